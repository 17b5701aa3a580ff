"""Route sync at link-up, rule G11: a relay that (re)starts re-learns the routes it lacks from its
neighbours, not only from its own snapshot (G2) and from homes next to it (G5).

A relay that restarts has no routes but those of its route snapshot (none when it was killed before its
first one), and next hops that may not be its neighbours any more. Gossip brings a route again only when
its device refreshes, so every push entered at it or passing through it searched (rings, local repair)
until then. Relays keep no registrations (a route is about 71 bytes; its registration would be 150 more),
so a neighbour cannot hand over verifiable registrations: it tells what it holds, `(route id, hops,
seconds left)`, and the asker takes each route id it has no live next hop for as a *provisional* route
through that neighbour, and one it has a live next hop for as that route's fallback, used once the route
has no next hop left (they may leave later, when no link is left to ask). A provisional route only
forwards pushes (which carry their registration, verified where it matters: at the entry, and by the
home's receipt on the way back); it is never forwarded, announced, exported or counted as a route of an
epoch, and any live next hop the relay has or learns for the route id (gossip, a receipt, F7) takes
precedence. A neighbour that lies can capture only route ids the asker has no live route for (or none
left), which it could capture as well by replaying their registrations (hops 0) to a relay that just
restarted; and it is scored like any next hop that swallows pushes (S1).

Bounded: a relay asks only on links that come up in its first SYNC_WINDOW_S after start (the daemon's
start; a simulated relay that rejoins); a neighbour answers once per link, SYNC_ROUTES_PER_TICK routes per
keepalive interval (the rest on later ticks), from a list of its route ids read at most once per
SYNC_KEYS_MAX_AGE_S, only routes it holds with a live next hop other than the asker, never those homed at
it (G5 announces those with their registration); the asker takes RouteSync frames only from neighbours
it asked on their current link, and at most route_max provisional routes (the oldest go first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inri.core.api import Effect, Send
from inri.core.state import EngineContext, RuleGroup
from inri.core.tables import RouteTable
from inri.protocol import limits
from inri.protocol.codec import encode_unchecked
from inri.protocol.messages import RouteSync, SyncedRoute

if TYPE_CHECKING:  # annotations only (the groups import each other: Engine.__init__ wires them)
    from inri.core.syncstate import SyncState
    from inri.core.tables import CompactRouteTable, RouteTable

SYNC = "sync"  # Hello feature: "send me the routes you hold" (rule G11)
# A relay asks on the links that come up this long after it starts: a restart's links (former neighbours
# re-dialled, M6) come up within seconds; later links are membership churn, whose relays hold routes.
SYNC_WINDOW_S = 60.0
# Routes a neighbour sends one asking relay per keepalive interval: four frames of MAX_SYNCED_ROUTES (about
# 24 KiB). A lab mesh's routes go at once; a million routes take about 16 minutes, paced.
SYNC_ROUTES_PER_TICK = 4 * limits.MAX_SYNCED_ROUTES
# The route ids a neighbour answers with are read out of its table at most once per this, and shared by
# every relay that asks meanwhile: a relay that reconnects over and over costs it a cursor, not a read of
# a million routes each time (a route learnt within the last second comes to the asker by gossip too,
# as to every relay). Longer let a relay answer from a list read before its routes came (a mesh that
# started a few seconds before: measured with real relays, answers from an empty list).
SYNC_KEYS_MAX_AGE_S = 1.0


class SyncRules(RuleGroup):
    """G11: asking for routes at link-up, answering, and the provisional routes learnt (the tables:
    `SyncState`, syncstate.py)."""

    def __init__(self, ctx: EngineContext, routes: RouteTable | CompactRouteTable, sync: SyncState) -> None:
        super().__init__(ctx)
        self._routes = routes
        self._sync = sync

    # Rule G11 (the neighbour asked).
    def on_sync_request(self, peer: str, now: float) -> list[Effect]:
        """peer asked for the routes this relay holds (once per link): a cursor over the route ids (read
        out of the table at most once per SYNC_KEYS_MAX_AGE_S), then the first tick's share of them."""
        sync = self._sync
        if not sync.serve(peer):
            self._count("route_sync_refused_again")
            return []
        keys = sync.keys(now, SYNC_KEYS_MAX_AGE_S)
        if keys is None:
            keys = list(self._routes.keys())
            sync.keep_keys(now, keys)
        sync.queue(peer, keys, len(keys))
        return self.sync_send(peer, now)

    # Rule G11 (the neighbour asked).
    def sync_send(self, peer: str, now: float) -> list[Effect]:
        """The next SYNC_ROUTES_PER_TICK routes queued for peer, in RouteSync frames."""
        sync = self._sync
        got = sync.queued(peer)
        if got is None or peer not in self._linked:
            sync.queue(peer, [], 0)
            return []
        keys, left = got
        routes = self._routes
        entries: list[SyncedRoute] = []
        stop = max(0, left - SYNC_ROUTES_PER_TICK)
        while left > stop:
            left -= 1
            rid = keys[left]
            entry = routes.get(rid)
            if entry is None:
                continue
            ttl = RouteTable.expires(entry) - now
            dist = RouteTable.distance(entry)
            if dist < 1 or ttl < 1 or not self._live_hop(rid, peer):
                continue  # homed here (G5 announces it), expiring, or only through the asker
            entries.append(SyncedRoute(rid, min(dist, limits.MAX_TTL), int(min(ttl, limits.MAX_LIFETIME_S))))
        sync.queue(peer, keys, left)
        out: list[Effect] = []
        step = limits.MAX_SYNCED_ROUTES
        for i in range(0, len(entries), step):
            frame = RouteSync(tuple(entries[i:i + step]))
            out.append(Send(peer, frame))
            if self._level:
                self._trace(now, "gossip_control", peer=peer, count=1, nbytes=len(encode_unchecked(frame)),
                            reason="route_sync")
        if out:
            self._linked[peer].last_sent = now  # M2
            self._count("route_sync_frames_sent", len(out))
            self._count("route_sync_routes_sent", len(entries))
        return out

    def _live_hop(self, rid: bytes, exclude: str | None) -> bool:
        """True when the route table holds a next hop for rid that is up and is not `exclude`."""
        active = self._linked
        return any(p != exclude and p in active for p in self._routes.next_hops_of(rid))

    # Rule G11 (the asker).
    def on_route_sync(self, peer: str, msg: RouteSync, now: float) -> list[Effect]:
        """Routes a neighbour holds: each route id with no live next hop here becomes a provisional route
        through it (distance hops + 1), until its registration would expire. One with a live next hop here
        is kept too, as its fallback (used once the route has no next hop left), unless one through another
        neighbour that is up is kept already: the table's next hops may leave (a neighbour that makes room
        for another drops us, and its route claims go, S2) and no link of the relay's first minute may be
        left to ask again. From a neighbour not asked on this link: ignored."""
        sync, active = self._sync, self._linked
        if not sync.asked(peer):
            self._count("route_sync_unsolicited")
            return []
        taken = 0
        for e in msg.entries:
            if e.ttl_s < 1:
                continue
            fallback = self._live_hop(e.route_id, None)  # the table's route serves first: this is its fallback
            if fallback:
                got = sync.provisional(e.route_id)
                if got is not None and got[0] in active:
                    continue
            sync.take(e.route_id, (peer, e.hops + 1, now + e.ttl_s, fallback))
            taken += 1
        self._count("route_sync_routes_taken", taken)
        return []

    # Rules G11, F1 (a provisional route serves as the route vector's last resort).
    def provisional_hop(self, rid: bytes, exclude: str | None) -> str | None:
        """The next hop of rid's provisional route, when it is up and not `exclude` (None: none)."""
        got = self._sync.provisional(rid)
        if got is None or got[0] == exclude or got[0] not in self._linked:
            return None
        if got[3] and self._routes.next_hops_of(rid):
            return None  # a fallback stands in only once the route has no next hop left (F3: a home down)
        return got[0]

    def provisional_count(self) -> int:
        """Route ids this relay reaches only through a provisional route (rule G11) whose neighbour is up:
        one through a neighbour whose link went down forwards nothing (`provisional_hop`) until that
        neighbour links again, so it is no route to count (a relay restarted amid link churn listed
        routes it could not use, and searched for their pushes)."""
        routes, active = self._routes, self._linked
        return sum(1 for rid, peer in self._sync.provisional_peers() if peer in active and not routes.next_hops_of(rid))
