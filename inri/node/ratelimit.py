"""Per-client token buckets (HTTP APIs of relays and bootstrap nodes).

Clients are keyed by IPv4 address or IPv6 /64 (one IPv6 host usually owns a whole /64, so keying
on the full address would give it 2^64 buckets). The table is LRU-bounded so an address scan cannot
grow it without limit.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from inri.common.addr import rate_key
from inri.core.budget import KeyedBuckets

RATE_TABLE_MAX = 100_000  # client buckets kept (LRU)


_KEYS: dict[str, str] = {}  # client address -> rate_key(address) (parsing an address on every request costs)
KEYS_CACHED_MAX = 4096  # the cache is cleared when it holds this many


def client_key(scope: dict[str, Any]) -> str:
    """Rate-limit key of a request's client: the IPv4 address, or the IPv6 /64."""
    return client_key_of(scope.get("client"))


def client_key_of(client: tuple[Any, ...] | None) -> str:
    """client_key of an ASGI scope's `client` (host, port)."""
    host = str((client or ("unknown", 0))[0])
    key = _KEYS.get(host)
    if key is None:
        if len(_KEYS) >= KEYS_CACHED_MAX:
            _KEYS.clear()
        key = _KEYS[host] = rate_key(host)
    return key


class RateLimiter(KeyedBuckets):
    """Token buckets per client key (inri.core.budget), LRU-bounded at RATE_TABLE_MAX keys.

    `take` returns 0 when allowed, else seconds to wait.
    """

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(rate_per_s, burst, max_keys=RATE_TABLE_MAX, clock=clock)
