"""Engine safety and liveness over random small topologies and event orders (hypothesis)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from inri.core.config import EngineConfig
from inri.core.testing import MiniNet
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import Push

CAPS = replace(EngineConfig(), push_seen_max=50, reverse_max=40, custody_retry_s=0.5, keepalive_interval_s=0.5)


@st.composite
def topologies(draw: st.DrawFn) -> tuple[int, list[tuple[int, int]], dict[tuple[int, int], float]]:
    n = draw(st.integers(3, 9))
    cap = EngineConfig().active_max  # relays hold at most active_max links: so do the topologies
    deg = [0] * n
    edges = set()
    for i in range(1, n):  # a random spanning tree (connected), degrees capped
        parent = draw(st.sampled_from([j for j in range(i) if deg[j] < cap - 1] or [i - 1]))
        edges.add((parent, i))
        deg[parent] += 1
        deg[i] += 1
    for _ in range(draw(st.integers(0, n))):
        a, b = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
        if a != b and deg[a] < cap and deg[b] < cap and (min(a, b), max(a, b)) not in edges:
            edges.add((min(a, b), max(a, b)))
            deg[a] += 1
            deg[b] += 1
    lat = {}
    for a, b in edges:
        lat[(a, b)] = draw(st.floats(0.001, 0.1))
        lat[(b, a)] = draw(st.floats(0.001, 0.1))
    return n, sorted(edges), lat


def next_hop_graph_is_acyclic(net: MiniNet, rid: bytes) -> bool:
    graph = {str(i): [p for p, _ in e.next_hops(rid)] for i, e in enumerate(net.engines) if net.alive[i]}
    state: dict[str, int] = {}

    def visit(u: str) -> bool:
        state[u] = 1
        for v in graph.get(u, []):
            if v == u or state.get(v) == 1 or (state.get(v) is None and not visit(v)):
                return False
        state[u] = 2
        return True

    return all(state.get(u) == 2 or visit(u) for u in graph)


@settings(max_examples=150)
@given(topologies(), st.data())
def test_safety_under_random_events(topo: tuple, data: st.DataObject) -> None:
    n, edges, lat = topo
    net = MiniNet(n, edges, config=CAPS, latency=lat, seed=data.draw(st.integers(0, 99)),
                  wire=data.draw(st.booleans()))
    regs = []
    for r in range(data.draw(st.integers(1, 3))):
        key = new_signing_key(bytes([r + 1]) * 32)
        home = data.draw(st.integers(0, n - 1))
        tokens = [bytes([r, i]) * 8 for i in range(6)]
        reg = make_registration(key, 1, 0, 3600)
        net.homes[home].add_registration(reg, tokens)
        net.apply(str(home), net.engines[home].register(reg, net.now))
        regs.append((key, home, tokens, reg))
    epochs: dict[tuple[int, bytes], int] = {}
    for _ in range(data.draw(st.integers(1, 12))):
        action = data.draw(st.sampled_from(["push", "push", "kill", "refresh", "wait"]))
        r = data.draw(st.integers(0, len(regs) - 1))
        key, home, tokens, reg = regs[r]
        at = data.draw(st.integers(0, n - 1))
        if action == "push" and net.alive[at]:
            res = net.engines[at].inject_push(reg, data.draw(st.sampled_from(tokens)), b"x", net.now)
            net.apply(str(at), res.effects)
        elif action == "kill" and at != home and sum(net.alive) > 2:
            net.kill(at)
        elif action == "refresh" and net.alive[home]:
            reg = make_registration(key, reg.epoch + 1, int(net.now), 3600)
            regs[r] = (key, home, tokens, reg)
            net.homes[home].add_registration(reg, [])
            net.apply(str(home), net.engines[home].register(reg, net.now))
        net.run_until(net.now + data.draw(st.floats(0.0, 2.0)))
        for i, e in enumerate(net.engines):  # an epoch never goes backward
            for _, _, _, rg in regs:
                ep = e.route_epoch(rg.route_id)
                if ep is not None:
                    assert ep >= epochs.get((i, rg.route_id), 0)
                    epochs[(i, rg.route_id)] = ep
    net.run_until(net.now + 20.0)
    # no relay sends the same (push id, attempt, mode) to the same neighbour twice
    sends = Counter((a, b, m.push_id, m.attempt, m.ring > 0) for a, b, m in net.sent if isinstance(m, Push))
    assert max(sends.values(), default=1) == 1
    # a push id is stored at most once; a token is spent at most once
    assert max(Counter(p for _, p in net.delivered).values(), default=1) == 1
    for _, home, _, reg in regs:
        box = net.homes[home].mailboxes[reg.route_id]
        assert len(box) == len(net.homes[home]._spent[reg.route_id])
    for _, _, _, reg in regs:
        assert next_hop_graph_is_acyclic(net, reg.route_id)
        for i, e in enumerate(net.engines):
            assert all(p != str(i) for p, _ in e.next_hops(reg.route_id))
    for e in net.engines:
        s = e.stats()
        assert s["seen"] <= CAPS.push_seen_max and s["reverse"] <= CAPS.reverse_max
        assert s["active"] <= CAPS.active_max


@settings(max_examples=100)
@given(topologies(), st.data())
def test_every_push_is_delivered_exactly_once_on_a_settled_mesh(topo: tuple, data: st.DataObject) -> None:
    n, edges, lat = topo
    net = MiniNet(n, edges, latency=lat, seed=3)
    home = data.draw(st.integers(0, n - 1))
    reg = make_registration(new_signing_key(b"\x09" * 32), 1, 0, 3600)
    tokens = [bytes([i]) * 16 for i in range(10)]
    net.homes[home].add_registration(reg, tokens)
    net.apply(str(home), net.engines[home].register(reg, 0.0))
    net.run_until(2.0)
    ids = []
    for token in tokens[: data.draw(st.integers(1, 10))]:
        at = data.draw(st.integers(0, n - 1))
        res = net.engines[at].inject_push(reg, token, b"m", net.now)
        net.apply(str(at), res.effects)
        ids.append(res.push_id)
        net.run_until(net.now + data.draw(st.floats(0.0, 0.2)))
    net.run_until(net.now + 10.0)
    assert sorted(p for _, p in net.delivered) == sorted(ids)
    assert all(r == str(home) for r, _ in net.delivered)
    assert all(net.custody[p] == "delivered" for p in ids)
    assert not net.tracer.of_kind("push_fallback")  # a settled mesh never needs the fallback


@settings(max_examples=100)
@given(topologies(), st.data())
def test_safety_with_a_hostile_peer(topo: tuple, data: st.DataObject) -> None:
    """Random events with one hostile relay: a black hole that also sends garbage, forged and replayed
    gossip, push floods and orphan receipts. Honest relays stay safe and bounded, and a rejected frame
    never changes an honest relay's routes, custody or reverse-path state."""
    from inri.protocol.messages import Receipt, ReceiptStatus, RegGossip, Registration

    n, edges, lat = topo
    net = MiniNet(n, edges, config=CAPS, latency=lat, seed=data.draw(st.integers(0, 99)))
    bad = data.draw(st.integers(0, n - 1))
    hostile = str(bad)
    net.engines[bad]._on_push = lambda peer, msg, now: []  # type: ignore[method-assign]  # black hole
    honest = [i for i in range(n) if i != bad]
    key = new_signing_key(b"\x33" * 32)
    home = data.draw(st.sampled_from(honest))
    tokens = [bytes([9, i]) * 8 for i in range(8)]
    reg = make_registration(key, 1, 0, 3600)
    net.homes[home].add_registration(reg, tokens)
    net.apply(str(home), net.engines[home].register(reg, net.now))
    gossip_seen = [reg]

    def neighbours_of_hostile() -> list[int]:
        return [i for i in honest if hostile in net.engines[i].active_peers()]

    def snapshot(i: int) -> tuple:
        e = net.engines[i]
        s = e.stats()
        return (s["routes"], s["custody"], s["reverse"], e.next_hops(reg.route_id))

    for _ in range(data.draw(st.integers(1, 15))):
        action = data.draw(st.sampled_from(["push", "garbage", "forge", "replay", "flood", "receipt", "wait"]))
        targets = neighbours_of_hostile()
        if action == "push":
            at = data.draw(st.sampled_from(honest))
            res = net.engines[at].inject_push(reg, data.draw(st.sampled_from(tokens)), b"x", net.now)
            net.apply(str(at), res.effects)
        elif action != "wait" and targets:
            to = data.draw(st.sampled_from(targets))
            eng = net.engines[to]
            if action == "garbage":
                before = snapshot(to)
                net.apply(str(to), eng.receive_frame(hostile, data.draw(st.binary(max_size=64)), net.now))
                if hostile in eng.active_peers() or not eng.stats().get("routes_purged"):
                    assert snapshot(to)[:3] == before[:3]
            elif action == "forge":
                k = data.draw(st.binary(min_size=32, max_size=32))
                forged = Registration(k, 1, 0, 3600, bytes(64))
                before = snapshot(to)
                net.apply(str(to), eng.receive_message(hostile, RegGossip(forged, 8, 0), net.now))
                assert snapshot(to)[0] == before[0]  # no route from a forged registration
            elif action == "replay":
                net.apply(str(to), eng.receive_message(hostile, RegGossip(gossip_seen[0], 8, 0), net.now))
            elif action == "flood":
                for j in range(data.draw(st.integers(1, 30))):
                    pid = b"\xfe" + bytes([j]) * 15
                    net.apply(str(to), eng.receive_message(hostile, Push(pid, reg.route_id, b"t" * 16, b"x", 8, 1,
                                                                         0, 0, reg), net.now))
            elif action == "receipt":
                before = snapshot(to)
                orphan = data.draw(st.binary(min_size=16, max_size=16))
                known = eng._reverse.back(orphan) is not None or orphan in eng._await  # a push it did send us
                net.apply(str(to), eng.receive_message(hostile, Receipt(orphan, ReceiptStatus.STORED, 2), net.now))
                if not known:
                    assert snapshot(to) == before
        net.run_until(net.now + data.draw(st.floats(0.0, 2.0)))
    net.run_until(net.now + 20.0)
    assert max(Counter(p for _, p in net.delivered).values(), default=1) == 1
    box = net.homes[home].mailboxes[reg.route_id]
    assert len(box) == len(net.homes[home]._spent[reg.route_id])
    graph = {str(i): [p for p, _ in net.engines[i].next_hops(reg.route_id) if p != hostile] for i in honest}
    state: dict[str, int] = {}

    def acyclic(u: str) -> bool:
        state[u] = 1
        for v in graph.get(u, []):
            if state.get(v) == 1 or (state.get(v) is None and not acyclic(v)):
                return False
        state[u] = 2
        return True

    assert all(state.get(u) == 2 or acyclic(u) for u in graph)
    for i in honest:
        s = net.engines[i].stats()
        assert s["seen"] <= CAPS.push_seen_max and s["reverse"] <= CAPS.reverse_max
        assert s["active"] <= CAPS.active_max and s["awaiting_receipt"] <= CAPS.reverse_max
        if s.get("peer_cut_score"):
            assert hostile not in net.engines[i].active_peers()
