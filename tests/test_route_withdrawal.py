"""Rule G12, route withdrawal (issue 42 item 1), on the engine through MiniNet: a relay that loses its last
live next hop tells its neighbours, and one with another next hop absorbs it; the neighbours of a home
whose link goes withdraw its routes, custodians park pushes for it without searching, and the home's
return delivers them; withdrawals from relays that are not next hops, floods of them and malformed frames
change nothing."""

from __future__ import annotations

from dataclasses import replace

import msgpack

from inri.core.api import CustodyStatus, DisconnectReason, Send
from inri.core.config import EngineConfig
from inri.core.stem import REGEN_BURST, REGEN_PER_S
from inri.core.testing import MiniNet
from inri.core.withdrawals import ENTRIES_IN_BURST, FRAMES_PER_TICK, HOLD_S
from inri.protocol import limits
from inri.protocol.codec import encode, make_registration
from inri.protocol.keys import new_signing_key, receipt_public_key
from inri.protocol.messages import (
    ErrorCode,
    ErrorFrame,
    MessageType,
    Push,
    RegGossip,
    Registration,
    RouteWithdraw,
    WithdrawKind,
    WithdrawnRoute,
)
from tests.test_core_engine import EDGES, KEY, SLOW, TOKENS, push

ON = replace(EngineConfig(), route_withdrawal=True)
# The device's receipt key, whose private half its homes hold: a home signs route generations with it (G10,
# G13).
RECEIPT_SECRET = bytes([0x42]) * 32


def net_with(edges: list[tuple[int, int]], n: int, config: EngineConfig = ON, *, receipt: bool = True,
             **kw: object) -> tuple[MiniNet, Registration]:
    """n relays on edges, a device homed at relay 0 (with a receipt key unless receipt is False), its
    registration flooded."""
    net = MiniNet(n, edges, config=config, **kw)  # type: ignore[arg-type]
    reg = make_registration(KEY, 1, 0, 3600, receipt_public_key(RECEIPT_SECRET) if receipt else None)
    net.homes[0].add_registration(reg, TOKENS, RECEIPT_SECRET if receipt else None)
    net.apply("0", net.engines[0].register(reg, 0.0))
    net.run_until(1.0)
    return net, reg


def cut(net: MiniNet, a: int, b: int) -> None:
    """The link a-b fails: both ends see it go."""
    del net.links[(str(a), str(b))], net.links[(str(b), str(a))]
    net.apply(str(a), net.engines[a].peer_down(str(b), net.now, DisconnectReason.LINK_LOST))
    net.apply(str(b), net.engines[b].peer_down(str(a), net.now, DisconnectReason.LINK_LOST))


def withdrawals(net: MiniNet, since: int = 0) -> list[tuple[str, str, WithdrawnRoute]]:
    """(from, to, entry) of every RouteWithdraw entry sent after net.sent[since]."""
    return [(a, b, w) for a, b, m in net.sent[since:] if isinstance(m, RouteWithdraw) for w in m.entries]


# 0 (home) - 1 - 2 - 5 and 0 - 3 - 4 - 5: relay 5 has two next hops (2 and 4); relay 6 hangs off 2 alone.
FORK = [(0, 1), (1, 2), (2, 5), (0, 3), (3, 4), (4, 5), (2, 6)]


def test_a_withdrawal_reaches_upstream_relays_and_is_absorbed_where_another_next_hop_is_left() -> None:
    net, reg = net_with(FORK, 7)
    rid = reg.route_id
    assert sorted(net.engines[5].next_hops(rid)) == [("2", 3), ("4", 3)]
    assert net.engines[6].next_hops(rid) == [("2", 3)]
    mark = len(net.sent)
    cut(net, 1, 2)  # 2 loses its only next hop (not the home: `no route`)
    net.run_until(net.now + 1.0)
    sent = withdrawals(net, mark)
    assert {(a, b) for a, b, w in sent if w.kind == WithdrawKind.NO_ROUTE} == {("2", "5"), ("2", "6"), ("6", "2")}
    assert net.engines[5].next_hops(rid) == [("4", 3)]  # absorbed: 4 is left, nothing sent on from 5
    assert net.engines[5].counters["withdraw_absorbed"] == 1
    # 5 answers 2's withdrawal (its route request) with its distance, 3: not below 2's feasibility
    # distance (2), so 2 does not take it (it could lead through 2: Babel's feasibility condition).
    assert [(a, b, w.hops) for a, b, w in sent if w.kind == WithdrawKind.RESTORED] == [("5", "2", 3)]
    assert net.engines[2].counters["withdraw_unfeasible"] == 1
    assert [p for p, _ in net.engines[2].next_hops(rid)] == ["1"]  # (its link is down)
    assert net.engines[6].next_hops(rid) == []  # its last next hop withdrew: gone, and told on (to 2)
    # No push waits for the route at 2: no route request (G13: its answer would cost a flood).
    assert not [w for _, _, w in sent if w.kind == WithdrawKind.REQUEST]
    # A push from 5 takes the route left, with no search.
    pid = push(net, 5, reg, TOKENS[0])
    net.run_until(net.now + 2.0)
    assert net.custody[pid] == CustodyStatus.DELIVERED
    assert not [m for _, _, m in net.sent if isinstance(m, Push) and m.push_id == pid and m.ring]


def search_frames(net: MiniNet, pid: bytes) -> int:
    return sum(1 for _, _, m in net.sent if isinstance(m, Push) and m.push_id == pid and m.ring)


def test_custodians_park_pushes_for_a_home_that_is_down_and_its_return_delivers_them_once() -> None:
    net, reg = net_with(EDGES, 8, latency=SLOW)
    net.kill(0)  # its only neighbour, 1, sees the link go: `home down`, withdrawn all along
    net.run_until(net.now + 1.0)
    for i in range(1, 8):
        assert net.engines[i]._withdrawals.home_down(reg.route_id), i
    pids = [push(net, at, reg, TOKENS[k]) for k, at in enumerate((5, 7, 1))]
    net.run_until(net.now + HOLD_S - 2.0)  # the whole escalation (route, backups, rings) and parked re-sends
    for pid in pids:
        assert pid not in net.custody
        assert sum(1 for _, _, m in net.sent if isinstance(m, Push) and m.push_id == pid) == 0  # no copy at all
    net.restart(0)  # back on its link to 1: 1 restores, and the restore goes on to every relay
    t = net.now
    net.run_until(t + 3.0)
    for pid in pids:
        assert net.custody.get(pid) == CustodyStatus.DELIVERED
        assert sum(1 for d in net.delivered if d[1] == pid) == 1
        assert search_frames(net, pid) == 0
    assert all(not net.engines[i]._withdrawals.home_down(reg.route_id) for i in range(1, 8))


def test_a_withdrawal_is_held_for_hold_s_then_the_push_searches_as_before() -> None:
    """A home whose route was withdrawn may be up (one of its links lost, back on other links): past HOLD_S
    the dropped next hops serve again and a parked push searches (C3), rather than wait to its TTL."""
    net, reg = net_with(EDGES, 8, latency=SLOW)
    net.kill(0)
    net.run_until(net.now + 1.0)
    pid = push(net, 5, reg, TOKENS[0])
    net.run_until(net.now + HOLD_S - 2.0)
    assert sum(1 for _, _, m in net.sent if isinstance(m, Push) and m.push_id == pid) == 0
    net.run_until(net.now + 60.0)
    assert not net.engines[5]._withdrawals.home_down(reg.route_id)
    assert net.engines[4].next_hops(reg.route_id) == [("3", 4)]  # taken back
    assert sum(1 for _, _, m in net.sent if isinstance(m, Push) and m.push_id == pid) > 0


def test_without_withdrawal_the_same_pushes_search() -> None:
    """The bar the test above holds against: with the rule off, the custodians search rings for the home."""
    net, reg = net_with(EDGES, 8, config=EngineConfig(), latency=SLOW)
    net.kill(0)
    net.run_until(net.now + 1.0)
    pid = push(net, 5, reg, TOKENS[0])
    net.run_until(net.now + 200.0)
    assert search_frames(net, pid) > 0


def test_a_withdrawal_from_a_neighbour_that_is_not_a_next_hop_is_ignored() -> None:
    net, reg = net_with(EDGES, 8, latency=SLOW)
    rid = reg.route_id
    assert net.engines[3].next_hops(rid) == [("2", 3)]  # 7 is a neighbour of 3, not its next hop
    lie = RouteWithdraw((WithdrawnRoute(rid, reg.epoch, WithdrawKind.HOME_DOWN, 0),))
    mark = len(net.sent)
    net.apply("3", net.engines[3].receive_message("7", lie, net.now))
    net.run_until(net.now + 1.0)
    assert net.engines[3].next_hops(rid) == [("2", 3)]
    assert not net.engines[3]._withdrawals.home_down(rid)
    # Its route request is answered (G13: a `home down` at any distance; the withdrawer takes one farther
    # than 1 hop only by asking for a newer route), and nothing else is sent.
    assert [(a, b, w.kind, w.hops) for a, b, w in withdrawals(net, mark)] == [("3", "7", WithdrawKind.RESTORED, 3)]
    assert net.engines[3].counters["withdraw_ignored"] == 1
    # Nor does a restore from a neighbour this relay dropped nothing for add a next hop.
    fake = RouteWithdraw((WithdrawnRoute(rid, reg.epoch, WithdrawKind.RESTORED, 0),))
    net.apply("3", net.engines[3].receive_message("7", fake, net.now))
    assert net.engines[3].next_hops(rid) == [("2", 3)]
    pid = push(net, 5, reg, TOKENS[0])
    net.run_until(net.now + 2.0)
    assert net.custody[pid] == CustodyStatus.DELIVERED


def test_a_flood_of_withdrawals_is_rate_bounded_on_the_way_in_and_out() -> None:
    net, reg = net_with(EDGES, 8, latency=SLOW)
    rid = reg.route_id
    eng = net.engines[3]
    junk = [WithdrawnRoute(bytes([i % 256, i // 256]) * 8, 1, WithdrawKind.NO_ROUTE, 0) for i in range(4096)]
    frames = [RouteWithdraw(tuple(junk[i:i + limits.MAX_WITHDRAWN_ROUTES]))
              for i in range(0, len(junk), limits.MAX_WITHDRAWN_ROUTES)]
    frames.append(RouteWithdraw((WithdrawnRoute(rid, reg.epoch, WithdrawKind.HOME_DOWN, 0),)))  # its real next hop
    out = []
    for f in frames:  # 4,097 entries at one instant from 3's next hop, 2
        out += eng.receive_message("2", f, net.now)
    assert eng.counters["withdraw_over_budget"] == len(junk) + 1 - ENTRIES_IN_BURST
    assert eng.counters["withdraw_ignored"] == ENTRIES_IN_BURST  # unknown route ids: nothing to cut
    assert eng.next_hops(rid) == [("2", 3)] and out == []  # the entry over the budget was not heeded
    # Out: 600 routes lost at once leave in FRAMES_PER_TICK frames per neighbour per keepalive interval.
    hub = net_with([(0, 1), (1, 2)], 3)[0]
    for i in range(600):  # 600 more routes learnt from the home 0 (written into 1's table directly)
        hub.engines[1]._routes.set_first(bytes([i % 256, i // 256]) * 8, 1, 3600.0, "0", 1)
    mark = len(hub.sent)
    hub.kill(0)
    first = [m for a, b, m in hub.sent[mark:] if isinstance(m, RouteWithdraw) and (a, b) == ("1", "2")]
    assert len(first) == FRAMES_PER_TICK  # 512 of 601 now
    hub.run_until(hub.now + hub.config.keepalive_interval_s + 0.1)
    later = [m for a, b, m in hub.sent[mark:] if isinstance(m, RouteWithdraw) and (a, b) == ("1", "2")]
    assert sum(len(m.entries) for m in later) == 601  # the rest on the next tick


def test_a_malformed_withdrawal_frame_gets_an_error_frame() -> None:
    net, reg = net_with(EDGES, 8, latency=SLOW)
    eng = net.engines[3]
    good = [reg.route_id, reg.epoch, int(WithdrawKind.HOME_DOWN), 0]
    bad_frames = [
        [int(MessageType.ROUTE_WITHDRAW), limits.PROTOCOL_VERSION, []],  # no entries
        [int(MessageType.ROUTE_WITHDRAW), limits.PROTOCOL_VERSION, [[*good[:3], 5]]],  # a withdrawal with hops
        [int(MessageType.ROUTE_WITHDRAW), limits.PROTOCOL_VERSION, [[good[0], good[1], 9, 0]]],  # no such kind
        [int(MessageType.ROUTE_WITHDRAW), limits.PROTOCOL_VERSION, [good[:3]]],  # a field short
        [int(MessageType.ROUTE_WITHDRAW), limits.PROTOCOL_VERSION, [good] * (limits.MAX_WITHDRAWN_ROUTES + 1)],
    ]
    for raw in bad_frames:
        effects = eng.receive_frame("2", msgpack.packb(raw), net.now)
        errors = [e for e in effects if isinstance(e, Send) and isinstance(e.msg, ErrorFrame)]
        assert len(errors) == 1 and errors[0].msg.code == ErrorCode.MALFORMED and errors[0].peer == "2"  # type: ignore[attr-defined]
    # The well-formed frame decodes and is heeded (2 is 3's next hop), on a relay that heard no bad frame.
    net, reg = net_with(EDGES, 8, latency=SLOW)
    eng = net.engines[3]
    assert eng.next_hops(reg.route_id) == [("2", 3)]
    eng.receive_frame("2", encode(RouteWithdraw((WithdrawnRoute(*good[:2], WithdrawKind.HOME_DOWN, 0),))), net.now)
    assert eng.next_hops(reg.route_id) == []


def test_a_relay_back_on_its_link_does_not_restore_a_route_to_a_home_that_is_down() -> None:
    """4 holds the route through 2 and 3; 3 fails, then the home: 4 withdraws it as `home down`. 3 comes
    back (with whatever routes it kept): its link alone says nothing of the home, so 4 keeps the route
    withdrawn and sends no restore; the home's own return restores it."""
    net, reg = net_with([(0, 1), (1, 2), (2, 4), (0, 5), (5, 3), (3, 4)], 6)
    rid = reg.route_id
    assert sorted(net.engines[4].next_hops(rid)) == [("2", 3), ("3", 3)]
    net.kill(3)
    net.run_until(net.now + 1.0)
    net.kill(0)
    net.run_until(net.now + 1.0)
    assert net.engines[4]._withdrawals.home_down(rid)
    mark = len(net.sent)
    net.restart(3)
    net.run_until(net.now + 5.0)
    assert net.engines[4]._withdrawals.home_down(rid)
    assert [w for a, _, w in withdrawals(net, mark) if a == "4" and w.kind == WithdrawKind.RESTORED] == []
    net.restart(0)
    net.run_until(net.now + 5.0)
    assert not net.engines[4]._withdrawals.home_down(rid)
    pid = push(net, 4, reg, TOKENS[0])
    net.run_until(net.now + 2.0)
    assert net.custody[pid] == CustodyStatus.DELIVERED


def test_a_relay_that_missed_a_withdrawal_is_told_again_when_it_uses_the_route() -> None:
    """4's withdrawal to 5 is lost (the 4 -> 5 direction drops frames for a second): 5's first push goes to
    4, which answers `home unreachable` and withdraws the route to 5 again; 5's next push is parked."""
    net, reg = net_with(EDGES, 8, latency=SLOW)
    lat = net.links.pop(("4", "5"))
    net.kill(0)
    net.run_until(net.now + 1.0)
    net.links[("4", "5")] = lat
    assert not net.engines[5]._withdrawals.home_down(reg.route_id)
    first = push(net, 5, reg, TOKENS[0])
    net.run_until(net.now + 1.0)
    assert net.engines[5]._withdrawals.home_down(reg.route_id)
    assert net.engines[4].counters["withdraw_told_again"] == 1
    second = push(net, 5, reg, TOKENS[1])
    net.run_until(net.now + 60.0)
    assert sum(1 for _, _, m in net.sent if isinstance(m, Push) and m.push_id == second) == 0
    assert search_frames(net, first) == 0


def test_a_home_blamed_before_it_fails_is_withdrawn_all_the_same() -> None:
    """A dying home is often blamed by its neighbour first (F6): its link then goes with a low score, which
    purges its route claims; the neighbour withdraws the home's routes before the purge."""
    net, reg = net_with(EDGES, 8, latency=SLOW)
    net.engines[1]._linked["0"].score = net.config.score_prefer_below - 1.0
    net.kill(0)
    net.run_until(net.now + 1.0)
    assert net.engines[1].next_hops(reg.route_id) == []  # purged
    for i in range(1, 8):
        assert net.engines[i]._withdrawals.home_down(reg.route_id), i


def test_a_neighbour_cut_for_its_score_has_its_routes_withdrawn_but_not_as_home_down() -> None:
    """Relay 1 cuts the home 0 for bad frames (S2: its route claims are purged): the routes it was the home
    of are withdrawn first, all along the line, as `no route`: a relay cut for its score is no witness that
    a home it claims is down (a hijacker claims every route at hop 0), so no push is parked for it; a push
    from 5 searches as before G12."""
    net, reg = net_with(EDGES, 8, latency=SLOW)
    eng = net.engines[1]
    mark = len(net.sent)
    for _ in range(100):
        net.apply("1", eng.receive_frame("0", b"\xc1", net.now))
        if "0" not in eng._linked:
            break
    assert "0" not in eng._linked and eng.counters["peer_cut_score"] == 1
    net.run_until(net.now + 1.0)
    sent = [(a, w.kind) for a, _, w in withdrawals(net, mark)]
    assert {a for a, k in sent if k == WithdrawKind.NO_ROUTE} == {str(i) for i in range(1, 8)}  # all withdrew
    assert not [a for a, k in sent if k == WithdrawKind.HOME_DOWN]  # none as `home down`
    for i in range(1, 8):
        assert net.engines[i].next_hops(reg.route_id) == [], i
        assert not net.engines[i]._withdrawals.home_down(reg.route_id), i
    pid = push(net, 5, reg, TOKENS[0])
    net.run_until(net.now + 5.0)
    assert not parked(net, pid)


def parked(net: MiniNet, pid: bytes) -> bool:
    """No copy of pid was sent at all."""
    return not any(isinstance(m, Push) and m.push_id == pid for _, _, m in net.sent)


def test_a_home_back_on_another_link_restores_the_relays_it_is_feasible_for() -> None:
    """The line 0 (home) - 1 - 2 - 3 - 4 - 5: the home fails and comes back linked to 5 instead of 1. 5
    restores the route at distance 1, and the push parked at 4 is delivered once, with no search: 4 takes 5's
    restore (distance 1: its sender is linked to a home), or, when the push's retry comes first, its route
    request (G13) reaches the home through 5 and the new generation's flood brings the route to every relay.
    (Without a push waiting, 3, 2 and 1 would stay withdrawn: home_back_on_another_link, below.)"""
    net, reg = net_with([(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)], 6)
    rid = reg.route_id
    net.kill(0)
    net.run_until(net.now + 1.0)
    assert all(net.engines[i]._withdrawals.home_down(rid) for i in range(1, 6))
    pid = push(net, 4, reg, TOKENS[0])
    net.run_until(net.now + 10.0)
    assert parked(net, pid)
    del net.links[("0", "1")], net.links[("1", "0")]
    net.links[("0", "5")] = net.links[("5", "0")] = 0.01
    net.restart(0)
    net.run_until(net.now + 3.0)
    assert net.custody.get(pid) == CustodyStatus.DELIVERED
    assert sum(1 for d in net.delivered if d[1] == pid) == 1 and search_frames(net, pid) == 0
    assert [net.engines[i].next_hops(rid)[0] for i in (5, 4)] == [("0", 1), ("5", 2)]


def home_back_on_another_link(*, receipt: bool = True) -> tuple[MiniNet, Registration]:
    """The line 0 (home) - 1 - 2 - 3 - 4 - 5: the home fails (every relay withdraws `home down`) and comes
    back linked to 5 instead of 1; 5 and 4 take it back (distance 0 and 1), 3, 2 and 1 stay withdrawn."""
    net, reg = net_with([(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)], 6, receipt=receipt)
    net.kill(0)
    net.run_until(net.now + 1.0)
    del net.links[("0", "1")], net.links[("1", "0")]
    net.links[("0", "5")] = net.links[("5", "0")] = 0.01
    net.restart(0)
    net.run_until(net.now + 3.0)
    assert all(net.engines[i]._withdrawals.home_down(reg.route_id) for i in (1, 2, 3))
    return net, reg


def test_a_push_parked_for_a_route_no_relay_may_take_asks_the_home_for_a_newer_one() -> None:
    """G13 (Babel's seqno request): a push parked at 1 has it ask its neighbours (it was offered no route);
    2 passes the request on, 3 passes it to 4, which offered a route (distance 2, not taken for a `home
    down`), 4 along its live route to 5 and the home 0, which issues the next route generation (G10, under
    the receipt key). Its flood replaces every relay's route of the epoch: the push goes the new way, once,
    with no search, and no relay is left withdrawn."""
    net, reg = home_back_on_another_link()
    rid = reg.route_id
    mark = len(net.sent)
    pid = push(net, 1, reg, TOKENS[0])
    net.run_until(net.now + 3.0)
    sent = withdrawals(net, mark)
    assert [(a, b) for a, b, w in sent if w.kind == WithdrawKind.REQUEST] == [
        ("1", "2"), ("2", "3"), ("3", "4"), ("4", "5"), ("5", "0")]
    assert net.engines[0].counters["route_regenerated_home"] == 1
    assert net.custody.get(pid) == CustodyStatus.DELIVERED
    assert sum(1 for d in net.delivered if d[1] == pid) == 1 and search_frames(net, pid) == 0
    assert [net.engines[i].next_hops(rid)[0] for i in (1, 2, 3)] == [("2", 5), ("3", 4), ("4", 3)]
    assert not any(net.engines[i]._withdrawals.home_down(rid) for i in range(1, 6))


def test_without_a_receipt_key_the_home_issues_no_generation_and_the_push_waits() -> None:
    """The same, but the registration has no receipt key (the home cannot sign a generation): the request
    reaches the home and nothing is flooded; the push stays parked (HOLD_S, then C3 as before G13)."""
    net, reg = home_back_on_another_link(receipt=False)
    pid = push(net, 1, reg, TOKENS[0])
    net.run_until(net.now + 10.0)
    assert net.engines[0].counters["route_requests_home"] == 1
    assert net.engines[0].counters["route_regenerate_refused"] == 1
    assert "route_regenerated_home" not in net.engines[0].counters
    assert parked(net, pid) and pid not in net.custody


def test_a_home_that_loses_one_of_two_links_leaves_no_relay_behind_parked() -> None:
    """Home 0 linked to 1 and 3; 2 (and 5 behind it) learnt the route through 1 first (the 3 - 2 link is
    slow) and keep one next hop (route_k 1: with room, 2 would hold 3 as a backup). The 0 - 1 link
    fails: 1 withdraws `home down`, and so does 2 (1 was its only next hop); its withdrawal asks 3,
    which still reaches the home at distance 1 and answers: 2 takes it (1 < 2) and restores 5.
    A push from 5 is delivered at once, with no search. 1 itself goes round through 6, linked to the home
    (distance 1: taken whatever 1's feasibility distance, 1: no route of 6 can lead through 1)."""
    slow = {(3, 2): 0.05, (2, 3): 0.05, (6, 0): 0.05, (0, 6): 0.05}
    net, reg = net_with([(0, 1), (0, 3), (1, 2), (3, 2), (2, 5), (1, 6), (6, 0)], 7, config=replace(ON, route_k=1),
                        latency=slow)
    rid = reg.route_id
    assert net.engines[2].next_hops(rid) == [("1", 2)]
    cut(net, 0, 1)
    net.run_until(net.now + 1.0)
    assert net.engines[2].next_hops(rid)[0] == ("3", 2)
    assert not net.engines[2]._withdrawals.home_down(rid) and not net.engines[5]._withdrawals.home_down(rid)
    assert net.engines[1].next_hops(rid)[0] == ("6", 2) and not net.engines[1]._withdrawals.home_down(rid)
    pids = [push(net, at, reg, TOKENS[k]) for k, at in enumerate((5, 1))]
    net.run_until(net.now + 2.0)
    for pid in pids:
        assert net.custody.get(pid) == CustodyStatus.DELIVERED and search_frames(net, pid) == 0


def test_a_home_of_two_fails_and_its_side_fails_over_to_the_other_home() -> None:
    """One route id homed at 0 and at 5 (homes in two places) on the line 0 - 1 - 2 - 3 - 4 - 5, each relay
    keeping one next hop (route_k 1): all route to 0, whose flood came first. 0 fails: the withdrawal runs
    down the line to 4, whose request the other home 5 answers (distance 0); 4 and 3 take it and a push
    from 3 reaches 5, with no search."""
    net, reg = net_with([(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)], 6, config=replace(ON, route_k=1))
    rid = reg.route_id
    net.homes[5].add_registration(reg, TOKENS, RECEIPT_SECRET)
    net.apply("5", net.engines[5].register(reg, net.now))
    net.run_until(net.now + 1.0)
    assert net.engines[4].next_hops(rid) == [("3", 4)]  # 5's flood came later, with no room left
    net.kill(0)
    net.run_until(net.now + 1.0)
    assert net.engines[4].next_hops(rid) == [("5", 1)] and net.engines[3].next_hops(rid) == [("4", 2)]
    pid = push(net, 3, reg, TOKENS[0])
    net.run_until(net.now + 2.0)
    assert net.custody.get(pid) == CustodyStatus.DELIVERED and search_frames(net, pid) == 0
    assert net.delivered == [("5", pid)]


def test_the_far_side_of_a_failed_home_of_two_asks_the_other_home_for_a_newer_route() -> None:
    """The same two homes; 3 takes 4's restore (distance 1), but 2 and 1 may not take 3's (distance 2, for a
    route withdrawn as `home down`). A push parked at 1 asks (G13): the request crosses 2 (withdrawn, it
    passes it on) to 3, which routes to 5 now, and along its route to 5, the other home, which issues the
    next route generation: its flood gives 2 and 1 the route to 5, and the push is delivered there, with no
    search and no relay left withdrawn."""
    net, reg = net_with([(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)], 6, config=replace(ON, route_k=1))
    rid = reg.route_id
    net.homes[5].add_registration(reg, TOKENS, RECEIPT_SECRET)
    net.apply("5", net.engines[5].register(reg, net.now))
    net.run_until(net.now + 1.0)
    net.kill(0)
    net.run_until(net.now + 1.0)
    assert net.engines[1]._withdrawals.home_down(rid) and net.engines[2]._withdrawals.home_down(rid)
    pid = push(net, 1, reg, TOKENS[0])
    net.run_until(net.now + 3.0)
    assert net.engines[5].counters["route_regenerated_home"] == 1
    assert net.custody.get(pid) == CustodyStatus.DELIVERED and search_frames(net, pid) == 0
    assert net.delivered == [("5", pid)]
    assert [net.engines[i].next_hops(rid) for i in (1, 2)] == [[("2", 4)], [("3", 3)]]
    assert not any(net.engines[i]._withdrawals.any() for i in range(1, 6))


def test_route_requests_cost_a_bounded_number_of_generations() -> None:
    """A neighbour that sends a home route requests for its route ids over and over (a hostile relay, or
    many custodians) gets one generation per route id per stem_embargo_s, and REGEN_PER_S a second over
    all route ids after a burst of REGEN_BURST; each generation costs one flood."""
    regs = [make_registration(new_signing_key(), 1, 0, 3600, receipt_public_key(RECEIPT_SECRET))
            for _ in range(int(REGEN_BURST) + 10)]
    net = MiniNet(3, [(0, 1), (1, 2)], config=ON)
    for reg in regs:
        net.homes[0].add_registration(reg, TOKENS, RECEIPT_SECRET)
        net.apply("0", net.engines[0].register(reg, 0.0))
    net.run_until(1.0)
    home = net.engines[0]
    for _ in range(3):  # the same requests three times within stem_embargo_s
        for i in range(0, len(regs), limits.MAX_WITHDRAWN_ROUTES):
            frame = RouteWithdraw(tuple(WithdrawnRoute(r.route_id, 1, WithdrawKind.REQUEST, 5)
                                        for r in regs[i:i + limits.MAX_WITHDRAWN_ROUTES]))
            net.apply("0", home.receive_message("1", frame, net.now))
    assert home.counters["route_requests_home"] == 3 * len(regs)
    assert home.counters["route_regenerated_home"] == REGEN_BURST  # the burst, then the budget
    assert home.counters["route_regenerate_paced"] == 2 * REGEN_BURST  # the same route ids again
    assert home.counters["route_regenerate_over_budget"] == 3 * (len(regs) - REGEN_BURST)
    net.run_until(net.now + ON.stem_embargo_s + 1.0)  # paced no more, and the budget has refilled 11 s
    frame = RouteWithdraw(tuple(WithdrawnRoute(r.route_id, 1, WithdrawKind.REQUEST, 5) for r in regs))
    net.apply("0", home.receive_message("1", frame, net.now))
    assert home.counters["route_regenerated_home"] == REGEN_BURST + int((ON.stem_embargo_s + 1.0) * REGEN_PER_S)


def test_an_answer_over_a_stale_route_that_leads_back_is_not_taken() -> None:
    """EDGES with slow links 1 - 6 - 7 - 3: when the home 0 fails, 7 still routes through 6 (distance 3)
    when 3 has withdrawn the route. A `restored` from 7 then (a neighbour the wave has not reached, or one
    that lies) would lead back into the dead home: 3's feasibility distance is 3, so it is not taken, and
    every relay ends withdrawn with nothing restored. (7 answers 3's `home down` itself, over its route
    through 6 at distance 3: 3 does not take it, it asks 7 for a newer route (G13), and the request dies at
    6, which has no route left: no generation, nothing restored.)"""
    net, reg = net_with(EDGES, 8, latency=SLOW)
    rid = reg.route_id
    mark = len(net.sent)
    net.kill(0)
    net.run_until(net.now + 0.03)
    assert net.engines[3]._withdrawals.home_down(rid) and ("6", 3) in net.engines[7].next_hops(rid)
    stale = RouteWithdraw((WithdrawnRoute(rid, reg.epoch, WithdrawKind.RESTORED, 3),))
    net.apply("3", net.engines[3].receive_message("7", stale, net.now))
    net.run_until(net.now + 1.0)
    sent = withdrawals(net, mark)
    assert [(a, b, w.hops) for a, b, w in sent if w.kind == WithdrawKind.RESTORED] == [("7", "3", 3)]
    assert net.engines[3].counters["withdraw_unfeasible"] == 2  # the stale restore, and 7's answer
    # A push parked at 3 asks 7 (G13); 7, withdrawn since, passes the request to its other neighbours, and
    # so on across the withdrawn relays, each once: none has a live route, no home gets it, nothing is taken.
    mark = len(net.sent)
    pid = push(net, 3, reg, TOKENS[0])
    net.run_until(net.now + 5.0)
    requests = [(a, b) for a, b, w in withdrawals(net, mark) if w.kind == WithdrawKind.REQUEST]
    assert requests[0] == ("3", "7")
    senders = [a for a, _ in requests]
    assert "0" not in senders and all(senders.count(a) <= 2 for a in senders)  # each relay once (to <= 2)
    for i in range(1, 8):
        assert net.engines[i]._withdrawals.home_down(rid), i
        assert not any(net.engines[i].counters.get(k) for k in ("withdraw_answer_taken", "withdraw_restored_by",
                                                                "route_requests_home")), i
    assert parked(net, pid)


# -- G12 with the stem on (rule G7: only the home's stem successor holds the home as its next hop) ---------

STEM_ON = replace(ON, stem=True, stem_embargo_s=5.0, stem_fluff_probability=0.5)


def stem_net_with(seed: int, stem_len: int = 1) -> tuple[MiniNet, Registration, list[str]]:
    """A 24-relay ring lattice (4 neighbours each), stem and withdrawal on, a device homed at relay 0 with a
    receipt key, whose stem passed at least stem_len distinct relays (the first seed from `seed` on that
    gives one): (net, registration, the stem relays in order)."""
    from tests.test_stem import ring_lattice
    for s in range(seed, seed + 60):
        net = MiniNet(24, ring_lattice(24), config=STEM_ON, wire=True, seed=s)
        reg = make_registration(KEY, 1, 0, 3600, receipt_public_key(RECEIPT_SECRET))
        net.homes[0].add_registration(reg, TOKENS, RECEIPT_SECRET)
        net.apply("0", net.engines[0].register(reg, 0.0))
        net.run_until(2.0)
        stem = [b for _, b, m in net.sent if isinstance(m, RegGossip) and m.stem]
        if len(stem) >= stem_len and len(set(stem)) == len(stem) and "0" not in stem:
            assert net.engines[int(stem[0])].next_hops(reg.route_id) == [("0", 2)]  # G7: its stem route home
            return net, reg, stem
    raise AssertionError(f"no seed gave a stem of {stem_len} relays")


def test_with_the_stem_on_a_home_that_fails_is_withdrawn_as_home_down_from_its_stem_successor() -> None:
    """The home's stem successor cannot tell its predecessor is the home (G6); it withdraws the route as
    `home down` when that link goes, whoever it was, and the wave reaches every relay: custodians park pushes
    for the dead home with no search (they searched before: `no route`), and the home's re-stem on its
    return (G10, a new route generation) ends every withdrawal and delivers them once."""
    for seed in (1, 2, 3):
        net, reg, stem = stem_net_with(seed * 10)
        succ = stem[0]
        rid = reg.route_id
        net.kill(0)
        net.run_until(net.now + 1.0)
        assert net.engines[int(succ)]._withdrawals.home_down(rid)
        for i in range(1, 24):
            assert net.engines[i]._withdrawals.home_down(rid), (seed, i)
        pids = [push(net, at, reg, TOKENS[k]) for k, at in enumerate((12, 13, int(succ)))]
        net.run_until(net.now + 60.0)
        for pid in pids:
            assert pid not in net.custody
            assert sum(1 for _, _, m in net.sent if isinstance(m, Push) and m.push_id == pid) == 0, seed
        net.restart(0)
        net.run_until(net.now + 10.0)
        for pid in pids:
            assert net.custody.get(pid) == CustodyStatus.DELIVERED, seed
            assert sum(1 for d in net.delivered if d[1] == pid) == 1
            assert search_frames(net, pid) == 0
        assert all(not net.engines[i]._withdrawals.home_down(rid) for i in range(1, 24))


def test_with_the_stem_on_a_failed_stem_relay_is_withdrawn_until_the_home_re_stems_around_it() -> None:
    """The home is up and its stem successor fails (a stem relay, not the fluff relay): the relays below the
    break withdraw `home down` (they cannot tell it from the home's failure), and the home's re-stem (G10),
    a newer route generation, ends the withdrawals: a push parked meanwhile is delivered once, with no
    search, and no relay is left withdrawn."""
    for seed in (1, 2, 3):
        net, reg, stem = stem_net_with(seed * 10, 2)
        rid = reg.route_id
        far = next(i for i in (12, 13, 11, 14) if str(i) not in stem)
        net.kill(int(stem[0]))
        assert net.engines[int(stem[1])]._withdrawals.home_down(rid)  # the home's failure as far as it knows
        pid = push(net, far, reg, TOKENS[0])
        net.run_until(net.now + 10.0)
        assert net.custody.get(pid) == CustodyStatus.DELIVERED, seed
        assert sum(1 for d in net.delivered if d[1] == pid) == 1
        assert search_frames(net, pid) == 0, seed
        assert net.engines[0].counters["stem_restemmed"] == 1
        for i in range(1, 24):
            assert not net.engines[i]._withdrawals.home_down(rid), (seed, i)


def test_with_the_stem_on_a_home_neighbour_left_with_no_route_takes_home_down_from_the_wave() -> None:
    """A flood neighbour of the home whose only next hop was the home (the flood walks back down the stem,
    G8) sees a link go and withdraws `no route`: it cannot tell. The stem successor's `home down` reaching it
    from another neighbour says why, and a push injected there parks instead of searching. With the stem
    off it keeps its `no route` (there the home's neighbours see the home at distance 1; a `restored` wave,
    not a newer generation, ends the withdrawal, and it takes that only from the neighbours it dropped)."""
    for seed in range(1, 400):
        net, reg, stem = stem_net_with(seed)
        rid = reg.route_id
        lone = [i for i in (1, 2, 22, 23) if str(i) != stem[0] and net.engines[i].next_hops(rid)
                and all(p == "0" for p, _ in net.engines[i].next_hops(rid))]
        if lone:
            break
    else:
        raise AssertionError("no seed left a neighbour of the home with the home as its only next hop")
    x = lone[0]
    mark = len(net.sent)
    net.kill(0)
    net.run_until(net.now + 1.0)
    sent = withdrawals(net, mark)
    assert (str(x), WithdrawKind.NO_ROUTE) in {(a, w.kind) for a, _, w in sent}  # its own news first
    assert (str(x), WithdrawKind.HOME_DOWN) in {(a, w.kind) for a, _, w in sent}  # then the reason, told on
    assert all(net.engines[i]._withdrawals.home_down(rid) for i in range(1, 24))
    pid = push(net, x, reg, TOKENS[0])
    net.run_until(net.now + 30.0)
    assert pid not in net.custody and sum(1 for _, _, m in net.sent if isinstance(m, Push) and m.push_id == pid) == 0
    # the same `home down` at a stem-off relay left with no route: kept as `no route`
    off, reg_off = net_with(FORK, 7)
    cut(off, 1, 2)
    off.run_until(off.now + 1.0)
    down = RouteWithdraw((WithdrawnRoute(reg_off.route_id, reg_off.epoch, WithdrawKind.HOME_DOWN, 0),))
    off.apply("2", off.engines[2].receive_message("5", down, off.now))
    assert not off.engines[2]._withdrawals.home_down(reg_off.route_id)


def test_a_withdrawal_of_an_older_route_generation_is_ignored() -> None:
    """A `home down` sent (or queued, or in flight) about a route generation the home's re-stem has since
    replaced says nothing about the new route: a relay holding the newer generation ignores it, even from its
    next hop, and heeds the same entry at its own generation. Entries carry the sender's generation."""
    net, reg, stem = stem_net_with(10, 2)
    rid = reg.route_id
    net.kill(int(stem[0]))  # the home re-stems around it: generation >= 1 everywhere
    net.run_until(net.now + 10.0)
    x = next(i for i in range(1, 24) if str(i) not in stem and net.engines[i].next_hops(rid))
    gen = net.engines[x]._stem.generation_of(rid, reg.epoch)
    assert gen >= 1
    nh = net.engines[x].next_hops(rid)[0][0]
    for g in (0, gen - 1):
        stale = RouteWithdraw((WithdrawnRoute(rid, reg.epoch, WithdrawKind.HOME_DOWN, 0, g),))
        net.apply(str(x), net.engines[x].receive_message(nh, stale, net.now))
    assert net.engines[x].counters["withdraw_stale_generation"] == 2
    assert nh in {p for p, _ in net.engines[x].next_hops(rid)}
    fresh = RouteWithdraw((WithdrawnRoute(rid, reg.epoch, WithdrawKind.HOME_DOWN, 0, gen),))
    net.apply(str(x), net.engines[x].receive_message(nh, fresh, net.now))
    assert nh not in {p for p, _ in net.engines[x].next_hops(rid)}


def test_a_push_searched_for_behind_a_no_route_withdrawal_asks_for_a_newer_route_too() -> None:
    """A custodian whose route is withdrawn `no route` with no live next hop searches (C3) and asks for a
    newer route as well (G13): the home's new generation gives every withdrawn relay its route back. (A
    failure near the flood's origin withdraws a whole region at once, whose relays answer no search.)"""
    net, reg = net_with(FORK, 7)
    rid = reg.route_id
    cut(net, 1, 2)  # 2 and 6 (through 2 only) are left with no route
    net.run_until(net.now + 1.0)
    assert net.engines[6].next_hops(rid) == [] and net.engines[2].next_hops(rid) == [("1", 2)]
    mark = len(net.sent)
    pid = push(net, 6, reg, TOKENS[0])
    net.run_until(net.now + 5.0)
    assert net.custody[pid] == CustodyStatus.DELIVERED and sum(1 for d in net.delivered if d[1] == pid) == 1
    requests = [(a, b) for a, b, w in withdrawals(net, mark) if w.kind == WithdrawKind.REQUEST]
    assert requests[0] == ("6", "2")
    assert net.engines[0].counters["route_regenerated_home"] == 1
    for i in (2, 6):  # the new generation's route, not withdrawn
        assert net.engines[i].next_hops(rid) and net.engines[i]._withdrawals._current(rid) is None, i


# 0 (home) - 1 - 2 - 8 - 6 - 5 (fast, 5 hops) and 0 - 3 - 5 (slow, 2 hops); 7 hangs off 5 and 6. Relay 5
# takes the fast way first (feasibility distance 5) and 3 as a backup at distance 2.
SHORTCUT = [(0, 1), (1, 2), (2, 8), (8, 6), (6, 5), (0, 3), (3, 5), (5, 7), (6, 7)]


def test_a_relay_never_takes_back_a_route_longer_than_one_it_told() -> None:
    """Seen on built-5k-c3l1 seed 2 (stem and withdrawal on): a relay that lost its primary answered a
    withdrawal with its backup's shorter distance but kept its feasibility distance; a neighbour that had
    taken that answer, passed it on, and not yet heard the later withdrawal, offered it back one hop longer,
    still under the old feasibility distance: taken, a loop of three relays that held a push to its
    deadline. Babel's invariant: the feasibility distance is never above a distance the relay told."""
    for seed in (1, 2, 3):
        net, reg = net_with(SHORTCUT, 9, latency={(3, 5): 0.2, (5, 3): 0.2}, seed=seed)
        rid = reg.route_id
        assert net.engines[5].next_hops(rid) == [("6", 5), ("3", 2)]
        assert net.engines[7].next_hops(rid)[0] == ("6", 5)
        mark = len(net.sent)
        cut(net, 2, 8)  # 8, then 6 lose their only next hop and withdraw; 5 keeps 3 and answers at distance 2
        net.run_until(net.now + 1.0)
        told = [(a, b, w.hops) for a, b, w in withdrawals(net, mark) if w.kind == WithdrawKind.RESTORED and a == "5"]
        assert ("5", "6", 2) in told, told
        assert net.engines[6].next_hops(rid)[0] == ("5", 3)
        # 5 loses 3 too; before 7 hears of it, 7 (through 5 or 6, distance 3) offers 5 its route: not taken.
        del net.links[("3", "5")], net.links[("5", "3")]
        net.apply("5", net.engines[5].peer_down("3", net.now, DisconnectReason.LINK_LOST))
        offer = RouteWithdraw((WithdrawnRoute(rid, reg.epoch, WithdrawKind.RESTORED, 3),))
        net.apply("5", net.engines[5].receive_message("7", offer, net.now))
        assert not [h for h in net.engines[5].next_hops(rid) if h[0] == "7"], seed
        assert net.engines[5].counters["withdraw_unfeasible"] >= 1, seed
        net.run_until(net.now + 5.0)
        for i in (5, 6, 7, 8):  # no next-hop cycle among them: every chain of live next hops ends
            chain = [str(i)]
            while chain[-1] not in ("0", "1", "2", "3"):
                at = chain[-1]
                live = [p for p, _ in net.engines[int(at)].next_hops(rid) if (at, p) in net.links]
                if not live:
                    break
                assert live[0] not in chain, (seed, chain + live[:1])
                chain.append(live[0])
