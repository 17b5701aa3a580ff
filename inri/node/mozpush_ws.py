"""The Mozilla Push WebSocket endpoint: drives one `mozpush.Session` per connection over ASGI.

The relay's API dispatches a `websocket` scope at MOZPUSH_PATH (and at `/` when the client asks for the
`push-notification` subprotocol: Sunup users may type only the host) to `MozPushServer.serve`. The
connection's own task (the one the HTTP front runs for it) reads the client's messages, feeds the
session and writes its replies; nothing else runs per idle connection (the state it keeps is a slotted
`_Conn` and the session: benchmarks/bench_mozpush.py measures the memory). Deliveries wake it from
outside: the service calls `delivered(route_id)` once a message is committed at home, and a short-lived
task in this server's nursery writes the connection's new notifications, then ends. Every write has a
deadline (WRITE_TIMEOUT_S): a client that does not read is closed, never waited on. Deliveries for an
agent with no connection are its wake hook's business (inri/node/agents.py wires the agents into the
relay's wake hooks); the end of an agent's connection is reported to `Agents.disconnected`.

Liveness: WebSocket pings and pongs are the HTTP front's (it answers a client's ping; the front of
issue 41 pings a silent client after `[api] ws_ping_interval_s`). Here a connection silent for
`[mozpush] idle_timeout_s` (longer than Firefox's 30-minute ping interval) is closed (TIMEOUT) by one
sweep per server, and a hello that does not come within `hello_timeout_s` ends the connection.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, assert_never

import structlog
import trio

from inri.common.http import Receive, Scope, Send
from inri.node.agents import Agents
from inri.node.mozpush import (
    SUBPROTOCOL,
    ChannelAdded,
    ChannelRemoved,
    Close,
    CloseCode,
    Identified,
    Limits,
    Output,
    Session,
    SessionState,
    Wake,
)
from inri.node.mozpush import Send as SendText
from inri.node.ratelimit import RateLimiter, client_key

log = structlog.get_logger("inri.mozpush")

MOZPUSH_PATH = "/v1/mozpush"  # dom.push.serverURL = wss://relay.example/v1/mozpush (docs/browsers.md)
WRITE_TIMEOUT_S = 10.0  # a write to a client that does not read ends its connection after this long


class _Conn:
    """One connection: its session, how to write to it, and how to end it from outside."""

    __slots__ = ("session", "send", "scope", "close_code", "flushing", "dirty", "routes", "last_heard")

    def __init__(self, session: Session, send: Send, now: float) -> None:
        self.session = session
        self.send = send
        self.scope = trio.CancelScope()  # cancelled to end the connection (replaced, idle, unwritable)
        self.close_code: CloseCode | None = None  # the code to close with once the scope is cancelled
        self.flushing = False  # a notification task is running for it
        self.dirty = False  # deliveries arrived while it ran: it polls again
        self.routes: list[bytes] = []  # route ids of its agent's channels (wake-ups)
        self.last_heard = now

    def end(self, code: CloseCode | None) -> None:
        if self.close_code is None:
            self.close_code = code
        self.scope.cancel()


class MozPushServer:
    """Every Mozilla Push connection of this relay (see the module docstring)."""

    def __init__(self, agents: Agents, limits: Limits, *, idle_timeout_s: float = 3900.0,
                 connect_rate: RateLimiter | None = None, clock: Callable[[], float] = trio.current_time) -> None:
        self.agents = agents
        self.limits = limits
        self.idle_timeout_s = idle_timeout_s
        self.connect_rate = connect_rate
        self.clock = clock
        self.by_uaid: dict[bytes, _Conn] = {}
        self.by_route: dict[bytes, _Conn] = {}
        self.open = 0
        self.counts: dict[str, int] = {}  # inri_mozpush_* counters (with the agents')
        self._nursery: trio.Nursery | None = None
        agents.connected = self.by_uaid.__contains__

    def _count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1

    # -- the server's own tasks -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Hold the nursery notification tasks run in, and close idle connections, until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                while True:
                    await trio.sleep(max(1.0, self.idle_timeout_s / 8))
                    now = self.clock()
                    for conn in list(self.by_uaid.values()):
                        if now - conn.last_heard > self.idle_timeout_s:
                            conn.end(CloseCode.TIMEOUT)
            finally:
                self._nursery = None

    def delivered(self, route_id: bytes) -> None:
        """A message for route_id is committed at home (RelayService.delivery_hooks): wake its connection."""
        conn = self.by_route.get(route_id)
        if conn is not None:
            self._wake(conn)

    def connected_route(self, route_id: bytes) -> bool:
        """True while the agent whose channel route_id is has a live connection (a TTL 0 push is kept then)."""
        return route_id in self.by_route

    def _wake(self, conn: _Conn) -> None:
        conn.dirty = True
        if not conn.flushing and self._nursery is not None:
            conn.flushing = True
            self._nursery.start_soon(self._flush, conn)

    async def _flush(self, conn: _Conn) -> None:
        """Write the connection's new notifications (MP4) until none are left, then end."""
        try:
            while conn.dirty and conn.close_code is None:
                conn.dirty = False
                for text in conn.session.poll():
                    if not await self._write(conn, {"type": "websocket.send", "text": text}):
                        return
                    self._count("notifications_sent")
        finally:
            conn.flushing = False

    async def _write(self, conn: _Conn, message: dict[str, Any]) -> bool:
        """One write under its deadline; False (and the connection ended) when it failed or stalled."""
        try:
            with trio.move_on_after(WRITE_TIMEOUT_S) as timer:
                await conn.send(message)
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            conn.end(None)
            return False
        if timer.cancelled_caught:
            self._count("write_timeouts")
            conn.end(None)
            return False
        return True

    # -- one connection ---------------------------------------------------------------------------

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI websocket application of one connection."""
        first = await receive()
        if first["type"] != "websocket.connect":
            return
        if self.connect_rate is not None and self.connect_rate.take(client_key(scope)):
            await send({"type": "websocket.close", "code": CloseCode.PING_TOO_OFTEN})  # before accept: 403
            self._count("refused_rate")
            return
        if self._nursery is None:  # run() is not running (a relay always starts it): nothing could be delivered
            await send({"type": "websocket.close", "code": CloseCode.INTERNAL})
            return
        offered = scope.get("subprotocols") or []
        await send({"type": "websocket.accept", "subprotocol": SUBPROTOCOL if SUBPROTOCOL in offered else None})
        now = self.clock()
        conn = _Conn(Session(self.agents, self.limits, now, client_key(scope)), send, now)
        self.open += 1
        self._count("connections")
        try:
            with conn.scope:
                await self._read(conn, receive)
            if conn.close_code is not None:  # ended from outside (replaced, idle) or by the session
                with trio.CancelScope(shield=True), trio.move_on_after(WRITE_TIMEOUT_S):
                    try:
                        await send({"type": "websocket.close", "code": int(conn.close_code)})
                    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
                        pass
                self._count(f"closed_{int(conn.close_code)}")
        finally:
            self.open -= 1
            conn.close_code = conn.close_code or CloseCode.GOING_AWAY  # stops a notification task
            uaid = conn.session.uaid
            if self._unbind(conn) and uaid is not None:
                try:  # its idle time starts; mail it left unacknowledged wakes it through its hook
                    self.agents.disconnected(uaid)
                except Exception:  # a failed store write must not break the connection's end
                    log.exception("agent's disconnection not recorded")

    async def _read(self, conn: _Conn, receive: Receive) -> None:
        session = conn.session
        while True:
            if session.state == SessionState.AWAITING_HELLO:
                deadline = session.hello_deadline
                with trio.move_on_at(deadline) as timer:
                    msg = await receive()
                if timer.cancelled_caught:
                    await self._carry(conn, session.timed_out())
                    return
            else:
                msg = await receive()
            kind = msg["type"]
            if kind == "websocket.disconnect":
                return
            if kind != "websocket.receive":
                continue
            conn.last_heard = now = self.clock()
            text = msg.get("text")
            outputs = session.receive_text(text, now) if text is not None else session.receive_bytes()
            if not await self._carry(conn, outputs):
                return

    async def _carry(self, conn: _Conn, outputs: list[Output]) -> bool:
        """Carry out a session's outputs in order; False once the connection is to end."""
        for out in outputs:
            match out:
                case SendText():
                    if not await self._write(conn, {"type": "websocket.send", "text": out.text}):
                        return False
                case Close():
                    conn.close_code = out.code
                    log.info("mozpush connection closed", code=int(out.code), reason=out.reason)
                    return False
                case Identified():
                    self._bind(conn, out.uaid, out.route_ids)
                case ChannelAdded():
                    conn.routes.append(out.route_id)
                    self.by_route[out.route_id] = conn
                case ChannelRemoved():
                    if out.route_id in conn.routes:
                        conn.routes.remove(out.route_id)
                    if self.by_route.get(out.route_id) is conn:
                        del self.by_route[out.route_id]
                case Wake():
                    self._wake(conn)
                case _:
                    assert_never(out)
        return True

    def _bind(self, conn: _Conn, uaid: bytes, routes: tuple[bytes, ...]) -> None:
        """MP1: one live connection per uaid; a newer one replaces the older (closed with REPLACED)."""
        old = self.by_uaid.get(uaid)
        if old is not None and old is not conn:
            self._unbind(old)
            old.end(CloseCode.REPLACED)
        self.by_uaid[uaid] = conn
        conn.routes = list(routes)
        for rid in routes:
            self.by_route[rid] = conn

    def _unbind(self, conn: _Conn) -> bool:
        """conn no longer serves its uaid; False when it did not (no hello, or replaced already)."""
        uaid = conn.session.uaid
        if uaid is None or self.by_uaid.get(uaid) is not conn:
            return False
        del self.by_uaid[uaid]
        for rid in conn.routes:
            if self.by_route.get(rid) is conn:
                del self.by_route[rid]
        return True

    def status(self) -> dict[str, Any]:
        return {"connections": self.open, **self.agents.status()}
