"""INRI against the seed's proof of concept (issue 16 item 5), measured side by side in one run.

1. The PoC (benchmarks/seed_poc/app.py: FastAPI under uvicorn, RabbitMQ from Debian's rabbitmq-server
   package, started and stopped here) and one INRI relay with the devices homed there, under the same
   wrk load (one thread, BENCH_CONCURRENCY connections, BENCH_POC_SECONDS per round, every request a
   fresh single-use token), in interleaved rounds: pushes/s answered 2xx, p50/p99 accept latency,
   medians over BENCH_POC_ROUNDS rounds and their ratios, and the relay's CPU per push (utime+stime
   from /proc/<pid>/stat over the round, divided by the pushes it accepted).
   BENCH_COMPARE_TREE=/path/to/another/checkout adds a relay run from that tree's code (e.g. main)
   to the rounds, so old and new are compared in the same run. BENCH_POC_BATCH=N (default 20, 0: off)
   adds rounds of the same pushes sent N per `POST /v1/push/batch` request to this tree's relay:
   pushes/s and CPU per push, printed apart (the 3x target is for single pushes).
2. The same HTTP load on a bare ASGI 202 endpoint served by hypercorn and by the relay's front
   (inri/common/front): the HTTP server's own ceiling, the measurement behind choosing the front.
3. A 3-hop line (entry - forwarder - forwarder - home, four relays, one bootstrap per link): wrk at
   the entry, pushes stored/s at the home end to end beside the PoC's rate, and CPU per push at the
   entry, a forwarding relay and the home, and the home's receipt batches (rule F5b: receipts per
   batch). wrk sends each device's pushes back to back (1,000 per device, 40 devices), which suits
   batches; BENCH_LINE_SPREAD=1 sends them round robin over the devices (a few receipts per batch).
   BENCH_LINE_RUNS (3) wrk runs on the same line, each with fresh devices: medians and the worst run.
   With BENCH_COMPARE_TREE, a second line runs that tree's code, its runs interleaved with this
   tree's: both lines' figures and the ratio of their CPU per push are printed.

System packages (wrk, rabbitmq-server) are installed by `make bench` (benchmarks/install_bench_deps.sh);
the PoC's Python packages are the `bench` extra. Missing any: this benchmark says so and skips.
The machine may be shared: the figures to quote are the ratios of interleaved rounds.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_http_push import BARE_APP, parse_wrk  # noqa: E402  (this directory: the script's own)

from inri import mesh  # noqa: E402
from inri.client import DeviceClient  # noqa: E402
from inri.client.credential import seal  # noqa: E402
from inri.common.b64url import b64e  # noqa: E402
from inri.common.identity import NodeIdentity  # noqa: E402
from inri.node.bootstrap_client import make_record  # noqa: E402
from inri.protocol.codec import encode_registration  # noqa: E402
from inri.protocol.peer_record import encode_record  # noqa: E402

CONC = int(os.environ.get("BENCH_CONCURRENCY", "32"))
SECONDS = int(os.environ.get("BENCH_POC_SECONDS", "5"))
ROUNDS = int(os.environ.get("BENCH_POC_ROUNDS", "3"))
TOKENS = int(os.environ.get("BENCH_POC_TOKENS", "40000"))  # fresh tokens per round (more than wrk can send)
LINE_SECONDS = int(os.environ.get("BENCH_LINE_SECONDS", "5"))
LINE_RUNS = int(os.environ.get("BENCH_LINE_RUNS", "3"))  # wrk runs on the line: medians (and the worst) printed
COMPARE_TREE = os.environ.get("BENCH_COMPARE_TREE", "")
# 3-hop line: 1 sends the pushes of the 40 devices round robin (each device's pushes spread out) instead of
# each device's 1,000 back to back: the home then has few pushes of one route per round, so receipt
# batches (rule F5b) carry a few receipts each (near their worst case).
LINE_SPREAD = os.environ.get("BENCH_LINE_SPREAD", "0") == "1"
# Pushes per POST /v1/push/batch request in the batch rounds (this tree's relay only; 0: none). Reported
# apart: the 3x target is for single pushes under the PoC's load.
BATCH = int(os.environ.get("BENCH_POC_BATCH", "20"))
TICK = os.sysconf("SC_CLK_TCK")
# Relays for load: the API's per-address limits far above what one wrk client sends.
LOAD_ENV = {"INRI_API_RATE_PER_S": "1000000", "INRI_API_RATE_BURST": "1000000",
            "INRI_API_DEVICE_RATE_PER_S": "1000000", "INRI_API_DEVICE_RATE_BURST": "1000000"}
RABBITMQ = "/usr/lib/rabbitmq/bin/rabbitmq-server"


def missing() -> list[str]:
    """What this benchmark needs and the machine lacks."""
    out = []
    if not shutil.which("wrk"):
        out.append("wrk (Debian package wrk)")
    if not (Path(RABBITMQ).exists() or shutil.which("rabbitmq-server")):
        out.append("rabbitmq-server (Debian package rabbitmq-server)")
    for mod in ("fastapi", "uvicorn", "aio_pika"):
        if importlib.util.find_spec(mod) is None:
            out.append(f"Python package {mod} (pip install -e '.[bench]')")
    return out


def free_port() -> int:
    """A TCP port free right now. Racy (another process may take it before the server binds), and used
    only here, in a benchmark, for third-party servers that can neither report the port they bound
    nor take a socket handed over (RabbitMQ's listener, Erlang distribution and epmd ports)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads) and of its living children (hypercorn's worker), in s."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    total = (int(fields[11]) + int(fields[12])) / TICK
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            children = task.read_text().split()
        except OSError:  # the thread (or the process) ended between the glob and the read
            continue
        total += sum(cpu_s(int(c)) for c in children)
    return total


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on {port} in {timeout} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def start_rabbitmq(d: Path) -> tuple[subprocess.Popen[bytes], int]:
    """A private RabbitMQ node (own ports, data and Erlang cookie under d), as root or not."""
    port, dist, epmd = free_port(), free_port(), free_port()
    d.mkdir()
    env = {**os.environ, "HOME": str(d), "RABBITMQ_NODENAME": f"inribench{port}@localhost",
           "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(port),
           "RABBITMQ_DIST_PORT": str(dist), "ERL_EPMD_PORT": str(epmd), "RABBITMQ_MNESIA_BASE": str(d / "mnesia"),
           "RABBITMQ_LOG_BASE": str(d / "log"), "RABBITMQ_ENABLED_PLUGINS_FILE": str(d / "plugins"),
           "RABBITMQ_CONFIG_FILE": str(d / "none")}
    exe = RABBITMQ if Path(RABBITMQ).exists() else str(shutil.which("rabbitmq-server"))
    with open(d / "out.log", "ab") as log:
        proc = subprocess.Popen([exe], env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    wait_port(port, proc, "rabbitmq-server", timeout=120)
    return proc, port


def start_poc(d: Path, amqp_port: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "POC_AMQP_URL": f"amqp://guest:guest@127.0.0.1:{amqp_port}/"}
    with open(d / "poc.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "app:app", "--host", "127.0.0.1", "--port",
                                 str(port), "--log-level", "warning", "--no-access-log"],
                                cwd=ROOT / "benchmarks" / "seed_poc", env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    wait_port(port, proc, "the PoC (uvicorn)")
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):  # its startup connects to RabbitMQ
        try:
            if httpx.post(url + "/register", json={"client_id": "warm", "count": 1}, timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return proc, url


def wrk(url: str, bodies: list[str], workdir: Path, seconds: int, *, reuse: bool = False) -> dict[str, float]:
    """wrk POSTing each body once, in turn: 2xx/s, p50 and p99 (s), requests sent, non-2xx."""
    script = workdir / f"load_{time.monotonic_ns()}.lua"
    script.write_text("\n".join(
        ["bodies = {"] + ["  " + json.dumps(b) + "," for b in bodies] + ["}", "i = 0", "request = function()",
         "  i = i + 1", "  return wrk.format('POST', nil, {['Content-Type'] = 'application/json'}, "
         "bodies[((i - 1) % #bodies) + 1])", "end"]))
    proc = subprocess.run(["wrk", "-t1", f"-c{CONC}", f"-d{seconds}s", "--latency", "-s", str(script), url],
                          capture_output=True, text=True, timeout=seconds + 120)
    script.unlink()
    out = proc.stdout
    _, p50, p99, bad = parse_wrk(out)
    m = re.search(r"(\d+) requests in ([\d.]+)(us|ms|s|m)", out)
    total = int(m.group(1)) if m else 0
    wall = float(m.group(2)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[m.group(3)] if m else float(seconds)
    if total > len(bodies) and not reuse:
        print(f"  (warning: wrk sent {total} requests for {len(bodies)} tokens: raise BENCH_POC_TOKENS)")
    return {"rps": (total - bad) / wall, "p50": p50, "p99": p99, "sent": total, "bad": bad}


async def inri_bodies(api: str, n: int) -> list[str]:
    """n push bodies, each with a fresh token, for devices homed at api (1,000 per device: its mailbox)."""
    per = 1000
    out: list[str] = []
    devices = [DeviceClient(api) for _ in range((n + per - 1) // per)]
    for d in devices:
        await d.register(tokens=500)
        while len(d.tokens) < per:
            await d.more_tokens(500)
        cred = d.export_credential(per)
        reg = b64e(encode_registration(cred.registration))
        ct = b64e(seal(cred.seal_key, b"y" * 64))
        out += [json.dumps({"registration": reg, "token": b64e(t), "ciphertext": ct}) for t in cred.tokens]
    return out[:n]


def poc_bodies(url: str, n: int) -> list[str]:
    tokens = httpx.post(url + "/register", json={"client_id": f"c{time.monotonic_ns()}", "count": n},
                        timeout=120).json()["tokens"]
    return [json.dumps({"token": t, "payload": {"msg": "y" * 64}}) for t in tokens]


def batched(bodies: list[str], n: int) -> list[str]:
    """Push bodies grouped n per POST /v1/push/batch body."""
    return [json.dumps({"pushes": [json.loads(b) for b in bodies[i:i + n]]}) for i in range(0, len(bodies) - n + 1, n)]


def accepted_total(api: str) -> float:
    """The relay's inri_pushes_accepted_total."""
    text = httpx.get(api + "/metrics", timeout=10).text
    return float(next((ln.split()[-1] for ln in text.splitlines() if ln.startswith("inri_pushes_accepted_total ")), 0))


def start_relay(d: Path, tree: str | None = None) -> dict[str, Any]:
    """One relay (and its bootstrap), load limits, traces off; tree: run another checkout's code."""
    old, cwd = dict(os.environ), os.getcwd()
    os.environ.update(LOAD_ENV)
    if tree:  # `python -m` puts the working directory first on sys.path: the processes start in the tree
        os.environ["PYTHONPATH"] = tree
        os.chdir(tree)
    try:
        return mesh.up(d.resolve(), relays=1, bootstraps=1, timeout_s=90, trace_level="off", profile="default")
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(old)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def one_relay_rounds(d: Path, poc_url: str, poc_pids: list[int]) -> dict[str, dict[str, list[float]]]:
    relays = {"relay": start_relay(d / "relay")}
    if COMPARE_TREE:
        relays["compare"] = start_relay(d / "compare", COMPARE_TREE)
    results: dict[str, dict[str, list[float]]] = {k: {} for k in ["poc", *relays, *(["batch"] if BATCH else [])]}
    try:
        for rnd in range(ROUNDS):
            order = ["poc", *relays, *(["batch"] if BATCH else [])]
            order = order[rnd % len(order):] + order[:rnd % len(order)]  # interleaved, rotating who goes first
            for name in order:
                if name == "poc":
                    bodies = poc_bodies(poc_url, min(TOKENS, 30000))
                    url, pids = poc_url + "/push", poc_pids
                elif name == "batch":  # this tree's relay, the same pushes BATCH per request
                    api = relays["relay"]["relays"][0]["api"]
                    bodies = batched(trio.run(inri_bodies, api, TOKENS), BATCH)
                    url, pids = api + "/v1/push/batch", [relays["relay"]["relays"][0]["pid"]]
                    c0, a0 = sum(cpu_s(p) for p in pids), accepted_total(api)
                    r = wrk(url, bodies, d, SECONDS, reuse=True)
                    pushes = accepted_total(api) - a0
                    r["cpu_ms"] = (sum(cpu_s(p) for p in pids) - c0) * 1000 / max(1.0, pushes)
                    r["rps"] = pushes / SECONDS
                    print(f"  round {rnd + 1} {name:8s} {r['rps']:8,.0f} pushes/s ({BATCH} per request)  "
                          f"p50 {r['p50'] * 1000:6.1f} ms  p99 {r['p99'] * 1000:6.1f} ms  non-2xx {r['bad']:.0f}  "
                          f"CPU/push {r['cpu_ms']:.3f} ms", flush=True)
                    for k, v in r.items():
                        results[name].setdefault(k, []).append(v)
                    continue
                else:
                    api = relays[name]["relays"][0]["api"]
                    bodies = trio.run(inri_bodies, api, TOKENS)
                    url, pids = api + "/v1/push", [relays[name]["relays"][0]["pid"]]
                c0 = sum(cpu_s(p) for p in pids)
                r = wrk(url, bodies, d, SECONDS)
                cpu = sum(cpu_s(p) for p in pids) - c0
                r["cpu_ms"] = cpu * 1000 / max(1.0, r["rps"] * SECONDS)
                print(f"  round {rnd + 1} {name:8s} {r['rps']:8,.0f} 2xx/s  p50 {r['p50'] * 1000:6.1f} ms  "
                      f"p99 {r['p99'] * 1000:6.1f} ms  non-2xx {r['bad']:.0f}  CPU/push {r['cpu_ms']:.3f} ms",
                      flush=True)
                for k, v in r.items():
                    results[name].setdefault(k, []).append(v)
    finally:
        for name in relays:
            mesh.down(d / name)
    return results


# -- 3. the 3-hop line ------------------------------------------------------------------------------

def start_line(d: Path, procs: list[subprocess.Popen[bytes]], tree: str | None = None) -> dict[str, Any]:
    """Relays R1 - R2 - R3 - R4 on a line: bootstrap Bk knows only Rk and Rk+1 (each relay asks only
    the bootstraps of its links); the ends keep one neighbour, the middle relays two. tree: run another
    checkout's code (the processes start in it: `python -m` puts it first on sys.path)."""
    if tree:
        cwd = os.getcwd()
        os.chdir(tree)
        try:
            return start_line(d.resolve(), procs)
        finally:
            os.chdir(cwd)
    d.mkdir()
    py = sys.executable
    boots: list[str] = []
    deadline = time.monotonic() + 120
    info: dict[str, Any] = {"dir": str(d), "bootstraps": [], "relays": []}
    benv = {"INRI_BOOTSTRAP_PER_PREFIX_MAX": "10000", "INRI_BOOTSTRAP_RATE_PER_S": "1000",
            "INRI_BOOTSTRAP_RATE_BURST": "2000"}
    for i in range(3):
        log = d / f"b{i + 1}.log"
        proc = mesh._spawn([py, "-m", "bootstrap_nodes.cli", "serve", "--listen", "127.0.0.1:0", "--data-dir",
                            str(d / f"b{i + 1}"), "--allow-private"], log, benv)
        procs.append(proc)
        boots.append(mesh.bootstrap_url(proc, log, deadline))
    for i in range(4):
        rdir = d / f"r{i + 1}"
        rdir.mkdir()
        mine = [boots[j] for j in (i - 1, i) if 0 <= j < 3]
        ends = i in (0, 3)
        # active_min = active_max: a middle relay keeps dialling until it has both of its neighbours.
        engine = {"active_min": 1 if ends else 2, "active_max": 1 if ends else 2, "outbound_min": 0,
                  "priority_join_below": 1}
        (rdir / "relay.toml").write_text(mesh.relay_config(rdir, 0, 0, mine, "line", "off", "default", engine))
        log = d / f"r{i + 1}.log"
        procs.append(mesh._spawn([py, "-m", "inri.cli", "relay", "--config", str(rdir / "relay.toml")], log, LOAD_ENV))
        info["relays"].append({"name": f"R{i + 1}", "pid": procs[-1].pid, "data_dir": str(rdir), "log": str(log),
                               "boots": mine})
    for r, proc in zip(info["relays"], procs[-4:], strict=True):  # this line's relays (procs may hold more)
        ready = mesh.relay_ready(Path(r["data_dir"]), proc, Path(r["log"]), deadline)
        r.update(api=ready["api"], quic=ready["quic"], node_id=ready["node_id"])
    # A relay announces to ONE of its bootstraps: announce each middle relay to both of its own, so
    # the bootstrap of every link knows both ends of it.
    for r in info["relays"]:
        ident = NodeIdentity.load_or_create(Path(r["data_dir"]) / "node.key")
        now = time.time()
        body = encode_record(make_record(ident, [r["quic"]], None, 100, int(now * 1000) + 1, int(now)))
        for b in r["boots"]:
            answer = httpx.post(b + "/v1/announce", content=body, headers={"content-type": "application/msgpack"},
                                timeout=10)
            if answer.status_code != 200:
                raise RuntimeError(f"announcing {r['name']} to {b}: {answer.status_code} {answer.text[:200]}")
    want = [1, 2, 2, 1]
    while True:
        got = [len(mesh.status(r["api"])["neighbours"]) for r in info["relays"]]
        if got == want:
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"the line did not form: neighbour counts {got}")
        time.sleep(0.3)
    return info


async def line_push(info: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """One wrk run at the line's entry with fresh devices; figures of this run only (a line runs several)."""
    entry, home = info["relays"][0], info["relays"][-1]
    async with httpx.AsyncClient(timeout=10) as c:
        routes0 = (await c.get(entry["api"] + "/v1/status")).json()["routes"]
        metrics0 = (await c.get(entry["api"] + "/metrics")).text
        at_home0 = (await c.get(home["api"] + "/metrics")).text
    bodies = await inri_bodies(home["api"], TOKENS)
    if LINE_SPREAD:
        bodies = [bodies[d * 1000 + k] for k in range(1000) for d in range(len(bodies) // 1000)]
    async with httpx.AsyncClient(timeout=10) as c:
        with trio.move_on_after(120) as waited:
            while (await c.get(entry["api"] + "/v1/status")).json()["routes"] < routes0 + len(bodies) // 1000:
                await trio.sleep(0.2)
        if waited.cancelled_caught:
            raise RuntimeError(f"the entry relay did not learn the {len(bodies) // 1000} new routes in 120 s")
        pids = [r["pid"] for r in info["relays"]]
        c0 = [cpu_s(p) for p in pids]
        t0 = time.perf_counter()
        r = await trio.to_thread.run_sync(wrk, entry["api"] + "/v1/push", bodies, workdir, LINE_SECONDS)
        with trio.move_on_after(300) as waited:
            while (await c.get(entry["api"] + "/v1/status")).json()["custody"] > 0:
                await trio.sleep(0.05)
        if waited.cancelled_caught:
            left = (await c.get(entry["api"] + "/v1/status")).json()["custody"]
            raise RuntimeError(f"the entry relay still held {left} pushes in custody 300 s after the load")
        wall = time.perf_counter() - t0
        cpu = [cpu_s(p) - c for p, c in zip(pids, c0, strict=True)]
        metrics = (await c.get(entry["api"] + "/metrics")).text
        at_home = (await c.get(home["api"] + "/metrics")).text

    def counter(text: str, name: str) -> float:
        return float(next((ln.split()[-1] for ln in text.splitlines() if ln.startswith(name + " ")), "0"))

    def delta(now: str, before: str, name: str) -> float:
        return counter(now, name) - counter(before, name)

    stored = int(delta(metrics, metrics0, 'inri_custody_settled_total{status="delivered"}'))
    batches = delta(at_home, at_home0, 'inri_engine_events_total{event="receipt_batches_sent"}')
    batched = delta(at_home, at_home0, 'inri_engine_events_total{event="receipts_batched"}')
    return {"accepted": r["rps"], "stored": stored, "stored_rate": stored / wall, "p99": r["p99"],
            "cpu_ms": [c * 1000 / max(1, stored) for c in cpu], "receipt_batches": batches,
            "receipts_per_batch": batched / batches if batches else 0.0}


def bare_servers(d: Path) -> dict[str, dict[str, float]]:
    """A bare ASGI app answering 202, under hypercorn and under the relay's front, the same wrk load."""
    (d / "bare_app.py").write_text(BARE_APP)
    (d / "bare_lean.py").write_text(
        "import functools, sys, trio\nfrom inri.common.front import FrontSettings, HttpServer, listening_socket\n"
        "from bare_app import app\nsock = listening_socket(sys.argv[1])\n"
        "server = HttpServer(app, FrontSettings())\n"
        "trio.run(functools.partial(server.run, [sock], shutdown_trigger=trio.sleep_forever))\n")
    out: dict[str, dict[str, list[float]]] = {"hypercorn": {}, "front": {}}
    procs = {}
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{d}"}
    for name in out:
        port = free_port()
        args = ([sys.executable, "-m", "hypercorn", "--worker-class", "trio", "-b", f"127.0.0.1:{port}", "bare_app:app"]
                if name == "hypercorn" else [sys.executable, "bare_lean.py", f"127.0.0.1:{port}"])
        procs[name] = (subprocess.Popen(args, cwd=d, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True), port)
    try:
        for name, (proc, port) in procs.items():
            wait_port(port, proc, name)
        body = [json.dumps({"registration": "x" * 200, "token": "y" * 22, "ciphertext": "z" * 150})]
        for _ in range(ROUNDS):
            for name, (proc, port) in procs.items():
                c0 = cpu_s(proc.pid)
                r = wrk(f"http://127.0.0.1:{port}/v1/push", body * 10, d, 3, reuse=True)
                r["cpu_ms"] = (cpu_s(proc.pid) - c0) * 1000 / max(1.0, r["sent"])
                for k, v in r.items():
                    out[name].setdefault(k, []).append(v)
    finally:
        for proc, _ in procs.values():
            stop(proc)
    return {name: {k: median(v) for k, v in figs.items()} for name, figs in out.items()}


def _line_medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    line: dict[str, Any] = {k: median([r[k] for r in runs]) for k in ("accepted", "stored_rate", "receipt_batches",
                                                                      "receipts_per_batch")}
    line["stored"] = sum(r["stored"] for r in runs)
    line["cpu_ms"] = [median([r["cpu_ms"][i] for r in runs]) for i in range(4)]
    line["cpu_worst"] = [max(r["cpu_ms"][i] for r in runs) for i in range(4)]
    line["runs"] = len(runs)
    return line


def main() -> None:
    lacking = missing()
    if lacking:
        print("bench_poc skipped: missing " + "; ".join(lacking) + ". `make bench` installs the system packages "
              "(as root, via apt-get); the Python ones are the `bench` extra.")
        return
    with tempfile.TemporaryDirectory(prefix="inri-poc-") as tmp:
        d = Path(tmp)
        cleanup: list[Callable[[], None]] = []
        try:
            rmq, amqp_port = start_rabbitmq(d / "rabbitmq")
            cleanup.append(lambda: stop(rmq))
            poc, poc_url = start_poc(d, amqp_port)
            cleanup.append(lambda: stop(poc))
            print(f"1. PoC (uvicorn + RabbitMQ) vs one INRI relay, wrk -t1 -c{CONC}, {SECONDS} s per round, "
                  f"{ROUNDS} interleaved rounds" + (f", compare tree {COMPARE_TREE}" if COMPARE_TREE else ""),
                  flush=True)
            res = one_relay_rounds(d, poc_url, [poc.pid, rmq.pid])
            for f in cleanup[::-1]:
                f()
            cleanup.clear()
            print("2. bare ASGI 202 endpoint: hypercorn vs the relay's front (inri/common/front)", flush=True)
            bare = bare_servers(d)
            print("3. a 3-hop line R1 (entry) - R2 - R3 - R4 (home)", flush=True)
            line: dict[str, Any] = {}
            compare_line: dict[str, Any] = {}
            line_procs: list[subprocess.Popen[bytes]] = []
            try:
                lines = {"this tree": start_line(d / "line", line_procs)}
                if COMPARE_TREE:
                    lines[COMPARE_TREE] = start_line(d / "line-compare", line_procs, COMPARE_TREE)
                runs: dict[str, list[dict[str, Any]]] = {name: [] for name in lines}
                for i in range(LINE_RUNS):
                    for name in (list(lines) if i % 2 == 0 else list(lines)[::-1]):  # interleaved
                        one = trio.run(line_push, lines[name], d)
                        runs[name].append(one)
                        print(f"  run {i + 1}{'' if len(lines) == 1 else ' (' + name + ')'}: stored "
                              f"{one['stored_rate']:,.0f}/s, CPU per push "
                              + " / ".join(f"{x:.3f}" for x in one["cpu_ms"]) + " ms (entry / fwd / fwd / home)",
                              flush=True)
                line = _line_medians(runs["this tree"])
                if COMPARE_TREE:
                    compare_line = _line_medians(runs[COMPARE_TREE])
            except (RuntimeError, trio.TooSlowError, httpx.HTTPError) as exc:
                kept = Path(tempfile.mkdtemp(prefix="inri-bench-line-failed-"))
                for name in ("line", "line-compare"):
                    for log in (d / name).glob("*.log"):
                        shutil.copy(log, kept / f"{name}-{log.name}")
                print(f"  the 3-hop line failed: {exc!r} (its logs: {kept})")
            finally:
                for proc in line_procs:
                    stop(proc)
        finally:
            for f in cleanup[::-1]:
                f()
    med = {name: {k: median(v) for k, v in figs.items()} for name, figs in res.items()}
    poc_rps = med["poc"]["rps"]
    print()
    print(f"{'':24s}{'2xx/s':>10s}{'ratio':>8s}{'p50 ms':>9s}{'p99 ms':>9s}{'CPU/push ms':>13s}")
    batch = med.pop("batch", None)
    for name, m in med.items():
        label = {"poc": "seed PoC", "relay": "INRI relay (this tree)", "compare": f"INRI relay ({COMPARE_TREE})"}[name]
        print(f"{label[:24]:24s}{m['rps']:10,.0f}{m['rps'] / poc_rps:8.2f}{m['p50'] * 1000:9.1f}{m['p99'] * 1000:9.1f}"
              f"{m['cpu_ms'] if name != 'poc' else float('nan'):13.3f}")
    print(f"(PoC CPU/push, uvicorn + RabbitMQ: {med['poc']['cpu_ms']:.3f} ms)")
    if batch is not None:
        print(f"POST /v1/push/batch, {BATCH} per request (this tree; not the 3x figure): {batch['rps']:,.0f} "
              f"pushes/s ({batch['rps'] / poc_rps:.2f}x the PoC's single pushes), request p99 "
              f"{batch['p99'] * 1000:.1f} ms, CPU/push {batch['cpu_ms']:.3f} ms")
    for name, m in bare.items():
        print(f"bare 202 under {name:10s} {m['rps']:10,.0f}/s  p99 {m['p99'] * 1000:.1f} ms  CPU/request "
              f"{m['cpu_ms']:.3f} ms")
    cpu = line.get("cpu_ms") or [float("nan")] * 4
    worst = line.get("cpu_worst") or [float("nan")] * 4
    line.setdefault("stored_rate", float("nan"))
    print(f"3-hop line, medians of {line.get('runs', 0)} runs: accepted {line.get('accepted', float('nan')):,.0f}/s "
          f"at the entry, stored end to end {line['stored_rate']:,.0f}/s ({line['stored_rate'] / poc_rps:.2f}x the "
          f"PoC), {line.get('stored')} pushes in all")
    print(f"CPU per push: entry {cpu[0]:.3f} ms, forwarding {cpu[1]:.3f} / {cpu[2]:.3f} ms, home {cpu[3]:.3f} ms "
          f"(worst run: {worst[0]:.3f} / {worst[1]:.3f} / {worst[2]:.3f} / {worst[3]:.3f})")
    print(f"receipts from the home: {line.get('receipt_batches', 0):,.0f} batches (rule F5b), "
          f"{line.get('receipts_per_batch', 0.0):.1f} receipts each" + (" (pushes spread over the devices)"
                                                                         if LINE_SPREAD else ""))
    if compare_line:
        ccpu = compare_line["cpu_ms"]
        print(f"3-hop line of {COMPARE_TREE} (runs interleaved with this tree's): stored "
              f"{compare_line['stored_rate']:,.0f}/s, CPU per push entry {ccpu[0]:.3f} ms, forwarding {ccpu[1]:.3f} / "
              f"{ccpu[2]:.3f} ms, home {ccpu[3]:.3f} ms; this tree / that tree: entry {cpu[0] / ccpu[0]:.3f}, "
              f"forwarding {cpu[1] / ccpu[1]:.3f} / {cpu[2] / ccpu[2]:.3f}, home {cpu[3] / ccpu[3]:.3f}")
    relay = med["relay"]
    figures = [
        {"metric": "one relay pushes/s vs seed PoC", "value": round(relay["rps"] / poc_rps, 2), "unit": "x",
         "ceiling": "aim >= 3x", "note": f"{relay['rps']:,.0f}/s vs {poc_rps:,.0f}/s; p99 {relay['p99'] * 1000:.1f} ms "
                                         f"vs PoC {med['poc']['p99'] * 1000:.1f} ms"},
        {"metric": "CPU per push, one relay", "value": round(relay["cpu_ms"], 3), "unit": "ms"},
        {"metric": "3-hop stored/s vs seed PoC", "value": round(line["stored_rate"] / poc_rps, 2), "unit": "x",
         "ceiling": "aim >= 1.5x", "note": f"{line['stored_rate']:,.0f}/s"},
        {"metric": "CPU per push entry/fwd/home", "value": round(cpu[0], 3), "unit": "ms",
         "ceiling": "aim 0.35/0.2/0.3", "note": f"fwd {cpu[1]:.3f}/{cpu[2]:.3f}, home {cpu[3]:.3f}; medians of "
                                                f"{line.get('runs', 0)} runs, worst entry {worst[0]:.3f}"},
        {"metric": "bare 202: front vs hypercorn", "value": round(bare["front"]["rps"] / bare["hypercorn"]["rps"], 2),
         "unit": "x", "note": f"{bare['front']['rps']:,.0f}/s vs {bare['hypercorn']['rps']:,.0f}/s"},
    ]
    if batch is not None:
        figures.append({"metric": f"one relay, push batch of {BATCH}, vs seed PoC", "value":
                        round(batch["rps"] / poc_rps, 2), "unit": "x",
                        "note": f"{batch['rps']:,.0f} pushes/s, CPU/push {batch['cpu_ms']:.3f} ms"})
    if compare_line:
        figures.append({"metric": "3-hop entry CPU per push vs compare tree", "unit": "x",
                        "value": round(cpu[0] / compare_line["cpu_ms"][0], 3),
                        "note": f"{COMPARE_TREE}: entry {compare_line['cpu_ms'][0]:.3f} ms (medians of "
                                f"{compare_line['runs']} interleaved runs)"})
    if "compare" in med:
        figures.append({"metric": "one relay vs compare tree", "value": round(relay["rps"] / med["compare"]["rps"], 2),
                        "unit": "x", "note": f"{COMPARE_TREE}: {med['compare']['rps']:,.0f}/s"})
    print(json.dumps({"bench": "poc", "figures": figures}))


if __name__ == "__main__":
    main()
