"""Tree gossip (rule G9, [engine] gossip_scheme = "tree"): the RegAnnounce / RegGraft wire frames, the
engine's eager/lazy push, backups from announcements, grafts, and the scheme in the simulator."""

from __future__ import annotations

import random
import re
from dataclasses import replace

import pytest

from inri.common.config import ConfigError, Setting, engine_config
from inri.core.api import Send
from inri.core.config import EngineConfig
from inri.core.engine import Engine
from inri.core.home import MemoryHomeStore
from inri.core.testing import MiniNet
from inri.core.trace import ListTracer
from inri.core.tree import TREE_MIN_SAMPLES, announce_frame_bytes, graft_frame_bytes
from inri.core.verify import CachingVerifier
from inri.protocol import limits
from inri.protocol.codec import DecodeError, decode, encode, make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import Announcement, RegAnnounce, RegGossip, RegGraft, Registration
from simulations.scenario import ScenarioError, from_dict
from simulations.sim import Simulator

TREE = EngineConfig(gossip_scheme="tree", tree_explore=0.0)
RID = bytes(range(16))


def reg_for(i: int, epoch: int = 1) -> Registration:
    return make_registration(new_signing_key(bytes([i]) * 32), epoch, 0, 3600)


# -- wire -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("msg", [
    RegAnnounce((Announcement(RID, 1, 0),)),
    RegAnnounce((Announcement(RID, 2**32 - 1, 200), Announcement(bytes(16), 300, 5))),
    RegAnnounce(tuple(Announcement(bytes([i]) * 16, i * 1000, i % 20) for i in range(40)), (RID,)),
    RegAnnounce((), (), (RID, bytes(16))),
    RegAnnounce((), tuple(bytes([i]) * 16 for i in range(17)), (RID,)),
    RegAnnounce((Announcement(RID, 7, 3, 1), Announcement(bytes(16), 300, 5, limits.MAX_ANNOUNCE_LAG_MS))),
    RegAnnounce((Announcement(RID, 7, 3, 200), Announcement(bytes(16), 300, 5)), (RID,)),
])
def test_announce_frames_round_trip_and_their_size_is_computed_exactly(msg: RegAnnounce) -> None:
    frame = encode(msg)
    assert decode(frame) == msg
    assert announce_frame_bytes(msg) == len(frame)


def test_a_single_announcement_is_tens_of_bytes_and_a_graft_too() -> None:
    reg = reg_for(1)
    full = len(encode(RegGossip(reg, 16, 3)))
    one = len(encode(RegAnnounce((Announcement(reg.route_id, 1, 3),))))
    assert one <= 30 and full >= 4 * one
    for epoch in (1, 200, 70000, 2**32 - 1):
        assert graft_frame_bytes(epoch) == len(encode(RegGraft(RID, epoch)))
        assert decode(encode(RegGraft(RID, epoch))) == RegGraft(RID, epoch)


# The reason names the frame position ($[2]: the frame's first field, the entries; $[2][0][3]: the first
# entry's lag_ms) and the rule broken.
@pytest.mark.parametrize("fields, why", [
    ([], "array` of at least length 3, got 2"),  # [type, version]: no entries
    ([[]], "empty"),
    ([[[RID, 1, 0]], []], "trailing empty"),  # one encoding per message
    ([[[RID, 1]]], "at least length 3, got 2 - at `$[2][0]`"),  # [route_id, epoch, hops]
    ([[[RID[:8], 1, 0]]], "length >= 16 - at `$[2][0][0]`"),  # route_id
    ([[[RID, 1, 0]], [RID], [RID], [RID]], "array` of at most length 4, got 5"),  # one field after eager
    ([[[RID, 1, 0]] * (limits.MAX_ANNOUNCEMENTS + 1)], f"length <= {limits.MAX_ANNOUNCEMENTS} - at `$[2]`"),
    ([[], [b"short"]], "length >= 16 - at `$[3][0]`"),  # prunes
    ([[[RID, 1, 0, 0]]], ">= 1 - at `$[2][0][3]`"),  # one encoding per message: lag 0 is a 3-field entry
    ([[[RID, 1, 0, limits.MAX_ANNOUNCE_LAG_MS + 1]]], f"<= {limits.MAX_ANNOUNCE_LAG_MS} - at `$[2][0][3]`"),
    ([[[RID, 1, 0, 5, 1]]], "at most length 4, got 5 - at `$[2][0]`"),
])
def test_malformed_announce_frames_are_refused(fields: list[object], why: str) -> None:
    import msgpack

    frame = msgpack.packb([9, limits.PROTOCOL_VERSION, *fields], use_bin_type=True)
    with pytest.raises(DecodeError, match=re.escape(why)):
        decode(frame)


@pytest.mark.parametrize("lag", [1, 127, 128, 300, 70000 // 2, limits.MAX_ANNOUNCE_LAG_MS])
def test_full_frames_with_a_lag_round_trip_and_flood_frames_are_unchanged(lag: int) -> None:
    reg = reg_for(1)
    plain = encode(RegGossip(reg, 16, 3))
    lagged = encode(RegGossip(reg, 16, 3, lag_ms=lag))
    assert decode(lagged) == RegGossip(reg, 16, 3, lag_ms=lag)
    assert decode(plain) == RegGossip(reg, 16, 3) and plain == encode(RegGossip(reg, 16, 3, lag_ms=0))
    assert len(lagged) - len(plain) <= 4  # nil and the lag
    import msgpack

    for bad, why in (([None, 0], ">= 1 - at `$[6]`"), ([False, 5], "nil"),  # lag_ms 0; field 4 nil
                     ([None, limits.MAX_ANNOUNCE_LAG_MS + 1], "lag_ms")):
        fields = msgpack.unpackb(plain, raw=False)[:5] + bad
        with pytest.raises(DecodeError, match=re.escape(why)):
            decode(msgpack.packb(fields, use_bin_type=True))


# -- configuration ------------------------------------------------------------------------------


def test_gossip_scheme_is_validated_in_relay_and_scenario_configuration() -> None:
    cfg = engine_config(EngineConfig(), {"gossip_scheme": Setting("tree", "relay.toml [engine] gossip_scheme")},
                        where="[engine]")
    assert cfg.gossip_scheme == "tree"
    assert EngineConfig().gossip_scheme == "flood"
    with pytest.raises(ConfigError, match="gossip_scheme"):
        engine_config(EngineConfig(), {"gossip_scheme": Setting("star", "relay.toml [engine] gossip_scheme")},
                      where="[engine]")
    with pytest.raises(ConfigError, match="tree_eager_share"):
        engine_config(EngineConfig(), {"tree_eager_share": Setting(1.5, "relay.toml [engine] tree_eager_share")},
                      where="[engine]")
    base = {"name": "x", "topology": {"relays": 10}, "workload": {"registrations": 1, "pushes": 1}}
    assert from_dict({**base, "engine": {"gossip_scheme": "tree"}}).engine.gossip_scheme == "tree"
    with pytest.raises(ScenarioError, match=r"\[engine\] gossip_scheme"):
        from_dict({**base, "engine": {"gossip_scheme": "plumtree"}})


# -- one engine -------------------------------------------------------------------------------------


def engine(config: EngineConfig = TREE, peers: tuple[str, ...] = ("a", "b", "c")) -> Engine:
    eng = Engine("r", config, verifier=CachingVerifier(), home=MemoryHomeStore(), tracer=ListTracer(),
                 rng=random.Random(1))
    for p in peers:
        eng.peer_up(p, 0.0, outbound=True, addr=f"addr-{p}")
    return eng


def sends(effects: list[object]) -> list[tuple[str, object]]:
    return [(e.peer, e.msg) for e in effects if isinstance(e, Send)]


def test_an_announcement_of_a_held_route_is_a_backup_only_when_feasible() -> None:
    reg = reg_for(2)
    eng = engine()
    eng.receive_message("a", RegGossip(reg, 16, 3), 0.0)  # first arrival: distance 4
    eng.receive_message("b", RegAnnounce((Announcement(reg.route_id, 1, 4),)), 0.01)  # 4 !< 4: not feasible
    assert eng.next_hops(reg.route_id) == [("a", 4)]
    eng.receive_message("c", RegAnnounce((Announcement(reg.route_id, 1, 2),)), 0.02)  # 2 < 4: backup
    assert eng.next_hops(reg.route_id) == [("a", 4), ("c", 3)]
    eng.receive_message("b", RegAnnounce((Announcement(reg.route_id, 0, 0),)), 0.03)  # older epoch: nothing
    assert eng.next_hops(reg.route_id) == [("a", 4), ("c", 3)]


def test_an_announcement_that_comes_before_the_full_frame_is_kept_and_the_announcer_gets_no_full_frame() -> None:
    reg = reg_for(3)
    eng = engine()
    eng.receive_message("c", RegAnnounce((Announcement(reg.route_id, 1, 1),)), 0.0)
    assert eng.next_hops(reg.route_id) == []
    out = sends(eng.receive_message("a", RegGossip(reg, 16, 3), 0.05))
    assert [p for p, m in out if isinstance(m, RegGossip)] == ["b"]  # c has it: no full frame
    # c's path was faster (its announcement came first) and shorter: c is the primary, a the backup
    assert eng.next_hops(reg.route_id) == [("c", 2), ("a", 4)]
    flushed = sends(eng.handle_timer(eng.get_timer() or 0.0))
    # c was faster than our full frame: it is asked for full frames (eager) and gets no announcement
    # (our hops 4 are not below its 1: we are no next hop for it)
    assert flushed == [("c", RegAnnounce((), (), (reg.route_id,)))]


def test_the_first_announcer_is_the_primary_only_when_feasible_and_not_the_full_frame_sender() -> None:
    reg = reg_for(5)
    eng = engine()
    eng.receive_message("c", RegAnnounce((Announcement(reg.route_id, 1, 5),)), 0.0)  # first, but 5 !< 4
    eng.receive_message("a", RegGossip(reg, 16, 3), 0.05)
    assert eng.next_hops(reg.route_id) == [("a", 4)]  # not feasible: no next hop, so not the primary
    reg2 = reg_for(6)
    eng.receive_message("a", RegAnnounce((Announcement(reg2.route_id, 1, 2),)), 0.1)
    eng.receive_message("b", RegAnnounce((Announcement(reg2.route_id, 1, 1),)), 0.11)
    eng.receive_message("a", RegGossip(reg2, 16, 2), 0.2)  # the first announcer sent the full frame too
    assert eng.next_hops(reg2.route_id) == [("a", 3), ("b", 2)]


def test_a_later_announcement_whose_lag_puts_it_first_becomes_the_primary_when_feasible() -> None:
    reg = reg_for(7)
    eng = engine()
    eng.receive_message("a", RegGossip(reg, 16, 5), 1.0)  # first full frame: distance 6, sent on at once
    # b's announcement comes 30 ms later, but b held the registration 40 ms before sending it (batching):
    # under flooding b's copy would have come 10 ms before a's. 4 < 6: feasible, so b leads.
    eng.receive_message("b", RegAnnounce((Announcement(reg.route_id, 1, 4, 40),)), 1.03)
    assert eng.next_hops(reg.route_id) == [("b", 5), ("a", 6)]
    # c's would have come before b's too, but is not feasible (6 !< 5): nothing changes
    eng.receive_message("c", RegAnnounce((Announcement(reg.route_id, 1, 6, 100),)), 1.04)
    assert eng.next_hops(reg.route_id) == [("b", 5), ("a", 6)]
    # a later full frame (a duplicate) with a lag is weighed the same way: c at 3 hops, 20 ms before b
    eng.receive_message("c", RegGossip(reg, 16, 3, lag_ms=100), 1.05)
    assert eng.next_hops(reg.route_id) == [("c", 4), ("b", 5)]
    assert eng.counters["tree_primary_earlier"] == 2
    # without lags the same frames change nothing: first come, first primary (the old rule)
    eng2 = engine()
    eng2.receive_message("a", RegGossip(reg, 16, 5), 1.0)
    eng2.receive_message("b", RegAnnounce((Announcement(reg.route_id, 1, 4),)), 1.03)
    assert eng2.next_hops(reg.route_id) == [("a", 6), ("b", 5)]


def test_what_a_relay_sends_after_an_earlier_path_carries_its_lag_and_distance_and_corrects_what_it_sent() -> None:
    reg = reg_for(8)
    eng = engine(peers=("a", "b", "c", "d"))
    eng.receive_message("b", RegAnnounce((Announcement(reg.route_id, 1, 2, 5),)), 1.0)  # virtually at 0.995
    out = sends(eng.receive_message("a", RegGossip(reg, 16, 5), 1.02))
    assert eng.next_hops(reg.route_id) == [("b", 3), ("a", 6)]
    # forwarded at our distance 3 (not the full frame's 6), hops + ttl as the flood's (21), 25 ms lag
    fulls = [(p, m) for p, m in out if isinstance(m, RegGossip)]
    assert fulls and all(m == RegGossip(reg, 18, 3, lag_ms=25) for _, m in fulls)
    assert sorted(p for p, _ in fulls) == ["c", "d"]  # unmeasured links: eager; b has it
    # b, the faster path, is asked for full frames; its hops (2) are below ours: no announcement for it
    flushed = sends(eng.handle_timer(1.02 + TREE.tree_announce_delay_s))
    assert [(p, m) for p, m in flushed if isinstance(m, RegAnnounce)] == [("b", RegAnnounce((), (), (reg.route_id,)))]
    # later d reports a path that would have come even earlier (1 hop, 0.9 s): d leads, and every
    # neighbour but d hears of it again with our new distance and lag
    t = 1.5
    eng.receive_message("d", RegAnnounce((Announcement(reg.route_id, 1, 1, 600),)), t)
    assert eng.next_hops(reg.route_id)[0] == ("d", 2)
    assert eng.counters["tree_corrections"] == 1
    flushed = sends(eng.handle_timer(t + TREE.tree_announce_delay_s))
    again = sorted(p for p, m in flushed if isinstance(m, RegAnnounce) and m.entries)
    assert "d" not in again and {"a", "c"} <= set(again)
    for _, m in flushed:
        if isinstance(m, RegAnnounce) and m.entries:
            assert m.entries == (Announcement(reg.route_id, 1, 2, 650),)


def test_a_registration_only_announced_is_grafted_from_the_closest_announcer_then_the_next() -> None:
    reg = reg_for(4)
    eng = engine()
    eng.receive_message("a", RegAnnounce((Announcement(reg.route_id, 1, 5),)), 0.0)
    eng.receive_message("b", RegAnnounce((Announcement(reg.route_id, 1, 2),)), 0.01)
    t = eng.get_timer()
    assert t is not None and t == pytest.approx(TREE.tree_graft_timeout_s)
    assert sends(eng.handle_timer(t)) == [("b", RegGraft(reg.route_id, 1))]
    t2 = eng.get_timer()
    assert t2 is not None and t2 == pytest.approx(t + TREE.tree_graft_timeout_s)
    assert sends(eng.handle_timer(t2)) == [("a", RegGraft(reg.route_id, 1))]  # b never answered
    eng.receive_message("a", RegGossip(reg, 10, 5), t2 + 0.01)  # the answer sets the route
    assert eng.next_hops(reg.route_id)[0] == ("a", 6)
    assert eng.counters["tree_grafts"] == 2


def test_a_graft_is_answered_with_the_full_frame_and_an_unknown_one_with_nothing() -> None:
    reg = reg_for(5)
    eng = engine()
    eng.receive_message("a", RegGossip(reg, 16, 3), 0.0)
    # sent 100 ms after it came here: the lag tells b when flooding's copy would have come
    assert sends(eng.receive_message("b", RegGraft(reg.route_id, 1), 0.1)) == [("b", RegGossip(reg, 15, 4, lag_ms=100))]
    assert sends(eng.receive_message("b", RegGraft(reg.route_id, 2), 0.1)) == []  # a newer epoch than ours
    assert sends(eng.receive_message("b", RegGraft(RID, 1), 0.1)) == []
    assert eng.counters["tree_graft_unknown"] == 2


def test_prunes_turn_a_direction_lazy_and_grafts_turn_it_eager_again() -> None:
    eng = engine()
    regs = [reg_for(10 + i) for i in range(TREE_MIN_SAMPLES + 2)]
    for i, reg in enumerate(regs[:TREE_MIN_SAMPLES]):
        out = sends(eng.receive_message("a", RegGossip(reg, 16, 3), i * 0.1))
        assert sorted(p for p, m in out if isinstance(m, RegGossip)) == ["b", "c"]  # unmeasured: eager
        eng.receive_message("b", RegAnnounce((), (reg.route_id,)), i * 0.1 + 0.05)  # b had it: prune
    reg = regs[TREE_MIN_SAMPLES]
    out = sends(eng.receive_message("a", RegGossip(reg, 16, 3), 1.0))
    assert [p for p, m in out if isinstance(m, RegGossip)] == ["c"]  # b is lazy from direction a
    flushed = sends(eng.handle_timer(1.0 + TREE.tree_announce_delay_s))
    assert [(p, m) for p, m in flushed if isinstance(m, RegAnnounce)] == [
        ("b", RegAnnounce((Announcement(reg.route_id, 1, 4, round(TREE.tree_announce_delay_s * 1000)),)))]
    out = sends(eng.receive_message("b", RegGossip(regs[-1], 16, 3), 1.1))  # another direction: eager
    assert sorted(p for p, m in out if isinstance(m, RegGossip)) == ["a", "c"]
    for _ in range(4):  # b needed our full frames after all (it grafted them)
        eng.receive_message("b", RegGraft(reg.route_id, 1), 1.2)
    reg2 = reg_for(40)
    out = sends(eng.receive_message("a", RegGossip(reg2, 16, 3), 1.3))
    assert sorted(p for p, m in out if isinstance(m, RegGossip)) == ["b", "c"]


def test_flood_stays_flood_and_a_flood_relay_still_learns_backups_from_announcements() -> None:
    reg = reg_for(6)
    eng = engine(EngineConfig())
    out = sends(eng.receive_message("a", RegGossip(reg, 16, 3), 0.0))
    assert sorted(p for p, _ in out) == ["b", "c"] and all(isinstance(m, RegGossip) for _, m in out)
    eng.receive_message("a", RegGossip(reg, 16, 3), 0.0)
    eng.receive_message("b", RegGossip(reg, 16, 3), 0.01)  # a duplicate: no prune under flood
    assert eng.get_timer() == pytest.approx(EngineConfig().keepalive_interval_s)
    eng.receive_message("c", RegAnnounce((Announcement(reg.route_id, 1, 1),)), 0.02)
    assert [p for p, _ in eng.next_hops(reg.route_id)] == ["a", "b"]  # b (3 < 4) took the room first


# -- a mesh of engines ---------------------------------------------------------------------------------


def _ring_with_chords(n: int) -> list[tuple[int, int]]:
    return [(i, (i + 1) % n) for i in range(n)] + [(i, (i + n // 2) % n) for i in range(0, n // 2, 2)]


@pytest.mark.parametrize("wire", [False, True])
def test_every_relay_gets_every_registration_with_fewer_bytes_than_flooding(wire: bool) -> None:
    n = 16
    edges = _ring_with_chords(n)
    rnd = random.Random(3)
    latency = {}
    for a, b in edges:
        latency[(a, b)] = latency[(b, a)] = rnd.uniform(0.005, 0.06)
    nbytes = {}
    for scheme in ("flood", "tree"):
        net = MiniNet(n, edges, config=replace(EngineConfig(), gossip_scheme=scheme), latency=latency, wire=wire)
        regs = [reg_for(50 + i) for i in range(60)]
        for i, reg in enumerate(regs):
            home = i % n
            net.homes[home].add_registration(reg, [])
            net.apply(str(home), net.engines[home].register(reg, net.now))
            net.run_until(net.now + 0.5)
        net.run_until(net.now + 2.0)
        for reg in regs:
            held = sum(1 for e in net.engines if e.route_epoch(reg.route_id) == 1)
            assert held == n, (scheme, held)
        gossip = (m for _, _, m in net.sent if isinstance(m, RegGossip | RegAnnounce | RegGraft))
        nbytes[scheme] = sum(len(encode(m)) for m in gossip)
        if scheme == "tree":
            assert any(isinstance(m, RegAnnounce) for _, _, m in net.sent)
    assert nbytes["tree"] < 0.95 * nbytes["flood"]


# -- the simulator ---------------------------------------------------------------------------------


def _scenario(scheme: str, seed: int, relays: int) -> dict[str, object]:
    return {
        "name": f"tree-{scheme}", "seed": seed, "duration_s": 40.0, "deadline_s": 15.0, "coverage_after_s": 5.0,
        "topology": {"relays": relays},
        "workload": {"registrations": 40, "registration_end_s": 8.0, "tokens_per_registration": 5,
                     "pushes": 60, "push_start_s": 12.0, "push_end_s": 25.0},
        "engine": {"keepalive_interval_s": 1.0, "gossip_scheme": scheme},
    }


@pytest.mark.parametrize("seed, relays", [(1, 60), (4, 90)])
def test_simulated_tree_gossip_costs_fewer_bytes_and_keeps_coverage_and_delivery(seed: int, relays: int) -> None:
    flood = Simulator(from_dict(_scenario("flood", seed, relays))).run().summary
    tree = Simulator(from_dict(_scenario("tree", seed, relays))).run().summary
    assert flood["gossip_scheme"] == "flood" and tree["gossip_scheme"] == "tree"
    # flooding sends nothing but full frames: its byte ratio is its frame ratio
    assert flood["gossip_bytes_ratio"] == pytest.approx(flood["overhead_ratio"])
    assert tree["gossip_bytes_ratio"] < 0.9 * flood["gossip_bytes_ratio"]
    assert tree["route_coverage"] == 1.0 and tree["delivery_ratio"] == flood["delivery_ratio"] == 1.0
    assert tree["route_k2_share"] >= 0.95 * flood["route_k2_share"]


@pytest.mark.integration
def test_the_cli_switches_the_scheme_with_one_flag() -> None:
    import json
    import subprocess
    import sys

    def run(*extra: str) -> dict[str, object]:
        proc = subprocess.run([sys.executable, "-m", "simulations.cli", "run", "tiny-50", "--trace-level", "summary",
                               "--progress", "off", *extra], capture_output=True, text=True, check=True)
        got: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
        return got

    flood, tree = run(), run("--gossip-scheme", "tree")
    assert (flood["gossip_scheme"], tree["gossip_scheme"]) == ("flood", "tree")
    assert flood["gossip_bytes_ratio"] == flood["overhead_ratio"]
    assert tree["gossip_bytes_ratio"] < flood["gossip_bytes_ratio"] < tree["overhead_ratio"]  # small frames
