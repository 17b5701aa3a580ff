"""Web Push pushes/s accepted at one relay beside native /v1/push pushes/s, in the same run.

Real processes: one bootstrap and two relays (`inri mesh up`): the device is homed at R1, both kinds of
pushes enter at R2 (one QUIC hop from home). Web Push requests are shaped as pywebpush sends them
(aes128gcm body made by pywebpush's encoder, `vapid t=...,k=...` with a fresh ES256 JWT per request,
`TTL`), so R2 verifies VAPID and the registration, tags, takes custody and waits for the home's
receipt before its 201; native pushes get their 202 after custody. JWTs and bodies are made before
the clock starts (the load generator must not be the bottleneck). Rate limits are raised for the run
(env INRI_WEBPUSH_*): this measures the relay, not its limits.
The two kinds run in interleaved rounds (native, Web Push, Web Push, native, ...) so load from other
processes on the machine hits both alike; the figures are the medians of the rounds and their ratio.
Env: BENCH_WP_PUSHES (per kind, default 3000), BENCH_WP_ROUNDS (6), BENCH_CONCURRENCY (32).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from py_vapid import Vapid02  # noqa: E402
from pywebpush import WebPusher  # noqa: E402

from inri import mesh  # noqa: E402
from inri.client import DeviceClient  # noqa: E402
from inri.client.credential import seal  # noqa: E402
from inri.common.b64url import b64e  # noqa: E402
from inri.protocol.codec import encode_registration  # noqa: E402

PUSHES = int(os.environ.get("BENCH_WP_PUSHES", "3000"))
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


async def run(info: dict[str, Any]) -> list[dict[str, Any]]:
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
    wp: list[tuple[str, dict[str, str], bytes]] = []
    for i in range(PUSHES):
        ep = endpoints[i % len(endpoints)]
        url = entry + ep.url[len("/".join(ep.url.split("/")[:3])):]
        sub = {"endpoint": url, "keys": {"p256dh": b64e(sub_key), "auth": b64e(os.urandom(16))}}
        body = WebPusher(sub).encode(b"x" * 64, "aes128gcm")["body"]
        auth = vapid.sign({"aud": entry, "sub": "mailto:bench@example.org",
                           "exp": int(time.time()) + 12 * 3600})["Authorization"]
        wp.append((url, {"ttl": "3600", "content-encoding": "aes128gcm", "authorization": auth}, body))
    native: list[tuple[str, dict[str, str], bytes]] = []
    reg = b64e(encode_registration(dev.keys.registration()))
    seal_pub = bytes(dev.keys.seal_key.public_key)
    while len(native) < PUSHES:
        if not dev.tokens:
            await dev.more_tokens(500)
        for t in dev.export_credential(len(dev.tokens)).tokens:
            body = json.dumps({"registration": reg, "token": b64e(t), "ciphertext": b64e(seal(seal_pub, b"y" * 64))})
            native.append((entry + "/v1/push", {"content-type": "application/json"}, body.encode()))
    native = native[:PUSHES]
    size = max(1, PUSHES // ROUNDS)
    rates: dict[str, list[float]] = {"native": [], "webpush": []}
    oks = {"native": 0, "webpush": 0}
    for r in range(ROUNDS):
        order = [("native", native, 202), ("webpush", wp, 201)]
        for kind, reqs, want in order if r % 2 == 0 else order[::-1]:
            rps, ok = await load(reqs[r * size:(r + 1) * size], want)
            rates[kind].append(rps)
            oks[kind] += ok
            while ids := [m.id for m in await dev.pull(500)]:  # keep the mailbox from filling up
                await dev.ack(ids)
    native_rps, wp_rps = statistics.median(rates["native"]), statistics.median(rates["webpush"])
    n = size * ROUNDS
    print(f"native /v1/push: {native_rps:.0f} pushes/s accepted, median of {ROUNDS} rounds "
          f"({', '.join(f'{x:.0f}' for x in rates['native'])}; {oks['native']}/{n} 202)")
    print(f"Web Push /wp/v1: {wp_rps:.0f} pushes/s accepted, median of {ROUNDS} rounds "
          f"({', '.join(f'{x:.0f}' for x in rates['webpush'])}; {oks['webpush']}/{n} 201), "
          f"{100 * wp_rps / native_rps:.0f}% of native")
    return [{"metric": "native /v1/push accepted at one relay", "value": round(native_rps), "unit": "pushes/s",
             "note": f"median of {ROUNDS} interleaved rounds"},
            {"metric": "Web Push accepted at one relay (VAPID verified, receipt awaited)", "value": round(wp_rps),
             "unit": "pushes/s", "note": f"{100 * wp_rps / native_rps:.0f}% of native (medians); "
                                         f"{oks['webpush']}/{n} 201"}]


def main() -> None:
    d = Path(tempfile.mkdtemp(prefix="bench-wp-"))
    info = mesh.up(d, relays=2, bootstraps=1, timeout_s=90, min_neighbours=1)
    try:
        figures = trio.run(run, info)
    finally:
        mesh.down(d)
    print(json.dumps({"bench": "webpush", "figures": figures}))


if __name__ == "__main__":
    main()
