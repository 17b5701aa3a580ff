"""One task per server that acts on every connection's deadlines: no timer or task per connection.

A connection keeps its deadlines as plain floats (writing one costs an attribute store, which is why
the hot path can set one per request) and registers with the sweeper only when a deadline is earlier
than the time it is registered at. The sweeper sleeps until the earliest registration, then asks each
connection that is due what it wants next (`due(now)`: close, ping, or a later time). A registration
that a later one replaced is dropped when it comes up (trio's own Deadlines work this way), so the heap
holds about one entry per connection. Exact: a connection is handled at its deadline, not at a tick.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Protocol

import trio

__all__ = ["Sweeper", "Timed"]


class Timed(Protocol):
    """What the sweeper handles: `armed` is the time it is registered at (math.inf: not registered)."""

    armed: float

    def due(self, now: float) -> float:
        """Act on what is due at now; the next deadline (> now), or math.inf for none."""
        ...


class Sweeper:
    """The deadlines of a server's connections (see the module docstring)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timed]] = []
        self._seq = itertools.count()
        self._scope: trio.CancelScope | None = None
        self._wake_at = math.inf

    def __len__(self) -> int:
        return len(self._heap)

    def arm(self, item: Timed, at: float) -> None:
        """Make sure item is handled at `at` (or earlier); callers check `at < item.armed` first."""
        item.armed = at
        heapq.heappush(self._heap, (at, next(self._seq), item))
        if at < self._wake_at:
            self._wake_at = at
            if self._scope is not None:
                self._scope.deadline = at

    async def run(self) -> None:
        """Handle deadlines until cancelled."""
        heap = self._heap
        while True:
            self._wake_at = heap[0][0] if heap else math.inf
            with trio.CancelScope(deadline=self._wake_at) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None
            self._wake_at = -math.inf  # arm() during the sweep must not touch a finished scope
            now = trio.current_time()
            while heap and heap[0][0] <= now:
                at, _, item = heapq.heappop(heap)
                if at != item.armed:
                    continue  # replaced by an earlier registration
                item.armed = math.inf
                following = item.due(now)
                if following < math.inf:
                    self.arm(item, following)
