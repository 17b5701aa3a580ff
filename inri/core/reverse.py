"""Reverse paths (rules F4, F6b, F1's answers, C1's markers): one owner, `ReversePaths`, held by the engine
as `_reverse`.

For each push a relay handled, where its answer (a receipt or a route error) goes back: the previous hop,
or a `ReverseMark` when the answer ends here. Entries expire `reverse_ttl_s` after they were set; the map
is bounded (`reverse_max`), oldest first out. A custodian's own `LOCAL` marker outlives the sweep: custody
(kept.py) decides when it goes.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from inri.core.tables import BoundedMap
from inri.protocol.messages import Registration


class ReverseMark(Enum):
    """Reverse-path entries that are not a previous hop (push id -> previous hop or one of these)."""

    LOCAL = 1  # the push was injected here: this relay is its custodian
    # Custody gave up: a receipt that still comes back (the last attempt got through late) corrects
    # the final status instead of being lost.
    LATE = 2


# (previous hop or mark, expiry, the push's registration: whose receipt key its receipt needs, hops of the
# copy that set it: -1 for a mark)
Back = tuple[str | ReverseMark, float, Registration | None, int]

_LOCAL = ReverseMark.LOCAL
_LATE = ReverseMark.LATE


class ReversePaths:
    """push id -> where its answer goes back (`Back`), in the order set."""

    __slots__ = ("_backs", "_ttl")

    def __init__(self, max_size: int, ttl: float) -> None:
        self._backs: BoundedMap[bytes, Back] = BoundedMap(max_size)
        self._ttl = ttl

    def __len__(self) -> int:
        return len(self._backs)

    def back(self, pid: bytes) -> Back | None:
        """Where the answer for push pid goes (None: nowhere known)."""
        return self._backs.get(pid)

    def backs(self, pids: Iterable[bytes]) -> list[Back | None]:
        """back() of each push id (a receipt batch's items)."""
        get = self._backs.get
        return [get(pid) for pid in pids]

    # Rules F4, F6b.
    def remember(self, pid: bytes, peer: str, now: float, reg: Registration | None, hops: int) -> bool:
        """The answer for push pid goes back to peer, which sent a copy `hops` hops from its custodian
        carrying reg (None: no registration of the push's route). True: the oldest entry was evicted."""
        return self._backs.put(pid, (peer, now + self._ttl, reg, hops))

    # Rule C1.
    def mark_local(self, pid: bytes, now: float) -> None:
        """This relay is push pid's custodian: its answer ends here."""
        self._backs.put(pid, (_LOCAL, now + self._ttl, None, -1))

    # Rule C3.
    def mark_late(self, pid: bytes, now: float, reg: Registration | None) -> None:
        """Custody of push pid gave up: a receipt that still comes back (verified against reg's receipt key)
        corrects the final status."""
        self._backs.put(pid, (_LATE, now + self._ttl, reg, -1))

    def forget(self, pid: bytes) -> None:
        """The answer for push pid went back (or custody ended): no entry left."""
        self._backs.pop(pid, None)

    def sweep(self, now: float) -> None:
        """Drop the expired entries, custodians' markers apart."""
        self._backs.sweep(lambda v: v[1] <= now and v[0] is not _LOCAL)
