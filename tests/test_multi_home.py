"""Homes in two places (issue 42, item 3), on the engine: a device registers the same route key (one route
id, one epoch) at two home relays, and both originate it (rule G2 at distance 0). Relays take the first
arrival (G2) and keep strictly closer arrivals as backups (G3, Babel's feasibility condition): each
relay's vector leads to the home whose flood reached it first."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inri.core.api import CustodyStatus
from inri.core.config import EngineConfig
from inri.core.testing import MiniNet
from inri.protocol.codec import make_registration
from inri.protocol.messages import Registration
from tests.test_core_engine import EDGES, KEY, SLOW, TOKENS, push

# EDGES: 0-1-2-3-4-5 and 1-6-7-3. The homes are 0 and 5.


def two_homes(*, stem: bool = False, second_after: float = 0.0) -> tuple[MiniNet, Registration]:
    """Home 0 registers the device at 0 s, home 5 `second_after` seconds later (both hold its tokens)."""
    net = MiniNet(8, EDGES, latency=SLOW, config=replace(EngineConfig(), stem=stem))
    reg = make_registration(KEY, 1, 0, 3600)
    net.homes[0].add_registration(reg, TOKENS)
    net.apply("0", net.engines[0].register(reg, 0.0))
    net.run_until(second_after)
    net.homes[5].add_registration(reg, TOKENS)
    net.apply("5", net.engines[5].register(reg, net.now))
    net.run_until(net.now + 5.0)
    return net, reg


def test_two_homes_registering_at_once_each_get_the_relays_nearer_to_them() -> None:
    """Neither origin is refused, and each relay's primary next hop leads to the home whose flood came
    first: 1, 2, 6 toward 0; 3, 4 toward 5; 7 (both floods in 3 hops) keeps one of each (G3)."""
    net, reg = two_homes()
    rid = reg.route_id
    assert not net.tracer.of_kind("reg_dropped")
    assert net.engines[0].next_hops(rid) == [] and net.engines[5].next_hops(rid) == []  # both are homes
    assert [net.engines[i].next_hops(rid)[0][0] for i in (1, 2, 6)] == ["0", "1", "1"]
    assert [net.engines[i].next_hops(rid)[0][0] for i in (3, 4)] == ["4", "5"]
    assert {p for p, _ in net.engines[7].next_hops(rid)} == {"3", "6"}


@pytest.mark.parametrize("stem", [False, True])
def test_a_second_home_registering_after_the_first_homes_flood_still_originates(stem: bool) -> None:
    """Home 5 already holds the route (epoch 1, learned from home 0's flood) when the device registers
    there too: it originates the route as well (it used to refuse it as `reg_local_stale`, and stayed a
    relay routing toward 0). With 0 down, a push injected at 5's neighbour is delivered at 5, once."""
    net, reg = two_homes(stem=stem, second_after=2.0)
    rid = reg.route_id
    assert net.engines[5].counters.get("reg_local_stale", 0) == 0
    assert net.engines[5].next_hops(rid) == []  # a home: distance 0, no next hop
    assert "5" in dict(net.engines[4].next_hops(rid))  # 4 keeps 5 as a (closer) backup
    net.kill(0)
    pid = push(net, 4, reg, TOKENS[0])
    net.run_until(net.now + 60.0)
    assert net.custody.get(pid) == CustodyStatus.DELIVERED
    assert [r for r, p in net.delivered if p == pid] == ["5"]


def test_the_same_epoch_registered_again_at_its_home_is_still_stale() -> None:
    """A home that originated an epoch refuses the same epoch again (single-home behaviour unchanged)."""
    net, reg = two_homes()
    assert net.engines[0].register(reg, net.now) == []
    assert net.engines[0].counters.get("reg_local_stale") == 1
