"""`inri relay`: one relay process — identity, store, QUIC mesh, HTTP/WebSocket API, bootstrap client.

Task tree (trio, structured): the link manager (QUIC endpoint and its links), the relay service (the
engine's timer loop), the HTTP API (hypercorn's trio worker), the bootstrap loop, and the signal
watcher. SIGINT/SIGTERM stop the HTTP listener first (in-flight requests finish within the grace
period), then everything else; a push is answered 202 only after its SQLite commit, so nothing
accepted is lost by stopping — or by being killed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import structlog
import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve as hyper_serve

from inri.node.api import create_app
from inri.node.bootstrap_client import BootstrapClient, BootstrapError, load_seed_list, make_record
from inri.node.config import RelayConfig
from inri.node.identity import NodeIdentity
from inri.node.links import LinkManager
from inri.node.quic import QuicEndpoint, format_addr, parse_addr
from inri.node.service import RelayService
from inri.node.store import Store
from inri.node.tracefile import TraceFile

log = structlog.get_logger("inri.relay")

READY_FILE = "relay.json"  # written into the data dir once the relay listens: its URLs, for scripts


def _api_url(host: str, port: int) -> str:
    return f"http://{format_addr(host, port)}"


async def _serve_api(app: Any, cfg: RelayConfig, shutdown: trio.Event, task_status: Any) -> None:
    hc = HyperConfig()
    host, port = parse_addr(cfg.relay.api)
    hc.bind = [format_addr(host, port)]
    hc.graceful_timeout = cfg.relay.shutdown_grace_s
    hc.accesslog = None
    hc.errorlog = None
    hc.keep_alive_timeout = 30
    hc.include_server_header = False
    # hypercorn 0.18 can end its whole server on one malformed connection (bytes after a final
    # request: BusyResourceError, upstream issues #203/#225). The API is served again at once, the
    # relay (links, custody, store) never goes down with it.
    bound: list[str] = []

    class _Started:  # records the address bound (port 0: the one relay.json reports)
        def started(self, binds: Any = None) -> None:
            bound.extend(binds or [])
            task_status.started(binds)

    status: Any = _Started()
    while True:
        try:
            await hyper_serve(app, hc, shutdown_trigger=shutdown.wait, task_status=status)
            return
        except Exception as exc:  # noqa: BLE001 - see above
            if shutdown.is_set():
                return
            log.error("HTTP server failed; serving again", error=repr(exc)[:300])
            status = trio.TASK_STATUS_IGNORED
            if port == 0 and bound:  # serve again where clients already connect, not on a new port
                hc.bind = [bound[0].removeprefix("http://")]
            await trio.sleep(0.05)


class _BootstrapLoop:
    """Announce this relay to the bootstrap nodes and ask them for candidate neighbours."""

    def __init__(self, cfg: RelayConfig, identity: NodeIdentity, service: RelayService, quic_addr: str) -> None:
        urls = list(cfg.relay.bootstrap) or load_seed_list()
        self.client = BootstrapClient(urls)
        self.cfg = cfg
        self.identity = identity
        self.service = service
        self.quic_addr = quic_addr
        self.announced_to: str | None = None

    async def run(self) -> None:
        cfg = self.cfg.relay
        next_announce = 0.0
        while True:
            now = time.time()
            if now >= next_announce:
                # Sequence numbers must grow across restarts: milliseconds of wall time do.
                record = make_record(self.identity, [self.quic_addr], cfg.geo or None, cfg.capacity,
                                     int(now * 1000), int(now))
                try:
                    self.announced_to = await self.client.announce(record)
                    next_announce = now + cfg.announce_interval_s
                    log.info("announced", bootstrap=self.announced_to)
                except BootstrapError as exc:
                    next_announce = now + min(30.0, cfg.announce_interval_s)
                    log.warning("announce failed", error=str(exc))
                except Exception:  # noqa: BLE001 - bootstraps are optional helpers: never fatal to the relay
                    next_announce = now + min(30.0, cfg.announce_interval_s)
                    log.exception("announce failed")
            if len(self.service.active_peers()) < self.cfg.engine.active_max:
                try:
                    peers = await self.client.fetch_peers(self.identity.node_id, cfg.geo or None, 16)
                    if peers:
                        self.service.add_candidates(peers)
                except BootstrapError as exc:
                    log.warning("peer list failed", error=str(exc))
                except Exception:  # noqa: BLE001 - as above
                    log.exception("peer list failed")
                # Ask again soon while the mesh is forming, slowly once it has formed.
                await trio.sleep(min(cfg.peers_interval_s, 2.0 if not self.service.active_peers() else 10.0))
            else:
                await trio.sleep(cfg.peers_interval_s)


async def run_relay(cfg: RelayConfig, *, shutdown: trio.Event | None = None) -> None:
    """Run one relay until SIGINT/SIGTERM (or `shutdown` is set)."""
    data = cfg.data_path
    data.mkdir(parents=True, exist_ok=True)
    identity = NodeIdentity.load_or_create(data / "node.key")
    store = Store(data / "relay.sqlite3", synchronous=cfg.store.synchronous)
    shutdown = shutdown or trio.Event()
    qhost, qport = parse_addr(cfg.relay.quic)
    endpoint = QuicEndpoint(identity, idle_timeout_s=cfg.quic.idle_timeout_s, listen_addr=cfg.relay.public_addr)
    await endpoint.bind(qhost, qport)
    if parse_addr(endpoint.listen_addr)[0] in ("0.0.0.0", "::"):
        log.warning("announcing an unspecified address: bootstraps will refuse it; set relay.public_addr "
                    "(--public-addr) to the address peers can reach", quic=endpoint.listen_addr)
    links = LinkManager(endpoint, connect_timeout_s=cfg.engine.connect_timeout_s,
                        send_queue_max_bytes=cfg.quic.send_queue_max_bytes)
    tracer = TraceFile(data / "traces", identity.node_id, level=cfg.trace.level, salt=cfg.trace.salt or None,
                       max_bytes=cfg.trace.max_bytes, keep=cfg.trace.keep)
    service = RelayService(identity.node_id, cfg.engine, store, links, tracer, listen_addr=endpoint.listen_addr,
                           rng=random.Random(), mailbox_max=cfg.api.mailbox_max)
    links.events = service
    app = create_app(service, config=cfg, neighbours=links.neighbours)
    log.info("relay starting", node_id=identity.node_id, quic=endpoint.listen_addr, api=cfg.relay.api,
             data_dir=str(data))
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(links.run)
            await nursery.start(service.run)
            binds = await nursery.start(_serve_api, app, cfg, shutdown)
            api_url = binds[0] if binds else _api_url(*parse_addr(cfg.relay.api))
            boot = _BootstrapLoop(cfg, identity, service, endpoint.listen_addr)
            nursery.start_soon(boot.run)
            _write_ready(data, {"node_id": identity.node_id, "api": api_url, "quic": endpoint.listen_addr,
                                "pid": os.getpid()})
            log.info("relay ready", node_id=identity.node_id, api=api_url, quic=endpoint.listen_addr)
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async with trio.open_nursery() as watch:
                    watch.start_soon(_first_signal, signals, shutdown)
                    await shutdown.wait()
                    watch.cancel_scope.cancel()
            log.info("relay stopping")
            # hypercorn finishes in-flight requests (graceful_timeout), then we stop the rest.
            with trio.move_on_after(cfg.relay.shutdown_grace_s + 1):
                while _api_running(nursery):
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
    finally:
        store.close()
        tracer.close()
        (data / READY_FILE).unlink(missing_ok=True)
        log.info("relay stopped", node_id=identity.node_id)


def _api_running(nursery: trio.Nursery) -> bool:
    return any("_serve_api" in t.name for t in nursery.child_tasks)


async def _first_signal(signals: Any, shutdown: trio.Event) -> None:
    async for signum in signals:
        log.info("signal", signal=signal.Signals(signum).name)
        shutdown.set()
        return


def _write_ready(data: Path, info: dict[str, Any]) -> None:
    tmp = data / (READY_FILE + ".tmp")
    tmp.write_text(json.dumps(info))
    os.replace(tmp, data / READY_FILE)
