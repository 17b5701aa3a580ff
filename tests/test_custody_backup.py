"""Rule C8: the first relay of a custodian's route attempt adopts the push when the custodian's link fails.

Seen on built-5k-c3l1 seed 1 with frames lost for good (`--loss-model drop`, stem and withdrawal on): a
relay answered 202, its first attempt was lost on a live link, and it failed for good 3 s later, before
its next attempt; the push was never delivered although its home stayed up. On the in-memory harness."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from inri.core.config import EngineConfig
from inri.core.testing import MiniNet
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import Push, Registration

# Custodian 0 reaches the home 3 through 1 and 2; 1's other way is 4 (slower: the route goes through 2).
EDGES = [(0, 1), (1, 2), (2, 3), (1, 4), (4, 3)]
LATENCY = {(1, 4): 0.05, (4, 1): 0.05}
HOME = 3
CFG = replace(EngineConfig(), receipt_timeout_min_s=1.0)


def _net(seed: int, cfg: EngineConfig = CFG) -> tuple[MiniNet, Registration, list[bytes]]:
    net = MiniNet(5, EDGES, config=cfg, latency=LATENCY, seed=seed)
    net.run_until(1.0)
    reg = make_registration(new_signing_key(), 1, 0, 3600)
    tokens = [os.urandom(16) for _ in range(3)]
    net.homes[HOME].add_registration(reg, tokens)
    net.apply(str(HOME), net.engines[HOME].register(reg, net.now))
    net.run_until(4.0)
    assert [h for h, _ in net.engines[1].next_hops(reg.route_id)][0] == "2"
    return net, reg, tokens


def _lose_first_attempt_then_kill_custodian(net: MiniNet, reg: Registration, token: bytes) -> bytes:
    """The push's first copy is lost between 1 and 2 (a live link: nobody is told), then the custodian is
    killed -9 before its next attempt (its links just stop answering)."""
    lat = net.links.pop(("1", "2"))
    pid = net.inject(0, reg, token)
    net.run_until(net.now + 0.05)
    net.links[("1", "2")] = lat
    assert not net.delivered
    net.kill(0, silent=True)
    return pid


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_push_whose_custodian_dies_is_delivered_by_the_relay_that_held_its_copy(seed: int) -> None:
    net, reg, tokens = _net(seed)
    pid = _lose_first_attempt_then_kill_custodian(net, reg, tokens[0])
    net.run_until(net.now + 60.0)
    assert [(r, p) for r, p in net.delivered if p == pid] == [(str(HOME), pid)]  # once, at its home
    assert net.engines[1].stats().get("custody_adopted") == 1
    assert net.custody[pid].value == "delivered"  # relay 1's custody ended with the home's receipt


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_without_backups_the_push_dies_with_its_custodian(seed: int) -> None:
    net, reg, tokens = _net(seed, replace(CFG, custody_backup=False))
    pid = _lose_first_attempt_then_kill_custodian(net, reg, tokens[0])
    net.run_until(net.now + 60.0)
    assert pid not in {p for _, p in net.delivered}
    assert not net.engines[1].stats().get("custody_adopted")


def test_an_answered_push_is_not_adopted_and_costs_nothing_more() -> None:
    """The receipt passing back through the first relay ends its copy: a custodian that dies after its
    pushes were delivered leaves nothing to adopt, and no push frame leaves after its death."""
    net, reg, tokens = _net(1)
    pids = [net.inject(0, reg, t) for t in tokens]
    net.run_until(net.now + 2.0)
    assert {p for _, p in net.delivered} == set(pids)
    sent = len([m for _, _, m in net.sent if isinstance(m, Push)])
    net.kill(0, silent=True)
    net.run_until(net.now + 60.0)
    assert not net.engines[1].stats().get("custody_adopted")
    assert len([m for _, _, m in net.sent if isinstance(m, Push)]) == sent


def test_a_copy_with_a_forged_registration_is_not_adopted() -> None:
    """A hostile neighbour that sends pushes under a registration nobody signed and then drops its link
    gets no relay to search for them."""
    net, reg, tokens = _net(1)
    forged = replace(reg, signature=bytes(len(reg.signature)))
    res = net.engines[0].inject_push(reg, tokens[0], b"x", net.now)
    assert res.push_id is not None
    push = next(e.msg for e in res.effects if hasattr(e, "msg") and isinstance(e.msg, Push))
    lat = net.links.pop(("1", "2"))  # relay 1 keeps its copy: no receipt comes back
    net.apply("1", net.engines[1].receive_message("0", replace(push, registration=forged), net.now))
    net.run_until(net.now + 0.05)
    net.links[("1", "2")] = lat
    net.kill(0, silent=True)
    net.run_until(net.now + 60.0)
    assert not net.engines[1].stats().get("custody_adopted")

