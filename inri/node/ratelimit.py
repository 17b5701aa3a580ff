"""Per-client token buckets (HTTP APIs of relays and bootstrap nodes).

Clients are keyed by IPv4 address or IPv6 /64 (one IPv6 host usually owns a whole /64, so keying
on the full address would give it 2^64 buckets). The table is LRU-bounded so an address scan cannot
grow it without limit.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from inri.common.addr import rate_key

RATE_TABLE_MAX = 100_000  # client buckets kept (LRU)


def client_key(scope: dict[str, Any]) -> str:
    """Rate-limit key of a request's client: the IPv4 address, or the IPv6 /64."""
    client = scope.get("client") or ("unknown", 0)
    return rate_key(str(client[0]))


class RateLimiter:
    """Token buckets per client key, LRU-bounded. `take` returns 0 when allowed, else seconds to wait."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate_per_s
        self.burst = float(burst)
        self.clock = clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self.hits = 0

    def take(self, key: str) -> float:
        now = self.clock()
        tokens, t = self._buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - t) * self.rate)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            wait = 0.0
        else:
            self._buckets[key] = (tokens, now)
            self.hits += 1
            wait = (1.0 - tokens) / self.rate
        while len(self._buckets) > RATE_TABLE_MAX:
            self._buckets.popitem(last=False)
        return wait
