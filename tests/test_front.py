"""The HTTP front (inri/common/front) on trio's memory streams under MockClock: every deadline at its exact
time, WebSocket liveness, caps and shedding, trusted proxies, crash containment, listener restarts.

The tests through real sockets and the relay's API are in tests/test_front_relay.py."""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing
from trio.testing import MockClock
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    Request,
    TextMessage,
)

from inri.common.front import FrontSettings, HttpServer
from inri.common.front.server import SHED_RETRY_AFTER_S

SETTINGS = FrontSettings(head_timeout_s=10.0, body_timeout_s=20.0, write_timeout_s=15.0, idle_timeout_s=30.0,
                         ws_ping_interval_s=30.0, ws_pong_timeout_s=20.0, ws_max_message_bytes=4096)


async def echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """200 with the method, path, client host and body the server handed the app."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    out = b"%s %s %s %s" % (scope["method"].encode(), scope["path"].encode(), scope["client"][0].encode(), body)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(out))]})
    await send({"type": "http.response.body", "body": out})


@asynccontextmanager
async def front(app: Any = echo_app, settings: FrontSettings = SETTINGS) -> AsyncIterator[HttpServer]:
    server = HttpServer(app, settings)
    stop = trio.Event()
    with trio.fail_after(3600):  # virtual time: a server that never closes what it should fails the test
        async with trio.open_nursery() as n:
            await n.start(lambda task_status: server.run([], shutdown_trigger=stop.wait, task_status=task_status))
            try:
                yield server
            finally:
                stop.set()


def connect(server: HttpServer, host: str = "198.51.100.7", *, lockstep: bool = False) -> trio.abc.Stream:
    """A client stream to server (lockstep: the server's writes wait until the client reads)."""
    client, end = trio.testing.lockstep_stream_pair() if lockstep else trio.testing.memory_stream_pair()
    server.accept(end, (host, 40000))
    return client


async def read_until_closed(stream: trio.abc.Stream) -> tuple[bytes, float]:
    """Everything until the server closes, and the (virtual) time it closed."""
    out = b""
    while True:
        try:
            data = await stream.receive_some(65536)
        except trio.BrokenResourceError:
            data = b""
        if not data:
            return out, trio.current_time()
        out += data


async def answer(stream: trio.abc.Stream, count: int = 1) -> bytes:
    out = b""
    while len(re.findall(rb"HTTP/1\.1 \d{3} [^\r]*\r\n(?:[^\r]+\r\n)*\r\n", out)) < count or not _complete(out, count):
        data = await stream.receive_some(65536)
        assert data, f"closed after {out!r}"
        out += data
    return out


def _complete(out: bytes, count: int) -> bool:
    """count answers with their whole bodies (content-length) in out."""
    pos = 0
    for _ in range(count):
        end = out.find(b"\r\n\r\n", pos)
        if end < 0:
            return False
        m = re.search(rb"content-length: (\d+)", out[pos:end], re.I)
        pos = end + 4 + (int(m.group(1)) if m else 0)
        if pos > len(out):
            return False
    return True


GET = b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n"


# -- deadlines ------------------------------------------------------------------------------------

async def test_a_first_head_trickled_byte_by_byte_is_closed_at_head_timeout_from_the_connection_start(
        autojump_clock: MockClock) -> None:
    async with front() as server:
        client = connect(server)
        t0 = trio.current_time()

        async def trickle() -> None:
            for byte in GET[:-1]:  # never the last byte: the head is never whole
                await client.send_all(bytes([byte]))
                await trio.sleep(0.3)

        async with trio.open_nursery() as n:
            n.start_soon(trickle)
            got, closed_at = await read_until_closed(client)
            n.cancel_scope.cancel()
    assert got == b"" and closed_at - t0 == SETTINGS.head_timeout_s
    assert server.stats.deadline_closes == {"head": 1}


async def test_later_heads_bodies_and_idle_connections_each_get_their_own_absolute_deadline(
        autojump_clock: MockClock) -> None:
    async with front() as server:
        # idle: an answered connection that sends nothing more
        idle = connect(server)
        await idle.send_all(GET)
        t0 = trio.current_time()
        await answer(idle)
        assert (await read_until_closed(idle))[1] - t0 == SETTINGS.idle_timeout_s
        # a later head: its deadline runs from its first byte, however slowly the rest comes
        slow = connect(server)
        await slow.send_all(GET)
        await answer(slow)
        await trio.sleep(5)
        started = trio.current_time()

        async def trickle(stream: trio.abc.Stream, data: bytes) -> None:
            try:
                for byte in data:
                    await stream.send_all(bytes([byte]))
                    await trio.sleep(1)
            except trio.BrokenResourceError:
                pass  # closed by the server (a byte sent at the very deadline)

        async with trio.open_nursery() as n:
            n.start_soon(trickle, slow, GET[:-1])
            assert (await read_until_closed(slow))[1] - started == SETTINGS.head_timeout_s
            n.cancel_scope.cancel()
        # a body: body_timeout_s from its head, trickled or not
        body = connect(server)
        await body.send_all(b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 100\r\n\r\n")
        head_at = trio.current_time()
        async with trio.open_nursery() as n:
            n.start_soon(trickle, body, b"x" * 99)
            assert (await read_until_closed(body))[1] - head_at == SETTINGS.body_timeout_s
            n.cancel_scope.cancel()
        # a chunked body goes to h11: the same deadline
        chunked = connect(server)
        await chunked.send_all(b"POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
        head_at = trio.current_time()
        async with trio.open_nursery() as n:
            n.start_soon(trickle, chunked, b"1\r\nx\r\n" * 40)
            assert (await read_until_closed(chunked))[1] - head_at == SETTINGS.body_timeout_s
            n.cancel_scope.cancel()
    assert server.stats.deadline_closes == {"idle": 1, "head": 1, "body": 2}


async def test_an_answer_the_client_does_not_read_is_closed_at_the_write_deadline(autojump_clock: MockClock) -> None:
    big = b"y" * 200_000

    async def big_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": big})

    async with front(big_app) as server:
        client = connect(server, lockstep=True)
        await client.send_all(GET)
        t0 = trio.current_time()
        while server.connections:
            await trio.sleep(0.5)
        assert trio.current_time() - t0 == pytest.approx(SETTINGS.write_timeout_s, abs=0.5)
        # a client that reads gets it all
        reader = connect(server, lockstep=True)
        await reader.send_all(GET)
        got = await answer(reader)
    assert got.endswith(big)
    assert server.stats.deadline_closes == {"write": 1}


async def test_a_stopping_server_closes_idle_connections_and_lets_a_request_in_flight_answer(
        autojump_clock: MockClock) -> None:
    release = trio.Event()

    async def slow_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] == "/slow":
            await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    server = HttpServer(slow_app, SETTINGS, graceful_s=5.0)
    stop = trio.Event()
    async with trio.open_nursery() as n:
        await n.start(lambda task_status: server.run([], shutdown_trigger=stop.wait, task_status=task_status))
        idle, busy = connect(server), connect(server)
        await idle.send_all(GET)
        await answer(idle)
        await busy.send_all(b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
        await trio.sleep(1)
        stop.set()
        assert (await read_until_closed(idle))[0] == b""
        await trio.sleep(1)
        release.set()
        got, _ = await read_until_closed(busy)
    assert got.startswith(b"HTTP/1.1 200 ") and b"connection: close" in got and got.endswith(b"ok")


# -- WebSockets ---------------------------------------------------------------------------------

async def ws_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Accepts, echoes every message, pushes one message after `push` arrives (from another task)."""
    assert scope["type"] == "websocket"
    assert (await receive())["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    while True:
        msg = await receive()
        if msg["type"] == "websocket.disconnect":
            return
        await send({"type": "websocket.send", "text": msg.get("text"), "bytes": msg.get("bytes")})


class WsClient:
    """A wsproto client over a stream: frames in, events out."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)

    async def open(self, path: str = "/ws") -> None:
        await self.stream.send_all(self.ws.send(Request(host="h", target=path)))
        event = await self.next()
        assert isinstance(event, AcceptConnection), event

    async def send(self, event: Any) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def next(self) -> Any:
        """The next event; None when the server closed the stream."""
        while True:
            for event in self.ws.events():
                return event
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.ws.receive_data(bytes(data))


async def test_a_silent_websocket_is_pinged_and_closed_when_nothing_answers(autojump_clock: MockClock) -> None:
    async with front(ws_app) as server:
        # answers the pings (wsproto answers for the client as it parses them): never closed
        alive = WsClient(connect(server))
        await alive.open()
        opened = trio.current_time()
        pings: list[float] = []
        while len(pings) < 3:
            event = await alive.next()
            assert isinstance(event, Ping)
            pings.append(trio.current_time() - opened)
            await alive.send(event.response())
        assert pings == [30.0, 60.0, 90.0]
        await alive.send(CloseConnection(code=1000))
        assert isinstance(await alive.next(), CloseConnection)
        # silent: pinged at 30 s, closed at 30 + 20 s; any frame from it would have moved both
        silent = WsClient(connect(server))
        await silent.open()
        opened = trio.current_time()
        await trio.sleep(10)
        await silent.send(TextMessage(data="hi"))  # heard at 10 s: the ping comes at 40 s
        assert isinstance(await silent.next(), TextMessage)
        event = await silent.next()
        assert isinstance(event, Ping) and trio.current_time() - opened == 40.0
        assert await silent.next() is None and trio.current_time() - opened == 60.0
    assert server.stats.deadline_closes == {"websocket_pong": 1}
    assert server.stats.websocket_pings == 4


async def test_websocket_client_pings_are_answered_and_big_messages_refused_with_1009(
        autojump_clock: MockClock) -> None:
    async with front(ws_app) as server:
        client = WsClient(connect(server))
        await client.open()
        await client.send(Ping(payload=b"abc"))
        event = await client.next()
        assert isinstance(event, Pong) and event.payload == b"abc"
        await client.send(BytesMessage(data=b"z" * 4000))
        echoed = await client.next()
        assert isinstance(echoed, BytesMessage) and echoed.data == b"z" * 4000
        await client.send(BytesMessage(data=b"z" * 3000, message_finished=False))
        await client.send(BytesMessage(data=b"z" * 3000))  # 6,000 bytes in one message: over 4,096
        event = await client.next()
        assert isinstance(event, CloseConnection) and event.code == 1009


async def test_a_websocket_message_the_client_does_not_read_is_closed_at_the_write_deadline(
        autojump_clock: MockClock) -> None:
    async def flood_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        while True:  # from another task than the one reading, as the device stream does
            await send({"type": "websocket.send", "bytes": b"m" * 100_000})

    async with front(flood_app) as server:
        stream = connect(server, lockstep=True)
        client = WsClient(stream)
        await client.open()
        t0 = trio.current_time()
        while server.connections:
            await trio.sleep(0.25)
        assert trio.current_time() - t0 == pytest.approx(SETTINGS.write_timeout_s, abs=0.25)
    assert server.stats.deadline_closes == {"write": 1}


# -- caps, shedding, trusted proxies ----------------------------------------------------------------

async def test_past_the_caps_new_connections_get_503_and_the_open_ones_are_kept(autojump_clock: MockClock) -> None:
    settings = FrontSettings(connections_max=5, connections_per_client_max=3)
    async with front(settings=settings) as server:
        mine = [connect(server, "203.0.113.1") for _ in range(3)]
        shed = connect(server, "203.0.113.1")  # a fourth from the same address
        got, _ = await read_until_closed(shed)
        assert got.startswith(b"HTTP/1.1 503 ") and b"retry-after: %d" % SHED_RETRY_AFTER_S in got
        assert json.loads(got.split(b"\r\n\r\n", 1)[1])["code"] == "too_many_connections"
        others = [connect(server, "203.0.113.2") for _ in range(2)]  # 5 in all now
        late = connect(server, "203.0.113.3")
        assert (await read_until_closed(late))[0].startswith(b"HTTP/1.1 503 ")
        for stream in mine + others:  # the connections already served are kept
            await stream.send_all(GET)
            assert (await answer(stream)).startswith(b"HTTP/1.1 200 ")
        await mine[0].aclose()
        await trio.sleep(0.1)
        again = connect(server, "203.0.113.1")  # room again for that address
        await again.send_all(GET)
        assert (await answer(again)).startswith(b"HTTP/1.1 200 ")
    assert server.stats.shed == {"connections_per_client_max": 1, "connections_max": 1}


async def test_a_trusted_proxy_names_the_client_and_its_connections_count_against_that_client(
        autojump_clock: MockClock) -> None:
    settings = FrontSettings(trusted_proxies=("10.0.0.0/8",), connections_per_client_max=2)
    async with front(settings=settings) as server:
        proxied = [connect(server, "10.1.2.3") for _ in range(5)]  # the proxy itself is not capped
        for i, stream in enumerate(proxied[:3]):
            await stream.send_all(b"GET /p HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 6.6.6.6, 198.51.100.%d\r\n\r\n"
                                  % (1 if i < 2 else 2))
            assert (await answer(stream)).endswith(b"GET /p 198.51.100.%d " % (1 if i < 2 else 2))
        await proxied[3].send_all(b"GET /p HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 198.51.100.1\r\n\r\n")
        got, _ = await read_until_closed(proxied[3])  # a third connection for 198.51.100.1
        assert got.startswith(b"HTTP/1.1 503 ")
        await proxied[4].send_all(b"GET /p HTTP/1.1\r\nHost: h\r\n\r\n")  # no header: the proxy's own
        assert (await answer(proxied[4])).endswith(b"GET /p 10.1.2.3 ")
        direct = connect(server, "192.0.2.9")  # not a trusted proxy: its header is ignored
        await direct.send_all(b"GET /p HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 198.51.100.2\r\n\r\n")
        assert (await answer(direct)).endswith(b"GET /p 192.0.2.9 ")


# -- what reaches h11, and what is refused -------------------------------------------------------------

@pytest.mark.parametrize(("raw", "status"), [
    (b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    (b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", 400),
    (b"POST /a HTTP/1.1\r\nHost: h\r\nContent-Length: 3, 3\r\n\r\nabc", 400),
    (b"GET /a HTTP/1.1\r\nHost: h\r\nX-A: a\r\n b\r\n\r\n", 400),
    (b"GET /a HTTP/1.1\nHost: h\n\n", 400),
    (b"GET /a HTTP/1.1\r\nHost: h\nX: y\r\n\r\n", 400),
    (b"GET /a HTTP/1.1\r\nHost: h\r\nX: " + b"v" * 20000 + b"\r\n\r\n", 431),
    (b"POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
    (b"GARBAGE\r\n\r\n", 400),
])
async def test_smuggling_and_malformed_heads_are_refused_with_an_empty_answer_and_a_close(
        raw: bytes, status: int, autojump_clock: MockClock) -> None:
    async with front() as server:
        client = connect(server)
        await client.send_all(raw + GET)  # a request smuggled behind the first is never served
        got, _ = await read_until_closed(client)
    head = got.split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 %d " % status) and b"content-length: 0" in head and b"connection: close" in head
    assert got.count(b"HTTP/1.1") == 1 and server.stats.refused == {status: 1}


async def test_unusual_requests_go_to_h11_for_one_request_and_the_fast_path_resumes(autojump_clock: MockClock) -> None:
    async with front() as server:
        client = connect(server)
        await client.send_all(b"POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
                              b"POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\nhi"
                              b"HEAD /c HTTP/1.1\r\nHost: h\r\n\r\n"
                              b"GET /d HTTP/1.1\r\nHost: h\r\n\r\n")
        got = await answer(client, 4)  # the 100 Continue and three answers; HEAD has no body
        assert [m.group(1) for m in re.finditer(rb"HTTP/1\.1 (\d{3})", got)] == [b"200", b"100", b"200", b"200",
                                                                                   b"200"]
        assert b"POST /a 198.51.100.7 abc" in got and b"POST /b 198.51.100.7 hi" in got
        assert got.endswith(b"GET /d 198.51.100.7 ")


async def test_an_oversize_chunked_body_gets_the_apps_413_and_is_read_and_dropped_before_the_close(
        autojump_clock: MockClock) -> None:
    async def limited(scope: dict[str, Any], receive: Any, send: Any) -> None:
        size = 0
        while True:
            size += len((await receive()).get("body", b""))
            if size > 1000:
                body = b'{"code":"too_large"}'
                await send({"type": "http.response.start", "status": 413, "headers": [
                    (b"content-length", b"%d" % len(body)), (b"connection", b"close")]})
                await send({"type": "http.response.body", "body": body})
                return

    async with front(limited) as server:
        client = connect(server)
        chunks = b"".join(b"400\r\n" + b"x" * 1024 + b"\r\n" for _ in range(200))  # 200 KiB, all sent
        await client.send_all(b"POST /a HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks)
        await client.send_eof()  # type: ignore[attr-defined]  # a StapledStream
        got, _ = await read_until_closed(client)
    assert got.startswith(b"HTTP/1.1 413 ") and got.endswith(b'{"code":"too_large"}')


# -- no crash escapes a connection --------------------------------------------------------------------

class FailingStream(trio.abc.Stream):
    """A stream whose writes raise an error no network gives (an injected bug)."""

    def __init__(self, inner: trio.abc.Stream) -> None:
        self.inner = inner

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        raise RuntimeError("injected")

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_an_error_in_one_connection_ends_that_connection_only(autojump_clock: MockClock,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    async with front() as server:
        before = connect(server)
        await before.send_all(GET)
        await answer(before)
        client, end = trio.testing.memory_stream_pair()
        server.accept(FailingStream(end), ("192.0.2.66", 1))
        await client.send_all(GET)
        assert (await read_until_closed(client))[0] == b""
        await before.send_all(GET)  # the connection opened before still works
        assert (await answer(before)).startswith(b"HTTP/1.1 200 ")
        after = connect(server)
        await after.send_all(GET)
        assert (await answer(after)).startswith(b"HTTP/1.1 200 ")
    assert server.stats.errors == 1 and server.stats.restarts == 0


class FlakyListener(trio.abc.Listener[trio.abc.Stream]):
    """accept() fails `failures` times, then waits forever."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: list[float] = []

    async def accept(self) -> trio.abc.Stream:
        self.calls.append(trio.current_time())
        if len(self.calls) <= self.failures:
            raise RuntimeError("listener broke")
        await trio.sleep_forever()
        raise AssertionError

    async def aclose(self) -> None:
        pass


async def test_a_failing_listener_accepts_again_with_backoff_counted_and_logged(autojump_clock: MockClock) -> None:
    import structlog

    listener = FlakyListener(8)
    server = HttpServer(echo_app, SETTINGS)
    async with trio.open_nursery() as n:
        await n.start(lambda task_status: server.run([], shutdown_trigger=trio.sleep_forever,
                                                     task_status=task_status))
        with structlog.testing.capture_logs() as logs:
            n.start_soon(server._accept_loop, listener)
            await trio.sleep(30)
        client = connect(server)  # connections are untouched by it
        await client.send_all(GET)
        assert (await answer(client)).startswith(b"HTTP/1.1 200 ")
        n.cancel_scope.cancel()
    gaps = [b - a for a, b in zip(listener.calls, listener.calls[1:], strict=False)]
    assert gaps == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0])
    assert server.stats.restarts == 8
    failed = [e for e in logs if e["event"] == "HTTP listener failed; accepting again"]
    assert len(failed) == 8 and all(e["log_level"] == "error" for e in failed)


def test_the_sweeper_keeps_about_one_entry_per_connection() -> None:
    """Deadlines written on every request do not grow the sweeper's heap (deadlines.py)."""

    class Item:
        armed = math.inf

        def due(self, now: float) -> float:
            return math.inf

    from inri.common.front.deadlines import Sweeper

    sweeper = Sweeper()
    items = [Item() for _ in range(100)]
    for step in range(1000):
        for item in items:
            at = 30.0 + step  # each later than the one registered: nothing pushed
            if at < item.armed:
                sweeper.arm(item, at)
    assert len(sweeper) == 100


def test_the_fronts_keys_are_the_same_in_a_relays_api_and_a_bootstraps_config(tmp_path: Any) -> None:
    """[api] and [bootstrap] take the same keys from files and the environment; a trusted proxy that is not
    an address or network is refused, naming where it came from."""
    from bootstrap_nodes.config import load_bootstrap_config
    from inri.common.config import ConfigError
    from inri.node.config import load_config

    relay = load_config(None, env={"INRI_API_TRUSTED_PROXIES": "127.0.0.1, 10.0.0.0/8",
                                   "INRI_API_CLIENT_IP_HEADER": "forwarded", "INRI_API_HEAD_TIMEOUT_S": "5"})
    assert relay.api.trusted_proxies == ("127.0.0.1", "10.0.0.0/8") and relay.api.head_timeout_s == 5.0
    assert relay.api.client_ip_header == "forwarded"
    boot = load_bootstrap_config(None, env={"INRI_BOOTSTRAP_TRUSTED_PROXIES": "::1",
                                            "INRI_BOOTSTRAP_CONNECTIONS_MAX": "7"})
    assert boot.trusted_proxies == ("::1",) and boot.connections_max == 7
    toml = tmp_path / "relay.toml"
    toml.write_text('[api]\ntrusted_proxies = ["10.0.0.300"]\n')
    with pytest.raises(ConfigError, match=r"relay.toml: api.trusted_proxies: '10.0.0.300' is not an IP address"):
        load_config(toml, env={})
    with pytest.raises(ConfigError, match="INRI_BOOTSTRAP_TRUSTED_PROXIES: 'proxy.example' is not an IP"):
        load_bootstrap_config(None, env={"INRI_BOOTSTRAP_TRUSTED_PROXIES": "proxy.example"})
    with pytest.raises(ConfigError, match="INRI_API_CLIENT_IP_HEADER"):
        load_config(None, env={"INRI_API_CLIENT_IP_HEADER": "x-real-ip"})


async def test_a_tls_context_reloaded_serves_new_connections_the_new_certificate(tmp_path: Any) -> None:
    """TlsContext.reload (the relay's SIGHUP hook): new connections get the new certificate; files that
    do not load leave the running context in use."""
    import ssl

    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    from inri.common.front import TlsContext, TlsError
    from tests.inproc import serving
    from tests.test_webpush import make_tls

    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    cert, key, _ = make_tls(first)
    cert2, key2, _ = make_tls(second)
    tls = TlsContext(str(cert), str(key))
    server = HttpServer(echo_app, SETTINGS, tls=tls)

    async def served_cert(url: str) -> bytes:
        host, port = url.removeprefix("https://").rsplit(":", 1)
        ctx = ssl.create_default_context()
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        stream = trio.SSLStream(await trio.open_tcp_stream(host, int(port)), ctx, server_hostname=host)
        await stream.do_handshake()
        der = stream.getpeercert(binary_form=True)
        await stream.send_all(GET)
        assert (await stream.receive_some(65536)).startswith(b"HTTP/1.1 200 ")
        await stream.aclose()
        assert der is not None
        return bytes(der)

    with trio.fail_after(30):
        async with serving(echo_app, server=server) as url:
            assert url.startswith("https://")
            before = await served_cert(url)
            (second / "broken.pem").write_text("not a key")
            tls.cert_file, tls.key_file = str(cert2), str(second / "broken.pem")
            with pytest.raises(TlsError, match="broken.pem"):
                tls.reload()
            assert await served_cert(url) == before
            tls.cert_file, tls.key_file = str(cert2), str(key2)
            tls.reload()
            after = await served_cert(url)
    assert before == x509.load_pem_x509_certificate(cert.read_bytes()).public_bytes(Encoding.DER)
    assert after == x509.load_pem_x509_certificate(cert2.read_bytes()).public_bytes(Encoding.DER)
