"""Mozilla Push at scale (docs/browsers.md): idle connections one relay holds and its memory per connection,
where that memory goes, and the time from a sender's 201 at the farthest relay to Firefox's service worker.

1. Idle connections: an `inri relay` process (test profile, lab rates); BENCH_MOZPUSH_IDLE (10,000)
   connections from this process, each past its `hello`, then held idle; the relay's RSS (VmRSS) before and
   after, per connection; a ping answered on every one afterwards (all still served). Aim: 10,000 at <= 20 KB.
2. Where the memory goes: an in-process relay under tracemalloc, BENCH_MOZPUSH_TRACED (2,000) connections;
   the relay's allocations (traces whose stack passes no client code) by the file that made them.
3. Latency: a 3-hop line (benchmarks/bench_poc.py's start_line), headless firefox-esr pointed at the home
   end, BENCH_MOZPUSH_PUSHES (100) pushes sent one at a time with pywebpush at the other end: from the 201
   to the service worker's `push` event (its Date.now()), p50 and p99. Skipped where firefox-esr is absent.
"""

from __future__ import annotations

import base64
import dataclasses
import inspect
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_poc import start_line  # noqa: E402  (benchmarks/ is sys.path[0])

from inri import mesh  # noqa: E402
from inri.common.front import HttpServer  # noqa: E402
from inri.node.api import create_app  # noqa: E402
from inri.node.config import RelayConfig  # noqa: E402
from inri.node.service import RelayService  # noqa: E402
from inri.node.store import Store  # noqa: E402
from inri.node.tracefile import TraceFile  # noqa: E402
from tests.firefox import FIREFOX, Firefox, PageServer  # noqa: E402
from tests.inproc import NullNetwork  # noqa: E402
from tests.mozpush_client import MPClient  # noqa: E402

IDLE = int(os.environ.get("BENCH_MOZPUSH_IDLE", "10000"))
TRACED = int(os.environ.get("BENCH_MOZPUSH_TRACED", "2000"))
PUSHES = int(os.environ.get("BENCH_MOZPUSH_PUSHES", "100"))
# Every connection comes from this one address: the front's caps are lifted to hold them all, and its
# WebSocket Pings (to clients silent ws_ping_interval_s) pushed past the run, so idle means idle.
FRONT = {"connections_max": 4 * IDLE + 1000, "connections_per_client_max": 4 * IDLE + 1000,
         "ws_ping_interval_s": 3600.0}
FRONT_KEYS = "".join(f"{k} = {v!r}\n" for k, v in FRONT.items())


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def open_idle(ws: str, n: int) -> list[MPClient]:
    clients: list[MPClient] = []

    async def one() -> None:
        c = await MPClient.connect(ws)
        got = await c.hello()
        assert got["status"] == 200
        clients.append(c)

    for start in range(0, n, 200):
        async with trio.open_nursery() as nursery:
            for _ in range(min(200, n - start)):
                nursery.start_soon(one)
    return clients


def idle_connections(workdir: Path) -> dict[str, float]:
    data = workdir / "idle"
    data.mkdir()
    (data / "relay.toml").write_text(
        f'[relay]\ndata_dir = "{data}"\napi = "127.0.0.1:0"\nquic = "127.0.0.1:0"\nprofile = "test"\n'
        'bootstrap = ["http://127.0.0.1:9"]\nlog_format = "json"\n[api]\nrate_per_s = 1000000.0\n'
        f"rate_burst = 1000000\n{FRONT_KEYS}")
    log = open(workdir / "idle.log", "ab")  # noqa: SIM115 - the child holds it
    proc = subprocess.Popen([sys.executable, "-m", "inri.cli", "relay", "--config", str(data / "relay.toml")],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (data / "relay.json").exists():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("relay did not start: " + (workdir / "idle.log").read_text()[-2000:])
            time.sleep(0.1)
        api = json.loads((data / "relay.json").read_text())["api"]
        ws = api.replace("http", "ws") + "/v1/mozpush"

        async def go() -> dict[str, float]:
            warm = await open_idle(ws, 50)  # the first connections' one-off allocations (caches, pools)
            for c in warm:
                await c.aclose()
            await trio.sleep(1.0)
            before = rss_kib(proc.pid)
            t0 = time.perf_counter()
            clients = await open_idle(ws, IDLE)
            opened_s = time.perf_counter() - t0
            await trio.sleep(2.0)
            after = rss_kib(proc.pid)
            held = httpx.get(api + "/v1/status", timeout=30).json()["mozpush"]["connections"]
            for c in clients:
                await c.send({})
            answered = 0
            for c in clients:
                answered += await c.recv() == {}
                await c.aclose()
            per = (after - before) / IDLE
            print(f"{IDLE} idle connections: relay RSS {before} KiB -> {after} KiB = {per:.1f} KiB "
                  f"({per * 1.024:.1f} KB) per connection; held {held}, pings answered {answered}; "
                  f"opened in {opened_s:.1f} s")
            return {"held": held, "answered": answered, "per_kib": per, "before": before, "after": after}

        return trio.run(go)
    finally:
        proc.terminate()
        proc.wait(30)


def where_memory_goes(workdir: Path) -> list[tuple[str, float]]:
    """tracemalloc over an in-process relay: the relay's bytes per connection by the file that allocated."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    cfg = RelayConfig()
    cfg = dataclasses.replace(cfg, api=dataclasses.replace(cfg.api, **FRONT))  # type: ignore[arg-type]
    store = Store(workdir / "traced.sqlite3")
    service = RelayService("a" * 32, cfg.engine.test_profile(), store, NullNetwork(),
                           TraceFile(workdir / "t", "a" * 32))
    out: list[tuple[str, float]] = []

    async def go() -> None:
        stop = trio.Event()
        async with trio.open_nursery() as n:
            await n.start(store.run)
            await n.start(service.run)
            app = create_app(service, config=cfg)
            await n.start(app.agents.run)
            await n.start(app.mozpush.run)
            server = HttpServer(app, cfg.api, stats=app.front)
            await n.start(lambda task_status: server.run([sock], shutdown_trigger=stop.wait, task_status=task_status))
            ws = url.replace("http", "ws") + "/v1/mozpush"
            for c in await open_idle(ws, 50):
                await c.aclose()
            await trio.sleep(0.5)
            tracemalloc.start(30)
            base = tracemalloc.take_snapshot()
            clients = await open_idle(ws, TRACED)
            await trio.sleep(0.5)
            snap = tracemalloc.take_snapshot()
            tracemalloc.stop()
            by_file: dict[str, int] = {}
            lines, first = inspect.getsourcelines(open_idle)
            client_lines = range(first, first + len(lines))
            for stat in snap.compare_to(base, "traceback"):
                if any("mozpush_client" in f.filename or (f.filename == __file__ and f.lineno in client_lines)
                       for f in stat.traceback):
                    continue  # the clients' side of the connections (this process)
                name = stat.traceback[-1].filename  # the frame that allocated (tracebacks run oldest first)
                key = "/".join(Path(name).parts[-2:])
                by_file[key] = by_file.get(key, 0) + stat.size_diff
            for c in clients:
                await c.aclose()
            stop.set()
            n.cancel_scope.cancel()
            total = sum(by_file.values())
            print(f"tracemalloc, {TRACED} idle connections in process: {total / TRACED:.0f} B per connection "
                  "allocated by the relay's Python code, by file:")
            for key, size in sorted(by_file.items(), key=lambda kv: -kv[1])[:12]:
                print(f"  {size / TRACED:8.0f} B  {key}")
                out.append((key, size / TRACED))
            out.insert(0, ("total", total / TRACED))

    trio.run(go)
    store.close()
    sock.close()
    return out


def pct(samples: list[float], q: int) -> float:
    """The nearest-rank percentile q of samples."""
    ordered = sorted(samples)
    return ordered[max(0, min(len(ordered) - 1, -(-q * len(ordered) // 100) - 1))]


def latency(workdir: Path) -> tuple[float, float, float, float] | None:
    """p50 and p99 (ms) from the sender's request at the line's entry to the service worker's event, and
    from its 201 (the entry answers once the home's receipt is back: the push is often there first)."""
    if FIREFOX is None:
        print("latency: skipped (firefox-esr is not installed)")
        return None
    from cryptography.hazmat.primitives import serialization
    from py_vapid import Vapid02
    from pywebpush import webpush

    vapid = Vapid02()
    vapid.generate_keys()
    public = base64.urlsafe_b64encode(vapid.public_key.public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)).rstrip(b"=").decode()

    procs: list[subprocess.Popen[bytes]] = []
    # Pushes go back to back to one endpoint: the per-endpoint limit (1/s, burst 20) is lifted on the line.
    os.environ.update(INRI_WEBPUSH_ENDPOINT_RATE_PER_S="100000", INRI_WEBPUSH_ENDPOINT_BURST="100000")
    line = start_line(workdir / "line", procs)
    page = PageServer()
    entry, home = line["relays"][0]["api"], line["relays"][-1]["api"]
    ff = Firefox(workdir / "profile", home.replace("http://", "ws://") + "/v1/mozpush", page.url + "/",
                 workdir / "firefox.log")
    try:
        ff.start()
        page.wait_for("page", 60)
        deadline = time.monotonic() + 60
        while httpx.get(home + "/v1/status", timeout=5).json()["mozpush"]["connections"] < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("Firefox did not connect:\n" + ff.tail())
            time.sleep(0.2)
        page.command(do="subscribe", scope="/a/", key=public)
        sub = page.wait_for("subscription", 60)[0]["sub"]
        sub = {**sub, "endpoint": entry + sub["endpoint"][len(home):]}
        while httpx.get(entry + "/v1/status", timeout=5).json()["routes"] < 1:
            time.sleep(0.2)  # the channel's route reached the entry
        sent_to_sw: list[float] = []
        after_201: list[float] = []
        for i in range(PUSHES + 5):
            text = f"latency {i}"
            t0 = time.time()
            r = webpush(sub, text, vapid_private_key=vapid, vapid_claims={"sub": "mailto:ops@example.org"},
                        ttl=60)
            t201 = time.time()
            assert r.status_code == 201
            got = page.wait_for("push", 30, text=text)[0]
            if i >= 5:  # the first pushes warm the path (route learning, connections set up)
                sent_to_sw.append(got["at_ms"] - t0 * 1000)
                after_201.append(got["at_ms"] - t201 * 1000)
        for name, samples in (("sender's request -> service worker", sent_to_sw),
                              ("sender's 201 -> service worker (negative: before the 201)", after_201)):
            print(f"{name}, {len(samples)} pushes over 3 hops: p50 {pct(samples, 50):.1f} ms, "
                  f"p99 {pct(samples, 99):.1f} ms (min {min(samples):.1f}, max {max(samples):.1f})")
        return pct(sent_to_sw, 50), pct(sent_to_sw, 99), pct(after_201, 50), pct(after_201, 99)
    finally:
        ff.stop()
        page.close()
        for proc in procs:
            mesh._stop_pid(proc.pid, 5.0)


def main() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < 2 * IDLE + 200:
        print(f"warning: RLIMIT_NOFILE {hard} is below what {IDLE} connections need here")
    workdir = Path(tempfile.mkdtemp(prefix="bench-mozpush-"))
    figures: list[dict[str, Any]] = []
    try:
        idle = idle_connections(workdir)
        figures += [
            {"metric": "mozpush idle connections held (one relay)", "value": idle["held"], "unit": "connections",
             "note": f"aim {IDLE}; pings answered on {int(idle['answered'])}"},
            {"metric": "mozpush relay RSS per idle connection", "value": round(idle["per_kib"] * 1.024, 1),
             "unit": "KB", "ceiling": 20.0, "note": f"VmRSS {idle['before']:.0f} -> {idle['after']:.0f} KiB"},
        ]
        traced = where_memory_goes(workdir)
        figures.append({"metric": "mozpush Python heap per idle connection (tracemalloc)",
                        "value": round(traced[0][1]), "unit": "B",
                        "note": ", ".join(f"{k} {v:.0f}" for k, v in traced[1:5])})
        lat = latency(workdir)
        if lat is not None:
            figures += [{"metric": "mozpush request -> service worker p50 (3 hops)", "value": round(lat[0], 1),
                         "unit": "ms", "note": f"{PUSHES} pushes, firefox-esr headless"},
                        {"metric": "mozpush request -> service worker p99 (3 hops)", "value": round(lat[1], 1),
                         "unit": "ms"},
                        {"metric": "mozpush 201 -> service worker p50 (3 hops)", "value": round(lat[2], 1),
                         "unit": "ms", "note": "negative: the event came before the sender had its 201"},
                        {"metric": "mozpush 201 -> service worker p99 (3 hops)", "value": round(lat[3], 1),
                         "unit": "ms"}]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({"bench": "mozpush", "figures": figures}))


if __name__ == "__main__":
    main()
