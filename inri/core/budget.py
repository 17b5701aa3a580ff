"""Token buckets: the one rate-limit primitive of the relay (engine flood budgets, HTTP rate limits).

`TokenBucket` is one bucket. It stores no rate or burst: the engine keeps one bucket per neighbour
and per origin route id (millions in a simulation), all sharing the engine's configured rate, so the
caller passes rate and burst to `take`. `KeyedBuckets` is a table of buckets keyed by a string (one
per HTTP client address, device or token), bounded by dropping the least recently used.

Arithmetic order is fixed (refill, cap at burst, then spend): the simulator's traces depend on it bit
for bit.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class TokenBucket:
    """`tokens` refilled at `rate` per second up to `burst`; each `take` spends one."""

    __slots__ = ("t", "tokens")

    def __init__(self, tokens: float, t: float) -> None:
        self.tokens = tokens  # tokens at time t
        self.t = t  # when tokens was last brought up to date

    def take(self, now: float, rate: float, burst: float) -> bool:
        """Refill up to `now`; spend one token if there is one. False: over budget (nothing spent)."""
        dt = now - self.t
        if dt > 0.0:
            tokens = self.tokens + dt * rate
            if tokens > burst:  # the cap, as min(burst, tokens) but without a builtin call (hot path)
                tokens = burst
            self.t = now
        else:  # a clock that went back (a test's, a caller's): no refill, and never a negative one
            tokens = self.tokens
        if tokens < 1.0:
            self.tokens = tokens
            return False
        self.tokens = tokens - 1.0
        return True

    def wait(self, rate: float) -> float:
        """Seconds until one token is available (0 when one is), as of the last `take`."""
        return max(0.0, (1.0 - self.tokens) / rate)


class KeyedBuckets:
    """One token bucket per key, at most `max_keys` of them (least recently used dropped first).

    `take(key)` returns 0.0 when allowed, else the seconds to wait for a token; `hits` counts
    refusals. The clock is injectable (virtual time in the simulator, monotonic in the daemon).
    """

    def __init__(
        self, rate_per_s: float, burst: float, *, max_keys: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate = rate_per_s
        self.burst = float(burst)
        self.max_keys = max_keys
        self.clock = clock
        self._buckets: dict[str, TokenBucket] = {}
        self.hits = 0

    def take(self, key: str) -> float:
        """Spend one token of key's bucket: 0.0 when allowed, else seconds until a token is due."""
        now = self.clock()
        buckets = self._buckets
        bucket = buckets.pop(key, None)
        if bucket is None:
            bucket = TokenBucket(self.burst, now)
            buckets[key] = bucket  # most recently used last (a dict keeps insertion order)
            while len(buckets) > self.max_keys:
                del buckets[next(iter(buckets))]
        else:
            buckets[key] = bucket
        if bucket.take(now, self.rate, self.burst):
            return 0.0
        self.hits += 1
        return bucket.wait(self.rate)
