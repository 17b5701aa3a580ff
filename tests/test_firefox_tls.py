"""Firefox receives over the relay's own TLS, as a user who points `dom.push.serverURL` at their relay with no
proxy in front does: one relay serving `[api] tls_cert`/`tls_key` (a certificate for 127.0.0.1 from a test CA),
headless firefox-esr on a fresh profile whose NSS database trusts that CA, `dom.push.serverURL =
wss://127.0.0.1:PORT/v1/mozpush` and no `dom.push.testing.allowInsecureServerURL`. The page's service worker
subscribes, gets an https:// endpoint, an unmodified pywebpush (verifying the relay with the CA) sends to it,
and the worker's `push` event gets the exact text. Skips where firefox-esr or NSS's certutil is absent
(.ci/run installs both: Debian's firefox-esr and libnss3-tools)."""

from __future__ import annotations

import os
import ssl
import time
from pathlib import Path

import httpx
import pytest
import requests
from pywebpush import webpush

from inri.node.mozpush_ws import MOZPUSH_PATH
from tests.firefox import CERTUTIL, FIREFOX, Firefox, PageServer
from tests.procs import Proc, relay_cmd, relay_ready
from tests.test_webpush import Sender, make_tls

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(FIREFOX is None, reason="firefox-esr is not installed (Debian's firefox-esr; "
                                                         ".ci/run installs it)"),
              pytest.mark.skipif(CERTUTIL is None, reason="certutil is not installed (Debian's libnss3-tools; "
                                                          ".ci/run installs it)")]
# What Firefox's push client (PushServiceWebSocket.sys.mjs) logs at debug level: a WebSocket that failed
# (with its nsresult; a certificate Firefox does not trust gives 2152398930, 0x804B0052), and a hello answered.
SOCKET_ERROR = "wsOnStop: Reconnecting after socket error"
HELLO_ANSWERED = "handleHelloReply()"


def wait_connected_over_tls(api: str, ca: Path, ff: Firefox, timeout: float = 90.0) -> None:
    """Firefox's push service holds a connection to the relay (its /v1/status, read over TLS with the CA).

    A connection that failed before any hello (a certificate Firefox does not trust, a refused handshake)
    shows in Firefox's push log as a socket error, then a retry with backoff: that fails at once, with the
    log. The timeout is only a hang guard."""
    deadline = time.monotonic() + timeout
    with httpx.Client(verify=ssl.create_default_context(cafile=str(ca)), timeout=5) as client:
        while client.get(api + "/v1/status").json()["mozpush"]["connections"] < 1:
            log = ff.tail(400)
            assert SOCKET_ERROR not in log or HELLO_ANSWERED in log, \
                "Firefox could not open its push connection to the relay over TLS:\n" + log
            assert time.monotonic() < deadline, "Firefox did not connect to the relay (hang guard):\n" + log
            time.sleep(0.2)


def test_firefox_receives_over_the_relays_own_tls(tmp_path: Path) -> None:
    cert, key, ca = make_tls(tmp_path)
    relay = Proc(relay_cmd(tmp_path / "relay"), tmp_path / "relay.log",
                 {"INRI_API_TLS_CERT": str(cert), "INRI_API_TLS_KEY": str(key)})
    page = PageServer()
    ff: Firefox | None = None
    try:
        api = relay_ready(relay, tmp_path / "relay")["api"]
        assert api.startswith("https://127.0.0.1:"), api
        ff = Firefox(tmp_path / "profile", "wss://" + api.removeprefix("https://") + MOZPUSH_PATH, page.url + "/",
                     tmp_path / "firefox.log")
        assert "allowInsecureServerURL" not in (tmp_path / "profile" / "user.js").read_text()
        ff.trust_ca(ca)
        ff.start()
        page.wait_for("page", 60)
        wait_connected_over_tls(api, ca, ff)
        sender = Sender()
        page.command(do="subscribe", scope="/tls/", key=sender.public)
        sub = page.wait_for("subscription", 60, scope="/tls/")[0]["sub"]
        assert sub["endpoint"].startswith(api + "/wp/v1/"), sub["endpoint"]
        text = "over the relay's own TLS " + os.urandom(4).hex() + " é✓"
        with requests.Session() as session:
            session.verify = str(ca)  # pywebpush sends with requests: the relay's certificate is checked
            session.trust_env = False  # else REQUESTS_CA_BUNDLE, where set, replaces verify (and loopback only)
            r = webpush(sub, text, vapid_private_key=sender.vapid, vapid_claims={"sub": "mailto:ops@example.org"},
                        ttl=600, requests_session=session)
        assert not isinstance(r, str) and r.status_code == 201, r
        try:
            got = page.wait_for("push", 60, text=text)[0]
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nFirefox log:\n{ff.tail()}") from None
        assert got["scope"].endswith("/tls/")
    finally:
        if ff is not None:
            ff.stop(keep_uaid=False)  # this profile is not started again
        page.close()
        assert relay.stop() == 0, relay.tail()
