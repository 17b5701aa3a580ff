"""`inri relay`: one relay process — identity, store, QUIC mesh, HTTP/WebSocket API, bootstrap client.

Task tree (trio, structured): the link manager (QUIC endpoint and its links), the relay service (the
engine's timer loop), the store's group commit, the HTTP API (inri/common/front), the bootstrap
loop, and the signal watcher. SIGINT/SIGTERM stop the HTTP listener first (in-flight requests finish within the grace
period), then everything else; a push is answered 202 only after its SQLite commit, so nothing
accepted is lost by stopping — or by being killed.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import random
import signal
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog
import trio

from inri.common.addr import format_addr, parse_addr
from inri.common.front import HttpServer, TlsContext, TlsError, listening_socket, raise_fd_limit
from inri.common.http import MetricsApp
from inri.common.identity import NodeIdentity
from inri.node import routesnap
from inri.node.api import TITLES, create_app
from inri.node.bootstrap_client import NO_ANSWER, Backoff, BootstrapClient, BootstrapError, load_seed_list, make_record
from inri.node.config import RelayConfig, public_addrs
from inri.node.datadir import open_data_dir
from inri.node.links import LinkManager
from inri.node.quic import LinkImpairment, QuicEndpoint
from inri.node.reachability import ANNOUNCE_TIMEOUT_S, AnnounceOutcome, Reachability
from inri.node.reload import run_hooks
from inri.node.service import Backpressure, RelayService
from inri.node.tracefile import TraceFile

log = structlog.get_logger("inri.relay")

READY_FILE = "relay.json"  # written into the data dir once the relay listens: its URLs, for scripts


class StartupError(Exception):
    """The relay could not start; the message is one line for the operator (the process exits 1)."""


def _api_url(host: str, port: int, tls: bool = False) -> str:
    return f"{'https' if tls else 'http'}://{format_addr(host, port)}"


def bind_api(addr: str, what: str = "the HTTP API") -> socket.socket:
    """The API's (or what's) listening socket, bound once for the relay's life; StartupError naming addr if
    taken."""
    try:
        return listening_socket(addr)
    except OSError as exc:
        raise StartupError(f"cannot listen for {what} on {format_addr(*parse_addr(addr))}: "
                           f"{exc.strerror or exc}") from None


def _tls_reloader(tls: TlsContext) -> Callable[[], None]:
    """A SIGHUP hook (inri/node/reload.py): the API's certificate and key read again; new connections get
    them, open ones keep theirs; a file that does not load leaves the running certificate in use."""

    def reload_tls_certificate() -> None:
        tls.reload()
        log.info("TLS certificate reloaded", cert=tls.cert_file)

    return reload_tls_certificate


async def _serve_api(server: HttpServer, listener: socket.socket, shutdown: trio.Event,
                     task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    """The API on its listening socket until shutdown (inri.common.front: plain or TLS, with its deadlines
    and caps; a failed listener accepts again there, counted in inri_http_restarts_total)."""
    await server.run([listener], shutdown_trigger=shutdown.wait, task_status=task_status)


PEERS_ASKED = 16  # candidates asked of a bootstrap per request
PEERS_FIRST_RETRY_S = 2.0  # a relay below its active view asks again this soon, then backs off to peers_interval_s


class _BootstrapLoop:
    """Announce this relay to the bootstrap nodes and ask them for candidate neighbours.

    While the relay has fewer neighbours than `active_max` it asks for peers after 2 s, 4 s, 8 s ...
    (jittered) up to `peers_interval_s`, and starts again from 2 s whenever its number of neighbours
    changed (one gained: the mesh is forming; one lost: a gap to fill): quick then, quiet when the
    bootstrap has nobody new to offer (an isolated relay used to ask every 2 s forever).
    """

    def __init__(self, cfg: RelayConfig, identity: NodeIdentity, service: RelayService, quic_addr: str) -> None:
        urls = list(cfg.relay.bootstrap) or load_seed_list()
        self.client = BootstrapClient(urls, announce_timeout_s=ANNOUNCE_TIMEOUT_S)
        self.cfg = cfg
        self.identity = identity
        self.service = service
        # Every configured public address (IPv4 and IPv6), else the one the QUIC endpoint listens on.
        self.addrs = public_addrs(cfg.relay.public_addr) or [quic_addr]
        self.impostors_logged: set[str] = set()
        self.announced_to: str | None = None
        self.peers_backoff = Backoff(PEERS_FIRST_RETRY_S, max(cfg.relay.peers_interval_s, PEERS_FIRST_RETRY_S))

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2.0):
                await self.client.aclose()

    async def _run(self) -> None:
        cfg = self.cfg.relay
        next_announce = 0.0
        neighbours = 0
        while True:
            now = time.time()
            if now >= next_announce:
                # Sequence numbers must grow across restarts: milliseconds of wall time do.
                record = make_record(self.identity, self.addrs, cfg.geo or None, cfg.capacity,
                                     int(now * 1000), int(now))
                try:
                    self.announced_to = await self.client.announce(record)
                    next_announce = now + cfg.announce_interval_s
                    self.service.reachability.announced(AnnounceOutcome.LISTED)
                    log.info("announced", bootstrap=self.announced_to, addrs=self.addrs)
                except BootstrapError as exc:
                    next_announce = now + min(30.0, cfg.announce_interval_s)
                    self._refused(exc)
                except Exception:  # bootstraps are optional helpers: never fatal to the relay
                    next_announce = now + min(30.0, cfg.announce_interval_s)
                    log.exception("announce failed")
            active = len(self.service.active_peers())
            self.service.reachability.neighbours(active, self.service.clock())
            if active != neighbours:
                self.peers_backoff.reset()  # the mesh moved around us: ask again soon
            neighbours = active
            if active < self.cfg.engine.active_max:
                try:
                    peers = await self.client.fetch_peers(self.identity.node_id, cfg.geo or None, PEERS_ASKED,
                                                          own_addrs=tuple(self.addrs))
                    self._log_impostors()
                    if peers:
                        # The first answer lists its ceil(count/2) nearest first (bootstrap_nodes/ranking.py):
                        # rule M5 dials those first and keeps one far link among the rest.
                        self.service.add_candidates(peers, near=min(len(peers), (PEERS_ASKED + 1) // 2))
                except BootstrapError as exc:
                    log.warning("peer list failed", error=str(exc))
                except Exception:  # as above
                    log.exception("peer list failed")
                await trio.sleep(self.peers_backoff.next())
            else:
                await trio.sleep(cfg.peers_interval_s)


    def _refused(self, exc: BootstrapError) -> None:
        """Tell the operator what a failed announcement means (reachability.py), in one log line."""
        reach = self.service.reachability
        if exc.code == "unreachable":
            reach.announced(AnnounceOutcome.UNREACHABLE, exc.detail)
            log.error(f"unreachable from the bootstrap: open UDP {reach.port_hint()}", addr=reach.unreachable_addr,
                      detail=exc.detail, hint="port forwarding, firewall, public_addr (docs/operations.md, Network)")
        elif exc.code == "duplicate_identity":
            reach.announced(AnnounceOutcome.DUPLICATE, exc.detail)
            log.error("another relay runs with this relay's identity (node.key): stop one of them", detail=exc.detail)
        elif exc.code == NO_ANSWER:
            reach.announced(AnnounceOutcome.NO_BOOTSTRAP, exc.detail)
            log.warning("announce failed: no bootstrap answered", detail=exc.detail)
        else:
            reach.announced(AnnounceOutcome.REFUSED, f"{exc.code}: {exc.detail}")
            log.warning("announce refused", code=exc.code, detail=exc.detail)

    def _log_impostors(self) -> None:
        new = self.client.impostors - self.impostors_logged
        if new:
            self.impostors_logged |= new
            log.error("a bootstrap lists this relay's identity at another address: two relays share one node key "
                      "(a copied data directory?); stop one and give it a new data directory", addrs=sorted(new))


# The relay daemon's garbage collector (tune_gc; the `inri relay` command sets it, not a library user).
# Every push allocates objects that outlive a few hundred allocations (its custody, rate-limit
# buckets, receipts waiting for a batch): at CPython's default (700, 10, 10) the young generation is
# collected every ~100 pushes and each collection walks them all. With a larger first threshold most
# of them are gone before it runs. Measured (instructions per push through the HTTP front, engine and
# store, callgrind, 2026-11-26): -1.8%. The push path makes no reference cycles (checked with
# gc.DEBUG_SAVEALL), so memory held by cyclic garbage does not grow with the larger thresholds.
GC_THRESHOLDS = (20_000, 50, 50)


def tune_gc() -> None:
    """Set the daemon's garbage collector thresholds (GC_THRESHOLDS)."""
    gc.set_threshold(*GC_THRESHOLDS)


async def run_relay(cfg: RelayConfig, *, shutdown: trio.Event | None = None,
                    on_sighup: Sequence[Callable[[], None]] = ()) -> None:
    """Run one relay until SIGINT/SIGTERM (or `shutdown` is set); SIGHUP runs `on_sighup` (inri/node/reload.py)."""
    data = cfg.data_path
    opened = open_data_dir(data, cfg.store.synchronous)  # lock, key, store (migrated): datadir.py
    identity, store = opened.identity, opened.store
    listeners: list[socket.socket] = []
    try:  # a taken port is a clear error before anything starts
        listener = bind_api(cfg.relay.api)
        listeners.append(listener)
        metrics_listener = bind_api(cfg.metrics.listen, "metrics") if cfg.metrics.listen else None
    except BaseException:
        for sock in listeners:
            sock.close()
        opened.close()
        raise
    if metrics_listener is not None:
        listeners.append(metrics_listener)
    try:  # HTTPS on the API's listener, served by the front; SIGHUP reads the files again (TlsContext.reload)
        tls = TlsContext(cfg.api.tls_cert, cfg.api.tls_key) if cfg.api.tls_cert else None
    except TlsError as exc:
        for sock in listeners:
            sock.close()
        opened.close()
        raise StartupError(str(exc)) from None
    if tls is not None:
        on_sighup = [*on_sighup, _tls_reloader(tls)]
    fds = raise_fd_limit(cfg.api.connections_max)
    if fds < cfg.api.connections_max:
        log.warning("the descriptor limit is below api.connections_max: accepting pauses when it is reached "
                    "(raise LimitNOFILE / ulimit -n)", limit=fds, connections_max=cfg.api.connections_max)
    shutdown = shutdown or trio.Event()
    ready = False
    stop_anchors: list[tuple[str, str]] = []
    try:
        qhost, qport = parse_addr(cfg.relay.quic)
        q = cfg.quic
        impairment = LinkImpairment(q.link_delay_ms / 1000, q.link_jitter_ms / 1000, q.link_loss)
        if impairment.active:
            log.warning("lab link impairment on: every QUIC datagram is delayed or dropped", delay_ms=q.link_delay_ms,
                        jitter_ms=q.link_jitter_ms, loss=q.link_loss)
        announced = public_addrs(cfg.relay.public_addr)  # IPv4 first: what peers dial
        endpoint = QuicEndpoint(identity, idle_timeout_s=q.idle_timeout_s,
                                listen_addr=announced[0] if announced else "",
                                impairment=impairment, regref=q.registration_refs)
        try:
            await endpoint.bind(qhost, qport)
        except OSError as exc:
            where = format_addr(qhost, qport)
            raise StartupError(f"cannot listen for QUIC on {where}: {exc.strerror or exc}") from None
        if parse_addr(endpoint.listen_addr)[0] in ("0.0.0.0", "::"):
            log.warning("announcing an unspecified address: bootstraps will refuse it; set relay.public_addr "
                        "(--public-addr) to the address peers can reach", quic=endpoint.listen_addr)
        links = LinkManager(endpoint, connect_timeout_s=cfg.engine.connect_timeout_s,
                            send_queue_max_bytes=cfg.quic.send_queue_max_bytes,
                            push_rate_per_s=cfg.quic.link_push_rate_per_s)
        tracer = TraceFile(data / "traces", identity.node_id, level=cfg.trace.level, salt=cfg.trace.salt or None,
                           max_bytes=cfg.trace.max_bytes, keep=cfg.trace.keep)
        reach = Reachability(cfg.relay.isolated_degraded_s, time.monotonic())  # the service's clock
        service = RelayService(identity.node_id, cfg.engine, store, links, tracer, listen_addr=endpoint.listen_addr,
                               reachability=reach,
                               rng=random.Random(), mailbox_max=cfg.api.mailbox_max,
                               backpressure=Backpressure(cfg.api.custody_backlog_s, cfg.api.custody_backlog_min,
                                                         cfg.api.custody_route_max),
                               wake=cfg.wake)
        links.events = service
        if not cfg.webpush.public_origins:  # Web Push answers on the API's real address (port 0 resolved)
            bound = listener.getsockname()
            cfg = dataclasses.replace(cfg, webpush=dataclasses.replace(
                cfg.webpush, public_origins=(_api_url(bound[0], bound[1], bool(cfg.api.tls_cert)),)))
        app = create_app(service, config=cfg, neighbours=links.neighbours)
        server = HttpServer(app, cfg.api, stats=app.front, tls=tls, graceful_s=cfg.relay.shutdown_grace_s)
        # [metrics] listen: the same front (deadlines, caps, counts), plain HTTP, serving /metrics only
        metrics_server = HttpServer(MetricsApp(app.registry, app.http_codes, TITLES), cfg.api, stats=app.front,
                                    graceful_s=cfg.relay.shutdown_grace_s)
        log.info("relay starting", node_id=identity.node_id, quic=endpoint.listen_addr, api=cfg.relay.api,
                 data_dir=str(data))
        snapshot_s = cfg.relay.route_snapshot_s
        if snapshot_s > 0:  # learned routes from before a restart (routesnap.py), before any link is up
            rows, anchors = routesnap.load(data)
            restored = service.restore_routes(rows)
            redial = service.restore_anchors(anchors)  # former neighbours: dialled first (rule M6)
            if restored or redial:
                log.info("routes restored", routes=restored, neighbours=redial)
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(store.run)  # group commit (store.py): before anything writes
                await nursery.start(links.run)
                await nursery.start(service.run)
                await nursery.start(service.wake.run)  # wake hooks: devices with no live stream (wake.py)
                await nursery.start(app.agents.run)  # Mozilla Push channels: re-signed as they fall due
                await nursery.start(app.mozpush.run)
                if snapshot_s > 0:
                    nursery.start_soon(_route_snapshots, service, data, snapshot_s)
                binds = await nursery.start(_serve_api, server, listener, shutdown)
                api_url = binds[0] if binds else _api_url(*parse_addr(cfg.relay.api), bool(cfg.api.tls_cert))
                ready_info: dict[str, Any] = {"node_id": identity.node_id, "api": api_url, "quic": endpoint.listen_addr,
                              "pid": os.getpid()}
                if metrics_listener is not None:
                    ready_info["metrics"] = (await nursery.start(_serve_api, metrics_server, metrics_listener,
                                                                 shutdown))[0]
                boot = _BootstrapLoop(cfg, identity, service, endpoint.listen_addr)
                nursery.start_soon(boot.run)
                _write_ready(data, ready_info)
                ready = True
                log.info("relay ready", node_id=identity.node_id, api=api_url, quic=endpoint.listen_addr,
                         metrics=f"{ready_info.get('metrics', api_url)}/metrics")
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
                    async with trio.open_nursery() as watch:
                        watch.start_soon(_first_signal, signals, shutdown, on_sighup)
                        await shutdown.wait()
                        watch.cancel_scope.cancel()
                log.info("relay stopping")
                stop_anchors = service.export_anchors()  # before the links close (routesnap.py)
                # The API finishes requests in flight (shutdown_grace_s), then we stop the rest.
                with trio.move_on_after(cfg.relay.shutdown_grace_s + 1):
                    while _api_running(nursery):
                        await trio.sleep(0.05)
                # Close the links (QUIC CONNECTION_CLOSE) and give the datagrams a moment to leave:
                # neighbours learn at once that this relay stopped, not after their keepalives time out.
                await endpoint.aclose()
                await trio.sleep(0.1)
                nursery.cancel_scope.cancel()
        finally:
            if ready and snapshot_s > 0:
                try:
                    routesnap.save_now(data, service.export_routes(), stop_anchors or service.export_anchors())
                except OSError as exc:
                    log.warning("route snapshot not written", error=str(exc))
            tracer.close()
            (data / READY_FILE).unlink(missing_ok=True)
            log.info("relay stopped", node_id=identity.node_id)
    except Exception as exc:
        if ready or isinstance(exc, StartupError):
            raise
        leaf = _first_leaf(exc)
        raise StartupError(f"relay failed before it was ready (API {cfg.relay.api}, QUIC {cfg.relay.quic}): "
                           f"{type(leaf).__name__}: {leaf}") from exc
    finally:
        opened.close()
        for sock in listeners:
            sock.close()


async def _route_snapshots(service: RelayService, data: Path, interval_s: float) -> None:
    """Write the learned routes every interval_s (routesnap.py); a failed write is logged, never fatal."""
    while True:
        await trio.sleep(interval_s)
        await snapshot_routes(service, data)


async def snapshot_routes(service: RelayService, data: Path) -> int:
    """Write one route snapshot, serving the relay's other tasks between chunks of the read-out (1M
    routes take 2-4 s to read: held in one piece, every push, keepalive and request waited that long).
    A failed write is logged, never fatal. Returns the rows written (-1: not written)."""
    rows: list[routesnap.Row] = []
    for chunk in service.export_route_chunks():
        rows += chunk
        await trio.sleep(0)
    try:
        await routesnap.save(data, rows, service.export_anchors())
    except OSError as exc:
        log.warning("route snapshot not written", error=str(exc))
        return -1
    return len(rows)


def _first_leaf(exc: BaseException) -> BaseException:
    """The first exception inside (nested) exception groups: what actually went wrong."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _api_running(nursery: trio.Nursery) -> bool:
    return any("_serve_api" in t.name for t in nursery.child_tasks)


async def _first_signal(signals: Any, shutdown: trio.Event, on_sighup: Sequence[Callable[[], None]]) -> None:
    """SIGINT/SIGTERM: stop. SIGHUP: run the reload hooks and go on (never exits)."""
    async for signum in signals:
        log.info("signal", signal=signal.Signals(signum).name)
        if signum == signal.SIGHUP:
            run_hooks(on_sighup)
            continue
        shutdown.set()
        return


def _write_ready(data: Path, info: dict[str, Any]) -> None:
    tmp = data / (READY_FILE + ".tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, data / READY_FILE)
