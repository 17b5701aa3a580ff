"""The entry relay's backpressure (issue 16 item 1): what it allows follows what the path drains."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace

from inri.core.api import CustodyStatus
from inri.core.config import EngineConfig
from inri.core.trace import NullTracer
from inri.node.identity import NodeIdentity
from inri.node.links import LinkManager
from inri.node.quic import QuicEndpoint
from inri.node.service import Backpressure, RelayService
from inri.node.store import Store


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@asynccontextmanager
async def relay_service(tmp_path: Path, clock: Clock, backpressure: Backpressure) -> AsyncIterator[RelayService]:
    """A relay service on a loopback QUIC endpoint, its engine on the test profile, its time `clock`."""
    ident = NodeIdentity.generate()
    ep = QuicEndpoint(ident, idle_timeout_s=5.0)
    await ep.bind("127.0.0.1", 0)
    store = Store(tmp_path / "relay.sqlite3")
    try:
        yield RelayService(ident.node_id, EngineConfig().test_profile(), store, LinkManager(ep), NullTracer(),
                           listen_addr=ep.listen_addr, rng=random.Random(1), clock=clock, backpressure=backpressure)
    finally:
        store.close()


async def test_a_burst_after_an_idle_spell_is_not_refused_while_its_path_drains(tmp_path: Path) -> None:
    """An app quiet for a minute sends a burst; receipts come back as fast as it pushes. The relay must
    not answer 429 for want of a measurement: within a fraction of a second it trusts the drain it sees
    (before: the first whole second of the burst was refused beyond `custody_backlog_min`)."""
    clock = Clock()
    async with relay_service(tmp_path, clock, Backpressure(custody_backlog_s=2.0, custody_backlog_min=100)) as service:
        route = bytes(16)
        clock.t += 60.0  # idle: nothing drained for a minute
        assert service.overloaded(route) is None
        refused = 0
        # 1,000 pushes/s for 0.8 s, each settled 0.15 s after it was accepted (150 in flight: more
        # than custody_backlog_min, far less than 2 s of the drain).
        for ms in range(800):
            clock.t += 0.001
            if ms >= 150:
                service._unhold((ms - 150).to_bytes(16, "big"), CustodyStatus.DELIVERED)
            if service.overloaded(route) is not None:
                refused += 1
                continue
            service._hold(SimpleNamespace(push_id=ms.to_bytes(16, "big"), route_id=route))  # type: ignore[arg-type]
        # The first 0.2 s of the burst are a sample; after that the drain measured so far counts.
        assert refused <= 150, f"{refused} of 800 pushes refused while the path drained 1,000/s"
        assert service.custody_allowed() >= 1000
        # ...and once the path stops draining, the allowance falls back to the minimum.
        for _ in range(15):
            clock.t += 1.0
            service.custody_allowed()
        assert service.custody_allowed() == 100


async def test_pushes_kept_for_a_home_that_is_down_do_not_refuse_new_ones(tmp_path: Path) -> None:
    """Custody lasts a push's TTL (days; rule C3): pushes held past custody_deadline_s wait for a home that is
    down and are not the path's backlog. Counted, `custody_backlog_min` of them would answer 429 to every
    push until their TTL ran out; the limit per device (`custody_route_max`) still counts them all."""
    clock = Clock()
    cfg = EngineConfig().test_profile()
    async with relay_service(tmp_path, clock, Backpressure(custody_backlog_min=100, custody_route_max=150)) as service:
        down, other = bytes(16), b"\x01" * 16
        for k in range(120):  # a device whose home is down: its pushes stay in custody
            service._hold(SimpleNamespace(push_id=k.to_bytes(16, "big"), route_id=down))  # type: ignore[arg-type]
        assert service.overloaded(other) is not None  # 120 just accepted: over the backlog of 100
        clock.t += cfg.custody_deadline_s + 1.0  # still held (their TTL is days), now parked
        assert service.overloaded(other) is None
        for k in range(120, 150):
            service._hold(SimpleNamespace(push_id=k.to_bytes(16, "big"), route_id=down))  # type: ignore[arg-type]
        assert service.overloaded(down) is not None  # custody_route_max counts every push held for it
        assert service.overloaded(other) is None
