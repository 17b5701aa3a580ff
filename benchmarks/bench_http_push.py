"""HTTP pushes through one relay and over one QUIC hop, beside their ceilings measured in the same run.

1. QUIC frames/s on one link (in process, one direction, 200-byte frames), beside the same frames over
   a loopback TCP stream with the same 4-byte framing (the kernel-transport ceiling).
2. End-to-end latency, unloaded: a push injected at relay A (HTTP 202) until the device's WebSocket at
   home relay B receives it (one QUIC hop), p50/p99 over sequential pushes.
3. Throughput: pushes/s accepted by A's HTTP API (202) from CONCURRENCY concurrent clients, and pushes/s
   stored at B, beside a bare hypercorn ASGI endpoint answering 202 to the same load generator.

4. The unloaded 1-hop latency of 2. side by side with an older tree (issue 16: "not worse than
   today's"): BENCH_COMPARE_TREE (a source tree), else BENCH_BASELINE_REF (default 99856a6, main when
   issue 16 was filed) unpacked with `git archive` from this checkout. Each tree runs its own mesh and
   clients (benchmarks/latency_worker.py); BENCH_LATENCY_ROUNDS (4) interleaved rounds of
   BENCH_LATENCY_ROUND_N (50) pushes each; medians of the rounds' p50 and p99 and their ratios. Skipped
   (said so) when neither tree is at hand.

Real processes: one bootstrap and two relays (`inri mesh up`); the load generator is this process.
Env: BENCH_PUSHES (default 12000), BENCH_CONCURRENCY (32), BENCH_LATENCY_N (200), BENCH_WRK_SECONDS (5).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inri import mesh  # noqa: E402
from inri.client import DeviceClient, HomeAppClient  # noqa: E402
from inri.client.credential import seal  # noqa: E402
from inri.common.b64url import b64e  # noqa: E402
from inri.common.identity import NodeIdentity  # noqa: E402
from inri.node.quic import QuicEndpoint  # noqa: E402
from inri.protocol.codec import encode_registration  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from latency_worker import e2e_latencies  # noqa: E402

PUSHES = int(os.environ.get("BENCH_PUSHES", "12000"))  # distinct pushes (tokens) the load cycles through
CONC = int(os.environ.get("BENCH_CONCURRENCY", "32"))
LAT_N = int(os.environ.get("BENCH_LATENCY_N", "200"))
WORKDIR = [Path(".")]
FRAMES = int(os.environ.get("BENCH_FRAMES", "50000"))

BARE_APP = '''
import json
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            await send({"type": msg["type"] + ".complete"})
            if msg["type"] == "lifespan.shutdown":
                return
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    body = json.dumps({"push_id": "00" * 16, "status": "pending"}).encode()
    await send({"type": "http.response.start", "status": 202,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
'''


BASELINE_REF = os.environ.get("BENCH_BASELINE_REF", "99856a6")
LAT_ROUNDS = int(os.environ.get("BENCH_LATENCY_ROUNDS", "4"))
LAT_ROUND_N = int(os.environ.get("BENCH_LATENCY_ROUND_N", "50"))


def compare_tree(tmp: Path) -> tuple[Path | None, str]:
    """The older tree to measure beside this one, and what it is (or None and why not)."""
    env = os.environ.get("BENCH_COMPARE_TREE")
    if env:
        return Path(env), env
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        return None, "no git checkout to unpack BENCH_BASELINE_REF from"
    out = tmp / "baseline"
    out.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", BASELINE_REF], capture_output=True)
    if archive.returncode != 0:
        return None, f"git archive {BASELINE_REF}: {archive.stderr.decode(errors='replace').strip()[:200]}"
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out, f"{BASELINE_REF} (git archive)"


def latency_side_by_side(tmp: Path) -> dict[str, Any] | None:
    """Unloaded 1-hop latency, this tree and an older one, in interleaved rounds (module docstring, 4.)."""
    old, what = compare_tree(tmp)
    if old is None:
        print(f"unloaded latency side by side: skipped ({what})")
        return None
    trees = {"this tree": ROOT, what: old}
    procs: dict[str, subprocess.Popen[str]] = {}
    try:
        for name, tree in trees.items():
            procs[name] = subprocess.Popen(
                [sys.executable, str(ROOT / "benchmarks" / "latency_worker.py")], cwd=tree, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": str(tree)}, start_new_session=True)
        for name, proc in procs.items():
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            if line != "ready":
                raise RuntimeError(f"latency worker for {name} did not start ({line!r})")
        rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
        for r in range(LAT_ROUNDS):
            for name in (list(trees) if r % 2 == 0 else list(reversed(trees))):
                proc = procs[name]
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(f"{LAT_ROUND_N}\n")
                proc.stdin.flush()
                lat = json.loads(proc.stdout.readline())
                rounds[name].append((pct(lat, 50), pct(lat, 99)))
    finally:
        for proc in procs.values():
            try:
                if proc.stdin is not None:
                    proc.stdin.write("quit\n")
                    proc.stdin.close()
                proc.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
    med = {name: (statistics.median(p for p, _ in rs), statistics.median(q for _, q in rs))
           for name, rs in rounds.items()}
    new, base = med["this tree"], med[what]
    print(f"unloaded 1-hop latency, {LAT_ROUNDS} interleaved rounds of {LAT_ROUND_N} pushes, medians of the rounds:")
    for name, (p50, p99) in med.items():
        print(f"  {name:32s} p50 {p50 * 1000:6.1f} ms  p99 {p99 * 1000:6.1f} ms")
    print(f"  this tree / {what}: p50 {new[0] / base[0]:.2f}x, p99 {new[1] / base[1]:.2f}x")
    return {"baseline": what, "p50": new[0], "p99": new[1], "base_p50": base[0], "base_p99": base[1]}


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, int(round(p / 100 * len(s) + 0.5)) - 1))]  # nearest rank


async def quic_frames(batch: int = 64) -> float:
    """Frames/s received over one link; the sender yields every `batch` frames (1: after each)."""
    a, b = NodeIdentity.generate(), NodeIdentity.generate()
    got = trio.Event()
    rate: list[float] = []

    async def on_link(link) -> None:  # type: ignore[no-untyped-def]
        t0 = 0.0
        for i in range(FRAMES):
            await link.receive()
            if i == 0:
                t0 = time.perf_counter()
        rate.append((FRAMES - 1) / (time.perf_counter() - t0))
        got.set()

    async with trio.open_nursery() as n:
        ea, eb = QuicEndpoint(a), QuicEndpoint(b)
        await ea.bind("127.0.0.1", 0)
        await eb.bind("127.0.0.1", 0)
        await n.start(ea.serve, on_link)
        await n.start(eb.serve, None)
        link = await eb.connect(ea.listen_addr, expect_node_id=a.node_id)
        frame = os.urandom(200)
        # As the relay sends: frames queued without yielding (send_nowait), the loop yielding between
        # batches, so QUIC packs several frames per packet.
        for i in range(FRAMES):
            link.send_nowait(frame)
            if i % batch == batch - 1:
                await trio.sleep(0)
        await got.wait()
        n.cancel_scope.cancel()
    return rate[0]


async def tcp_frames() -> float:
    rate: list[float] = []
    done = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        buf = bytearray()
        n = 0
        t0: float | None = None
        while n < FRAMES:
            data = await stream.receive_some(65536)
            if t0 is None:
                t0 = time.perf_counter()
            buf += data
            while len(buf) >= 4:
                size = int.from_bytes(buf[:4], "big")
                if len(buf) < 4 + size:
                    break
                del buf[: 4 + size]
                n += 1
        assert t0 is not None
        rate.append((FRAMES - 1) / (time.perf_counter() - t0))
        done.set()

    async with trio.open_nursery() as n:
        listeners = await n.start(trio.serve_tcp, handler, 0)
        port = listeners[0].socket.getsockname()[1]
        s = await trio.open_tcp_stream("127.0.0.1", port)
        frame = (200).to_bytes(4, "big") + os.urandom(200)
        for _ in range(FRAMES):
            await s.send_all(frame)
        await done.wait()
        n.cancel_scope.cancel()
    return rate[0]


async def load(url: str, bodies: list[dict[str, Any]]) -> tuple[float, list[float], int]:
    """POST every body at url with CONC workers; returns (requests/s, latencies, 202 count)."""
    lat: list[float] = []
    ok = 0
    it = iter(bodies)

    async def worker(c: httpx.AsyncClient) -> None:
        nonlocal ok
        for body in it:
            t = time.perf_counter()
            r = await c.post(url, json=body)
            lat.append(time.perf_counter() - t)
            ok += r.status_code == 202

    limits = httpx.Limits(max_connections=CONC, max_keepalive_connections=CONC)
    async with httpx.AsyncClient(timeout=60, limits=limits) as c:
        t0 = time.perf_counter()
        async with trio.open_nursery() as n:
            for _ in range(CONC):
                n.start_soon(worker, c)
        wall = time.perf_counter() - t0
    return len(bodies) / wall, lat, ok


WRK_SECONDS = float(os.environ.get("BENCH_WRK_SECONDS", "5"))


def wrk_load(url: str, bodies: list[dict[str, Any]], workdir: Path) -> tuple[float, float, float, int]:
    """wrk (one thread, CONC connections) POSTing the bodies in turn; (req/s, p50 s, p99 s, non-2xx)."""
    script = workdir / f"push_{abs(hash(url))}.lua"
    lines = ["bodies = {"] + ["  " + json.dumps(json.dumps(b)) + "," for b in bodies] + ["}", "i = 0",
             "request = function()", "  i = i + 1",
             '  local body = bodies[((i - 1) % #bodies) + 1]',
             '  return wrk.format("POST", nil, {["Content-Type"] = "application/json"}, body)',
             "end"]
    script.write_text("\n".join(lines))
    proc = subprocess.run(["wrk", "-t1", f"-c{CONC}", f"-d{int(WRK_SECONDS)}s", "--latency", "-s", str(script), url],
                          capture_output=True, text=True, timeout=WRK_SECONDS + 60)
    out = proc.stdout
    if "Requests/sec" not in out:
        print("wrk failed:", out[-500:], proc.stderr[-500:])
    return parse_wrk(out)


_WRK_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def parse_wrk(out: str) -> tuple[float, float, float, int]:
    """(req/s, p50 s, p99 s, non-2xx) from `wrk --latency` output.

    Percentiles are read only from the "Latency Distribution" lines (`     50%    4.98ms`): a bare
    `50%` search also matches the "+/- Stdev" column (`68.50%`) of the thread stats and yields NaN.
    """
    def grab(pattern: str) -> str | None:
        m = re.search(pattern, out, re.MULTILINE)
        return m.group(1) if m else None

    def pctl(p: int) -> float:
        m = re.search(rf"^\s*{p}%\s+([\d.]+)(us|ms|s|m)\s*$", out.split("Latency Distribution", 1)[-1], re.MULTILINE)
        return float(m.group(1)) * _WRK_UNITS[m.group(2)] if m else float("nan")

    rps = float(grab(r"^Requests/sec:\s+([\d.]+)") or 0)
    bad = int(grab(r"^\s*Non-2xx or 3xx responses:\s+(\d+)") or 0)
    return rps, pctl(50), pctl(99), bad


async def relay_bench(info: dict[str, Any]) -> dict[str, Any]:
    a, b = info["relays"][0], info["relays"][1]
    # Several devices at B: one device's mailbox holds at most 1,000 unacknowledged messages.
    devices = [DeviceClient(b["api"]) for _ in range(PUSHES // 800 + 1)]
    for d in devices:
        await d.register(tokens=500)
        while len(d.tokens) < PUSHES // len(devices) + LAT_N:
            await d.more_tokens(500)
    dev = devices[0]
    async with httpx.AsyncClient(timeout=5) as c:
        while (await c.get(a["api"] + "/v1/status")).json()["routes"] < 1:
            await trio.sleep(0.05)
    # Unloaded end-to-end latency, one QUIC hop.
    e2e = await e2e_latencies(dev, HomeAppClient([a["api"]]), LAT_N)
    # Throughput.
    bodies = []
    for d in devices:
        cred = d.export_credential(PUSHES // len(devices))
        reg = b64e(encode_registration(cred.registration))
        bodies += [{"registration": reg, "token": b64e(t), "ciphertext": b64e(seal(cred.seal_key, b"y" * 64))}
                   for t in cred.tokens]
    bodies = [bodies[i] for i in sorted(range(len(bodies)), key=lambda i: (i % len(devices), i))]
    t0 = time.perf_counter()
    if shutil.which("wrk"):
        rps, p50, p99, bad = await trio.to_thread.run_sync(wrk_load, a["api"] + "/v1/push", bodies, WORKDIR[0])
        lat = [p50, p99]
        tool = "wrk"
    else:
        rps, lat_all, ok = await load(a["api"] + "/v1/push", bodies)
        lat = [pct(lat_all, 50), pct(lat_all, 99)]
        tool = "httpx"
    # Stored at B: wait until A holds nothing in custody, then count what A saw delivered.
    async with httpx.AsyncClient(timeout=10) as c:
        with trio.fail_after(300):
            while (await c.get(a["api"] + "/v1/status")).json()["custody"] > 0:
                await trio.sleep(0.02)
        t_settled = time.perf_counter()
        metrics = (await c.get(a["api"] + "/metrics")).text
    delivered = int(float(next((ln.split()[-1] for ln in metrics.splitlines()
                                if ln.startswith('inri_custody_settled_total{status="delivered"}')), "0")))
    delivered -= LAT_N  # the latency run's pushes
    stored_rate = delivered / (t_settled - t0)
    ok = delivered
    return {"e2e": e2e, "rps": rps, "lat": lat, "ok": ok, "stored_rate": stored_rate, "tool": tool}


async def bare_bench(url: str) -> tuple[float, list[float]]:
    bodies = [{"registration": "x" * 200, "token": "y" * 22, "ciphertext": "z" * 150}] * PUSHES
    if shutil.which("wrk"):
        rps, p50, p99, _ = await trio.to_thread.run_sync(wrk_load, url, bodies[:100], WORKDIR[0])
        return rps, [p50, p99]
    rps, lat, _ = await load(url, bodies)
    return rps, [pct(lat, 50), pct(lat, 99)]


def main() -> None:
    quic = trio.run(quic_frames)
    quic1 = trio.run(quic_frames, 1)
    tcp = trio.run(tcp_frames)
    print(f"QUIC frames/s on one link (200 B, batches of 64 as the relay sends): {quic:,.0f}")
    print(f"QUIC frames/s on one link (200 B, a yield after every frame):        {quic1:,.0f}")
    print(f"TCP loopback frames/s, same framing:      {tcp:,.0f}")
    with tempfile.TemporaryDirectory(prefix="inri-bench-") as d:
        WORKDIR[0] = Path(d)
        # Relays as an operator runs them: default timers, traces off.
        info = mesh.up(d, relays=2, bootstraps=1, timeout_s=60, min_neighbours=1, trace_level="off",
                       profile="default")
        try:
            res = trio.run(relay_bench, info)
        finally:
            mesh.down(d)
        app_file = Path(d) / "bare_app.py"
        app_file.write_text(BARE_APP)
        # Bound here and handed over (hypercorn's fd:// bind): the port is known and nobody can take it.
        sock = socket.create_server(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "hypercorn", "--worker-class", "trio", "-b",
                                 f"fd://{sock.fileno()}", "bare_app:app"], cwd=d, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, pass_fds=(sock.fileno(),))
        sock.close()  # the server's copy is the one that counts
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                try:
                    httpx.post(f"http://127.0.0.1:{port}/", json={}, timeout=1)
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            bare_rps, bare_lat = trio.run(bare_bench, f"http://127.0.0.1:{port}/v1/push")
        finally:
            proc.terminate()
            proc.wait(10)
    with tempfile.TemporaryDirectory(prefix="inri-bench-lat-") as d:
        side = latency_side_by_side(Path(d))
    e2e = res["e2e"]
    print(f"end-to-end push latency, unloaded, 1 QUIC hop: p50 {pct(e2e, 50) * 1000:.1f} ms, "
          f"p99 {pct(e2e, 99) * 1000:.1f} ms (n={len(e2e)})")
    print(f"HTTP pushes accepted/s at one relay ({res['tool']}, {CONC} connections): {res['rps']:,.0f} "
          f"(p50 {res['lat'][0] * 1000:.1f} ms, p99 {res['lat'][1] * 1000:.1f} ms)")
    print(f"pushes stored/s at the home relay (one QUIC hop):     {res['stored_rate']:,.0f}")
    print(f"bare hypercorn ASGI 202 endpoint, same load:         {bare_rps:,.0f} "
          f"(p50 {bare_lat[0] * 1000:.1f} ms, p99 {bare_lat[1] * 1000:.1f} ms)")
    print(json.dumps({"bench": "http_push", "figures": [
        {"metric": "QUIC frames/s one link", "value": round(quic), "unit": "/s",
         "ceiling": f"TCP loopback {tcp:,.0f}/s",
         "note": f"200-byte frames in batches of 64; {quic1:,.0f}/s yielding after each frame"},
        {"metric": "e2e push latency p50 (1 hop)", "value": round(pct(e2e, 50) * 1000, 1), "unit": "ms",
         "ceiling": "aim < 50 ms", "note": f"p99 {pct(e2e, 99) * 1000:.1f} ms, n={len(e2e)}"},
        {"metric": "HTTP pushes accepted/s", "value": round(res["rps"]), "unit": "/s",
         "ceiling": f"bare hypercorn {bare_rps:,.0f}/s",
         "note": f"p50 {res['lat'][0] * 1000:.1f} ms p99 {res['lat'][1] * 1000:.1f} ms, {res['tool']} {CONC} conns"},
        {"metric": "pushes stored/s at home (1 QUIC hop)", "value": round(res["stored_rate"]), "unit": "/s",
         "ceiling": "aim >= 2,000/s", "note": f"{res['ok']} pushes"},
    ] + ([] if side is None else [
        {"metric": "unloaded 1-hop latency p50, this tree / baseline",
         "value": round(side["p50"] / side["base_p50"], 2),
         "unit": "x", "ceiling": "<= 1 (not worse than when issue 16 was filed)",
         "note": f"{side['p50'] * 1000:.1f} vs {side['base_p50'] * 1000:.1f} ms ({side['baseline']})"},
        {"metric": "unloaded 1-hop latency p99, this tree / baseline",
         "value": round(side["p99"] / side["base_p99"], 2),
         "unit": "x", "ceiling": "<= 1",
         "note": f"{side['p99'] * 1000:.1f} vs {side['base_p99'] * 1000:.1f} ms ({side['baseline']})"},
    ])}))


if __name__ == "__main__":
    main()
