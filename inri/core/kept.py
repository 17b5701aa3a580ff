"""Pushes in custody (rules C1-C3, C7): one owner, `CustodyTable`, held by the engine as `_custody`.

A custodian keeps each push a home app injected until its receipt returns or its deadline passes
(custody.py's rules decide when and where to try again). The table holds the records and the retry
timers: a heap of (when, sequence, push id), the sequence keeping equal times in scheduling order. A
push settled or re-scheduled leaves a stale heap entry behind; it is dropped when it comes up, and only an
entry whose time is its record's `next_retry` fires.
"""

from __future__ import annotations

import heapq

from inri.protocol.messages import Push


class Custody:
    """A push this relay accepted from a home app, kept until its receipt returns (C1-C3)."""

    __slots__ = ("push", "attempt", "ring_step", "deadline", "next_retry", "home_down", "routed", "ring_spent",
                 "sent_to", "sent_at", "refused", "ring_watch", "ring_full", "ring_finds")

    def __init__(self, push: Push, deadline: float) -> None:
        self.push = push
        self.attempt = 0
        self.ring_step = 0
        self.home_down = False  # a relay next to the home reported it unreachable
        self.routed = False  # some attempt left along a cached route
        self.ring_spent = 0  # worst-case ring messages of the rings sent so far (fallback_budget)
        self.deadline = deadline
        self.next_retry = 0.0
        # Rule C7: the one next hop the last attempt went to (None: a ring or none), and when.
        self.sent_to: str | None = None
        self.sent_at = 0.0
        # Rule F5c: a `not home` came back for it (its home holds no key of its registration; unsigned, so
        # it settles the push only at the deadline, as `unknown_registration`).
        self.refused = False
        # Rule C2b: the last attempt was a ring (ring_watch); ring_full is the retry it had before its quick
        # verdict (due at next_retry; 0.0: none pending); ring_finds how many `repair found` came back for it.
        self.ring_watch = False
        self.ring_full = 0.0
        self.ring_finds = 0


class CustodyTable:
    """push id -> its custody record, in the order taken, and the retry timers (C2)."""

    __slots__ = ("_records", "_timers", "_seq")

    def __init__(self) -> None:
        self._records: dict[bytes, Custody] = {}
        self._timers: list[tuple[float, int, bytes]] = []  # (when, seq, push id)
        self._seq = 0  # the last seq given out

    def __len__(self) -> int:
        return len(self._records)

    def holds(self, pid: bytes) -> bool:
        """Whether push pid is in custody here."""
        return pid in self._records

    def get(self, pid: bytes) -> Custody | None:
        """The custody record of push pid (None: not in custody here)."""
        return self._records.get(pid)

    def take(self, custody: Custody) -> None:
        """Rule C1: keep custody (replacing any record of the same push id)."""
        self._records[custody.push.push_id] = custody

    def release(self, pid: bytes) -> Custody | None:
        """Custody of push pid ends; its record (None: it was not kept). Its timers go stale."""
        return self._records.pop(pid, None)

    def records(self) -> list[Custody]:
        """Every record, in the order taken."""
        return list(self._records.values())

    def expire(self, now: float) -> int:
        """Drop every record whose deadline has come (the sweep); how many went."""
        gone = [pid for pid, c in self._records.items() if now >= c.deadline]
        for pid in gone:
            del self._records[pid]
        return len(gone)

    # Rule C2.
    def schedule(self, pid: bytes, when: float) -> None:
        """Arm a retry of push pid at `when` (its record's next_retry says which timer is live)."""
        self._seq += 1
        heapq.heappush(self._timers, (when, self._seq, pid))

    def next_due(self) -> float | None:
        """When the earliest live retry is due (None: none); stale timers ahead of it are dropped."""
        timers = self._timers
        records = self._records
        while timers:
            first, _, pid = timers[0]
            c = records.get(pid)
            if c is not None and c.next_retry == first:
                return first
            heapq.heappop(timers)
        return None

    def pop_due(self, now: float) -> Custody | None:
        """The next record whose retry is due by now, its timer spent (None: none due). A retry scheduled
        while the caller works through the due ones comes up in the same pass if it is due too."""
        timers = self._timers
        while timers and timers[0][0] <= now:
            when, _, pid = heapq.heappop(timers)
            c = self._records.get(pid)
            if c is not None and c.next_retry == when:
                return c
        return None
