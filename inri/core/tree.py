"""Tree gossip, rule G9 (`[engine] gossip_scheme = "tree"`): Plumtree's eager/lazy push on top of rules
G1-G4, with eager sets per incoming neighbour (as DVMRP prunes per source and interface).

A relay sends the full registration frame (RegGossip) only to its *eager* neighbours and a compact
announcement (route id, epoch, hops) to its *lazy* ones, in RegAnnounce frames batched per neighbour.
Which neighbours are lazy depends on where the registration came from: the neighbour it arrived from
(its direction: the homes behind that neighbour), or none when it is homed here. One shared tree for
every home would route along tree paths (measured: 1.5x the path latency); per direction, the eager
links follow each direction's first arrivals, close to the shortest-path tree of every home.

Every neighbour starts eager. Upkeep, carried in RegAnnounce frames:
- prune: a full frame of a (route, epoch) we already hold came from a neighbour: it moves us to lazy
  for the direction it got that route from;
- eager: a neighbour's announcement came before any full frame (its path was faster): it moves us to
  eager for that direction;
- graft (RegGraft): an announced (route, epoch) whose full frame did not come within
  tree_graft_timeout_s is asked from the announcer with the fewest hops, which answers with the full
  frame and moves us to eager; no answer by the next timeout, the next announcer.

Announcements of a (route, epoch) this relay holds are what duplicate full frames were under flooding:
backup next hops under rule G3 unchanged (feasible: hops below the feasibility distance, room left),
without a signature check (this relay verified that (route, epoch) itself).

The route table stays the seen-cache; a relay keeps the registrations it forwarded for TREE_CACHE_S
(graft answers, directions), bounded. `flood` (the default) never sends through this module, but every
relay handles announcements and grafts (a mesh may mix both schemes).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from typing import Any

from inri.core.api import Effect, Send, TraceLevel
from inri.core.config import EngineConfig
from inri.core.gossip import gossip_frame_bytes
from inri.core.neighbours import Neighbours
from inri.core.state import Neighbour, make_send
from inri.core.tables import Arrival, BoundedMap, CompactRouteTable, RouteEntry, RouteTable
from inri.protocol import limits
from inri.protocol.messages import Announcement, RegAnnounce, RegGossip, RegGraft, Registration

# How long a relay keeps a registration it forwarded, to answer grafts: far beyond any graft timeout
# (a neighbour grafts after tree_graft_timeout_s per announcer tried).
TREE_CACHE_S = 30.0
TREE_CACHE_MAX = 65536  # registrations kept for graft answers (bounded whatever the load)
TREE_MISSING_MAX = 65536  # announced (route, epoch) pairs awaiting their full frame
# Virtual arrivals kept (route id -> (epoch, time)): copies of a registration come within seconds of it,
# so the newest 8192 cover minutes at any usual registration rate (about 1 MB per relay at most); a route
# whose entry went compares as it did before lags (first come, first primary).
TREE_VTIME_MAX = 8192
TREE_VTIME_S = 5.0  # ...and none older than this is kept (announcements and corrections come within about 1 s)
TREE_MIN_SAMPLES = 3  # full frames sent before a link's measured share decides (unmeasured: eager)
TREE_HALF_AT = 64  # counts are halved past this: a link's share follows changes of topology and homes
TREE_EAGER_WEIGHT = 2  # a neighbour that needed our full frame (graft, eager request) counts as this many useful ones
TREE_CORRECT_S = 0.002  # an earlier virtual arrival by at least this is announced again to the neighbours
TREE_STATS_MAX = 4096  # (direction, hops, neighbour) counters per relay
_FEASIBLE = Arrival.FEASIBLE
_FULL = TraceLevel.FULL


def _uint_bytes(v: int) -> int:
    """msgpack size of an unsigned int."""
    return 1 if v < 128 else 2 if v < 256 else 3 if v < 65536 else 5 if v < 2**32 else 9


def _array_header(n: int) -> int:
    return 1 if n < 16 else 3


_ROUTE_ID = 2 + limits.ROUTE_ID_BYTES  # a bin8 of 16 bytes


def announce_frame_bytes(msg: RegAnnounce) -> int:
    """Bytes of codec.encode(msg), computed without encoding (the tree scheme's most frequent frame);
    tests/test_tree.py checks it against the codec."""
    lists = 3 if msg.eager else 2 if msg.prunes else 1
    n = _array_header(2 + lists) + 1 + _uint_bytes(limits.PROTOCOL_VERSION) + _array_header(len(msg.entries))
    for a in msg.entries:
        n += 1 + _ROUTE_ID + _uint_bytes(a.epoch) + _uint_bytes(a.hops) + (_uint_bytes(a.lag_ms) if a.lag_ms else 0)
    if lists > 1:
        n += _array_header(len(msg.prunes)) + _ROUTE_ID * len(msg.prunes)
    if lists > 2:
        n += _array_header(len(msg.eager)) + _ROUTE_ID * len(msg.eager)
    return n


def graft_frame_bytes(epoch: int) -> int:
    """Bytes of codec.encode(RegGraft(route id, epoch))."""
    return 1 + 1 + _uint_bytes(limits.PROTOCOL_VERSION) + _ROUTE_ID + _uint_bytes(epoch)


def _claimed(entry: RouteEntry | None, epoch: int, peer: str) -> bool:
    return entry is not None and RouteTable.epoch(entry) == epoch and RouteTable.claims(entry, peer)


class TreeGossip:
    """G9's owner: eager/lazy push of registration gossip (gossip_scheme "tree") and the state it keeps.
    The engine holds one (`Engine._tree`); gossip.py hands it first arrivals, duplicates and
    originations, the engine its frames (RegAnnounce, RegGraft), its timer and links that went down.
    It shares the engine's route table, neighbour set (read: the active view), random stream and counters,
    and changes no other rule group's state."""

    __slots__ = ("_relay_id", "_cfg", "_routes", "_neighbours", "_rng", "_counters", "_emit", "_level", "_stats",
                 "_out", "_flush_at", "_missing", "_extra", "_vtime", "_grafts", "_cache")

    def __init__(self, relay_id: str, config: EngineConfig, routes: RouteTable | CompactRouteTable,
                 neighbours: Neighbours, rng: random.Random, counters: dict[str, int],
                 emit: Callable[..., None], level: int) -> None:
        self._relay_id = relay_id
        self._cfg = config
        self._routes = routes
        self._neighbours = neighbours
        self._rng = rng
        self._counters = counters
        self._emit = emit
        self._level = level
        # Full frames sent and prunes received per (direction: the neighbour a registration came from,
        # None: homed here; hops; neighbour) and per (direction, None, neighbour).
        self._stats: dict[tuple[str | None, int | None, str], list[int]] = {}
        # RegAnnounce frame per neighbour (announcements, prunes, eager requests) until _flush_at.
        self._out: dict[str, tuple[list[Announcement], list[bytes], list[bytes]]] = {}
        self._flush_at: float | None = None
        # Announced (route, epoch) pairs awaiting their full frame -> [(announcer, hops, virtual arrival)].
        self._missing: BoundedMap[tuple[bytes, int], list[tuple[str, int, float]]] = BoundedMap(TREE_MISSING_MAX)
        self._extra = 0  # bytes of the lag field of the full frames last forwarded (trace rows)
        self._vtime: BoundedMap[bytes, tuple[int, float]] = BoundedMap(TREE_VTIME_MAX)  # route id -> (epoch, at)
        self._grafts: list[tuple[float, bytes, int]] = []  # graft timers (when, route id, epoch)
        # The registrations forwarded lately: route id -> (registration, ttl, hops, until, direction).
        self._cache: BoundedMap[bytes, tuple[Registration, int, int, float, str | None]] = BoundedMap(TREE_CACHE_MAX)

    def _count(self, name: str, n: int = 1) -> None:
        self._counters[name] = self._counters.get(name, 0) + n

    def _trace(self, now: float, kind: str, **fields: Any) -> None:
        self._emit(now, self._relay_id, kind, **fields)

    # -- sending (first arrival or origination) ----------------------------------------------------

    def first(self, reg: Registration, ttl: int, hops: int, peer: str, at: float, now: float,
              jitter: float) -> list[Effect]:
        """The first full frame of (route, epoch) came from peer and set the route (G2), at virtual
        arrival time `at` (now less its lag): announcements that came before it are candidates for the
        primary and backups (G3), then forward (ttl left: hops and TTL as G2's)."""
        vtime = self._vtime
        while vtime:  # oldest first: forget the virtual arrivals no copy will be weighed against any more
            oldest = next(iter(vtime))
            if vtime[oldest][1] > at - TREE_VTIME_S:
                break
            del vtime[oldest]
        vtime.put_last(reg.route_id, (reg.epoch, at))
        self._extra = 0
        has = self._arrived(reg.route_id, reg.epoch, now) if self._missing else None
        if has:  # an announcer became the primary: forward at its distance (hops + ttl stays the flood's)
            d = self._distance(reg.route_id, reg.epoch, hops)
            ttl, hops = ttl + hops - d, d
        return self.forward(reg, ttl, hops, peer, now, jitter, has) if ttl > 0 else []

    def _distance(self, rid: bytes, epoch: int, hops: int) -> int:
        """Our distance to rid's home now (the primary's, as Babel advertises its current metric): at
        most `hops`, what we first forwarded or announced; an earlier, feasible primary can be closer."""
        entry = self._routes.get(rid)
        if entry is None or RouteTable.epoch(entry) != epoch:
            return hops
        vector = RouteTable.vector(entry)
        return min(hops, vector[0][1]) if vector else hops

    def forward(self, reg: Registration, ttl: int, hops: int, exclude: str | None, now: float,
                jitter: float, has: dict[str, int] | None = None) -> list[Effect]:
        """Full frame to the neighbours eager for its direction (`exclude`: the neighbour it came from,
        None at its home) and distance, an announcement (batched) to the others; keep reg for grafts
        and upkeep. `has`: neighbours that announced it to us already (-> their hops): no full frame,
        and an announcement only where we would be a feasible next hop for them (hops below theirs)."""
        lag = self._lag(reg.route_id, reg.epoch, now)
        fwd = RegGossip(reg, ttl, hops, lag_ms=lag) if lag else RegGossip(reg, ttl, hops)
        self._extra = 1 + _uint_bytes(lag) if lag else 0
        out: list[Effect] = []
        ann: Announcement | None = None
        rng = self._rng
        explore = self._cfg.tree_explore
        for p, st in self._neighbours.active().items():
            if p == exclude:
                continue
            if has and p in has:
                if hops >= has[p]:
                    continue
            elif self._eager(exclude, hops, p) or (explore and rng.random() < explore):
                self._note(exclude, hops, p, 1, 0)
                st.last_sent = now
                out.append(make_send(p, fwd, rng.random() * jitter if jitter else 0.0))
                continue
            if ann is None:
                ann = Announcement(reg.route_id, reg.epoch, hops)
            self._batch(p)[0].append(ann)
        if ann is not None and self._flush_at is None:
            self._flush_at = now + self._cfg.tree_announce_delay_s
        self._cache.put_last(reg.route_id, (reg, ttl, hops, now + TREE_CACHE_S, exclude))
        if exclude is None:  # originated here: announcements' lags count from now
            self._vtime.put_last(reg.route_id, (reg.epoch, now))
        return out

    def _lag(self, rid: bytes, epoch: int, now: float) -> int:
        """Milliseconds (floored) since this relay's virtual arrival of (rid, epoch): the lag_ms of what
        it sends about it now (0: arrived just now, or not known)."""
        first = self._vtime.get(rid)
        if first is None or first[0] != epoch or now <= first[1]:
            return 0
        return min(int((now - first[1]) * 1000.0), limits.MAX_ANNOUNCE_LAG_MS)

    def _eager(self, direction: str | None, hops: int, peer: str) -> bool:
        """Does a full frame from this direction, at this distance, usually reach peer first? Measured:
        full frames sent and prunes received per (direction, hops, neighbour), else per (direction,
        neighbour) while fewer than TREE_MIN_SAMPLES; unmeasured links are eager."""
        stats = self._stats
        got = stats.get((direction, hops, peer))
        if got is None or got[0] < TREE_MIN_SAMPLES:
            got = stats.get((direction, None, peer))
            if got is None or got[0] < TREE_MIN_SAMPLES:
                return True
        sent, dup = got
        return sent - dup >= self._cfg.tree_eager_share * sent

    def _note(self, direction: str | None, hops: int, peer: str, sent: int, dup: int) -> None:
        stats = self._stats
        for key in ((direction, hops, peer), (direction, None, peer)):
            got = stats.get(key)
            if got is None:
                if len(stats) >= TREE_STATS_MAX:
                    return
                stats[key] = [sent, dup]
            else:
                got[0] += sent
                got[1] += dup
                if got[0] > TREE_HALF_AT:  # forget slowly: links and homes change
                    got[0] //= 2
                    got[1] //= 2

    def _batch(self, peer: str) -> tuple[list[Announcement], list[bytes], list[bytes]]:
        """What waits for the next RegAnnounce frame to peer: (announcements, prunes, eager requests)."""
        batch = self._out.get(peer)
        if batch is None:
            batch = self._out[peer] = ([], [], [])
        return batch

    def _upkeep(self, peer: str, rid: bytes, eager: bool, now: float) -> None:
        """Queue a prune (eager False) or an eager request about rid for peer's next RegAnnounce frame."""
        batch = self._batch(peer)
        (batch[2] if eager else batch[1]).append(rid)
        if self._flush_at is None:
            self._flush_at = now + self._cfg.tree_announce_delay_s

    def duplicate(self, peer: str, rid: bytes, now: float) -> None:
        """A full frame of a (route, epoch) we hold came from peer: ask for announcements instead."""
        self._upkeep(peer, rid, False, now)

    def _arrived(self, rid: bytes, epoch: int, now: float) -> dict[str, int]:
        """The full frame of (rid, epoch) arrived (its route is set): announcements that came first are
        G3 arrivals at their virtual arrival times (arrival minus lag), earliest first, so the earliest
        feasible one becomes the primary (flooding's first arrival) and the next a backup; the earliest
        announcer was faster than the full frame: it should send full frames to us.
        Returns the announcers (-> their hops)."""
        waiting = self._missing.pop((rid, epoch), None)
        has: dict[str, int] = {}
        if waiting:
            active = self._neighbours.active()
            for at, peer, hops in sorted((at, peer, hops) for peer, hops, at in waiting):
                if peer in active and peer not in has:
                    if not has:
                        self._upkeep(peer, rid, True, now)
                    has[peer] = hops
                    self._known(rid, epoch, peer, hops, at, now)
        return has

    # -- receiving -----------------------------------------------------------------------------------

    def on_announce(self, peer: str, state: Neighbour, msg: RegAnnounce, now: float) -> list[Effect]:
        """A RegAnnounce frame from peer: its prunes and eager requests measure our links; its announcements
        are G3 arrivals (a held (route, epoch)) or wait for their full frame, grafted after a timeout."""
        cache = self._cache
        for rid in msg.prunes:  # our full frame was a duplicate there
            cached = cache.get(rid)
            if cached is not None:
                self._note(cached[4], cached[2], peer, 0, 1)
        for rid in msg.eager:  # our announcement came first there: a full frame would have been useful
            cached = cache.get(rid)
            if cached is not None:
                self._note(cached[4], cached[2], peer, TREE_EAGER_WEIGHT, 0)
        routes = self._routes
        cfg = self._cfg
        for a in msg.entries:
            entry = routes.get(a.route_id)
            known_epoch = None if entry is None else RouteTable.epoch(entry)
            at = now - a.lag_ms / 1000.0 if a.lag_ms else now  # when flooding's copy would have come
            if known_epoch == a.epoch:
                self._known(a.route_id, a.epoch, peer, a.hops, at, now)
            elif known_epoch is None or a.epoch > known_epoch:
                key = (a.route_id, a.epoch)
                waiting = self._missing.get(key)
                if waiting is None:
                    self._missing.put(key, [(peer, a.hops, at)])
                    heapq.heappush(self._grafts, (now + cfg.tree_graft_timeout_s, a.route_id, a.epoch))
                elif len(waiting) < 2 * cfg.active_max:
                    waiting.append((peer, a.hops, at))
            # an older epoch than ours: nothing to learn
        return []

    def _known(self, rid: bytes, epoch: int, peer: str, hops: int, at: float, now: float) -> None:
        """Rule G3 for an announcement of a (route, epoch) this relay holds, at its virtual arrival time
        `at`: earlier than the primary's and feasible (hops below the feasibility distance), the new
        primary (the primary before it the first backup: flooding's first arrival, whichever frame
        came first here); else a feasible backup next hop while there is room."""
        routes = self._routes
        entry = routes.get(rid)
        if entry is None or hops >= limits.MAX_TTL:
            return
        if self._lead(rid, entry, epoch, peer, hops, at, now):
            return
        if routes.arrival(entry, epoch, peer, hops, self._cfg.route_k) is _FEASIBLE:
            routes.add_backup(rid, entry, peer, hops + 1)
            if self._level >= _FULL:
                self._trace(now, "route_backup", msg=f"{rid.hex()}:{epoch}", route=rid.hex(), peer=peer,
                            hops=hops + 1, epoch=epoch)

    def _lead(self, rid: bytes, entry: RouteEntry, epoch: int, peer: str, hops: int, at: float,
              now: float) -> bool:
        """peer's copy of (rid, epoch), `hops` from its home, would have come at `at` under flooding:
        before the primary's and feasible, peer becomes the primary (the former primary its first
        backup). True: the announcement is spent (peer led, or it was the primary's own, earlier)."""
        first = self._vtime.get(rid)
        if first is None or first[0] != epoch or at >= first[1] or RouteTable.epoch(entry) != epoch:
            return False
        if RouteTable.primary(entry) == peer:  # the primary's path is faster than we knew
            self._vtime[rid] = (epoch, at)
        elif hops >= RouteTable.distance(entry):  # not feasible (G3): no next hop at all
            return False
        else:
            self._routes.lead(rid, entry, peer, hops + 1, self._cfg.route_k)
            self._vtime[rid] = (epoch, at)
            self._count("tree_primary_earlier")
            if self._level >= _FULL:
                self._trace(now, "route_backup", msg=f"{rid.hex()}:{epoch}", route=rid.hex(), peer=peer,
                            hops=hops + 1, epoch=epoch, reason="earlier")
        if first[1] - at >= TREE_CORRECT_S:
            self._correct(rid, epoch, peer, now)
        return True

    def _correct(self, rid: bytes, epoch: int, primary: str, now: float) -> None:
        """Our virtual arrival of (rid, epoch) is earlier than what we sent about it said: if we sent
        anything (full frames, announcements), announce it again, with the new lag, to every neighbour
        but the primary, which corrects their choice of primary as flooding's earlier copy would have."""
        cached = self._cache.get(rid)
        if cached is None or cached[0].epoch != epoch:
            return  # not forwarded yet: what we forward will carry the new lag
        ann = Announcement(rid, epoch, cached[2])
        for p in self._neighbours.active():
            if p != primary:
                self._batch(p)[0].append(ann)
        self._count("tree_corrections")
        if self._flush_at is None:
            self._flush_at = now + self._cfg.tree_announce_delay_s

    def earlier(self, peer: str, msg: RegGossip, entry: RouteEntry, now: float) -> bool:
        """A full frame of a (route, epoch) we hold (G3), counted at its virtual arrival time."""
        reg = msg.registration
        if msg.hops >= limits.MAX_TTL:
            return False
        at = now - msg.lag_ms / 1000.0 if msg.lag_ms else now
        return self._lead(reg.route_id, entry, reg.epoch, peer, msg.hops, at, now)

    def on_graft(self, peer: str, state: Neighbour, msg: RegGraft, now: float) -> list[Effect]:
        """A RegGraft from peer: answer with the full frame we forwarded lately (within peer's budget)."""
        cached = self._cache.get(msg.route_id)
        if cached is None or cached[0].epoch < msg.epoch or cached[3] <= now:
            self._count("tree_graft_unknown")
            return []
        reg, ttl, hops, _, direction = cached
        lag = self._lag(reg.route_id, reg.epoch, now)
        self._note(direction, hops, peer, TREE_EAGER_WEIGHT, 0)  # it needed our full frame
        cfg = self._cfg
        if not state.reg_budget.take(now, cfg.reg_budget_per_peer_per_s, cfg.reg_budget_peer_burst):
            self._count("tree_graft_refused")
            return []
        state.last_sent = now
        self._count("tree_graft_answered")
        if self._level:
            self._trace(now, "gossip_control", msg=f"{msg.route_id.hex()}:{reg.epoch}", route=msg.route_id.hex(),
                        peer=peer, count=1, nbytes=gossip_frame_bytes(reg) + (1 + _uint_bytes(lag) if lag else 0),
                        reason="graft_answer")
        return [Send(peer, RegGossip(reg, ttl, hops, lag_ms=lag) if lag else RegGossip(reg, ttl, hops))]

    # -- timers --------------------------------------------------------------------------------------

    def next_due(self) -> float | None:
        """When the tree scheme's timer is due (announcement flush, graft timeouts); None: nothing armed."""
        t = self._flush_at
        if self._grafts:
            first = self._grafts[0][0]
            if t is None or first < t:
                return first
        return t

    def lag_bytes(self) -> int:
        """Bytes of the lag field of the full frames last forwarded (trace rows' frame size)."""
        return self._extra

    def timer(self, now: float) -> list[Effect]:
        """The announcement flush and graft timeouts that are due."""
        out: list[Effect] = []
        if self._flush_at is None and not self._grafts:
            return out
        if self._flush_at is not None and now >= self._flush_at:
            out += self._flush(now)
        grafts = self._grafts
        while grafts and grafts[0][0] <= now:
            _, rid, epoch = heapq.heappop(grafts)
            out += self._graft(rid, epoch, now)
        return out

    def _flush(self, now: float) -> list[Effect]:
        """One RegAnnounce frame per neighbour with what waits for it (several past MAX_ANNOUNCEMENTS)."""
        self._flush_at = None
        out: list[Effect] = []
        sizes: dict[int, int] = {}  # frame bytes -> frames of that size (trace rows: count x one frame's bytes)
        step = limits.MAX_ANNOUNCEMENTS
        routes = self._routes
        lags: dict[bytes, Announcement] = {}
        for p, (entries, prunes, eager) in self._out.items():
            st = self._neighbours.active().get(p)
            if st is None:
                continue
            # A neighbour that became one of our next hops for the route meanwhile is closer to its
            # home than we are: it cannot take us as a next hop (G3) and has it; no announcement.
            if len(entries) > 1:  # a correction (_correct) may repeat an announcement still waiting
                entries = list({(a.route_id, a.epoch): a for a in entries}.values())
            entries = [self._lagged(a, now, lags) for a in entries
                       if not _claimed(routes.get(a.route_id), a.epoch, p)]
            if not (entries or prunes or eager):
                continue
            for i in range(0, max(len(entries), len(prunes), len(eager)), step):
                msg = RegAnnounce(tuple(entries[i:i + step]), tuple(prunes[i:i + step]), tuple(eager[i:i + step]))
                out.append(Send(p, msg))
                if self._level:
                    size = announce_frame_bytes(msg)
                    sizes[size] = sizes.get(size, 0) + 1
            st.last_sent = now
        self._out.clear()
        for size, frames in sorted(sizes.items()):
            self._trace(now, "gossip_control", count=frames, nbytes=size, reason="announce")
        return out

    def _lagged(self, a: Announcement, now: float, done: dict[bytes, Announcement]) -> Announcement:
        """a with its lag (the milliseconds, floored, since this relay's virtual arrival of (route, epoch))
        and our distance now."""
        got = done.get(a.route_id)
        if got is None or got.epoch != a.epoch:
            lag = self._lag(a.route_id, a.epoch, now)
            hops = self._distance(a.route_id, a.epoch, a.hops)
            got = done[a.route_id] = Announcement(a.route_id, a.epoch, hops, lag) if lag or hops != a.hops else a
        return got

    def _graft(self, rid: bytes, epoch: int, now: float) -> list[Effect]:
        """A graft timer fired: still no full frame of (rid, epoch)? Graft the closest announcer left."""
        key = (rid, epoch)
        waiting = self._missing.get(key)
        if waiting is None:
            return []
        entry = self._routes.get(rid)
        if entry is not None and RouteTable.epoch(entry) >= epoch:
            del self._missing[key]
            return []
        live = [(h, i) for i, (p, h, _) in enumerate(waiting) if p in self._neighbours.active()]
        if not live:
            del self._missing[key]
            return []
        _, i = min(live)
        peer = waiting.pop(i)[0]
        self._neighbours.sent(peer, now)
        self._count("tree_grafts")
        heapq.heappush(self._grafts, (now + self._cfg.tree_graft_timeout_s, rid, epoch))
        if self._level:
            self._trace(now, "gossip_control", msg=f"{rid.hex()}:{epoch}", route=rid.hex(), peer=peer, count=1,
                        nbytes=graft_frame_bytes(epoch), reason="graft")
        return [Send(peer, RegGraft(rid, epoch))]

    def peer_down(self, peer: str) -> None:
        """Forget what was measured and batched for peer, whose link went down."""
        if not self._stats and not self._out:
            return
        stats = self._stats
        for key in [k for k in stats if k[0] == peer or k[2] == peer]:
            del stats[key]
        self._out.pop(peer, None)
