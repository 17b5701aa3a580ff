"""Pushes a relay forwarded along a route and awaits an answer for (rules F6, S1, C4-C6): one owner,
`AwaitedAnswers`, held by the engine as `_await`.

An answer (a receipt or a route error) ends the wait; none by the deadline blames the next hop (S1) and
may report a hole upstream (F6). The deadline shrinks with the hops the copy travelled (forwarding.py),
so the relay nearest a black hole gives up first. The copy sent is kept: its hops and attempt give
round-trip samples (C4), and C5/C6 re-send it over another next hop.
"""

from __future__ import annotations

import heapq

from inri.core.tables import BoundedMap
from inri.protocol.messages import Push

# (next hop, deadline, sent at, route id, the copy sent)
Awaited = tuple[str, float, float, bytes, Push]


class AwaitedAnswers:
    """push id -> the copy awaited from its next hop, in send order, with a heap of deadlines (an answered
    or re-sent push leaves a stale heap entry, dropped when it comes up)."""

    __slots__ = ("_waits", "_deadlines")

    def __init__(self, max_size: int) -> None:
        self._waits: BoundedMap[bytes, Awaited] = BoundedMap(max_size)
        self._deadlines: list[tuple[float, bytes]] = []

    def __len__(self) -> int:
        return len(self._waits)

    def __contains__(self, pid: bytes) -> bool:
        return pid in self._waits

    def expect(self, pid: bytes, nh: str, deadline: float, now: float, rid: bytes, copy: Push) -> None:
        """Await an answer for `copy` of push pid, sent to nh now, until deadline (replaces any wait for pid)."""
        self._waits.put_last(pid, (nh, deadline, now, rid, copy))
        heapq.heappush(self._deadlines, (deadline, pid))

    def get(self, pid: bytes) -> Awaited | None:
        """What is awaited for push pid (None: nothing)."""
        return self._waits.get(pid)

    def discard(self, pid: bytes) -> None:
        """Stop awaiting push pid (answered, or sent another way)."""
        self._waits.pop(pid, None)

    def awaited_from(self, peer: str, now: float) -> list[tuple[bytes, Push]]:
        """The pushes still awaited from peer, before their deadline: (push id, the copy sent), in send order."""
        return [(pid, w[4]) for pid, w in self._waits.items() if w[0] == peer and w[1] > now]

    def next_deadline(self) -> float | None:
        """The earliest deadline still awaited (None: none); stale heap entries go here, not on a wakeup."""
        heap = self._deadlines
        waits = self._waits
        while heap:
            deadline, pid = heap[0]
            w = waits.get(pid)
            if w is not None and w[1] == deadline:
                return deadline
            heapq.heappop(heap)
        return None

    def pop_overdue(self, now: float) -> tuple[bytes, Awaited] | None:
        """The next push whose deadline passed by now, no longer awaited (None: none is overdue)."""
        heap = self._deadlines
        waits = self._waits
        while heap and heap[0][0] <= now:
            deadline, pid = heapq.heappop(heap)
            w = waits.get(pid)
            if w is None or w[1] != deadline:
                continue  # answered, or sent again since
            del waits[pid]
            return pid, w
        return None
