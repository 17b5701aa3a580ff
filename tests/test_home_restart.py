"""A home relay that restarts (issue 15 item 2): pushes it should keep are not lost.

In the in-memory harness (inri.core.testing.MiniNet): the home comes back, with its former neighbour or
with other neighbours, and a push entered far away while it was down is delivered without a device
refresh. With real processes: tests/test_home_restart.py::test_kill9_of_the_home_relay_* below.
"""

from __future__ import annotations

import os

import pytest

from inri.core.api import CustodyStatus
from inri.core.testing import MiniNet
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key, receipt_public_key

HOME = 6
CHAIN = [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5), (5, HOME)]


def _moved(net: MiniNet, old: int, new: int) -> None:
    """The home's link to `old` is gone for good; it comes back linked to `new` instead."""
    for a, b in ((str(old), str(HOME)), (str(HOME), str(old))):
        net.links.pop((a, b), None)
    net.links[(str(new), str(HOME))] = net.links[(str(HOME), str(new))] = 0.01


@pytest.mark.parametrize(("extra", "back_at", "why"), [
    ([], 5, "the same neighbour: the home's link-up announcement restores the route there"),
    ([], 3, "a relay on the path: it takes the home as a next hop, the route error demotes the dead one"),
    ([(5, 7)], 7, "off the path, next to the old neighbour: its search (radius 2) finds the home"),
])
def test_home_back_with_other_neighbours_far_push_delivered_without_refresh(
    extra: list[tuple[int, int]], back_at: int, why: str
) -> None:
    n = 8 if extra else 7
    net = MiniNet(n, CHAIN + extra)
    net.run_until(1.0)
    secret = os.urandom(32)
    reg = make_registration(new_signing_key(), 1, 0, 3600, receipt_public_key(secret))
    tokens = [os.urandom(16) for _ in range(3)]
    net.homes[HOME].add_registration(reg, tokens, secret)
    net.apply(str(HOME), net.engines[HOME].register(reg, net.now))
    net.run_until(3.0)
    assert net.engines[0].has_route(reg.route_id)
    net.kill(HOME)
    if back_at != 5:
        _moved(net, 5, back_at)
    net.run_until(4.0)
    # Entered at the far end while the home is down: in custody at relay 0.
    res = net.engines[0].inject_push(reg, tokens[0], b"while down", net.now)
    assert res.push_id is not None
    net.apply("0", res.effects)
    net.run_until(10.0)
    assert res.push_id not in net.custody  # still pending: the home is down
    net.restart(HOME)  # no device refresh: the home originates what its store holds, as the daemon does
    net.run_until(70.0)
    assert net.custody.get(res.push_id) == CustodyStatus.DELIVERED, why
    assert [p for _, p in net.delivered].count(res.push_id) == 1
    # A second push after the restart goes straight through.
    res2 = net.engines[0].inject_push(reg, tokens[1], b"after", net.now)
    assert res2.push_id is not None
    net.apply("0", res2.effects)
    net.run_until(net.now + 5.0)
    assert net.custody.get(res2.push_id) == CustodyStatus.DELIVERED, why


def test_a_restarted_home_is_not_scored_as_a_replayer_by_its_former_neighbours() -> None:
    """The home's announcement of a (route, epoch) its neighbour still credits to it is no replay (G5)."""
    net = MiniNet(3, [(0, 1), (1, 2)])
    net.run_until(1.0)
    regs = [make_registration(new_signing_key(), 1, 0, 3600) for _ in range(30)]
    for r in regs:
        net.homes[2].add_registration(r, [os.urandom(16)])
        net.apply("2", net.engines[2].register(r, net.now))
    net.run_until(3.0)
    net.kill(2)
    net.run_until(4.0)
    net.restart(2)
    net.run_until(10.0)
    assert net.engines[1].peer_scores().get("2", 0.0) >= 0.0
    assert "reg_dropped_replayed" not in net.engines[1].counters
    assert net.engines[2].counters.get("reg_announced", 0) >= 30
