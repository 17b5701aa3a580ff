"""Web Push pushes/s accepted at one relay beside native /v1/push pushes/s, and each kind's CPU per push at the
entry relay, in the same run.

Real processes: one bootstrap and two relays (`inri mesh up`): the device is homed at R1, both kinds of
pushes enter at R2 (one QUIC hop from home). Web Push requests are shaped as pywebpush sends them
(aes128gcm body made by pywebpush's encoder, `vapid t=...,k=...` with a fresh ES256 JWT per request,
`TTL`), so R2 opens the endpoint URL (its token's signature, once per URL), verifies VAPID and the
registration, tags, takes custody and waits for the home's receipt before its 201; native pushes get their
202 after custody. JWTs and bodies are made before the clock starts (the load generator must not be the
bottleneck). Rate limits are raised for the run (env INRI_WEBPUSH_*): this measures the relay, not its limits.
The two kinds run in interleaved rounds (native, Web Push, Web Push, native, ...) so load from other
processes on the machine hits both alike; the figures are the medians of the rounds and their ratio.
CPU per push at the entry: utime + stime of R2's process over a round (/proc/<pid>/stat), divided by the
pushes of the round.
BENCH_COMPARE_TREE=/path/to/another/checkout (e.g. `git archive main` unpacked) adds a second mesh running
that tree's code, its rounds interleaved with this tree's: both trees' figures and the ratios of their CPU
per push at the entry are printed (the client side, this process, is the same for both).
Env: BENCH_WP_PUSHES (per kind, default 3000), BENCH_WP_ROUNDS (6), BENCH_CONCURRENCY (32).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_poc import cpu_s  # noqa: E402  (this directory: the script's own)
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from py_vapid import Vapid02  # noqa: E402
from pywebpush import WebPusher  # noqa: E402

from inri import mesh  # noqa: E402
from inri.client import DeviceClient  # noqa: E402
from inri.client.credential import DeviceKeys, seal  # noqa: E402
from inri.common.b64url import b64e  # noqa: E402
from inri.node.store import Store  # noqa: E402
from inri.node.webpush import mint_endpoint, open_endpoint  # noqa: E402
from inri.protocol.codec import encode_registration  # noqa: E402

PUSHES = int(os.environ.get("BENCH_WP_PUSHES", "3000"))
COMPARE_TREE = os.environ.get("BENCH_COMPARE_TREE", "")
CONC = int(os.environ.get("BENCH_CONCURRENCY", "32"))
ROUNDS = max(1, int(os.environ.get("BENCH_WP_ROUNDS", "6")))
for key, value in (("ENDPOINT_RATE_PER_S", "1000000"), ("ENDPOINT_BURST", "1000000"),
                   ("VAPID_RATE_PER_S", "1000000"), ("VAPID_BURST", "1000000")):
    os.environ.setdefault(f"INRI_WEBPUSH_{key}", value)
os.environ.setdefault("INRI_API_MAILBOX_MAX", str(4 * PUSHES))  # a full mailbox would answer 429


async def load(requests: list[tuple[str, dict[str, str], bytes]], want: int) -> tuple[float, int]:
    """POST every request with CONC workers; (requests/s, answers with status `want`)."""
    ok = 0
    it = iter(requests)

    async def worker(c: httpx.AsyncClient) -> None:
        nonlocal ok
        for url, headers, body in it:
            r = await c.post(url, headers=headers, content=body)
            ok += r.status_code == want

    limits = httpx.Limits(max_connections=CONC, max_keepalive_connections=CONC)
    async with httpx.AsyncClient(timeout=60, limits=limits) as c:
        t0 = time.perf_counter()
        async with trio.open_nursery() as n:
            for _ in range(CONC):
                n.start_soon(worker, c)
        return len(requests) / (time.perf_counter() - t0), ok


Requests = list[tuple[str, dict[str, str], bytes]]


async def prepare(info: dict[str, Any]) -> tuple[DeviceClient, Requests, Requests]:
    """A device homed at R1, its Web Push and native requests entering at R2 (made before any clock starts)."""
    home, entry = info["relays"][0]["api"], info["relays"][1]["api"]
    dev = DeviceClient(home)
    await dev.register(tokens=500)
    async with httpx.AsyncClient(timeout=5) as c:
        while (await c.get(entry + "/v1/status")).json()["routes"] < 1:
            await trio.sleep(0.05)
    endpoints = [await dev.mint_endpoint() for _ in range(8)]
    sub_key = ec.generate_private_key(ec.SECP256R1()).public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    vapid = Vapid02()
    vapid.generate_keys()
    wp: Requests = []
    for i in range(PUSHES):
        ep = endpoints[i % len(endpoints)]
        url = entry + ep.url[len("/".join(ep.url.split("/")[:3])):]
        sub = {"endpoint": url, "keys": {"p256dh": b64e(sub_key), "auth": b64e(os.urandom(16))}}
        body = WebPusher(sub).encode(b"x" * 64, "aes128gcm")["body"]
        auth = vapid.sign({"aud": entry, "sub": "mailto:bench@example.org",
                           "exp": int(time.time()) + 12 * 3600})["Authorization"]
        wp.append((url, {"ttl": "3600", "content-encoding": "aes128gcm", "authorization": auth}, body))
    native: Requests = []
    reg = b64e(encode_registration(dev.keys.registration()))
    seal_pub = bytes(dev.keys.seal_key.public_key)
    while len(native) < PUSHES:
        if not dev.tokens:
            await dev.more_tokens(500)
        for t in dev.export_credential(len(dev.tokens)).tokens:
            body = json.dumps({"registration": reg, "token": b64e(t), "ciphertext": b64e(seal(seal_pub, b"y" * 64))})
            native.append((entry + "/v1/push", {"content-type": "application/json"}, body.encode()))
    return dev, wp, native[:PUSHES]


async def run(meshes: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    prepared = {name: await prepare(info) for name, info in meshes.items()}
    size = max(1, PUSHES // ROUNDS)
    kinds = [("native", 202), ("webpush", 201)]
    requests = {(m, "webpush"): prepared[m][1] for m in meshes} | {(m, "native"): prepared[m][2] for m in meshes}
    rates: dict[tuple[str, str], list[float]] = {(m, k): [] for m in meshes for k, _ in kinds}
    cpu: dict[tuple[str, str], list[float]] = {(m, k): [] for m in meshes for k, _ in kinds}
    oks = {key: 0 for key in rates}
    for r in range(ROUNDS):
        order = [(m, kind) for m in meshes for kind in kinds]
        order = order[r % len(order):] + order[:r % len(order)]  # interleaved, rotating who goes first
        for m, (kind, want) in order:
            dev, entry_pid = prepared[m][0], meshes[m]["relays"][1]["pid"]
            reqs = requests[(m, kind)][r * size:(r + 1) * size]
            c0 = cpu_s(entry_pid)
            rps, ok = await load(reqs, want)
            cpu[(m, kind)].append((cpu_s(entry_pid) - c0) * 1e6 / max(1, len(reqs)))
            rates[(m, kind)].append(rps)
            oks[(m, kind)] += ok
            while ids := [msg.id for msg in await dev.pull(500)]:  # keep the mailbox from filling up
                await dev.ack(ids)
    n = size * ROUNDS
    med = {key: (statistics.median(rates[key]), statistics.median(cpu[key])) for key in rates}
    figures: list[dict[str, Any]] = []
    for m in meshes:
        (nat_rps, nat_cpu), (wp_rps, wp_cpu) = med[(m, "native")], med[(m, "webpush")]
        print(f"[{m}] native /v1/push: {nat_rps:.0f} pushes/s accepted, {nat_cpu:.0f} us CPU per push at the entry, "
              f"medians of {ROUNDS} rounds ({', '.join(f'{x:.0f}' for x in rates[(m, 'native')])} pushes/s; "
              f"{', '.join(f'{x:.0f}' for x in cpu[(m, 'native')])} us; {oks[(m, 'native')]}/{n} 202)")
        print(f"[{m}] Web Push /wp/v1: {wp_rps:.0f} pushes/s accepted, {wp_cpu:.0f} us CPU per push at the entry, "
              f"medians of {ROUNDS} rounds ({', '.join(f'{x:.0f}' for x in rates[(m, 'webpush')])} pushes/s; "
              f"{', '.join(f'{x:.0f}' for x in cpu[(m, 'webpush')])} us; {oks[(m, 'webpush')]}/{n} 201), "
              f"{100 * wp_rps / nat_rps:.0f}% of native")
    this = next(iter(meshes))
    (nat_rps, nat_cpu), (wp_rps, wp_cpu) = med[(this, "native")], med[(this, "webpush")]
    figures += [{"metric": "native /v1/push accepted at one relay", "value": round(nat_rps), "unit": "pushes/s",
                 "note": f"median of {ROUNDS} interleaved rounds"},
                {"metric": "Web Push accepted at one relay (VAPID verified, receipt awaited)", "value": round(wp_rps),
                 "unit": "pushes/s", "note": f"{100 * wp_rps / nat_rps:.0f}% of native (medians); "
                                             f"{oks[(this, 'webpush')]}/{n} 201"},
                {"metric": "Web Push CPU per push at the entry relay", "value": round(wp_cpu), "unit": "us",
                 "note": f"median of {ROUNDS} rounds; native /v1/push: {nat_cpu:.0f} us"}]
    for m in list(meshes)[1:]:
        for kind, _ in kinds:
            ratio = med[(this, kind)][1] / med[(m, kind)][1]
            print(f"CPU per {kind} push at the entry, this tree / {m}: {ratio:.3f} "
                  f"({med[(this, kind)][1]:.0f} us / {med[(m, kind)][1]:.0f} us, medians of interleaved rounds)")
            figures.append({"metric": f"CPU per {kind} push at the entry, this tree / compare tree",
                            "value": round(ratio, 3), "unit": "ratio", "note": m})
    return figures


def open_cost() -> float:
    """Microseconds one `open_endpoint` takes (what an entry relay runs once per distinct endpoint URL:
    canonical base64url, the registration decoded, the token's Ed25519 signature checked), in process."""
    with tempfile.TemporaryDirectory() as tmp:
        keys = DeviceKeys()
        reg = keys.registration()
        store = Store(Path(tmp) / "s.db")
        store.add_device(reg, os.urandom(32), [], 0.0, keys.receipt_secret())
        _tok, url = mint_endpoint(store, "https://push.example.org", reg.route_id, None, os.urandom(32), 0.0)
        r, e = url.rsplit("/", 2)[-2:]
        n = 2000
        best = min(timeit.repeat(lambda: open_endpoint(r, e), number=n, repeat=5)) / n * 1e6
        store.close()
    print(f"open_endpoint (once per distinct URL at an entry relay): {best:.1f} us, best of 5 x {n}")
    return best


def start_mesh(d: Path, tree: str | None = None) -> dict[str, Any]:
    """Two relays and a bootstrap; tree: run another checkout's code (`python -m` puts the working
    directory first on sys.path, so the processes start in the tree; PYTHONPATH for their children)."""
    old, cwd = dict(os.environ), os.getcwd()
    if tree:
        os.environ["PYTHONPATH"] = tree
        os.chdir(tree)
    try:
        # Traces off and default timers, as a relay runs in production (tracing is off by default).
        return mesh.up(d, relays=2, bootstraps=1, timeout_s=90, min_neighbours=1, trace_level="off",
                       profile="default")
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(old)


def main() -> None:
    d = Path(tempfile.mkdtemp(prefix="bench-wp-"))
    meshes: dict[str, dict[str, Any]] = {}
    try:
        meshes["this tree"] = start_mesh(d / "this")
        if COMPARE_TREE:
            meshes[COMPARE_TREE] = start_mesh(d / "compare", COMPARE_TREE)
        figures = trio.run(run, meshes)
        figures.append({"metric": "open an endpoint URL (token signature checked), once per URL at an entry relay",
                        "value": round(open_cost(), 1), "unit": "us", "note": "in process, best of 5"})
    finally:
        for info in meshes.values():
            mesh.down(info["dir"])
    print(json.dumps({"bench": "webpush", "figures": figures}))


if __name__ == "__main__":
    main()
