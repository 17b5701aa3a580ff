"""Overload without loss at full rate (issue 16): an app pushes into an entry relay as fast as it can for
60 s while the path drains far slower; prints what was accepted (202), refused (429), stored, lost.

Real processes on loopback: a bootstrap, a home relay H and an entry relay E linked to H, default
timers and the documented backpressure defaults (`[api] custody_backlog_s` 10, `custody_backlog_min`
200); E's uplink is capped at PATH_RATE pushes/s with `[quic] link_push_rate_per_s`. Lost = answered
202 but neither stored at the home nor still in custody at the entry (must be 0); cuts = neighbours
cut for their score (must be 0).

Usage: python benchmarks/bench_overload.py [--seconds S] [--rate R]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

from inri import mesh
from inri.client import DeviceClient
from inri.client.credential import seal
from inri.common.b64url import b64e
from inri.node.metrics import parse_metrics
from inri.protocol.codec import encode_registration

CONNECTIONS = 32
SETTLE_S = 180.0  # after the load: every 202 must settle within this


def metrics(api: str) -> dict[str, float]:
    return parse_metrics(httpx.get(api + "/metrics", timeout=10).text)


def start(d: Path, rate: float) -> tuple[list[subprocess.Popen[bytes]], dict[str, dict[str, Any]]]:
    procs: list[subprocess.Popen[bytes]] = []
    deadline = time.monotonic() + 60
    blog = d / "boot.log"
    boot = subprocess.Popen([sys.executable, "-m", "bootstrap_nodes.cli", "serve", "--listen", "127.0.0.1:0",
                             "--data-dir", str(d / "boot"), "--allow-private"], stdout=blog.open("ab"),
                            stderr=subprocess.STDOUT)
    procs.append(boot)
    url = mesh.bootstrap_url(boot, blog, deadline)
    extra = {"E": f"[quic]\nlink_push_rate_per_s = {rate}\n"
                  "[api]\nrate_per_s = 100000.0\nrate_burst = 100000\ndevice_rate_per_s = 100000.0\n"
                  "device_rate_burst = 100000\n",
             "H": "[api]\ntokens_max = 1000\nmailbox_max = 1000000\n"}
    relays: dict[str, dict[str, Any]] = {}
    for name in ("H", "E"):
        rd = d / name
        rd.mkdir()
        cfg = rd / "relay.toml"
        cfg.write_text(mesh.relay_config(rd, 0, 0, [url], "salt", "off", "default", lab_limits=False) + extra[name])
        log = d / f"{name}.log"
        p = subprocess.Popen([sys.executable, "-m", "inri.cli", "relay", "--config", str(cfg)], stdout=log.open("ab"),
                             stderr=subprocess.STDOUT)
        procs.append(p)
        relays[name] = {**mesh.relay_ready(rd, p, log, deadline), "log": log}
    while not all(mesh.status(r["api"])["neighbours"] for r in relays.values()):
        if time.monotonic() > deadline:
            raise RuntimeError("relays did not link")
        time.sleep(0.2)
    return procs, relays


async def run(relays: dict[str, dict[str, Any]], seconds: float) -> dict[str, Any]:
    home, entry = relays["H"]["api"], relays["E"]["api"]
    dev = DeviceClient(home)
    await dev.register(tokens=1000)
    with trio.fail_after(60):
        while not mesh.status(entry)["routes"]:
            await trio.sleep(0.1)
    reg = ""
    seal_key = b""
    tokens: list[bytes] = []

    async def refill() -> None:
        nonlocal reg, seal_key
        if len(dev.tokens) < 1000:
            await dev.more_tokens(1000)
        cred = dev.export_credential(len(dev.tokens))
        reg, seal_key = b64e(encode_registration(cred.registration)), cred.seal_key
        tokens.extend(cred.tokens)

    await refill()
    accepted: dict[str, bytes] = {}
    codes: collections.Counter[int] = collections.Counter()
    retry_after: list[int] = []
    t_end = trio.current_time() + seconds
    n = 0
    async with httpx.AsyncClient(timeout=30, limits=httpx.Limits(max_connections=CONNECTIONS)) as client:

        async def worker() -> None:
            nonlocal n
            while trio.current_time() < t_end:
                if not tokens:
                    await refill()
                    continue
                token = tokens.pop()
                n += 1
                text = f"push {n}".encode()
                body = {"registration": reg, "token": b64e(token), "ciphertext": b64e(seal(seal_key, text))}
                r = await client.post(entry + "/v1/push", json=body)
                codes[r.status_code] += 1
                if r.status_code == 202:
                    accepted[r.json()["push_id"]] = text
                elif r.status_code == 429:
                    retry_after.append(int(r.headers.get("retry-after", "0")))

        async with trio.open_nursery() as nursery:
            for _ in range(CONNECTIONS):
                nursery.start_soon(worker)
    load_s = seconds
    t0 = trio.current_time()
    with trio.move_on_after(SETTLE_S):
        while metrics(entry).get("inri_custody_pushes", 0) > 0:
            await trio.sleep(1.0)
    settle_s = trio.current_time() - t0
    stored: list[Any] = []
    while batch := await dev.pull(limit=500):  # an ack of 500 ids stays under the body limit
        stored += batch
        await dev.ack([m.id for m in batch])
    await dev.aclose()
    me, mh = metrics(entry), metrics(home)
    pending = int(me.get("inri_custody_pushes", 0))
    ids = collections.Counter(m.id for m in stored)
    return {
        "load_s": load_s, "settle_s": settle_s, "codes": dict(codes), "accepted": len(accepted),
        "refused_429": codes.get(429, 0), "stored": len(ids), "duplicates": sum(c - 1 for c in ids.values()),
        "pending": pending, "lost": len(set(accepted) - set(ids)) - pending,
        "wrong": sum(1 for m in stored if accepted.get(m.id) != m.plaintext),
        "cuts": me.get("inri_peers_cut_total", 0) + mh.get("inri_peers_cut_total", 0),
        "settled": {k.split('"')[1]: v for k, v in me.items() if k.startswith("inri_custody_settled_total{")},
        "retry_after_max": max(retry_after, default=0),
        "overload_warnings": relays["E"]["log"].read_text().count("overloaded: answering 429"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--rate", type=float, default=20.0, help="pushes/s the entry relay's uplink carries")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="inri-overload-") as d:
        procs, relays = start(Path(d), a.rate)
        try:
            res = trio.run(run, relays, a.seconds)
        finally:
            for p in reversed(procs):
                p.terminate()
                p.wait(10)
    print(f"overload, {a.seconds:.0f} s at full rate ({CONNECTIONS} connections) into a relay whose path drains "
          f"{a.rate:.0f}/s (loaded 2-core machine):")
    print(f"  answered 202: {res['accepted']}   429: {res['refused_429']} (Retry-After up to "
          f"{res['retry_after_max']} s)   other: {sum(v for k, v in res['codes'].items() if k not in (202, 429))}")
    print(f"  stored at home: {res['stored']}   still in custody at the end: {res['pending']}   "
          f"lost (202, neither stored nor in custody): {res['lost']}   duplicates: "
          f"{res['duplicates']}   wrong content: {res['wrong']}")
    print(f"  statuses at the entry: {res['settled']}   settled {res['settle_s']:.1f} s after the load")
    print(f"  neighbours cut: {res['cuts']:.0f}   overload warnings logged: {res['overload_warnings']}")
    print(json.dumps({"bench": "overload", "figures": [
        {"metric": "overload: pushes lost (202 not stored)", "value": res["lost"], "unit": "",
         "ceiling": "must be 0",
         "note": f"{res['accepted']} x 202, {res['refused_429']} x 429, {res['stored']} stored, "
                 f"{a.seconds:.0f} s into a {a.rate:.0f}/s path"},
        {"metric": "overload: honest neighbours cut", "value": int(res["cuts"]), "unit": "", "ceiling": "must be 0"},
        {"metric": "overload: accepted/s", "value": round(res["accepted"] / res["load_s"], 1), "unit": "/s",
         "ceiling": f"path drains {a.rate:.0f}/s", "note": f"duplicates {res['duplicates']}"},
    ]}))


if __name__ == "__main__":
    main()
