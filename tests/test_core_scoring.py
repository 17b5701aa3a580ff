"""Peer scoring (engine rules S1, S2): hostile neighbours lose preference, then the link."""

from __future__ import annotations

import random
from dataclasses import replace

from inri.core.api import Disconnect, InjectOutcome, Send, TraceLevel
from inri.core.config import EngineConfig
from inri.core.engine import Engine
from inri.core.home import MemoryHomeStore
from inri.core.trace import ListTracer
from inri.core.verify import CachingVerifier
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import Keepalive, PeerInfo, Push, Receipt, ReceiptStatus, RegGossip, Registration

CFG = EngineConfig()


def engine(cfg: EngineConfig = CFG) -> tuple[Engine, ListTracer]:
    tracer = ListTracer(TraceLevel.FULL)
    eng = Engine("me", cfg, verifier=CachingVerifier(), home=MemoryHomeStore(), tracer=tracer,
                 rng=random.Random(3))
    for p in ("a", "b", "c"):
        eng.peer_up(p, 0.0, outbound=True, addr=f"addr-{p}")
    return eng, tracer


def reg(i: int = 1) -> Registration:
    return make_registration(new_signing_key(bytes([i]) * 32), 1, 0, 3600)


def routed(eng: Engine, r: Registration) -> None:
    """a first (hops 2), then b (hops 1, feasible): the route vector is [a, b], a is the primary."""
    eng.receive_message("a", RegGossip(r, 10, 2), 0.1)
    eng.receive_message("b", RegGossip(r, 10, 1), 0.2)
    assert [p for p, _ in eng.next_hops(r.route_id)] == ["a", "b"]


def hear_all(eng: Engine, now: float) -> None:
    """Keepalives from every neighbour, so liveness never cuts a link in these tests."""
    for p in eng.active_peers():
        eng.receive_message(p, Keepalive(1, True), now)


def push_from_c(eng: Engine, r: Registration, n: int, now: float) -> list[str]:
    """Pushes arriving from c in route mode: where does each one go?"""
    hops = []
    for i in range(n):
        pid = random.Random(n * 1000 + i + int(now * 10)).randbytes(16)
        out = eng.receive_message("c", Push(pid, r.route_id, b"t" * 16, b"x", 10, 1, 0, 0, r), now)
        hops += [e.peer for e in out if isinstance(e, Send) and isinstance(e.msg, Push)]
    return hops


def test_a_black_hole_next_hop_loses_preference_and_receipts_win_it_back() -> None:
    eng, tracer = engine()
    r = reg()
    routed(eng, r)
    assert push_from_c(eng, r, 4, 1.0) == ["a"] * 4
    hear_all(eng, 3.5)
    eng.handle_timer(1.0 + CFG.receipt_timeout_s + CFG.keepalive_interval_s)  # no answer from a: 4 x -1
    assert eng.peer_scores()["a"] < CFG.score_prefer_below
    assert eng.stats()["push_no_answer"] == 4
    # The backup takes over while a's score is low; a stays linked (not yet low enough to be cut).
    now = 5.0
    pids = []
    for i in range(3):
        pid = bytes([i]) * 16
        out = eng.receive_message("c", Push(pid, r.route_id, b"t" * 16, b"x", 10, 1, 0, 0, r), now)
        assert [e.peer for e in out if isinstance(e, Send)] == ["b"]
        pids.append(pid)
    assert "a" in eng.active_peers()
    # b answers: its score rises; a receipt through a would raise a's score the same way.
    for pid in pids:
        out = eng.receive_message("b", Receipt(pid, ReceiptStatus.STORED, 3), now + 0.1)
        assert [e.peer for e in out] == ["c"]  # the receipt still travels back
    assert eng.peer_scores()["b"] == 3 * CFG.score_receipt
    # A receipt that comes from a neighbour the push was not sent to earns it nothing.
    eng.receive_message("c", Receipt(pids[0], ReceiptStatus.STORED, 3), now + 0.2)
    assert eng.peer_scores()["c"] == 0


def test_scores_decay_back_towards_zero() -> None:
    cfg = replace(CFG, score_half_life_s=10.0)
    eng, _ = engine(cfg)
    eng.receive_frame("a", b"\xc1", 0.0)
    assert eng.peer_scores()["a"] == cfg.score_invalid_frame
    for t in range(1, 21):  # keepalives answered so the links stay up; 20 s = two half-lives
        hear_all(eng, float(t) - 0.5)
        eng.handle_timer(float(t))
    assert abs(eng.peer_scores()["a"] - cfg.score_invalid_frame / 4) < 0.1


def test_a_forger_is_cut_banned_and_refused_until_the_ban_ends() -> None:
    eng, tracer = engine()
    good = reg(9)
    forged = Registration(good.route_key, good.epoch, good.issued_at, good.lifetime, bytes(64))
    effects = []
    for i in range(5):
        bad = reg(20 + i)
        bad = Registration(bad.route_key, bad.epoch, bad.issued_at, bad.lifetime, bytes(64))
        effects = eng.receive_message("a", RegGossip(bad, 10, 1), 1.0 + i)
    assert Disconnect("a", "score") in effects
    assert "a" not in eng.active_peers() and eng.route_count() == 0
    assert eng.stats()["banned"] == 1 and eng.stats()["score_bad_signature"] == 5
    assert [r[11] for r in tracer.of_kind("peer_scored")] == ["bad_signature"]
    # Refused while banned, not re-dialled, not taken from peer exchange.
    assert eng.peer_up("a", 100.0, outbound=False, addr="addr-a") == [Disconnect("a", "banned")]
    eng.add_candidates([PeerInfo("a", "addr-a")], 100.0)
    assert "a" not in eng.passive_peers()
    # A forged copy of a real registration (valid route id, bad signature) is refused the same way.
    eng.receive_message("b", RegGossip(good, 10, 3), 101.0)
    eng.receive_message("c", RegGossip(forged, 10, 1), 101.1)
    assert [p for p, _ in eng.next_hops(good.route_id)] == ["b"]
    assert eng.peer_scores()["c"] == CFG.score_bad_signature
    # After the ban: welcome again.
    after = 5.0 + CFG.score_ban_s + 1  # cut at t = 5.0
    assert eng.peer_up("a", after, outbound=False, addr="addr-a") == []
    assert "a" in eng.active_peers()


def test_replays_and_push_floods_count_against_the_sender() -> None:
    cfg = replace(CFG, push_budget_peer_burst=10, push_budget_per_peer_per_s=1.0)
    eng, _ = engine(cfg)
    r = reg()
    routed(eng, r)
    eng.receive_message("a", RegGossip(r, 10, 2), 0.3)  # the same (route, epoch) again from a
    assert eng.stats()["reg_dropped_replayed"] == 1
    assert eng.peer_scores()["a"] == cfg.score_replay
    sent = push_from_c(eng, r, 30, 1.0)
    assert len(sent) == 10  # the burst; the other 20 are over c's push budget
    assert eng.stats()["push_dropped_budget_peer"] == 20
    # The drops protect us; one burst over budget costs one penalty (at most one per second), not
    # the link: an honest entry relay briefly faster than its path is not cut.
    assert eng.peer_scores()["c"] == cfg.score_budget_drop and "c" in eng.active_peers()
    # A neighbour that keeps flooding, second after second, reaches the cut (-20) and is gone.
    for k in range(1, 19):
        push_from_c(eng, r, 5, 1.0 + k)
    assert "c" in eng.active_peers()
    for k in range(19, 25):
        push_from_c(eng, r, 5, 1.0 + k)
    assert "c" not in eng.active_peers() and eng.stats()["peer_cut_score"] == 1


def test_replayed_push_ids_through_an_honest_relay_never_get_honest_links_cut() -> None:
    """A hostile relay H sends pushes to the home, then the same push ids to another neighbour, whose
    copies reach the home again over two honest hops. The home (and any relay) answers a route-mode
    copy it already handled with a DUPLICATE route error, passed back hop by hop, so no honest relay
    waits in vain and blames its next hop as a black hole."""
    from inri.core.testing import MiniNet
    from inri.protocol.messages import RouteError, RouteErrorReason

    edges = [(0, 1), (0, 2), (0, 3), (1, 4), (1, 5), (2, 4), (2, 6)]  # 0 hostile, 1 home, 2-4-1 a detour
    net = MiniNet(7, edges, latency={(u, v): 0.06 for a, b in edges for u, v in ((a, b), (b, a))})
    r = reg(5)
    net.homes[1].add_registration(r, [bytes([9, i]) * 8 for i in range(8)])
    net.apply("1", net.engines[1].register(r, 0.0))
    net.run_until(1.0)
    ids = [b"\xfe" + bytes([j]) * 15 for j in range(30)]
    for target in (1, 2):  # to the home first, then the same ids to relay 2
        for pid in ids:
            net.apply(str(target), net.engines[target].receive_message(
                "0", Push(pid, r.route_id, b"t" * 16, b"x", 8, 1, 0, 0, r), net.now))
        net.run_until(net.now + 0.5)
    net.run_until(net.now + 20.0)
    for i in (1, 2, 4):
        assert not net.engines[i].stats().get("peer_cut_score")
        assert all(score > CFG.score_prefer_below for p, score in net.engines[i].peer_scores().items() if p != "0")
    dups = [m for _, _, m in net.sent if isinstance(m, RouteError) and m.reason == RouteErrorReason.DUPLICATE]
    assert len(dups) >= len(ids)  # answered, not dropped quietly
    traced = [r for r in net.tracer.of_kind("route_error") + net.tracer.of_kind("receipt_forwarded")
              if r[11] == "duplicate"]
    assert len(traced) == len(dups)  # every one is a traced push message (messages_per_delivered_push)
    assert "1" in net.engines[2].active_peers() or "4" in net.engines[2].active_peers()


def test_a_congested_link_costs_a_modest_score_then_preference_then_the_link() -> None:
    """Engine.link_congested (the daemon's bounded send queue dropped frames for the peer)."""
    eng, _ = engine()
    r = reg(7)
    routed(eng, r)
    assert eng.link_congested("a", 1.0) == []  # one report: modest, the link stays
    assert eng.peer_scores()["a"] == CFG.score_congested
    for k in range(50):  # reported on every dropped frame: counted once per keepalive interval
        eng.link_congested("a", 1.0 + k * 0.01)
    assert eng.peer_scores()["a"] == CFG.score_congested
    assert eng.stats()["score_congested"] == 1
    t, cut = 1.0, False
    while t < 120.0 and not cut:  # a neighbour that never reads: preference lost, then the link
        t += CFG.keepalive_interval_s
        for p in ("a", "b", "c"):
            eng.receive_message(p, Keepalive(1, True), t)
        eng.handle_timer(t)
        out = eng.link_congested("a", t)
        if eng.peer_scores().get("a", 0.0) < CFG.score_prefer_below:
            assert eng._forwarding_rules.next_hop(r.route_id, None) == "b"  # preference is internal
        cut = Disconnect("a", "score") in out
    assert cut and "a" not in eng.active_peers() and t < 60.0
    assert eng.peer_scores()["b"] == 0.0  # honest neighbours are untouched


def _drive_slow_next_hop(eng: Engine, r: Registration, delay: float, seconds: float, rate: int = 10) -> list[bytes]:
    """Pushes from c at `rate`/s for `seconds`, each answered by the next hop a `delay` s after it left;
    the engine's timer runs every 0.1 s. Returns the push ids a was sent."""
    step = 1.0 / rate
    t, i = 1.0, 0
    sent: list[tuple[float, bytes]] = []
    answered = 0
    while t < 1.0 + seconds + min(delay, 5.0) + 1.0:
        if t < 1.0 + seconds:
            pid = i.to_bytes(16, "big")
            out = eng.receive_message("c", Push(pid, r.route_id, b"t" * 16, b"x", 10, 1, 0, 0, r), t)
            assert [e.peer for e in out if isinstance(e, Send)] == ["a"]
            sent.append((t, pid))
            i += 1
        while answered < len(sent) and sent[answered][0] + delay <= t:
            eng.receive_message("a", Receipt(sent[answered][1], ReceiptStatus.STORED, 3), t)
            answered += 1
        hear_all(eng, t)
        eng.handle_timer(t)
        t = round(t + step, 6)
    return [pid for _, pid in sent]


def test_a_slow_next_hop_whose_receipts_come_late_is_not_a_black_hole() -> None:
    """Slowness is not silence (rule S1): receipts 3 s after the push (receipt_timeout_s is 2 s), 10
    pushes/s for 60 s. The old scoring blamed every push (-1 each, the late receipt earned nothing) and
    cut the neighbour within seconds; now late answers are credited and the grace follows the measured
    delay, so the neighbour keeps its link and its preference."""
    eng, _ = engine()
    r = reg()
    eng.receive_message("a", RegGossip(r, 10, 2), 0.1)  # a is the only next hop
    _drive_slow_next_hop(eng, r, delay=3.0, seconds=60.0)
    stats = eng.stats()
    assert "a" in eng.active_peers() and not stats.get("peer_cut_score")
    assert eng.peer_scores()["a"] > CFG.score_prefer_below
    assert stats.get("push_answer_late_wait", 0) > 500  # the grace carried most pushes
    assert stats.get("push_no_answer", 0) <= stats.get("receipt_late_credited", 0)  # every blame given back


def test_a_black_hole_is_still_blamed_on_time_next_to_a_slow_neighbour() -> None:
    """The grace is for neighbours that answer: one that never does is blamed at receipt_timeout_s."""
    eng, _ = engine()
    r = reg()
    eng.receive_message("a", RegGossip(r, 10, 2), 0.1)
    _drive_slow_next_hop(eng, r, delay=1e9, seconds=3.0)  # never answers
    stats = eng.stats()
    assert stats["push_no_answer"] >= 20 and not stats.get("push_answer_late_wait")
    assert stats["peer_cut_score"] == 1 and "a" not in eng.active_peers()  # 20 x -1: cut, as before


def test_missing_receipts_never_cut_the_last_link() -> None:
    """A relay's only neighbour is not cut for lateness (cutting it cannot route anything better)."""
    tracer = ListTracer(TraceLevel.FULL)
    eng = Engine("me", CFG, verifier=CachingVerifier(), home=MemoryHomeStore(), tracer=tracer, rng=random.Random(3))
    eng.peer_up("a", 0.0, outbound=True, addr="addr-a")
    r = reg()
    eng.receive_message("a", RegGossip(r, 10, 2), 0.1)
    pids = [i.to_bytes(16, "big") for i in range(60)]
    for pid in pids:
        eng.inject_push(r, b"t" * 16, b"x", 1.0, push_id=pid)
    for k in range(1, 40):
        eng.receive_message("a", Keepalive(1, True), 1.0 + k * 0.5)
        eng.handle_timer(1.0 + k * 0.5)
    assert eng.stats()["push_no_answer"] >= 30 and eng.stats()["peer_cut_spared_last_link"] >= 1
    assert eng.active_peers() == ["a"] and not eng.stats().get("peer_cut_score")


def test_pushes_injected_for_one_next_hop_stay_within_its_push_budget() -> None:
    """Rule C1: an entry relay does not send a next hop more pushes than its push budget takes (it would
    drop them and score us down); past 90% of it the push is refused (429 at the API), nothing kept."""
    cfg = replace(CFG, push_budget_peer_burst=40, push_budget_per_peer_per_s=10.0)
    eng, _ = engine(cfg)
    r = reg()
    routed(eng, r)
    results = [eng.inject_push(r, b"t" * 16, b"x", 1.0) for _ in range(30)]
    accepted = [x for x in results if x.outcome == InjectOutcome.ACCEPTED]
    refused = [x for x in results if x.outcome != InjectOutcome.ACCEPTED]
    assert len(accepted) == 20  # half the burst at once
    assert {(x.outcome, x.reason, x.push_id) for x in refused} == {(InjectOutcome.OVERLOADED, "next_hop_busy", None)}
    assert eng.stats()["custody"] == 20 and eng.stats()["push_refused_next_hop_busy"] == 10
    # A second later: 90% of the rate again.
    later = [eng.inject_push(r, b"t" * 16, b"x", 2.0).outcome for _ in range(12)]
    assert later.count(InjectOutcome.ACCEPTED) == 9
