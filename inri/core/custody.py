"""Custody, rules C1-C3: the relay where a home app injects a push keeps it until a receipt returns,
re-sends it with an escalating search, parks it until the deadline, and re-adopts it after a restart."""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from typing import TYPE_CHECKING

from inri.core.api import (
    CustodyReleased,
    CustodyStatus,
    CustodyTaken,
    Effect,
    InjectOutcome,
    InjectResult,
)
from inri.core.forwarding import LOCAL_REPAIR_RADIUS, ROUTE_ATTEMPTS
from inri.core.kept import Custody
from inri.core.roundtrip import ROUTE_LEN_MAX
from inri.core.state import (
    MAX_CLOCK_SKEW_S,
    RECEIPT_STATUS,
    EngineContext,
    Neighbour,
    RuleGroup,
    new_push,
    readdress,
    released,
)
from inri.core.tables import BoundedMap, RouteTable
from inri.protocol import limits
from inri.protocol.messages import (
    Push,
    ReceiptStatus,
    Registration,
    RouteErrorReason,
    WebPushMeta,
)

if TYPE_CHECKING:  # annotations only (the groups import each other: Engine.__init__ wires them)
    from inri.core.backups import BackupCopies
    from inri.core.forwarding import ForwardingRules
    from inri.core.kept import CustodyTable
    from inri.core.neighbours import Neighbours
    from inri.core.reverse import ReversePaths
    from inri.core.roundtrip import RttEstimator
    from inri.core.rtt import RttRules
    from inri.core.scoring import ScoringRules
    from inri.core.seen import SeenCache
    from inri.core.tables import CompactRouteTable, RouteTable
    from inri.core.withdrawals import Withdrawals

# Parked custody (escalation exhausted) is re-sent along the route 4 retry periods after the first
# parked re-send, then after twice the period before, up to 16 retry periods (32 s by default): a home
# that stays down costs each push a few re-sends, not one every 8 s until the deadline (rule C3).
PARK_FACTOR = 4
PARK_BACKOFF_MAX = 16
# Rule C7: a push queued behind pushes its next hop still works through is looked at again after this
# share of the queue's measured delay (the answer delay of the latest-sent push it answered).
QUEUE_LOOK = 0.5
# Rule C7: the push at the head of the queue (nothing sent before it still in custody) is next in line
# until this factor times the queue's measured delay after it left; later, it was lost.
QUEUE_HEAD_SLACK = 1.5
# Pushes injected here for one next hop: at most this share of its push budget (_next_hop_free).
OUT_BUDGET_SHARE = 0.9
QUEUE_REREAD_S = 0.05  # a head push found due before the relay read past its due time: look again this soon


def ring_cost(radius: int, degree: int) -> int:
    """The most messages a ring copy of `radius` can cause on a mesh whose relays have at most `degree`
    neighbours: the custodian sends `degree`, every relay within radius - 1 hops forwards to its other
    degree - 1 (the seen-cache stops the rest). The fallback budget counts rings at this cost."""
    if degree <= 2:
        return degree * radius
    cost: int = degree * ((degree - 1) ** radius - 1) // (degree - 2)
    return cost


def widest_ring(budget: int, degree: int, limit: int) -> int:
    """The largest radius <= limit whose ring_cost fits budget (0: none)."""
    r = 0
    while r < limit and ring_cost(r + 1, degree) <= budget:
        r += 1
    return r


class CustodyRules(RuleGroup):
    """C1-C3: pushes this relay accepted from home apps."""

    # The state this rule group owns (tests/test_core_owners.py; Engine.__init__ builds it).
    _waiting_route: dict[bytes, set[bytes]]  # C3c: route id -> pushes in custody whose last copy failed
    _renewed_at: BoundedMap[bytes, float]  # C3c: route id -> when a new epoch or generation last came

    # The rule groups this one calls (given by `wire`).
    _forwarding_rules: ForwardingRules
    _rtt_rules: RttRules
    _scoring_rules: ScoringRules

    def __init__(self, ctx: EngineContext, custody: CustodyTable, neighbours: Neighbours, reverse: ReversePaths,
                 routes: RouteTable | CompactRouteTable, rtt: RttEstimator, seen: SeenCache,
                 withdrawals: Withdrawals, backups: BackupCopies) -> None:
        super().__init__(ctx)
        self._withdrawals = withdrawals
        self._backups = backups
        self._custody = custody
        self._neighbours = neighbours
        self._reverse = reverse
        self._routes = routes
        self._rtt = rtt
        self._seen = seen
        self._waiting_route: dict[bytes, set[bytes]] = {}  # custody.py (C3c)
        self._renewed_at: BoundedMap[bytes, float] = BoundedMap(ROUTE_LEN_MAX)

    def wire(self, *, forwarding: ForwardingRules, rtt: RttRules, scoring: ScoringRules) -> None:
        """The other rule groups this one calls (Engine.__init__, once all are built)."""
        self._forwarding_rules = forwarding
        self._rtt_rules = rtt
        self._scoring_rules = scoring

    # Rule C1.
    def inject_push(
        self,
        registration: Registration,
        token: bytes,
        ciphertext: bytes,
        now: float,
        *,
        push_id: bytes | None = None,
        webpush: WebPushMeta | None = None,
    ) -> InjectResult:
        """A home app pushes here with a push credential's registration and one token (rule C1).

        A Web Push push passes its `webpush` meta (and a zero token); custody is the same.
        """
        reason = None
        if len(token) != limits.TOKEN_BYTES or len(ciphertext) > limits.MAX_CIPHERTEXT_BYTES:
            outcome, reason = InjectOutcome.TOKEN_MISMATCH, "malformed"
        elif (registration.issued_at > now + self._ctx.wall_offset + MAX_CLOCK_SKEW_S
              or (registration.expires_at <= now + self._ctx.wall_offset
                  and (webpush is None or not self._refreshed(registration, now)))):
            outcome, reason = InjectOutcome.BAD_REGISTRATION, "stale_registration"
        elif not self._verifier.verify_registration(registration):
            outcome, reason = InjectOutcome.BAD_REGISTRATION, "bad_signature"
        elif len(self._custody) >= self.config.custody_max:
            outcome, reason = InjectOutcome.OVERLOADED, "custody_full"
        elif not self._next_hop_free(registration.route_id, now):
            outcome, reason = InjectOutcome.OVERLOADED, "next_hop_busy"
        if reason is not None:
            self._count("push_refused_" + reason)
            if self._level:
                self._trace(now, "push_refused", route=registration.route_id.hex(), reason=reason)
            return InjectResult(outcome, None, [], reason)
        pid = push_id if push_id is not None else self._rng.randbytes(limits.PUSH_ID_BYTES)
        push = new_push(pid, registration.route_id, token, ciphertext, self.config.push_ttl, 0, 0, 0, registration,
                        webpush)
        custody = Custody(push, now + self._custody_span(push))
        self._custody.take(custody)
        if self._level:
            self._trace(now, "push_injected", msg=pid.hex(), route=push.route_id.hex(), ttl=push.ttl)
        effects: list[Effect] = [CustodyTaken(push, custody.deadline)]
        effects += self.attempt(custody, now)
        return InjectResult(InjectOutcome.ACCEPTED, pid, effects)

    # Rule C1b.
    def _refreshed(self, registration: Registration, now: float) -> bool:
        """A Web Push endpoint's registration expired, but its home keeps the route alive: a route of a newer
        epoch for its route id is live here (rule C1b).

        An endpoint URL embeds the registration it was minted under and cannot change (a browser keeps a
        subscription for months: docs/browsers.md "Endpoint lifetime"); its home re-signs the registration
        under the same route key before it expires, and the gossip of each new epoch keeps the route live
        at every relay. The old signature still proves the route key's owner made the endpoint; the live
        newer epoch proves the home still serves it. Without one, the push is refused here (404) and
        nothing searches the mesh for a route that is gone. Native pushes (one-use tokens) are not
        concerned: a device hands its apps new credentials."""
        entry = self._routes.get(registration.route_id)
        return (entry is not None and RouteTable.epoch(entry) > registration.epoch
                and RouteTable.expires(entry) > now)

    # Rule C1.
    def _next_hop_free(self, rid: bytes, now: float) -> bool:
        """True when the route's first active next hop can take one more push injected here within its
        push budget (push_budget_per_peer_per_s, the same at every relay by default), at OUT_BUDGET_SHARE
        of it: the rest is left for custody's re-sends. Over it the push is refused (429 at the API)
        rather than sent to be dropped there: a neighbour drops pushes over its budget and lowers our
        score for them, and an entry relay that accepted 2,300 pushes/s for a next hop taking 2,000 was
        cut and banned by it, with 10,000 pushes in custody (bench_poc's 3-hop line, 1 run in 17).
        No known next hop (a search): not limited here."""
        active = self._linked
        for p in self._routes.next_hops_of(rid):
            st = active.get(p)
            if st is not None:
                cfg = self.config
                return st.push_out.take(now, OUT_BUDGET_SHARE * cfg.push_budget_per_peer_per_s,
                                        cfg.push_budget_peer_burst / 2)
        return True

    # Rule C3.
    def restore_custody(self, push: Push, deadline: float, attempt: int, now: float) -> list[Effect]:
        """Re-adopt a push this relay held in custody before a restart (the daemon reads it from disk).

        It is re-sent with the same push id and a higher attempt number, so relays whose seen-caches
        still hold the earlier attempt forward it, and the home relay answers DUPLICATE if it already
        stored it: a push answered 202 is neither lost nor delivered twice across a crash.
        deadline is on the engine's clock, as in CustodyTaken (the daemon stores a wall-clock deadline
        on disk and converts it back: a restart resets the monotonic clock).
        """
        pid = push.push_id
        if self._custody.holds(pid):
            return []
        if deadline <= now:
            self._count("custody_expired")
            return [CustodyReleased(pid, CustodyStatus.EXPIRED)]
        custody = Custody(push, deadline)
        custody.attempt = max(0, attempt)
        # A restarted relay has no routes yet: skip straight to ring searches after the route attempts.
        custody.ring_step = max(0, custody.attempt - ROUTE_ATTEMPTS)
        self._custody.take(custody)
        if custody.attempt >= self.config.custody_max_attempts:
            return self._parked_attempt(custody, now)
        return self.attempt(custody, now)

    # Rule C8.
    def adopt_from(self, peer: str, now: float) -> list[Effect]:
        """Take custody of the pushes peer held whose route attempts' copies this relay holds (backups.py):
        peer's link failed before their receipts passed back. Each goes on one attempt later
        than the copy held, kept for its full custody span from now (its acceptance time is not known
        here: at most reverse_ttl_s too long). A copy without its registration, or with a forged one, is
        not adopted: a hostile neighbour's invented pushes cost it its link, not our searches."""
        out: list[Effect] = []
        for push in self._backups.take_from(peer, now) if len(self._backups) else ():
            reg = push.registration
            if self._custody.holds(push.push_id) or reg is None or reg.route_id != push.route_id or not (
                    self._verifier.verify_registration(reg)):
                continue
            if len(self._custody) >= self.config.custody_max:
                self._count("custody_adopt_full")
                continue
            self._count("custody_adopted")
            deadline = now + self._custody_span(push)
            out.append(CustodyTaken(push, deadline))  # the daemon commits it, as for a push injected here
            out += self.restore_custody(push, deadline, push.attempt + 1, now)
        return out

    # Rule C3.
    def _custody_span(self, push: Push) -> float:
        """How long custody keeps push after accepting it: its TTL (a Web Push push's `TTL`; a native push
        carries none: custody_max_ttl_s), at least custody_deadline_s and at most custody_max_ttl_s.

        Computed from the push and the config alone, so the acceptance time is deadline - span, also
        after a restart (the deadline on disk is restored; no other field is stored).
        """
        cfg = self.config
        ttl = cfg.custody_max_ttl_s if push.webpush is None else float(push.webpush.ttl_s)
        return max(cfg.custody_deadline_s, min(ttl, cfg.custody_max_ttl_s))

    def _accepted_at(self, c: Custody) -> float:
        """When this relay accepted c's push (engine clock)."""
        return c.deadline - self._custody_span(c.push)

    # Rule C2.
    def _aged(self, c: Custody, now: float) -> Push:
        """c.push with its Web Push age set to the time it has spent in custody here (WebPushMeta.age_s).

        Accepted at deadline - _custody_span (also after a restart: the deadline is restored).
        """
        push, meta = c.push, c.push.webpush
        if meta is None:
            return push
        age = min(max(0, int(now - self._accepted_at(c))), limits.MAX_WEBPUSH_TTL_S)
        if age == meta.age_s:
            return push
        return dataclasses.replace(push, webpush=dataclasses.replace(meta, age_s=age))

    def attempt(self, c: Custody, now: float) -> list[Effect]:
        """Send attempt number c.attempt of a push in custody: route first, then widening rings."""
        out = self._attempt(c, now)
        return self._ask_newer(c, now) + out if self._withdrawals.any() else out

    def _ask_newer(self, c: Custody, now: float) -> list[Effect]:
        """G13 for a route withdrawn here as `no route` with no live next hop left: the push searches (C3),
        and this relay asks for a newer route too. A failure near the flood's origin (the fluff relay, with
        the stem on) withdraws the route from a whole region at once, whose relays then answer no search,
        and only a newer generation brings it back (geo-5k-3n-c3l1 seed 5, stem on: a push whose home was
        up was searched for in vain to the end). Paced by REQUEST_GAP_S (withdrawals.py)."""
        return self._withdrawals.ask(c.push.route_id, now)

    def _attempt(self, c: Custody, now: float) -> list[Effect]:
        push = self._aged(c, now)
        pid = push.push_id
        status = self._accept_at_home(push, now)
        if status is not None:
            if isinstance(status, RouteErrorReason):  # rule F5c (NOT_HOME): no key of its registration here
                self._count("push_dropped_not_home")
                return self.settle(pid, CustodyStatus.UNKNOWN_REGISTRATION, 0, now)
            return self._forwarding_rules.deliver_local(pid, push, status, now) + self.settle(pid, status, 0, now)
        cfg = self.config
        self._reverse.mark_local(pid, now)
        c.ring_watch = False  # C2b: set again below when this attempt is a ring
        c.ring_full = 0.0
        # Retry periods 1, 1, 2, 2, 3, 3 x custody_retry_s: every escalation step (route, backups,
        # rings, full TTL) gets its turn within 12 retry periods (24 s by default), so black holes
        # on the routes cost latency, not pushes, within a 30 s deadline.
        # Route attempts wait for the route's measured round trip (rule C4); rings, and re-sends to a
        # home reported down (`home unreachable`: it will not be back within a round trip, and short
        # periods would spend the whole escalation while it restarts), custody_retry_s.
        period = (self._rtt_rules.retry_period(push.route_id) if c.attempt < ROUTE_ATTEMPTS and not c.home_down
                  else cfg.custody_retry_s)
        c.next_retry = now + period * (1 + c.attempt // 2)
        self._schedule(pid, c.next_retry)
        self._seen.mark_copy(pid, c.attempt, False, now)
        self._seen.mark_copy(pid, c.attempt, True, now)
        if c.attempt and self._level:
            self._trace(now, "push_retry", msg=pid.hex(), route=push.route_id.hex(), count=c.attempt)
        # The first two attempts follow the route when there is one (the second prefers backups all
        # along the way); every later attempt (no receipt in time, or a route error) widens the ring:
        # 1, 3, 5, 7, then the full TTL.
        if self._withdrawals.home_down(push.route_id):  # G12: its home is down: wait for the route, no ring
            return self._park_withdrawn(c, now)
        if c.attempt < ROUTE_ATTEMPTS or c.home_down:
            c.home_down = False
            nh = self._forwarding_rules.next_hop(push.route_id, None, alternate=c.attempt == 1)
            if c.attempt and self._forwarding_rules.steer_known(pid):  # rule F9: not into the hole a search found
                nh = self._forwarding_rules.steer_hop(pid, push.route_id, None, nh, now)
            if nh is not None:
                c.routed = True
                self._sent_to(c, nh, now)
                return [self._forwarding_rules.forward(readdress(push, limits.MAX_TTL, 0, c.attempt, 0), nh, now)]
        c.sent_to = None
        radii = limits.RING_RADII
        if c.ring_step < len(radii):
            ring = radii[c.ring_step]
        else:  # the last ring: as wide as what is left of the budget affords (at most push_ttl)
            ring = widest_ring(cfg.fallback_budget - c.ring_spent, cfg.active_max, cfg.push_ttl)
            if ring <= radii[-1]:
                return self._over_budget(c, push, now)
        cost = ring_cost(ring, cfg.active_max)
        if c.ring_spent + cost > cfg.fallback_budget:
            return self._over_budget(c, push, now)
        c.ring_spent += cost
        c.ring_step += 1
        msg = readdress(push, cfg.push_ttl, 0, c.attempt, ring)
        self._watch_ring(c, ring, now)
        return self._forwarding_rules.ring_flood(msg, None, now)

    # Rule C2b.
    def _watch_ring(self, c: Custody, ring: int, now: float) -> None:
        """The ring of radius `ring` just sent: its quick verdict is due after its round trip (radius + 1
        link round trips at srtt + 2 rttvar: a copy that meets a route says `repair found` from at most
        `ring` links away, F8b), when that comes before the ring's own retry. No estimate yet: none."""
        if not self.config.ring_verdict or c.ring_step >= len(limits.RING_RADII):
            # the next step would be the last ring (as wide as the fallback budget affords: thousands of
            # messages on a 3-neighbour mesh): it waits the full period, time for a withdrawal (G12) or a
            # receipt to come (geo-5k-3n-c3l1 seed 2: hurried into it, pushes sent while their home was down
            # cost 186 messages each, against 92)
            return
        c.ring_watch = True
        c.ring_finds = 0
        rtt = self._rtt
        if not rtt.active():
            return
        quick = now + (ring + 1) * rtt.link_wait(2.0)
        if quick >= c.next_retry:
            return
        c.ring_full = c.next_retry
        c.next_retry = quick
        self._schedule(c.push.push_id, quick)

    # Rule C2b.
    def ring_found(self, pid: bytes, failed: bool) -> bool:
        """A `repair found` came back to this custodian: a copy of its ring met a route. True when push pid's
        last attempt was a ring (it then waits its full retry). failed: it came from the neighbour this
        push's last `repair failed` came from (F9), whose route is the one that just failed: no find."""
        c = self._custody.get(pid)
        if c is None or not c.ring_watch:
            return False
        if failed:
            self._count("custody_ring_find_stale")
        else:
            c.ring_finds += 1
        return True

    # Rule C2b.
    def ring_duplicate(self, pid: bytes) -> bool:
        """An unexpected `duplicate` came back to this custodian while its ring waits (F8c's refutation, for
        a custodian's ring): a find's route copy met a relay that had this attempt's copy, so that route
        leads into a path already tried. It takes one find back; it never hurries the next step itself (the
        quick verdict, when still due, decides). True when pid's last attempt was a ring."""
        c = self._custody.get(pid)
        if c is None or not c.ring_watch:
            return False
        if c.ring_finds:
            c.ring_finds -= 1
            self._count("custody_ring_find_refuted")
        return True

    # Rule C2 (the fallback budget).
    def _over_budget(self, c: Custody, push: Push, now: float) -> list[Effect]:
        """The next ring would not fit the push's fallback budget: re-send along routes instead (any live
        next hop, a low-scored one too: the ring was the alternative), never flood again."""
        self._count("push_fallback_budget_exhausted")
        if self._level:
            self._trace(now, "push_retry", msg=push.push_id.hex(), route=push.route_id.hex(), count=c.attempt,
                        reason="fallback_budget")
        nh = self._forwarding_rules.next_hop(push.route_id, None, alternate=(c.attempt & 1) == 1, low_ok=True)
        if nh is None:
            return []  # no route here yet: the next retry looks again (gossip or a returning home brings it)
        c.routed = True
        self._sent_to(c, nh, now)
        return [self._forwarding_rules.forward(readdress(push, limits.MAX_TTL, 0, c.attempt, 0), nh, now)]

    # Rule C1.
    def settle(self, pid: bytes, status: ReceiptStatus | CustodyStatus, hops: int, now: float) -> list[Effect]:
        """Custody of pid ends with the home's answer (a receipt's status), or a final status decided here."""
        c = self._custody.release(pid)
        self._reverse.forget(pid)
        if c is None:
            return []
        if self._waiting_route:  # C3c
            self._forget_waiting(c)
        st = None if c.sent_to is None else self._linked.get(c.sent_to)
        if st is not None:  # rule C7
            st.queue_heard = now
            if c.attempt == 0 and c.sent_at > st.queue_sent:  # one copy, sent to one next hop, answered
                st.queue_sent = c.sent_at
                st.queue_delay = now - c.sent_at
            self._queue_front(st)
        final = status if isinstance(status, CustodyStatus) else RECEIPT_STATUS[status]
        self._rtt.route_measured(c.push.route_id, hops)  # rule C4b (rtt.py)
        if self._level:
            self._trace(now, "push_settled", msg=pid.hex(), route=c.push.route_id.hex(), hops=hops, reason=final)
        return [released(pid, final, hops)]

    # Rules C2, C3 (deadline).
    def retry(self, c: Custody, now: float) -> list[Effect]:
        """A push in custody whose retry is due: send it again, or settle it at its deadline."""
        pid = c.push.push_id
        # A push refused `not home` (F5c) settles custody_deadline_s after acceptance, not at its TTL: the
        # unsigned answer is only trusted once that long of re-sends along its route found no home.
        if now >= c.deadline or (c.refused and now >= self._accepted_at(c) + self.config.custody_deadline_s):
            self._custody.release(pid)
            if self._waiting_route:  # C3c
                self._forget_waiting(c)
            # A late receipt still corrects the status, once it verifies against the push's receipt key.
            self._reverse.mark_late(pid, now, c.push.registration)
            # expired: routes existed but no receipt came back in time; unreachable: no relay on our
            # side ever had a route to the device; unknown_registration: `not home` came back (F5c).
            final = (CustodyStatus.UNKNOWN_REGISTRATION if c.refused else
                     CustodyStatus.EXPIRED if c.routed else CustodyStatus.UNREACHABLE)
            if self._level:
                self._trace(now, "push_settled", msg=pid.hex(), route=c.push.route_id.hex(), reason=final)
                self._trace(now, "push_dropped", msg=pid.hex(), route=c.push.route_id.hex(), reason=final)
            return [CustodyReleased(pid, final)]
        queued = self._queued_until(c, now)
        if queued is not None:
            # Rule C7: the push waits in a queue that is being answered; a copy would only lengthen it.
            self._count("custody_retry_queued")
            c.next_retry = min(queued, c.deadline)
            self._schedule(pid, c.next_retry)
            return []
        wait = self._scoring_rules.answer_expected(pid, now)
        if wait is not None:
            # The next hop is slow but answering (rule S1): re-sending now would add load to a path
            # that is already behind. Wait for its answer (or its grace to end) first.
            self._count("custody_retry_deferred")
            c.next_retry = min(wait, c.deadline)
            self._schedule(pid, c.next_retry)
            return []
        if c.ring_full:  # C2b: the ring's quick verdict
            full, c.ring_full = c.ring_full, 0.0
            if c.ring_finds:  # a copy met a route: its answer gets the ring's full wait
                c.next_retry = full
                self._schedule(pid, full)
                return []
            self._count("custody_ring_verdict")
        c.ring_watch = False
        c.attempt += 1
        if c.attempt >= self.config.custody_max_attempts:
            return self._parked_attempt(c, now)
        return self.attempt(c, now)

    # Rule C3.
    def _parked_attempt(self, c: Custody, now: float) -> list[Effect]:
        out = self._parked(c, now)
        return self._ask_newer(c, now) + out if self._withdrawals.any() else out

    def _parked(self, c: Custody, now: float) -> list[Effect]:
        """After the escalation (route, backups, rings, full TTL): keep custody until the deadline (the
        push's TTL, _custody_span).

        A home relay that crashed comes back and re-gossips its registrations, so the route returns:
        a parked push is re-sent along it (never flooded: that was tried), so a push answered 202
        survives a home relay's downtime up to the custody deadline. The re-sends back off: PARK_FACTOR
        retry periods after the first, then twice the period before, up to PARK_BACKOFF_MAX. Measured
        (churn-2k, a 2,000-relay copy of churn-10k): a third of all push messages went to the every-8-s
        re-sends of pushes whose home never came back; a home that does come back waits at most
        PARK_BACKOFF_MAX retry periods more for its parked pushes.
        Past custody_deadline_s after acceptance (a push whose TTL is longer), each wait is as long as the
        push has been kept beyond custody_deadline_s (so the waits double), at least PARK_BACKOFF_MAX
        retry periods and at most custody_park_max_s: a push kept for days costs one re-send an hour by
        default, not 112 (32 s apart); the bound is in EngineConfig. A new epoch or generation of its route wakes
        it at once then (C3c), since its next scheduled re-send may be an hour away.
        """
        cfg = self.config
        pid = c.push.push_id
        parked = min(max(0, c.attempt - cfg.custody_max_attempts), 8)  # parked re-sends before this one
        wait = cfg.custody_retry_s * min(PARK_FACTOR << parked, PARK_BACKOFF_MAX)
        accepted = self._accepted_at(c)
        beyond = now - accepted - cfg.custody_deadline_s
        if beyond >= 0:
            wait = max(wait, min(beyond, cfg.custody_park_max_s))
            self._waiting_route.setdefault(c.push.route_id, set()).add(pid)
        # A push answered `not home` ends at custody_deadline_s (retry): its last wait stops there.
        end = min(c.deadline, accepted + cfg.custody_deadline_s) if c.refused else c.deadline
        c.next_retry = min(now + wait, end)
        self._schedule(pid, c.next_retry)
        if self._withdrawals.home_down(c.push.route_id):  # G12: its home is down: wait for the route
            return self._park_withdrawn(c, now)
        nh = self._forwarding_rules.next_hop(c.push.route_id, None, low_ok=True)
        if nh is None:
            return self._parked_search(c, now)
        if parked & 1 and cfg.parked_search and not c.home_down:
            # Rule C3b: every other parked re-send searches the neighbourhood instead of the route that
            # has failed since the escalation began (a home reported down is waited for on the route).
            searched = self._parked_search(c, now)
            if searched:
                return searched
        c.routed = True
        self._sent_to(c, nh, now)
        self._reverse.mark_local(pid, now)
        self._seen.mark_copy(pid, c.attempt, False, now)
        push = self._aged(c, now)
        if self._level:
            self._trace(now, "push_retry", msg=pid.hex(), route=push.route_id.hex(), count=c.attempt)
        return [self._forwarding_rules.forward(readdress(push, limits.MAX_TTL, 0, c.attempt, 0), nh, now)]

    # Rule C3.
    def _parked_search(self, c: Custody, now: float) -> list[Effect]:
        """A parked push whose route is known here but has no live next hop (route errors and a lost
        link took them all):
        ask the neighbourhood (radius LOCAL_REPAIR_RADIUS), within the push's fallback budget. The
        routes that came back with a restarted home (its link-up announcements reach its neighbours,
        which kept their routes) are then used, where waiting would keep the push until its deadline
        (seen with real relays: a custodian whose next hops had answered `no route` while the home
        restarted)."""
        cfg = self.config
        cost = ring_cost(LOCAL_REPAIR_RADIUS, cfg.active_max)
        if (not self._linked or c.ring_spent + cost > cfg.fallback_budget
                or c.push.route_id not in self._routes):  # a route never known here: searched already
            return []
        c.ring_spent += cost
        c.sent_to = None
        pid = c.push.push_id
        self._count("custody_parked_search")
        self._reverse.mark_local(pid, now)
        self._seen.mark_copy(pid, c.attempt, True, now)
        push = self._aged(c, now)
        if self._level:
            self._trace(now, "push_fallback", msg=pid.hex(), route=push.route_id.hex(), ttl=LOCAL_REPAIR_RADIUS,
                        count=c.attempt)
        copy = readdress(push, cfg.push_ttl, 0, c.attempt, LOCAL_REPAIR_RADIUS)
        return self._forwarding_rules.ring_flood(copy, None, now)

    # Rule C7.
    def _sent_to(self, c: Custody, nh: str, now: float) -> None:
        c.sent_to = nh
        c.sent_at = now
        if c.attempt == 0:
            st = self._linked.get(nh)
            if st is not None:
                if st.queue_order is None:
                    st.queue_order = deque()
                st.queue_order.append((now, c.push.push_id))

    # Rule C7.
    def _queue_front(self, st: Neighbour) -> float:
        """When the oldest push sent to nh that is still in custody was first sent (inf: none): its first
        copy is ahead of every later one in nh's queue, re-sent or not. Settled ones leave the front."""
        order = st.queue_order
        if order is None:
            return math.inf
        custody = self._custody
        while order:
            sent, pid = order[0]
            if custody.holds(pid):
                return sent
            order.popleft()
        return math.inf

    # Rule C7.
    def _queued_until(self, c: Custody, now: float) -> float | None:
        """When to look again at a push due for a retry that waits in a queue its next hop is working
        through (None: it does not, the retry goes ahead).

        Queued: the one next hop the last attempt went to is answering (a receipt for a push of ours
        came back from it within custody_retry_s), answers in order (no push sent to it after this one
        has been answered yet), and pushes sent to it before this one still wait for their answers:
        their turn comes first, this one's after. A copy sent now would only join the same queue (a
        loaded 3-hop line answering seconds late had its custodian re-send most pushes, and every relay
        on it, the home too, handled each twice). That holds when the retry would take another next hop
        too: the copy would reach the same home, whose answers are part of the queue, and under load
        every backup path would carry every push twice. The retry of a push whose next hop went quiet
        or unresponsive, or answered a later push, or answered all the earlier ones (this one was lost),
        goes ahead; the push at the head of the queue waits only while its answer is not yet due (1.5x
        the queue's measured delay after it left, counted to the last frame this relay read). Looked
        at again after half the queue's measured delay (at least a retry period): a push lost in a
        long queue is re-sent about that soon after a later one is answered.
        """
        nh = c.sent_to
        cfg = self.config
        if nh is None or not cfg.adaptive_retry or c.home_down:
            return None
        st = self._linked.get(nh)
        if (st is None or st.queue_heard < now - cfg.custody_retry_s or st.queue_sent >= c.sent_at
                or self._rtt_rules.unresponsive(nh)):
            return None
        if self._queue_front(st) >= c.sent_at:
            # Nothing ahead of it: the head of the queue. Its answer is due about the queue's measured
            # delay after it left (the delay of the latest-sent push answered); until then it is next in
            # line, not lost, if the queue has moved since it left. After that, lost: C4's re-send.
            # Overdue only once this relay has read frames past that time: a relay that stalled (its
            # timers may run before it reads what came meanwhile) must not take its own pause for a
            # lost answer.
            due = c.sent_at + QUEUE_HEAD_SLACK * st.queue_delay
            if st.queue_heard <= c.sent_at or self._neighbours.heard_any() >= due:
                return None
            return max(due, now + QUEUE_REREAD_S)
        nxt = c.attempt + 1
        rid = c.push.route_id
        period = self._rtt_rules.retry_period(rid) if nxt < ROUTE_ATTEMPTS else cfg.custody_retry_s
        return now + max(period, QUEUE_LOOK * st.queue_delay)

    # Rule G12.
    def _park_withdrawn(self, c: Custody, now: float) -> list[Effect]:
        """c's route was withdrawn here as `home down` (withdrawals.py): nothing is sent; the route's
        restore (or a newer epoch or generation) wakes it (C3c), and until then its retries stay as
        scheduled and send nothing but a route request (G13: a live home of the route id, if one is
        reachable, issues a newer generation). (Not _await_route: no copy left, so a renewal older than
        the last copy would wake it again at once.)"""
        c.home_down = True  # woken, it follows the route (it never widens)
        self._waiting_route.setdefault(c.push.route_id, set()).add(c.push.push_id)
        self._count("custody_parked_withdrawn")
        return self._withdrawals.wanted(c.push.route_id, now)

    # Rule C3c.
    def _forget_waiting(self, c: Custody) -> None:
        waiting = self._waiting_route.get(c.push.route_id)
        if waiting is not None:
            waiting.discard(c.push.push_id)
            if not waiting:
                del self._waiting_route[c.push.route_id]

    def home_down(self, c: Custody, now: float) -> None:
        """A relay on the route answered `home unreachable` for this push (or this relay is the home's
        silent neighbour): custody waits on the route (C3)."""
        c.home_down = True
        self.await_route(c, now)

    def await_route(self, c: Custody, now: float) -> None:
        """The push's last copy failed (a route error came back) and it waits for its scheduled retry:
        a route renewal wakes it, and an answer about a route renewed after the copy left (the re-stem's
        flood overtook it) wakes it now."""
        rid = c.push.route_id
        renewed = self._renewed_at.get(rid)
        if renewed is not None and renewed > c.sent_at and c.next_retry > now:
            c.home_down = True  # the next attempt follows the (new) route, as after `home unreachable`
            c.next_retry = now
            self._schedule(c.push.push_id, now)
            self._count("custody_woken")
            return
        self._waiting_route.setdefault(rid, set()).add(c.push.push_id)

    def route_renewed(self, rid: bytes, now: float) -> None:
        """Rule C3c: a new epoch or route generation of rid reached this relay (a refresh, or the home's
        re-stem around a failed stem relay, G10): pushes in custody here whose last copy failed (`home
        unreachable`, `next hop down`, or parked) are re-sent now along the new route, not at their
        scheduled, backed-off retry (churn-10k with the stem on: pushes late by 10-20 s after the
        re-stem had come)."""
        self._renewed_at.put(rid, now)
        waiting = self._waiting_route.pop(rid, None)
        if waiting is None:
            return
        for pid in waiting:
            c = self._custody.get(pid)
            if c is not None and c.next_retry > now:
                c.home_down = True  # the next attempt follows the new route (it never widens)
                c.next_retry = now
                self._schedule(pid, now)
                self._count("custody_woken")

    # Rule C2.
    def _schedule(self, pid: bytes, when: float) -> None:
        self._custody.schedule(pid, when)
