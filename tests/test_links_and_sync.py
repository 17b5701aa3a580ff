"""Links both ends hold, and routes back at link-up (issue 43 item 4; docs/protocol.md rules M7, G11).

M7: a relay below active_min in a mesh of full relays dialled them over and over (each time a bootstrap
listed them again) and listed each link for the 2 s a full relay held it on probation: the mesh never
settled. Now a relay lists a link only once it has heard from the other end (which sends nothing on a link
it holds on probation), and does not dial a relay that refused it as full again for FULL_BACKOFF_S.
G11: a relay that restarts with no routes learns, from each neighbour whose link comes up, the routes it
lacks (provisional routes), in the engine (MiniNet) and over real relays (the last tests; the 10 mesh
starts of the acceptance with INRI_MESH_STARTS=10)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from inri import mesh
from inri.client import DeviceClient, HomeAppClient
from inri.core import membership
from inri.core.api import CustodyStatus, Disconnect, DisconnectReason
from inri.core.config import EngineConfig
from inri.core.membership import PROBATION_S
from inri.core.sync import SYNC, SYNC_ROUTES_PER_TICK
from inri.core.testing import MiniNet
from inri.node import routesnap
from inri.node.metrics import parse_metrics
from inri.protocol import limits
from inri.protocol.codec import DecodeError, decode, encode, make_registration
from inri.protocol.keys import new_signing_key, receipt_public_key
from inri.protocol.messages import (
    Hello,
    PeerInfo,
    Push,
    RegGossip,
    Registration,
    RouteError,
    RouteErrorReason,
    RouteSync,
    SyncedRoute,
)

# -- M7: links both ends hold ---------------------------------------------------------------------------


def _full_relay_and_a_dialler() -> MiniNet:
    """Relay 0 full (4 neighbours: 1-4); relay 5 with 2 neighbours (1, 2): below active_min, not "low"."""
    net = MiniNet(6, [(0, 1), (0, 2), (0, 3), (0, 4), (5, 1), (5, 2)], open_dial=True)
    net.run_until(1.0)
    assert len(net.engines[0].active_peers()) == 4 and len(net.engines[5].active_peers()) == 2
    return net


def _dials(net: MiniNet) -> int:
    """Links relay 0 (full) refused: the dials relay 5 made to it."""
    return net.engines[0].counters.get("peer_refused_full", 0)


def test_a_link_a_full_relay_holds_on_probation_is_listed_by_neither_end_and_closed_after_it() -> None:
    net = _full_relay_and_a_dialler()
    t0 = net.now
    net.apply("5", net.engines[5].add_candidates([PeerInfo("0", "addr-0")], net.now))  # the bootstrap lists 0
    listed_at_5, linked = [], []
    while net.now < t0 + PROBATION_S + 2.0:
        net.run_until(net.now + 0.01)
        listed_at_5.append("0" in net.engines[5].listed_peers())
        linked.append("0" in net.engines[5].active_peers())
    assert _dials(net) == 1
    # 5 held the link for the probation (0 waits for a "low" Hello), and 0 then closed it as full...
    interval = EngineConfig().keepalive_interval_s  # the full relay's timer checks probations on its tick
    assert 0 < linked.count(True) * 0.01 <= PROBATION_S + interval + 0.05, linked.count(True)
    assert "0" not in net.engines[5].active_peers() and "5" not in net.engines[0].active_peers()
    # ...but 5 never listed it: 0 never spoke on it (a relay sends nothing to a link on probation).
    assert not any(listed_at_5)


@pytest.mark.parametrize("backoff", [True, False])
def test_a_relay_below_active_min_backs_off_from_a_full_relay(backoff: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bootstrap lists the full relay again every 2 s (peers_interval_s in the lab) for two minutes: it
    is dialled again 2 s after its first refusal, then twice as long after each (up to 60 s): 6 dials
    (refused after 2-3 s of probation each: at 0, ~5, ~11, ~22, ~41, ~76 s). Without the backoff (as before
    M7), at the first listing after each refusal: 23."""
    if not backoff:
        monkeypatch.setattr(membership, "FULL_BACKOFF_MIN_S", 0.0)
    net = _full_relay_and_a_dialler()
    t0 = net.now
    while net.now < t0 + 120.0:
        net.apply("5", net.engines[5].add_candidates([PeerInfo("0", "addr-0")], net.now))
        net.run_until(net.now + 2.0)
    dials = _dials(net)
    assert dials <= 6 if backoff else dials >= 20, dials


def test_a_link_is_listed_once_each_end_heard_from_the_other() -> None:
    net = MiniNet(3, [(0, 1)], open_dial=True)
    net.run_until(1.0)
    net.apply("2", net.engines[2].add_candidates([PeerInfo("1", "addr-1")], net.now))
    net.run_until(net.now + 0.011)  # the link is up at both ends
    assert "1" in net.engines[2].active_peers() and "1" not in net.engines[2].listed_peers()
    assert "2" in net.engines[1].active_peers() and "2" not in net.engines[1].listed_peers()
    # Listed once something came over it: keepalives at the latest (one interval), a round trip on.
    net.run_until(net.now + EngineConfig().keepalive_interval_s + 0.03)
    assert not any(isinstance(m, Hello) for a, _, m in net.sent if a == "1")  # nothing but keepalives
    assert "1" in net.engines[2].listed_peers() and "2" in net.engines[1].listed_peers()


# -- G11: routes back at link-up ------------------------------------------------------------------------

MESH = [(0, 1), (1, 2), (2, 3), (3, 0), (1, 4), (2, 5), (4, 5)]  # two paths between most relays


def _devices(net: MiniNet, homes: list[int]) -> list[tuple[Registration, list[bytes]]]:
    out = []
    for h in homes:
        secret = os.urandom(32)
        reg = make_registration(new_signing_key(), 1, 0, 3600, receipt_public_key(secret))
        tokens = [os.urandom(16) for _ in range(4)]
        net.homes[h].add_registration(reg, tokens, secret)
        net.apply(str(h), net.engines[h].register(reg, net.now))
        out.append((reg, tokens))
    return out


@pytest.mark.parametrize("route_sync", [True, False])
def test_a_relay_restarted_with_no_routes_learns_every_route_from_its_neighbours(route_sync: bool) -> None:
    """Relay 1 (homes none of them) is killed silently and restarted empty (killed before its first
    snapshot): within a keepalive interval of its links coming up it has a next hop for every route id,
    and a push entered there follows it (no ring search). [engine] route_sync = false: as before G11,
    only the route of the device homed next to it (G5) comes back."""
    cfg = dataclasses.replace(EngineConfig(), route_sync=route_sync)
    net = MiniNet(6, MESH, config=cfg)
    net.run_until(1.0)
    devices = _devices(net, [0, 3, 4, 5])
    net.run_until(3.0)
    assert all(net.engines[1].has_route(reg.route_id) for reg, _ in devices)
    net.kill(1, silent=True)
    net.run_until(12.0)  # its neighbours time it out (keepalives)
    net.restart(1)
    net.run_until(net.now + 0.1)  # its links are up (10 ms each way)
    linked = net.now
    net.run_until(linked + cfg.keepalive_interval_s)
    have = [net.engines[1].has_route(reg.route_id) for reg, _ in devices]
    if not route_sync:
        assert have.count(True) == 2, have  # relays 0 and 4 home a device and are its neighbours (G5)
        return
    assert all(have), have
    assert net.engines[1].counters.get("route_sync_routes_taken", 0) >= 2
    reg, tokens = devices[1]  # homed at 3, two hops away
    res = net.engines[1].inject_push(reg, tokens[0], b"x", net.now)
    net.apply("1", res.effects)
    net.run_until(net.now + 2.0)
    assert net.custody[res.push_id or b""] == CustodyStatus.DELIVERED
    assert not any(isinstance(m, Push) and m.push_id == res.push_id and m.ring for _, _, m in net.sent)


def _restarted_next_to_a_home() -> tuple[MiniNet, list[tuple[Registration, list[bytes]]]]:
    """Relay 1 restarted empty a keepalive interval ago; devices[0] is homed at its neighbour 0, whose
    announcement (G5) it has, so the sync answers for that route came while it had a live next hop."""
    net = MiniNet(6, MESH)
    net.run_until(1.0)
    devices = _devices(net, [0, 3, 4, 5])
    net.run_until(3.0)
    net.kill(1, silent=True)
    net.run_until(12.0)  # its neighbours time it out (keepalives)
    net.restart(1)
    net.run_until(net.now + EngineConfig().keepalive_interval_s)
    eng = net.engines[1]
    assert eng.next_hops(devices[0][0].route_id) == [("0", 1)] and eng.route_count() == len(devices)
    assert eng.stats()["routes_provisional"] == len(devices)  # 3 routes it lacked, 1 fallback
    return net, devices


def test_a_route_sync_answer_outlives_the_live_route_it_was_not_needed_for() -> None:
    """Issue 43: relay 1 restarts empty; relay 0 homes a device and announces it at link-up (G5), so the
    sync answers of 2 and 4 find a live route for it. Then 0 drops 1 to make room for another relay (M4,
    MAKE_ROOM: 1 forgets 0's route claims, S2, and does not re-dial it). The answers are kept as fallback
    provisional routes: 1 still has a route to the device, and a push entered there is delivered. Before,
    they were dropped at once, and 1 lacked the route until the device refreshed (no link of its first
    minute was left to ask)."""
    net, devices = _restarted_next_to_a_home()
    eng = net.engines[1]
    reg, tokens = devices[0]
    net.apply("0", [Disconnect("1", DisconnectReason.MAKE_ROOM),
                    *net.engines[0].peer_down("1", net.now, DisconnectReason.MAKE_ROOM)])
    assert eng.next_hops(reg.route_id) == [] and "0" not in eng.active_peers()
    assert eng.has_route(reg.route_id) and eng.route_count() == len(devices)
    res = eng.inject_push(reg, tokens[0], b"x", net.now)
    net.apply("1", res.effects)
    net.run_until(net.now + 2.0)
    assert net.custody[res.push_id or b""] == CustodyStatus.DELIVERED
    assert not any(isinstance(m, Push) and m.push_id == res.push_id and m.ring for _, _, m in net.sent)


def test_a_fallback_does_not_stand_in_for_a_route_whose_home_went_down() -> None:
    """The fallback kept for a live route (above) serves only once the route has no next hop left: when
    relay 0, the device's home, fails (its link drops), relay 1 keeps the route through it and treats it as
    before (rule F3: `home unreachable` for a while, then a search), instead of sending the push on to a
    neighbour whose route leads to the same down home."""
    net, devices = _restarted_next_to_a_home()
    eng = net.engines[1]
    reg, _ = devices[0]
    net.kill(0)
    assert eng.next_hops(reg.route_id) == [("0", 1)] and "0" not in eng.active_peers()
    assert not eng.has_route(reg.route_id)
    assert eng.has_route(devices[1][0].route_id)  # homed at 3: its provisional route (through 2) serves


def test_route_sync_is_taken_only_when_asked_and_never_over_a_live_route() -> None:
    net = MiniNet(3, [(0, 1), (1, 2)])
    net.run_until(1.0)
    (reg, _), = _devices(net, [2])
    net.run_until(2.0)
    eng = net.engines[0]
    assert eng.next_hops(reg.route_id) == [("1", 2)]
    made_up = os.urandom(16)
    claim = RouteSync((SyncedRoute(made_up, 0, 600), SyncedRoute(reg.route_id, 0, 600)))
    net.apply("0", eng.receive_message("1", claim, net.now))  # 0 never asked 1
    assert eng.counters.get("route_sync_unsolicited") == 1 and not eng.has_route(made_up)
    eng._sync.ask("1")  # as if it had asked on this link (its Hello with `sync`)
    net.apply("0", eng.receive_message("1", claim, net.now))
    assert eng.has_route(made_up)  # a route id it has no route for: provisional, through 1
    assert eng.next_hops(reg.route_id) == [("1", 2)]  # the live route stays as it was (hops 0 claimed)
    # The answer for the live route is kept as its fallback only (used once no next hop of it is up), not
    # counted as a second route.
    assert eng.route_count() == 2 and eng.stats()["routes_provisional"] == 2


def test_a_provisional_route_through_a_neighbour_that_went_down_is_no_route() -> None:
    """It forwards nothing while that link is down, so the route count (`/v1/status` routes) leaves it out,
    and counts it again when the neighbour links again."""
    net = MiniNet(3, [(0, 1), (0, 2)])
    net.run_until(1.0)
    eng = net.engines[0]
    rid = os.urandom(16)
    eng._sync.ask("1")
    net.apply("0", eng.receive_message("1", RouteSync((SyncedRoute(rid, 1, 600),)), net.now))
    assert eng.route_count() == 1 and eng.stats()["routes_provisional"] == 1
    net.apply("0", eng.peer_down("1", net.now, DisconnectReason.LINK_LOST))
    assert eng.route_count() == 0  # still held (routes_provisional), not counted
    net.apply("0", eng.peer_up("1", net.now, outbound=True))
    assert eng.route_count() == 1


def test_a_provisional_route_whose_neighbour_answers_no_route_is_dropped() -> None:
    net = MiniNet(2, [(0, 1)])
    net.run_until(1.0)
    eng = net.engines[0]
    ghost = make_registration(new_signing_key(), 1, 0, 3600)  # registered nowhere: 1 has no route for it
    eng._sync.ask("1")
    net.apply("0", eng.receive_message("1", RouteSync((SyncedRoute(ghost.route_id, 1, 600),)), net.now))
    assert eng.next_hops(ghost.route_id) == [] and eng.has_route(ghost.route_id)
    res = eng.inject_push(ghost, os.urandom(16), b"x", net.now)
    net.apply("0", res.effects)
    net.run_until(net.now + 0.1)
    assert any(isinstance(m, RouteError) and m.reason == RouteErrorReason.NO_ROUTE for _, _, m in net.sent)
    assert not eng.has_route(ghost.route_id) and eng.counters["route_provisional_dropped"] == 1


def test_a_handed_over_route_that_closes_a_loop_costs_its_first_push_one_round() -> None:
    """G11's known gap (docs/results/2026-11-29-routes-at-link-up.md), as over real relays: relay 1 is on
    relay 3's route to a device homed at 0 (0-2-1-3); 4's route runs through 3 (its other, through 5, is
    slower). 1 is killed and restarted linked to 3 and 4 only: 3 still routes through 1 (split horizon
    kept it out of 3's answer), 4 hands its route through 3 over, and a push entered at 1 goes round
    1 -> 4 -> 3 -> 1. It is answered `duplicate` and the custodian's second attempt (which prefers backups
    all along the way) goes 4 -> 5 -> 0: two frames out of 1, not a search; its receipt makes 5 4's first
    next hop, and the next push goes straight (one frame)."""
    net = MiniNet(6, [(0, 2), (2, 1), (1, 3), (3, 4), (4, 5), (5, 0)],
                  latency={(4, 5): 0.2, (5, 4): 0.2, (5, 0): 0.2, (0, 5): 0.2})
    net.run_until(1.0)
    (reg, tokens), = _devices(net, [0])
    net.run_until(3.0)
    rid = reg.route_id
    assert net.engines[3].next_hops(rid) == [("1", 3)] and net.engines[4].next_hops(rid) == [("3", 4), ("5", 2)]
    net.kill(1, silent=True)
    for a, b in (("1", "2"), ("2", "1")):
        del net.links[(a, b)]
    net.links[("1", "4")] = net.links[("4", "1")] = 0.01
    net.restart(1)
    net.run_until(net.now + EngineConfig().keepalive_interval_s)
    eng = net.engines[1]
    assert eng.next_hops(rid) == [] and eng.has_route(rid)  # the route 4 handed over (provisional)

    def push(token: bytes) -> list[tuple[str, str, Push | RouteError]]:
        start = len(net.sent)
        res = eng.inject_push(reg, token, b"x", net.now)
        net.apply("1", res.effects)
        net.run_until(net.now + 5.0)
        assert net.custody.get(res.push_id or b"") == CustodyStatus.DELIVERED
        return [(a, b, m) for a, b, m in net.sent[start:]
                if isinstance(m, Push | RouteError) and m.push_id == res.push_id]

    first = push(tokens[0])
    assert ("3", "1") in [(a, b) for a, b, m in first if isinstance(m, Push)]  # it came back round the loop
    assert [m.reason for a, b, m in first if a == "1" and isinstance(m, RouteError)] == [RouteErrorReason.DUPLICATE]
    assert [(b, m.ring) for a, b, m in first if a == "1" and isinstance(m, Push)] == [("4", 0), ("4", 0)]
    second = push(tokens[1])
    assert [(a, b) for a, b, m in second] == [("1", "4"), ("4", "5"), ("5", "0")]


def test_a_neighbour_answers_a_sync_once_per_interval_and_paced_per_tick() -> None:
    """More routes than one tick's share go over several keepalive intervals; a second request on the same
    link is refused (a relay cannot make its neighbour resend its table but by linking again)."""
    cfg = dataclasses.replace(EngineConfig(), reg_budget_peer_burst=5000)
    net = MiniNet(3, [(0, 1), (1, 2)], config=cfg)
    net.run_until(1.0)
    eng = net.engines[1]
    for _ in range(SYNC_ROUTES_PER_TICK + 100):  # routes through 2 (none through 0, the relay that asks)
        eng.receive_message("2", RegGossip(make_registration(new_signing_key(), 1, 0, 3600), 5, 3), net.now)
    ask = Hello(limits.PROTOCOL_VERSION, "0", "addr-0", (SYNC,))
    first = [m for e in eng.receive_message("0", ask, net.now) if isinstance(m := getattr(e, "msg", None), RouteSync)]
    assert sum(len(f.entries) for f in first) == SYNC_ROUTES_PER_TICK
    assert all(len(encode(f)) < limits.MAX_FRAME_BYTES and decode(encode(f)) == f for f in first)
    again = eng.receive_message("0", ask, net.now)
    assert not any(isinstance(getattr(e, "msg", None), RouteSync) for e in again)
    assert eng.counters["route_sync_refused_again"] == 1
    rest = [m for e in eng.handle_timer(net.now + 1.0) if isinstance(m := getattr(e, "msg", None), RouteSync)]
    assert sum(len(f.entries) for f in rest) == 100


def test_route_sync_frames_are_strict() -> None:
    import msgpack

    ok = [[b"r" * 16, 3, 60]] * limits.MAX_SYNCED_ROUTES
    got = decode(msgpack.packb([13, limits.PROTOCOL_VERSION, ok]))
    assert isinstance(got, RouteSync) and len(got.entries) == limits.MAX_SYNCED_ROUTES
    for bad in ([], ok + [[b"r" * 16, 3, 60]], [[b"r" * 15, 3, 60]], [[b"r" * 16, limits.MAX_TTL + 1, 60]],
                [[b"r" * 16, 3, limits.MAX_LIFETIME_S + 1]], [[b"r" * 16, 3]], [[b"r" * 16, -1, 60]]):
        with pytest.raises(DecodeError) as err:
            decode(msgpack.packb([13, limits.PROTOCOL_VERSION, bad]))
        assert err.value.code == "malformed", bad




# -- over real relays ------------------------------------------------------------------------------------

STARTS = int(os.environ.get("INRI_MESH_STARTS", "2"))  # the acceptance asks for 10 (issue 43)
SETTLE_GUARD_S = 120.0  # a mesh not settled after this never settles (before M7: 2 of 9 starts); not a timing claim


def _symmetric(info: dict[str, Any]) -> tuple[bool, list[tuple[str, str]]]:
    """Every relay up, the mesh connected, and every link listed by both ends (one status round)."""
    names = {r["node_id"]: r["name"] for r in info["relays"]}
    lists = {r["name"]: {names.get(n["node_id"], "?") for n in mesh.status(r["api"])["neighbours"]}
             for r in info["relays"]}
    one_sided = sorted((a, b) for a, nbs in lists.items() for b in nbs if a not in lists.get(b, set()))
    seen, todo = {"R1"}, ["R1"]
    while todo:
        for b in lists[todo.pop()]:
            if b not in seen:
                seen.add(b)
                todo.append(b)
    return not one_sided and len(seen) == len(lists), one_sided


def _first_copies(trace: Path, offset: int) -> dict[str, str]:
    """How the first copy of each push a relay took custody of (past `offset` in its trace file) left it:
    `push_forwarded` (to a next hop of its route) or `push_fallback` (ring copies: a search)."""
    first: dict[str, str] = {}
    with trace.open(encoding="utf-8") as f:
        f.seek(offset)
        for line in f:
            row = json.loads(line)
            if row["kind"] == "push_injected":
                first.setdefault(row["msg"], "")
            elif row["kind"] in ("push_forwarded", "push_fallback") and first.get(row["msg"]) == "":
                first[row["msg"]] = row["kind"]
    return first


async def _settled(info: dict[str, Any]) -> float:
    """Wait until every link is listed by both ends and the mesh is connected, three status rounds in a
    row (SETTLE_GUARD_S at most); the seconds it took."""
    t0 = time.monotonic()
    streak = 0
    with trio.fail_after(SETTLE_GUARD_S):
        while streak < 3:
            ok, _ = await trio.to_thread.run_sync(_symmetric, info)
            streak = streak + 1 if ok else 0
            await trio.sleep(0.2)
    return time.monotonic() - t0


@pytest.mark.integration
@pytest.mark.parametrize("start", range(STARTS))
def test_eight_relays_settle_with_every_link_listed_by_both_ends(tmp_path: Path, start: int) -> None:
    """8 relays and a bootstrap, started at once: every link comes to be listed by both ends (and stays so
    for three status rounds), the mesh connected; the time it took is printed (the issue asks for 30 s).
    Before M7, 2 of 9 starts never settled in 120 s."""
    info = mesh.up(tmp_path, relays=8, bootstraps=1, timeout_s=90, min_neighbours=0, trace_level="off")
    try:
        t0 = time.monotonic()
        streak, last = 0, []
        while streak < 3:
            assert time.monotonic() - t0 < SETTLE_GUARD_S, f"start {start}: one-sided links {last}"
            ok, last = _symmetric(info)
            streak = streak + 1 if ok else 0
            time.sleep(0.2)
        print(f"start {start}: settled {time.monotonic() - t0:.1f} s after the relays were up")
    finally:
        mesh.down(tmp_path)


@pytest.mark.integration
async def test_a_restarted_relay_relearns_every_route_from_its_neighbours(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """6 relays (a route snapshot every second), a device homed at each of R1-R5; R6 (homes none) is killed
    (kill -9) twice: mid-path, with a snapshot of every route, then seconds after its links came up, with
    its snapshot deleted (as if killed before its first one): its neighbours still hold its old links, issue
    43's last gap (test_node_links). Each time it comes to have a route to every device after its first link
    comes up (rule G11; before it, only the devices homed at its new neighbours came back, G5; the time is
    printed, the issue asks for 10 s: the engine test above checks a keepalive interval on simulated time),
    and pushes entered there once the mesh has settled follow them (their first copies, in R6's trace)."""
    monkeypatch.setenv("INRI_RELAY_ROUTE_SNAPSHOT_S", "1.0")
    info = await trio.to_thread.run_sync(lambda: mesh.up(tmp_path, relays=6, bootstraps=1, timeout_s=120,
                                                         min_neighbours=2, trace_level="summary"))
    devices: list[DeviceClient] = []
    try:
        by_name = {r["name"]: r for r in info["relays"]}
        for name in ("R1", "R2", "R3", "R4", "R5"):
            dev = DeviceClient(by_name[name]["api"])
            await dev.register(tokens=4)
            devices.append(dev)
        creds = [dev.export_credential(2) for dev in devices]  # two pushes each: one per restart
        r6 = by_name["R6"]
        trace = Path(r6["data_dir"]) / "traces" / "trace.jsonl"  # one file: a restart appends to it
        async with httpx.AsyncClient(timeout=5) as c:
            async def status() -> dict[str, Any]:
                got: dict[str, Any] = (await c.get(r6["api"] + "/v1/status")).json()
                return got

            with trio.fail_after(60):
                while (await status())["routes"] < len(devices):
                    await trio.sleep(0.1)
            for snapshot in (True, False):
                if snapshot:  # one with every route (learnt by gossip: provisional routes are not kept)
                    with trio.fail_after(30):
                        while len(routesnap.load(r6["data_dir"])[0]) < len(devices):
                            await trio.sleep(0.1)
                os.kill(r6["pid"], signal.SIGKILL)
                with trio.fail_after(30):
                    await trio.to_thread.run_sync(os.waitpid, r6["pid"], 0)
                if not snapshot:
                    (Path(r6["data_dir"]) / routesnap.SNAPSHOT_FILE).unlink(missing_ok=True)
                await trio.to_thread.run_sync(lambda: mesh.restart_relay(info, r6))
                with trio.fail_after(60):
                    while not (await status())["neighbours"]:
                        await trio.sleep(0.05)
                linked = time.monotonic()
                with trio.move_on_after(60.0):  # a hang guard, not a timing claim
                    while (await status())["routes"] < len(devices):
                        await trio.sleep(0.1)
                took = time.monotonic() - linked
                got = (await status())["routes"]
                print(f"snapshot {snapshot}: {got} of {len(devices)} routes {took:.1f} s after its first link")
                assert got == len(devices), (snapshot, got)
                # They serve: one push per device entered at R6 leaves it along a route (a search would
                # send it to every neighbour), and is delivered. Pushed once the mesh has settled:
                # the restart reshuffles it for seconds (relays make room for R6, M6, and cut others,
                # whose route claims go, S2; links to the killed R6 last until keepalives time out), and
                # a push sent meanwhile may meet a home cut off for a moment or a stale route of the old
                # R6, and cost custody re-sends that say nothing of G11 (under load: 12-13 frames).
                settled = await _settled(info)
                with trio.fail_after(60):  # two neighbours at least: a search then costs two frames a push
                    while len((await status())["neighbours"]) < 2 or (await status())["routes"] < len(devices):
                        await trio.sleep(0.1)
                print(f"snapshot {snapshot}: mesh settled {settled:.1f} s after the routes were checked")
                m0 = parse_metrics((await c.get(r6["api"] + "/metrics")).text)
                before = m0["inri_pushes_out_total"]
                mark = trace.stat().st_size if trace.exists() else 0
                app = HomeAppClient([r6["api"]])
                pids = [(await app.push(cred, b"after the restart")).push_id for cred in creds]
                with trio.fail_after(30):
                    for pid in pids:
                        while (await app.status(pid, r6["api"]))["status"] == "pending":
                            await trio.sleep(0.1)
                statuses = [(await app.status(pid, r6["api"]))["status"] for pid in pids]
                await app.aclose()
                m1 = parse_metrics((await c.get(r6["api"] + "/metrics")).text)
                out = m1["inri_pushes_out_total"] - before
                events = {k: v - m0.get(k, 0) for k, v in m1.items() if "events" in k and v != m0.get(k, 0)}
                first = _first_copies(trace, mark)
                print(f"snapshot {snapshot}: {out} push frames out for {len(pids)} pushes, events {events}")
                # Each push's first copy left R6 along a route, not in a ring search (read in R6's trace:
                # with two neighbours a search of every push costs two frames a push, as a loop does).
                assert statuses == ["delivered"] * len(pids), (statuses, events)
                assert list(first.values()) == ["push_forwarded"] * len(pids), first
                # One frame each along a route; a push may come back once around a loop a handed-over
                # route closes (G11's known gap: docs/results/2026-11-29-routes-at-link-up.md; the engine
                # test above) and leave again on the custodian's second attempt: two frames.
                assert out <= 2 * len(pids), (out, events)
    finally:
        for dev in devices:
            await dev.aclose()
        await trio.to_thread.run_sync(lambda: mesh.down(tmp_path))
