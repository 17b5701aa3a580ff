"""Headless Firefox as a Web Push receiver: a fresh profile pointed at a relay, and a loopback page.

Used by tests/test_firefox.py and benchmarks/bench_mozpush.py. No driver: the profile's user.js sets the
push server (`dom.push.serverURL`), and the page takes its orders from `PageServer` (it long-polls
`/cmd`) and reports back over HTTP (`/report`): subscriptions, and every `push` event its service worker
receives, with the text and the worker's clock. Firefox is Debian's firefox-esr (.ci/run installs it); a
profile is made to trust a test CA with NSS's certutil (Debian's libnss3-tools, also installed by .ci/run).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIREFOX = shutil.which("firefox-esr") or shutil.which("firefox")
CERTUTIL = shutil.which("certutil")

PAGE = """<!doctype html><meta charset="utf-8"><title>INRI push test</title>
<script>
const report = (obj) => fetch("/report", {method: "POST", headers: {"content-type": "application/json"},
                                          body: JSON.stringify(obj)});
function keyBytes(b64) {
  const s = (b64 + "=".repeat((4 - b64.length % 4) % 4)).replace(/-/g, "+").replace(/_/g, "/");
  return Uint8Array.from(atob(s), c => c.charCodeAt(0));
}
function active(reg) {
  if (reg.active) return Promise.resolve();
  const w = reg.installing || reg.waiting;
  return new Promise(resolve => w.addEventListener("statechange", () => { if (w.state === "activated") resolve(); }));
}
async function run(cmd) {
  if (cmd.do === "subscribe") {
    const reg = await navigator.serviceWorker.register("/sw.js", {scope: cmd.scope});
    await active(reg);
    const sub = await reg.pushManager.subscribe({userVisibleOnly: true, applicationServerKey: keyBytes(cmd.key)});
    report({kind: "subscription", scope: cmd.scope, sub: sub.toJSON()});
  } else if (cmd.do === "unsubscribe") {
    const reg = await navigator.serviceWorker.getRegistration(cmd.scope);
    const sub = await reg.pushManager.getSubscription();
    report({kind: "unsubscribed", scope: cmd.scope, ok: await sub.unsubscribe()});
  }
}
(async () => {
  report({kind: "page"});
  for (;;) {
    let cmd;
    try { cmd = await (await fetch("/cmd")).json(); }
    catch (e) { await new Promise(r => setTimeout(r, 200)); continue; }
    if (cmd.do === "wait") continue;
    try { await run(cmd); } catch (e) { report({kind: "error", cmd: cmd, error: String(e)}); }
  }
})();
</script>
"""

WORKER = """self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", e => e.waitUntil(self.clients.claim()));
self.addEventListener("push", e => {
  const body = {kind: "push", scope: self.registration.scope, text: e.data ? e.data.text() : null, at_ms: Date.now()};
  e.waitUntil(fetch("/report", {method: "POST", headers: {"content-type": "application/json"},
                                body: JSON.stringify(body)}));
});
"""

PREFS = {
    "dom.push.testing.ignorePermission": True,
    "dom.push.loglevel": "debug",
    "devtools.console.stdout.chrome": True,
    "dom.push.maxQuotaPerSubscription": 10000,  # background pushes without a notification spend quota
    "dom.serviceWorkers.testing.enabled": True,
    "browser.shell.checkDefaultBrowser": False,
    "browser.startup.homepage_override.mstone": "ignore",
    "browser.sessionstore.resume_from_crash": False,  # a restart opens the page once, not twice
    "browser.aboutwelcome.enabled": False,
    "datareporting.policy.dataSubmissionEnabled": False,
    "toolkit.telemetry.reportingpolicy.firstRun": False,
    "app.update.auto": False,
    "extensions.update.enabled": False,
    "network.connectivity-service.enabled": False,
    "network.captive-portal-service.enabled": False,
    "browser.safebrowsing.malware.enabled": False,
    "browser.safebrowsing.phishing.enabled": False,
    "services.settings.server": "http://127.0.0.1:9/",  # no remote settings fetched (loopback, closed port)
}


class PageServer:
    """The loopback origin of the test page (http://127.0.0.1:PORT, a secure context)."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        self.cond = threading.Condition()
        self.commands: queue.Queue[dict[str, Any]] = queue.Queue()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, body: bytes, ctype: str) -> None:
                self.send_response(200)
                self.send_header("content-type", ctype)
                self.send_header("content-length", str(len(body)))
                self.send_header("cache-control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                if self.path == "/sw.js":
                    self._answer(WORKER.encode(), "text/javascript")
                elif self.path == "/cmd":
                    try:
                        cmd = owner.commands.get(timeout=10)
                    except queue.Empty:
                        cmd = {"do": "wait"}
                    try:
                        self._answer(json.dumps(cmd).encode(), "application/json")
                    except OSError:  # the page asking went away (Firefox stopped): another page gets it
                        if cmd["do"] != "wait":
                            owner.commands.put(cmd)
                        raise
                else:
                    self._answer(PAGE.encode(), "text/html")

            def do_POST(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                data = json.loads(self.rfile.read(n) or b"{}")
                data["received_at"] = time.time()
                with owner.cond:
                    owner.reports.append(data)
                    owner.cond.notify_all()
                self._answer(b"{}", "application/json")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def command(self, **cmd: Any) -> None:
        self.commands.put(cmd)

    def wait_for(self, kind: str, timeout: float, count: int = 1, **match: Any) -> list[dict[str, Any]]:
        """The first `count` reports of this kind (and these fields), waiting up to timeout seconds."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                got = [r for r in self.reports if r.get("kind") == kind
                       and all(r.get(k) == v for k, v in match.items())]
                errors = [r for r in self.reports if r.get("kind") == "error"]
                if errors:
                    raise AssertionError(f"the page failed: {errors}")
                if len(got) >= count:
                    return got[:count]
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {count} {kind} report(s) {match} within {timeout} s: {self.reports}")
                self.cond.wait(left)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Firefox:
    """One headless Firefox on a profile of its own (kept across restarts), opened on the page."""

    def __init__(self, profile: Path, server_url: str, page_url: str, log: Path) -> None:
        assert FIREFOX is not None
        self.profile, self.page_url, self.log = profile, page_url, log
        profile.mkdir(parents=True, exist_ok=True)
        prefs: dict[str, object] = {**PREFS, "dom.push.serverURL": server_url}
        if server_url.startswith("ws://"):  # Firefox refuses a plain push server without it (docs/browsers.md)
            prefs["dom.push.testing.allowInsecureServerURL"] = True
        (profile / "user.js").write_text("".join(f"user_pref({json.dumps(k)}, {json.dumps(v)});\n"
                                                 for k, v in prefs.items()))
        self.proc: subprocess.Popen[bytes] | None = None

    def trust_ca(self, ca: Path) -> None:
        """Make the profile's certificate database (NSS, cert9.db) trust the CA in the PEM file ca for TLS
        servers, as a user importing a private CA does (Settings, Certificates, Import)."""
        assert CERTUTIL is not None
        db = f"sql:{self.profile}"
        subprocess.run([CERTUTIL, "-N", "-d", db, "--empty-password"], check=True, capture_output=True, timeout=30)
        subprocess.run([CERTUTIL, "-A", "-d", db, "-n", "INRI test CA", "-t", "C,,", "-i", str(ca)], check=True,
                       capture_output=True, timeout=30)

    def start(self) -> None:
        home = self.profile.parent / "home"
        home.mkdir(exist_ok=True)
        env = {**os.environ, "HOME": str(home), "MOZ_CRASHREPORTER_DISABLE": "1", "MOZ_HEADLESS": "1"}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([str(FIREFOX), "--headless", "--no-remote", "--profile", str(self.profile),
                                          self.page_url], stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env, start_new_session=True)

    def saved_uaid(self) -> str | None:
        """The uaid Firefox has written to the profile's prefs.js (dom.push.userAgentID), if any."""
        try:
            text = (self.profile / "prefs.js").read_text(errors="replace")
        except OSError:
            return None
        for line in text.splitlines():
            if '"dom.push.userAgentID"' in line:
                return line.split(",", 1)[1].strip(' ");')
        return None

    def stop(self, keep_uaid: bool = True) -> None:
        """Quit (SIGTERM: Firefox shuts down cleanly), then make sure the whole process group is gone.

        Firefox keeps its uaid in a pref, written to prefs.js shortly after it changes and at shutdown. A
        Firefox that had to be killed (a loaded machine: no clean exit within 20 s) before that write
        comes back without a uaid and drops every subscription, so a uaid it holds is awaited first (unless
        keep_uaid is false: the profile is not started again)."""
        if self.proc is None:
            return
        deadline = time.monotonic() + (60 if keep_uaid else 0)
        while self.saved_uaid() is None and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)
        self.proc = None

    def tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""
