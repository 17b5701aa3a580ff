"""The sans-IO engine, driven through inri.core.testing.MiniNet (in-memory frames, virtual clock)."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from inri.core.api import Connect, CustodyStatus, Disconnect, DisconnectReason, InjectOutcome, Send, TraceLevel
from inri.core.config import EngineConfig
from inri.core.custody import PARK_BACKOFF_MAX, PARK_FACTOR
from inri.core.engine import Engine
from inri.core.home import MemoryHomeStore
from inri.core.testing import MiniNet
from inri.core.trace import ListTracer, NullTracer
from inri.core.verify import CachingVerifier
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import ErrorFrame, Hello, Keepalive, PeerInfo, Push, RegGossip, Registration

KEY = new_signing_key(b"\x07" * 32)
TOKENS = [bytes([i]) * 16 for i in range(1, 30)]
# 0 - 1 - 2 - 3 - 4 - 5, with a detour 1 - 6 - 7 - 3 (slower) so relays have alternatives
EDGES = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (1, 6), (6, 7), (7, 3)]
SLOW = {(6, 1): 0.05, (1, 6): 0.05, (7, 6): 0.05, (6, 7): 0.05, (3, 7): 0.05, (7, 3): 0.05}


def registered_net(epoch: int = 1, **kw: object) -> tuple[MiniNet, Registration]:
    net = MiniNet(8, EDGES, latency=SLOW, **kw)  # type: ignore[arg-type]
    reg = make_registration(KEY, epoch, 0, 3600)
    net.homes[0].add_registration(reg, TOKENS)
    net.apply("0", net.engines[0].register(reg, 0.0))
    net.run_until(1.0)
    return net, reg


def push(net: MiniNet, at: int, reg: Registration, token: bytes, **kw: object) -> bytes:
    res = net.engines[at].inject_push(reg, token, b"sealed", net.now, **kw)  # type: ignore[arg-type]
    assert res.outcome == InjectOutcome.ACCEPTED and res.push_id is not None
    net.apply(str(at), res.effects)
    return res.push_id


def test_gossip_builds_route_vectors_along_the_fastest_paths() -> None:
    net, reg = registered_net()
    rid = reg.route_id
    assert net.engines[0].next_hops(rid) == []  # home
    assert net.engines[5].next_hops(rid)[0] == ("4", 5)
    assert net.engines[3].next_hops(rid)[0] == ("2", 3)  # via 2 (fast), not via 7
    # 7 hears first from 3 (0-1-2-3-7, 80 ms, distance 4), then from 6 (110 ms, distance 3): 6's own
    # distance 2 is < 4, so 6 is a feasible backup. 3 hears from 7 too late, and 7's distance 4 is not
    # < 3: no backup there.
    assert net.engines[7].next_hops(rid) == [("3", 4), ("6", 3)]
    assert net.engines[3].next_hops(rid) == [("2", 3)]
    rows = net.tracer.of_kind("route_set")
    assert len(rows) == 7 and {r[1] for r in rows} == {str(i) for i in range(1, 8)}
    assert sum(r[9] for r in rows) + net.tracer.of_kind("reg_originated")[0][9] == sum(
        1 for _, _, m in net.sent if isinstance(m, RegGossip))


def test_push_follows_the_vector_and_the_receipt_settles_custody() -> None:
    net, reg = registered_net(wire=True)
    pid = push(net, 5, reg, TOKENS[0])
    net.run_until(3.0)
    assert net.delivered == [("0", pid)]
    assert net.custody[pid] == "delivered"
    path = [r[1] for r in net.tracer.of_kind("push_forwarded") if r[3] == pid.hex()]
    assert path == ["5", "4", "3", "2", "1"]
    assert net.homes[0].mailboxes[reg.route_id][pid][0] == b"sealed"


def test_token_is_spent_once_and_a_resent_push_id_gets_the_same_receipt() -> None:
    net, reg = registered_net()
    pid = push(net, 5, reg, TOKENS[0])
    net.run_until(3.0)
    again = push(net, 4, reg, TOKENS[0], push_id=pid)  # custody restored elsewhere: same push id
    other = push(net, 5, reg, TOKENS[0])  # a different push with the spent token
    net.run_until(6.0)
    assert again == pid
    assert net.custody[pid] == "delivered"
    assert net.custody[other] == "spent"
    assert [d for d in net.delivered if d[1] == pid] == [("0", pid)]
    assert len(net.homes[0].mailboxes[reg.route_id]) == 1


def test_bad_registrations_are_refused_before_anything_is_sent() -> None:
    net, reg = registered_net()
    e = net.engines[5]
    forged = Registration(reg.route_key, reg.epoch + 1, reg.issued_at, reg.lifetime, reg.signature)
    expired = make_registration(KEY, 2, 0, 10)
    for bad, why in ((forged, InjectOutcome.BAD_REGISTRATION), (expired, InjectOutcome.BAD_REGISTRATION)):
        res = e.inject_push(bad, TOKENS[1], b"x", 100.0)
        assert res.outcome == why and res.effects == [] and res.push_id is None
    assert e.inject_push(reg, b"short", b"x", 1.0).outcome == InjectOutcome.TOKEN_MISMATCH
    assert {r[11] for r in net.tracer.of_kind("push_refused")} == {"bad_signature", "stale_registration", "malformed"}


def test_dead_next_hop_is_repaired_locally_through_a_neighbour_with_its_own_route() -> None:
    net, reg = registered_net()
    net.kill(2)  # 3's primary next hop; 3 has no feasible backup, 7 -> 6 -> 1 still reaches home
    pid = push(net, 5, reg, TOKENS[2])
    net.run_until(30.0)
    assert net.delivered == [("0", pid)]
    assert net.custody[pid] == "delivered"
    repair = [r for r in net.tracer.of_kind("push_fallback") if r[3] == pid.hex()]
    assert [r[1] for r in repair] == ["3"]  # relay 3 searched its neighbourhood; 7 carried it on via 6
    path = [r[1] for r in net.tracer.of_kind("push_forwarded") if r[3] == pid.hex()]
    assert path == ["5", "4", "7", "6", "1"]


def test_route_error_reaches_the_custodian_when_no_repair_is_possible() -> None:
    net = MiniNet(4, [(0, 1), (1, 2), (2, 3)])  # a line: no alternative anywhere
    reg = make_registration(KEY, 1, 0, 3600)
    net.homes[0].add_registration(reg, TOKENS)
    net.apply("0", net.engines[0].register(reg, 0.0))
    net.run_until(1.0)
    net.kill(1)  # 2's next hop; 2 was two hops from home (not adjacent) and has no one left to ask
    pid = push(net, 3, reg, TOKENS[0])
    net.run_until(1.5)
    errors = net.tracer.of_kind("route_error")
    assert [(r[1], r[11]) for r in errors] == [("2", "no_route")]
    assert any(r[1] == "3" and r[3] == pid.hex() for r in net.tracer.of_kind("push_retry"))  # retried at once
    assert net.engines[3].next_hops(reg.route_id) == []  # 2 said it cannot reach home: 3 stops using it


def test_a_dead_home_is_reported_and_never_flooded_for_and_routes_survive() -> None:
    net = MiniNet(4, [(0, 1), (1, 2), (2, 3)], config=replace(EngineConfig(), custody_max_ttl_s=300.0))
    reg = make_registration(KEY, 1, 0, 3600)
    net.homes[0].add_registration(reg, TOKENS)
    net.apply("0", net.engines[0].register(reg, 0.0))
    net.run_until(1.0)
    net.kill(0)
    net.run_until(10.0)  # 1 has noticed (keepalive) that the home is gone
    pid = push(net, 3, reg, TOKENS[0])
    net.run_until(200.0)
    assert pid not in net.custody  # still in custody: retried along the route until the deadline
    net.run_until(400.0)
    assert net.custody[pid] == "expired"  # routes existed; the home never answered
    assert {r[11] for r in net.tracer.of_kind("route_error")} == {"home_unreachable"}
    assert not net.tracer.of_kind("push_fallback")  # no ring can reach a relay that is down
    assert net.engines[2].next_hops(reg.route_id) == [("1", 2)]  # the path stays for when home returns
    assert net.engines[3].next_hops(reg.route_id) == [("2", 3)]


def test_a_device_no_relay_has_a_route_to_ends_custody_as_unreachable() -> None:
    net, _ = registered_net(config=replace(EngineConfig(), custody_retry_s=0.5, custody_deadline_s=60.0,
                                           custody_max_ttl_s=60.0))
    stranger = make_registration(new_signing_key(b"\x09" * 32), 1, 0, 3600)  # never registered anywhere
    pid = push(net, 5, stranger, TOKENS[3])
    net.run_until(100.0)
    assert net.delivered == []
    assert net.custody[pid] == "unreachable"
    floods = [r for r in net.tracer.of_kind("push_fallback") if r[1] == "5" and r[3] == pid.hex()]
    # One search per escalation attempt (rings 1, 3, 5, 7, then the full TTL); parked retries never flood.
    assert 0 < len(floods) <= EngineConfig().custody_max_attempts


def test_older_epoch_never_overrides_newer() -> None:
    net, reg2 = registered_net(epoch=2)
    old = make_registration(KEY, 1, 0, 3600)
    e = net.engines[3]
    before = e.next_hops(reg2.route_id)
    assert e.receive_message("7", RegGossip(old, 10, 0), 2.0) == []
    assert e.route_epoch(reg2.route_id) == 2 and e.next_hops(reg2.route_id) == before
    assert net.tracer.of_kind("reg_dropped")[-1][11] == "stale_epoch"
    newer = make_registration(KEY, 3, 0, 3600)
    out = e.receive_message("7", RegGossip(newer, 10, 0), 2.0)
    assert e.route_epoch(reg2.route_id) == 3 and e.next_hops(reg2.route_id) == [("7", 1)]
    assert {s.peer for s in out if isinstance(s, Send)} == {"2", "4"}  # never back to the sender


def lone_engine(cfg: EngineConfig | None = None, level: TraceLevel = TraceLevel.FULL) -> tuple[Engine, ListTracer]:
    tracer = ListTracer(level)
    eng = Engine("me", cfg or EngineConfig(), verifier=CachingVerifier(), home=MemoryHomeStore(), tracer=tracer,
                 rng=random.Random(5))
    return eng, tracer


def test_per_neighbour_flood_budget_drops_excess_registrations() -> None:
    cfg = replace(EngineConfig(), reg_budget_peer_burst=5, reg_budget_per_peer_per_s=1.0)
    eng, tracer = lone_engine(cfg)
    eng.peer_up("spammer", 0.0, outbound=True)
    for i in range(20):
        eng.receive_message("spammer", RegGossip(make_registration(new_signing_key(bytes([i]) * 32), 1, 0, 60), 5, 0),
                            0.0)
    assert eng.route_count() == 5
    assert len([r for r in tracer.of_kind("reg_dropped") if r[11] == "budget_peer"]) == 15


def test_garbage_frames_get_an_error_frame_and_change_nothing() -> None:
    eng, _ = lone_engine()
    eng.peer_up("p", 0.0, outbound=True)
    before = eng.stats()
    out = eng.receive_frame("p", b"\xc1\xff garbage", 0.1)
    assert len(out) == 1 and isinstance(out[0], Send) and isinstance(out[0].msg, ErrorFrame)
    after = eng.stats()
    assert after.pop("frames_invalid") == 1 and after.pop("score_invalid_frame") == 1 and after == before
    assert eng.peer_scores() == {"p": EngineConfig().score_invalid_frame}  # counts against the sender


def test_membership_refuses_inbound_over_capacity_and_replaces_lost_neighbours() -> None:
    cfg = replace(EngineConfig(), active_min=3, active_max=4)
    eng, _ = lone_engine(cfg)
    effects = eng.add_candidates([PeerInfo(f"c{i}", f"addr{i}") for i in range(6)], 0.0) + eng.start(
        0.0, sync_routes=False)  # no G11 (a Hello asking for routes on every link)
    connects = [e for e in effects if isinstance(e, Connect)]
    assert len(connects) == 3
    hellos = []
    for c in connects:  # with fewer than 2 neighbours, a link we dial says so (rule M4)
        out = eng.peer_up(c.peer, 0.1, outbound=True, addr=c.addr)
        hellos += [e.msg.features for e in out if isinstance(e, Send) and isinstance(e.msg, Hello)]
    assert hellos == [("low",), ("low",)]
    assert eng.peer_up("in1", 0.2, outbound=False) == []
    # Full: an inbound link is held on probation; without a "low" Hello it is refused as full.
    assert eng.peer_up("in2", 0.2, outbound=False) == []
    assert eng.receive_message("in2", Hello(1, "in2", "", ()), 0.3) == [Disconnect("in2", "full")]
    assert eng.peer_up("in3", 0.2, outbound=False) == []
    assert Disconnect("in3", "full") in eng.handle_timer(0.2 + 2.5)  # probation over, no Hello
    assert "in2" not in eng.active_peers() and "in3" not in eng.active_peers()
    refill = eng.peer_down(connects[0].peer, 2.8, DisconnectReason.LINK_LOST)
    assert refill == []  # still 3 active (2 outbound + in1) = active_min
    refill = eng.peer_down("in1", 2.9, DisconnectReason.LINK_LOST)
    assert len(refill) == 1 and isinstance(refill[0], Connect) and refill[0].peer not in eng.active_peers()


def test_a_relay_short_of_neighbours_gets_into_a_full_relay_which_makes_room() -> None:
    eng, _ = lone_engine(replace(EngineConfig(), active_min=3, active_max=4))
    for p in ("a", "b", "c", "d"):
        eng.peer_up(p, 0.0, outbound=False, addr=f"addr-{p}")
    assert eng.peer_up("lonely", 1.0, outbound=False, addr="addr-lonely") == []
    out = eng.receive_message("lonely", Hello(1, "lonely", "addr-lonely", ("low",)), 1.1)
    dropped = [e.peer for e in out if isinstance(e, Disconnect)]
    assert len(dropped) == 1 and dropped[0] in "abcd" and all(e.reason == "make_room" for e in out
                                                               if isinstance(e, Disconnect))
    assert "lonely" in eng.active_peers() and len(eng.active_peers()) == 4
    assert dropped[0] in eng.passive_peers()  # still a candidate for later
    # At most one eviction a minute: a relay cut everywhere is "low" too and must not churn links.
    assert eng.peer_up("pushy", 2.0, outbound=False, addr="addr-pushy") == []
    assert eng.receive_message("pushy", Hello(1, "pushy", "", ("low",)), 2.1) == [Disconnect("pushy", "full")]
    assert eng.peer_up("later", 70.0, outbound=False, addr="addr-later") == []
    assert any(isinstance(e, Disconnect) and e.reason == "make_room"
               for e in eng.receive_message("later", Hello(1, "later", "", ("low",)), 70.1))


def test_two_meshes_of_full_relays_knit_together() -> None:
    """Two groups, every relay of the first full: the second gets in through priority joins."""
    edges = [(a, b) for a in range(5) for b in range(a + 1, 5)]  # 5 relays, each with 4 links: all full
    edges += [(5, 6)]  # a pair on its own
    net = MiniNet(7, edges, open_dial=True)
    for i in (5, 6):  # the pair learns of the full group (a bootstrap list)
        net.apply(str(i), net.engines[i].add_candidates([PeerInfo(str(j), f"addr-{j}") for j in range(5)], net.now))
    net.run_until(30.0)
    seen, todo = {"0"}, ["0"]
    while todo:
        for p in net.engines[int(todo.pop())].active_peers():
            if p not in seen:
                seen.add(p)
                todo.append(p)
    assert seen == {str(i) for i in range(7)}
    assert all(len(e.active_peers()) <= 4 for e in net.engines)
    assert sum(e.counters.get("peer_made_room", 0) for e in net.engines) >= 1


def test_silent_neighbour_is_declared_down_by_keepalive() -> None:
    cfg = replace(EngineConfig(), keepalive_interval_s=1.0, keepalive_misses=3)
    eng, tracer = lone_engine(cfg)
    eng.peer_up("quiet", 0.0, outbound=True)
    eng.peer_up("chatty", 0.0, outbound=True)
    sent_keepalive = False
    t = 0.0
    while t < 5.0:
        t = eng.get_timer() or t + 1
        out = eng.handle_timer(t)
        sent_keepalive |= any(isinstance(e, Send) and isinstance(e.msg, Keepalive) for e in out)
        eng.receive_message("chatty", Keepalive(1, True), t)
    assert sent_keepalive
    assert eng.active_peers() == ["chatty"]
    assert tracer.of_kind("peer_down")[0][5] == "quiet"


def test_null_tracer_level_off_emits_nothing_and_routes_the_same() -> None:
    eng, off_tracer = lone_engine(level=TraceLevel.OFF)
    quiet = Engine("me", EngineConfig(), verifier=CachingVerifier(), home=MemoryHomeStore(), tracer=NullTracer(),
                   rng=random.Random(5))
    reg = make_registration(KEY, 1, 0, 60)
    for e in (eng, quiet):
        e.peer_up("a", 0.0, outbound=True)
        e.peer_up("b", 0.0, outbound=True)
        out = e.receive_message("a", RegGossip(reg, 5, 2), 0.0)
        assert [s.peer for s in out] == ["b"]
        assert e.next_hops(reg.route_id) == [("a", 3)]
    assert off_tracer.rows == []  # level off: the engine builds no rows at all


def test_a_receipt_after_custody_gave_up_corrects_the_final_status() -> None:
    """The last attempt can get through after custody timed out: its receipt still settles the status."""
    from inri.core.api import CustodyReleased
    from inri.protocol.messages import Push, Receipt, ReceiptStatus

    cfg = replace(EngineConfig(), custody_deadline_s=2.0, custody_max_ttl_s=2.0)
    eng = Engine("a", cfg, verifier=CachingVerifier(), home=MemoryHomeStore(), tracer=NullTracer(),
                 rng=random.Random(1))
    eng.peer_up("b", 0.0, outbound=True, addr="b:1")
    reg = make_registration(new_signing_key(b"\x05" * 32), 1, 0, 3600)
    eng.receive_message("b", RegGossip(reg, 5, 1), 0.1)
    res = eng.inject_push(reg, b"t" * 16, b"c", 1.0)
    assert res.outcome == InjectOutcome.ACCEPTED and any(isinstance(e, Send) and isinstance(e.msg, Push)
                                                         for e in res.effects)
    # No receipt by the retry time (1 + custody_retry_s), which is past the deadline: custody ends.
    gave_up = [e for e in eng.handle_timer(1.0 + cfg.custody_retry_s) if isinstance(e, CustodyReleased)]
    assert [(e.push_id, e.status) for e in gave_up] == [(res.push_id, "expired")]  # a route existed
    late = eng.receive_message("b", Receipt(res.push_id, ReceiptStatus.STORED, 2), 3.1)
    assert [(e.push_id, e.status, e.hops) for e in late if isinstance(e, CustodyReleased)] == [
        (res.push_id, "delivered", 2)]
    assert eng.receive_message("b", Receipt(res.push_id, ReceiptStatus.STORED, 2), 3.2) == []  # once only


def test_custody_parks_after_the_escalation_and_delivers_when_the_home_returns() -> None:
    """A home relay down longer than every attempt: the push waits in custody, then follows the new route."""
    net, reg = registered_net()
    net.kill(0)  # the home relay crashes
    pid = push(net, 5, reg, TOKENS[0])
    net.run_until(net.now + 90.0)  # route, backups, rings 1/3/5/7, full TTL: all fail; parked retries continue
    assert pid not in net.custody and net.engines[5]._custody.holds(pid)
    net.restart(0)
    net.run_until(net.now + 5.0)  # links come back
    net.apply("0", net.engines[0].register(reg, net.now))  # the restarted home re-gossips its registration
    net.run_until(net.now + 60.0)
    assert net.custody.get(pid) == "delivered"
    assert sum(1 for d in net.delivered if d[1] == pid) == 1


def test_parked_re_sends_back_off_while_the_home_stays_down() -> None:
    """Rule C3: after the escalation, a push whose home stays down is re-sent along its route 4, 8, 16
    retry periods after the re-send before, then every PARK_BACKOFF_MAX: a home down for minutes costs each custodian a
    few re-sends per push (the sweep of a churned mesh: a third of all push messages went to homes
    that never came back), not one every 4 retry periods until the deadline."""
    net, reg = registered_net()
    cfg = net.config
    net.kill(0)  # the home relay is down for good
    pid = push(net, 5, reg, TOKENS[0])
    net.run_until(net.now + 200.0)
    retries = [(t, count) for t, relay, kind, msg, *_, count, _n, _r in net.tracer.rows
               if kind == "push_retry" and relay == "5" and msg == pid.hex()]
    parked = [t for t, count in retries if count is not None and count >= cfg.custody_max_attempts]
    gaps = [round((b - a) / cfg.custody_retry_s, 6) for a, b in zip(parked, parked[1:], strict=False)]
    assert gaps[:3] == [PARK_FACTOR, 2 * PARK_FACTOR, 4 * PARK_FACTOR], gaps  # doubling from the first
    assert set(gaps[2:]) == {PARK_BACKOFF_MAX}, gaps
    assert net.engines[5]._custody.holds(pid)  # still kept for the home's return, up to the deadline


def test_routes_expire_with_their_registration_and_sweeps_skip_tables_with_nothing_due() -> None:
    net = MiniNet(8, EDGES, latency=SLOW)
    short = make_registration(KEY, 1, 0, 40)
    other = new_signing_key(b"\x09" * 32)
    long = make_registration(other, 1, 0, 100)
    for reg in (short, long):
        net.homes[0].add_registration(reg, TOKENS)
        net.apply("0", net.engines[0].register(reg, 0.0))
    net.run_until(35.0)
    assert all(net.engines[i].route_epoch(short.route_id) == 1 for i in range(1, 8))
    net.run_until(75.0)  # a sweep ran after 40 s: the short registration's routes are gone, not the long one's
    assert all(net.engines[i].route_epoch(short.route_id) is None for i in range(1, 8))
    assert all(net.engines[i].route_epoch(long.route_id) == 1 for i in range(1, 8))
    net.run_until(135.0)
    assert all(net.engines[i].route_count() == 0 for i in range(1, 8))
    # A route learned after a sweep that found nothing due is still swept when it expires.
    late = make_registration(new_signing_key(b"\x0a" * 32), 1, 130, 20)  # expires at 150
    net.apply("0", net.engines[0].register(late, 135.0))
    net.run_until(140.0)
    assert net.engines[5].route_epoch(late.route_id) == 1
    net.run_until(185.0)
    assert net.engines[5].route_epoch(late.route_id) is None




def test_one_lost_push_frame_is_not_reported_as_a_hole_and_cuts_no_route_upstream() -> None:
    """Rule F6: a next hop with a record of answering leaves one push unanswered (its frame was lost on
    the link): the relay tries its other ways first and tells nobody upstream. Before, it answered
    `no route` and its upstream dropped it as a next hop: on 1% frame loss most route errors were
    these, and the cut routes sent later pushes to ring searches (loss-1k: +90% messages)."""
    # Fixed retry periods (C4 off): the custodian's retry comes after 1's answer deadline, as on the
    # long paths of loss-1k where a relay mid-path gives up before the custodian re-sends.
    net = MiniNet(4, [(0, 1), (1, 2), (2, 3)], config=replace(EngineConfig(), adaptive_retry=False))
    net.run_until(1.0)
    reg = make_registration(new_signing_key(b"\x44" * 32), 1, 0, 3600)
    tokens = [bytes([7, i]) * 8 for i in range(8)]
    net.homes[3].add_registration(reg, tokens)
    net.apply("3", net.engines[3].register(reg, net.now))
    net.run_until(2.0)
    for k in range(3):  # answered pushes: 2 earns its record at 1
        res = net.engines[0].inject_push(reg, tokens[k], b"ok", net.now)
        net.apply("0", res.effects)
        net.run_until(net.now + 1.0)
    assert len(net.delivered) == 3
    apply = net.apply
    lost: list[bool] = []

    def lossy(src: str, effects: list[Any]) -> None:  # the next push frame from 1 to 2 is lost
        if src == "1" and not lost:
            kept = [e for e in effects if not (isinstance(e, Send) and e.peer == "2" and isinstance(e.msg, Push))]
            if len(kept) < len(effects):
                lost.append(True)
            effects = kept
        apply(src, effects)

    net.apply = lossy  # type: ignore[method-assign]
    res = net.engines[0].inject_push(reg, tokens[5], b"lost once", net.now)
    assert res.push_id is not None
    net.apply("0", res.effects)
    net.run_until(net.now + 30.0)
    assert lost
    assert not [r for r in net.tracer.of_kind("route_error") if r[11] in ("no_route", "next_hop_down")]
    assert [h for h, _ in net.engines[0].next_hops(reg.route_id)] == ["1"]
    assert net.custody.get(res.push_id) == CustodyStatus.DELIVERED  # the custodian's retry
    assert net.engines[1].counters.get("hole_suspected", 0) == 1


def test_a_relay_upstream_of_a_black_hole_is_not_cut_for_it() -> None:
    """The hostile-peer property test's example (hypothesis found it): hostile relay 4 sends pushes to
    honest 6, whose next hop 7 forwards them along 7's primary route, back to 4, which swallows them.
    With one receipt timeout for every relay, 6 (which sent first) blamed 7 (-1 per push) and cut it
    before 7 blamed 4. Rule F6: the timeout shrinks with the hops the copy travelled, so 7 gives up on 4
    first and its `next hop down` reaches 6 before 6's own timeout: 6 keeps 7, 7 cuts 4."""
    caps = replace(EngineConfig(), push_seen_max=50, reverse_max=40, custody_retry_s=0.5, keepalive_interval_s=0.5)
    edges = [(0, 1), (0, 2), (0, 3), (0, 7), (1, 2), (1, 4), (2, 5), (3, 8), (4, 6), (4, 7), (5, 7), (6, 7)]
    lat = {(a, b): 0.0625 for a, b in edges} | {(b, a): 0.0625 for a, b in edges}
    lat |= {(0, 1): 0.0078125, (1, 4): 0.03125, (4, 7): 0.015625, (7, 6): 0.03125}  # 4's gossip reaches 7 first
    net = MiniNet(9, edges, config=caps, latency=lat, seed=0)
    net.engines[4]._on_push = lambda peer, msg, now: []  # type: ignore[method-assign]  # black hole
    reg = make_registration(new_signing_key(b"\x33" * 32), 1, 0, 3600)
    net.homes[0].add_registration(reg, [bytes([9, i]) * 8 for i in range(8)])
    net.apply("0", net.engines[0].register(reg, net.now))
    net.run_until(net.now + 1.0)
    assert net.engines[7].next_hops(reg.route_id)[0][0] == "4"  # the loop back to the black hole
    for j in range(20):
        pid = b"\xfe" + bytes([j]) * 15
        net.apply("6", net.engines[6].receive_message("4", Push(pid, reg.route_id, b"t" * 16, b"x", 8, 1, 0, 0, reg),
                                                      net.now))
    net.run_until(net.now + 20.0)
    assert "7" in net.engines[6].active_peers()
    assert not net.engines[6].stats().get("peer_cut_score")
    assert "4" not in net.engines[7].active_peers()  # the black hole itself is cut


def test_a_full_route_table_evicts_its_earliest_expiring_routes_in_batches_of_one_percent() -> None:
    """Rule G2: a full table drops the routes that expire first. Finding them is one scan of the whole
    table (0.2-0.4 s at 1M routes), so a full table evicts route_max / 100 of them per scan, not one per
    new route: the scan is paid once per hundredth of the table, not for every registration."""
    cfg = EngineConfig(route_max=300)
    eng = Engine("me", cfg, verifier=CachingVerifier(), home=MemoryHomeStore(), tracer=NullTracer(),
                 rng=random.Random(1))
    eng.peer_up("a", 0.0, outbound=True)
    regs = [make_registration(new_signing_key(bytes([i % 256, i // 256]) * 16), 1, 0,
                              3600 + 10 * ((i * 7) % 300) if i < 300 else 9000)  # the newcomers expire last
            for i in range(304)]
    for reg in regs[:300]:
        eng.receive_message("a", RegGossip(reg, 0, 3), 1.0)  # ttl 0: cache only
    assert eng.route_count() == 300 and not eng.counters.get("routes_evicted")
    by_expiry = sorted(regs[:300], key=lambda r: r.expires_at)
    eng.receive_message("a", RegGossip(regs[300], 0, 3), 1.0)
    assert eng.counters["routes_evicted"] == 3  # 300 // 100, in one go
    assert [r for r in by_expiry[:4] if not eng.next_hops(r.route_id)] == by_expiry[:3]  # the earliest three
    assert eng.route_count() == 298
    for reg in regs[301:303]:  # room for two: nothing evicted
        eng.receive_message("a", RegGossip(reg, 0, 3), 1.0)
    assert eng.counters["routes_evicted"] == 3 and eng.route_count() == 300
    eng.receive_message("a", RegGossip(regs[303], 0, 3), 1.0)  # full again: the next batch
    assert eng.counters["routes_evicted"] == 6 and eng.route_count() == 298
    assert all(eng.next_hops(r.route_id) for r in regs[300:304])  # the new routes stay
