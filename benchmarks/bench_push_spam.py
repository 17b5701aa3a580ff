"""A push spammer against a real relay (issue 6): honest end-to-end latency with and without it.

Real processes: one bootstrap and two relays (`inri mesh up`) with the DOCUMENTED API rate limits
(not the lab's raised ones). Relay A takes pushes, relay B is the devices' home. The honest home app
pushes from 127.0.0.2 at BENCH_SPAM_HONEST_RATE pushes/s (default 4) and measures each push from
its POST at A until the device's WebSocket at B has it. The spammer is wrk from 127.0.0.1 with
BENCH_SPAM_CONNECTIONS connections (default 64) POSTing valid-looking pushes (its own registered
device, random tokens) as fast as A answers: far beyond A's capacity, so what A answers per second
is the attack rate. Printed: honest p50/p99 unloaded and under spam (same run), honest pushes lost,
spam requests answered per second and how many got in (202) vs refused (429).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from inri import mesh
from inri.client import DeviceClient, HomeAppClient
from inri.client.credential import b64e, seal
from inri.protocol.codec import encode_registration

HONEST_N = int(os.environ.get("BENCH_SPAM_HONEST_N", "100"))
HONEST_RATE = float(os.environ.get("BENCH_SPAM_HONEST_RATE", "4"))
CONNS = int(os.environ.get("BENCH_SPAM_CONNECTIONS", "64"))


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    k = max(1, -(-len(s) * p // 100))  # nearest rank
    return s[int(k) - 1]


async def honest_run(a_api: str, dev: DeviceClient, n: int) -> tuple[list[float], int]:
    """n pushes from 127.0.0.2, paced; returns (latencies of delivered ones, lost)."""
    cred = dev.export_credential(n)
    transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    lat: list[float] = []
    lost = 0
    async with httpx.AsyncClient(transport=transport, timeout=30) as client, dev.stream() as messages:
        app = HomeAppClient([a_api], client=client)
        for _ in range(n):
            t = time.perf_counter()
            receipt = await app.push(cred, b"honest")
            got = False
            with trio.move_on_after(30):
                while (await messages.receive()).id != receipt.push_id:
                    pass
                got = True
                lat.append(time.perf_counter() - t)
            lost += not got
            await trio.sleep(max(0.0, 1.0 / HONEST_RATE - (time.perf_counter() - t)))
    return lat, lost


def wrk(url: str, body: list[str], seconds: int, workdir: Path) -> dict[str, float]:
    script = workdir / "spam.lua"
    script.write_text("bodies = {" + ",".join(json.dumps(b) for b in body) + "}\ni = 0\n"
                      "request = function()\n  i = i + 1\n"
                      "  return wrk.format('POST', nil, {['Content-Type'] = 'application/json'}, "
                      "bodies[((i - 1) % #bodies) + 1])\nend\n"
                      "done = function(summary, latency, requests)\n"
                      "  io.write(string.format('STATUS requests=%d\\n', summary.requests))\nend\n")
    proc = subprocess.run(["wrk", "-t1", f"-c{CONNS}", f"-d{seconds}s", "-s", str(script), url],
                          capture_output=True, text=True, timeout=seconds + 60)
    out = proc.stdout
    import re

    got = re.search(r"Requests/sec:\s+([\d.]+)", out)
    rps = float(got.group(1)) if got else 0.0
    m = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    total = re.search(r"STATUS requests=(\d+)", out)
    return {"rps": rps, "non2xx": float(m.group(1)) if m else 0.0, "requests": float(total.group(1)) if total else 0.0}


async def bench(info: dict[str, Any], workdir: Path) -> dict[str, Any]:
    a, b = info["relays"][0], info["relays"][1]
    honest = DeviceClient(b["api"])
    await honest.register(tokens=2 * HONEST_N + 10)
    spammer = DeviceClient(b["api"])
    await spammer.register(tokens=10)
    async with httpx.AsyncClient(timeout=5) as c:
        while (await c.get(a["api"] + "/v1/status")).json()["routes"] < 2:
            await trio.sleep(0.05)
    quiet, quiet_lost = await honest_run(a["api"], honest, HONEST_N)
    cred = spammer.export_credential(1)
    reg = b64e(encode_registration(cred.registration))
    bodies = [json.dumps({"registration": reg, "token": b64e(os.urandom(16)),
                          "ciphertext": b64e(seal(cred.seal_key, b"spam" * 16))}) for _ in range(500)]
    seconds = int(HONEST_N / HONEST_RATE) + 10
    spam: dict[str, float] = {}
    loaded: list[float] = []
    loaded_lost = 0

    async def run_spam() -> None:
        spam.update(await trio.to_thread.run_sync(wrk, a["api"] + "/v1/push", bodies, seconds, workdir))

    async with trio.open_nursery() as n:
        n.start_soon(run_spam)
        await trio.sleep(3)  # the spam is at full rate before the honest pushes start
        loaded, loaded_lost = await honest_run(a["api"], honest, HONEST_N)
    async with httpx.AsyncClient(timeout=5) as c:
        metrics = (await c.get(a["api"] + "/metrics")).text
    accepted = float(next(ln.split()[-1] for ln in metrics.splitlines() if ln.startswith("inri_pushes_accepted_total")))
    return {"quiet": quiet, "quiet_lost": quiet_lost, "loaded": loaded, "loaded_lost": loaded_lost, "spam": spam,
            "accepted_total": accepted}


def main() -> int:
    if not shutil.which("wrk"):
        print("wrk not installed: the spam benchmark needs it (apt install wrk)")
        print(json.dumps({"bench": "push_spam", "figures": []}))
        return 0
    with tempfile.TemporaryDirectory() as d:
        info = mesh.up(d, relays=2, bootstraps=1, timeout_s=60, min_neighbours=1, trace_level="off",
                       lab_limits=False)
        try:
            r = trio.run(bench, info, Path(d))
        finally:
            mesh.down(d)
    q, lo = r["quiet"], r["loaded"]
    spam = r["spam"]
    answered = spam["rps"]
    got_in = r["accepted_total"] - 2 * HONEST_N
    print(f"honest unloaded: n={len(q)} p50 {pct(q, 50) * 1000:.1f} ms p99 {pct(q, 99) * 1000:.1f} ms "
          f"lost {r['quiet_lost']}")
    print(f"honest under spam: n={len(lo)} p50 {pct(lo, 50) * 1000:.1f} ms p99 {pct(lo, 99) * 1000:.1f} ms "
          f"lost {r['loaded_lost']}")
    print(f"spam: {answered:,.0f} requests/s answered ({spam['requests']:,.0f} in all), {spam['non2xx']:,.0f} refused, "
          f"{got_in:,.0f} accepted; machine {os.cpu_count()} cores")
    ratio = pct(lo, 99) / pct(q, 99)
    figures = [
        {"metric": "honest e2e p99 under push spam / unloaded", "value": round(ratio, 2), "unit": "x",
         "ceiling": "<= 2",
         "note": f"{pct(lo, 99) * 1000:.1f} ms vs {pct(q, 99) * 1000:.1f} ms; "
                 f"lost {r['loaded_lost']}+{r['quiet_lost']}"},
        {"metric": "spam requests answered by the relay", "value": round(answered), "unit": "/s",
         "note": f"{CONNS} wrk connections; {got_in:,.0f} got in (per-device limit), rest 429"},
    ]
    print(json.dumps({"bench": "push_spam", "figures": figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
