"""One tree's 1-hop mesh for bench_http_push's side-by-side latency rounds (not run by itself).

Run with a source tree first on PYTHONPATH (this one, or BENCH_COMPARE_TREE's): brings up one bootstrap and
two relays from that tree's code (`inri.mesh.up`), registers a device at the second relay, prints
"ready", then for every line "N" on stdin pushes N messages one after another at the first relay with
that tree's own clients and prints the end-to-end latencies (push sent -> message on the device's
WebSocket) as one JSON list; "quit" or end of input takes the mesh down. Only client calls that every
tree since the first wave has are used, so an old tree measures itself with its own client.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time

import httpx
import trio

from inri import mesh
from inri.client import DeviceClient, HomeAppClient


async def e2e_latencies(dev: DeviceClient, app: HomeAppClient, n: int) -> list[float]:
    """n pushes one after another, each timed from the push sent to the message on the device's stream."""
    cred = dev.export_credential(n)
    out: list[float] = []
    async with dev.stream() as messages:
        for _ in range(n):
            t = time.perf_counter()
            receipt = await app.push(cred, b"x" * 64)
            while (await messages.receive()).id != receipt.push_id:
                pass
            out.append(time.perf_counter() - t)
    await dev.ack([m.id for m in await dev.pull(limit=1000)])
    return out


async def serve(info: dict) -> None:  # type: ignore[type-arg]
    a, b = info["relays"][0], info["relays"][1]
    dev = DeviceClient(b["api"])
    await dev.register(tokens=500)
    async with httpx.AsyncClient(timeout=5) as c:
        while (await c.get(a["api"] + "/v1/status")).json()["routes"] < 1:
            await trio.sleep(0.05)
    app = HomeAppClient([a["api"]])
    print("ready", flush=True)
    while True:
        line = (await trio.to_thread.run_sync(sys.stdin.readline)).strip()
        if not line or line == "quit":
            return
        n = int(line)
        while len(dev.tokens) < n + 10:
            await dev.more_tokens(500)
        print(json.dumps(await e2e_latencies(dev, app, n)), flush=True)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="inri-lat-") as d:
        info = mesh.up(d, relays=2, bootstraps=1, timeout_s=60, min_neighbours=1, trace_level="off",
                       profile="default")
        try:
            trio.run(serve, info)
        finally:
            mesh.down(d)


if __name__ == "__main__":
    main()
