"""Rule C6: a neighbour the transport reports unresponsive (QUIC: nothing acknowledged through two probe
timeouts) is passed over at once, on the in-memory harness (inri.core.testing.MiniNet)."""

from __future__ import annotations

import os
from dataclasses import replace

from inri.core.config import EngineConfig
from inri.core.testing import MiniNet
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key, receipt_public_key
from inri.protocol.messages import Push, Registration

# 0 - 1 - 2 - 3 and 1 - 4 - 3: the home is 3; relay 1 reaches it through 2 (fast, primary) or 4 (backup).
EDGES = [(0, 1), (1, 2), (2, 3), (1, 4), (4, 3)]
LATENCY = {(1, 4): 0.03, (4, 1): 0.03, (4, 3): 0.03, (3, 4): 0.03}
# The custodian's own retry comes no sooner than 1 s: what is measured here is the relay's re-send.
CFG = replace(EngineConfig(), receipt_timeout_min_s=1.0)


def _net(transport_acks: bool = True) -> tuple[MiniNet, Registration, list[bytes]]:
    net = MiniNet(5, EDGES, config=CFG, latency=LATENCY, transport_acks=transport_acks)
    net.run_until(1.0)
    secret = os.urandom(32)
    reg = make_registration(new_signing_key(), 1, 0, 3600, receipt_public_key(secret))
    tokens = [os.urandom(16) for _ in range(4)]
    net.homes[3].add_registration(reg, tokens, secret)
    net.apply("3", net.engines[3].register(reg, net.now))
    net.run_until(3.0)
    assert [h for h, _ in net.engines[1].next_hops(reg.route_id)] == ["2", "4"]
    return net, reg, tokens


def _forwarded_to(net: MiniNet, src: str, dst: str, pid: bytes) -> int:
    return sum(1 for a, b, m in net.sent if a == src and b == dst and isinstance(m, Push) and m.push_id == pid)


def test_a_relay_whose_next_hop_died_re_sends_over_the_backup_before_the_custodian_retries() -> None:
    """Relay 2 dies silently (kill -9: no link goes down until keepalives time out, 3 s here). Relay 1
    forwards the push to it; 1's transport reports 2 unresponsive three probe timeouts later, and 1
    re-sends over 4 at once: the push is home well before the custodian's retry, which never comes.
    A later push is not sent to 2 at all while 2 stays silent. Before C6 the first push waited for the
    custodian's retry (1 s and more) and the second one was lost in 2 as well."""
    net, reg, tokens = _net()
    net.kill(2, silent=True)
    t0 = net.now
    first = net.inject(0, reg, tokens[0])
    net.run_until(t0 + 0.5)
    assert ("3", first) in net.delivered
    assert net.engines[1].stats().get("push_rerouted_unresponsive", 0) == 1
    net.run_until(t0 + 1.5)
    assert not [r for r in net.tracer.of_kind("push_retry") if r[3] == first.hex()]  # no custodian retry
    second = net.inject(0, reg, tokens[1])
    net.run_until(net.now + 0.3)  # keepalives have not declared 2 down yet
    assert "2" in net.engines[1].active_peers()
    assert ("3", second) in net.delivered
    assert _forwarded_to(net, "1", "2", second) == 0 and _forwarded_to(net, "1", "4", second) == 1


def test_an_unresponsive_report_on_a_live_lossy_link_is_forgotten_at_its_next_frame() -> None:
    """A false report (a live link that lost a frame and its retransmission) costs one detour: the next
    frame from that neighbour makes it a next hop like any other again, and the link stays up."""
    net, reg, tokens = _net()
    other = make_registration(new_signing_key(), 1, 0, 3600)  # a second route the detour does not touch
    net.homes[3].add_registration(other, tokens[2:])
    net.apply("3", net.engines[3].register(other, net.now))
    links = net.engines[1]._neighbours
    heard = links.active()["2"].last_heard
    while links.active()["2"].last_heard == heard:  # after 2's keepalive round: the next is ~1 s off
        net.run_until(net.now + 0.005)
    net.run_until(net.now + 0.1)
    assert [h for h, _ in net.engines[1].next_hops(other.route_id)] == ["2", "4"]
    net.apply("1", net.engines[1].link_unresponsive("2", net.now))
    detour = net.inject(0, reg, tokens[0])
    net.run_until(net.now + 0.2)
    assert _forwarded_to(net, "1", "4", detour) == 1 and _forwarded_to(net, "1", "2", detour) == 0
    net.run_until(net.now + 2.0)  # 2's keepalive (or its answer to 1's) arrives meanwhile
    assert "2" in net.engines[1].active_peers()
    back = net.inject(0, other, tokens[2])
    net.run_until(net.now + 0.3)
    assert _forwarded_to(net, "1", "2", back) == 1
    assert {("3", detour), ("3", back)} <= set(net.delivered)


def test_a_relay_left_without_another_next_hop_searches_its_neighbourhood_at_once() -> None:
    """Relay 1's only next hop for the route (2) dies silently; 1's neighbour 4, linked after the route
    was gossiped, has a route of its own (via 5). Reported unresponsive, 2 is passed over: 1 searches
    radius 2 (F3's local repair) for the push's first attempt, and 4 carries it home, well before the
    custodian's retry. Before C6 the push waited for that retry."""
    net = MiniNet(6, [(0, 1), (1, 2), (2, 3), (4, 5), (5, 3)], config=CFG, transport_acks=True)
    net.run_until(1.0)
    reg = make_registration(new_signing_key(), 1, 0, 3600)
    tokens = [os.urandom(16)]
    net.homes[3].add_registration(reg, tokens)
    net.apply("3", net.engines[3].register(reg, net.now))
    net.run_until(3.0)
    net.links[("1", "4")] = net.links[("4", "1")] = 0.01
    net.link_up("1", "4")
    net.run_until(3.5)
    assert [h for h, _ in net.engines[1].next_hops(reg.route_id)] == ["2"]
    assert net.engines[4].has_route(reg.route_id)
    net.kill(2, silent=True)
    t0 = net.now
    pid = net.inject(0, reg, tokens[0])
    net.run_until(t0 + 0.6)
    assert ("3", pid) in net.delivered
    assert net.engines[1].stats().get("push_local_repair", 0) == 1
    net.run_until(t0 + 1.5)
    assert not [r for r in net.tracer.of_kind("push_retry") if r[3] == pid.hex()]
