"""The HTTP front serving the relay's API, through real sockets: pipelining and group commit, hostile clients
(a reader that never reads, slowloris, request smuggling, oversize chunked bodies), a crash injected in one
connection. Timing goes through MockClock: autojump where the relay runs no worker thread, a clock moved by
hand where it does (the group commit's checkpoints)."""

from __future__ import annotations

import json
import math
import re
import socket
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
import trio
from trio.testing import MockClock

from inri.client import DeviceClient
from inri.client.credential import b64e, seal
from inri.common.front.connection import Connection
from inri.common.front.wire import FdWire
from inri.node.config import RelayConfig
from inri.node.metrics import parse_metrics
from inri.protocol.codec import encode_registration
from tests.inproc import relay_api, relay_front

T = TypeVar("T")
LOAD = RelayConfig()
LOAD = replace(LOAD, api=replace(LOAD.api, rate_per_s=1e6, rate_burst=10**6, device_rate_per_s=1e6,
                                 device_rate_burst=10**6, tarpit_s=0.0))


async def _exchange(url: str, raw: bytes, until: bytes, count: int = 1) -> bytes:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    try:
        await stream.send_all(raw)
        answer = b""
        while answer.count(until) < count:
            data = await stream.receive_some(65536)
            if not data:
                break
            answer += data
        return answer
    finally:
        await stream.aclose()


async def _read_all(stream: trio.SocketStream) -> bytes:
    """What the client can still read: until the end of the stream or a reset."""
    out = b""
    while True:
        try:
            data = await stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return out
        if not data:
            return out
        out += data


async def until(predicate: Callable[[], T], what: str, real_s: float = 60.0) -> T:
    """predicate's first true value, polled in real time: the virtual clock stands still meanwhile."""
    give_up = time.monotonic() + real_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < give_up, f"{what}: not within {real_s} s"
        await trio.to_thread.run_sync(time.sleep, 0.01)


async def push_requests(dev: DeviceClient, n: int) -> list[bytes]:
    cred = dev.export_credential(n)
    reg, ct = b64e(encode_registration(cred.registration)), b64e(seal(cred.seal_key, b"x"))
    out = []
    for token in cred.tokens[:n]:
        body = json.dumps({"registration": reg, "token": b64e(token), "ciphertext": ct}).encode()
        out.append(b"POST /v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return out


def stored(db_path: Path, push_ids: list[bytes]) -> int:
    db = sqlite3.connect(db_path)
    try:
        return sum(db.execute("SELECT COUNT(*) FROM mailbox WHERE push_id = ?", (p,)).fetchone()[0]
                   for p in push_ids)
    finally:
        db.close()


def metric(text: str, name: str) -> float:
    return parse_metrics(text).get(name, 0.0)


# -- pipelining and group commit ---------------------------------------------------------------------

async def test_pipelined_requests_are_answered_in_order_on_one_connection(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with relay_api(tmp_path) as url:
            raw = (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
                   b"POST /v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
                   b"GET /v1/push/zz HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await _exchange(url, raw, b"HTTP/1.1 ", 3)
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert statuses == [b"200", b"422", b"404"], answer  # health, a push without fields, an unknown push id
    assert answer.count(b"application/problem+json") == 2


async def test_pipelined_pushes_are_answered_after_their_commit_and_before_the_next_answer(tmp_path: Path) -> None:
    """With group commit, a push's 202 is written by the committing task (the request's task goes on
    reading): a request pipelined behind pushes is still answered after them, and each 202 comes
    only once its push is committed (another connection to the database sees it)."""
    with trio.fail_after(30):
        async with relay_api(tmp_path, group_commit=True) as url:
            dev = DeviceClient(url)
            await dev.register(tokens=3)
            raw = b"".join(await push_requests(dev, 3)) + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
            answer = await _exchange(url, raw, b"HTTP/1.1 ", 4)
            statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)
            assert statuses == [b"202", b"202", b"202", b"200"], answer
            push_ids = [bytes.fromhex(p.decode()) for p in re.findall(rb'"push_id":"([0-9a-f]{32})"', answer)]
            assert len(push_ids) == 3 and stored(tmp_path / "relay.sqlite3", push_ids) == 3


async def test_answers_a_slow_reader_has_no_room_for_are_written_later_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that pipelines hundreds of pushes and reads nothing for a while: the committed 202s
    the socket cannot take go to a writer task; every push gets its 202, in order, then the request
    behind them its answer."""
    writers = []
    original = Connection._write_rest

    async def counted(self: Connection) -> None:
        writers.append(len(self.rest))
        await original(self)

    monkeypatch.setattr(Connection, "_write_rest", counted)
    n = 700
    with trio.fail_after(60):
        async with relay_api(tmp_path, LOAD, group_commit=True) as url:
            dev = DeviceClient(url)
            await dev.register(tokens=500)
            await dev.more_tokens(500)
            raw = b"".join(await push_requests(dev, n)) + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
            host, port = url.removeprefix("http://").rsplit(":", 1)
            sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: the relay's buffer fills
            await sock.connect((host, int(port)))
            stream = trio.SocketStream(sock)
            answer = b""

            async def read_later() -> None:
                nonlocal answer
                with trio.move_on_after(20):  # the relay answers meanwhile, until its socket buffer is full
                    while not writers:
                        await trio.sleep(0.05)
                while answer.count(b"HTTP/1.1 ") < n + 1:
                    data = await stream.receive_some(65536)
                    assert data, "the relay closed the connection"
                    answer += data

            async with trio.open_nursery() as nursery:
                nursery.start_soon(stream.send_all, raw)
                nursery.start_soon(read_later)
            await stream.aclose()
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert statuses == [b"202"] * n + [b"200"]
    assert len(set(re.findall(rb'"push_id":"([0-9a-f]{32})"', answer))) == n
    assert writers, "the socket never ran out of room: the test did not reach the writer task"


# -- hostile clients ----------------------------------------------------------------------------------

async def test_a_client_that_pipelines_1000_pushes_and_never_reads_is_closed_at_the_write_deadline(
        tmp_path: Path, mock_clock: MockClock) -> None:
    """Issue 41: the relay keeps serving everyone else, the slow connection is closed when its write has
    waited write_timeout_s (not later, not earlier), and every 202 it got is stored."""
    cfg = replace(LOAD, api=replace(LOAD.api, write_timeout_s=20.0))
    n = 1000
    with trio.fail_after(3600):  # virtual: this test moves the clock by hand
        async with relay_front(tmp_path, cfg, group_commit=True) as (url, _, server):
            dev, other = DeviceClient(url), DeviceClient(url)
            await dev.register(tokens=500)
            await dev.more_tokens(500)
            await other.register(tokens=1)
            raw = b"".join(await push_requests(dev, n))
            host, port = url.removeprefix("http://").rsplit(":", 1)
            sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            await sock.connect((host, int(port)))
            mine = sock.getsockname()[1]
            stream = trio.SocketStream(sock)

            async def send() -> None:
                try:
                    await stream.send_all(raw)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # closed by the relay before it read everything

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send)
                slow = await until(lambda: next((c for c in server.connections if c.peer[1] == mine
                                                 and c.write_by < math.inf), None), "the relay waits on the client")
                assert slow.write_by == trio.current_time() + 20.0  # the clock has not moved since
                async with httpx.AsyncClient() as c:  # everyone else is served meanwhile
                    assert (await c.get(url + "/healthz")).status_code == 200
                    cred = other.export_credential(1)
                    r = await c.post(url + "/v1/push", json={"registration": b64e(encode_registration(
                        cred.registration)), "token": b64e(cred.tokens[0]), "ciphertext": b64e(b"c" * 40)})
                    assert r.status_code == 202
                mock_clock.jump(19.99)
                for _ in range(50):
                    await trio.sleep(0)
                assert slow in server.connections, "closed before its deadline"
                mock_clock.jump(0.02)
                await until(lambda: slow not in server.connections, "the slow connection closed")
                nursery.cancel_scope.cancel()
            got = await _read_all(stream)
            await stream.aclose()
            async with httpx.AsyncClient() as c:
                scrape = (await c.get(url + "/metrics")).text
                assert (await c.get(url + "/healthz")).status_code == 200
    statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", got)
    push_ids = [bytes.fromhex(p.decode()) for p in re.findall(rb'"push_id":"([0-9a-f]{32})"', got)]
    assert statuses and set(statuses) == {b"202"} and len(statuses) < n, statuses[:3]
    assert stored(tmp_path / "relay.sqlite3", push_ids) == len(push_ids) >= len(statuses) - 1  # the last may be cut
    assert metric(scrape, 'inri_http_deadline_closes_total{phase="write"}') == 1
    assert metric(scrape, "inri_http_restarts_total") == 0 and metric(scrape, "inri_http_connection_errors_total") == 0


async def test_slowloris_heads_and_bodies_are_closed_at_their_deadlines(tmp_path: Path,
                                                                       autojump_clock: MockClock) -> None:
    """A head trickled one byte a second is closed head_timeout_s (10 s) after the connection opened; a
    body trickled the same way body_timeout_s (30 s) after its head; each byte moves nothing."""
    settings = RelayConfig().api
    async with relay_api(tmp_path) as url:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        for raw, deadline in ((b"POST /v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n", 10.0),
                              (b"POST /v1/push HTTP/1.1\r\nHost: x\r\nContent-Length: 400\r\n\r\n" + b"{" * 399,
                               30.0)):
            stream = await trio.open_tcp_stream(host, int(port))
            opened = trio.current_time()
            head_end = raw.find(b"\r\n\r\n") + 4 if b"\r\n\r\n" in raw else 0
            if head_end:
                await stream.send_all(raw[:head_end])
                opened = trio.current_time()
            closed_at = math.inf

            async def trickle(stream: trio.SocketStream = stream, rest: bytes = raw[head_end:]) -> None:
                for byte in rest:
                    await stream.send_all(bytes([byte]))
                    await trio.sleep(1.0)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(trickle)
                assert await _read_all(stream) == b""
                closed_at = trio.current_time() - opened
                nursery.cancel_scope.cancel()
            await stream.aclose()
            assert closed_at == deadline, (raw[:30], closed_at)
    assert (settings.head_timeout_s, settings.body_timeout_s) == (10.0, 30.0)


@pytest.mark.parametrize(("name", "raw"), [
    ("Content-Length and Transfer-Encoding",
     b"POST /v1/push HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
    ("two Content-Lengths", b"POST /v1/push HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n"),
    ("a Content-Length list", b"POST /v1/push HTTP/1.1\r\nHost: x\r\nContent-Length: 0, 0\r\n\r\n"),
    ("obs-fold", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Note: a\r\n folded\r\n\r\n"),
    ("bare LF", b"GET /healthz HTTP/1.1\nHost: x\n\n"),
])
async def test_request_smuggling_is_refused_and_nothing_behind_it_is_served(tmp_path: Path, name: str,
                                                                            raw: bytes) -> None:
    with trio.fail_after(30):
        async with relay_api(tmp_path) as url:
            answer = await _exchange(url, raw + b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 ", 2)
    head = answer.split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 400 ") and b"connection: close" in head, (name, answer)
    assert answer.count(b"HTTP/1.1 ") == 1, (name, answer)  # the request behind it was not served


async def test_an_oversize_body_gets_413_too_large_whatever_its_framing(tmp_path: Path) -> None:
    """A client sending its whole body before reading (httpx does) gets the documented problem, not a
    reset: with Content-Length (not read) and chunked (read until over the limit), five times each."""
    body = b"x" * 300_000

    async def chunks() -> AsyncIterator[bytes]:  # no length: httpx sends it chunked
        for i in range(0, len(body), 10_000):
            yield body[i:i + 10_000]

    with trio.fail_after(120):
        async with relay_api(tmp_path) as url:
            for _ in range(5):
                async with httpx.AsyncClient() as c:
                    for content in (body, chunks()):
                        r = await c.post(url + "/v1/push", content=content)
                        assert r.status_code == 413 and r.json()["code"] == "too_large", r.text
                        assert r.headers["connection"] == "close"
            raw = b"POST /v1/push HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + b"".join(
                b"2710\r\n" + b"y" * 10_000 + b"\r\n" for _ in range(30)) + b"0\r\n\r\n"
            answer = await _exchange(url, raw, b"}")
    assert answer.startswith(b"HTTP/1.1 413 ") and b'"code":"too_large"' in answer


async def test_a_crash_injected_in_one_connection_leaves_the_others_untouched(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error no network gives, in the writer of one connection's committed answers (it used to escape
    into the server and drop every connection): that connection ends, logged; the others go on; nothing
    restarts."""
    victim: list[int] = []
    original = FdWire.send

    async def failing(self: FdWire, data: bytes) -> None:
        if self.stream.socket.getpeername()[1] in victim:  # type: ignore[attr-defined]
            raise RuntimeError("injected")
        await original(self, data)

    monkeypatch.setattr(FdWire, "send", failing)
    with trio.fail_after(60):
        async with relay_api(tmp_path, LOAD, group_commit=True) as url:
            dev = DeviceClient(url)
            await dev.register(tokens=500)
            host, port = url.removeprefix("http://").rsplit(":", 1)
            keep = await trio.open_tcp_stream(host, int(port))  # a connection opened before the crash
            await keep.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await keep.receive_some(65536)).startswith(b"HTTP/1.1 200 ")
            sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the writer task is needed
            await sock.connect((host, int(port)))
            victim.append(sock.getsockname()[1])
            stream = trio.SocketStream(sock)
            raw = b"".join(await push_requests(dev, 400))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_ignore_closed, stream.send_all, raw)
                with trio.move_on_after(5):
                    while True:  # read nothing until the relay gave up on this connection
                        await trio.sleep(0.05)
                        if (await _scrape(url, "inri_http_connection_errors_total")) >= 1:
                            break
                got = await _read_all(stream)
                nursery.cancel_scope.cancel()
            await keep.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert (await keep.receive_some(65536)).startswith(b"HTTP/1.1 200 ")
            assert await _scrape(url, "inri_http_restarts_total") == 0
            assert await _scrape(url, "inri_http_connection_errors_total") == 1
    assert 0 < got.count(b"HTTP/1.1 202 ") < 400


async def test_a_handler_exception_answers_500_and_only_an_app_escaping_one_ends_its_connection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 41 item 3: a bug in a request's handler (the ASGI path and the fast push path alike) answers
    `500 internal` and its connection goes on; an exception escaping the app altogether gets an empty 500
    and that connection closes; a connection opened before is served throughout and nothing restarts."""
    from inri.node.api import RelayApi

    async def broken_status(self: RelayApi, req: Any) -> tuple[int, Any]:
        raise RuntimeError("injected in a handler")

    async def broken_push(self: RelayApi, *args: Any, **kw: Any) -> tuple[int, Any]:
        raise RuntimeError("injected in the push handler")

    escaping = False
    original_http = RelayApi._http

    async def http(self: RelayApi, scope: Any, receive: Any, send: Any) -> None:
        if escaping and scope["path"] == "/v1/status":
            raise RuntimeError("injected outside the handlers")
        await original_http(self, scope, receive, send)

    monkeypatch.setattr(RelayApi, "status", broken_status)
    monkeypatch.setattr(RelayApi, "_pushed", broken_push)
    monkeypatch.setattr(RelayApi, "_http", http)
    health = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with trio.fail_after(60):
        async with relay_api(tmp_path) as url:
            host, port = url.removeprefix("http://").rsplit(":", 1)
            keep = await trio.open_tcp_stream(host, int(port))
            await keep.send_all(health)
            assert (await keep.receive_some(65536)).startswith(b"HTTP/1.1 200 ")
            raw = (b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n"
                   b"POST /v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                   b"\r\n{}" + health)
            answer = await _exchange(url, raw, b"HTTP/1.1 ", 3)
            assert re.findall(rb"HTTP/1\.1 (\d{3}) ", answer) == [b"500", b"500", b"200"], answer
            assert answer.count(b'"code":"internal"') == 2
            escaping = True
            stream = await trio.open_tcp_stream(host, int(port))
            await stream.send_all(b"GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n" + health)
            closed = await _read_all(stream)
            await stream.aclose()
            assert re.findall(rb"HTTP/1\.1 (\d{3}) ", closed) == [b"500"], closed  # and nothing behind it
            assert closed.endswith(b"\r\n\r\n") and b"content-length: 0" in closed.lower()
            await keep.send_all(health)
            assert (await keep.receive_some(65536)).startswith(b"HTTP/1.1 200 ")
            await keep.aclose()
            assert await _scrape(url, "inri_http_restarts_total") == 0
            assert await _scrape(url, "inri_http_connection_errors_total") == 0
            assert await _scrape(url, 'inri_http_responses_total{code="500"}') == 2


async def _ignore_closed(fn: Callable[..., Any], *args: Any) -> None:
    try:
        await fn(*args)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _scrape(url: str, name: str) -> float:
    async with httpx.AsyncClient() as c:
        return metric((await c.get(url + "/metrics")).text, name)


async def test_websocket_refused_before_accept_is_an_http_403(tmp_path: Path) -> None:
    """A stream URL that names no device: the app closes before accepting, the client sees 403."""
    with trio.fail_after(30):
        async with relay_api(tmp_path) as url:
            raw = (b"GET /v1/devices/nothex/stream/extra HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                   b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                   b"Sec-WebSocket-Version: 13\r\n\r\n")
            answer = await _exchange(url, raw, b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 403 "), answer
