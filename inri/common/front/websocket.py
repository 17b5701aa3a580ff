"""A WebSocket on a connection of the front (RFC 6455 through wsproto) as the ASGI websocket protocol.

After the upgrade the HTTP head and idle deadlines no longer apply. Instead (docs/operations.md):
- liveness: after `ws_ping_interval_s` without a byte from the client the server sends a Ping (the
  sweeper does, deadlines.py: no timer or task per connection while all is well), and closes the
  connection when nothing arrives within `ws_pong_timeout_s` of it (RFC 6455 5.5.2: a Pong, or any
  frame, shows the client is there). Clients' own Pings are answered.
- every write (a message, a Ping, a close) has the connection's write deadline;
- a message larger than `ws_max_message_bytes` is refused with close code 1009 (RFC 6455 7.4.1).

An app sends from any of its tasks through ASGI `send` (the device stream does); frames are serialised
by the connection's send lock. A close before accept is an HTTP 403 (ASGI).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import h11
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import Connection as WsFrames
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Message,
    Ping,
    RejectConnection,
    TextMessage,
)
from wsproto.events import Request as WsRequest
from wsproto.utilities import RemoteProtocolError as WsProtocolError

from inri.common.front.stats import Phase
from inri.common.front.wire import CLOSED_ERRORS

if TYPE_CHECKING:
    from inri.common.front.connection import Connection

__all__ = ["WebSocket"]

CLOSE_TOO_BIG = 1009  # RFC 6455 7.4.1: a message too big to process
CLOSE_PROTOCOL = 1002
CLOSE_ABNORMAL = 1006  # never sent: what the app is told when the connection ended without a close frame


class WebSocket:
    """One WebSocket connection (module docstring)."""

    __slots__ = ("accepted", "c", "closed", "handshake", "heard_at", "parts", "pinged_at", "req", "size", "trailing",
                 "ws")

    def __init__(self, connection: Connection, conn: h11.Connection, req: h11.Request) -> None:
        self.c = connection
        self.req: h11.Request | None = req
        self.trailing = bytes(conn.trailing_data[0])
        self.handshake: WSConnection | None = WSConnection(ConnectionType.SERVER)
        self.ws: WsFrames | None = None  # the frames, once accepted (the handshake and its h11 are dropped)
        self.accepted = False
        self.closed = False
        self.parts: list[Any] = []  # the fragments of the message being received
        self.size = 0
        self.heard_at = trio.current_time()  # the last time bytes came from the client
        self.pinged_at = math.inf  # when our unanswered Ping left

    async def run(self) -> None:
        c = self.c
        server = c.server
        scope = self._handshake()
        if scope is None:
            await c.refuse(400)
            return
        connected = False

        async def receive() -> dict[str, Any]:
            nonlocal connected
            if not connected:
                connected = True
                return {"type": "websocket.connect"}
            return await self._receive()

        c.send_lock = trio.Lock()
        c.ws = self
        c.arm(self.heard_at + server.settings.ws_ping_interval_s)
        server.stats.websockets_open += 1
        try:
            await server.app(scope, receive, self._send)
        except CLOSED_ERRORS:
            return
        except Exception:  # noqa: BLE001 - as for HTTP: logged, the connection ends
            server.app_failed()
        finally:
            server.stats.websockets_open -= 1
        if not self.accepted:
            await self._reject()
        elif not self.closed:
            await self._out(CloseConnection(code=1000))

    def _handshake(self) -> dict[str, Any] | None:
        """The upgrade request handed to wsproto (which checks it), then dropped; the ASGI scope, or None
        when wsproto does not take it for a WebSocket handshake."""
        req, c = self.req, self.c
        assert req is not None and self.handshake is not None
        self.req = None
        # wsproto does the handshake from the request's bytes: the head h11 parsed, then what came after it.
        head = b"%s %s HTTP/1.1\r\n" % (req.method, req.target) + b"".join(
            b"%s: %s\r\n" % (k, v) for k, v in req.headers.raw_items()) + b"\r\n"
        self.handshake.receive_data(head + self.trailing)
        self.trailing = b""
        first = next(self.handshake.events(), None)
        if not isinstance(first, WsRequest):
            return None
        scope = c.scope_of(req.method, bytes(req.target), list(req.headers), "websocket")
        del scope["method"]
        scope["subprotocols"] = list(first.subprotocols)
        return scope

    def due(self, now: float) -> float:
        """Liveness (module docstring): the sweeper's call on this connection's WebSocket."""
        settings = self.c.server.settings
        if not self.accepted:  # the app is still deciding: it gets the time of a ping and its answer
            until = self.heard_at + settings.ws_ping_interval_s + settings.ws_pong_timeout_s
            if now >= until:
                self.c.expire(Phase.PONG)
                return math.inf
            return until
        if self.pinged_at < math.inf:
            if self.heard_at >= self.pinged_at:
                self.pinged_at = math.inf  # answered
            else:
                until = self.pinged_at + settings.ws_pong_timeout_s
                if now >= until:
                    self.c.expire(Phase.PONG)
                    return math.inf
                return until
        ping_at = self.heard_at + settings.ws_ping_interval_s
        if now < ping_at:
            return ping_at
        self.pinged_at = now
        self.c.server.spawn(self._ping)
        return now + settings.ws_pong_timeout_s

    async def _ping(self) -> None:
        c = self.c
        try:
            if not self.closed and not c.closed and self.ws is not None and self.ws.state is ConnectionState.OPEN:
                await self._out(Ping())
                c.server.stats.websocket_pings += 1
        except CLOSED_ERRORS:
            pass
        except Exception as exc:  # noqa: BLE001 - a bug ends this connection only
            c.server.connection_failed(c, exc)
            c.scope.cancel()

    async def _receive(self) -> dict[str, Any]:
        c = self.c
        ws = self.ws
        if ws is None:
            raise RuntimeError("ASGI: websocket receive before accept")
        limit = c.server.settings.ws_max_message_bytes
        while True:
            for event in ws.events():
                if isinstance(event, Message):
                    self.size += len(event.data)
                    if self.size > limit:
                        await self._out(CloseConnection(code=CLOSE_TOO_BIG))
                        return {"type": "websocket.disconnect", "code": CLOSE_TOO_BIG}
                    self.parts.append(event.data)
                    if event.message_finished:
                        parts, self.parts, self.size = self.parts, [], 0
                        if isinstance(event, TextMessage):
                            return {"type": "websocket.receive", "text": "".join(parts)}
                        return {"type": "websocket.receive", "bytes": b"".join(bytes(p) for p in parts)}
                elif isinstance(event, Ping):
                    await self._out(event.response())
                elif isinstance(event, CloseConnection):
                    if not self.closed:
                        await self._out(event.response())
                    return {"type": "websocket.disconnect", "code": event.code}
            if self.closed:
                return {"type": "websocket.disconnect", "code": CLOSE_ABNORMAL}
            try:
                data = await c.read()
            except CLOSED_ERRORS:
                data = b""
            if not data:
                self.closed = True
                return {"type": "websocket.disconnect", "code": CLOSE_ABNORMAL}
            self.heard_at = trio.current_time()
            try:
                ws.receive_data(data)
            except WsProtocolError:
                self.closed = True
                return {"type": "websocket.disconnect", "code": CLOSE_PROTOCOL}

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "websocket.accept":
            if not self.accepted and self.handshake is not None:
                headers = list(message.get("headers", []))
                event = AcceptConnection(subprotocol=message.get("subprotocol"), extra_headers=headers)
                async with self._lock():
                    data = self.handshake.send(event)
                    self.ws, self.handshake = self.handshake.connection, None
                    self.accepted = True
                    self.heard_at = trio.current_time()
                    await self.c.send(data)
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
        """A close before accept is an HTTP 403 (ASGI)."""
        if not self.closed and self.handshake is not None:
            self.closed = True
            async with self._lock():
                await self.c.send(self.handshake.send(RejectConnection(status_code=403,
                                                                       headers=[(b"content-length", b"0")])))

    async def _out(self, event: Event) -> None:
        if isinstance(event, CloseConnection):
            if self.closed:
                return
            self.closed = True
        async with self._lock():
            assert self.ws is not None
            await self.c.send(self.ws.send(event))

    def _lock(self) -> trio.Lock:
        assert self.c.send_lock is not None
        return self.c.send_lock
