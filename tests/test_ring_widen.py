"""Rule F4d: a wider ring copy is not stopped by a narrower copy of the same attempt seen first.

Seen on geo-5k-3n-c3l1 seed 2 (stem and route withdrawal on): a custodian's neighbour held a stale route
into a relay whose route had broken; the route-mode copy reached that relay first, its local repair
(radius 2) marked the attempt's ring copy as seen there, and the custodian's wider ring, arriving a few
milliseconds later through another neighbour, was dropped as a duplicate. Every ring, up to 7, died
there, and the push was never delivered although its home stayed up. On the in-memory harness."""

from __future__ import annotations

import os
from dataclasses import replace

from inri.core.api import DisconnectReason
from inri.core.config import EngineConfig
from inri.core.testing import MiniNet
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import Push, Registration

# Custodian 0 reaches the home 8 through 1, then 3-4-5-6-7 (its backup: 2). Relay 2 reaches it through 19,
# a short cut to 5. Relay 3's other way out, 9-10-11, meets the home's other side (11-18-...-12-8) only at
# 11, whose route is through 18; 9 and 10 learnt theirs through 3 and have no other feasible next hop.
# When 3-4 breaks and 19 fails, 2 and 3 have no live next hop: 3's local repair (radius 2) reaches 10 and
# stops there, and a relay with a live route (11) is 5 hops from the custodian, through 2, 3, 9 and 10.
EDGES = [(0, 1), (0, 2), (1, 3), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7), (7, 8), (2, 19), (19, 5),
         (3, 9), (9, 10), (10, 11), (11, 18), (18, 17), (17, 16), (16, 15), (15, 14), (14, 13), (13, 12), (12, 8)]
# 0-2 and 2-3 are slower than 0-1 and 1-3: the route-mode copy through 1 reaches 3 before the ring copy
# through 2. 10-11 is slow, so 11 hears the route from 18 first and 10 from 9.
LATENCY = {(0, 2): 0.03, (2, 0): 0.03, (2, 3): 0.03, (3, 2): 0.03, (10, 11): 0.2, (11, 10): 0.2}
HOME = 8
CFG = replace(EngineConfig(), receipt_timeout_min_s=1.0)


def _net(seed: int) -> tuple[MiniNet, bytes]:
    net = MiniNet(20, EDGES, config=CFG, latency=LATENCY, seed=seed)
    net.run_until(1.0)
    reg = make_registration(new_signing_key(), 1, 0, 3600)
    token = os.urandom(16)
    net.homes[HOME].add_registration(reg, [token])
    net.apply(str(HOME), net.engines[HOME].register(reg, net.now))
    net.run_until(4.0)
    hops = {i: [h for h, _ in net.engines[i].next_hops(reg.route_id)] for i in (0, 1, 2, 3, 9, 10, 11)}
    assert hops == {0: ["1", "2"], 1: ["3"], 2: ["19"], 3: ["4"], 9: ["3"], 10: ["9"], 11: ["18", "10"]}, hops
    for pair in (("3", "4"), ("4", "3")):
        del net.links[pair]
    net.apply("3", net.engines[3].peer_down("4", net.now, DisconnectReason.LINK_LOST))
    net.apply("4", net.engines[4].peer_down("3", net.now, DisconnectReason.LINK_LOST))
    net.kill(19)
    res = net.engines[0].inject_push(reg, token, b"x", net.now)
    assert res.push_id is not None
    net.apply("0", res.effects)
    return net, res.push_id


def test_a_wider_ring_goes_past_a_relay_that_searched_narrower_first() -> None:
    for seed in (1, 2, 3):
        net, pid = _net(seed)
        t0 = net.now
        net.run_until(t0 + 30.0)
        assert (str(HOME), pid) in net.delivered, seed
        assert [p for r, p in net.delivered if p == pid] == [pid], seed  # once
        assert net.custody[pid].value == "delivered", seed
        # The copy that got through left 3 as a ring copy to 9 with more than radius 2's hops left, after
        # 3 had searched with radius 2 for the same attempt.
        wide = [m for a, b, m in net.sent
                if (a, b) == ("3", "9") and isinstance(m, Push) and m.push_id == pid and m.ring > 2]
        assert wide, seed
        assert net.engines[11].stats().get("push_seen_dropped", 0) <= 3, seed


def test_a_ring_copy_no_wider_than_one_seen_still_dies_quietly() -> None:
    """F1 still holds for ring copies: each relay floods a ring of one attempt at most once per wider
    radius, so the search's cost stays bounded (no relay sends more ring copies of one attempt than its
    links times the number of distinct radii that reached it)."""
    for seed in (1, 2, 3):
        net, pid = _net(seed)
        net.run_until(net.now + 30.0)
        per: dict[tuple[str, int], int] = {}
        for a, _b, m in net.sent:
            if isinstance(m, Push) and m.push_id == pid and m.ring:
                per[(a, m.attempt)] = per.get((a, m.attempt), 0) + 1
        for (relay, _attempt), n in per.items():
            assert n <= 3 * 2, (seed, relay, n)  # at most 3 links, at most twice (narrow, then wide)


# Rule C2b. Custodian 0 reaches the home 4 along 0-1-2-3-4; 5 and 6 hang off 0 and learnt the route through
# it (0-5 is fast, 6-2 slow: 6 keeps 2 as a feasible backup). When 0-1 breaks, 0 has no next hop left: its
# ring 1 reaches only 5, whose route leads back to 0 (ring_end); ring 3 reaches 6, which follows 2.
VERDICT_EDGES = [(0, 1), (1, 2), (2, 3), (3, 4), (0, 5), (5, 6), (6, 2)]
VERDICT_LATENCY = {(6, 2): 0.3, (2, 6): 0.3}


VERDICT = replace(CFG, ring_verdict=True)  # C2b is off by default


def _homed(n: int, edges: list[tuple[int, int]], latency: dict[tuple[int, int], float], config: EngineConfig,
           seed: int) -> tuple[MiniNet, Registration, bytes]:
    """n relays on edges, a device homed at relay 4, its route flooded and every relay's round-trip
    estimate taken (keepalives)."""
    net = MiniNet(n, edges, config=config, latency=latency, seed=seed)
    net.run_until(1.0)
    reg = make_registration(new_signing_key(), 1, 0, 3600)
    token = os.urandom(16)
    net.homes[4].add_registration(reg, [token])
    net.apply("4", net.engines[4].register(reg, net.now))
    net.run_until(6.0)
    return net, reg, token


def _cut_and_inject(net: MiniNet, reg: Registration, token: bytes, a: int, b: int, settle: float) -> bytes:
    """The link a-b fails (both ends see it); `settle` seconds later relay 0 takes a push for reg."""
    for pair in ((str(a), str(b)), (str(b), str(a))):
        del net.links[pair]
    net.apply(str(a), net.engines[a].peer_down(str(b), net.now, DisconnectReason.LINK_LOST))
    net.apply(str(b), net.engines[b].peer_down(str(a), net.now, DisconnectReason.LINK_LOST))
    net.run_until(net.now + settle)
    res = net.engines[0].inject_push(reg, token, b"x", net.now)
    assert res.push_id is not None
    net.apply("0", res.effects)
    return res.push_id


def _verdict_net(config: EngineConfig, seed: int) -> tuple[MiniNet, bytes]:
    net, reg, token = _homed(7, VERDICT_EDGES, VERDICT_LATENCY, config, seed)
    assert [h for h, _ in net.engines[5].next_hops(reg.route_id)] == ["0"]
    assert [h for h, _ in net.engines[6].next_hops(reg.route_id)] == ["5", "2"]
    return net, _cut_and_inject(net, reg, token, 0, 1, 0.0)


def _delivered_after(net: MiniNet, pid: bytes, t0: float) -> float:
    net.run_until(t0 + 30.0)
    rows = [r for r in net.tracer.of_kind("push_delivered") if r[3] == pid.hex()]
    assert len(rows) == 1
    return rows[0][0] - t0


def test_a_custodian_ring_that_meets_no_route_is_followed_by_the_next_at_once() -> None:
    """Ring 1's copy dies at 5 and no `repair found` comes back: ring 3 goes after ring 1's round trip, not
    after the attempt's retry period (at least receipt_timeout_min_s, 1 s here; 2 s on the simulated geo
    mesh); ring 3's find at 6 makes the custodian wait for its answer (no ring 5). Delivered in 0.38 s,
    against 1.34 s without the verdict."""
    for seed in (1, 2, 3):
        net, pid = _verdict_net(VERDICT, seed)
        t0 = net.now
        took = _delivered_after(net, pid, t0)
        assert took < CFG.receipt_timeout_min_s, (seed, took)
        assert net.custody[pid].value == "delivered"
        assert net.engines[0].stats().get("custody_ring_verdict", 0) >= 1, seed
        radii = [m.ring for a, b, m in net.sent if a == "0" and isinstance(m, Push) and m.push_id == pid and m.ring]
        assert max(radii) == 3, (seed, radii)  # ring 3 found it: no wider ring was sent
        off, pid_off = _verdict_net(CFG, seed)
        assert _delivered_after(off, pid_off, off.now) >= CFG.receipt_timeout_min_s, seed  # ring 1 waited it out


# Rule C2b, a find that met a hole. Custodian 0's only route is 0-1-2-8-3-4; 8-3 breaks, so 2 keeps a route
# with no live next hop and 1 a stale one through 2. 5 learnt the route through 0 only; 6 has a live way
# through 7 (4-10-11-12-13-7-6). Ring 1 meets 1's stale route (a find) and 5's dead end; the find's copy ends
# in 2's failed search, whose `repair failed` comes back to the custodian.
REFUTE_EDGES = [(0, 1), (1, 2), (2, 8), (8, 3), (3, 4), (0, 5), (5, 6), (6, 7), (7, 13), (13, 12), (12, 11),
                (11, 10), (10, 4)]
REFUTE_LATENCY = {(6, 7): 0.1, (7, 6): 0.1}


def _refute_net(config: EngineConfig, seed: int) -> tuple[MiniNet, bytes]:
    net, reg, token = _homed(14, REFUTE_EDGES, REFUTE_LATENCY, config, seed)
    hops = {i: [h for h, _ in net.engines[i].next_hops(reg.route_id)] for i in (0, 1, 2, 5, 6)}
    assert hops == {0: ["1"], 1: ["2"], 2: ["8"], 5: ["0"], 6: ["5", "7"]}, hops
    return net, _cut_and_inject(net, reg, token, 8, 3, 0.5)


def test_a_ring_whose_find_met_a_hole_waits_its_full_period() -> None:
    """Without F9's note of where the route attempt failed (repair_steer off), 1's find counts, and 2's
    `repair failed` for its copy, coming back later, does not take it back: the ring waits its full retry
    period, as with the verdict off. An error after a find is what a black hole's neighbour reports too,
    and the next ring sent at once spent the push's rings before the hole was scored out (black-holes-1k
    seeds 1-5, never delivered: 3, 3, 18, 5, 2 with the verdict off; 5 and 6 on seeds 1 and 2 when an error
    hurried the next ring)."""
    for seed in (1, 2, 3):
        net, pid = _refute_net(replace(VERDICT, repair_steer=False), seed)
        took = _delivered_after(net, pid, net.now)
        assert net.engines[0].stats().get("custody_ring_verdict", 0) == 0, seed
        off, pid_off = _refute_net(replace(CFG, repair_steer=False), seed)
        assert took == _delivered_after(off, pid_off, off.now), seed


def test_a_find_on_the_path_that_just_failed_is_no_find() -> None:
    """The route attempt's `repair failed` came back through 1 (F9 notes it); ring 1's find at 1 is that
    same stale route into 2, so it does not hold the ring: ring 3 goes after ring 1's round trip (1.29 s,
    against 3.15 s with the verdict off)."""
    for seed in (1, 2, 3):
        net, pid = _refute_net(VERDICT, seed)
        took = _delivered_after(net, pid, net.now)
        assert net.engines[0].stats().get("custody_ring_find_stale", 0) >= 1, seed
        assert net.engines[0].stats().get("custody_ring_verdict", 0) >= 1, seed
        off, pid_off = _refute_net(CFG, seed)
        took_off = _delivered_after(off, pid_off, off.now)
        assert took_off - took >= CFG.receipt_timeout_min_s, (seed, took, took_off)


def test_a_find_whose_copy_met_the_tried_path_is_taken_back() -> None:
    """Relay 9, a neighbour of the custodian, reaches the home only through 1: ring 1's find at 9 sends its
    route copy to 1, which had the attempt's ring copy already and answers `duplicate`; passed back to the
    custodian, it takes 9's find back (F8c's refutation, for a custodian's ring), so nothing holds the
    ring and ring 3 goes after ring 1's round trip."""
    edges = REFUTE_EDGES + [(0, 9), (9, 1)]
    for seed in (1, 2, 3):
        times = {}
        for name, cfg in (("on", VERDICT), ("off", CFG)):
            net, reg, token = _homed(14, edges, REFUTE_LATENCY, cfg, seed)
            assert [h for h, _ in net.engines[9].next_hops(reg.route_id)][0] == "1"
            pid = _cut_and_inject(net, reg, token, 8, 3, 0.5)
            times[name] = _delivered_after(net, pid, net.now)
            if name == "on":
                assert net.engines[0].stats().get("custody_ring_find_refuted", 0) >= 1, seed
        assert times["off"] - times["on"] >= CFG.receipt_timeout_min_s, (seed, times)
