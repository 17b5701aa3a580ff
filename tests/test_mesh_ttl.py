"""Issue 17: TTLs that follow the mesh (G2, G3b, F1), the fallback budget (C2), and no honest link cut
for loss (S1-S2), on small engine networks and through the simulator's scenario run."""

from __future__ import annotations

import random
from dataclasses import replace

from inri.core.api import Disconnect, InjectOutcome, Send, TraceLevel
from inri.core.config import EngineConfig
from inri.core.custody import ring_cost, widest_ring
from inri.core.engine import Engine
from inri.core.home import MemoryHomeStore
from inri.core.testing import MiniNet
from inri.core.trace import ListTracer
from inri.core.verify import CachingVerifier
from inri.protocol import limits
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import Keepalive, Push, Receipt, ReceiptStatus, RegGossip, Registration

KEY = new_signing_key(b"\x11" * 32)
TOKENS = [bytes([i]) * 16 for i in range(1, 30)]


def _register(net: MiniNet, home: int, reg: Registration) -> None:
    net.homes[home].add_registration(reg, TOKENS)
    net.apply(str(home), net.engines[home].register(reg, net.now))


def test_gossip_crosses_a_60_hop_mesh_and_a_push_follows_its_route_to_the_end() -> None:
    """A line of 61 relays (diameter 60, beyond the old gossip TTL 16 and push TTL 24): on the wire
    (frames encoded and decoded), gossip reaches the far end and a push from there is delivered along
    the route without a TTL drop or any ring search."""
    n = 61
    net = MiniNet(n, [(i, i + 1) for i in range(n - 1)], wire=True)
    reg = make_registration(KEY, 1, 0, 3600)
    _register(net, 0, reg)
    net.run_until(5.0)
    assert net.engines[n - 1].next_hops(reg.route_id) == [(str(n - 2), n - 1)]
    res = net.engines[n - 1].inject_push(reg, TOKENS[0], b"sealed", net.now)
    assert res.outcome == InjectOutcome.ACCEPTED and res.push_id is not None
    net.apply(str(n - 1), res.effects)
    net.run_until(10.0)
    assert net.custody[res.push_id] == "delivered"
    pid = res.push_id.hex()
    assert len([r for r in net.tracer.of_kind("push_forwarded") if r[3] == pid]) == n - 1
    assert not net.tracer.of_kind("push_fallback") and not net.tracer.of_kind("push_dropped")


def test_a_shorter_later_copy_carries_gossip_on_where_the_fast_detour_spent_the_ttl() -> None:
    """G3b. Relay 5 hears the registration first over a fast 5-hop detour (0-1-2-3-4-5) that leaves the
    copy one hop of TTL, then over a slow direct link from the home (1 hop). With first arrivals only,
    the relays behind 5 (6..9, 2 to 5 hops from the home) were never reached; the shorter copy is
    forwarded again and reaches them, and nobody counts it as a replay."""
    edges = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (0, 5), (5, 6), (6, 7), (7, 8), (8, 9)]
    slow = {(0, 5): 0.5, (5, 0): 0.5}
    cfg = replace(EngineConfig(), gossip_ttl=6)
    net = MiniNet(10, edges, config=cfg, latency=slow)
    reg = make_registration(KEY, 1, 0, 3600)
    _register(net, 0, reg)
    net.run_until(3.0)
    assert net.engines[5].next_hops(reg.route_id)[0] == ("4", 5)  # the first arrival stays the route
    for i in range(1, 10):  # every relay is within 6 hops of the home by the shortest path
        assert net.engines[i].next_hops(reg.route_id), f"relay {i} unreached"
    assert net.tracer.of_kind("reg_reforwarded")
    assert not net.tracer.of_kind("reg_dropped")
    assert all(s == 0 for e in net.engines for s in e.peer_scores().values())


def test_the_custodian_stops_ring_searches_at_the_fallback_budget_and_retries_along_the_route() -> None:
    """C2. No relay has a route when the push is injected: the custodian's first ring fits a budget of
    30 messages (radius 1: 4 with active_max 4), radius 3 (52) does not, so it is not sent; once the
    registration's gossip has come, a later attempt follows the route and delivers."""
    assert [ring_cost(r, 4) for r in (1, 3, 5, 7)] == [4, 52, 484, 4372]
    assert [ring_cost(r, 3) for r in (1, 3, 5, 7)] == [3, 21, 93, 381]
    # the default budget's last ring: 10 with 3 neighbours (498 spent on 1-7), none wider than 7 with 4
    assert widest_ring(5000 - 498, 3, 24) == 10 and widest_ring(5000 - 4912, 4, 24) == 3
    cfg = replace(EngineConfig(), fallback_budget=30)
    edges = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (1, 6), (6, 7), (7, 3)]
    net = MiniNet(8, edges, config=cfg)
    reg = make_registration(KEY, 1, 0, 3600)
    net.homes[0].add_registration(reg, TOKENS)
    res = net.engines[5].inject_push(reg, TOKENS[0], b"sealed", 0.0)
    assert res.push_id is not None
    net.apply("5", res.effects)
    net.run_until(7.0)  # attempts 0 (no route: ring 1), 1 and 2 (ring 3 over budget)
    pid = res.push_id.hex()
    rings = [r for r in net.tracer.of_kind("push_fallback") if r[3] == pid and r[1] == "5"]
    assert [r[7] for r in rings] == [1]  # ttl column: the ring's radius
    assert any(r[11] == "fallback_budget" for r in net.tracer.of_kind("push_retry") if r[3] == pid)
    assert net.engines[5].stats()["push_fallback_budget_exhausted"] >= 1
    net.apply("0", net.engines[0].register(reg, net.now))
    net.run_until(30.0)
    assert net.custody[res.push_id] == "delivered"
    assert [r for r in net.tracer.of_kind("push_fallback") if r[3] == pid and r[1] == "5"] == rings


def _engine() -> Engine:
    eng = Engine("me", EngineConfig(), verifier=CachingVerifier(), home=MemoryHomeStore(),
                 tracer=ListTracer(TraceLevel.FULL), rng=random.Random(3))
    for p in ("a", "b", "c"):
        eng.peer_up(p, 0.0, outbound=True, addr=f"addr-{p}")
    return eng


def _keepalives(eng: Engine, now: float) -> None:
    for p in eng.active_peers():
        eng.receive_message(p, Keepalive(1, True), now)


def _run_pushes(eng: Engine, reg: Registration, answered_every: int, rounds: int) -> list[Disconnect]:
    """Pushes from c to a (the route), `a` answering one in `answered_every` of them; the rest time out."""
    cuts: list[Disconnect] = []
    now = 1.0
    for i in range(rounds):
        pid = i.to_bytes(16, "big")
        out = eng.receive_message("c", Push(pid, reg.route_id, b"t" * 16, b"x", 30, 1, 0, 0, reg), now)
        assert [e.peer for e in out if isinstance(e, Send) and isinstance(e.msg, Push)] in (["a"], ["b"])
        if i % answered_every == 0:
            eng.receive_message("a", Receipt(pid, ReceiptStatus.STORED, 9), now + 0.3)
        now += 0.5
        _keepalives(eng, now)
        cuts += [e for e in eng.handle_timer(now) if isinstance(e, Disconnect)]
    return cuts


def test_a_neighbour_behind_a_lossy_path_keeps_its_link_and_a_black_hole_does_not() -> None:
    """S1-S2. `a` answers a third of the pushes sent through it (loss and churn behind it): that is
    not a black hole, so its link is never cut (it was, before: -1 per silence, +1 per answer). A
    neighbour that answers nothing is still cut."""
    reg = make_registration(KEY, 1, 0, 3600)
    lossy = _engine()
    lossy.receive_message("a", RegGossip(reg, 10, 2), 0.1)
    assert _run_pushes(lossy, reg, 3, 240) == []
    assert "a" in lossy.active_peers() and not lossy.stats().get("peer_cut_score")
    hole = _engine()
    hole.receive_message("a", RegGossip(reg, 10, 2), 0.1)
    cuts = _run_pushes(hole, reg, 10**9, 240)
    assert [c.peer for c in cuts] == ["a"] and "a" not in hole.active_peers()


def test_wire_ttl_bound() -> None:
    """The TTL fields stay one-byte msgpack fixints, and the defaults sit at the bound."""
    assert limits.MAX_TTL <= 127
    assert EngineConfig().gossip_ttl == limits.MAX_TTL


def test_the_scenario_run_prints_honest_cuts_the_fallback_budget_and_scope_reach(capsys: object) -> None:
    """Through the CLI (inri-sim run --no-adversaries): the summary names the honest links cut by
    scoring, the fallback budget and its effect, and reach within the gossip TTL's scope."""
    import json

    from simulations.cli import main

    assert main(["run", "tiny-50", "--no-adversaries", "--progress", "off", "--trace-level", "off"]) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]  # type: ignore[attr-defined]
    summary = json.loads(out)
    assert summary["cuts_of_honest"] == 0 and summary["cuts_by_reason"] == {}
    assert summary["fallback_budget"] == EngineConfig().fallback_budget
    assert summary["fallback_budget_exhausted"] >= 0 and summary["fallback_messages_max_push"] >= 0
    assert summary["scope_reach"] == summary["route_coverage"] == 1.0
