"""The relay's HTTP/1.1 front (inri/node/http1.py) at the byte level: what the API tests do not reach."""

from __future__ import annotations

import json
import re
import socket
import sqlite3
from dataclasses import replace
from pathlib import Path

import pytest
import trio

from inri.client import DeviceClient
from inri.client.credential import b64e, seal
from inri.node import http1
from inri.node.config import RelayConfig
from inri.protocol.codec import encode_registration
from tests.inproc import relay_api


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
            cred = dev.export_credential(3)
            reg, ct = b64e(encode_registration(cred.registration)), b64e(seal(cred.seal_key, b"x"))
            raw = b""
            for token in cred.tokens:
                body = json.dumps({"registration": reg, "token": b64e(token), "ciphertext": ct}).encode()
                raw += (b"POST /v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            raw += b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
            answer = await _exchange(url, raw, b"HTTP/1.1 ", 4)
            statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)
            assert statuses == [b"202", b"202", b"202", b"200"], answer
            push_ids = [bytes.fromhex(p.decode()) for p in re.findall(rb'"push_id":"([0-9a-f]{32})"', answer)]
            assert len(push_ids) == 3
            db = sqlite3.connect(tmp_path / "relay.sqlite3")
            try:  # committed: homed here, each is in the mailbox
                held = db.execute("SELECT COUNT(*) FROM mailbox WHERE push_id IN (?, ?, ?)", push_ids).fetchone()[0]
            finally:
                db.close()
            assert held == 3


async def test_answers_a_slow_reader_has_no_room_for_are_written_later_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client that pipelines hundreds of pushes and reads nothing for a while: the committed 202s
    the socket cannot take go to a writer task; every push gets its 202, in order, then the request
    behind them its answer."""
    writers = []
    original = http1._Connection._write_rest

    async def counted(self: http1._Connection) -> None:
        writers.append(len(self.rest))
        await original(self)

    monkeypatch.setattr(http1._Connection, "_write_rest", counted)
    n = 700
    cfg = RelayConfig()
    cfg = replace(cfg, api=replace(cfg.api, rate_per_s=1e6, rate_burst=10**6, device_rate_per_s=1e6,
                                   device_rate_burst=10**6))
    with trio.fail_after(60):
        async with relay_api(tmp_path, cfg, group_commit=True) as url:
            dev = DeviceClient(url)
            await dev.register(tokens=500)
            await dev.more_tokens(500)
            cred = dev.export_credential(n)
            reg, ct = b64e(encode_registration(cred.registration)), b64e(seal(cred.seal_key, b"x"))
            raw = b""
            for token in cred.tokens[:n]:
                body = json.dumps({"registration": reg, "token": b64e(token), "ciphertext": ct}).encode()
                raw += (b"POST /v1/push HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            raw += b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
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


async def test_oversized_body_gets_413_and_the_connection_closes_after_it(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with relay_api(tmp_path) as url:
            raw = b"POST /v1/push HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n" + b"x" * 1000
            answer = await _exchange(url, raw, b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413 ") and b"connection: close" in answer.lower(), answer


async def test_websocket_refused_before_accept_is_an_http_403(tmp_path: Path) -> None:
    """A stream URL that names no device: the app closes before accepting, the client sees 403."""
    with trio.fail_after(30):
        async with relay_api(tmp_path) as url:
            raw = (b"GET /v1/devices/nothex/stream/extra HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                   b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                   b"Sec-WebSocket-Version: 13\r\n\r\n")
            answer = await _exchange(url, raw, b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 403 "), answer


async def _echo_app(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def, type-arg]
    """Answers 200 with the request body, its method and path (what the server handed the app)."""
    if scope["type"] != "http":
        return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    out = b"%s %s %s" % (scope["method"].encode(), scope["path"].encode(), body)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(out))]})
    await send({"type": "http.response.body", "body": out})


async def _echo_server(nursery: trio.Nursery, keep_alive_s: float = 30.0) -> tuple[str, trio.Event]:
    from hypercorn.config import Config

    from inri.node.http1 import serve

    cfg = Config()
    cfg.bind = ["127.0.0.1:0"]
    cfg.keep_alive_timeout = keep_alive_s
    stop = trio.Event()
    urls = await nursery.start(lambda task_status: serve(_echo_app, cfg, shutdown_trigger=stop.wait,
                                                         task_status=task_status))
    return urls[0], stop


async def test_requests_the_fast_path_leaves_to_h11_are_answered_the_same(tmp_path: Path) -> None:
    """Chunked bodies, Expect, Connection: close, a missing Host, a malformed header: each handed to h11."""
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            url, stop = await _echo_server(n)
            chunked = await _exchange(url, b"POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                                           b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", b"POST /a abcde")
            assert chunked.startswith(b"HTTP/1.1 200 ") and chunked.endswith(b"POST /a abcde"), chunked
            cont = await _exchange(url, b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue"
                                        b"\r\n\r\nhi", b"POST /b hi")
            assert cont.startswith(b"HTTP/1.1 100 ") and cont.endswith(b"POST /b hi"), cont
            close = await _exchange(url, b"GET /c HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", b"GET /c ")
            assert b"connection: close" in close.lower(), close
            no_host = await _exchange(url, b"GET /d HTTP/1.1\r\n\r\n", b"\r\n\r\n")
            assert no_host.startswith(b"HTTP/1.1 400 "), no_host
            bad = await _exchange(url, b"GET /e HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n", b"\r\n\r\n")
            assert bad.startswith(b"HTTP/1.1 400 "), bad
            old = await _exchange(url, b"GET /f HTTP/1.0\r\n\r\n", b"GET /f ")
            assert old.startswith(b"HTTP/1.1 200 ") and b"connection: close" in old.lower(), old
            stop.set()


async def test_a_request_in_pieces_and_pipelined_ones_on_the_fast_path(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            url, stop = await _echo_server(n)
            host, port = url.removeprefix("http://").rsplit(":", 1)
            stream = await trio.open_tcp_stream(host, int(port))
            raw = b"POST /p%20q HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
            for i in range(0, len(raw), 7):  # the head and the body in pieces, with pauses between
                await stream.send_all(raw[i:i + 7])
                await trio.sleep(0.01)
            two = b"GET /1 HTTP/1.1\r\nHost: x\r\n\r\nGET /2 HTTP/1.1\r\nHost: x\r\n\r\n"
            await stream.send_all(two)
            answer = b""
            while answer.count(b"HTTP/1.1 200 ") < 3 or not answer.endswith(b"GET /2 "):
                answer += await stream.receive_some(65536)
            assert answer.count(b"HTTP/1.1 200 ") == 3
            assert b"POST /p q hello" in answer and answer.index(b"GET /1 ") < answer.index(b"GET /2 ")
            assert b"connection: close" not in answer.lower()
            await stream.aclose()
            stop.set()


async def test_an_idle_connection_is_closed_after_keep_alive_timeout(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            url, stop = await _echo_server(n, keep_alive_s=0.4)
            host, port = url.removeprefix("http://").rsplit(":", 1)
            stream = await trio.open_tcp_stream(host, int(port))
            await stream.send_all(b"GET /k HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = await stream.receive_some(65536)
            assert answer.startswith(b"HTTP/1.1 200 ")
            t0 = trio.current_time()
            assert await stream.receive_some(65536) == b""  # the server closed the idle connection
            assert 0.3 <= trio.current_time() - t0 < 3.0
            await stream.aclose()
            stop.set()
