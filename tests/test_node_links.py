"""The link manager and the relay service over real QUIC links on loopback (in-process, no subprocess)."""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio

from inri.core.config import EngineConfig
from inri.core.sync import SYNC
from inri.core.trace import NullTracer
from inri.node.identity import NodeIdentity
from inri.node.links import LinkManager
from inri.node.quic import Link, LinkClosed, QuicEndpoint
from inri.node.service import RelayService
from inri.node.store import Store
from inri.protocol import limits
from inri.protocol.codec import decode, encode, make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import Hello, Keepalive, PeerInfo, RegGossip, RouteSync

SEND_QUEUE = limits.MAX_FRAME_BYTES + 4  # the smallest bound the config accepts


@asynccontextmanager
async def relay(
    tmp: Path, engine: EngineConfig | None = None, **links_kw: Any
) -> AsyncIterator[tuple[RelayService, LinkManager]]:
    ident = NodeIdentity.generate()
    ep = QuicEndpoint(ident, idle_timeout_s=5.0)
    await ep.bind("127.0.0.1", 0)
    links = LinkManager(ep, **links_kw)
    store = Store(tmp / "relay.sqlite3")
    service = RelayService(ident.node_id, engine or EngineConfig().test_profile(), store, links, NullTracer(),
                           listen_addr=ep.listen_addr, rng=random.Random(1))
    links.events = service
    try:
        async with trio.open_nursery() as n:
            await n.start(links.run)
            await n.start(service.run)
            yield service, links
            n.cancel_scope.cancel()
    finally:
        store.close()


async def _keepalives(link: Link) -> None:
    """Answer nothing, read nothing: only show signs of life (the engine's keepalive frames)."""
    nonce = 0
    while True:
        nonce += 1
        await link.send(encode(Keepalive(nonce, False)))
        await trio.sleep(0.2)


async def test_a_neighbour_that_never_reads_cannot_grow_our_send_queue(tmp_path: Path) -> None:
    """Issue 13 item 7: a peer withholding QUIC flow-control credit while keeping its link alive."""
    hostile = NodeIdentity.generate()
    with trio.fail_after(30):
        async with relay(tmp_path, send_queue_max_bytes=SEND_QUEUE) as (service, links), trio.open_nursery() as n:
            ep = QuicEndpoint(hostile, idle_timeout_s=5.0)
            ep._client_config.max_stream_data = 8192  # a small window...
            ep._client_config.max_data = 16384
            await ep.bind("127.0.0.1", 0)
            await n.start(ep.serve, None)
            link = await ep.connect(links.endpoint.listen_addr, expect_node_id=service.node_id)
            quic = link._conn.quic
            # ...that is never raised again: this peer withholds credit whatever it receives.
            quic._write_connection_limits = lambda *a, **k: None  # type: ignore[method-assign]
            quic._write_stream_limits = lambda *a, **k: None  # type: ignore[method-assign]
            n.start_soon(_keepalives, link)
            while hostile.node_id not in service.listed_peers():  # a neighbour (M7: it spoke on the link)
                await trio.sleep(0.01)
            # A gossip flood: 1,500 devices homed at the relay, each registration gossiped to the peer.
            peak = 0
            started = trio.current_time()
            for i in range(1500):
                reg = make_registration(new_signing_key(i.to_bytes(4, "big") * 8), 1, int(time.time()), 3600)
                service.register_device(reg, 1)
                peak = max(peak, *(int(nb["send_backlog_bytes"]) for nb in links.neighbours()))
                if i % 100 == 0:
                    await trio.sleep(0)  # let the link's task send what the window allows
            await trio.sleep(1.2)  # keepalives keep flowing; the link stays up
            status = service.status()
            dropped = links.stats["frames_dropped_congested"]
            counted = service.counters["frames_dropped_congested"]  # read together: drops go on until the cancel
            elapsed = trio.current_time() - started
            n.cancel_scope.cancel()
    assert peak <= SEND_QUEUE, f"send queue reached {peak} bytes, bound {SEND_QUEUE}"
    assert dropped > 500 and counted == dropped
    # Scored by the engine at most once per keepalive interval (0.5 s here), so one slow moment does
    # not cost the link at once (the bound follows the run's length: a loaded machine runs it longer).
    interval = EngineConfig().test_profile().keepalive_interval_s
    assert 1 <= service.engine.counters["score_congested"] <= 1 + elapsed / interval
    assert status["peer_scores"][hostile.node_id] < 0


async def _wait(cond: Any) -> None:
    while not cond():
        await trio.sleep(0.01)


async def test_gossip_from_a_link_still_pending_is_kept_until_it_is_admitted(tmp_path: Path) -> None:
    """Issue 13 item 17: a full relay holds a new inbound link pending (rule M4); what the peer gossips
    meanwhile reaches the engine once the link is admitted, and /v1/status lists only neighbours both ends
    hold (rule M7: active here, and heard from since the link came up)."""
    cfg = replace(EngineConfig().test_profile(), active_min=1, active_max=1)
    p1, p2 = NodeIdentity.generate(), NodeIdentity.generate()
    reg = make_registration(new_signing_key(b"\x11" * 32), 1, int(time.time()), 3_600)
    with trio.fail_after(20):
        async with relay(tmp_path, cfg) as (service, links), trio.open_nursery() as n:
            eps = []
            for ident in (p1, p2):
                ep = QuicEndpoint(ident, idle_timeout_s=5.0)
                await ep.bind("127.0.0.1", 0)
                await n.start(ep.serve, None)
                eps.append(ep)
            first = await eps[0].connect(links.endpoint.listen_addr, expect_node_id=service.node_id)
            await _wait(lambda: service.active_peers() == [p1.node_id])
            assert links.neighbours() == []  # not heard from yet: it may not hold the link (M7)
            await first.send(encode(Keepalive(1, False)))
            await _wait(lambda: service.listed_peers() == [p1.node_id])
            second = await eps[1].connect(links.endpoint.listen_addr, expect_node_id=service.node_id)
            await _wait(lambda: service.status()["pending_neighbours"] == [p2.node_id])
            assert [nb["node_id"] for nb in links.neighbours()] == [p1.node_id]  # active ones only
            assert [nb["node_id"] for nb in links.pending()] == [p2.node_id]
            # The peer dialled us and counts us as its neighbour: it gossips a registration.
            await second.send(encode(RegGossip(reg, 16, 0)))
            await _wait(lambda: service.counters.get("frames_in_reg_gossip", 0) == 1)
            assert service.engine.route_count() == 0  # not a neighbour yet: held, not handled
            # A bootstrap lists the peer; the first neighbour leaves; the relay wants the pending one.
            service.add_candidates([PeerInfo(p2.node_id, eps[1].listen_addr)])
            await first.aclose("bye")
            await _wait(lambda: service.active_peers() == [p2.node_id])
            await _wait(lambda: service.engine.route_count() == 1)
            assert service.engine.next_hops(reg.route_id)[0][0] == p2.node_id
            assert service.status()["pending_neighbours"] == []
            n.cancel_scope.cancel()


async def test_a_neighbour_that_restarted_replaces_its_dead_link_at_once(tmp_path: Path) -> None:
    """A neighbour killed (-9: no QUIC close reaches us) and started again with the same identity dials
    us while we still hold its old link: the new link replaces the old one at once (the engine sees the
    old go down and the new come up), whichever node id is larger. Before, the duplicate-link rule kept
    the old, dead link when the dialler's id was the larger one, and the restarted relay stayed cut off
    from us until our keepalives timed out."""
    with trio.fail_after(30):
        async with relay(tmp_path, connect_timeout_s=0.5) as (service, links):
            me = service.node_id
            peer = NodeIdentity.generate()
            while peer.node_id < me:  # the case the old rule got wrong
                peer = NodeIdentity.generate()
            async with trio.open_nursery() as crash:  # the first process of the peer
                ep1 = QuicEndpoint(peer, idle_timeout_s=30.0)
                await ep1.bind("127.0.0.1", 0)
                await crash.start(ep1.serve, None)
                old = await ep1.connect(links.endpoint.listen_addr, expect_node_id=me)
                await _wait(lambda: peer.node_id in service.active_peers())
                crash.cancel_scope.cancel()  # gone without a word: its socket just stops answering
            ep1._sock.close()
            await trio.sleep(0.6)  # older than a connect timeout: not a simultaneous dial
            assert peer.node_id in service.active_peers() and not links._links[peer.node_id].closed
            async with trio.open_nursery() as n:  # the restarted process: same identity, new port
                ep2 = QuicEndpoint(peer, idle_timeout_s=30.0)
                await ep2.bind("127.0.0.1", 0)
                await n.start(ep2.serve, None)
                new = await ep2.connect(links.endpoint.listen_addr, expect_node_id=me)
                await _wait(lambda: links.stats["links_replaced"] == 1)
                assert links._links[peer.node_id].remote_addr == ep2.listen_addr
                assert peer.node_id in service.active_peers()
                frame = await new.receive()  # the new link carries our frames (keepalives at least)
                assert frame and not new.closed
                n.cancel_scope.cancel()
            assert old is not new


@pytest.mark.parametrize("peer_id", ["smaller", "larger"])
async def test_a_neighbour_restarted_right_after_linking_is_a_new_link_to_the_engine(tmp_path: Path,
                                                                                     peer_id: str) -> None:
    """Issue 43, rules G11 and G5: a neighbour killed -9 moments after it linked to us (well within a
    connect timeout: a simultaneous dial would look so) starts again and dials us while we hold its old
    link. The engine sees a new link: the routes homed here are announced on it (G5) and the restarted
    relay's route sync is answered (G11). Before, the link manager swapped links silently when the
    peer's node id was the smaller (the engine kept the old link's state: the sync was refused as a
    repeat, nothing announced: the restarted relay lacked those routes until a device refreshed), and
    refused the new link as a duplicate when it was the larger, until our keepalives timed out."""
    with trio.fail_after(30):
        async with relay(tmp_path, connect_timeout_s=60.0) as (service, links), trio.open_nursery() as n:
            me = service.node_id
            peer = NodeIdentity.generate()
            while (peer.node_id < me) != (peer_id == "smaller"):
                peer = NodeIdentity.generate()
            homed = make_registration(new_signing_key(b"\x21" * 32), 1, int(time.time()), 3600)
            service.register_device(homed, 1)
            # Another neighbour gossips a route: one the relay holds through a next hop other than the peer.
            other = QuicEndpoint(NodeIdentity.generate(), idle_timeout_s=30.0)
            await other.bind("127.0.0.1", 0)
            await n.start(other.serve, None)
            via_other = await other.connect(links.endpoint.listen_addr, expect_node_id=me)
            learnt = make_registration(new_signing_key(b"\x22" * 32), 1, int(time.time()), 3600)
            await via_other.send(encode(RegGossip(learnt, 16, 0)))
            await _wait(lambda: service.engine.route_count() == 1)
            ask = encode(Hello(limits.PROTOCOL_VERSION, peer.node_id, "", (SYNC,)))
            async with trio.open_nursery() as crash:  # the peer's first run: it links, asks, is killed
                ep1 = QuicEndpoint(peer, idle_timeout_s=30.0)
                await ep1.bind("127.0.0.1", 0)
                await crash.start(ep1.serve, None)
                old = await ep1.connect(links.endpoint.listen_addr, expect_node_id=me)
                await old.send(ask)
                await _wait(lambda: service.engine.counters.get("route_sync_frames_sent", 0) == 1)
                crash.cancel_scope.cancel()  # gone without a word
            ep1._sock.close()
            async with trio.open_nursery() as again:  # its second run, at once: same identity, new port
                ep2 = QuicEndpoint(peer, idle_timeout_s=30.0)
                await ep2.bind("127.0.0.1", 0)
                await again.start(ep2.serve, None)
                new = await ep2.connect(links.endpoint.listen_addr, expect_node_id=me)
                await new.send(ask)
                await new.send(encode(Keepalive(4343, False)))  # answered after the Hello: frames in order
                got: list[object] = []
                while True:
                    try:
                        msg = decode(await new.receive())
                    except LinkClosed:
                        break  # refused as a duplicate (before the fix, a larger peer id)
                    got.append(msg)
                    if isinstance(msg, Keepalive) and msg.reply and msg.nonce == 4343:
                        break
                again.cancel_scope.cancel()
            n.cancel_scope.cancel()
    announced = [m.registration.route_id for m in got if isinstance(m, RegGossip)]
    synced = [e.route_id for m in got if isinstance(m, RouteSync) for e in m.entries]
    assert announced == [homed.route_id] and synced == [learnt.route_id], got
    assert links.stats["links_replaced"] == 1 and service.engine.counters.get("route_sync_refused_again", 0) == 0
