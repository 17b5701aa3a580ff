"""Memory of idle connections at a relay (issue 41; issue 37 aims at 10,000 idle WebSockets at <= 20 KB each).

One relay process (`inri relay`, test profile); BENCH_IDLE_N (2,000) idle HTTP keep-alive connections
(each answered one GET /healthz, then silent), then as many idle device streams (WebSocket
`/v1/devices/{id}/stream`, authenticated, then silent). Prints the relay's RSS (VmRSS) before and after
each set and the increase per connection. The kernel's socket buffers are not in RSS.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from inri import mesh  # noqa: E402
from inri.client import DeviceClient  # noqa: E402

N = int(os.environ.get("BENCH_IDLE_N", "2000"))
BATCH = 200


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def settle(pid: int) -> int:
    """RSS once it stops moving (the relay has handled what was sent)."""
    last = -1
    for _ in range(50):
        await trio.sleep(0.2)
        now = rss_kib(pid)
        if now == last:
            return now
        last = now
    return last


async def idle_http(port: int, held: list[trio.SocketStream]) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = b""
    while not answer.endswith(b"}"):
        answer += await stream.receive_some(65536)
    held.append(stream)


async def idle_ws(port: int, path: str, secret: str, held: list[trio.SocketStream]) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(f"GET {path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                          f"Authorization: Bearer {secret}\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += await stream.receive_some(65536)
    if not answer.startswith(b"HTTP/1.1 101 "):
        raise RuntimeError(f"the stream was refused: {answer[:200]!r}")
    held.append(stream)


async def run(api: str, pid: int) -> dict[str, float]:
    port = int(api.rsplit(":", 1)[1])
    dev = DeviceClient(api)
    await dev.register(tokens=1)
    assert dev.secret is not None
    path = f"/v1/devices/{dev.device_id}/stream"
    held: list[trio.SocketStream] = []
    base = await settle(pid)
    for start in range(0, N, BATCH):
        async with trio.open_nursery() as n:
            for _ in range(min(BATCH, N - start)):
                n.start_soon(idle_http, port, held)
    http = await settle(pid)
    for start in range(0, N, BATCH):
        async with trio.open_nursery() as n:
            for _ in range(min(BATCH, N - start)):
                n.start_soon(idle_ws, port, path, dev.secret, held)
    ws = await settle(pid)
    for stream in held:
        await stream.aclose()
    await dev.aclose()
    return {"base": base, "http": http, "ws": ws}


def main() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2 * N + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 2 * N + 256), hard))
    os.environ.update({"INRI_API_IDLE_TIMEOUT_S": "3600", "INRI_API_RATE_PER_S": "1000000",
                       "INRI_API_RATE_BURST": "1000000", "INRI_API_CONNECTIONS_PER_CLIENT_MAX": str(4 * N),
                       "INRI_API_CONNECTIONS_MAX": str(4 * N)})
    with tempfile.TemporaryDirectory(prefix="inri-front-mem-") as d:
        info = mesh.up(Path(d), relays=1, bootstraps=1, timeout_s=90, trace_level="off")
        try:
            relay = info["relays"][0]
            started = time.perf_counter()
            rss = trio.run(run, relay["api"], relay["pid"])
        finally:
            mesh.down(Path(d))
    per_http = (rss["http"] - rss["base"]) * 1024 / N
    per_ws = (rss["ws"] - rss["http"]) * 1024 / N
    print(f"relay RSS: {rss['base']:,} KiB with no client connection, {rss['http']:,} KiB with {N:,} idle HTTP "
          f"keep-alive connections ({per_http / 1000:.1f} KB each), {rss['ws']:,} KiB with {N:,} idle device "
          f"streams more ({per_ws / 1000:.1f} KB each); {time.perf_counter() - started:.0f} s")
    print(json.dumps({"bench": "front_memory", "figures": [
        {"metric": "RSS per idle HTTP connection", "value": round(per_http / 1000, 1), "unit": "KB",
         "note": f"{N:,} keep-alive connections, relay process VmRSS"},
        {"metric": "RSS per idle WebSocket (device stream)", "value": round(per_ws / 1000, 1), "unit": "KB",
         "ceiling": "issue 37: <= 20 KB", "note": f"{N:,} authenticated streams, relay process VmRSS"},
    ]}))


if __name__ == "__main__":
    main()
