"""The engine's tables: a bounded expiring map (seen-cache, reverse paths, awaited answers) and the
route table.

A relay's tables must stay bounded whatever its neighbours send, and entries must leave when they
expire. `BoundedMap` is a dict (lookups stay C-speed) with a size bound that evicts the oldest
insertion, and a sweep that drops what a predicate calls expired.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

from inri.protocol import limits

K = TypeVar("K")
V = TypeVar("V")


class BoundedMap(dict[K, V]):
    """A dict of at most `max_size` entries, in insertion order; a new key in a full map evicts the
    oldest entry (FIFO: the oldest is also the first to expire when every entry lives equally long)."""

    __slots__ = ("max_size",)

    def __init__(self, max_size: int) -> None:
        super().__init__()
        self.max_size = max_size

    def put(self, key: K, value: V) -> bool:
        """Insert or overwrite key (an overwritten key keeps its place). True: the oldest entry was
        evicted to make room."""
        if len(self) >= self.max_size and key not in self:  # cheap test first: rarely full
            del self[next(iter(self))]
            self[key] = value
            return True
        self[key] = value
        return False

    def put_last(self, key: K, value: V) -> bool:
        """Insert key as the newest entry (moved to the end if present), so that a map whose values
        carry a constant-timeout deadline stays in deadline order. True: the oldest was evicted."""
        evicted = False
        if key in self:
            del self[key]
        elif len(self) >= self.max_size:
            del self[next(iter(self))]
            evicted = True
        self[key] = value
        return evicted

    def sweep(self, expired: Callable[[V], bool]) -> int:
        """Drop every entry whose value `expired` accepts; returns how many went."""
        gone = [key for key, value in self.items() if expired(value)]
        for key in gone:
            del self[key]
        return len(gone)


# A route entry is a flat tuple: (epoch, expires, feasibility distance, peer1, hops1, peer2, hops2, ...),
# next hops in preference order (primary first). Flat tuples cost the least memory per route (a
# simulation holds millions); only RouteTable reads or builds them, so the layout can change here alone.
RouteEntry = tuple[Any, ...]
_FIRST_HOP = 3  # index of the primary next hop
UNKNOWN_DISTANCE = limits.MAX_TTL + 1  # feasibility distance of a route with no next hop left


class Arrival(Enum):
    """What a gossip arrival of (route id, epoch) from a neighbour is to the route id's entry (rules G1,
    G3); a route id not in the table is simply a first arrival (G2)."""

    NEWER = 1  # a newer epoch of a known route id (a refresh)
    STALE = 2  # an older epoch than the table's
    REPLAYED = 3  # the same epoch again from a neighbour that is already one of its next hops
    FEASIBLE = 4  # the same epoch from another neighbour, strictly closer than the feasibility distance, room left
    DUPLICATE = 5  # the same epoch, not usable as a backup


# Members bound once: an Enum class attribute lookup costs several times a dict lookup (hot path).
_NEWER, _STALE, _REPLAYED, _FEASIBLE, _DUPLICATE = (
    Arrival.NEWER, Arrival.STALE, Arrival.REPLAYED, Arrival.FEASIBLE, Arrival.DUPLICATE)


class RouteTable(dict[bytes, RouteEntry]):
    """route id -> route entry, plus the earliest expiry (sweeps skip the scan until then).

    Reading an entry: `epoch`, `expires`, `distance` (feasibility distance), `next_hops`, `vector`,
    `primary`, `claims` (peer is one of its next hops), `has_room`, and for the gossip hot path
    `arrival` (all of these at once); by route id: `next_hops_of`. Changing the table: `originate`,
    `set_first`, `add_backup`, `drop_next_hop`, `purge`, `expire`, `evict_first_expiring`.

    The readers run per frame: they return entry items as they are (annotated locals, no int()/float()
    conversions: the items already have those types) and the hot paths get one call per frame.
    """

    __slots__ = ("expire_from",)

    def __init__(self) -> None:
        super().__init__()
        self.expire_from = float("inf")  # no route expires before this

    # -- reading an entry (static: callers hold the entry from one lookup) --------------------------

    @staticmethod
    def epoch(entry: RouteEntry) -> int:
        """The newest epoch of the route id."""
        epoch: int = entry[0]
        return epoch

    @staticmethod
    def expires(entry: RouteEntry) -> float:
        """When the route expires (engine clock)."""
        expires: float = entry[1]
        return expires

    @staticmethod
    def distance(entry: RouteEntry) -> int:
        """Feasibility distance: 0 at the home relay, else the distance of the first arrival (G3)."""
        distance: int = entry[2]
        return distance

    @staticmethod
    def next_hops(entry: RouteEntry) -> tuple[str, ...]:
        """Next hops, primary first."""
        return entry[_FIRST_HOP::2]

    @staticmethod
    def vector(entry: RouteEntry) -> list[tuple[str, int]]:
        """[(next hop, distance), ...], primary first."""
        return list(zip(entry[_FIRST_HOP::2], entry[_FIRST_HOP + 1::2], strict=True))

    @staticmethod
    def claims(entry: RouteEntry, peer: str) -> bool:
        """peer is one of the entry's next hops."""
        return peer in entry  # the only str items of an entry are its next hops: no slice needed

    @staticmethod
    def primary(entry: RouteEntry) -> str | None:
        """The primary next hop (None: no next hop, e.g. at the home relay)."""
        return entry[_FIRST_HOP] if len(entry) > _FIRST_HOP else None

    @staticmethod
    def worst_hops(entry: RouteEntry) -> int:
        """The distance of the last next hop (0: no next hop)."""
        return int(entry[-1]) if len(entry) > _FIRST_HOP else 0

    @staticmethod
    def demote(entry: RouteEntry, peer: str) -> RouteEntry:
        """The entry with peer moved to the end of the next hops (tried last)."""
        i = _FIRST_HOP + 2 * entry[_FIRST_HOP::2].index(peer)
        return entry[:i] + entry[i + 2:] + entry[i:i + 2]

    @staticmethod
    def has_room(entry: RouteEntry, route_k: int) -> bool:
        """Fewer than route_k next hops."""
        return len(entry) < _FIRST_HOP + 2 * route_k

    @staticmethod
    def arrival(entry: RouteEntry, epoch: int, peer: str, hops: int, route_k: int) -> Arrival:
        """What gossip of `epoch` from peer, `hops` away from the home, is to the entry of its route id.
        In the order of rules G1 and G3: the epoch first, then a replay by one of its next hops, then
        feasibility (hops below the feasibility distance) and room."""
        known = entry[0]
        if epoch != known:
            return _NEWER if epoch > known else _STALE
        if peer in entry:  # as `claims`
            return _REPLAYED
        if hops < entry[2] and len(entry) < _FIRST_HOP + 2 * route_k:  # as `distance`, `has_room`
            return _FEASIBLE
        return _DUPLICATE

    def next_hops_of(self, rid: bytes) -> tuple[str, ...]:
        """Next hops of rid, primary first (none: the route id is unknown, or this is its home)."""
        entry = self.get(rid)
        return () if entry is None else entry[_FIRST_HOP::2]

    # -- changing the table -------------------------------------------------------------------------

    def _expiring(self, expires: float) -> None:
        if expires < self.expire_from:
            self.expire_from = expires

    def originate(self, rid: bytes, epoch: int, expires: float) -> None:
        """This relay is the route's home: distance 0, no next hop."""
        self[rid] = (epoch, expires, 0)
        self._expiring(expires)

    def set_first(self, rid: bytes, epoch: int, expires: float, peer: str, hops: int) -> None:
        """First arrival of (route id, epoch): one next hop, whose distance is the feasibility distance."""
        self[rid] = (epoch, expires, hops, peer, hops)
        if expires < self.expire_from:  # as _expiring, inline: once per new (route, epoch)
            self.expire_from = expires

    def add_backup(self, rid: bytes, entry: RouteEntry, peer: str, hops: int) -> None:
        """Append a backup next hop to rid's current entry."""
        self[rid] = (*entry, peer, hops)

    def drop_next_hop(self, rid: bytes, entry: RouteEntry, peer: str) -> None:
        """Stop using peer for rid (it reported it cannot reach the home); the distance is kept."""
        i = _FIRST_HOP + 2 * entry[_FIRST_HOP::2].index(peer)
        self[rid] = entry[:i] + entry[i + 2:]

    def purge(self, peer: str) -> int:
        """Forget every route claim of peer (O(routes)); the feasibility distance becomes that of the
        next hops left (none left: unknown), as in Babel. Returns how many entries changed."""
        changed = 0
        for rid, e in list(self.items()):
            if peer not in e:
                continue
            i = e.index(peer)
            rest = e[_FIRST_HOP:i] + e[i + 2:]
            fd = min(rest[1::2]) if rest else UNKNOWN_DISTANCE
            self[rid] = (e[0], e[1], fd, *rest)
            changed += 1
        return changed

    def expire(self, now: float) -> list[bytes]:
        """Remove the routes expired at now; returns their ids."""
        expired = [r for r, e in self.items() if e[1] <= now]
        self.expire_from = min((e[1] for e in self.values() if e[1] > now), default=float("inf"))
        for r in expired:
            del self[r]
        return expired

    def evict_first_expiring(self) -> bytes:
        """Remove the entry that expires first (the table is full); returns its id."""
        victim = min(self, key=lambda r: self[r][1])
        del self[victim]
        return victim

    def routed_count(self) -> int:
        """Route ids with at least one next hop."""
        return sum(1 for e in self.values() if len(e) > _FIRST_HOP)
