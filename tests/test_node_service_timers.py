"""The relay service's timer loop on trio's MockClock (issue 13 item 6).

Three RelayServices (entry E, middle M, home H) on an in-memory network, each with its real SQLite
store, driven by `RelayService.run()`. Both clocks the service takes (`clock=`, the engine's
monotonic now, and `wall_clock=`, unix time for registrations and the store) are trio's clock plus
the wall time at the start, so registrations signed with real timestamps stay valid while
`MockClock(autojump_threshold=0)` jumps over every idle stretch: custody retries, parking, the
300 s custody deadline and the settled statuses, asserted to the virtual second, whatever the load of
the machine (a timer read from a real clock instead would never fire: `fail_after` fails the test).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace
from pathlib import Path

import trio
import trio.testing

from inri.core.api import InjectOutcome
from inri.core.config import EngineConfig
from inri.core.trace import NullTracer
from inri.node.service import RelayService
from inri.node.store import Store
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import Registration


class MemNet:
    """Links between in-process services: frames go through one queue, delivered by one task."""

    def __init__(self) -> None:
        self.nodes: dict[str, RelayService] = {}
        self.links: set[frozenset[str]] = set()
        self.tx, self.rx = trio.open_memory_channel[tuple[str, str, str, bytes]](math.inf)

    def sink(self, me: str) -> _Sink:
        return _Sink(self, me)

    def link(self, a: str, b: str) -> None:
        """Open a link a -> b (a dialled) and tell both services."""
        self.links.add(frozenset((a, b)))
        self.nodes[a].peer_up(b, outbound=True, addr=b)
        self.nodes[b].peer_up(a, outbound=False, addr=a)

    def crash(self, node: str) -> None:
        """The node vanishes: its links carry nothing more (its neighbours notice by keepalive)."""
        del self.nodes[node]

    async def pump(self) -> None:
        async for kind, src, dst, frame in self.rx:
            svc = self.nodes.get(dst)
            if svc is None or frozenset((src, dst)) not in self.links:
                continue
            if kind == "frame":
                svc.receive_frame(src, frame)
            elif kind == "down":
                self.links.discard(frozenset((src, dst)))
                svc.peer_down(src, "link_closed")


class _Sink:
    def __init__(self, net: MemNet, me: str) -> None:
        self.net, self.me = net, me

    def send(self, peer: str, frame: bytes, delay: float) -> None:
        self.net.tx.send_nowait(("frame", self.me, peer, frame))

    def connect(self, peer: str, addr: str) -> None:
        pass  # this test wires the links itself

    def disconnect(self, peer: str, reason: str) -> None:
        self.net.tx.send_nowait(("down", self.me, peer, b""))


async def test_custody_retries_parking_deadline_and_statuses_run_on_a_mock_clock(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    t0 = float(int(time.time()))

    def clock() -> float:
        return trio.current_time() + t0

    # keepalive 0.5 s x 6, custody retry 1 s; a native push's custody lasts custody_max_ttl_s: 300 s here
    cfg = replace(EngineConfig().test_profile(), custody_max_ttl_s=300.0)
    net = MemNet()
    stores = {name: Store(tmp_path / f"{name}.sqlite3") for name in "EMH"}

    async def start(name: str, nursery: trio.Nursery) -> RelayService:
        svc = RelayService(name, cfg, stores[name], net.sink(name), NullTracer(), rng=random.Random(7),
                           clock=clock, wall_clock=clock)
        net.nodes[name] = svc
        await nursery.start(svc.run)
        return svc

    def push(svc: RelayService, reg: Registration, token: bytes, text: bytes) -> bytes:
        result = svc.inject_push(reg, token, text)
        assert result.outcome == InjectOutcome.ACCEPTED and result.push_id is not None
        return result.push_id

    async def settled(svc: RelayService, pid: bytes) -> tuple[str, float]:
        while (st := svc.push_status(pid)) is None or st["status"] == "pending":
            await trio.sleep(0.5)
        return str(st["status"]), float(st["settled_at"]) - float(st["accepted_at"])

    try:
        with trio.fail_after(900):  # virtual seconds: a timer that never fires fails, not hangs
            async with trio.open_nursery() as n:
                n.start_soon(net.pump)
                entry, _, home = [await start(name, n) for name in "EMH"]
                net.link("E", "M")
                net.link("M", "H")
                key = new_signing_key(b"\x21" * 32)
                reg = make_registration(key, 1, int(clock()), 3 * 3600)
                _, tokens = home.register_device(reg, 5)
                while entry.engine.route_count() < 1:
                    await trio.sleep(0.1)
                # 1. Delivered at once.
                assert await settled(entry, push(entry, reg, tokens[0], b"one")) == ("delivered", 0.0)
                # 2. The home crashes: the push stays in custody (retries, then parked), the home comes back
                #    after 100 s with the same store and re-gossips its device; a parked retry delivers it.
                net.crash("H")
                pid2 = push(entry, reg, tokens[1], b"two")
                await trio.sleep(100)
                assert entry.push_status(pid2)["status"] == "pending"  # type: ignore[index]
                assert entry.engine.stats()["custody"] == 1
                home = await start("H", n)
                net.link("M", "H")
                status, took = await settled(entry, pid2)
                assert status == "delivered" and 100 <= took < 120, (status, took)
                assert [p for p, _, _ in stores["H"].pending(reg.route_id)].count(pid2) == 1
                # 3. The home crashes for good: custody holds the push until the 300 s deadline: expired.
                net.crash("H")
                pid3 = push(entry, reg, tokens[2], b"three")
                status, took = await settled(entry, pid3)
                assert status == "expired" and 300 <= took < 302, (status, took)
                # 4. A registration no relay has a route for: unreachable at the deadline.
                stray = make_registration(new_signing_key(b"\x22" * 32), 1, int(clock()), 3 * 3600)
                status, took = await settled(entry, push(entry, stray, b"\x01" * 16, b"four"))
                assert status == "unreachable" and 300 <= took < 302, (status, took)
                n.cancel_scope.cancel()
    finally:
        for s in stores.values():
            s.close()
    assert trio.current_time() > 700  # virtual seconds covered
