"""10,000 connections opened against a relay process's connection caps (issue 41): the connections past
a cap get `503 too_many_connections` with Retry-After and are closed, the ones already served keep
being served, other addresses are served, and the relay's memory stays bounded (printed)."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import httpx
import pytest
import trio

from inri.node.metrics import parse_metrics
from tests.procs import Proc, relay_cmd, relay_ready

pytestmark = pytest.mark.integration

PER_CLIENT = 1000
IN_ALL = 1500
FLOOD = 10_000
BATCH = 200  # connections opened at once: below the relay's SHED_TASKS_MAX, so every shed one gets its 503
HEAD = b"GET /healthz HTTP/1.1\r\nHost: x\r\n"  # never finished: a served connection waits for the rest


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


async def open_one(port: int, source: str, held: list[trio.SocketStream], shed: list[bytes]) -> None:
    """Connect from source and start a request: kept in held if the relay serves it, its answer in shed."""
    stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
    await stream.send_all(HEAD)
    answer = b""
    with trio.move_on_after(0.5):  # a shed connection is answered at once; a served one waits for its head
        while True:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                break
            if not data:
                break
            answer += data
    if answer or not _open(stream):
        shed.append(answer)
        await stream.aclose()
    else:
        held.append(stream)


def _open(stream: trio.SocketStream) -> bool:
    return stream.socket.fileno() >= 0


async def flood(port: int, source: str, count: int) -> tuple[list[trio.SocketStream], list[bytes]]:
    held: list[trio.SocketStream] = []
    shed: list[bytes] = []
    for start in range(0, count, BATCH):
        async with trio.open_nursery() as n:
            for _ in range(min(BATCH, count - start)):
                n.start_soon(open_one, port, source, held, shed)
    return held, shed


async def get(port: int, stream: trio.SocketStream | None = None, source: str = "127.0.0.4") -> bytes:
    """GET /healthz on stream (or a new connection from source); the answer's head and body."""
    s = stream or await trio.open_tcp_stream("127.0.0.1", port, local_address=source)
    await s.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    out = b""
    while b"\r\n\r\n" not in out or not out.rstrip().endswith(b"}"):
        data = await s.receive_some(65536)
        if not data:
            break
        out += data
    if stream is None:
        await s.aclose()
    return out


IDLE_S = "600"


async def test_ten_thousand_connections_against_the_caps(tmp_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = IN_ALL + 4 * BATCH + 256
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"needs {wanted} file descriptors; the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    env = {"INRI_API_CONNECTIONS_MAX": str(IN_ALL), "INRI_API_CONNECTIONS_PER_CLIENT_MAX": str(PER_CLIENT),
           "INRI_API_HEAD_TIMEOUT_S": "600", "INRI_API_RATE_PER_S": "100000", "INRI_API_RATE_BURST": "100000",
           # the keep-alive connection idles while the floods run (over 30 s, the default, on a loaded machine)
           "INRI_API_IDLE_TIMEOUT_S": IDLE_S}
    proc = Proc(relay_cmd(tmp_path / "r"), tmp_path / "relay.log", env)
    held: list[trio.SocketStream] = []
    try:
        port = int(relay_ready(proc, tmp_path / "r")["api"].rsplit(":", 1)[1])
        with trio.fail_after(300):
            before = rss_kib(proc.p.pid)
            keep = await trio.open_tcp_stream("127.0.0.1", port, local_address="127.0.0.2")
            assert (await get(port, keep)).startswith(b"HTTP/1.1 200 ")
            held_a, shed_a = await flood(port, "127.0.0.1", FLOOD)  # one address: its cap
            held_b, shed_b = await flood(port, "127.0.0.3", 1000)  # another one: the cap in all
            held = held_a + held_b
            peak = rss_kib(proc.p.pid)
            assert (await get(port, keep)).startswith(b"HTTP/1.1 200 ")  # served before: served still
            late = await get(port)  # a new connection while every slot is taken: shed, with an answer
            # the counts, read from another address once a slot is free
            async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address="127.0.0.5")) as c:
                await held.pop().aclose()
                await trio.sleep(0.2)
                metrics = parse_metrics((await c.get(f"http://127.0.0.1:{port}/metrics")).text)
            for stream in held:
                await stream.aclose()
            held = []
            await trio.sleep(0.5)
            after_close = await get(port)
            settled = rss_kib(proc.p.pid)
    finally:
        for stream in held:
            await stream.aclose()
        proc.stop()
    print(f"relay RSS: {before} KiB before, {peak} KiB with {IN_ALL} connections served and "
          f"{len(shed_a) + len(shed_b)} shed ({(peak - before) / IN_ALL:.1f} KiB per connection), "
          f"{settled} KiB once they closed")
    assert (len(held_a), len(held_b)) == (PER_CLIENT, IN_ALL - PER_CLIENT - 1)  # (the keep-alive one counts)
    assert len(shed_a) == FLOOD - PER_CLIENT and len(shed_b) == 1000 - len(held_b)
    for answer in shed_a[:50] + shed_b[:50] + [late]:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503 ") and b"retry-after: 5" in head.lower(), answer[:200]
        assert json.loads(body)["code"] == "too_many_connections"
    assert all(a.startswith(b"HTTP/1.1 503 ") for a in shed_a + shed_b)
    assert metrics['inri_http_connections_shed_total{reason="connections_per_client_max"}'] == FLOOD - PER_CLIENT
    assert metrics['inri_http_connections_shed_total{reason="connections_max"}'] == len(shed_b) + 1
    assert after_close.startswith(b"HTTP/1.1 200 ")
    assert peak - before < 64 * IN_ALL, "more than 64 KiB of RSS per connection served"
    assert "Traceback" not in (tmp_path / "relay.log").read_text()
