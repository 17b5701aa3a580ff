"""Issue 13 item 2: a stepped wall clock must not cut links, expire routes or fire custody deadlines.

Two RelayServices over real SQLite stores, linked in memory, run their own timer tasks (`run()`)
under trio's MockClock. Each has a monotonic clock (trio's virtual time) and an injected wall clock
that the test steps by +1 h and -1 h mid-run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import trio
import trio.testing

from inri.core.config import EngineConfig
from inri.core.trace import NullTracer
from inri.node.service import RelayService
from inri.node.store import Store
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key

WALL0 = 1_800_000_000.0  # unix time at virtual time 0


class Wall:
    """An injectable wall clock: trio's virtual time plus a base the test can step."""

    def __init__(self) -> None:
        self.base = WALL0

    def __call__(self) -> float:
        return self.base + trio.current_time()


class MemoryLink:
    """A NetworkSink that hands frames to the other service from a task (no re-entrant calls)."""

    def __init__(self, me: str) -> None:
        self.me = me
        self.send_ch, self.recv_ch = trio.open_memory_channel[tuple[str, bytes]](10_000)
        self.peers: dict[str, RelayService] = {}

    def send(self, peer: str, frame: bytes, delay: float) -> None:
        self.send_ch.send_nowait((peer, frame))

    def connect(self, peer: str, addr: str) -> None:
        pass  # the test links the two services itself

    def disconnect(self, peer: str, reason: str) -> None:
        pass  # the engine forgot the link; a cut shows in active_peers()

    async def deliver(self) -> None:
        async for peer, frame in self.recv_ch:
            other = self.peers.get(peer)
            if other is not None:
                other.receive_frame(self.me, frame)


# The push's custody lasts its TTL (a native push: custody_max_ttl_s, 300 s here), beyond custody_deadline_s
# (60 s): the deadline on disk is the TTL's, across the restart below (rule C3).
CONFIG = replace(EngineConfig().test_profile(), custody_deadline_s=60.0, custody_max_ttl_s=300.0)


def make_service(name: str, store: Store, net: MemoryLink, clock: Callable[[], float],
                 wall: Callable[[], float]) -> RelayService:
    return RelayService(name * 32, CONFIG, store, net, NullTracer(),
                        clock=clock, wall_clock=wall)


async def _scenario(tmp: Path) -> None:
    wall = Wall()
    a_id, b_id = "a" * 32, "b" * 32
    net_a, net_b = MemoryLink(a_id), MemoryLink(b_id)
    a = make_service("a", Store(tmp / "a.sqlite3"), net_a, trio.current_time, wall)
    b_store = Store(tmp / "b.sqlite3")
    b = make_service("b", b_store, net_b, trio.current_time, wall)
    net_a.peers[b_id], net_b.peers[a_id] = b, a
    async with trio.open_nursery() as nursery:
        nursery.start_soon(net_a.deliver)
        nursery.start_soon(net_b.deliver)
        await nursery.start(a.run)
        await nursery.start(b.run)
        a.peer_up(b_id, outbound=True, addr="b")
        b.peer_up(a_id, outbound=False, addr="a")
        # A device homed at A for 30 minutes: B learns its route by gossip.
        device = make_registration(new_signing_key(b"\x01" * 32), 1, int(wall()), 1800)
        a.register_device(device, 4)
        # A push at B for a device no relay homes: custody until its 300 s TTL (custody_max_ttl_s).
        nowhere = make_registration(new_signing_key(b"\x02" * 32), 1, int(wall()), 3600)
        pushed = b.inject_push(nowhere, b"t" * 16, b"c" * 32)
        assert pushed.push_id is not None
        await trio.sleep(5.0)
        assert b.engine.has_route(device.route_id)
        assert b.active_peers() == [a_id] and a.active_peers() == [b_id]

        for step in (3600.0, -7200.0):  # +1 h, then back to 1 h behind the start
            wall.base += step
            await trio.sleep(40.0)  # more than a keepalive timeout and a route sweep
            assert b.active_peers() == [a_id] and a.active_peers() == [b_id], f"link cut after {step:+} s"
            assert b.engine.has_route(device.route_id), f"route expired after a {step:+} s step"
            assert b.engine.stats()["custody"] == 1, f"custody deadline fired after a {step:+} s step"
            status = b.push_status(pushed.push_id)
            assert status is not None and status["status"] == "pending"
        wall.base += 3600.0  # back on time: 85 s of the 300 s deadline gone

        # A restart of B (kill: its tasks stop; a new monotonic clock starts at 0): the custody
        # deadline stored on disk still ends the push at 300 s after it was accepted, not earlier.
        nursery.cancel_scope.cancel()
    restarted_at = trio.current_time()
    b2_clock = lambda: trio.current_time() - restarted_at  # noqa: E731 - a fresh monotonic clock
    b2 = make_service("b", b_store, MemoryLink(b_id), b2_clock, wall)
    async with trio.open_nursery() as nursery:
        await nursery.start(b2.run)
        assert b2.engine.stats()["custody"] == 1
        await trio.sleep(300.0 - restarted_at - 2.0)  # 2 s before the deadline
        status = b2.push_status(pushed.push_id)
        assert status is not None and status["status"] == "pending", "custody deadline fired early after restart"
        await trio.sleep(4.0)
        status = b2.push_status(pushed.push_id)
        assert status is not None and status["status"] == "unreachable"
        nursery.cancel_scope.cancel()


def test_wall_clock_steps_cut_no_link_expire_no_route_fire_no_deadline(tmp_path: Path) -> None:
    trio.run(_scenario, tmp_path, clock=trio.testing.MockClock(autojump_threshold=0))
