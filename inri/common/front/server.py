"""The HTTP front's server: listeners, connection caps, overload shedding, the deadline sweeper, shutdown.

One `HttpServer` serves an ASGI app (HTTP and `websocket` scopes) on any number of listening sockets,
plain or TLS (`TlsContext`), for the relay and the bootstrap alike. What each connection does is in
connection.py and websocket.py; here:

- caps: at most `connections_max` connections at once, and `connections_per_client_max` per client
  address (IPv4, IPv6 /64: inri.common.addr.rate_key). A trusted proxy's connections count against the
  client each request names (proxies.py), not against the proxy. Past a cap the *new* connection is
  answered `503 too_many_connections` with `Retry-After` and closed (at most SHED_TASKS_MAX such answers
  in flight, each within SHED_S; beyond, it is closed at once): the connections already served keep
  going.
- listener failures: an error from accept() other than a lack of descriptors or memory (which pauses
  accepting for ACCEPT_PAUSE_S) is logged at error level, counted (`restarts`) and the listener accepts
  again after a backoff (RESTART_MIN_S doubling to RESTART_MAX_S, back to the minimum after
  RESTART_STABLE_S of service). Connections are never affected: they live in their own nursery.
- shutdown: listeners close, idle connections close, requests in flight get `graceful_s`.
"""

from __future__ import annotations

import errno
import functools
import json
import resource
import socket
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import structlog
import trio

from inri.common.addr import format_addr, parse_addr, rate_key
from inri.common.front.connection import Connection, FastExchange
from inri.common.front.deadlines import Sweeper
from inri.common.front.proxies import TrustedProxies
from inri.common.front.settings import FrontSettings
from inri.common.front.stats import FrontStats, ShedReason
from inri.common.front.tls import TlsContext
from inri.common.front.wire import CLOSED_ERRORS, RECEIVE_BYTES, Wire, wire_for
from inri.common.http import Problem, Receive, Scope, Send, problem_body

__all__ = ["ASGIApp", "HttpServer", "listening_socket", "raise_fd_limit"]

ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
FastPost = Callable[[bytes, tuple[str, int] | None, bytes, FastExchange], Awaitable[bool]]

SHED_TASKS_MAX = 256
SHED_S = 1.0  # a shed connection's TLS handshake, 503 and the read of what the client had sent
SHED_RETRY_AFTER_S = 5
ACCEPT_PAUSE_S = 0.1  # out of descriptors or memory: accept again after this (trio.serve_listeners does too)
RESTART_MIN_S = 0.05
RESTART_MAX_S = 2.0
RESTART_STABLE_S = 10.0
LISTEN_BACKLOG = 1024
FD_MARGIN = 512  # descriptors beside the connections: the store, QUIC, logs, outgoing requests
_CAPACITY_ERRNOS = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS))

log = structlog.get_logger("inri.http")


def _shed_answer() -> bytes:
    problem = Problem(503, "too_many_connections", "this server has as many connections as it serves (in all, or "
                      "from this address); retry later", retry_after=SHED_RETRY_AFTER_S)
    body = json.dumps(problem_body(problem, "/", {"too_many_connections": "Too many connections"}),
                      separators=(",", ":")).encode()
    return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\ncontent-length: %d\r\n"
            b"retry-after: %d\r\nconnection: close\r\n\r\n%s" % (len(body), SHED_RETRY_AFTER_S, body))


class HttpServer:
    """An ASGI app served over HTTP/1.1 and WebSocket with the front's deadlines and caps."""

    def __init__(self, app: ASGIApp, settings: FrontSettings, *, stats: FrontStats | None = None,
                 tls: TlsContext | None = None, graceful_s: float = 5.0) -> None:
        self.app = app
        # An app may serve hot POST targets from the parsed body without an ASGI scope (RelayApi.fast_post:
        # `await fast_post(target, client, body, exchange) -> bool`, False: not one of its targets; the
        # exchange has `send`, ASGI's, and `answer_json(status, body, after=None)`).
        self.fast_post: FastPost | None = getattr(app, "fast_post", None)
        self.settings = settings
        self.proxies = TrustedProxies(settings.trusted_proxies, settings.client_ip_header)
        self.stats = stats if stats is not None else FrontStats()
        self.tls = tls
        self.graceful_s = graceful_s
        self.sweeper = Sweeper()
        self.connections: set[Connection] = set()
        self.per_client: dict[str, int] = {}
        self.shedding = 0
        self.closing = False
        self.nursery: trio.Nursery | None = None  # the connections' nursery (helper tasks start there too)
        self.shed_answer = _shed_answer()

    # -- serving ---------------------------------------------------------------------------------

    async def run(self, sockets: Sequence[socket.socket], *, shutdown_trigger: Callable[[], Awaitable[Any]],
                  task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve on the listening sockets until shutdown_trigger returns; task_status gets their URLs.

        The sockets stay the caller's (each is served through a duplicate). With no sockets, connections
        come only through accept() (tests on memory streams)."""
        listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(sock.dup())) for sock in sockets]
        scheme = "https" if self.tls is not None else "http"
        urls = [f"{scheme}://{format_addr(*sock.getsockname()[:2])}" for sock in sockets]
        async with trio.open_nursery() as outer:
            outer.start_soon(self.sweeper.run)
            async with trio.open_nursery() as conns:
                self.nursery = conns
                async with trio.open_nursery() as accepting:
                    for listener in listeners:
                        accepting.start_soon(self._accept_loop, listener)
                    task_status.started(urls)
                    await shutdown_trigger()
                    accepting.cancel_scope.cancel()
                for listener in listeners:
                    await listener.aclose()
                self.closing = True
                for connection in list(self.connections):
                    if connection.idle and not connection.pending and not connection.rest:
                        connection.scope.cancel()  # (one with answers still to write closes once they are out)
                conns.cancel_scope.deadline = trio.current_time() + self.graceful_s
            outer.cancel_scope.cancel()

    async def _accept_loop(self, listener: trio.SocketListener) -> None:
        delay = RESTART_MIN_S
        while True:
            started = trio.current_time()
            try:
                while True:
                    self.accept(await listener.accept())
            except trio.ClosedResourceError:
                return  # closed at shutdown
            except OSError as exc:
                if exc.errno not in _CAPACITY_ERRNOS:
                    delay = await self._listener_failed(exc, started, delay)
                    continue
                log.warning("out of descriptors or memory: accepting paused", error=exc.strerror,
                            pause_s=ACCEPT_PAUSE_S, connections=len(self.connections))
                await trio.sleep(ACCEPT_PAUSE_S)
            except Exception as exc:  # noqa: BLE001 - a failed listener accepts again (module docstring)
                delay = await self._listener_failed(exc, started, delay)

    async def _listener_failed(self, exc: Exception, started: float, delay: float) -> float:
        if trio.current_time() - started > RESTART_STABLE_S:
            delay = RESTART_MIN_S
        self.stats.restarts += 1
        log.error("HTTP listener failed; accepting again", error=repr(exc)[:300], retry_in_s=delay, exc_info=exc)
        await trio.sleep(delay)
        return min(RESTART_MAX_S, delay * 2)

    def accept(self, stream: trio.abc.Stream, peer: tuple[str, int] | None = None,
               local: tuple[str, int] | None = None) -> None:
        """Serve a new connection (or shed it, past a cap). peer/local: the addresses of a stream that has
        no socket (memory streams); a socket stream's are read from it."""
        assert self.nursery is not None, "accept() before run() started"
        if isinstance(stream, trio.SocketStream):
            try:
                peer = _addr(stream.socket.getpeername())
                local = _addr(stream.socket.getsockname())
            except OSError:  # gone before we looked at it
                stream.socket.close()
                return
        if peer is None:
            peer = ("unknown", 0)
        trusted = bool(self.proxies) and self.proxies.trusts(peer[0])
        key = None if trusted else rate_key(peer[0])
        settings = self.settings
        if len(self.connections) >= settings.connections_max:
            self._shed(stream, ShedReason.CONNECTIONS)
            return
        if key is not None and self.per_client.get(key, 0) >= settings.connections_per_client_max:
            self._shed(stream, ShedReason.CLIENT)
            return
        wire: Wire
        if self.tls is not None:
            stream = trio.SSLStream(stream, self.tls.context, server_side=True, https_compatible=True)
            wire = Wire(stream)
        else:
            wire = wire_for(stream)
        connection = Connection(self, stream, wire, peer, local, key, trusted=trusted, tls=self.tls is not None)
        self.connections.add(connection)
        if key is not None:
            self.per_client[key] = self.per_client.get(key, 0) + 1
        self.stats.accepted += 1
        self.stats.open = len(self.connections)
        self.nursery.start_soon(connection.run)

    def forget(self, connection: Connection) -> None:
        """connection has ended."""
        self.connections.discard(connection)
        self.stats.open = len(self.connections)
        if connection.client_key is not None:
            self._release(connection.client_key)
            connection.client_key = None

    def _release(self, key: str) -> None:
        left = self.per_client.get(key, 0) - 1
        if left > 0:
            self.per_client[key] = left
        else:
            self.per_client.pop(key, None)

    def resolve_client(self, connection: Connection, headers: Sequence[tuple[bytes, bytes]]) -> bool:
        """A trusted proxy's request: the client it names becomes the connection's, counted against that
        client's cap; False when the client has as many connections as it may (answer 503)."""
        peer = connection.peer
        host = self.proxies.client(peer[0], headers)
        connection.client = peer if host == peer[0] else (host, 0)
        key = rate_key(host)
        if key == connection.client_key:
            return True
        if connection.client_key is not None:
            self._release(connection.client_key)
            connection.client_key = None
        if self.per_client.get(key, 0) >= self.settings.connections_per_client_max:
            counts = self.stats.shed
            counts[ShedReason.CLIENT] = counts.get(ShedReason.CLIENT, 0) + 1
            return False
        self.per_client[key] = self.per_client.get(key, 0) + 1
        connection.client_key = key
        return True

    def spawn(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run fn as a task beside the connections (it must not raise)."""
        assert self.nursery is not None
        self.nursery.start_soon(fn)

    def connection_failed(self, connection: Connection, exc: BaseException) -> None:
        """A connection ended on an error of ours (a bug): logged with its traceback, counted."""
        self.stats.errors += 1
        log.error("HTTP connection failed", client=format_addr(*connection.peer), exc_info=exc)

    def app_failed(self) -> None:
        """The app raised: logged with its traceback (the request got a 500, or its connection closed)."""
        log.error("request failed in the application", exc_info=True)

    # -- shedding --------------------------------------------------------------------------------

    def _shed(self, stream: trio.abc.Stream, reason: ShedReason) -> None:
        counts = self.stats.shed
        counts[reason] = counts.get(reason, 0) + 1
        if self.shedding < SHED_TASKS_MAX:
            self.shedding += 1
            self.spawn(functools.partial(self._answer_shed, stream))
        elif isinstance(stream, trio.SocketStream):
            stream.socket.close()
        else:
            self.spawn(functools.partial(trio.aclose_forcefully, stream))

    async def _answer_shed(self, stream: trio.abc.Stream) -> None:
        """503 with Retry-After, a half-close, then what the client had sent read and dropped (so that the
        close does not send a reset that would destroy the answer), all within SHED_S."""
        try:
            with trio.move_on_after(SHED_S):
                if self.tls is not None:
                    stream = trio.SSLStream(stream, self.tls.context, server_side=True, https_compatible=True)
                    await stream.do_handshake()
                await stream.send_all(self.shed_answer)
                if isinstance(stream, trio.abc.HalfCloseableStream):
                    await stream.send_eof()
                dropped = 0
                while dropped < RECEIVE_BYTES:
                    data = await stream.receive_some(RECEIVE_BYTES)
                    if not data:
                        break
                    dropped += len(data)
        except CLOSED_ERRORS:
            pass
        except Exception:  # a bug here must not end the server (logged)
            self.stats.errors += 1
            log.error("answering a shed connection failed", exc_info=True)
        finally:
            self.shedding -= 1
            await trio.aclose_forcefully(stream)


def _addr(sockaddr: Any) -> tuple[str, int] | None:
    return (str(sockaddr[0]), int(sockaddr[1])) if isinstance(sockaddr, tuple) else None


def listening_socket(addr: str) -> socket.socket:
    """A TCP socket listening on addr ("host:port", "[v6]:port"; port 0: any free port); OSError if not."""
    host, port = parse_addr(addr)
    family, type_, proto, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                           flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, type_, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by accepted connections
        sock.bind(sockaddr)
        sock.listen(LISTEN_BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's descriptor limit (the soft one, up to the hard one) to wanted + FD_MARGIN, so
    that connections_max connections can be served; returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted += FD_MARGIN
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft if soft != resource.RLIM_INFINITY else wanted
    new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if new > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        return new
    return soft
