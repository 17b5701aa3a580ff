"""The push seen-cache (rules F1, F6b, F8b, F8c, F10): which copies of a push a relay handled, and the
once-per-push notes its rules keep beside them. One owner, `SeenCache`, held by the engine as `_seen`.

A copy is (push id, attempt, mode): a relay handles each once (F1); a ring copy that meets a route goes on
in route mode through relays that saw the ring copy of the same attempt. A note (`Mark`) is a fact about
the push that a rule must not act on twice (a route error passed back, a repair watched, ...). Both kinds
share one bounded map, oldest first out past `push_seen_max`: a note lives as long as the copies it
is about.
"""

from __future__ import annotations

from enum import IntEnum

from inri.core.tables import BoundedMap


class Mark(IntEnum):
    """A once-per-push note in the seen-cache (its key beside copies' keys, which are attempt * 2 + mode >= 0)."""

    ERROR_PASSED = -1  # F6b: a route error was passed on for the last copy received (lives reverse_ttl_s)
    REPAIR_WATCHED = -2  # F8b: a local repair of the push started here (F8 watches it)
    REPAIR_FOUND = -3  # F8b: a `repair found` came back for that repair
    FOUND_PASSED = -4  # F8b: a `repair found` was passed back
    REROUTED = -5  # F10: the push was sent around a dead end its copy met
    QUICK_PASSED = -6  # F8c: the search's quick verdict was left to F8's full wait by a `repair found`
    REFUTE_PASSED = -7  # F8c: a refutation (`duplicate`) was passed back to the searching relay
    RING_RELAYED = -8  # C2b: a ring copy of a custodian's ring passed here (its `repair found` goes back)


_ERROR_PASSED = Mark.ERROR_PASSED._value_  # a plain int: an IntEnum key hashes ~20x slower (Enum.__hash__)


class SeenCache:
    """The copies of pushes handled here and the notes kept per push, each until its expiry."""

    __slots__ = ("_map", "_radius", "_ttl", "_error_ttl")

    def __init__(self, max_size: int, ttl: float, error_ttl: float) -> None:
        # (push id, attempt * 2 + ring mode, or a Mark's value) -> expiry
        self._map: BoundedMap[tuple[bytes, int], float] = BoundedMap(max_size)
        # Rule F4d: (push id, attempt) -> (expiry, the radius left of the widest ring copy flooded from
        # here), for ring copies only. A ring-mode copy in _map with no entry here counts as the widest.
        self._radius: BoundedMap[tuple[bytes, int], tuple[float, int]] = BoundedMap(max_size)
        self._ttl = ttl  # seen_ttl_s
        self._error_ttl = error_ttl  # reverse_ttl_s: an ERROR_PASSED note lives as long as the reverse path

    def __len__(self) -> int:
        return len(self._map)

    # Rule F1.
    def copy_seen(self, pid: bytes, attempt: int, ring: bool) -> bool:
        """True when the copy (pid, attempt, ring mode or route mode) was handled here."""
        return (pid, attempt * 2 + ring) in self._map

    def mark_copy(self, pid: bytes, attempt: int, ring: bool, now: float) -> None:
        """Note the copy (pid, attempt, mode) as handled here (a ring copy: as the widest, F4d)."""
        self._map.put((pid, attempt * 2 + ring), now + self._ttl)
        if ring:
            self._radius.pop((pid, attempt), None)

    # Rules F1, F6b.
    def first_copy(self, pid: bytes, attempt: int, ring: bool, now: float) -> bool:
        """A copy received from a neighbour: False when it was handled here already; else note it, and
        clear ERROR_PASSED (F6b: this copy may be answered by a route error again)."""
        m = self._map
        key = (pid, attempt * 2 + ring)
        if key in m:
            return False
        m.put(key, now + self._ttl)
        m.pop((pid, _ERROR_PASSED), None)
        return True

    # Rules F1, F4d.
    def first_ring(self, pid: bytes, attempt: int, radius: int, now: float) -> bool:
        """A ring copy with `radius` hops left, received from a neighbour: False when a ring copy of the
        same attempt was handled here with as many hops left or more (or by a search of unknown radius);
        else note it, as first_copy does. Rule F4d: a narrower copy of the same attempt (a relay's local
        repair, radius LOCAL_REPAIR_RADIUS, or a copy from a nearer relay's ring) that arrived first must
        not stop the custodian's wider ring here: the wider one goes on to its own radius."""
        m = self._map
        key = (pid, attempt * 2 + 1)
        if key in m:
            had = self._radius.get((pid, attempt))
            if had is None or had[1] >= radius:
                return False
        expiry = now + self._ttl
        m.put(key, expiry)
        self._radius.put((pid, attempt), (expiry, radius))
        m.pop((pid, _ERROR_PASSED), None)
        return True

    def mark_ring(self, pid: bytes, attempt: int, radius: int, now: float) -> None:
        """Note that this relay sent ring copies of (pid, attempt) with `radius` hops left (a local search):
        a wider ring copy arriving later still goes on (F4d); mark_copy(ring) notes the widest."""
        expiry = now + self._ttl
        self._map.put((pid, attempt * 2 + 1), expiry)
        self._radius.put((pid, attempt), (expiry, radius + 1))

    def has(self, pid: bytes, mark: Mark) -> bool:
        """True when the note `mark` is held for push pid."""
        return (pid, mark._value_) in self._map

    def mark(self, pid: bytes, mark: Mark, now: float) -> None:
        """Hold the note `mark` for push pid (until seen_ttl_s from now; ERROR_PASSED: reverse_ttl_s)."""
        ttl = self._error_ttl if mark is Mark.ERROR_PASSED else self._ttl
        self._map.put((pid, mark._value_), now + ttl)

    def mark_once(self, pid: bytes, mark: Mark, now: float) -> bool:
        """Hold the note `mark` for push pid; False (nothing changed) when it was held already."""
        if (pid, mark._value_) in self._map:
            return False
        self.mark(pid, mark, now)
        return True

    def clear(self, pid: bytes, mark: Mark) -> None:
        """Drop the note `mark` for push pid, if held."""
        self._map.pop((pid, mark._value_), None)

    def sweep(self, now: float) -> None:
        """Drop the copies and notes expired by now."""
        self._map.sweep(lambda exp: exp <= now)
        self._radius.sweep(lambda v: v[0] <= now)
