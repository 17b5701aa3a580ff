"""The relay's HTTP/1.1 front (inri/node/http1.py) at the byte level: what the API tests do not reach."""

from __future__ import annotations

import re
from pathlib import Path

import trio

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
