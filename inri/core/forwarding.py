"""Push forwarding, rules F1-F4: along the route vector with reverse-path state, delivery at home,
local repair and route errors, and ring copies that switch back to route mode."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from inri.core.api import (
    CustodyReleased,
    Delivered,
    Effect,
    Send,
    TraceLevel,
)
from inri.core.reverse import Back, ReverseMark
from inri.core.seen import Mark
from inri.core.state import (
    RECEIPT_STATUS,
    EngineContext,
    RuleGroup,
    make_receipt,
    make_send,
    readdress,
)
from inri.core.tables import BoundedMap, RouteEntry, RouteTable
from inri.protocol import limits
from inri.protocol.keys import receipt_signed_bytes, receipts_signed_bytes
from inri.protocol.messages import (
    Push,
    Receipt,
    ReceiptBatch,
    ReceiptStatus,
    Registration,
    RouteError,
    RouteErrorReason,
)

if TYPE_CHECKING:  # annotations only (the groups import each other: Engine.__init__ wires them)
    from inri.core.awaited import AwaitedAnswers
    from inri.core.backups import BackupCopies
    from inri.core.custody import CustodyRules
    from inri.core.kept import CustodyTable
    from inri.core.neighbours import Neighbours
    from inri.core.reverse import ReversePaths
    from inri.core.roundtrip import RttEstimator
    from inri.core.rtt import RttRules
    from inri.core.scoring import ScoringRules
    from inri.core.seen import SeenCache
    from inri.core.stemstate import StemState
    from inri.core.sync import SyncRules
    from inri.core.syncstate import SyncState
    from inri.core.tables import CompactRouteTable, RouteTable
    from inri.core.withdrawals import Withdrawals

ROUTE_ATTEMPTS = 2  # custody attempts that follow routes before the expanding ring starts (C2)
# Rule F8: a relay's local repair is answered within (its route distance + this) link round trips: the
# radius-2 search reaches a relay with a route at most 2 links away, whose route may be 1 longer.
REPAIR_EXTRA_LINKS = 3
LOCAL_REPAIR_RADIUS = 2  # a relay whose route broke searches this far before the custodian must
# A relay whose neighbour was the home, and whose link to it has been down this long, still answers
# `home unreachable` but also searches its neighbourhood: a restarted home may be back with other
# neighbours (its link-up announcements, rule G5, gave them the route). Shorter would flood for every
# push to a home that is merely restarting; the deadline is minutes.
HOME_SEARCH_AFTER_S = 5.0
# Rule F6 (no holes): a relay waits for a forwarded push's answer receipt_timeout_s less this share
# of it per hop the copy has already travelled (its hop count), never less than a quarter of it.
# Along one path the hop count grows by one per hop, so the relay next to a black hole gives up
# first and its route error reaches the relays upstream before their own timeouts: they learn where
# the hole is instead of blaming their honest next hops. The custodian's own wait is unchanged.
# The step (0.12 s by default) must exceed a link's round trip; a slower neighbour gets S1's grace.
ANSWER_STEP_SHARE = 0.06
# Rule F6: a next hop is reported as a hole upstream when it leaves a second push of the same route
# unanswered within this window (the first one may have been a lost frame).
HOLE_EVIDENCE_WINDOW_S = 30.0
# Bound once: Enum class attribute lookups cost several times a dict lookup on the per-frame path.
_LOCAL = ReverseMark.LOCAL
_LATE = ReverseMark.LATE
_FULL = TraceLevel.FULL
_NOT_HOME = RouteErrorReason.NOT_HOME  # rule F5c


def _onward(push: Push, ring: int) -> Push:
    """The copy of push a relay forwards: one hop further, in ring mode `ring` (0: route).

    A ring copy has one TTL less. A route-mode copy carries MAX_TTL - hops (docs/protocol.md, "TTLs"):
    a push following a route is never dropped for TTL while the route exists (a route is at most as
    long as its gossip travelled, and gossip stops at MAX_TTL); the seen-cache is its loop guard.
    """
    hops = push.hops + 1
    return readdress(push, limits.MAX_TTL - hops if not ring else push.ttl - 1, hops, push.attempt, ring)


class ForwardingRules(RuleGroup):
    """F1-F4: what a relay does with a push, a receipt or a route error."""

    # The state this rule group owns (tests/test_core_owners.py; Engine.__init__ builds it).
    # F8: local repairs awaiting an answer: (deadline, push id, previous hop, route id)
    _repair_heap: list[tuple[float, bytes, str, bytes, bool]]
    _steer: BoundedMap[bytes, tuple[str | None, float]]  # F9
    _finds: BoundedMap[bytes, tuple[int, int, float]]  # F8c
    # F5c: push id -> (sender, attempt, expiry) of its last route copy whose reverse entry was kept
    _kept_from: BoundedMap[bytes, tuple[str, int, float]]
    _hole_suspects: BoundedMap[tuple[str, bytes], float]
    # F5b: receipts held for flush_receipts, or None (answered at once)
    _receipt_hold: dict[tuple[str, bytes, bytes | None], dict[bytes, tuple[ReceiptStatus, int]]] | None

    # The rule groups this one calls (given by `wire`).
    _custody_rules: CustodyRules
    _rtt_rules: RttRules
    _scoring_rules: ScoringRules
    _sync_rules: SyncRules

    def __init__(self, ctx: EngineContext, awaited: AwaitedAnswers, custody: CustodyTable, neighbours: Neighbours,
                 reverse: ReversePaths, routes: RouteTable | CompactRouteTable, rtt: RttEstimator, seen: SeenCache,
                 stem: StemState, sync: SyncState, withdrawals: Withdrawals, backups: BackupCopies) -> None:
        super().__init__(ctx)
        self._withdrawals = withdrawals
        self._backups = backups
        self._await = awaited
        self._custody = custody
        self._neighbours = neighbours
        self._reverse = reverse
        self._routes = routes
        self._rtt = rtt
        self._seen = seen
        self._stem = stem
        self._sync = sync
        # F8 (): local repairs this relay started, until their answer is due (a receipt
        # passing back through here ends the wait: the reverse entry goes).
        self._repair_heap: list[tuple[float, bytes, str, bytes, bool]] = []
        # F9 (): push id -> (the next hop a `repair failed` for it came from, expiry), or
        # (None, expiry) where this relay's own search for it found nothing.
        self._steer: BoundedMap[bytes, tuple[str | None, float]] = BoundedMap(self.config.reverse_max)
        # F8c (): push id -> (`repair found` words heard for a local repair of it, refutations
        # heard, expiry), on the searching relay and on relays between it and a find.
        self._finds: BoundedMap[bytes, tuple[int, int, float]] = BoundedMap(self.config.reverse_max)
        # F5c (): push id -> (the neighbour that sent its last route copy, that copy's attempt,
        # expiry) when F6b kept the reverse entry of an earlier copy: a `not home` for that copy goes there.
        self._kept_from: BoundedMap[bytes, tuple[str, int, float]] = BoundedMap(self.config.reverse_max)
        # (next hop, route id) -> when it first left a push of the route unanswered (rule F6)
        self._hole_suspects: BoundedMap[tuple[str, bytes], float] = BoundedMap(4096)
        # Rule F5b: receipts answered as a home, held until flush_receipts (None: answered at once, the
        # default; a host that flushes once per round calls hold_receipts): (neighbour, route id, the
        # pushes' receipt key) -> push id -> (status, hops).
        self._receipt_hold: dict[tuple[str, bytes, bytes | None], dict[bytes, tuple[ReceiptStatus, int]]] | None = None

    def wire(self, *, custody: CustodyRules, rtt: RttRules, scoring: ScoringRules, sync: SyncRules) -> None:
        """The other rule groups this one calls (Engine.__init__, once all are built)."""
        self._custody_rules = custody
        self._rtt_rules = rtt
        self._scoring_rules = scoring
        self._sync_rules = sync

    # Rules F1 (route vector), S2 (preference).
    def next_hop(self, rid: bytes, exclude: str | None, alternate: bool = False, low_ok: bool = False) -> str | None:
        """The first live next hop for rid other than `exclude` whose score is not low (None: none).

        low_ok: fall back to a live next hop with a low score (rule S2) when no other is left.

        Next hops whose link is down are skipped, not forgotten: when the link comes back (a crashed
        neighbour restarting, a partition healing), the route works again at once.
        alternate: prefer the backup over the primary (odd custody attempts take the other path, so a
        re-send does not walk into the same silent failure as the first copy).
        """
        hops = self._routes.next_hops_of(rid)
        if not hops:
            return self._sync_rules.provisional_hop(rid, exclude) if self._sync.any_provisional() else None  # G11
        active = self._linked
        if alternate and len(hops) > 1:
            hops = hops[1:] + hops[:1]
        fallback = None
        floor = self.config.score_prefer_below
        for p in hops:
            st = active.get(p)
            if st is not None and p != exclude:
                if st.score >= floor and st.unresponsive_at <= st.last_heard:
                    return p
                if fallback is None:
                    # Low score (S2), or unresponsive since it was last heard (C6, rtt.py): only when no
                    # better next hop is alive.
                    fallback = p
        if self._sync.any_provisional():  # G11: no next hop of the route table is up: a provisional route's
            prov = self._sync_rules.provisional_hop(rid, exclude)
            if prov is not None:
                return prov
        return fallback if low_ok else None

    # Rule F3 (home unreachable, searched for after a while).
    def _home_search(self, msg: Push, peer: str, now: float) -> list[Effect]:
        """Ring copies of radius 2 around this relay when its link to the home of msg's route has been
        down for HOME_SEARCH_AFTER_S: the home may be back elsewhere nearby. Only for custody attempts
        2, 4, 8, 16, ... (once each): a home back within seconds is found at the next one, and a push to
        a home that stays down costs a few searches over its custody, not one per parked re-send."""
        if msg.attempt < 2 or msg.attempt & (msg.attempt - 1):
            return []
        entry = self._routes.get(msg.route_id)
        primary = None if entry is None else RouteTable.primary(entry)
        since = None if primary is None else self._neighbours.down_since(primary)
        if since is not None and now - since < HOME_SEARCH_AFTER_S:
            return []
        if (msg.registration is None or msg.ttl <= LOCAL_REPAIR_RADIUS or len(self._linked) < 2
                or self._seen.copy_seen(msg.push_id, msg.attempt, True)):
            return []
        self._count("push_home_search")
        self._seen.mark_ring(msg.push_id, msg.attempt, LOCAL_REPAIR_RADIUS, now)
        return self.ring_flood(_onward(msg, LOCAL_REPAIR_RADIUS), peer, now)

    # Rules F3 (home unreachable), G7.
    def _home_adjacent(self, rid: bytes) -> bool:
        """True when our route for rid had distance 1 (the home relay was our neighbour) and no live
        next hop remains: the home relay itself is unreachable from here, not just a path to it. With
        the stem on, also on a stem relay whose predecessor (its only next hop, G7) is down: see
        home_hop."""
        entry = self._routes.get(rid)
        if entry is None:
            return False
        primary = RouteTable.primary(entry)
        if RouteTable.distance(entry) == 1:
            return primary is None or primary not in self._linked
        return primary is not None and primary not in self._linked and self.home_hop(rid, entry, primary)

    # Rules F3, F6, C5, C6 (home unreachable), G7.
    def home_hop(self, rid: bytes, entry: RouteEntry, nh: str) -> bool:
        """nh stands for the home relay here: the home itself (a next hop at distance 1), or, with the
        stem on, this stem relay's predecessor (rule G7: its only next hop and the only way to the
        home). Behind a stem predecessor that is down (or silent) is the home, or a stem relay whose
        failure the home re-stems around (G10): either way no ring search finds a way in meanwhile
        (every flood route leads into the stem), so the custodian hears `home unreachable` and
        retries along the route, as next to a home that is down. The answer is the same whether the
        predecessor is the home or not, so it does not single the home out."""
        if (nh, 1) in RouteTable.vector(entry):
            return True
        return self._stem.keeps(rid, entry, nh)

    # Rule F1.
    def has_route(self, route_id: bytes) -> bool:
        """True when a live next hop is known for route_id."""
        return self.next_hop(route_id, None, low_ok=True) is not None

    # Rules F1, S1 (an answer is awaited).
    def forward(self, msg: Push, nh: str, now: float) -> Send:
        """Send msg to the next hop nh and await its answer."""
        self._linked[nh].last_sent = now  # M2
        self._await_answer(msg, nh, now)
        if self._level:
            self._trace(now, "push_forwarded", msg=msg.push_id.hex(), route=msg.route_id.hex(), peer=nh,
                        hops=msg.hops, ttl=msg.ttl, count=1)
        jitter = self.config.forward_jitter_s
        return make_send(nh, msg, self._rng.random() * jitter if jitter else 0.0)

    # Rule F6.
    def _await_answer(self, msg: Push, nh: str, now: float) -> None:
        """Expect an answer for the copy msg (just sent to nh) within a timeout
        that shrinks with the hops it has travelled (rule F6)."""
        if self._rtt_rules.keep_awaiting(msg.push_id, nh, now):  # rtt.py (C4): the first next hop stays awaited
            return
        timeout = self.config.receipt_timeout_s
        deadline = now + max(timeout / 4, timeout * (1 - ANSWER_STEP_SHARE * msg.hops))
        self._await.expect(msg.push_id, nh, deadline, now, msg.route_id, msg)

    # Rules S1 (a black hole is blamed), F6 (and reported upstream).
    def answers_overdue(self, now: float) -> list[Effect]:
        """Pushes whose answer is overdue: blame the next hop (S1; a slow one gets its grace first) and
        tell the relay upstream where the hole is (F6)."""
        out: list[Effect] = []
        waits = self._await
        while True:
            due = waits.pop_overdue(now)
            if due is None:
                return out
            pid, w = due
            nh = w[0]
            out += self._scoring_rules.receipt_overdue(pid, nh, w[2], now, w[1] - w[2])
            if self._scoring_rules.in_grace(pid):
                continue  # a slow neighbour's grace: not reported (scoring.py blames it when it ends)
            st = self._linked.get(nh)
            if st is None or st.last_heard <= w[2]:
                # Silent since the push left: more likely down (keepalives will tell, and its routes go
                # with it) than a hole; reporting these cost 40% more messages under churn (churn-2k).
                out += self.report_home_silent(pid, nh, now, w[3])
                continue
            rid = w[3]
            first = self._hole_suspects.get((nh, rid))
            if st.score > 0.0 and (first is None or now - first > HOLE_EVIDENCE_WINDOW_S):
                # One unanswered push from a next hop with a record of answering (its score, after this
                # blame, is still positive): a lost frame is as likely as a hole. Try the route's other next
                # hops first here; report upstream only when nh leaves a second push of this route
                # unanswered within the window (a black hole swallows them all; random loss rarely
                # takes two of one route through one relay): on churn-2k with 1% frame loss, hole
                # reports were most of the route errors, and the routes they cut upstream sent pushes
                # to ring searches.
                self._hole_suspects.put((nh, rid), now)
                entry = self._routes.get(rid)
                if entry is not None and RouteTable.claims(entry, nh) and len(RouteTable.next_hops(entry)) > 1:
                    self._routes.demote(rid, entry, nh)
                self._count("hole_suspected")
                continue
            out += self._report_hole(pid, nh, now, rid)

    # Rule F6.
    def report_home_silent(self, pid: bytes, nh: str, now: float, rid: bytes) -> list[Effect]:
        """The next hop that did not answer is the home relay itself (distance 1 here) and has been
        silent since the push left: most likely the home went down (kill -9, restart). Tell the relay
        upstream `home unreachable` now, as after the keepalive timeout: its custodian keeps custody
        and retries later along the same route, and no relay upstream tears its route down for a home
        that is merely restarting (a `no route` from the next relay back would: every relay between
        the custodian and the home then lost the route until the device refreshed it)."""
        entry = self._routes.get(rid)
        if entry is None or not self.home_hop(rid, entry, nh):
            return []
        back = self._reverse.back(pid)
        if back is None:
            return []
        prev = back[0]
        if isinstance(prev, ReverseMark):
            c = self._custody.get(pid)
            if c is not None:
                self._custody_rules.home_down(c, now)  # the home is our neighbour and silent: retry later, never widen
            return []
        if prev not in self._linked:
            return []
        self._count("home_silent_reported")
        self._linked[prev].last_sent = now  # M2
        if self._level:
            self._trace(now, "route_error", msg=pid.hex(), route=rid.hex(), peer=prev,
                        reason="home_unreachable", count=1)
        return [Send(prev, RouteError(pid, rid, RouteErrorReason.HOME_UNREACHABLE))]

    # Rule F6.
    def _report_hole(self, pid: bytes, nh: str, now: float, rid: bytes) -> list[Effect]:
        """No answer came for push pid from nh, heard from since: the push fell into a hole after this
        relay (a black hole, or a relay whose local repair found nothing: its F8 notice only tells the
        custodian, so the hole is found and reported here, as before). nh goes last among the
        route's next hops, and the relay upstream hears a route error: `next hop down` when a live
        next hop is left here (the route is repaired: keep using this relay), `no route` otherwise
        (it stops using this relay for the route). Reverse state stays: a late receipt still finds
        its way back. A slow neighbour whose grace ends unanswered is blamed, not reported (rare)."""
        back = self._reverse.back(pid)
        if back is None:
            return []
        entry = self._routes.get(rid)
        if entry is not None and RouteTable.claims(entry, nh) and len(RouteTable.next_hops(entry)) > 1:
            self._routes.demote(rid, entry, nh)
        prev = back[0]
        if isinstance(prev, ReverseMark) or prev not in self._linked:
            return []
        if entry is not None and self._stem.keeps(rid, entry, nh):
            # G7: a stem relay keeps its stem route (stem.py), so upstream keeps using it while it is up.
            kept = RouteErrorReason.NEXT_HOP_DOWN if nh in self._linked else RouteErrorReason.NO_ROUTE
            return self._send_hole(pid, rid, prev, kept, now)
        left = self.next_hop(rid, prev)
        reason = RouteErrorReason.NEXT_HOP_DOWN if left is not None and left != nh else RouteErrorReason.NO_ROUTE
        return self._send_hole(pid, rid, prev, reason, now)

    def _send_hole(self, pid: bytes, rid: bytes, prev: str, reason: RouteErrorReason, now: float) -> list[Effect]:
        self._count("hole_reported")
        self._linked[prev].last_sent = now  # M2
        if self._level:
            self._trace(now, "route_error", msg=pid.hex(), route=rid.hex(), peer=prev,
                        reason="next_hop_down" if reason == RouteErrorReason.NEXT_HOP_DOWN else "no_route", count=1)
        return [Send(prev, RouteError(pid, rid, reason))]

    # Rule F4.
    def ring_flood(self, msg: Push, sender: str | None, now: float) -> list[Effect]:
        """Send a ring copy of msg to every linked neighbour but sender."""
        out: list[Effect] = []
        for p, st in self._linked.items():
            if p != sender:
                st.last_sent = now
                out.append(make_send(p, msg, 0.0))
        if self._level:
            self._trace(now, "push_fallback", msg=msg.push_id.hex(), route=msg.route_id.hex(), hops=msg.hops,
                        ttl=msg.ring, count=len(out))
        return out

    # Rules F1 (budget, seen, reverse path), F2 (at home), F4 (ring copies), F3 (local repair, no route).
    def on_push(self, peer: str, msg: Push, now: float) -> list[Effect]:
        """A push frame from a neighbour (Engine._on_push, a hook, calls it)."""
        pid = msg.push_id
        rid = msg.route_id
        cfg = self.config
        state = self._linked[peer]
        if not state.push_budget.take(now, cfg.push_budget_per_peer_per_s, cfg.push_budget_peer_burst):
            self._count("push_dropped_budget_peer")
            if self._level:
                self._trace(now, "push_dropped", msg=pid.hex(), route=msg.route_id.hex(), peer=peer, hops=msg.hops + 1,
                            ttl=msg.ttl, reason="budget_peer")
            # The drop is the protection; the score is for a neighbour that keeps flooding: at most
            # one penalty per second. Per dropped push, 20 pushes over budget cut an honest entry
            # relay briefly faster than its path (its custodian re-sends what was dropped).
            if now - state.budget_penalized_at < 1.0:
                return []
            state.budget_penalized_at = now
            return self._scoring_rules.score(peer, cfg.score_budget_drop, now, "budget_peer")
        # Seen per (push, attempt, mode): a ring copy that met a route continues in route mode through
        # relays that already saw (and flooded) the ring copy of the same attempt.
        if not (self._seen.first_ring(pid, msg.attempt, msg.ring, now) if msg.ring  # F4d: a wider ring goes on
                else self._seen.first_copy(pid, msg.attempt, False, now)):  # F6b's mark goes with a new copy
            self._count("push_seen_dropped")
            if msg.ring:  # ring copies are not awaited: they die quietly
                return []
            # A route-mode copy is awaited by its sender (S1): say it was a duplicate, or the sender
            # would blame us as a black hole. Without this a hostile relay replaying push ids we saw
            # through an honest neighbour could get that neighbour to cut its link to us.
            if self._level:
                self._trace(now, "route_error", msg=pid.hex(), route=msg.route_id.hex(), peer=peer,
                            reason="duplicate", count=1)
            return [Send(peer, RouteError(pid, msg.route_id, RouteErrorReason.DUPLICATE))]
        if msg.ring and msg.attempt >= ROUTE_ATTEMPTS and cfg.ring_verdict:
            # C2b: a find met by this ring goes back through here to the custodian, once per ring copy
            self._seen.mark(pid, Mark.RING_RELAYED, now)
            self._seen.clear(pid, Mark.FOUND_PASSED)
        if self._level >= _FULL:
            # Trace hops = links crossed to reach this relay, as in push_delivered (docs/trace-schema.md);
            # the frame's own counter stops one short (the sender counts the link it sends on).
            self._trace(now, "push_received", msg=pid.hex(), route=rid.hex(), peer=peer, hops=msg.hops + 1,
                        ttl=msg.ttl)
        if not self._custody.holds(pid):  # a custodian keeps its own LOCAL reverse marker
            # The carried registration (when it is the route's) says which receipt key the answer must
            # be signed with; it is checked only if a receipt comes back (rule F5).
            # Rule F6b: a later copy (another attempt, a ring copy) takes the reverse path only when it
            # came over fewer hops than the copy that set it (or that one's link is down): every
            # reverse pointer then leads to a relay with a smaller hop count, so reverse paths never
            # form a cycle for an answer to go round.
            old = self._reverse.back(pid)
            if old is None or msg.hops < old[3] or old[0] not in self._linked:
                reg = msg.registration
                if self._reverse.remember(pid, peer, now, reg if reg is not None and reg.route_id == rid else None,
                                          msg.hops):
                    self._count("reverse_evicted")
            else:
                self._count("reverse_kept")
                if not msg.ring:  # F5c: who sent this copy, should a `not home` answer it (_on_not_home)
                    self._kept_from.put(pid, (peer, msg.attempt, now + cfg.reverse_ttl_s))
        status = self._accept_at_home(msg, now)
        if status is not None:
            if isinstance(status, RouteErrorReason):  # rule F5c: no key of the push's registration here
                return self._push_drop(peer, msg, now, "not_home", status)
            out = self.deliver_local(pid, msg, status, now, hops=msg.hops + 1)
            # Rule F5c: signed with the receipt key of the registration this push carried (the current
            # one, or a superseded one this home still holds), so every relay on the way back verifies it.
            reg = msg.registration
            rkey = reg.receipt_key if reg is not None and reg.route_id == rid else None
            hold = self._receipt_hold
            if hold is not None:  # rule F5b: answered with the round's other receipts (flush_receipts)
                group = hold.setdefault((peer, rid, rkey), {})
                if pid not in group:  # a second copy in the same round: the first one's answer stands
                    group[pid] = (status, msg.hops + 1)
                return out
            sig = self._home.sign_receipt(rid, receipt_signed_bytes(pid, rid, status), rkey)
            out.append(Send(peer, Receipt(pid, status, msg.hops + 1, sig)))
            return out
        if msg.ttl <= 1:
            return self._push_drop(peer, msg, now, "ttl", RouteErrorReason.TTL_EXHAUSTED)
        if not msg.ring and msg.hops == 0 and cfg.custody_backup and not self._custody.holds(pid):
            self._backups.keep(peer, msg, now)  # C8: a custodian's own route attempt passes here first
        if msg.ring:
            if msg.registration is None or msg.registration.route_id != rid or not (
                self._verifier.verify_registration(msg.registration)
            ):
                return self._push_drop(peer, msg, now, "bad_registration", None)
            nh = self.next_hop(rid, peer, alternate=(msg.attempt & 1) == 1)
            if nh is not None:  # a route is known here: follow the route (once per attempt)...
                # ...and (rule F4b, `ring_past_routes`) the ring goes on to its radius: routes broken by
                # churn are not withdrawn, so every relay near the custodian may hold a route into the
                # same dead end, and a ring that stopped at the first route would never search past them.
                # The ring's worst case is what the fallback budget (C2) already charges.
                # Rule F4c (`last_ring_past_routes`, on by default): the custodian's last ring (wider than
                # the fixed radii 1, 3, 5, 7: the widest the fallback budget affords, C2, sent only after
                # every cheaper ring failed; its radius is the copy's radius left + hops) goes past routes
                # as F4b does, while it has more than LOCAL_REPAIR_RADIUS hops to go (so local repairs,
                # home searches and parked searches never do). Earlier rings stop at the first route (F4),
                # as before; where the budget has no last ring (4 neighbours) nothing changes.
                last = (cfg.last_ring_past_routes and msg.ring > LOCAL_REPAIR_RADIUS
                        and msg.ring + msg.hops > limits.RING_RADII[-1])
                go_on = msg.ring > 1 and (cfg.ring_past_routes or last)
                more = self.ring_flood(_onward(msg, msg.ring - 1), peer, now) if go_on else []
                if self._seen.copy_seen(pid, msg.attempt, False):
                    self._count("push_seen_dropped")
                    return more
                self._seen.mark_copy(pid, msg.attempt, False, now)
                out = [self.forward(_onward(msg, 0), nh, now)] + more
                if (msg.attempt < ROUTE_ATTEMPTS or cfg.ring_verdict) and cfg.adaptive_retry and peer in self._linked:
                    # Rule F8b: a local repair's copy (route attempts) found a route: the searching relay,
                    # one or two links back, waits. Rule C2b: so does a custodian's ring (later attempts).
                    self._count("repair_found_sent" if msg.attempt < ROUTE_ATTEMPTS else "ring_found_sent")
                    if self._level:
                        self._trace(now, "route_error", msg=pid.hex(), route=rid.hex(), peer=peer,
                                    reason="repair_found", count=1)
                    out.append(Send(peer, RouteError(pid, rid, RouteErrorReason.REPAIR_FOUND)))
                return out
            if self._home_adjacent(rid) or self._withdrawals.home_down(rid):  # widening cannot help (F3, G12)
                return self._push_drop(peer, msg, now, "home_unreachable", RouteErrorReason.HOME_UNREACHABLE)
            if msg.ring <= 1:
                return self._push_drop(peer, msg, now, "ring_end", None)
            return self.ring_flood(_onward(msg, msg.ring - 1), peer, now)
        if self._withdrawals.home_down(rid):  # G12: the home is down: not used, no search; the sender missed it
            return (self._push_drop(peer, msg, now, "home_unreachable", RouteErrorReason.HOME_UNREACHABLE)
                    + self._withdrawals.tell_again(peer, rid, now))
        nh = self.next_hop(rid, peer, alternate=(msg.attempt & 1) == 1)
        if msg.attempt and cfg.repair_steer and pid in self._steer:  # rule F9: a search for it failed
            steer = self._steered(msg, peer, nh, now)
            if steer is not None:
                return steer
            nh = self.steer_hop(pid, rid, peer, nh, now)
        if nh is None:
            low = self.next_hop(rid, peer, low_ok=True)  # a live next hop with a low score (S2)
            if low is not None and (msg.attempt == 0 or self._linked[low].score > cfg.score_avoid_below):
                # Low but not very low, or the push's first attempt: most likely an honest relay
                # upstream of a failure (blame for a missing receipt is diffuse); use it rather than
                # flood the neighbourhood. Re-sent attempts (the custodian saw a failure) avoid it.
                if self._rtt_rules.unresponsive(low):  # rtt.py (C6): its transport gave up on it: ask around first
                    repaired = self._rtt_rules.repair_stranded(_onward(msg, 0), low, peer, now)
                    if repaired:
                        return repaired
                return [self.forward(_onward(msg, 0), low, now)]
            if low is None and self._home_adjacent(rid):
                return (self._push_drop(peer, msg, now, "home_unreachable", RouteErrorReason.HOME_UNREACHABLE)
                        + self._home_search(msg, peer, now))
            if (msg.registration is not None and msg.ttl > LOCAL_REPAIR_RADIUS and len(self._linked) > 1
                    and not self._seen.copy_seen(pid, msg.attempt, True)):
                # Local repair (AODV): our route broke; ask the neighbourhood before giving up. Neighbours
                # with a route of their own (not through us: the sender is excluded) carry it on.
                self._count("push_local_repair")
                self._seen.mark_ring(pid, msg.attempt, LOCAL_REPAIR_RADIUS, now)
                self.watch_repair(msg, peer, now)
                return self.ring_flood(_onward(msg, LOCAL_REPAIR_RADIUS), peer, now)
            if low is not None:  # the neighbourhood was asked: the low-scored next hop is the last resort
                return [self.forward(_onward(msg, 0), low, now)]
            return self._push_drop(peer, msg, now, "no_route", RouteErrorReason.NO_ROUTE)
        return [self.forward(_onward(msg, 0), nh, now)]

    # Rule F9.
    def steer_hop(self, pid: bytes, rid: bytes, prev: str | None, nh: str | None, now: float) -> str | None:
        """The next hop for a later copy of push pid: nh, unless a `repair failed` for an earlier copy came
        back from nh (rule F9) and another live next hop of the route (not prev, score not low, not
        unresponsive) is left: that one, so the copy does not walk into the hole the search found."""
        got = self._steer.get(pid)
        if got is None or nh is None or got[0] != nh or got[1] <= now:
            return nh
        other = self._other_hop(rid, prev, nh)
        if other is None:
            return nh
        self._count("push_steered")
        return other

    # Rule F9.
    def _other_hop(self, rid: bytes, prev: str | None, avoid: str) -> str | None:
        """A live next hop of rid other than prev and avoid, whose score is not low and that is not
        unresponsive (None: none)."""
        active = self._linked
        floor = self.config.score_prefer_below
        for p in self._routes.next_hops_of(rid):
            st = active.get(p)
            if (p != avoid and p != prev and st is not None and st.score >= floor
                    and st.unresponsive_at <= st.last_heard):
                return p
        return None

    # Rule F9.
    def _steered(self, msg: Push, peer: str, nh: str | None, now: float) -> list[Effect] | None:
        """A later route attempt's copy (attempt 1) reaches the relay whose own search for an earlier
        copy found nothing (it sent `repair failed`) and still has no live next hop: the same search
        would find the same nothing. Answer `repair failed` at once (the custodian goes on to its
        rings) instead of searching again. None: nothing to do here (the copy goes on as usual)."""
        got = self._steer.get(msg.push_id)
        if (got is None or got[0] is not None or got[1] <= now or nh is not None
                or msg.attempt >= ROUTE_ATTEMPTS or self.next_hop(msg.route_id, peer, low_ok=True) is not None
                or self._home_adjacent(msg.route_id)):
            return None
        if not self._error_once(msg.push_id, now):
            return []
        self._count("repair_failed_repeated")
        self._linked[peer].last_sent = now  # M2
        if self._level:
            self._trace(now, "route_error", msg=msg.push_id.hex(), route=msg.route_id.hex(), peer=peer,
                        reason="repair_failed", count=1)
        return [Send(peer, RouteError(msg.push_id, msg.route_id, RouteErrorReason.DEAD_END))]

    # Rule F8.
    def watch_repair(self, msg: Push, prev: str, now: float) -> None:
        """A local repair of push msg (received from prev) starts here: if no answer comes back through
        this relay within the repair's expected round trip, the custodian hears `repair failed` (F8).
        The wait: (route distance here + REPAIR_EXTRA_LINKS) link round trips at srtt + 2 rttvar each
        (rule C4's per-link estimate); no estimate yet (or adaptive_retry off): no report, as before.
        Only where the custodian can use it: for a route attempt (a ring's copies go on without it), and
        when it would reach the custodian before the custodian's own retry (C4's period for the whole
        route, as this relay would compute it), or it is only a cost."""
        cfg = self.config
        rtt = self._rtt
        srtt = rtt.srtt()
        if not cfg.adaptive_retry or srtt <= 0.0 or msg.attempt >= ROUTE_ATTEMPTS:
            return
        entry = self._routes.get(msg.route_id)
        d = RouteTable.distance(entry) if entry is not None else 0
        back = msg.hops + 1  # links from the custodian to here
        if d <= 0:
            d = back  # no route held here any more: the path so far stands in for the rest
        link = rtt.link_wait(2.0)
        wait = (d + REPAIR_EXTRA_LINKS) * link
        period = rtt.path_period(back + d)
        # Rule F8b: the search's own verdict comes sooner. A copy that meets a route says so (`repair
        # found`) from at most LOCAL_REPAIR_RADIUS links away; with no such word within that many link
        # round trips the search found nothing (its other copies died quietly), and the custodian hears
        # it now rather than after a successful repair's whole round trip.
        quick = LOCAL_REPAIR_RADIUS * link
        if back * srtt + quick >= period:
            return
        seen = self._seen
        seen.mark(msg.push_id, Mark.REPAIR_WATCHED, now)
        seen.clear(msg.push_id, Mark.REPAIR_FOUND)
        seen.clear(msg.push_id, Mark.QUICK_PASSED)
        self._finds.pop(msg.push_id, None)  # F8c: this search's finds only
        heapq.heappush(self._repair_heap, (now + quick, msg.push_id, prev, msg.route_id, True))
        if back * srtt + wait < period:
            heapq.heappush(self._repair_heap, (now + wait, msg.push_id, prev, msg.route_id, False))

    # Rule F8.
    def repair_next(self) -> float | None:
        """When the first local repair watched here is due (None: none)."""
        heap = self._repair_heap
        return heap[0][0] if heap else None

    # Rules F5c, F8c, F9.
    def sweep_repairs(self, now: float) -> None:
        """Drop the expired steering notes (F9), find counts (F8c) and kept senders (F5c)."""
        self._steer.sweep(lambda v: v[1] <= now)
        self._finds.sweep(lambda v: v[2] <= now)
        self._kept_from.sweep(lambda v: v[2] <= now)

    # Rule F9.
    def steer_known(self, pid: bytes) -> bool:
        """True when a search for push pid failed (its next copies are steered, steer_hop)."""
        return pid in self._steer

    # Rule F8.
    def repairs_unanswered(self, now: float) -> list[Effect]:
        """Local repairs whose answer is overdue: the radius-2 search found nothing (its copies die
        quietly). Tell the relay upstream `repair failed`, a notice for the custodian that every relay
        on the way passes on unchanged (_on_repair_failed): the custodian takes its next step (C2) at
        once instead of re-sending into the same hole after its retry period."""
        out: list[Effect] = []
        heap = self._repair_heap
        if not heap or heap[0][0] > now:
            return out
        while heap and heap[0][0] <= now:
            _, pid, prev, rid, quick = heapq.heappop(heap)
            if quick and self._seen.has(pid, Mark.REPAIR_FOUND):
                # F8b: a copy found a route: the full wait (the entry after this one) decides, unless every
                # find is refuted first (F8c, _find_refuted)
                self._seen.mark(pid, Mark.QUICK_PASSED, now)
                continue
            out += self._report_repair_failed(pid, prev, rid, now)
        return out

    # Rules F8, F8c.
    def _report_repair_failed(self, pid: bytes, prev: str, rid: bytes, now: float) -> list[Effect]:
        """This relay's search for push pid (received from prev) found nothing: `repair failed` (F9: `dead
        end`) to prev, once per copy, unless the push was answered meanwhile."""
        back = self._reverse.back(pid)
        if back is None or back[0] != prev or prev not in self._linked:
            return []  # answered (a receipt took the reverse entry), or the way back is gone
        if not self._error_once(pid, now):
            return []  # an answer (a route error) already went back for this copy (F6b)
        self._count("repair_failed_reported")
        self._linked[prev].last_sent = now  # M2
        if self.config.repair_steer:  # F9: this relay's search for it found nothing
            self._steer.put(pid, (None, now + self.config.reverse_ttl_s))
        if self._level:
            self._trace(now, "route_error", msg=pid.hex(), route=rid.hex(), peer=prev, reason="repair_failed",
                        count=1)
        # F9: `dead end` (a `repair failed` that says no relay on its way back could go around yet)
        reason = RouteErrorReason.DEAD_END if self.config.repair_steer else RouteErrorReason.REPAIR_FAILED
        return [Send(prev, RouteError(pid, rid, reason))]

    # Rule F8.
    def _on_repair_failed(self, peer: str, msg: RouteError, now: float) -> list[Effect]:
        """`repair failed`: a local repair down this push's path found nothing. A notice for the
        custodian, passed back along the reverse path (once per copy, F6b); it changes no route, score
        or wait on the way (F6's timeouts still find and report the hole, as before F8): a relay could
        not tell a true notice from a black hole's excuse. The custodian takes its next step (C2) at
        once: the other route attempt (backups first) or the first ring, rather than after its retry
        period (C4), which on a long route is seconds."""
        back = self._reverse.back(msg.push_id)
        if back is None:
            return []
        prev = back[0]
        if prev is _LOCAL:
            c = self._custody.get(msg.push_id)
            if c is None or c.attempt >= ROUTE_ATTEMPTS or c.home_down or c.sent_to != peer:
                return []  # a ring (its other copies go on), or a notice about an earlier attempt
            if c.attempt + 1 >= self.config.custody_max_attempts:
                return []
            self._count("custody_escalated_repair_failed")
            c.attempt += 1
            if self.config.repair_steer:  # F9: the next attempt goes another way if there is one
                self._steer.put(msg.push_id, (peer, now + self.config.reverse_ttl_s))
                if (msg.reason == RouteErrorReason.DEAD_END and c.attempt < ROUTE_ATTEMPTS
                        and c.attempt + 1 < self.config.custody_max_attempts
                        and self._other_hop(msg.route_id, None, peer) is None):
                    # ...and where none is, on the whole way to the search, the second route attempt would
                    # only meet the same search: the first ring goes now.
                    self._count("custody_skipped_dead_end")
                    c.attempt += 1
            return self._custody_rules.attempt(c, now)
        if isinstance(prev, ReverseMark) or prev not in self._linked:
            return []
        if self.config.repair_steer and self.config.repair_reroute:
            rerouted = self._reroute_dead_end(peer, msg, prev, now)
            if rerouted is not None:
                return rerouted
        if not self._error_once(msg.push_id, now):
            return []
        if self.config.repair_steer:  # F9: the push's next copy through here avoids peer if it can
            self._steer.put(msg.push_id, (peer, now + self.config.reverse_ttl_s))
            if (msg.reason == RouteErrorReason.DEAD_END and not self._seen.has(msg.push_id, Mark.REROUTED)
                    and self._other_hop(msg.route_id, prev, peer) is not None):
                msg = RouteError(msg.push_id, msg.route_id, RouteErrorReason.REPAIR_FAILED)  # a way around here
        self._linked[prev].last_sent = now  # M2
        return [Send(prev, msg)]

    # Rule F10.
    def _reroute_dead_end(self, peer: str, msg: RouteError, prev: str, now: float) -> list[Effect] | None:
        """A `repair failed` (or `dead end`) for the copy of a route attempt this relay sent to peer, and
        another live next hop of the route here (not prev, not peer; score not low, not unresponsive): send
        that copy over it now, once per push, instead of passing the notice back for the custodian to
        send its next attempt the same way (rule F10). The notice stops here; peer stays awaited (F6
        blames it as before unless the push is answered), and later copies avoid it (F9). None: nothing
        done here (the notice goes back as before)."""
        pid = msg.push_id
        w = self._await.get(pid)
        if w is None or w[0] != peer or w[4].ring or w[4].attempt >= ROUTE_ATTEMPTS:
            return None
        if self._seen.has(pid, Mark.REROUTED):
            return None  # the copy sent around met a dead end too: the custodian hears of it
        other = self._other_hop(msg.route_id, prev, peer)
        if other is None:
            return None
        self._seen.mark(pid, Mark.REROUTED, now)
        self._steer.put(pid, (peer, now + self.config.reverse_ttl_s))
        self._count("push_rerouted_dead_end")
        return [self.forward(w[4], other, now)]

    # Rule F8b.
    def _on_repair_found(self, peer: str, msg: RouteError, now: float) -> list[Effect]:
        """`repair found`: a copy of a local repair met a route at peer (or beyond it). The searching
        relay notes it (its quick verdict is then left to F8's full wait); a relay between (it passed a
        repair's ring copy on) passes it back along the reverse path, once per push. Neutral: no route,
        score or wait changes for it, so a relay that sends it wrongly only delays a notice."""
        pid = msg.push_id
        seen = self._seen
        if seen.has(pid, Mark.REPAIR_WATCHED):
            seen.mark(pid, Mark.REPAIR_FOUND, now)
            self._count_find(pid, 1, now)  # F8c
            return []
        steer = self._steer.get(pid)  # F9: the neighbour this push's last `repair failed` came from
        if self._custody_rules.ring_found(pid, steer is not None and steer[0] == peer and steer[1] > now):
            return []  # C2b: the custodian's ring met a route
        if (not seen.copy_seen(pid, 0, True) and not seen.copy_seen(pid, 1, True)
                and not seen.has(pid, Mark.RING_RELAYED)):
            return []  # no ring copy passed here (F8b's word goes back one ring only)
        self._count_find(pid, 1, now)  # F8c: every find counts here, the word goes back once
        if not seen.mark_once(pid, Mark.FOUND_PASSED, now):
            return []
        back = self._reverse.back(pid)
        if (back is None or isinstance(back[0], ReverseMark) or back[0] == peer
                or back[0] not in self._linked):
            return []
        if self._level:
            self._trace(now, "receipt_forwarded", msg=pid.hex(), peer=back[0], reason="repair_found", count=1)
        return [Send(back[0], msg)]

    # Rule F5c.
    def _on_not_home(self, peer: str, msg: RouteError, now: float) -> list[Effect]:
        """`not home`: the push's home holds no receipt key of the registration the push carried (the device
        signed one it never registered there, or the home lost it), so it refused the push rather than
        answer with a receipt the path would refuse as forged. Unsigned (any relay on the way could send
        it), so it is neutral: an answer (the next hop is no black hole) that earns nothing and changes no
        route and no score, passed back along the reverse path once per copy (F6b). The custodian keeps
        custody and re-sends along the route at its scheduled retries, never wider (the home was reached;
        a relay that lied is gone round by the alternate attempt), and settles the push as
        `unknown_registration` at its deadline."""
        pid = msg.push_id
        w = self._await.get(pid)
        copy = w[4] if w is not None and w[0] == peer else None  # the copy it answers (F6: awaited here)
        self._scoring_rules.answered(peer, pid, now, reward=False)
        self._count("route_error_not_home")
        back = self._reverse.back(pid)
        if back is None:
            return []
        prev = back[0]
        kept = None if copy is None else self._kept_from.get(pid)
        if kept is not None and copy is not None and kept[1] == copy.attempt and kept[0] in self._linked:
            # The copy it answers came from a relay that is not this push's reverse entry (F6b kept an
            # earlier copy's, over fewer hops): that relay awaits the answer, and would blame this one as
            # a black hole without it (the custodian re-sends a refused push along its route, and routes
            # change between its copies). Back along that copy's own path: no cycle.
            prev = kept[0]
        if prev is _LOCAL:
            c = self._custody.get(pid)
            if c is not None:
                c.refused = True
                self._custody_rules.home_down(c, now)  # route re-sends only (custody.py), as after `home unreachable`
            return []
        if isinstance(prev, ReverseMark) or prev not in self._linked or not self._error_once(pid, now):
            return []
        self._linked[prev].last_sent = now  # M2
        if self._level:
            self._trace(now, "receipt_forwarded", msg=pid.hex(), peer=prev, reason="not_home", count=1)
        return [Send(prev, msg)]

    # Rule F8c.
    def _count_find(self, pid: bytes, found: int, now: float) -> tuple[int, int]:
        """Add a `repair found` (found = 1) or its refutation (0) heard here for push pid's search: (finds,
        refutations) so far."""
        got = self._finds.get(pid)
        finds, refuted = (0, 0) if got is None else (got[0], got[1])
        finds += found
        refuted += 1 - found
        self._finds.put(pid, (finds, refuted, now + self.config.seen_ttl_s))
        return finds, refuted

    # Rule F8c.
    def _find_refuted(self, peer: str, msg: RouteError, now: float) -> list[Effect]:
        """An unexpected `duplicate` (not awaited from peer): the copy of a local repair's find (F8b) met a
        relay that had this attempt's route copy already, so the route it found leads back into the
        push's own path (through the searching relay), not around the hole. Counted against the finds
        heard here; when every find is refuted, the searching relay's verdict is `repair failed` after
        all (now, if its quick verdict was already left to F8's full wait), and a relay between passes
        the refutation back once."""
        pid = msg.push_id
        if pid not in self._finds or not self.config.repair_refute:
            self._count("route_error_unexpected")
            return []
        finds, refuted = self._count_find(pid, 0, now)
        if refuted < finds:
            return []
        seen = self._seen
        back = self._reverse.back(pid)
        if back is None or isinstance(back[0], ReverseMark) or back[0] not in self._linked:
            return []
        prev = back[0]
        if seen.has(pid, Mark.REPAIR_WATCHED):  # the searching relay: its search found nothing after all
            self._count("repair_found_refuted")
            seen.clear(pid, Mark.REPAIR_FOUND)
            if seen.has(pid, Mark.QUICK_PASSED):
                return self._report_repair_failed(pid, prev, msg.route_id, now)
            return []  # the quick verdict, still due, decides
        if not seen.has(pid, Mark.FOUND_PASSED) or seen.has(pid, Mark.REFUTE_PASSED) or prev == peer:
            return []
        seen.mark(pid, Mark.REFUTE_PASSED, now)
        if self._level:
            self._trace(now, "receipt_forwarded", msg=pid.hex(), peer=prev, reason="duplicate", count=1)
        return [Send(prev, msg)]

    # Rule F6b.
    def _error_once(self, pid: bytes, now: float) -> bool:
        """True the first time a route error for push pid is passed on since its last copy came (F6b:
        route errors keep the reverse path, so a relay passes on one route error per copy of the push it
        received; a new copy clears the mark, in on_push): an answer never circles."""
        if not self._seen.mark_once(pid, Mark.ERROR_PASSED, now):
            self._count("route_error_repeat_dropped")
            return False
        return True

    # Rule F3.
    def _push_drop(
        self, peer: str, msg: Push, now: float, reason: str, error: RouteErrorReason | None
    ) -> list[Effect]:
        self._count("push_dropped_" + reason)
        if self._level:
            self._trace(now, "push_dropped", msg=msg.push_id.hex(), route=msg.route_id.hex(), peer=peer,
                        hops=msg.hops + 1, ttl=msg.ttl, reason=reason)
        if error is None:  # ring copies die quietly: other copies are still searching
            return []
        # The reverse path stays: a search (local repair, a ring going on: F4b), or the home back, may
        # still answer, and its receipt must find the way back (it expires with reverse_ttl_s; F6b
        # keeps route errors from circling).
        if self._level:
            self._trace(now, "route_error", msg=msg.push_id.hex(), route=msg.route_id.hex(), peer=peer,
                        reason=reason, count=1)
        return [Send(peer, RouteError(msg.push_id, msg.route_id, error))]

    # Rule F2.
    def deliver_local(
        self, pid: bytes, msg: Push, status: ReceiptStatus, now: float, hops: int = 0
    ) -> list[Effect]:
        """The home store's verdict (status) on msg at this relay: delivered, a duplicate, or dropped (counted)."""
        if status == ReceiptStatus.STORED:
            if self._level:
                self._trace(now, "push_delivered", msg=pid.hex(), route=msg.route_id.hex(), hops=hops)
            return [Delivered(msg.route_id, pid)]
        if status == ReceiptStatus.DUPLICATE:
            if self._level:
                self._trace(now, "push_duplicate", msg=pid.hex(), route=msg.route_id.hex(), hops=hops)
            return []
        reason = RECEIPT_STATUS[status]
        self._count("push_dropped_" + reason)
        if self._level:
            self._trace(now, "push_dropped", msg=pid.hex(), route=msg.route_id.hex(), hops=hops, reason=reason)
        return []

    # Rule F5.
    def _receipt_forged(self, msg: Receipt, prev: str | ReverseMark, reg: Registration | None) -> bool | None:
        """True when the receipt does not carry the home relay's signature for this push (rule F5).

        The key is the receipt key of the push's registration: the custodian's own (verified when the
        push was injected), or the one the push carried here, trusted only once its registration
        verifies (else a hostile custodian could make honest homes' receipts look forged). A push whose
        registration has no receipt key, or none known here, cannot be judged: its receipt passes.
        """
        if not self.config.receipt_signatures:
            return None
        if prev is _LOCAL:
            c = self._custody.get(msg.push_id)
            if c is not None:
                reg = c.push.registration
        elif reg is not None and not self._verifier.verify_registration(reg):
            return False
        if reg is None or reg.receipt_key is None:
            return None  # cannot be judged here: passed on, but teaches no route (F7)
        return not self._verifier.verify_receipt(reg.receipt_key, reg.route_id, msg)

    # Rule F7.
    def _learn_from_receipt(self, peer: str, msg: Receipt,
                            back: Back, now: float) -> None:
        """A receipt signed by the home came back through peer: peer reached the home for this push's
        route, so it becomes the route's primary next hop (a search that found the home after a
        route broke repairs the route for every later push, on every relay the receipt passes).
        Distance: the receipt's hops less the hops this relay's copy had travelled."""
        prev = back[0]
        rid: bytes | None = None
        if prev is _LOCAL:
            c = self._custody.get(msg.push_id)
            rid = None if c is None else c.push.route_id
        else:
            waited = self._await.get(msg.push_id)
            if waited is not None:
                rid = waited[3]
            elif back[2] is not None:
                rid = back[2].route_id
        if rid is None:
            return
        entry = self._routes.get(rid)
        hops = max(1, min(limits.MAX_TTL, msg.hops - back[3] - 1))
        if entry is None:
            # No route here (a relay back with empty state): the push's registration makes one.
            reg = back[2]
            if reg is None or reg.route_id != rid or len(self._routes) >= self.config.route_max:
                return
            expires = self._local_expiry(reg.expires_at)
            if expires <= now:
                return
            self._routes.set_first(rid, reg.epoch, expires, peer, hops)
        elif RouteTable.primary(entry) == peer or RouteTable.distance(entry) == 0:
            return
        else:
            self._routes.lead(rid, entry, peer, hops, self.config.route_k)
        self._count("route_learnt_receipt")
        if self._level >= _FULL:
            self._trace(now, "route_learnt", route=rid.hex(), peer=peer, hops=hops)

    # Rules F1 (receipts travel back), F5 (signed receipts), S1 (an answer).
    def on_receipt(self, peer: str, msg: Receipt, now: float) -> list[Effect]:
        """A receipt from a neighbour: check it, learn from it, pass it back or settle custody."""
        back = self._reverse.back(msg.push_id)
        forged = None if back is None else self._receipt_forged(msg, back[0], back[2])
        if forged:
            # Ignored (custody and reverse state stay for the real answer) and its sender scored down.
            self._count("receipt_refused")
            if self._level:
                self._trace(now, "receipt_refused", msg=msg.push_id.hex(), peer=peer, hops=msg.hops,
                            reason=RECEIPT_STATUS[msg.status])
            return self._scoring_rules.score(peer, self.config.score_bad_signature, now, "bad_receipt")
        if forged is not None and back is not None:
            self._learn_from_receipt(peer, msg, back, now)
        self._rtt_rules.receipt_rtt(peer, msg, now)  # rtt.py (C4): a round-trip sample
        self._scoring_rules.answered(peer, msg.push_id, now, any_peer=True)  # scoring.py: rises, never cuts
        if back is None:
            self._count("receipt_orphan")
            return []
        self._reverse.forget(msg.push_id)
        self._backups.answered(msg.push_id)  # C8: the custodian gets its answer
        prev = back[0]
        if prev is _LOCAL:
            return self._custody_rules.settle(msg.push_id, msg.status, msg.hops, now)
        if prev is _LATE:
            self._count("receipt_late")
            return [CustodyReleased(msg.push_id, RECEIPT_STATUS[msg.status], msg.hops)]
        if isinstance(prev, ReverseMark) or prev not in self._linked:  # (no other mark: for mypy)
            self._count("receipt_lost_link")
            return []
        self._linked[prev].last_sent = now  # M2
        if self._level:
            self._trace(now, "receipt_forwarded", msg=msg.push_id.hex(), peer=prev, hops=msg.hops, count=1)
        return [Send(prev, msg)]

    # Rule F5b (the home's side).
    def flush_receipts(self, now: float) -> list[Effect]:
        """The receipts held since the last flush (a host that called hold_receipts), one frame per (neighbour,
        route, receipt key the pushes carried): a ReceiptBatch under one signature for two or more (at
        most receipt_batch_max each), a plain Receipt for one. The host calls it once per scheduling
        round, before the round's writes commit (a receipt still leaves only once the push is stored)."""
        hold = self._receipt_hold
        if not hold:
            return []
        self._receipt_hold = {}
        out: list[Effect] = []
        cap = max(1, min(self.config.receipt_batch_max, limits.MAX_RECEIPTS_PER_BATCH))
        sign = self._home.sign_receipt
        for (peer, rid, key), group in hold.items():  # F5c: each under its pushes' own receipt key
            items = [(pid, status, hops) for pid, (status, hops) in group.items()]
            for i in range(0, len(items), cap):
                chunk = items[i:i + cap]
                sig = sign(rid, receipts_signed_bytes(rid, chunk), key) if len(chunk) > 1 else None
                if sig is None:  # one receipt, or no receipt key here (unsigned, as before F5): one frame each
                    out += [Send(peer, Receipt(pid, st, hops, sign(rid, receipt_signed_bytes(pid, rid, st), key)))
                            for pid, st, hops in chunk]
                    continue
                self._count("receipt_batches_sent")
                self._count("receipts_batched", len(chunk))
                out.append(Send(peer, ReceiptBatch(rid, tuple(chunk), sig)))
        return out

    def hold_receipts(self) -> None:
        """Rule F5b: from now on the receipts this relay answers as a home are held until flush_receipts
        (a host that calls it once per round; the simulator and MiniNet answer each push at once)."""
        if self._receipt_hold is None and self.config.receipt_batch_max > 1:
            self._receipt_hold = {}

    def receipts_held(self) -> bool:
        """True when receipts wait for flush_receipts."""
        return bool(self._receipt_hold)

    # Rule F5b (every relay on the way back).
    def _batch_forged(self, msg: ReceiptBatch,
                      backs: list[Back | None],
                      judged: set[bytes]) -> bool | None:
        """As _receipt_forged, once for a whole batch: True when the signature does not verify under the
        receipt key of the pushes' registration (or an item's push was of another route), False when
        it does, None when no item can be judged here (no receipt key known). judged: filled with the
        push ids whose registration (of this route, with a receipt key) was checked: only they teach (F7)."""
        if not self.config.receipt_signatures:
            return None
        rid = msg.route_id
        keys: set[bytes] = set()
        for item, back in zip(msg.items, backs, strict=True):
            if back is None:
                continue
            reg = back[2]
            if back[0] is _LOCAL:
                c = self._custody.get(item[0])
                if c is not None:
                    reg = c.push.registration
            elif reg is not None and not self._verifier.verify_registration(reg):
                continue  # not trusted to judge by (see _receipt_forged)
            if reg is None or reg.receipt_key is None:
                continue
            if reg.route_id != rid:
                return True  # a push of another route under this route's signature
            keys.add(reg.receipt_key)
            judged.add(item[0])
        if not keys:
            return None
        return not all(self._verifier.verify_receipts(k, msg) for k in keys)

    # Rules F5b, F1 (receipts travel back), S1 (answers), F7.
    def on_receipt_batch(self, peer: str, msg: ReceiptBatch, now: float) -> list[Effect]:
        """A batch of the home's receipts: judged once (one signature), then each item as a receipt; the
        batch is passed on whole (its signature covers every item) to each relay an item's reverse path
        leads to. A batch that does not verify is ignored and its sender scored down once (one frame)."""
        backs = self._reverse.backs([item[0] for item in msg.items])
        judged: set[bytes] = set()
        forged = self._batch_forged(msg, backs, judged)
        if forged:
            self._count("receipt_refused")
            self._count("receipt_batch_refused")
            if self._level:
                self._trace(now, "receipt_refused", msg=msg.items[0][0].hex(), peer=peer, hops=msg.items[0][2],
                            reason="batch")
            return self._scoring_rules.score(peer, self.config.score_bad_signature, now, "bad_receipt")
        out: list[Effect] = []
        onward: dict[str, None] = {}
        for (pid, status, hops), back in zip(msg.items, backs, strict=True):
            r = make_receipt(pid, status, hops)
            if forged is not None and back is not None and pid in judged:
                self._learn_from_receipt(peer, r, back, now)
            self._rtt_rules.receipt_rtt(peer, r, now)
            self._scoring_rules.answered(peer, pid, now, any_peer=True)
            if back is None:
                self._count("receipt_orphan")
                continue
            self._reverse.forget(pid)
            self._backups.answered(pid)  # C8 (as in on_receipt)
            prev = back[0]
            if prev is _LOCAL:
                out += self._custody_rules.settle(pid, status, hops, now)
            elif prev is _LATE:
                self._count("receipt_late")
                out.append(CustodyReleased(pid, RECEIPT_STATUS[status], hops))
            elif isinstance(prev, ReverseMark) or prev not in self._linked:  # (as in on_receipt)
                self._count("receipt_lost_link")
            else:
                onward[prev] = None
                if self._level:
                    self._trace(now, "receipt_forwarded", msg=pid.hex(), peer=prev, hops=hops, count=1)
        for prev in onward:
            self._linked[prev].last_sent = now  # M2
            out.append(Send(prev, msg))
        return out

    # Rules F3 (route errors travel back; the reporting next hop is dropped), C2.
    def on_route_error(self, peer: str, msg: RouteError, now: float) -> list[Effect]:
        """A route error from a neighbour: fix the route, re-send or pass the error back."""
        if msg.reason == RouteErrorReason.DUPLICATE:
            # A relay down the path had this attempt already (its answer went back the way the first
            # copy came): no black hole and no broken route. Neutral for the score; passed back along
            # this copy's reverse path so no relay on it blames its next hop; a custodian keeps custody.
            if not self._scoring_rules.answered(peer, msg.push_id, now, reward=False):
                if self._custody_rules.ring_duplicate(msg.push_id):  # C2b: a ring's find led into a tried path
                    return []
                return self._find_refuted(peer, msg, now)  # F8c: a repair's find led back into the path?
            self._count("route_error_duplicate")
            back = self._reverse.back(msg.push_id)
            if back is None or isinstance(back[0], ReverseMark) or back[0] not in self._linked:
                return []
            self._reverse.forget(msg.push_id)
            if self._level:
                self._trace(now, "receipt_forwarded", msg=msg.push_id.hex(), peer=back[0], reason="duplicate",
                            count=1)
            return [Send(back[0], msg)]
        if msg.reason == RouteErrorReason.REPAIR_FAILED or msg.reason == RouteErrorReason.DEAD_END:
            return self._on_repair_failed(peer, msg, now)
        if msg.reason == RouteErrorReason.REPAIR_FOUND:
            return self._on_repair_found(peer, msg, now)
        if msg.reason == _NOT_HOME:
            return self._on_not_home(peer, msg, now)
        # An answer, if not a receipt: no black hole there. It earns what a receipt earns, so a
        # neighbour blamed while the home behind it was down (not yet detected) recovers.
        # `next hop down` (F6) is neutral: it earns nothing, or a black hole could buy score with it.
        hole = msg.reason == RouteErrorReason.NEXT_HOP_DOWN
        self._scoring_rules.answered(peer, msg.push_id, now, reward=not hole)
        home_down = msg.reason == RouteErrorReason.HOME_UNREACHABLE
        # The reverse path stays (see _push_drop, _report_hole): a late receipt still gets back (a
        # search that went on after `no route` may still find the home: F4b, F7).
        back = self._reverse.back(msg.push_id)
        if back is None:
            return []
        prev = back[0]
        # The neighbour that sent the error cannot reach the home: stop using it as a next hop for this
        # route (a backup takes over). Relays further back keep their routes: their next hop is fine.
        # A home that is down is no fault of the path, and the route is right again when it returns: that
        # next hop is only tried last (a backup, e.g. a link to the home that came back, goes first).
        entry = self._routes.get(msg.route_id)
        if not home_down and not hole and self._sync.any_provisional():
            if self._sync.drop(msg.route_id, peer):  # G11: the neighbour it was learnt from has no route
                self._count("route_provisional_dropped")
        if entry is not None and RouteTable.claims(entry, peer):
            if self._stem.keeps(msg.route_id, entry, peer):
                pass  # G7: a stem relay's only way to the home (stem.py)
            elif not home_down and not hole:
                self._routes.drop_next_hop(msg.route_id, entry, peer)
            elif len(RouteTable.next_hops(entry)) > 1:
                # F6: behind `next hop down` the route was repaired, but it just lost a push: a backup
                # goes first (a hostile relay that answers it for every push it swallows ends last).
                self._routes.demote(msg.route_id, entry, peer)
        if prev is _LOCAL:
            c = self._custody.get(msg.push_id)
            if c is None:
                return []
            if hole:
                # F6: the route is repaired down the path; the scheduled retry stands
                self._custody_rules.await_route(c, now)
                return []
            if msg.reason == RouteErrorReason.HOME_UNREACHABLE:
                # The home relay is down: flooding cannot reach it. Keep custody and re-send along the
                # route at the next scheduled retry (it may be back by then); never widen the ring.
                self._custody_rules.home_down(c, now)
                return []
            if c.attempt + 1 >= self.config.custody_max_attempts:
                self._custody_rules.await_route(c, now)
                return []  # parked: the next slow retry is already scheduled
            return self._custody_rules.retry(c, now)
        if (isinstance(prev, ReverseMark) or prev not in self._linked  # a late mark, or the link went
                or not self._error_once(msg.push_id, now)):  # F6b
            return []
        if msg.reason == RouteErrorReason.NO_ROUTE:
            # F6: the next hop that reported it was dropped here; relays further upstream keep their
            # routes (an answer, not a fault). Were this relay left without a route, its next push for
            # the route searches its neighbourhood (F3), and a search that finds nothing is reported
            # one hop further: a hole closes one hop per failed push, not a whole path at once.
            msg = RouteError(msg.push_id, msg.route_id, RouteErrorReason.NEXT_HOP_DOWN)
        if self._level:
            self._trace(now, "receipt_forwarded", msg=msg.push_id.hex(), peer=prev, reason="route_error", count=1)
        return [Send(prev, msg)]
