"""One HTTP/1.1 connection of the front: requests in turn, each under its deadlines, until it closes.

Each request head goes through `parse_head` (parse.py): the common request is served on the fast path
(body read whole, the app called inline, the answer written in one write), anything else by h11 for that
request only (a fresh h11.Connection fed the same bytes; what it has left over after the request, the
next pipelined one, comes back to the fast path), and refused input gets an empty 400/431 and the
connection closes. A WebSocket upgrade hands the connection to websocket.py for the rest of its life.

Deadlines (absolute, trio's model; docs/operations.md): the first head must be whole within
`head_timeout_s` of the connection's start (TLS handshake included); a later head within
`head_timeout_s` of its first byte, the next request must start within `idle_timeout_s` of the last
answer, a body within `body_timeout_s` of its head, each write within `write_timeout_s`. A trickle of
bytes moves none of them. The connection writes them as floats (`read_by`, `write_by`) while it waits;
the server's sweeper (deadlines.py) cancels `scope` when one passes.

Answers keep the order of the requests. A push's 202 waits for the group commit: the committing task
writes it (`answer_committed`, on a plain TCP socket) while this task reads on; the next request is
served only once every earlier answer is out of user space, so a client that does not read holds one
answer here at most, and the socket's buffer, until the write deadline closes its connection.

No error in here ends more than this connection: what the client causes ends it quietly, anything else
is logged with its traceback (`FrontStats.errors`) and ends it too.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from email.utils import formatdate
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import h11
import trio

from inri.common.front.parse import DEFER, FastHead, Refusal, Verdict, head_ended, parse_head
from inri.common.front.stats import Phase
from inri.common.front.websocket import WebSocket
from inri.common.front.wire import CLOSED_ERRORS, Closed, Wire

if TYPE_CHECKING:
    from inri.common.front.server import HttpServer

__all__ = ["Connection", "Exchange", "FastExchange"]

FAST_BODY_MAX = 64 * 1024  # a body up to this size is read whole before the app runs; larger ones go to h11
FAST_YIELD_EVERY = 16  # requests served back to back without waiting on the socket before we yield once
DRAIN_MAX_BYTES = 256 * 1024  # unread body the server reads and drops after an answer, to keep a connection
# After an answer that closes the connection before the client's request was read whole (413, a refusal),
# what the client still sends is read and dropped for up to LINGER_S and LINGER_MAX_BYTES, after a
# half-close: closing a socket with unread input sends a reset, and the client may then lose the answer.
LINGER_S = 5.0
LINGER_MAX_BYTES = 1024 * 1024
ANSWERS_FLUSH_S = 5.0  # a closing connection waits this long at most for answers still waiting on a commit

_STATUS_LINES = {code: b"HTTP/1.1 %d \r\n" % code for code in (200, 201, 202, 204, 400, 404, 413, 422, 429)}
_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 413: b"Payload Too Large",
            431: b"Request Header Fields Too Large", 500: b"Internal Server Error", 501: b"Not Implemented",
            503: b"Service Unavailable"}


class _Date:
    """The Date header, formatted once per second."""

    def __init__(self) -> None:
        self.second = -1
        self.value = b""

    def header(self) -> bytes:
        now = int(time.time())
        if now != self.second:
            self.second = now
            self.value = formatdate(now, usegmt=True).encode()
        return self.value


DATE = _Date()


class Connection:
    """One client connection: requests in turn until it closes, is expired or the server stops."""

    __slots__ = ("armed", "buf", "client", "client_key", "close_after", "closed", "expired", "flushed", "local",
                 "peer", "pending", "phase", "read_by", "rest", "scope", "send_lock", "server", "started",
                 "stream", "tls", "trusted", "waited", "wire", "write_by", "writing", "ws", "idle")

    def __init__(self, server: HttpServer, stream: trio.abc.Stream, wire: Wire, peer: tuple[str, int],
                 local: tuple[str, int] | None, client_key: str | None, *, trusted: bool, tls: bool) -> None:
        self.server = server
        self.stream = stream
        self.wire = wire
        self.peer = peer
        self.client: tuple[str, int] = peer  # the scope's client: behind a trusted proxy, the one it names
        self.client_key = client_key  # counted in server.per_client (None: a trusted proxy, not yet known)
        self.trusted = trusted
        self.tls = tls
        self.local = local
        self.scope = trio.CancelScope()  # the sweeper cancels it at a deadline
        self.started = trio.current_time()
        self.armed = math.inf  # the sweeper's registration (deadlines.py)
        self.read_by = math.inf  # deadline of the read this task waits on
        self.phase = Phase.HEAD
        self.write_by = math.inf  # deadline of the write in progress
        self.expired: Phase | None = None
        self.idle = False  # waiting for the next request (a stopping server closes such connections)
        self.close_after = False  # fast path: the answer said the connection closes
        self.waited = False  # fast path: the socket was waited on since the last request was counted
        self.buf = b""
        # Answers written after the group commit by the committing task (answer_json's `after`): `pending`
        # such answers not written yet; `rest`: bytes of them the socket had no room for (a writer task
        # sends them, in order). Nothing else is written, nor the connection closed, before both are empty.
        self.pending = 0
        self.rest: list[bytes] = []
        self.writing = False
        self.flushed: trio.Event | None = None
        self.closed = False
        self.ws: WebSocket | None = None
        self.send_lock: trio.Lock | None = None  # a WebSocket's app sends from several tasks

    # -- life ------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until the connection ends; never raises (what ends it is counted or logged)."""
        server = self.server
        try:
            with self.scope:
                await self._serve()
        except CLOSED_ERRORS:
            pass
        except Exception as exc:  # noqa: BLE001 - a bug ends this connection only (issue 41 item 3)
            server.connection_failed(self, exc)
        finally:
            self.read_by = self.write_by = math.inf
            with trio.CancelScope(shield=True):
                if self.expired is None:  # a push answered 202 gets its answer (its commit is near)
                    with trio.move_on_after(ANSWERS_FLUSH_S):
                        try:
                            await self._flush_answers()
                        except CLOSED_ERRORS:
                            pass
                self.closed = True
                try:
                    await self.wire.aclose()
                except CLOSED_ERRORS:
                    pass
                server.forget(self)

    def due(self, now: float) -> float:
        """The sweeper's call (deadlines.py): expire at a passed deadline, ping a silent WebSocket."""
        if self.closed:
            return math.inf
        if self.write_by <= now:
            self.expire(Phase.WRITE)
            return math.inf
        if self.ws is not None:
            return min(self.ws.due(now), self.write_by)
        if self.read_by <= now:
            self.expire(self.phase)
            return math.inf
        return min(self.read_by, self.write_by)

    def expire(self, phase: Phase) -> None:
        """Close the connection now: its deadline for phase passed."""
        if self.expired is None:
            self.expired = phase
            counts = self.server.stats.deadline_closes
            counts[phase] = counts.get(phase, 0) + 1
        self.scope.cancel()

    def arm(self, at: float) -> None:
        """Make sure the sweeper looks at this connection at `at` (or earlier)."""
        if at < self.armed:
            self.server.sweeper.arm(self, at)

    async def receive(self, until: float, phase: Phase, *, wait_first: bool = False) -> bytes:
        """Bytes from the client (b"" at its end); the connection closes if none come by `until`."""
        wire = self.wire
        try:
            if not wait_first:
                data = wire.try_receive()
                if data is not None:
                    return data
            self.read_by = until
            self.phase = phase
            if until < self.armed:
                self.server.sweeper.arm(self, until)
            self.waited = True
            try:
                return await wire.receive(wait_first=wait_first)
            finally:
                self.read_by = math.inf
        except CLOSED_ERRORS:
            raise
        except Exception as exc:  # the stream's bug, not the app's: see _wire_failed
            raise self._wire_failed(exc) from exc

    async def read(self) -> bytes:
        """Bytes from the client without a read deadline (a WebSocket: liveness instead, websocket.py)."""
        try:
            return await self.wire.receive()
        except CLOSED_ERRORS:
            raise
        except Exception as exc:  # see _wire_failed
            raise self._wire_failed(exc) from exc

    async def send(self, data: bytes) -> None:
        """All of data, within write_timeout_s (else the connection closes)."""
        wire = self.wire
        try:
            n = wire.try_send(data)
            if n == len(data):
                return
            until = trio.current_time() + self.server.settings.write_timeout_s
            self.write_by = until
            if until < self.armed:
                self.server.sweeper.arm(self, until)
            try:
                await wire.send(data[n:] if n else data)
            finally:
                self.write_by = math.inf
        except CLOSED_ERRORS:
            raise
        except Exception as exc:  # see _wire_failed
            raise self._wire_failed(exc) from exc

    def _wire_failed(self, exc: Exception) -> Closed:
        """The stream raised what no network does (a bug under us): logged and counted here, where it
        happened, and the connection ends quietly (an app whose send or receive it reached is not blamed)."""
        self.server.connection_failed(self, exc)
        return Closed("the stream failed")

    # -- requests --------------------------------------------------------------------------------

    async def _serve(self) -> None:
        server = self.server
        settings = server.settings
        if self.tls:  # the handshake is part of the first head's time
            self.read_by = self.started + settings.head_timeout_s
            self.phase = Phase.HEAD
            self.arm(self.read_by)
            try:
                await self.wire.handshake()
            finally:
                self.read_by = math.inf
        max_head = settings.max_head_bytes
        first = True
        answered = False  # a request was answered (the next one is read after a wait)
        served = 0
        buf = b""
        while True:
            verdict = parse_head(buf, max_head, FAST_BODY_MAX) if buf else None
            if verdict is None:
                if server.closing and not buf:
                    return
                verdict, buf = await self._read_head(buf, first=first, wait_first=answered)
                if verdict is None:
                    return  # the client closed the connection between requests
            first = False
            if self.pending or self.rest:  # a pipelined request: the answers before it go first
                await self._flush_answers()
            if type(verdict) is FastHead:
                start, length = verdict.body_start, verdict.length
                if len(buf) - start < length:
                    buf = await self._read_body(buf, start + length)
                    if len(buf) < start + length:
                        return  # the client closed the connection mid-body
                body = buf[start:start + length]
                buf = buf[start + length:]
                if self.trusted and not self.server.resolve_client(self, verdict.headers):
                    await self._shed_answer()
                    return
                await self._fast_request(verdict, body)
                if self.close_after:
                    return
                answered = True
                served += 1
                if self.waited:  # the socket was waited on (a yield) since the last count
                    self.waited = False
                    served = 0
                elif served >= FAST_YIELD_EVERY:  # requests that never wait: let the other tasks run now and then
                    served = 0
                    await trio.lowlevel.checkpoint()
            elif type(verdict) is Refusal:
                await self.refuse(verdict.status)
                return
            else:
                request, buf = buf, b""  # (a WebSocket's bytes are not kept for its whole life)
                rest = await self._h11_request(request)
                if rest is None:
                    return
                buf = rest
                answered = True

    async def _read_head(self, buf: bytes, *, first: bool, wait_first: bool) -> tuple[Verdict, bytes]:
        """Read until buf holds a whole head (or a refusal): (None, b"") when the client closes before
        sending any of it. The first head's deadline runs from the connection's start, a later one's from
        its first byte; before that byte, the idle deadline."""
        settings = self.server.settings
        max_head = settings.max_head_bytes
        if first:
            head_by = self.started + settings.head_timeout_s
        if not buf:
            self.idle = True
            try:
                if first:
                    data = await self.receive(head_by, Phase.HEAD)
                else:
                    data = await self.receive(trio.current_time() + settings.idle_timeout_s, Phase.IDLE,
                                              wait_first=wait_first)
            finally:
                self.idle = False
            if not data:
                return None, b""
            buf = data
            verdict = parse_head(buf, max_head, FAST_BODY_MAX)
            if verdict is not None:
                return verdict, buf
        if not first:
            head_by = trio.current_time() + settings.head_timeout_s
        parts = bytearray(buf)  # collected in place: a head trickled byte by byte is copied once
        while True:
            scan = max(0, len(parts) - 3)
            data = await self.receive(head_by, Phase.HEAD)
            if not data:  # the end mid-head: h11's answer to what came (_h11_request gives it the end)
                return DEFER, bytes(parts)
            parts += data
            if head_ended(parts, max_head, scan):
                buf = bytes(parts)
                return parse_head(buf, max_head, FAST_BODY_MAX), buf

    async def _read_body(self, buf: bytes, size: int) -> bytes:
        """buf read on until it holds size bytes (less: the client closed), within body_timeout_s."""
        until = trio.current_time() + self.server.settings.body_timeout_s
        parts = bytearray(buf)
        while len(parts) < size:
            data = await self.receive(until, Phase.BODY)
            if not data:
                break
            parts += data
        return bytes(parts)

    def scope_of(self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]],
                 kind: str = "http") -> dict[str, Any]:
        """The ASGI scope of a request (both paths, and a WebSocket's)."""
        raw_path, _, query = target.partition(b"?")
        path = raw_path.decode("ascii")
        scheme = ("https" if self.tls else "http") if kind == "http" else ("wss" if self.tls else "ws")
        return {
            "type": kind, "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": method.decode("ascii"), "scheme": scheme, "path": unquote(path) if "%" in path else path,
            "raw_path": raw_path, "query_string": query, "root_path": "", "headers": headers,
            "client": self.client, "server": self.local, "extensions": {},
        }

    async def _fast_request(self, head: FastHead, body: bytes) -> None:
        server = self.server
        exchange = FastExchange(self, body)
        fast_post = server.fast_post
        try:
            if (head.method != b"POST" or fast_post is None
                    or not await fast_post(head.target, self.client, body, exchange)):
                await server.app(self.scope_of(head.method, head.target, head.headers), exchange.receive,
                                 exchange.send)
        except CLOSED_ERRORS:
            raise
        except Exception:  # noqa: BLE001 - an app failure is a 500, never a dropped server
            server.app_failed()
            if not exchange.sent:
                await exchange.answer(500, [(b"content-length", b"0")], b"")
            raise Closed from None
        if not exchange.sent:  # the app returned without answering
            await exchange.answer(500, [(b"content-length", b"0")], b"")

    async def _h11_request(self, buf: bytes) -> bytes | None:
        """One request parsed by h11 from the start of buf; what is left after it (the next request's
        bytes), or None when the connection closes."""
        server = self.server
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=server.settings.max_head_bytes)
        conn.receive_data(buf)
        if not head_ended(buf, server.settings.max_head_bytes):
            conn.receive_data(b"")  # _read_head hands over an incomplete head at the end of the stream
        try:
            event = await self.h11_event(conn, trio.current_time() + server.settings.head_timeout_s, Phase.HEAD)
        except h11.RemoteProtocolError as exc:
            await self.refuse(exc.error_status_hint)
            return None
        if not isinstance(event, h11.Request):
            return None  # ConnectionClosed
        if self.trusted and not server.resolve_client(self, list(event.headers)):
            await self._shed_answer()
            return None
        if _is_websocket(event):
            ws = WebSocket(self, conn, event)
            del conn, event, buf  # an idle WebSocket keeps nothing of its request (issue 37: <= 20 KB each)
            await ws.run()
            return None
        exchange = Exchange(self, conn, head_only=event.method == b"HEAD")
        try:
            await self._call_app(self.scope_of(event.method, bytes(event.target), list(event.headers)), exchange)
        except h11.RemoteProtocolError as exc:  # the body broke the protocol while the app read it
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await self.refuse(exc.error_status_hint)
            else:
                await self.linger()
            return None
        if conn.our_state is h11.MUST_CLOSE:
            if conn.their_state is h11.SEND_BODY:
                await self.linger()
            return None
        if not await self._drain(conn, exchange.body_by):
            await self.linger()
            return None
        if conn.their_state is h11.DONE and conn.our_state is h11.DONE:
            return bytes(conn.trailing_data[0])
        return None

    async def h11_event(self, conn: h11.Connection, until: float, phase: Phase) -> Any:
        """(For this module's exchanges.) The next h11 event, reading the client as needed, within until."""
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            conn.receive_data(await self.receive(until, phase))

    async def _call_app(self, scope: dict[str, Any], exchange: Exchange) -> None:
        """Run the app for one request; a failure before any answer started, or an app that returns
        without answering, is a 500 (never a dropped server)."""
        try:
            await self.server.app(scope, exchange.receive, exchange.send)
        except (*CLOSED_ERRORS, h11.RemoteProtocolError):
            raise
        except Exception:  # noqa: BLE001 - an app failure is a 500, never a dropped server
            self.server.app_failed()
            if exchange.status is None:
                await exchange.answer(500, [(b"content-length", b"0")], b"")
            raise Closed from None
        if exchange.conn.our_state is h11.SEND_RESPONSE:  # the app returned without answering
            await exchange.answer(500, [(b"content-length", b"0")], b"")

    async def _drain(self, conn: h11.Connection, until: float) -> bool:
        """After the answer: read and drop what is left of the request body; False to close instead."""
        dropped = 0
        while conn.their_state is h11.SEND_BODY:
            event = await self.h11_event(conn, until, Phase.BODY)
            if isinstance(event, h11.Data):
                dropped += len(event.data)
                if dropped > DRAIN_MAX_BYTES:
                    return False
            elif not isinstance(event, h11.EndOfMessage):
                return False
        return conn.their_state is h11.DONE and conn.our_state is h11.DONE

    async def refuse(self, status: int) -> None:
        """Input the server does not serve: a bodiless answer, then the connection closes (after a linger)."""
        counts = self.server.stats.refused
        counts[status] = counts.get(status, 0) + 1
        head = b"HTTP/1.1 %d %s\r\ncontent-length: 0\r\nconnection: close\r\ndate: %s\r\n\r\n" % (
            status, _REASONS.get(status, b""), DATE.header())
        await self.send(head)
        await self.linger()

    async def _shed_answer(self) -> None:
        """The client a trusted proxy named has as many connections as it may: 503, then close."""
        await self.send(self.server.shed_answer)
        await self.linger()

    async def linger(self) -> None:
        """Half-close, then read and drop what the client still sends (up to LINGER_S, LINGER_MAX_BYTES):
        a socket closed with unread input sends a reset, which may destroy the answer before it is read."""
        await self.wire.send_eof()
        until = trio.current_time() + min(LINGER_S, self.server.settings.body_timeout_s)
        dropped = 0
        with trio.move_on_at(until):  # rare: a scope of its own (the sweeper would count it as expired)
            while dropped < LINGER_MAX_BYTES:
                data = await self.wire.receive()
                if not data:
                    return
                dropped += len(data)

    # -- answers written after a commit ----------------------------------------------------------

    def answer_committed(self, data: bytes) -> None:
        """An answer that waited for the group commit, written by the committing task (an after-commit
        action) in the order the requests came; what the socket cannot take now goes to a writer task.
        It runs in the store's task: nothing may escape from here."""
        self.pending -= 1
        try:
            if self.closed:
                return
            if not self.rest:
                n = self.wire.try_send(data)
                if n == len(data):
                    return
                data = data[n:]
            self.rest.append(data)
            if not self.writing:
                self.writing = True
                self.server.spawn(self._write_rest)
        except CLOSED_ERRORS:  # the client is gone: no later answer may go out before this one
            self.closed = True
            self.scope.cancel()
        except Exception as exc:  # noqa: BLE001 - a bug ends this connection only, never the store's task
            self.closed = True
            self.server.connection_failed(self, exc)
            self.scope.cancel()
        finally:
            if not self.writing:
                if self.closed:
                    self.rest.clear()
                self._check_flushed()

    async def _write_rest(self) -> None:
        """Write what the socket had no room for, each within write_timeout_s (else the connection closes)."""
        try:
            while self.rest and not self.closed:
                await self.send(self.rest[0])
                del self.rest[0]
        except CLOSED_ERRORS:  # no later answer may go out before this one: the connection ends
            self.closed = True
            self.scope.cancel()
        except trio.Cancelled:  # the server stops
            self.closed = True
            raise
        except Exception as exc:  # noqa: BLE001 - as run(): a bug ends this connection only
            self.closed = True
            self.server.connection_failed(self, exc)
            self.scope.cancel()
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
            self.scope.cancel()

    async def _flush_answers(self) -> None:
        """Return once every answer written after a commit is out (or the client is gone)."""
        while self.pending or self.rest:
            if self.flushed is None:
                self.flushed = trio.Event()
            await self.flushed.wait()


class FastExchange:
    """ASGI receive/send for one request of the fast path: the body is read already, the answer goes
    out in one write once complete (with the Content-Length the app gave, or its length)."""

    __slots__ = ("body", "c", "chunks", "headers", "sent", "status")

    def __init__(self, connection: Connection, body: bytes) -> None:
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
        out += (b"date: ", DATE.header(), b"\r\n")
        if c.server.closing and not c.close_after:
            c.close_after = True
            out.append(b"connection: close\r\n")
        out += (b"\r\n", body)
        await c.send(b"".join(out))

    async def answer_json(self, status: int, body: bytes,
                          after: Callable[[Callable[[], None]], None] | None = None) -> None:
        """A complete application/json answer, as answer() writes it for the same status, content type
        and length, without the ASGI messages and header list (the app's hottest answer: a push's 202).

        after: the store's after_commit. The answer then leaves once what the request wrote is committed:
        on a plain TCP socket written by the committing task, and this returns at once (the connection
        goes on reading); on other streams this waits for the commit and writes it."""
        c = self.c
        self.sent = True
        closing = c.server.closing and not c.close_after
        if closing:
            c.close_after = True
        data = b"%scontent-type: application/json\r\ncontent-length: %d\r\ndate: %s\r\n%s\r\n%s" % (
            _STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status, len(body), DATE.header(),
            b"connection: close\r\n" if closing else b"", body)
        if after is None:
            await c.send(data)
            return
        if c.wire.sync:
            c.pending += 1
            after(functools.partial(c.answer_committed, data))
            return
        committed = trio.Event()
        after(committed.set)
        await committed.wait()
        await c.send(data)


class Exchange:
    """ASGI receive/send for one HTTP request parsed by h11."""

    __slots__ = ("body_by", "body_done", "c", "conn", "headers", "head_only", "status")

    def __init__(self, connection: Connection, conn: h11.Connection, *, head_only: bool = False) -> None:
        self.c = connection
        self.conn = conn
        self.head_only = head_only  # a HEAD request: the answer's body is not sent (RFC 9110 9.3.2)
        self.status: int | None = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.body_done = False
        self.body_by = trio.current_time() + connection.server.settings.body_timeout_s  # the body's deadline

    async def receive(self) -> dict[str, Any]:
        if self.body_done:
            # ASGI: after the body, receive() waits for the disconnect; the app does not ask for it.
            await trio.sleep_forever()
        conn = self.conn
        if conn.client_is_waiting_for_100_continue and conn.our_state is h11.SEND_RESPONSE:
            await self.c.send(conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        chunks: list[bytes] = []
        while True:
            if chunks:
                # What is buffered already goes out in one message; read the socket only when empty.
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    return {"type": "http.request", "body": b"".join(chunks), "more_body": True}
            else:
                event = await self.c.h11_event(conn, self.body_by, Phase.BODY)
            if isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                self.body_done = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            else:
                return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = int(message["status"])
            self.headers = list(message.get("headers", []))
        elif kind == "http.response.body":
            if self.status is None:
                raise RuntimeError("ASGI: response body before its start")
            await self._write(bytes(message.get("body", b"")), end=not message.get("more_body", False))

    async def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self.status, self.headers = status, headers
        await self._write(body, end=True)

    async def _write(self, body: bytes, *, end: bool) -> None:
        conn = self.conn
        out = b""
        if conn.our_state is h11.SEND_RESPONSE:
            assert self.status is not None
            headers = [*self.headers, (b"date", DATE.header())]
            if self.c.server.closing:
                headers.append((b"connection", b"close"))
            out = conn.send(h11.Response(status_code=self.status, headers=headers)) or b""
        if body and not self.head_only:
            out += conn.send(h11.Data(data=body)) or b""
        if end:
            out += conn.send(h11.EndOfMessage()) or b""
        await self.c.send(out)


def _is_websocket(req: h11.Request) -> bool:
    upgrade = connection = b""
    for name, value in req.headers:
        if name == b"upgrade":
            upgrade = value.lower()
        elif name == b"connection":
            connection = value.lower()
    return b"websocket" in upgrade and b"upgrade" in connection

