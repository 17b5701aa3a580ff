"""An ASGI app, and a relay's HTTP/WebSocket API, served in this process by the HTTP front (inri/common/front)
on 127.0.0.1, port 0 read back."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from inri.common.front import ASGIApp, FrontSettings, HttpServer, listening_socket
from inri.node.api import create_app
from inri.node.config import RelayConfig
from inri.node.service import RelayService
from inri.node.store import Store
from inri.node.tracefile import TraceFile


class NullNetwork:
    """A relay with no neighbours."""

    def send(self, peer: str, frame: bytes, delay: float) -> None:
        pass

    def connect(self, peer: str, addr: str) -> None:
        pass

    def disconnect(self, peer: str, reason: str) -> None:
        pass


@asynccontextmanager
async def relay_api(tmp: Path, cfg: RelayConfig | None = None, *, group_commit: bool = False) -> AsyncIterator[str]:
    """A relay service with no mesh and its API; yields the API's URL. group_commit: the store commits
    once per scheduling round (Store.run), as in the daemon."""
    async with relay_service(tmp, cfg, group_commit=group_commit) as (url, _):
        yield url


@asynccontextmanager
async def relay_service(tmp: Path, cfg: RelayConfig | None = None, *,
                        group_commit: bool = False) -> AsyncIterator[tuple[str, RelayService]]:
    """relay_api, yielding the service too (its store, its wake hooks: their task runs as in the daemon)."""
    async with relay_front(tmp, cfg, group_commit=group_commit) as (url, service, _):
        yield url, service


@asynccontextmanager
async def relay_front(tmp: Path, cfg: RelayConfig | None = None, *,
                      group_commit: bool = False) -> AsyncIterator[tuple[str, RelayService, HttpServer]]:
    """relay_service, yielding the HTTP front serving it too."""
    cfg = cfg or RelayConfig()
    tmp.mkdir(parents=True, exist_ok=True)
    store = Store(tmp / "relay.sqlite3")
    service = RelayService("a" * 32, cfg.engine.test_profile(), store, NullNetwork(),
                           TraceFile(tmp / "traces", "a" * 32), wake=cfg.wake)
    try:
        async with trio.open_nursery() as n:
            if group_commit:
                await n.start(store.run)
            await n.start(service.run)
            await n.start(service.wake.run)
            app = create_app(service, config=cfg)
            await n.start(app.agents.run)
            await n.start(app.mozpush.run)
            server = HttpServer(app, cfg.api, stats=app.front)
            async with serving(app, server=server) as url:
                try:
                    yield url, service, server
                finally:
                    n.cancel_scope.cancel()
    finally:
        store.close()  # after Store.run's last commit


@asynccontextmanager
async def serving(app: ASGIApp, settings: FrontSettings | None = None, *,
                  server: HttpServer | None = None) -> AsyncIterator[str]:
    """app served by the HTTP front (or by server, built for it) on 127.0.0.1, a free port; yields its URL."""
    server = server or HttpServer(app, settings or FrontSettings(), stats=getattr(app, "front", None))
    sock = listening_socket("127.0.0.1:0")
    stop = trio.Event()
    try:
        async with trio.open_nursery() as n:
            urls = await n.start(functools.partial(server.run, [sock], shutdown_trigger=stop.wait))
            try:
                yield urls[0]
            finally:
                stop.set()
                n.cancel_scope.cancel()
    finally:
        sock.close()
