"""The relay's HTTP/1.1 + WebSocket front: h11 and wsproto over trio streams, serving an ASGI app.

Why hand-written (issue 16 item 2, measured): under wrk, a relay spent 57% of its CPU in the HTTP
stack, most of it in hypercorn's per-request machinery (a task, an event-driven ASGI queue and cancel
scopes per request, timers per connection), not in parsing. This front keeps the sans-IO libraries
hypercorn is built from (h11 parses and frames HTTP/1.1, wsproto does the WebSocket handshake and
frames) and drops the rest: one task per connection, the ASGI app called inline, a request's
response written with one send, one cancel scope per connection whose deadline is moved (no scope
per read). `benchmarks/bench_poc.py` measures both servers on the same relay (figures in docs/
operations.md). Every route is the same ASGI app as before, so the documented API, problem+json
bodies, limits and metrics do not change; `serve()` takes hypercorn's Config and has hypercorn's
serve() signature, so the relay (and the tests) switch servers without other changes.

The fast path (`_Connection._serve_fast`): even h11's event objects and state machine cost more
than the relay's push handler, so the common request is parsed here, on h11's own grammar (its
request-line and header-field expressions): HTTP/1.1, exactly one Host, a Content-Length body up to
FAST_BODY_MAX (or none), no Transfer-Encoding, Expect, Upgrade or Connection other than keep-alive.
The socket is read and written on its file descriptor (trio's stream yields to the scheduler on
every call; these wait only when there is nothing to read or no room to write), and connections that
wait too long are closed by one sweeper task per server instead of a deadline moved per read. A
request that does not fit, and anything malformed, goes to h11 from its first byte for the rest of
the connection, so every answer to unusual or bad input is h11's, as before.

What it does: HTTP/1.1 keep-alive and pipelining (h11 parses the next request only after the answer
to the one before), request heads bounded by `h11_max_incomplete_size`, bodies bounded by each
route (the app's `Request`), idle connections closed after `keep_alive_timeout`, a request whose head
or body stalls for READ_TIMEOUT_S closed, input h11 cannot parse answered 400 (501 for an unsupported
transfer coding) with an empty body as hypercorn did, `Expect: 100-continue` honoured, an app failure
answered 500. WebSocket upgrades (the device stream) go through wsproto with the ASGI websocket
protocol; a close before accept is answered 403, as hypercorn did. Graceful stop: on the shutdown
trigger the listeners close, idle connections close, requests in flight get `graceful_timeout`.
No lifespan events (the relay's app has nothing to start), no HTTP/2, no TLS (a reverse proxy's job:
docs/operations.md).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
import socket
import time
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote

import h11
import trio
from hypercorn.config import Config
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    TextMessage,
)
from wsproto.events import Request as WsRequest
from wsproto.utilities import RemoteProtocolError as WsProtocolError

from inri.common.addr import format_addr

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[dict[str, Any]]], Callable[[dict[str, Any]], Awaitable[None]]],
                   Awaitable[None]]

READ_TIMEOUT_S = 30.0  # a request's head or body that stalls this long closes its connection
# A closing connection waits this long at most for its answers still waiting on a group commit (one
# scheduling round as a rule; the store commits what is pending when it stops).
ANSWERS_FLUSH_S = 5.0
RECEIVE_BYTES = 65536
LISTEN_BACKLOG = 1024
DRAIN_MAX_BYTES = 256 * 1024  # unread body the server reads and drops to keep a connection (413, 404 ...)
WS_MAX_MESSAGE_BYTES = 1024 * 1024  # the device stream's messages are acks (~17.5 KB at most)
# The fast path (see _Connection._serve_fast): requests it parses itself, h11's grammar (h11/_abnf.py).
FAST_BODY_MAX = 64 * 1024  # a body up to this size is read whole before the app runs; larger ones go to h11
FAST_YIELD_EVERY = 16  # requests served back to back without waiting on the socket before we yield once
_REQUEST_LINE = re.compile(rb"([-!#$%&'*+.^_`|~0-9a-zA-Z]+) ([\x21-\x7e]+) HTTP/1\.1")
_HEADER = re.compile(rb"([-!#$%&'*+.^_`|~0-9a-zA-Z]+):[ \t]*((?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?)[ \t]*")
# Request and header lines parsed lately (clients repeat theirs on every request): request line ->
# (method, target), header line -> (lower-case name, value). Only lines the expressions match are
# kept; each is cleared when it holds FIELDS_CACHED_MAX.
_REQUEST_LINES: dict[bytes, tuple[bytes, bytes]] = {}
_FIELDS: dict[bytes, tuple[bytes, bytes]] = {}
FIELDS_CACHED_MAX = 1024
# Request headers the fast path leaves to h11 (framing, upgrades, continue, close semantics).
_H11_HEADERS = frozenset((b"transfer-encoding", b"expect", b"upgrade", b"connection", b"content-length", b"host"))
_STATUS_LINES = {code: b"HTTP/1.1 %d \r\n" % code for code in (200, 201, 202, 204, 400, 404, 413, 422, 429)}
_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 413: b"Payload Too Large",
            431: b"Request Header Fields Too Large", 500: b"Internal Server Error", 501: b"Not Implemented"}


class _Date:
    """The Date header, formatted once per second (as hypercorn sends it)."""

    def __init__(self) -> None:
        self.second = -1
        self.value = b""

    def header(self) -> bytes:
        now = int(time.time())
        if now != self.second:
            self.second = now
            self.value = formatdate(now, usegmt=True).encode()
        return self.value


_DATE = _Date()


class _Closed(Exception):
    """The peer closed the connection or let it stall: stop serving it."""


class _Connection:
    """One client connection: requests in turn until it closes (or the server stops)."""

    def __init__(self, server: _Server, stream: trio.SocketStream) -> None:
        self.server = server
        self.stream = stream
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=server.config.h11_max_incomplete_size)
        sock = stream.socket
        self.client = _addr(sock.getpeername())
        self.local = _addr(sock.getsockname())
        self.deadline = trio.CancelScope()  # its deadline is moved while we wait for the peer (not a scope per read)
        self.idle = False  # waiting for the next request (the server's stop closes such connections)
        self.send_lock = trio.Lock()  # a WebSocket app sends from two tasks
        self.close_after = False  # fast path: the answer said the connection closes
        self.waited = False  # fast path: _recv waited on the socket since the last request was counted
        self.fd = sock.fileno()
        self.buf = b""  # fast path: bytes received and not parsed yet
        # Fast path: while waiting on the socket, the trio time after which the server's sweeper closes
        # the connection (no deadline moved per read: one sweeper per server checks them all).
        self.wait_until = math.inf
        # Answers written after the group commit by the committing task (answer_json's `after`): the
        # connection task does not wait for the commit (a task switch per push saved). `pending`: such
        # answers not written yet; `rest`: bytes of them the socket had no room for (a writer task sends
        # them, in order). Nothing else is written, nor the connection closed, before both are empty.
        self.pending = 0
        self.rest: list[bytes] = []
        self.writing = False
        self.flushed: trio.Event | None = None
        self.closed = False

    async def run(self) -> None:
        try:
            with self.deadline:
                await self._serve()
        except (_Closed, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        except Exception:  # noqa: BLE001 - one connection's failure (h11.LocalProtocolError ...) never ends the server
            self.server.log_error("connection failed", exc_info=True)
        finally:
            self.server.connections.discard(self)
            with trio.CancelScope(shield=True), trio.move_on_after(ANSWERS_FLUSH_S):
                await self._flush_answers()  # a push answered 202 gets its answer (its commit is near)
            self.closed = True
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                await self.stream.aclose()

    async def _serve(self) -> None:
        if await self._serve_fast():
            await self._flush_answers()  # h11 writes only after them
            await self._serve_h11()

    def answer_committed(self, data: bytes) -> None:
        """An answer that waited for the group commit, written by the committing task (an after-commit
        action) in the order the requests came; what the socket buffer cannot take now goes to a writer task."""
        self.pending -= 1
        if self.closed:
            self._check_flushed()
            return
        if not self.rest:
            try:
                n = os.write(self.fd, data)
            except BlockingIOError:
                n = 0
            except OSError:  # the peer is gone: the connection task finds out on its next read
                self.closed = True
                self._check_flushed()
                return
            if n == len(data):
                self._check_flushed()
                return
            data = data[n:]
        self.rest.append(data)
        if not self.writing:
            self.writing = True
            self.server.spawn(self._write_rest)

    async def _write_rest(self) -> None:
        try:
            while self.rest and not self.closed:
                await self.send_raw(self.rest[0])
                del self.rest[0]
        except OSError:
            self.closed = True
        finally:
            self.writing = False
            if self.closed:
                self.rest.clear()
            self._check_flushed()

    def _check_flushed(self) -> None:
        if self.pending or self.rest:
            return
        if self.flushed is not None:
            self.flushed.set()
            self.flushed = None
        if self.server.closing and self.idle:  # the server stops: an idle connection closes once answered
            self.deadline.cancel()

    async def _flush_answers(self) -> None:
        """Return once every answer written after a commit is out (or the peer is gone)."""
        while self.pending or self.rest:
            if self.flushed is None:
                self.flushed = trio.Event()
            await self.flushed.wait()

    async def _serve_fast(self) -> bool:
        """Requests h11 would parse the same way, parsed here (most of hypercorn's and h11's per-request
        cost was event objects and state machines, not parsing): HTTP/1.1 with one Host, a
        Content-Length body (or none) up to FAST_BODY_MAX, no Transfer-Encoding, Expect, Upgrade or
        Connection header. Anything else (and anything malformed) from its first byte on goes to h11
        for the rest of the connection: True to hand over, False when the connection is done.

        Socket calls go straight to the file descriptor: a read that finds data or a write that fits
        the socket buffer does not pass through trio's scheduler (trio's stream yields on each)."""
        server = self.server
        config = server.config
        max_head = config.h11_max_incomplete_size
        served = 0
        answered = False  # a request was answered on this connection (the next is read after a wait)
        while True:
            if server.closing:
                return False
            buf = self.buf
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.idle = True
                try:
                    while end < 0:
                        if len(buf) > max_head:
                            return self._to_h11(buf)
                        # Right after an answer the client has rarely sent its next request yet: wait
                        # for it first (a read now would mostly fail, a syscall and an exception spent).
                        data = await self._recv(config.keep_alive_timeout, wait_first=answered and not buf)
                        if not data:
                            if buf:
                                return self._to_h11(buf, eof=True)
                            return False
                        buf += data
                        end = buf.find(b"\r\n\r\n", max(0, len(buf) - len(data) - 3))
                finally:
                    self.idle = False
            if self.pending or self.rest:  # a pipelined request: the answers before it go first
                await self._flush_answers()
            if end > max_head:
                return self._to_h11(buf)
            lines = buf[:end].split(b"\r\n")
            request_line = _REQUEST_LINES.get(lines[0])
            if request_line is None:
                m = _REQUEST_LINE.fullmatch(lines[0])
                if m is None:
                    return self._to_h11(buf)
                request_line = m.group(1), m.group(2)
                if len(_REQUEST_LINES) >= FIELDS_CACHED_MAX:
                    _REQUEST_LINES.clear()
                _REQUEST_LINES[lines[0]] = request_line
            method, target = request_line
            if method == b"HEAD" or method == b"CONNECT":
                return self._to_h11(buf)
            headers: list[tuple[bytes, bytes]] = []
            hosts = 0
            length = -1
            for line in lines[1:]:
                field = _FIELDS.get(line)
                if field is None:
                    h = _HEADER.fullmatch(line)
                    if h is None:
                        return self._to_h11(buf)
                    name, value = h.groups()
                    field = name.lower(), value
                    if len(_FIELDS) >= FIELDS_CACHED_MAX:
                        _FIELDS.clear()
                    _FIELDS[line] = field
                name, value = field
                if name in _H11_HEADERS:
                    if name == b"host":
                        hosts += 1
                    elif name == b"content-length" and value.isdigit() and len(value) < 10 and length < 0:
                        length = int(value)
                    elif name != b"connection" or value.lower() != b"keep-alive":
                        return self._to_h11(buf)
                headers.append((name, value))
            if hosts != 1 or length > FAST_BODY_MAX:
                return self._to_h11(buf)
            length = max(length, 0)
            start = end + 4
            while len(buf) - start < length:  # the rest of the body (usually in the same read)
                data = await self._recv(READ_TIMEOUT_S)
                if not data:
                    return False
                buf += data
            self.buf = buf[start + length:]
            await self._fast_request(method, target, headers, buf[start:start + length])
            if self.close_after:
                return False
            answered = True
            served += 1
            if self.waited:  # the socket was waited on (a yield) since the last count
                self.waited = False
                served = 0
            elif served >= FAST_YIELD_EVERY:  # requests that never wait: let the other tasks run now and then
                served = 0
                await trio.lowlevel.checkpoint()

    def _to_h11(self, buf: bytes, *, eof: bool = False) -> bool:
        """Hand what is buffered to h11 (which parses it from the start of a request)."""
        self.buf = b""
        self.conn.receive_data(buf)
        if eof:
            self.conn.receive_data(b"")
        return True

    async def _recv(self, timeout: float, *, wait_first: bool = False) -> bytes:
        """Bytes from the socket (b"" at its end); the sweeper closes the connection after timeout s.
        wait_first: wait until the socket is readable before the first read."""
        fd = self.fd
        while True:
            if wait_first:
                wait_first = False
            else:
                try:
                    return os.read(fd, RECEIVE_BYTES)
                except BlockingIOError:
                    pass
            self.wait_until = trio.current_time() + timeout
            self.waited = True
            try:
                await trio.lowlevel.wait_readable(fd)
            finally:
                self.wait_until = math.inf

    async def send_raw(self, data: bytes) -> None:
        """Write all of data to the socket, waiting only when its buffer is full."""
        fd = self.fd
        view = memoryview(data)
        while view:
            try:
                n = os.write(fd, view)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(fd)
                continue
            view = view[n:]

    def _scope(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]]) -> Scope:
        """The ASGI scope of an HTTP/1.1 request (both paths: fast and h11)."""
        raw_path, _, query = target.partition(b"?")
        path = raw_path.decode("ascii")
        return {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": method.decode("ascii"), "scheme": "http", "path": unquote(path) if "%" in path else path,
            "raw_path": raw_path, "query_string": query, "root_path": "", "headers": headers,
            "client": self.client, "server": self.local, "extensions": {},
        }

    async def _call_app(self, scope: Scope, exchange: _FastExchange | _Exchange,
                        started: Callable[[], bool], answered: Callable[[], bool]) -> None:
        """Run the app for one request; a failure before any answer started, or an app that returns
        without answering, is a 500 (never a dropped server)."""
        try:
            await self.server.app(scope, exchange.receive, exchange.send)
        except (_Closed, trio.BrokenResourceError, trio.ClosedResourceError):
            raise
        except Exception:  # noqa: BLE001 - an app failure is a 500, never a dropped server
            self.server.log_error("Error in ASGI application", exc_info=True)
            if not started():
                await exchange.answer(500, [(b"content-length", b"0")], b"")
            raise _Closed from None
        if not answered():  # the app returned without answering
            await exchange.answer(500, [(b"content-length", b"0")], b"")

    async def _fast_request(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]],
                            body: bytes) -> None:
        exchange = _FastExchange(self, body)
        fast_post = self.server.fast_post
        try:
            if (method != b"POST" or fast_post is None
                    or not await fast_post(target, self.client, body, exchange)):
                await self.server.app(self._scope(method, target, headers), exchange.receive, exchange.send)
        except (_Closed, trio.BrokenResourceError, trio.ClosedResourceError):
            raise
        except Exception:  # noqa: BLE001 - as _call_app: an app failure is a 500, never a dropped server
            self.server.log_error("Error in ASGI application", exc_info=True)
            if not exchange.sent:
                await exchange.answer(500, [(b"content-length", b"0")], b"")
            raise _Closed from None
        if not exchange.sent:  # the app returned without answering
            await exchange.answer(500, [(b"content-length", b"0")], b"")

    async def _serve_h11(self) -> None:
        conn = self.conn
        while True:
            self.idle = True
            try:
                if self.server.closing:
                    return
                event = await self.next_event_within(self.server.config.keep_alive_timeout)
            except h11.RemoteProtocolError as exc:
                await self.refuse(exc.error_status_hint)
                return
            finally:
                self.idle = False
            if not isinstance(event, h11.Request):
                return  # ConnectionClosed
            if _is_websocket(event):
                await _WebSocket(self, event).run()
                return
            try:
                await self._request(event)
            except h11.RemoteProtocolError as exc:
                if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    await self.refuse(exc.error_status_hint)
                return
            if conn.our_state is h11.MUST_CLOSE or not await self._drain():
                return
            conn.start_next_cycle()

    async def next_event_within(self, timeout: float) -> Any:
        """The next h11 event, reading the socket as needed; _Closed after `timeout` s without one."""
        conn = self.conn
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            self.deadline.deadline = trio.current_time() + timeout
            data = await self.stream.receive_some(RECEIVE_BYTES)
            self.deadline.deadline = math.inf
            conn.receive_data(data)
            if self.deadline.cancel_called:
                raise _Closed

    async def refuse(self, status: int) -> None:
        """What h11 cannot parse: a bodiless answer, then the connection closes (hypercorn's answer)."""
        reason = _REASONS.get(status, b"")
        head = b"HTTP/1.1 %d %s\r\ncontent-length: 0\r\nconnection: close\r\ndate: %s\r\n\r\n" % (
            status, reason, _DATE.header())
        await self.stream.send_all(head)

    async def _drain(self) -> bool:
        """After the answer: read and drop what is left of the request body; False to close instead."""
        conn = self.conn
        dropped = 0
        while conn.their_state is h11.SEND_BODY:
            event = await self.next_event_within(READ_TIMEOUT_S)
            if isinstance(event, h11.Data):
                dropped += len(event.data)
                if dropped > DRAIN_MAX_BYTES:
                    return False
            elif not isinstance(event, h11.EndOfMessage):
                return False
        return conn.their_state is h11.DONE and conn.our_state is h11.DONE

    async def _request(self, req: h11.Request) -> None:
        exchange = _Exchange(self)
        await self._call_app(self._scope(req.method, bytes(req.target), list(req.headers)), exchange,
                             lambda: exchange.status is not None,
                             lambda: self.conn.our_state is not h11.SEND_RESPONSE)


class _FastExchange:
    """ASGI receive/send for one request of the fast path: the body is read already, the answer goes
    out in one write once complete (with the Content-Length the app gave, or its length)."""

    def __init__(self, connection: _Connection, body: bytes) -> None:
        self.c = connection
        self.body: bytes | None = body
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.sent = False

    async def receive(self) -> dict[str, Any]:
        body, self.body = self.body, None
        if body is None:
            # ASGI: after the body, receive() waits for the disconnect; the app does not ask for it.
            await trio.sleep_forever()
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = int(message["status"])
            self.headers = list(message.get("headers", []))
        elif kind == "http.response.body":
            if not self.status:
                raise RuntimeError("ASGI: response body before its start")
            if self.sent:
                raise RuntimeError("ASGI: response body after its end")
            self.chunks.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                await self.answer(self.status, self.headers, b"".join(self.chunks))

    async def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        c = self.c
        self.sent = True
        out = [_STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status]
        sized = False
        for name, value in headers:
            lower = name.lower()
            if lower == b"content-length":
                sized = True
            elif lower == b"connection" and b"close" in value.lower():
                c.close_after = True
            out += (name, b": ", value, b"\r\n")
        if not sized:
            out.append(b"content-length: %d\r\n" % len(body))
        out += (b"date: ", _DATE.header(), b"\r\n")
        if c.server.closing and not c.close_after:
            c.close_after = True
            out.append(b"connection: close\r\n")
        out += (b"\r\n", body)
        await c.send_raw(b"".join(out))

    async def answer_json(self, status: int, body: bytes,
                          after: Callable[[Callable[[], None]], None] | None = None) -> None:
        """A complete application/json answer, as answer() writes it for the same status, content type
        and length, without the ASGI messages and header list (the app's hottest answer: a push's 202).

        after: the store's after_commit. The answer then leaves once what the request wrote is committed,
        written by the committing task, and this returns at once: the connection goes on reading."""
        c = self.c
        self.sent = True
        closing = c.server.closing and not c.close_after
        if closing:
            c.close_after = True
        data = b"%scontent-type: application/json\r\ncontent-length: %d\r\ndate: %s\r\n%s\r\n%s" % (
            _STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status, len(body), _DATE.header(),
            b"connection: close\r\n" if closing else b"", body)
        if after is None:
            await c.send_raw(data)
            return
        c.pending += 1
        after(functools.partial(c.answer_committed, data))


class _Exchange:
    """ASGI receive/send for one HTTP request on a connection."""

    def __init__(self, connection: _Connection) -> None:
        self.c = connection
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body_done = False

    async def receive(self) -> dict[str, Any]:
        if self.body_done:
            # ASGI: after the body, receive() waits for the disconnect; the app does not ask for it.
            await trio.sleep_forever()
        conn = self.c.conn
        if conn.client_is_waiting_for_100_continue and conn.our_state is h11.SEND_RESPONSE:
            await self.c.stream.send_all(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        chunks: list[bytes] = []
        try:
            while True:
                if chunks:
                    # What is buffered already goes out in one message; read the socket only when empty.
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        return {"type": "http.request", "body": b"".join(chunks), "more_body": True}
                else:
                    event = await self.c.next_event_within(READ_TIMEOUT_S)
                if isinstance(event, h11.Data):
                    chunks.append(bytes(event.data))
                elif isinstance(event, h11.EndOfMessage):
                    self.body_done = True
                    return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
                else:
                    return {"type": "http.disconnect"}
        except h11.RemoteProtocolError:
            return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = int(message["status"])
            self.headers = list(message.get("headers", []))
        elif kind == "http.response.body":
            if self.status is None:
                raise RuntimeError("ASGI: response body before its start")
            body = bytes(message.get("body", b""))
            if message.get("more_body", False):
                await self._write(body, end=False)
            else:
                await self._write(body, end=True)

    async def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status, self.headers = status, headers
        await self._write(body, end=True)

    async def _write(self, body: bytes, *, end: bool) -> None:
        conn = self.c.conn
        out = b""
        if conn.our_state is h11.SEND_RESPONSE:
            assert self.status is not None
            headers = [*self.headers, (b"date", _DATE.header())]
            if self.c.server.closing:
                headers.append((b"connection", b"close"))
            out = conn.send(h11.Response(status_code=self.status, headers=headers)) or b""
        if body:
            out += conn.send(h11.Data(data=body)) or b""
        if end:
            out += conn.send(h11.EndOfMessage()) or b""
        await self.c.stream.send_all(out)


def _is_websocket(req: h11.Request) -> bool:
    upgrade = connection = b""
    for name, value in req.headers:
        if name == b"upgrade":
            upgrade = value.lower()
        elif name == b"connection":
            connection = value.lower()
    return b"websocket" in upgrade and b"upgrade" in connection


class _WebSocket:
    """One WebSocket connection (RFC 6455 via wsproto) as the ASGI websocket protocol."""

    def __init__(self, connection: _Connection, req: h11.Request) -> None:
        self.c = connection
        self.req = req
        self.ws = WSConnection(ConnectionType.SERVER)
        self.accepted = False
        self.closed = False
        self.text: list[str] = []
        self.data: list[bytes] = []
        self.size = 0

    async def run(self) -> None:
        req, c = self.req, self.c
        # wsproto does the handshake from the request's bytes: hand it the head h11 parsed, then
        # whatever the client sent after it.
        head = b"%s %s HTTP/1.1\r\n" % (req.method, req.target) + b"".join(
            b"%s: %s\r\n" % (k, v) for k, v in req.headers.raw_items()) + b"\r\n"
        trailing, _ = c.conn.trailing_data
        self.ws.receive_data(head + bytes(trailing))
        first = next(self.ws.events(), None)
        if not isinstance(first, WsRequest):
            await c.refuse(400)
            return
        raw_path, _, query = bytes(req.target).partition(b"?")
        scope: Scope = {
            "type": "websocket", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "scheme": "ws", "path": unquote(raw_path.decode("ascii")), "raw_path": raw_path, "query_string": query,
            "root_path": "", "headers": list(req.headers), "client": c.client, "server": c.local,
            "subprotocols": list(first.subprotocols), "extensions": {},
        }
        connected = False

        async def receive() -> dict[str, Any]:
            nonlocal connected
            if not connected:
                connected = True
                return {"type": "websocket.connect"}
            return await self._receive()

        try:
            await c.server.app(scope, receive, self._send)
        except (_Closed, trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return
        except Exception:  # noqa: BLE001 - as for HTTP: logged, the connection ends
            c.server.log_error("Error in ASGI websocket application", exc_info=True)
        if not self.accepted:
            await self._reject()
        elif not self.closed:
            await self._out(CloseConnection(code=1000))

    async def _receive(self) -> dict[str, Any]:
        while True:
            for event in self.ws.events():
                if isinstance(event, Message):
                    self.size += len(event.data)
                    if self.size > WS_MAX_MESSAGE_BYTES:
                        await self._out(CloseConnection(code=1009))
                        return {"type": "websocket.disconnect", "code": 1009}
                    if isinstance(event, TextMessage):
                        self.text.append(event.data)
                    elif isinstance(event, BytesMessage):
                        self.data.append(bytes(event.data))
                    if event.message_finished:
                        self.size = 0
                        if isinstance(event, TextMessage):
                            text, self.text = "".join(self.text), []
                            return {"type": "websocket.receive", "text": text}
                        data, self.data = b"".join(self.data), []
                        return {"type": "websocket.receive", "bytes": data}
                elif isinstance(event, Ping):
                    await self._out(event.response())
                elif isinstance(event, CloseConnection):
                    if not self.closed:
                        await self._out(event.response())
                    return {"type": "websocket.disconnect", "code": event.code}
            if self.closed:
                return {"type": "websocket.disconnect", "code": 1006}
            try:
                data = await self.c.stream.receive_some(RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if not data:
                self.closed = True
                return {"type": "websocket.disconnect", "code": 1006}
            try:
                self.ws.receive_data(data)
            except WsProtocolError:
                self.closed = True
                return {"type": "websocket.disconnect", "code": 1002}

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "websocket.accept":
            if not self.accepted:
                self.accepted = True
                hdrs = list(message.get("headers", []))
                await self._out(AcceptConnection(subprotocol=message.get("subprotocol"), extra_headers=hdrs))
        elif kind == "websocket.send":
            if self.closed:
                raise trio.ClosedResourceError("websocket closed")
            if message.get("text") is not None:
                await self._out(TextMessage(data=message["text"]))
            else:
                await self._out(BytesMessage(data=message.get("bytes") or b""))
        elif kind == "websocket.close":
            if not self.accepted:
                await self._reject()
            elif not self.closed:
                await self._out(CloseConnection(code=int(message.get("code", 1000)), reason=message.get("reason")))

    async def _reject(self) -> None:
        """A close before accept is an HTTP 403 (ASGI; hypercorn's answer)."""
        if not self.closed:
            self.closed = True
            await self._write(self.ws.send(RejectConnection(status_code=403, headers=[(b"content-length", b"0")])))

    async def _out(self, event: Any) -> None:
        if isinstance(event, CloseConnection):
            if self.closed:
                return
            self.closed = True
        await self._write(self.ws.send(event))

    async def _write(self, data: bytes) -> None:
        async with self.c.send_lock:
            await self.c.stream.send_all(data)


class _Server:
    def __init__(self, app: ASGIApp, config: Config) -> None:
        self.app = app
        # An app may serve hot POST targets from the parsed body without an ASGI scope (RelayApi.fast_post:
        # `await fast_post(target, client, body, exchange) -> bool`, False: not one of its targets; the
        # exchange has `send`, ASGI's, and `answer_json(status, body)`).
        self.fast_post: Callable[[bytes, Any, bytes, _FastExchange], Awaitable[bool]] | None = getattr(
            app, "fast_post", None)
        self.config = config
        self.closing = False
        self.connections: set[_Connection] = set()
        self.nursery: trio.Nursery | None = None  # the connections' nursery (writer tasks start there)
        self.errorlog: logging.Logger | None = getattr(config.log, "error_logger", None)

    def log_error(self, message: str, **kw: Any) -> None:
        if self.errorlog is not None:
            self.errorlog.error(message, **kw)

    def spawn(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run fn as a task of the server's connections (closed with them)."""
        assert self.nursery is not None
        self.nursery.start_soon(fn)

    async def handle(self, stream: trio.SocketStream) -> None:
        try:
            connection = _Connection(self, stream)
        except OSError:  # gone before we looked at it (getpeername: not connected)
            await stream.aclose()
            return
        self.connections.add(connection)
        await connection.run()


def _addr(sockaddr: Any) -> tuple[str, int] | None:
    return (str(sockaddr[0]), int(sockaddr[1])) if isinstance(sockaddr, tuple) else None


def _listening_socket(bind: str) -> socket.socket:
    if bind.startswith("fd://"):
        return socket.socket(fileno=int(bind[5:]))
    host, _, port = bind.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    info = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(info[0], info[1], info[2])
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(info[4])
    sock.listen(LISTEN_BACKLOG)
    return sock


async def serve(app: ASGIApp, config: Config, *, shutdown_trigger: Callable[[], Awaitable[Any]],
                task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve app on config.bind (host:port or fd://N, as hypercorn) until shutdown_trigger returns.

    task_status gets the bound URLs (http://host:port). Requests in flight then get
    config.graceful_timeout seconds; idle connections close at once."""
    server = _Server(app, config)
    socks = [_listening_socket(b) for b in config.bind]
    listeners = []
    for sock in socks:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
    async with trio.open_nursery() as sweeper:
        sweeper.start_soon(_sweep, server)
        await _serve_connections(server, config, listeners, shutdown_trigger, task_status)
        sweeper.cancel_scope.cancel()


async def _sweep(server: _Server) -> None:
    """Close connections of the fast path that waited on their socket longer than allowed."""
    interval = max(0.05, min(1.0, server.config.keep_alive_timeout / 4, READ_TIMEOUT_S / 4))
    while True:
        await trio.sleep(interval)
        now = trio.current_time()
        for connection in list(server.connections):
            if connection.wait_until < now:
                connection.deadline.cancel()


async def _serve_connections(server: _Server, config: Config, listeners: list[trio.SocketListener],
                             shutdown_trigger: Callable[[], Awaitable[Any]],
                             task_status: trio.TaskStatus[list[str]]) -> None:
    urls = [f"http://{format_addr(*listener.socket.getsockname()[:2])}" for listener in listeners]
    async with trio.open_nursery() as conns:
        server.nursery = conns
        async with trio.open_nursery() as accept:
            for listener in listeners:
                accept.start_soon(functools.partial(trio.serve_listeners, server.handle, [listener],
                                                    handler_nursery=conns))
            task_status.started(urls)
            await shutdown_trigger()
            accept.cancel_scope.cancel()
        for listener in listeners:
            await listener.aclose()
        server.closing = True
        for connection in list(server.connections):
            if connection.idle and not connection.pending and not connection.rest:
                connection.deadline.cancel()  # (one with answers still to write closes once they are out)
        conns.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
