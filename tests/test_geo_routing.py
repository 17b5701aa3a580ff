"""Issue 17 (sparse geographic meshes under churn): reverse paths without cycles (F6b), ring searches
that are not captured by stale routes (F4b; by default on the last ring: F4c),
and receipts that repair the route they came back along (F7), on small engine networks."""

from __future__ import annotations

import random
from dataclasses import replace

from inri.core.api import Send, TraceLevel
from inri.core.config import EngineConfig
from inri.core.engine import Engine
from inri.core.home import MemoryHomeStore
from inri.core.testing import MiniNet
from inri.core.trace import ListTracer
from inri.core.verify import CachingVerifier
from inri.protocol import limits
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key, receipt_public_key
from inri.protocol.messages import Push, RegGossip, Registration, RouteError, RouteErrorReason

KEY = new_signing_key(b"\x17" * 32)
SECRET = b"\x71" * 32  # the receipt key's seed (the home signs receipts with it: rule F5)
TOKENS = [bytes([i]) * 16 for i in range(1, 30)]

# Home 0. A fast branch 0-1-2-3-4-5 with the custodian 6 and its neighbour 7 both behind 5 (6-5, 7-5,
# 6-7), and a slow detour 0-10-11-12-13-14-15-7 that only relays 10-15 route along (15 is as far from
# the home as 7 is, so 7 never takes it as a backup: G3 feasibility).
FAST = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, 6), (5, 7), (6, 7)]
SLOW = [(0, 10), (10, 11), (11, 12), (12, 13), (13, 14), (14, 15), (15, 7)]


def _reg() -> Registration:
    return make_registration(KEY, 1, 0, 3600, receipt_public_key(SECRET))


def _stale_branch_net(config: EngineConfig | None = None) -> tuple[MiniNet, bytes, bytes]:
    latency: dict[tuple[int, int], float] = {}
    for a, b in FAST:
        latency[(a, b)] = latency[(b, a)] = 0.001
    for a, b in SLOW:
        latency[(a, b)] = latency[(b, a)] = 0.3 if (a, b) == (15, 7) else 0.05
    net = MiniNet(16, FAST + SLOW, latency=latency, config=config)
    reg = _reg()
    net.homes[0].add_registration(reg, TOKENS, SECRET)
    net.apply("0", net.engines[0].register(reg, net.now))
    net.run_until(2.0)
    assert net.engines[7].next_hops(reg.route_id)[0][0] == "5"  # 7's route runs into the fast branch
    assert net.engines[15].next_hops(reg.route_id) == [("14", 6)]  # 15's runs along the detour
    assert len(net.engines[7].next_hops(reg.route_id)) == 1
    net.kill(1)  # the branch breaks: 2 is left without a route, and 3 to 7 still point into it
    net.run_until(12.0)  # keepalives notice
    res = net.engines[6].inject_push(reg, TOKENS[0], b"sealed", net.now)
    assert res.push_id is not None
    net.apply("6", res.effects)
    return net, reg.route_id, res.push_id


def test_a_ring_search_goes_past_relays_whose_routes_run_into_the_same_dead_end() -> None:
    """F4b. Every relay within 2 hops of the custodian 6 holds a route into the broken branch; the ring
    copies that meet those routes follow them and also go on to the ring's radius, where relay 15's
    route along the detour delivers: the custodian's ring of radius 3 (attempt 3) finds the home. A ring
    that stopped at the first route never got past relay 7 (`ring_past_routes = false`, the default; F4c
    acts on the last ring only): radius 5 delivered, 4 s later."""
    net, rid, pid = _stale_branch_net(replace(EngineConfig(), ring_past_routes=True))
    t0 = net.now
    net.run_until(60.0)
    assert net.custody[pid] == "delivered"
    p = pid.hex()
    delivered = [r[0] for r in net.tracer.of_kind("push_delivered") if r[3] == p]
    retries = [r[9] for r in net.tracer.of_kind("push_retry") if r[3] == p and r[0] < delivered[0]]
    assert max(retries) == 3, retries
    rings = [r[7] for r in net.tracer.of_kind("push_fallback") if r[3] == p and r[1] == "6" and r[0] < delivered[0]]
    assert rings == [1, 3]
    assert delivered[0] - t0 < 7.0


def _sent_pushes(eng: Engine, peer: str, push: Push, t: float) -> list[tuple[str, int]]:
    out = eng.receive_message(peer, push, t)
    return sorted((e.peer, e.msg.ring) for e in out if isinstance(e, Send) and isinstance(e.msg, Push))


def test_the_last_ring_goes_past_routes() -> None:
    """F4c (the default). A relay with a route (via c) meets ring copies: those of the fixed rings (radius
    1, 3, 5, 7 = radius left + hops) switch to route mode only (F4: a ring costs what it did); those of
    the custodian's last ring, wider than 7 (the widest the fallback budget affords: 10 with 3
    neighbours), follow the route and also go on to the relay's other neighbours (a, the sender,
    excluded), as F4b does on every ring, while more than 2 hops are left. Radius-2 searches (local
    repair, parked re-sends) never go on. `last_ring_past_routes = false`: captured every time."""
    reg = _reg()
    cases = [  # (attempt, radius left, hops so far, goes on)
        (2, 1, 0, False), (3, 3, 0, False), (4, 3, 2, False), (5, 7, 0, False), (5, 2, 5, False),
        (6, 10, 0, True), (6, 9, 1, True), (6, 3, 7, True), (6, 2, 8, False),
        (1, 2, 12, False), (9, 2, 0, False)]
    for on in (True, False):
        eng = _relay(None if on else replace(EngineConfig(), last_ring_past_routes=False))  # the defaults first
        eng.receive_message("c", _gossip(reg), 0.0)
        for n, (attempt, ring, hops, past) in enumerate(cases):
            pid = bytes([n + 1]) * 16
            push = Push(pid, reg.route_id, b"t" * 16, b"x", 20, hops, attempt, ring, reg)
            sent = _sent_pushes(eng, "a", push, 1.0)
            want = [("b", ring - 1), ("c", 0), ("c", ring - 1)] if on and past else [("c", 0)]
            assert sent == want, (attempt, ring, hops, sent)


def test_the_last_ring_is_the_widest_the_budget_affords_on_three_neighbours_only() -> None:
    """Where F4c acts: with 3 neighbours the default fallback budget leaves a last ring after 1, 3, 5, 7
    (radius 10, C2), with 4 it does not (rings 1 to 7 spend it; the push goes along routes instead), so
    random 4-neighbour meshes keep their rings' cost."""
    from inri.core.custody import ring_cost, widest_ring
    cfg = EngineConfig()
    for degree, last in ((3, 10), (4, 0)):
        spent = sum(ring_cost(r, degree) for r in (1, 3, 5, 7))
        wide = widest_ring(cfg.fallback_budget - spent, degree, cfg.push_ttl)
        assert (wide if wide > 7 else 0) == last


def test_a_receipt_repairs_the_route_it_came_back_along() -> None:
    """F7. After the search's receipt came back 15 -> 7 -> 6 (the default search: ring 5), the custodian
    routes through 7: the next push from 6 goes straight along the detour (before, 6 tried its old primary
    5 first)."""
    net, rid, pid = _stale_branch_net()
    net.run_until(60.0)
    assert net.custody[pid] == "delivered"
    assert net.engines[7].next_hops(rid)[0][0] == "15"
    assert net.engines[6].next_hops(rid)[0][0] == "7"
    assert net.engines[6].stats()["route_learnt_receipt"] >= 1
    reg = _reg()
    res = net.engines[6].inject_push(reg, TOKENS[1], b"sealed", net.now)
    assert res.push_id is not None
    net.apply("6", res.effects)
    net.run_until(net.now + 5.0)
    assert net.custody[res.push_id] == "delivered"
    second = res.push_id.hex()
    first_hop = [r[5] for r in net.tracer.of_kind("push_forwarded") if r[3] == second and r[1] == "6"][0]
    assert first_hop == "7"
    assert [r[6] for r in net.tracer.of_kind("push_delivered") if r[3] == second] == [8]  # 6-7-15-14-...-10-0


def _relay(config: EngineConfig | None = None) -> Engine:
    eng = Engine("me", config or EngineConfig(), verifier=CachingVerifier(), home=MemoryHomeStore(),
                 tracer=ListTracer(TraceLevel.FULL), rng=random.Random(5))
    for p in ("a", "b", "c"):
        eng.peer_up(p, 0.0, outbound=True, addr=f"addr-{p}")
    return eng


def test_a_later_copy_with_more_hops_does_not_take_over_the_reverse_path() -> None:
    """F6b. A route copy came from a (hops 3); a ring copy of another attempt comes from b with more
    hops: a `next hop down` answer still goes back to a, once, however often it comes round."""
    eng = _relay()
    reg = _reg()
    eng.receive_message("c", _gossip(reg), 0.0)
    pid = b"\x01" * 16
    sent = eng.receive_message("a", Push(pid, reg.route_id, b"t" * 16, b"x", 120, 3, 0, 0, reg), 1.0)
    assert [e.peer for e in sent if isinstance(e, Send) and isinstance(e.msg, Push)] == ["c"]
    eng.receive_message("b", Push(pid, reg.route_id, b"t" * 16, b"x", 20, 7, 2, 3, reg), 1.1)
    err = RouteError(pid, reg.route_id, RouteErrorReason.NEXT_HOP_DOWN)
    first = eng.receive_message("c", err, 1.2)
    assert [(e.peer, e.msg.reason) for e in first if isinstance(e, Send)] == [
        ("a", RouteErrorReason.NEXT_HOP_DOWN)]
    # the same error coming round again (a cycle of reverse paths elsewhere) is not passed on again
    again = eng.receive_message("c", err, 1.3)
    assert not [e for e in again if isinstance(e, Send)]
    assert eng.stats()["route_error_repeat_dropped"] == 1


def _gossip(reg: Registration) -> RegGossip:
    return RegGossip(reg, limits.MAX_TTL - 1, 1)
