"""Route withdrawal, rule G12 (`[engine] route_withdrawal`): the triggered updates of Babel (RFC 8966,
3.7.2: an unreachable route is announced with an infinite metric at once) and DSDV. One owner, holding
its state and its rule.

A relay that loses its last live next hop for a route id tells its neighbours (those that said
`withdraw` in their Hello) in a `RouteWithdraw` frame; a neighbour whose next hop it is drops it, and
passes the withdrawal on only when that was its own last live next hop (a relay with another absorbs it).
When the link to a route's home relay goes (a next hop at distance 1: the route was learnt from it at
hop 0), its neighbours withdraw the route as `home down`, whatever else they hold, and that kind travels
with the wave: custodians of pushes for it then park them (custody.py) and relays on the way answer
`home unreachable` (forwarding.py) instead of searching. With the stem on (stem.py, G7) the flood starts at
the fluff relay and no relay holds the home at distance 1: the home's stem successor, whose only next hop
is its stem predecessor, withdraws as `home down` when that link goes (it cannot tell the home from a stem
relay, G6; a failed stem relay is re-stemmed around by the home, G10, and the newer generation ends the
withdrawal), and a relay left with no next hop by a link that went (one of the home's flood neighbours)
takes a `home down` from any neighbour as the reason (stem on only). A relay whose withdrawn route gets a live next
hop again (the home's link back, a next hop's restore: for `home down`, none of the next hops it had
then counts, as they lead to the same home) sends `restored` (not to its own next hops: split horizon); the
neighbours that dropped it for its withdrawal re-take it, pass the restore on and wake the pushes parked
for the route (C3c). A withdrawal is also Babel's route request (RFC 8966 3.8.2.1): a neighbour that still
has a live route avoiding the withdrawer (one that absorbs it, one the withdrawer was never a next hop of,
a home of the route id) answers it with `restored` and its distance; a relay whose route is withdrawn and
has no live next hop takes a `restored` from any neighbour when it is feasible (strictly closer than the
feasibility distance it keeps for the route's epoch), which no route leading back through it can be.
A newer epoch ends a withdrawal of the older one (its flood restores the route
everywhere by itself). A withdrawal is held HOLD_S at most: a home that was up after all (one link lost)
is searched for as before G12 after that.

Rule G13, the other half of Babel's answer (RFC 8966 3.8.1.2, the seqno request): a custodian parking a push
for a route withdrawn here, or searching for one withdrawn as `no route` with no live next hop (`ask`), asks
for a newer route; a relay whose route is withdrawn with no live next hop, offered a route it may not take
(not feasible, or farther than one hop from a home for a `home down`), asks the neighbour that offered it
for a newer route (a `request` entry); a relay with a live route passes the request on along it (a withdrawn
one towards the route it was offered), at most `hops` relays, once per route id every REQUEST_GAP_S; a home
of the route id that gets it issues the next route generation (G10, signed with the registration's receipt
key; stem.py, `StemRules.regenerate`), whose flood replaces every relay's route of the epoch, feasible for
all of them: a home back on other links than before, a home that lost one link, and the other home of a
route id homed in two places (issue 42 item 3) then take over the relays left parked, and the pushes parked
for them are re-sent (C3c). A request that meets no live route (a home that is down) goes nowhere.

Hostile relays: a withdrawal counts only from a current next hop for the route (a relay cannot cut a route
it is not on), a restore from a neighbour whose withdrawal this relay heeded (it re-adds a next hop that
was one) or, for a route with no live next hop left, a feasible one (what gossip of the same epoch could
add: a G3 feasible arrival); a withdrawal from a neighbour is answered at most once per entry it sends;
each neighbour's entries are rate-bounded on the way in, and what this
relay sends each neighbour is bounded per keepalive interval (a route flapping costs a bounded number of
frames); each (route id, epoch) is withdrawn once until it is restored.

Compatibility: relays that predate G12 refuse frame type 14 as malformed (and lower the sender's score),
so a relay sends it only to neighbours whose Hello on their current link listed `withdraw`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from inri.core.api import Effect, Send
from inri.core.budget import TokenBucket
from inri.core.state import Neighbour
from inri.core.tables import CompactRouteTable, RouteEntry, RouteTable
from inri.protocol import limits
from inri.protocol.messages import RouteWithdraw, WithdrawKind, WithdrawnRoute

WITHDRAW = "withdraw"  # Hello feature: "send me your route withdrawals" (rule G12)
# Frames (of up to MAX_WITHDRAWN_ROUTES entries) this relay sends one neighbour per keepalive interval; the
# rest wait for the next tick. Two: a home's failure and its return within one interval both go at once.
FRAMES_PER_TICK = 2
# Entries a neighbour may send us per second (and a burst of twice that): what an honest relay sends at
# most (FRAMES_PER_TICK full frames per 1 s keepalive interval). Over it, entries are ignored (counted).
ENTRIES_IN_PER_S = float(FRAMES_PER_TICK * limits.MAX_WITHDRAWN_ROUTES)
ENTRIES_IN_BURST = 2 * ENTRIES_IN_PER_S
_NONE: frozenset[str] = frozenset()


def _past(vector: list[tuple[str, int]]) -> frozenset[str]:
    """The next hops of a route withdrawn as `home down` that do not count as its return (all but the home)."""
    return frozenset(p for p, h in vector if h != 1)


# A withdrawal is held this long at most: then the next hops dropped for it serve again (as before G12) and
# pushes parked for it search as C3 has them. A route withdrawn for a home that is in fact up (one of its
# links lost, the home back on other links) must not keep its pushes parked until their TTL.
HOLD_S = 120.0
# G13: a relay sends (or passes on) a route request for one route id at most this often; a home issues a
# generation on request at most once per stem_embargo_s per route id and REGEN_PER_S a second in all
# (stem.py), so a hostile neighbour's requests cost at most that many floods.
REQUEST_GAP_S = 10.0
# A request may pass the offered route's length and this many relays more (the route may have moved).
REQUEST_SLACK = 2
_REQUEST = b"?"  # the key prefix of a request in a neighbour's queue (beside its route updates)


class Withdrawals:
    """Rule G12: the routes withdrawn here, the next hops dropped for their withdrawals, and the frames
    queued for each neighbour that speaks `withdraw`."""

    __slots__ = ("_on", "_routes", "_linked", "_route_k", "_interval", "_count", "_renewed", "_regenerate",
                 "_generation", "_trace", "_speaks", "_withdrawn", "_dropped", "_offers", "_asked", "_demand", "_out",
                 "_sent", "_in", "_stem_keeps", "_stem_on")

    def __init__(self, on: bool, routes: RouteTable | CompactRouteTable, linked: Mapping[str, Neighbour],
                 route_k: int, interval_s: float, count: Callable[[str, int], None],
                 renewed: Callable[[bytes, float], None],
                 regenerate: Callable[[bytes, float], list[Effect]] | None = None,
                 generation: Callable[[bytes, int], int] | None = None,
                 trace: Callable[[float, int], None] | None = None,
                 stem_keeps: Callable[[bytes, RouteEntry, str], bool] | None = None, stem_on: bool = False) -> None:
        self._on = on  # [engine] route_withdrawal: off, this relay neither says `withdraw` nor withdraws
        self._routes = routes
        self._linked = linked
        self._route_k = route_k
        self._interval = interval_s
        self._count = count  # the engine's counters
        self._renewed = renewed  # C3c (custody.py): wake the pushes waiting for a route
        # G13 (stem.py): at a home of a route id, issue its next generation on request
        self._regenerate = regenerate
        # G10 (stemstate.py): rid's route generation at an epoch; a newer one than a withdrawal's ends it
        self._generation = generation if generation is not None else (lambda rid, epoch: 0)
        self._trace = trace  # (now, frames): the frames sent, a summary-level trace row (gossip messages)
        # G7 (stemstate.py): (rid, entry, peer) -> peer is this stem relay's stem predecessor for rid
        self._stem_keeps = stem_keeps if stem_keeps is not None else (lambda rid, entry, peer: False)
        self._stem_on = stem_on  # [engine] stem
        # neighbours whose Hello on their current link said `withdraw` (a dict, not a set: frames go out in
        # the order links came up, so a simulated run is the same whatever the process's hash seed)
        self._speaks: dict[str, None] = {}
        # route id -> (epoch, kind, next hops that do not count as its return, when, route generation) of the
        # routes withdrawn here
        self._withdrawn: dict[bytes, tuple[int, WithdrawKind, frozenset[str], float, int]] = {}
        # route id -> (epoch, next hop dropped for its withdrawal -> its distance)
        self._dropped: dict[bytes, tuple[int, dict[str, int]]] = {}
        # G13: route id -> (neighbour, distance) of the route last offered while withdrawn here, not taken
        self._offers: dict[bytes, tuple[str, int]] = {}
        self._asked: dict[bytes, float] = {}  # G13: route id -> when a request for it was last sent from here
        # G13: route id -> when pushes last needed it here (parked for it, or a request passed through)
        self._demand: dict[bytes, float] = {}
        # neighbour -> entries to send, by route id (a request by _REQUEST + route id: it replaces no update)
        self._out: dict[str, dict[bytes, WithdrawnRoute]] = {}
        self._sent: dict[str, tuple[float, int]] = {}  # neighbour -> (tick start, frames sent in it)
        self._in: dict[str, TokenBucket] = {}  # neighbour -> its entries' budget

    # -- links ---------------------------------------------------------------------------------------

    def features(self) -> tuple[str, ...]:
        """What this relay's Hello adds: `withdraw` when the rule is on."""
        return (WITHDRAW,) if self._on else ()

    def heard_hello(self, peer: str, features: Iterable[str], now: float) -> None:
        """peer's Hello: it takes withdrawals when it lists `withdraw` (on this link). A Hello again does
        not refill its budget."""
        if self._on and WITHDRAW in features and peer not in self._speaks:
            self._speaks[peer] = None
            self._in[peer] = TokenBucket(ENTRIES_IN_BURST, now)

    def link_up(self, now: float) -> list[Effect]:
        """A link came up: routes withdrawn here that it is a next hop of are live again (a home back on
        its link, a next hop back): restored."""
        return self._restore_live(now) if self._withdrawn else []

    def link_down(self, peer: str, now: float, *, home: bool = True) -> list[Effect]:
        """peer's link went down: withdraw each route whose last live next hop it was, and (`home down`)
        each it was the home of (a next hop at distance 1). home=False: the link was cut by this relay
        (membership's make-room or outbound quota), the home is up: `no route` only."""
        self._forget_peer(peer)
        if not self._on:
            return []
        linked = self._linked
        routes = self._routes
        for rid, entry in routes.items():
            if peer not in entry:  # as RouteTable.claims
                continue
            vector = RouteTable.vector(entry)
            if home and ((peer, 1) in vector or self._stem_keeps(rid, entry, peer)):
                self._withdraw(rid, RouteTable.epoch(entry), WithdrawKind.HOME_DOWN, now, _past(vector))
            elif not any(p in linked and p != peer for p, _ in vector):  # (a relay cut for its score is still linked)
                self._withdraw(rid, RouteTable.epoch(entry), WithdrawKind.NO_ROUTE, now)
        return self.flush(now)

    def _forget_peer(self, peer: str) -> None:
        self._speaks.pop(peer, None)
        self._out.pop(peer, None)
        self._sent.pop(peer, None)
        self._in.pop(peer, None)

    # -- frames --------------------------------------------------------------------------------------

    def on_frame(self, peer: str, msg: RouteWithdraw, now: float) -> list[Effect]:
        """A RouteWithdraw from peer: heed the withdrawals of a next hop and the restores of one dropped."""
        bucket = self._in.get(peer)
        if bucket is None:  # it never said `withdraw` on this link: it has no reason to send one
            self._count("withdraw_unsolicited", 1)
            return []
        routes = self._routes
        out: list[Effect] = []
        for w in msg.entries:
            if not bucket.take(now, ENTRIES_IN_PER_S, ENTRIES_IN_BURST):
                self._count("withdraw_over_budget", 1)
                continue
            entry = routes.get(w.route_id)
            if entry is None or RouteTable.epoch(entry) != w.epoch:
                self._count("withdraw_ignored", 1)
                continue
            if w.kind == WithdrawKind.REQUEST:
                out += self._on_request(peer, w, entry, now)
                continue
            if w.generation < self._gen(w.route_id, w.epoch):
                # about a route our newer generation's flood replaced (frames in flight or queued when it came)
                self._count("withdraw_stale_generation", 1)
                continue
            if w.kind == WithdrawKind.RESTORED:
                self._restored_by(peer, w, entry, now)
                continue
            if peer in RouteTable.next_hops(entry):
                self._withdrawn_by(peer, w, entry, now)
            elif w.kind == WithdrawKind.HOME_DOWN and (self._dropped_for(peer, w) or self._stranded(w, entry)):
                # it said `no route` first, now the home is down; or our route went with no live next hop
                # left, and a neighbour knows why
                self._withdraw(w.route_id, w.epoch, w.kind, now, self._past_of(w.route_id, w.kind))
            else:
                self._count("withdraw_ignored", 1)  # not our next hop: not its route to cut
            self._answer(peer, w)
        return out + self.flush(now)

    def _answer(self, peer: str, w: WithdrawnRoute) -> None:
        """peer withdrew rid: its withdrawal is also Babel's route request (RFC 8966 3.8.2.1). Answer with
        `restored` and this relay's distance when it has a live route that does not lead through peer (or
        is rid's home), so a withdrawer left with no next hop takes this relay (a home's failover to another
        home of the route id, a home back on other links). Bounded by peer's entry budget (one answer per
        entry it sends) and the send budget per keepalive interval.

        A `home down` is answered at any distance, but the withdrawer takes the answer only from a home of
        the route id or a relay linked to one (distance 1: its keepalives say that home is up): a longer
        route may be one the wave has not reached yet, into the dead home (measured on churn-2k: taking it
        woke parked pushes into the dead home's neighbourhood, 68 -> 91 messages a push while its home was
        down). A longer one is asked for a newer route instead (G13, _restored_by): a request along a
        route into the dead home goes nowhere; along one to a live home, it has that home regenerate."""
        rid = w.route_id
        if peer not in self._speaks or self._current(rid) is not None:
            return
        entry = self._routes.get(rid)
        if entry is None:
            return
        hops = self._live_hops(entry, peer)
        if hops is None:
            return
        self._count("withdraw_answered", 1)
        self._routes.tighten(rid, entry, hops)  # never above what we tell (Babel's feasibility invariant)
        self._out.setdefault(peer, {})[rid] = WithdrawnRoute(rid, RouteTable.epoch(entry), WithdrawKind.RESTORED, hops,
                                                             self._gen(rid, RouteTable.epoch(entry)))

    def _live_hops(self, entry: RouteEntry, peer: str) -> int | None:
        """This relay's distance to entry's home over live next hops other than peer (0: it is a home of
        it), or None: no live route that avoids peer (split horizon: no answer or restore goes back to a
        next hop, so one never routes through the relay it tells)."""
        if RouteTable.distance(entry) == 0 and RouteTable.primary(entry) is None:
            return 0
        linked = self._linked
        live = [h for p, h in RouteTable.vector(entry) if p in linked and p != peer]
        return min(live) if live else None

    def _withdrawn_by(self, peer: str, w: WithdrawnRoute, entry: RouteEntry, now: float) -> None:
        rid = w.route_id
        hops = dict(RouteTable.vector(entry))[peer]
        self._routes.drop_next_hop(rid, entry, peer)
        dropped = self._dropped.get(rid)
        if dropped is None or dropped[0] != w.epoch:
            self._dropped[rid] = (w.epoch, {peer: hops})
        else:
            dropped[1][peer] = hops
        linked = self._linked
        if any(p in linked for p in self._routes.next_hops_of(rid)):
            self._count("withdraw_absorbed", 1)  # another live next hop: nothing changes upstream
            return
        self._count("withdraw_heeded", 1)
        self._withdraw(rid, w.epoch, w.kind, now, self._past_of(rid, w.kind))

    def _dropped_for(self, peer: str, w: WithdrawnRoute) -> bool:
        """This relay dropped peer as a next hop for w's route (of w's epoch) for its withdrawal, and has
        withdrawn the route itself since."""
        dropped = self._dropped.get(w.route_id)
        known = self._current(w.route_id)
        return (dropped is not None and dropped[0] == w.epoch and peer in dropped[1] and known is not None
                and known[0] == w.epoch)

    def _stranded(self, w: WithdrawnRoute, entry: RouteEntry) -> bool:
        """w's route is withdrawn here as `no route` with no live next hop left (its last next hop's link went,
        or it withdrew): a `home down` from any neighbour then says why. With the stem on, only the home's
        stem successor knows its home is down (G7); a relay that held the home as a flood next hop (the
        flood walks back down the stem, G8) sees only a link go, and the relays routing through it only its
        `no route`: without this, they search for a dead home (churn-2k, stem on: 223 messages a push while
        its home was down). A hostile neighbour gains nothing it lacked: the route has no next hop here, and
        a parked push still asks for a newer route (G13) and is searched for after HOLD_S. Stem on only: there
        the home's return is a newer generation (G10, a restart re-stems), which ends every withdrawal; with the
        stem off the home's neighbours know it at distance 1, and its return is a `restored` wave, which the
        relays moved here would not take from a neighbour they never dropped (geo-5k-3n-c3l1 seed 1, stem
        off: 3 pushes whose home was up never delivered, none without it)."""
        if not self._stem_on:
            return False
        known = self._current(w.route_id)
        return (known is not None and known[0] == w.epoch and known[1] == WithdrawKind.NO_ROUTE
                and not self._has_live(w.route_id, entry))

    def _restored_by(self, peer: str, w: WithdrawnRoute, entry: RouteEntry, now: float) -> None:
        """peer's route is live (a restore, or an answer to our withdrawal). A neighbour dropped for its
        withdrawal is taken back; while the route is withdrawn here with no live next hop, any neighbour
        is taken when it is feasible (Babel's condition, RFC 8966 3.5.1: strictly closer than the
        feasibility distance kept for the route's epoch): its route cannot lead through us, however stale
        its news (a neighbour the wave has not reached yet still routes to a dead home: it is taken, and its
        own withdrawal follows; each take lowers the distance, so a route is taken back a bounded number
        of times per epoch). A route of distance 0 or 1 is taken whatever its distance: its sender is a
        home or is linked to one (its next hop is that home, not us), so it cannot lead through us (the
        home's neighbour that lost its link to a home still up, or to one of two homes, goes round). A
        farther route waits for a newer epoch or HOLD_S."""
        rid = w.route_id
        dropped = self._dropped.get(rid)
        ours = False
        if dropped is not None and dropped[0] == w.epoch and peer in dropped[1]:
            ours = True
            del dropped[1][peer]
            if not dropped[1]:
                del self._dropped[rid]
        known = self._current(rid)
        if known is None or self._has_live(rid, entry):
            if not ours:
                self._count("withdraw_ignored", 1)  # a route of ours is live: not its route to add
            return  # absorbed here: the next hops kept serve (re-adding it could close a loop)
        if not ours and w.hops > 1 and (w.hops >= RouteTable.distance(entry) or known[1] == WithdrawKind.HOME_DOWN):
            # Not feasible (it may lead through us), or for a `home down` perhaps into the dead home: not
            # taken. G13: ask it for a newer route (a request along it to a live home has that home issue one).
            self._count("withdraw_unfeasible", 1)
            self._offers[rid] = (peer, w.hops)
            if self._wanted(rid, now):
                self._request(peer, rid, w.epoch, min(limits.MAX_TTL, w.hops + REQUEST_SLACK), now)
            return
        # Withdrawn here, so no live next hop of ours leads through it: it leads, and the restore goes on.
        self._routes.lead(rid, entry, peer, w.hops + 1, self._route_k)
        self._count("withdraw_restored_by" if ours else "withdraw_answer_taken", 1)
        self._restore_live(now, (rid,))

    # -- G13: route requests --------------------------------------------------------------------------

    def wanted(self, rid: bytes, now: float) -> list[Effect]:
        """Custody parked a push for rid, withdrawn here (custody.py): ask for a newer route (G13), towards
        the route last offered, or, with none, of every neighbour (a withdrawn one passes it on the same
        way, so the request crosses the withdrawn relays to one with a live route or an offer)."""
        self._note_demand(rid, now)
        known = self._current(rid)
        entry = self._routes.get(rid)
        if known is None or entry is None:
            return []
        nxt = self._towards(rid, entry, None)
        hops = min(limits.MAX_TTL, self._offers[rid][1] + REQUEST_SLACK) if nxt is not None and rid in self._offers \
            else limits.MAX_TTL
        self._request(nxt, rid, known[0], hops, now)
        return self.flush(now)

    def ask(self, rid: bytes, now: float) -> list[Effect]:
        """Custody is about to search for rid (C3): withdrawn here as `no route` with no live next hop left,
        it asks for a newer route as well (as `wanted`; a `home down` parks instead and asks there)."""
        known = self._current(rid)
        if known is None or known[1] != WithdrawKind.NO_ROUTE:
            return []
        entry = self._routes.get(rid)
        if entry is None or self._has_live(rid, entry):
            return []
        return self.wanted(rid, now)

    def _note_demand(self, rid: bytes, now: float) -> None:
        if len(self._demand) >= limits.MAX_WITHDRAWN_ROUTES * 64:  # bounded: a lost entry costs one request
            self._demand.clear()
        self._demand[rid] = now

    def _wanted(self, rid: bytes, now: float) -> bool:
        """Pushes needed rid here lately (parked for it, or a request for it passed through): only then is
        an offer worth a request, whose answer costs a flood."""
        last = self._demand.get(rid)
        return last is not None and now - last < HOLD_S

    def _request(self, peer: str | None, rid: bytes, epoch: int, hops: int, now: float,
                 skip: str | None = None) -> None:
        """Ask peer (None: every neighbour but skip) for a newer route to rid, which it may pass `hops` - 1
        relays further: at most once per REQUEST_GAP_S."""
        last = self._asked.get(rid)
        if (peer is not None and peer not in self._speaks) or (last is not None and now - last < REQUEST_GAP_S):
            return
        if len(self._asked) >= limits.MAX_WITHDRAWN_ROUTES * 64:  # bounded: old entries only pace requests
            self._asked.clear()
        self._asked[rid] = now
        w = WithdrawnRoute(rid, epoch, WithdrawKind.REQUEST, hops, self._gen(rid, epoch))
        for p in ((peer,) if peer is not None else self._speaks):
            if p != skip:
                self._count("route_requests_sent", 1)
                self._out.setdefault(p, {})[_REQUEST + rid] = w

    def _on_request(self, peer: str, w: WithdrawnRoute, entry: RouteEntry, now: float) -> list[Effect]:
        """peer asks for a newer route to w's route id (G13). A home of it issues the next generation; a
        relay with a live route passes the request on along it (a withdrawn relay towards the route it was
        offered); the rest drop it."""
        rid = w.route_id
        if RouteTable.distance(entry) == 0 and RouteTable.primary(entry) is None:  # a home of rid
            self._count("route_requests_home", 1)
            return self._regenerate(rid, now) if self._regenerate is not None else []
        nxt = self._towards(rid, entry, peer)
        withdrawn = nxt is None and self._current(rid) is not None
        if w.hops <= 1 or (nxt is None and not withdrawn):
            self._count("route_requests_dropped", 1)
            return []
        self._note_demand(rid, now)  # an offer that comes later is worth asking too
        self._request(nxt, rid, w.epoch, w.hops - 1, now, skip=peer)  # None (withdrawn, no offer): to all
        return []

    def _towards(self, rid: bytes, entry: RouteEntry, peer: str | None) -> str | None:
        """The neighbour a request for rid goes on to: the nearest live next hop that counts (not peer, not
        one of a `home down` withdrawal's past next hops), or, withdrawn here, the one that offered a route."""
        known = self._current(rid)
        past = known[2] if known is not None else _NONE
        linked = self._linked
        best: tuple[int, str] | None = None
        for p, h in RouteTable.vector(entry):
            if p in linked and p != peer and p not in past and p in self._speaks and (best is None or h < best[0]):
                best = (h, p)
        if best is not None:
            return best[1]
        offer = self._offers.get(rid)
        if known is not None and offer is not None and offer[0] != peer and offer[0] in linked:
            return offer[0]
        return None

    # -- state ---------------------------------------------------------------------------------------

    def _past_of(self, rid: bytes, kind: WithdrawKind) -> frozenset[str]:
        entry = self._routes.get(rid)
        return _past(RouteTable.vector(entry)) if entry is not None and kind == WithdrawKind.HOME_DOWN else _NONE

    def _withdraw(self, rid: bytes, epoch: int, kind: WithdrawKind, now: float,
                  past: frozenset[str] = frozenset()) -> None:
        """Withdraw rid (of epoch) here and tell the neighbours. `past`, for a home that is down: the next
        hops it has, up or not, but the home itself; they lead to the same home (a home's neighbour
        withdraws its routes whatever else it holds), and one of them back on its link (a relay restarted
        with the routes it kept) knows nothing of the home: they do not count as the route's return."""
        known = self._current(rid)
        if known is not None and known[0] == epoch and (known[1] == kind or kind == WithdrawKind.NO_ROUTE):
            return  # told already (a `home down` overrides a `no route`, not the other way)
        self._withdrawn[rid] = (epoch, kind, past, now, self._generation(rid, epoch))
        self._count("routes_withdrawn", 1)
        self._queue(WithdrawnRoute(rid, epoch, kind, 0, self._gen(rid, epoch)))

    def _queue(self, w: WithdrawnRoute) -> None:
        """Tell every neighbour that speaks `withdraw`; a restore not the route's own next hops (split
        horizon: they must not take back a route that leads through them)."""
        skip = _NONE
        if w.kind == WithdrawKind.RESTORED:
            entry = self._routes.get(w.route_id)
            skip = frozenset(RouteTable.next_hops(entry)) if entry is not None else _NONE
        for p in self._speaks:
            if p not in skip:
                self._out.setdefault(p, {})[w.route_id] = w

    def _restore_live(self, now: float, rids: Iterable[bytes] | None = None) -> list[Effect]:
        """Withdrawn routes (rids, or all) that have a live next hop again are restored: told to the
        neighbours, and the pushes parked for them woken (C3c); routes gone or renewed are forgotten.

        A route withdrawn as `home down` comes back only with the home itself (a next hop at distance 1:
        its link back) or a next hop taken since (a neighbour's restore, gossip): a relay that failed and
        comes back with the routes it had (a snapshot) does not know the home is down, and its link alone
        would restore the route all over the mesh (`past`, _withdraw)."""
        routes = self._routes
        linked = self._linked
        for rid in list(self._withdrawn if rids is None else rids):
            known = self._withdrawn.get(rid)
            if known is None:
                continue
            entry = routes.get(rid)
            if entry is None or self._renewed_since(rid, entry, known):
                del self._withdrawn[rid]  # expired, or a newer epoch's or generation's flood renewed it everywhere
                self._dropped.pop(rid, None)
                self._offers.pop(rid, None)
                self._demand.pop(rid, None)
                continue
            if now - known[3] >= HOLD_S:
                self._release(rid, entry)
                continue
            live = [h for p, h in RouteTable.vector(entry) if p in linked and p not in known[2]]
            if live:
                del self._withdrawn[rid]
                self._offers.pop(rid, None)
                self._demand.pop(rid, None)
                self._count("routes_restored", 1)
                self._routes.tighten(rid, entry, min(live))  # as _answer
                self._queue(WithdrawnRoute(rid, known[0], WithdrawKind.RESTORED, min(live), self._gen(rid, known[0])))
                self._renewed(rid, now)
        return self.flush(now) if rids is None else []

    def _release(self, rid: bytes, entry: RouteEntry) -> None:
        """A withdrawal held HOLD_S: the next hops dropped for it are taken back (those still linked, while
        there is room) and the route is as it was before G12 (F3, C3 search for it again)."""
        del self._withdrawn[rid]
        self._offers.pop(rid, None)
        self._demand.pop(rid, None)
        dropped = self._dropped.pop(rid, None)
        self._count("withdraw_released", 1)
        if dropped is None or dropped[0] != RouteTable.epoch(entry):
            return
        for p, hops in dropped[1].items():
            if p in self._linked and p not in entry and RouteTable.has_room(entry, self._route_k):
                self._routes.add_backup(rid, entry, p, hops)
                entry = self._routes[rid]

    def _has_live(self, rid: bytes, entry: RouteEntry) -> bool:
        """entry (rid's) has a live next hop that counts (not one of a `home down` withdrawal's past ones)."""
        known = self._current(rid)
        ignore = known[2] if known is not None else frozenset()
        linked = self._linked
        return any(p in linked and p not in ignore for p in RouteTable.next_hops(entry))

    def _current(self, rid: bytes) -> tuple[int, WithdrawKind, frozenset[str], float, int] | None:
        """rid's withdrawal here, unless its route has been renewed since (then it is forgotten)."""
        known = self._withdrawn.get(rid)
        if known is None:
            return None
        entry = self._routes.get(rid)
        if entry is not None and not self._renewed_since(rid, entry, known):
            return known
        del self._withdrawn[rid]
        self._dropped.pop(rid, None)
        self._offers.pop(rid, None)
        self._demand.pop(rid, None)
        return None

    def _renewed_since(self, rid: bytes, entry: RouteEntry,
                       known: tuple[int, WithdrawKind, frozenset[str], float, int]) -> bool:
        """rid's route (entry) is of a newer epoch, or a newer generation (G10, G13), than its withdrawal."""
        epoch = RouteTable.epoch(entry)
        return epoch != known[0] or self._generation(rid, epoch) > known[4]

    def home_down(self, rid: bytes) -> bool:
        """rid was withdrawn here as `home down` and has no live next hop but those that were up when it
        was (the home's neighbour's others: they lead to the same home): pushes for it wait (custody parks
        them, a relay on the way answers `home unreachable`) instead of searching."""
        known = self._current(rid)
        if known is None or known[1] != WithdrawKind.HOME_DOWN:
            return False
        entry = self._routes.get(rid)
        if entry is None or self._renewed_since(rid, entry, known):
            return False
        return not self._has_live(rid, entry)

    def tell_again(self, peer: str, rid: bytes, now: float) -> list[Effect]:
        """peer sent us a push for rid, withdrawn here as `home down`: our withdrawal did not reach it (a
        frame lost, or its link came up since): tell it again (within the send budget)."""
        known = self._current(rid)
        if known is None or peer not in self._speaks:
            return []
        self._count("withdraw_told_again", 1)
        self._out.setdefault(peer, {})[rid] = WithdrawnRoute(rid, known[0], known[1], 0, self._gen(rid, known[0]))
        return self.flush(now)

    def any(self) -> bool:
        """Some route is withdrawn here, or frames are queued."""
        return bool(self._withdrawn or self._out)

    # -- sending -------------------------------------------------------------------------------------

    def tick(self, now: float) -> list[Effect]:
        """The engine's tick: restore what came back unseen (a next hop taken from gossip or a receipt),
        forget what expired, send what waited for the budget."""
        return self._restore_live(now) if self._withdrawn else self.flush(now)

    def _gen(self, rid: bytes, epoch: int) -> int:
        """rid's route generation of epoch here (0: none; G10)."""
        return self._generation(rid, epoch)

    def _news(self, w: WithdrawnRoute) -> bool:
        """A queued entry still worth sending: a withdrawal only while the route is still withdrawn here at
        that epoch. One that waited for the send budget while a newer route generation (G10, G13) renewed
        the route would reach neighbours that hold the new generation already, and cut that route where
        this relay is their next hop again, with no withdrawal of ours left to restore it (geo-5k-3n-c3l1
        seed 2, stem on: a push whose home was up parked until the end)."""
        if w.kind not in (WithdrawKind.NO_ROUTE, WithdrawKind.HOME_DOWN):
            return True
        known = self._current(w.route_id)
        return known is not None and known[0] == w.epoch

    def flush(self, now: float) -> list[Effect]:
        """Send each neighbour its queued entries, within FRAMES_PER_TICK frames per keepalive interval."""
        out: list[Effect] = []
        cap = limits.MAX_WITHDRAWN_ROUTES
        for p in list(self._out):
            st = self._linked.get(p)
            queued = self._out[p]
            if st is None or p not in self._speaks or not queued:
                del self._out[p]
                continue
            start, frames = self._sent.get(p, (now, 0))
            if now - start >= self._interval:
                start, frames = now, 0
            while queued and frames < FRAMES_PER_TICK:
                keys = list(queued)[:cap]
                batch = [w for w in (queued.pop(k) for k in keys) if self._news(w)]
                if not batch:
                    continue
                frames += 1
                st.last_sent = now
                out.append(Send(p, RouteWithdraw(tuple(batch))))
            self._sent[p] = (start, frames)
            if not queued:
                del self._out[p]
        if out:
            self._count("withdraw_frames_sent", len(out))
            if self._trace is not None:  # gossip messages in the cost figures (docs/metrics.md)
                self._trace(now, len(out))
        return out
