"""Rule C3, custody until the push's TTL (issue 42 item 2), on the engine: a push outlives the fixed
custody_deadline_s while its only route is down, is delivered when the route returns, settles when its
TTL (a Web Push `TTL`, a native push's custody_max_ttl_s) is spent, and its parked re-sends back off to
custody_park_max_s so that a push kept for long costs a bounded number of messages."""

from __future__ import annotations

import math
from dataclasses import replace

from inri.core.api import CustodyStatus
from inri.core.config import EngineConfig
from inri.core.custody import PARK_BACKOFF_MAX
from inri.core.testing import MiniNet
from inri.protocol.messages import ContentEncoding, Urgency, WebPushMeta
from tests.test_core_engine import TOKENS, push, registered_net

OLD_DEADLINE_S = EngineConfig().custody_deadline_s  # 300 s: the fixed deadline before item 2


def parked_sends(net: MiniNet, relay: str, pid: bytes, after: float) -> list[float]:
    """When relay re-sent pid after the escalation (route re-sends and parked searches), from time `after`."""
    cfg = net.config
    return [t for t, r, kind, msg, *_, count, _n, _reason in net.tracer.rows
            if r == relay and msg == pid.hex() and t >= after and kind in ("push_retry", "push_fallback")
            and count is not None and count >= cfg.custody_max_attempts]


def test_a_push_outlives_the_old_deadline_and_is_delivered_when_its_home_returns() -> None:
    """The only route (the home relay) is down for 400 s, longer than the old 300 s deadline, and comes back
    within the push's TTL: the push is still in custody and is delivered, once."""
    net, reg = registered_net()
    net.kill(0)
    pid = push(net, 5, reg, TOKENS[0])
    t0 = net.now
    net.run_until(t0 + OLD_DEADLINE_S + 100.0)
    assert pid not in net.custody and net.engines[5]._custody.holds(pid)  # past 300 s: still kept
    net.restart(0)
    net.run_until(net.now + 5.0)
    net.apply("0", net.engines[0].register(reg, net.now))
    # The parked re-sends are now as far apart as the push has been kept beyond 300 s (100 s here).
    net.run_until(net.now + 2 * 100.0 + 10.0)
    assert net.custody.get(pid) == CustodyStatus.DELIVERED
    assert sum(1 for d in net.delivered if d[1] == pid) == 1


def test_a_native_push_settles_at_custody_max_ttl_with_backed_off_re_sends() -> None:
    """A native push (no TTL of its own) whose home never returns is kept until custody_max_ttl_s, not 300 s,
    then settles `expired` (a route had existed); past 300 s its re-sends double up to custody_park_max_s."""
    ttl, park_max = 3000.0, 600.0
    net, reg = registered_net(config=replace(EngineConfig(), custody_max_ttl_s=ttl, custody_park_max_s=park_max))
    net.kill(0)
    pid = push(net, 5, reg, TOKENS[0])
    t0 = net.now
    net.run_until(t0 + ttl - 1.0)
    assert pid not in net.custody and net.engines[5]._custody.holds(pid)
    net.run_until(t0 + ttl + 1.0)
    assert net.custody.get(pid) == CustodyStatus.EXPIRED
    late = parked_sends(net, "5", pid, t0 + OLD_DEADLINE_S)
    gaps = [b - a for a, b in zip(late, late[1:], strict=False)]
    short = PARK_BACKOFF_MAX * net.config.custody_retry_s
    # The bound stated in EngineConfig: log2(park_max / 32 s) + 1 doublings, then one per park_max.
    bound = math.ceil(math.log2(park_max / short)) + 1 + math.ceil((ttl - OLD_DEADLINE_S) / park_max)
    assert 0 < len(late) <= bound, (late, bound)
    assert max(gaps) == park_max and gaps == sorted(gaps), gaps  # backing off, capped


def test_a_web_push_push_settles_at_its_ttl() -> None:
    """A Web Push push with TTL 900 s whose home never returns settles at 900 s (not 300 s, not the cap)."""
    net, reg = registered_net()
    net.kill(0)
    meta = WebPushMeta(b"e" * 16, b"t" * 16, 900, Urgency.NORMAL, ContentEncoding.AES128GCM, None)
    pid = push(net, 5, reg, bytes(16), webpush=meta)
    t0 = net.now
    net.run_until(t0 + 899.0)
    assert pid not in net.custody
    net.run_until(t0 + 901.0)
    assert net.custody.get(pid) == CustodyStatus.EXPIRED

