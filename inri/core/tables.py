"""The engine's tables: a bounded expiring map (seen-cache, reverse paths, awaited answers) and the
route table.

A relay's tables must stay bounded whatever its neighbours send, and entries must leave when they
expire. `BoundedMap` is a dict (lookups stay C-speed) with a size bound that evicts the oldest
insertion, and a sweep that drops what a predicate calls expired.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Callable, Iterator
from enum import Enum
from typing import TYPE_CHECKING, Any, TypeVar

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


# A route entry, as the readers see it, is a flat tuple: (epoch, expires, feasibility distance, peer1,
# hops1, peer2, hops2, ...), next hops in preference order (primary first). `RouteTable` builds one per
# lookup from its compact storage (below); only RouteTable reads or builds them.
RouteEntry = tuple[Any, ...]
ExportRow = tuple[bytes, int, float, tuple[tuple[str, int], ...]]  # a route snapshot's row (export_rows)
EXPORT_CHUNK = 20_000  # rows per export_chunks list when the caller does not say (about 50 ms of work)
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

# Compact storage. The routes of a table live in buckets (bytearrays) chosen by the route id's hash;
# a route is one fixed-size record in its bucket:
#   route id (16 bytes) | epoch (u32) | expires (f64) | distance (u8) | next hops (u8)
#   | slots x (peer number (u32), hops (u8)) | seq (u64)
# Peers are numbered per table (`_peers`); `seq` numbers first insertions, so everything that used to
# follow a dict's insertion order (expiry lists, the eviction tie-break, iteration) still does. A
# bucket holds about 4-8 routes: a lookup is one dict probe (the route id's hash is cached by the
# bytes object), one C `find` of the 16 bytes in a few hundred and one C `unpack_from`. Measured over
# 1M routes (benchmarks/bench_route_memory.py): about 60 B per route in the table (71 B of the engine's
# allocations), the route id included, against 179 B for a dict of tuples keyed by the route id object.
_KEY = limits.ROUTE_ID_BYTES
_COUNT = _KEY + 13  # offset of the next hop count in a record
_SLOT = struct.Struct("<IB")  # one next hop: peer number, hops
_LOAD = 8  # mean routes per bucket before the bucket count doubles (to 4)
_EMPTY = b""  # every empty bucket
_MIN_BUCKETS = 64  # buckets are made on first use: a small table costs no more for these


def _body_struct(slots: int) -> struct.Struct:
    """A record after its route id, seq excluded (a rewrite keeps the seq)."""
    return struct.Struct("<IdBB" + "IB" * slots)


class EntryReaders:
    """What both route tables share: the readers of a route entry (a flat tuple), the changes that
    rewrite an entry (`demote`, `lead`) and the sweep of expired routes (`sweep`). Rule groups change
    the table through these and the changing methods of each table, never an entry by hand."""

    __slots__ = ()

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

    # -- changing an entry (both tables store it through their own __setitem__) --------------------

    if TYPE_CHECKING:  # each table's own (RouteTable: dict's)
        _expire_from: float

        def __setitem__(self, rid: bytes, entry: RouteEntry) -> None: ...
        def expire(self, now: float) -> list[bytes]: ...

    def demote(self, rid: bytes, entry: RouteEntry, peer: str) -> None:
        """Move peer to the end of rid's next hops (tried last); entry is rid's entry as read."""
        self[rid] = _demoted(entry, peer)

    def lead(self, rid: bytes, entry: RouteEntry, peer: str, hops: int, route_k: int) -> None:
        """Make peer rid's primary next hop at distance hops (moved up if it was a backup; the last next
        hop dropped past route_k), the feasibility distance lowered to hops if larger; entry is rid's
        entry as read."""
        self[rid] = _led(entry, peer, hops, route_k)

    def tighten(self, rid: bytes, entry: RouteEntry, hops: int) -> None:
        """This relay tells a neighbour it is `hops` from rid's home (G12's `restored`): the feasibility
        distance is lowered to hops if larger. Babel's invariant (RFC 8966 3.5.1): a node's feasibility
        distance is never above a distance it advertised, or a neighbour routing through it could offer
        it back a route it would take (a loop); entry is rid's entry as read."""
        if hops < entry[2]:
            self[rid] = (entry[0], entry[1], hops, *entry[3:])

    # -- expiry -------------------------------------------------------------------------------------

    def earliest_expiry(self) -> float:
        """No route expires before this (a lower bound: removals do not raise it; `expire` makes it exact)."""
        return self._expire_from

    def sweep(self, now: float) -> list[bytes]:
        """`expire`, skipped (nothing to remove) until the earliest expiry: what the engine's sweep calls."""
        if now < self._expire_from:
            return []
        return self.expire(now)


class RouteTable(EntryReaders, dict[bytes, RouteEntry]):
    """route id -> route entry, plus the earliest expiry (sweeps skip the scan until then): a dict of
    flat tuples (`[engine] route_table = "dict"`, the simulator's default: the fastest lookups; the
    compact table below, the relay's default, holds the same entries in about 40% of the memory).

    Reading an entry: `epoch`, `expires`, `distance` (feasibility distance), `next_hops`, `vector`,
    `primary`, `claims` (peer is one of its next hops), `has_room`, and for the gossip hot path
    `arrival` (all of these at once); by route id: `next_hops_of`. Changing the table: `originate`,
    `set_first`, `add_backup`, `drop_next_hop`, `demote`, `lead`, `purge`, `sweep` (`expire` once due),
    `evict_first_expiring`.

    The readers run per frame: they return entry items as they are (annotated locals, no int()/float()
    conversions: the items already have those types) and the hot paths get one call per frame.
    """

    __slots__ = ("_expire_from",)

    def __init__(self) -> None:
        super().__init__()
        self._expire_from = float("inf")  # no route expires before this

    def next_hops_of(self, rid: bytes) -> tuple[str, ...]:
        """Next hops of rid, primary first (none: the route id is unknown, or this is its home)."""
        entry = self.get(rid)
        return () if entry is None else entry[_FIRST_HOP::2]

    # -- changing the table -------------------------------------------------------------------------

    def _expiring(self, expires: float) -> None:
        if expires < self._expire_from:
            self._expire_from = expires

    def originate(self, rid: bytes, epoch: int, expires: float) -> None:
        """This relay is the route's home: distance 0, no next hop."""
        self[rid] = (epoch, expires, 0)
        self._expiring(expires)

    def set_first(self, rid: bytes, epoch: int, expires: float, peer: str, hops: int) -> None:
        """First arrival of (route id, epoch): one next hop, whose distance is the feasibility distance."""
        self[rid] = (epoch, expires, hops, peer, hops)
        if expires < self._expire_from:  # as _expiring, inline: once per new (route, epoch)
            self._expire_from = expires

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
        self._expire_from = min((e[1] for e in self.values() if e[1] > now), default=float("inf"))
        for r in expired:
            del self[r]
        return expired

    def evict_first_expiring(self) -> bytes:
        """Remove the entry that expires first (the table is full); returns its id."""
        return self.evict_earliest(1)[0]

    def evict_earliest(self, count: int) -> list[bytes]:
        """Remove the `count` entries that expire first (the oldest of equals first), in that order;
        returns their ids. One scan of the table, whatever `count`: a full table evicts in batches."""
        victims = [rid for rid, _ in heapq.nsmallest(count, self.items(), key=_expiry_of)]  # stable: oldest first
        for rid in victims:
            del self[rid]
        return victims

    def routed_count(self) -> int:
        """Route ids with at least one next hop."""
        return sum(1 for e in self.values() if len(e) > _FIRST_HOP)

    def export_rows(self, offset: float) -> list[ExportRow]:
        """The learned routes (a next hop, not homed here) as (route id, epoch, expires + offset, ((next
        hop, distance), ...)), in no set order: what a route snapshot keeps (Engine.export_routes)."""
        return [row for chunk in self.export_chunks(offset, EXPORT_CHUNK) for row in chunk]

    def export_chunks(self, offset: float, size: int) -> Iterator[list[ExportRow]]:
        """export_rows in lists of about `size` rows, for a caller that lets other work run between
        them: the table may change meanwhile (the routes are those of the call; later changes may or
        may not show)."""
        items = list(self.items())  # the routes of the call: a dict must not change size under iteration
        for start in range(0, len(items), size):
            yield [(rid, e[0], e[1] + offset, tuple(zip(e[_FIRST_HOP::2], e[_FIRST_HOP + 1::2], strict=True)))
                   for rid, e in items[start:start + size] if len(e) > _FIRST_HOP and e[2] > 0]


class CompactRouteTable(EntryReaders):
    """RouteTable's twin stored compactly (`[engine] route_table = "compact"`, the relay's default):
    about 60 B per route against about 180 B. A lookup costs about 5x a dict's (1.5-2 us against 0.3-0.5
    at 1M routes), which a push forward does not feel (benchmarks/bench_engine.py: as fast or faster,
    side by side); a gossip reception does (0.77x).

    A mapping with the dict methods the engine uses (get, [], []=, pop, del, in, len, iteration in
    insertion order), stored compactly (see above); entries come out as flat tuples, and it has every
    reader and changing method of RouteTable, with the same results (tests/test_core_tables.py).
    Route ids that are not 16 bytes (never from the wire: the codec checks the length) are kept in a
    plain dict beside the buckets.
    """

    __slots__ = ("_expire_from", "_b", "_mask", "_n", "_seq", "_slots", "_stride", "_seq_at", "_unpack",
                 "_pack_into", "_pack_seq", "_pad", "_peers", "_peer_ix", "_other", "_whole")

    def __init__(self) -> None:
        self._expire_from = float("inf")  # no route expires before this
        # bucket number (hash & mask) -> its records; _EMPTY (shared) until a route lands in it
        self._b: list[bytes | bytearray] = [_EMPTY] * _MIN_BUCKETS
        self._mask = _MIN_BUCKETS - 1
        self._n = 0  # routes in the buckets
        self._seq = 0  # the last seq given out
        self._peers: list[str] = []  # peer number -> name
        self._peer_ix: dict[str, int] = {}
        self._other: dict[bytes, tuple[int, RouteEntry]] = {}  # odd-length route ids: -> (seq, entry)
        self._slots = 0
        self._set_format(2)

    def _set_format(self, slots: int) -> None:
        self._slots = slots
        body = _body_struct(slots)
        self._seq_at = _KEY + body.size  # offset of the seq in a record
        self._stride = self._seq_at + 8
        self._unpack = body.unpack_from
        self._whole = struct.Struct(f"<{_KEY}s" + body.format[1:] + "Q")  # a whole record, for scans
        self._pack_into = body.pack_into
        self._pack_seq = struct.Struct(body.format + "Q").pack  # a new record: its fields, then its seq
        self._pad = [(0, 0) * (slots - n) for n in range(slots + 1)]

    def _aligned(self, b: bytes | bytearray, rid: bytes, i: int) -> int:
        """The offset of rid's record in b, from a `find` that returned i (-1: not there)."""
        stride = self._stride
        while i >= 0 and i % stride:  # matched across two records (only by chance): look on
            i = b.find(rid, i + 1)
        return i

    def _decode(self, b: bytes | bytearray, i: int) -> RouteEntry:
        v = self._unpack(b, i + _KEY)
        n = v[3]
        if not n:
            return v[:3]
        peers = self._peers
        out: list[Any] = list(v[:3])
        for j in range(4, 4 + 2 * n, 2):
            out += (peers[v[j]], v[j + 1])
        return tuple(out)

    def _seq_of(self, b: bytes | bytearray, i: int) -> int:
        return int.from_bytes(b[i + self._seq_at:i + self._stride], "little")

    def _peer(self, peer: str) -> int:
        ix = self._peer_ix.get(peer)
        if ix is None:
            ix = self._peer_ix[peer] = len(self._peers)
            self._peers.append(peer)
        return ix

    def _fields(self, entry: RouteEntry) -> list[Any]:
        """The record's fields for entry after the route id, seq excluded (as `_pack_into` packs them)."""
        n = (len(entry) - _FIRST_HOP) // 2
        fields: list[Any] = [entry[0], entry[1], entry[2], n]
        peer = self._peer
        for j in range(_FIRST_HOP, len(entry), 2):
            fields += (peer(entry[j]), entry[j + 1])
        fields += self._pad[n]
        return fields

    def _rebuild(self, mask: int, slots: int) -> None:
        """Re-bucket every route for `mask` and re-encode it for `slots` next hops."""
        old_unpack, old_stride, old_seq_at, old_slots = self._unpack, self._stride, self._seq_at, self._slots
        self._set_format(slots)
        more = (0, 0) * (slots - old_slots)
        body = _body_struct(slots)
        new: dict[int, bytearray] = {}
        for b in self._b:
            for i in range(0, len(b), old_stride):
                rid = bytes(b[i:i + _KEY])
                if slots == old_slots:
                    rec = b[i:i + old_stride]
                else:
                    rec = bytearray(rid + body.pack(*old_unpack(b, i + _KEY), *more) + b[i + old_seq_at:i + old_stride])
                k = hash(rid) & mask
                nb = new.get(k)
                if nb is None:
                    new[k] = bytearray(rec)
                else:
                    nb += rec
        self._b = [new.get(k, _EMPTY) for k in range(mask + 1)]
        self._mask = mask

    def _put(self, rid: bytes, entry: RouteEntry) -> None:
        """Set rid's entry: a known route id keeps its place in the insertion order."""
        if len(entry) > _FIRST_HOP + 2 * self._slots:
            self._rebuild(self._mask, (len(entry) - _FIRST_HOP) // 2)
        if len(rid) != _KEY:
            old = self._other.get(rid)
            if old is None:
                self._seq += 1
            self._other[rid] = (self._seq if old is None else old[0], entry)
            return
        self._write(rid, self._fields(entry))

    def _write(self, rid: bytes, fields: list[Any] | tuple[Any, ...]) -> None:
        k = hash(rid) & self._mask
        b = self._b[k]
        if b:
            i = b.find(rid)
            if i % self._stride:
                i = self._aligned(b, rid, i)
            if i >= 0:
                self._pack_into(b, i + _KEY, *fields)
                return
            self._seq += 1
            b += rid + self._pack_seq(*fields, self._seq)  # b is a bytearray: only the empty bucket is bytes
        else:
            self._seq += 1
            self._b[k] = bytearray(rid + self._pack_seq(*fields, self._seq))
        self._n += 1
        if self._n > _LOAD * (self._mask + 1):
            self._rebuild(self._mask * 2 + 1, self._slots)

    def _records(self) -> list[tuple[int, bytes, RouteEntry]]:
        """Every (seq, route id, entry), in insertion order."""
        out = [(seq, rid, e) for rid, (seq, e) in self._other.items()]
        stride = self._stride
        for b in self._b:
            for i in range(0, len(b), stride):
                out.append((self._seq_of(b, i), bytes(b[i:i + _KEY]), self._decode(b, i)))
        out.sort(key=lambda r: r[0])
        return out

    # -- the mapping --------------------------------------------------------------------------------

    def get(self, rid: bytes, default: RouteEntry | None = None) -> RouteEntry | None:
        """rid's entry (default: unknown)."""
        if len(rid) != _KEY:
            got = self._other.get(rid)
            return default if got is None else got[1]
        b = self._b[hash(rid) & self._mask]
        i = b.find(rid)
        if i % self._stride:  # not found (-1), or matched across two records
            i = self._aligned(b, rid, i)
            if i < 0:
                return default
        v = self._unpack(b, i + _KEY)  # as _decode, inline (hot path)
        n = v[3]
        if n == 1:
            return (v[0], v[1], v[2], self._peers[v[4]], v[5])
        if n == 2:
            peers = self._peers
            return (v[0], v[1], v[2], peers[v[4]], v[5], peers[v[6]], v[7])
        return v[:3] if not n else self._decode(b, i)

    def __getitem__(self, rid: bytes) -> RouteEntry:
        entry = self.get(rid)
        if entry is None:
            raise KeyError(rid)
        return entry

    def __setitem__(self, rid: bytes, entry: RouteEntry) -> None:
        self._put(rid, entry)
        if len(entry) > 1:
            self._expiring(entry[1])

    def __contains__(self, rid: object) -> bool:
        return isinstance(rid, bytes) and self.get(rid) is not None

    def __delitem__(self, rid: bytes) -> None:
        if self.pop(rid, None) is None:
            raise KeyError(rid)

    def pop(self, rid: bytes, default: RouteEntry | None = None) -> RouteEntry | None:
        """Remove rid; its entry (default: it was not there)."""
        if len(rid) != _KEY:
            got = self._other.pop(rid, None)
            return default if got is None else got[1]
        k = hash(rid) & self._mask
        b = self._b[k]
        i = self._aligned(b, rid, b.find(rid))
        if i < 0:
            return default
        entry = self._decode(b, i)
        del b[i:i + self._stride]  # type: ignore[union-attr]  # a bytearray once not empty
        if not b:
            self._b[k] = _EMPTY
        self._n -= 1
        return entry

    def __len__(self) -> int:
        return self._n + len(self._other)

    def __bool__(self) -> bool:
        return bool(self._n or self._other)

    def __iter__(self) -> Iterator[bytes]:
        return iter([rid for _, rid, _ in self._records()])

    def keys(self) -> list[bytes]:
        """Route ids, in insertion order."""
        return [rid for _, rid, _ in self._records()]

    def values(self) -> list[RouteEntry]:
        """Entries, in insertion order."""
        return [e for _, _, e in self._records()]

    def items(self) -> list[tuple[bytes, RouteEntry]]:
        """(route id, entry) pairs, in insertion order."""
        return [(rid, e) for _, rid, e in self._records()]

    def next_hops_of(self, rid: bytes) -> tuple[str, ...]:
        """Next hops of rid, primary first (none: the route id is unknown, or this is its home)."""
        if len(rid) != _KEY:
            got = self._other.get(rid)
            return () if got is None else got[1][_FIRST_HOP::2]
        b = self._b[hash(rid) & self._mask]
        i = b.find(rid)
        if i % self._stride:
            i = self._aligned(b, rid, i)
            if i < 0:
                return ()
        v = self._unpack(b, i + _KEY)
        n = v[3]
        if n == 1:
            return (self._peers[v[4]],)
        if n == 2:
            peers = self._peers
            return (peers[v[4]], peers[v[6]])
        return () if not n else self._decode(b, i)[_FIRST_HOP::2]

    # -- changing the table -------------------------------------------------------------------------

    def _expiring(self, expires: float) -> None:
        if expires < self._expire_from:
            self._expire_from = expires

    def originate(self, rid: bytes, epoch: int, expires: float) -> None:
        """This relay is the route's home: distance 0, no next hop."""
        self._put(rid, (epoch, expires, 0))
        self._expiring(expires)

    def set_first(self, rid: bytes, epoch: int, expires: float, peer: str, hops: int) -> None:
        """First arrival of (route id, epoch): one next hop, whose distance is the feasibility distance."""
        if expires < self._expire_from:  # as _expiring, inline: once per new (route, epoch)
            self._expire_from = expires
        if len(rid) != _KEY:
            self._put(rid, (epoch, expires, hops, peer, hops))
            return
        ix = self._peer_ix.get(peer)
        self._write(rid, (epoch, expires, hops, 1, self._peer(peer) if ix is None else ix, hops, *self._pad[1]))

    def add_backup(self, rid: bytes, entry: RouteEntry, peer: str, hops: int) -> None:
        """Append a backup next hop to rid's current entry."""
        n = (len(entry) - _FIRST_HOP) // 2
        b = self._b[hash(rid) & self._mask]
        i = self._aligned(b, rid, b.find(rid)) if n < self._slots and len(rid) == _KEY else -1
        if i < 0 or b[i + _COUNT] != n:  # not the entry the caller read: the general way
            self._put(rid, (*entry, peer, hops))
            return
        ix = self._peer_ix.get(peer)
        _SLOT.pack_into(b, i + _COUNT + 1 + 5 * n, self._peer(peer) if ix is None else ix, hops)
        b[i + _COUNT] = n + 1  # type: ignore[index]  # a bytearray once not empty

    def drop_next_hop(self, rid: bytes, entry: RouteEntry, peer: str) -> None:
        """Stop using peer for rid (it reported it cannot reach the home); the distance is kept."""
        i = _FIRST_HOP + 2 * entry[_FIRST_HOP::2].index(peer)
        self._put(rid, entry[:i] + entry[i + 2:])

    def purge(self, peer: str) -> int:
        """Forget every route claim of peer (O(routes)); the feasibility distance becomes that of the
        next hops left (none left: unknown), as in Babel. Returns how many entries changed."""
        changed = 0
        for rid, (seq, e) in list(self._other.items()):
            if peer in e:
                self._other[rid] = (seq, _without(e, peer))
                changed += 1
        ix = self._peer_ix.get(peer)
        if ix is None or not self._n:
            return changed
        stride, unpack, pack_into = self._stride, self._unpack, self._pack_into
        for b in self._b:
            for i in range(0, len(b), stride):
                v = unpack(b, i + _KEY)
                if ix in v[4:4 + 2 * v[3]:2]:
                    pack_into(b, i + _KEY, *self._fields(_without(self._decode(b, i), peer)))
                    changed += 1
        return changed

    def _scans(self) -> tuple[struct.Struct, struct.Struct]:
        """Structs that read every record of a bucket in one C call (`iter_unpack`): (expires,) and
        (expires, seq), the other fields skipped as pad bytes."""
        skip = self._seq_at - _KEY - 12  # after expires, up to the seq
        return (struct.Struct(f"<{_KEY + 4}xd{skip + 8}x"), struct.Struct(f"<{_KEY + 4}xd{skip}xQ"))

    def expire(self, now: float) -> list[bytes]:
        """Remove the routes expired at now; returns their ids (in insertion order).

        One C-level scan per bucket for its earliest expiry; only buckets holding an expired route are
        read record by record (a sweep of 1M routes in about 0.1 s, not the 5 s of decoding them all)."""
        by_exp, _ = self._scans()
        nxt = float("inf")
        gone: list[tuple[int, bytes]] = []
        stride = self._stride
        for b in self._b:
            if not b:
                continue
            first = min(by_exp.iter_unpack(b))[0]
            if first > now:
                if first < nxt:
                    nxt = first
                continue
            for i, (exp,) in zip(range(0, len(b), stride), by_exp.iter_unpack(b), strict=True):
                if exp <= now:
                    gone.append((self._seq_of(b, i), bytes(b[i:i + _KEY])))
                elif exp < nxt:
                    nxt = exp
        for rid, (seq, e) in self._other.items():
            if e[1] <= now:
                gone.append((seq, rid))
            elif e[1] < nxt:
                nxt = e[1]
        gone.sort()
        for _, rid in gone:
            self.pop(rid)
        self._expire_from = nxt
        return [rid for _, rid in gone]

    def evict_first_expiring(self) -> bytes:
        """Remove the entry that expires first (the table is full; the oldest of equals); returns its id."""
        return self.evict_earliest(1)[0]

    def evict_earliest(self, count: int) -> list[bytes]:
        """As RouteTable.evict_earliest: one C-level scan of (expires, seq) per bucket finds the `count`
        smallest; only the buckets that hold one are read record by record."""
        _, by_exp_seq = self._scans()
        keys: list[tuple[float, int]] = [(e[1], seq) for seq, e in self._other.values()]
        for b in self._b:
            if b:
                keys += by_exp_seq.iter_unpack(b)
        chosen = heapq.nsmallest(count, keys)
        if not chosen:
            raise KeyError("evict_earliest: the table is empty")
        last = chosen[-1]
        order = {seq: i for i, (_, seq) in enumerate(chosen)}
        victims: list[bytes | None] = [None] * len(chosen)
        for rid, (seq, _) in self._other.items():
            if seq in order:
                victims[order[seq]] = rid
        seq_at, stride = self._seq_at, self._stride
        for b in self._b:
            if not b or min(by_exp_seq.iter_unpack(b)) > last:
                continue
            for i in range(0, len(b), stride):
                j = order.get(int.from_bytes(b[i + seq_at:i + stride], "little"))
                if j is not None:
                    victims[j] = bytes(b[i:i + _KEY])
        out = [rid for rid in victims if rid is not None]
        for rid in out:
            self.pop(rid)
        return out

    def routed_count(self) -> int:
        """Route ids with at least one next hop."""
        count = sum(1 for _, e in self._other.values() if len(e) > _FIRST_HOP)
        by_count = struct.Struct(f"<{_COUNT}xB{self._stride - _COUNT - 1}x")  # the next hop count alone
        none = (0,)
        for b in self._b:
            if b:  # one C-level scan per bucket (/v1/status calls this)
                counts = list(by_count.iter_unpack(b))
                count += len(counts) - counts.count(none)
        return count

    def export_rows(self, offset: float) -> list[ExportRow]:
        """As RouteTable.export_rows: every record read by one C call per bucket, no ordering (a relay
        with 1M routes snapshots them every `route_snapshot_s`: 10.8 s through `items()`, which decodes
        and sorts every record, against about 2.3 s)."""
        return [row for chunk in self.export_chunks(offset, EXPORT_CHUNK) for row in chunk]

    def export_chunks(self, offset: float, size: int) -> Iterator[list[ExportRow]]:
        """As RouteTable.export_chunks. Safe across changes between chunks: the buckets are those of the
        call (a bucket is read whole within one chunk; a rebuild makes new buckets and leaves the old ones
        as they were, read with the record layout of the call; peer numbers are never reused)."""
        out: list[ExportRow] = []
        for rid, (_, e) in list(self._other.items()):
            row = _export_row(rid, e, offset)
            if row is not None:
                out.append(row)
        whole, peers, buckets = self._whole, self._peers, list(self._b)
        for b in buckets:
            if not b:
                continue
            for v in whole.iter_unpack(b):
                n = v[4]
                if not n or not v[3]:  # no next hop, or homed here (distance 0)
                    continue
                if n == 1:
                    hops: tuple[tuple[str, int], ...] = ((peers[v[5]], v[6]),)
                elif n == 2:
                    hops = ((peers[v[5]], v[6]), (peers[v[7]], v[8]))
                else:
                    hops = tuple((peers[v[j]], v[j + 1]) for j in range(5, 5 + 2 * n, 2))
                out.append((v[0], v[1], v[2] + offset, hops))
            if len(out) >= size:
                yield out
                out = []
        if out:
            yield out


def _demoted(entry: RouteEntry, peer: str) -> RouteEntry:
    """entry with peer moved to the end of the next hops."""
    i = _FIRST_HOP + 2 * entry[_FIRST_HOP::2].index(peer)
    return entry[:i] + entry[i + 2:] + entry[i:i + 2]


def _led(entry: RouteEntry, peer: str, hops: int, route_k: int) -> RouteEntry:
    """entry with peer as its primary next hop at distance hops (EntryReaders.lead)."""
    rest = list(entry[_FIRST_HOP:])
    if peer in rest:
        i = rest.index(peer)
        del rest[i:i + 2]
    rest = [peer, hops, *rest][:2 * max(route_k, 1)]
    return (entry[0], entry[1], min(entry[2], hops), *rest)


def _expiry_of(item: tuple[bytes, RouteEntry]) -> float:
    expires: float = item[1][1]
    return expires


def _export_row(rid: bytes, e: RouteEntry, offset: float) -> ExportRow | None:
    """rid's snapshot row (RouteTable.export_rows), None for a route homed here or without next hops."""
    if len(e) <= _FIRST_HOP or e[2] <= 0:
        return None
    return (rid, e[0], e[1] + offset, tuple(zip(e[_FIRST_HOP::2], e[_FIRST_HOP + 1::2], strict=True)))


def _without(e: RouteEntry, peer: str) -> RouteEntry:
    """Entry e without next hop peer, its feasibility distance that of the next hops left."""
    i = e.index(peer)
    rest = e[_FIRST_HOP:i] + e[i + 2:]
    fd = min(rest[1::2]) if rest else UNKNOWN_DISTANCE
    return (e[0], e[1], fd, *rest)
