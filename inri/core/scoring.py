"""Peer scoring, rules S1-S2 (zero trust between relays): what a neighbour's behaviour costs or earns
it, and what a low score takes away (preference, then the link). Score events are listed in
docs/protocol.md ("Peer scoring"); their values are EngineConfig.score_*."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

from inri.core.api import (
    Disconnect,
    DisconnectReason,
    Effect,
)
from inri.core.state import (
    EngineContext,
    RuleGroup,
)
from inri.core.tables import BoundedMap

if TYPE_CHECKING:  # annotations only (the groups import each other: Engine.__init__ wires them)
    from inri.core.awaited import AwaitedAnswers
    from inri.core.membership import MembershipRules
    from inri.core.neighbours import Neighbours
    from inri.core.syncstate import SyncState
    from inri.core.tables import CompactRouteTable, RouteTable
    from inri.core.withdrawals import Withdrawals

# Slowness is not silence (rule S1). A neighbour whose answers come, but late, is given a longer
# grace before a missing answer counts against it: SLOW_GRACE_FACTOR times its measured answer delay,
# at least receipt_timeout_s and at most SLOW_GRACE_MAX_FACTOR times it (a hostile relay cannot buy
# unbounded patience by answering slowly). The grace applies only to a neighbour that answered since
# the push left and whose answers take more than receipt_timeout_s / SLOW_GRACE_FACTOR on average:
# a black hole never answers, and a fast neighbour that drops one push is blamed on time.
SLOW_GRACE_FACTOR = 3.0
SLOW_GRACE_MAX_FACTOR = 8.0
ANSWER_DELAY_WEIGHT = 0.2  # moving average weight of one answer's delay (adapts within ~10 answers)
NO_RECEIPT = "no_receipt"
# A neighbour is cut for missing answers (rule S2) only while it answers less than this share of the
# pushes it is judged on (answers and blames, decayed with the score's half-life). A black hole answers
# none; an honest relay behind lossy links or churned paths answers most (2% loss on a 15-hop path
# loses a quarter of pushes or their receipts) and keeps its link at a low score (preference lost).
# Measured before this rule: 28 honest links cut on a 1,500-relay 3-neighbour geographic mesh with 2%
# loss and 15% churn and no adversary, each a third of a relay's links.
BLACK_HOLE_SHARE = 0.1
# A missing answer costs score_no_receipt * (1 - share / ANSWERING_SHARE), share being the neighbour's
# answered share so far (the same decayed counts): nothing while it answers half of what it is sent,
# the full penalty when it answers nothing. A push and its receipt cross 2h links: with 2% loss on a
# 15-hop path only 0.98^30 = 55% of them come back from an honest neighbour, and at -1 per silence
# and +1 per answer every honest neighbour there would sink below score_prefer_below, pushing the
# relay into local repair floods. A black hole answers nothing and pays in full.
ANSWERING_SHARE = 0.5


class ScoringRules(RuleGroup):
    """S1: change a neighbour's score; S2: cut and ban it when the score falls too low."""

    # The state this rule group owns (tests/test_core_owners.py; Engine.__init__ builds it).
    _overdue: dict[bytes, tuple[str, float, float]]
    _overdue_heap: list[tuple[float, bytes]]
    _blamed: BoundedMap[bytes, tuple[str, float, float]]

    # The rule groups this one calls (given by `wire`).
    _membership_rules: MembershipRules

    def __init__(self, ctx: EngineContext, awaited: AwaitedAnswers, neighbours: Neighbours,
                 routes: RouteTable | CompactRouteTable, sync: SyncState, withdrawals: Withdrawals) -> None:
        super().__init__(ctx)
        self._withdrawals = withdrawals
        self._await = awaited
        self._neighbours = neighbours
        self._routes = routes
        self._sync = sync
        # Slow, not silent (rule S1, scoring.py): pushes past receipt_timeout_s whose next hop keeps
        # answering, slowly, get a longer grace: push id -> (next hop, sent, grace end), with a heap
        # (grace end, push id) for expiry; pushes blamed on a neighbour (push id -> (next hop, sent,
        # expiry)) are remembered so a late answer gives the penalty back.
        self._overdue: dict[bytes, tuple[str, float, float]] = {}
        self._overdue_heap: list[tuple[float, bytes]] = []
        self._blamed: BoundedMap[bytes, tuple[str, float, float]] = BoundedMap(self.config.reverse_max)

    def wire(self, *, membership: MembershipRules) -> None:
        """The other rule groups this one calls (Engine.__init__, once all are built)."""
        self._membership_rules = membership

    # Rules S1, S2.
    def score(self, peer: str, delta: float, now: float, reason: str) -> list[Effect]:
        """Change peer's score (rule S1); cut and ban it when the score falls too low (S2)."""
        state = self._linked.get(peer)
        if state is None:
            return []
        cfg = self.config
        state.score = min(cfg.score_max, state.score + delta)
        if delta < 0:
            self._count("score_" + reason)
        if state.score > cfg.score_disconnect_below:
            return []
        if reason == NO_RECEIPT and len(self._linked) <= 1:
            # Never cut the last link for missing receipts: with no other neighbour, cutting it cannot
            # route a push anywhere better, and a slow path is far likelier than a lone black hole.
            state.score = cfg.score_disconnect_below - delta / 2
            self._count("peer_cut_spared_last_link")
            return []
        if reason == NO_RECEIPT and state.answers > BLACK_HOLE_SHARE * (state.answers + state.silences):
            # It answers: a lossy or churned path behind it, not a black hole. It keeps the link at the
            # floor of the score (it is a next hop only when no other is alive).
            state.score = cfg.score_disconnect_below - delta / 2
            self._count("peer_cut_spared_answering")
            return []
        self._count("peer_cut_score")
        self._neighbours.ban(peer, now + cfg.score_ban_s)  # and no candidate any more
        # G12: before the purge takes its claims, and as `no route` only: a relay cut for its score is no
        # witness that the homes it claims are down (a hijacker claims every route at hop 0: taking its cut
        # as `home down` parked honest pushes for homes that were up, 8 lost on forger-1k).
        withdrawn = self._withdrawals.link_down(peer, now, home=False)
        self.purge_routes(peer)
        if self._level:
            self._trace(now, "peer_scored", peer=peer, reason=reason, count=int(state.score))
        return [Disconnect(peer, DisconnectReason.SCORE), *withdrawn,
                *self._membership_rules.peer_down(peer, now, DisconnectReason.SCORE)]

    # Rule S1.
    def link_congested(self, peer: str, now: float) -> list[Effect]:
        """The driver's bounded send queue for peer dropped frames: peer does not read (rule S1).

        A modest penalty (score_congested), at most once per keepalive interval however often the
        driver reports, so only a neighbour that stays congested loses preference and then the link.
        """
        state = self._linked.get(peer)
        if state is None or now - state.congested_at < self.config.keepalive_interval_s:
            return []
        state.congested_at = now
        return self.score(peer, self.config.score_congested, now, "congested")

    # Rule S2.
    def purge_routes(self, peer: str) -> None:
        """Forget every route claim of a neighbour cut for its score (O(routes); cuts are rare).

        A liar's claims must not outlive its link: a neighbour that claimed to be the home (distance 1
        here) would otherwise make this relay report the home unreachable once the liar is gone. The
        feasibility distance becomes that of the next hops left (none left: unknown), as in Babel.
        """
        purged = self._routes.purge(peer)
        if purged:
            self._count("routes_purged", purged)
        self._sync.purge(peer)  # G11: its provisional routes go too

    # Rule S1 (an answer).
    def answered(self, peer: str, pid: bytes, now: float, *, reward: bool = True, any_peer: bool = False) -> bool:
        """An answer (receipt or route error) for push pid came back from peer.

        True when pid was awaited from peer: on time, in a slow neighbour's grace, or already blamed
        (a late answer gives the penalty back: slowness is not silence). The answer's delay feeds the
        neighbour's measured answer delay; reward: it earns score_receipt. any_peer: the push is no
        longer awaited whoever answered (a receipt settles it; the awaited neighbour earns nothing).
        """
        cfg = self.config
        credit = 0.0
        waited = self._await.get(pid)
        if waited is not None:
            if waited[0] != peer:
                if any_peer:
                    self._await.discard(pid)
                return False
            self._await.discard(pid)
            sent = waited[2]
        else:
            late = self._overdue.get(pid)
            if late is not None:
                if late[0] != peer:
                    if any_peer:
                        del self._overdue[pid]
                    return False
                del self._overdue[pid]
                sent = late[1]
                self._count("receipt_in_grace")
            else:
                blamed = self._blamed.get(pid)
                if blamed is None or blamed[0] != peer:
                    return False
                del self._blamed[pid]
                sent = blamed[1]
                credit = -cfg.score_no_receipt
                self._count("receipt_late_credited")
                st = self._linked.get(peer)
                if st is not None and st.silences >= 1.0:
                    st.silences -= 1.0  # it was not silent after all
        state = self._linked.get(peer)
        if state is not None:
            state.answers += 1.0
            state.answered_at = now
            state.answer_delay += ANSWER_DELAY_WEIGHT * ((now - sent) - state.answer_delay)
            gain = credit + (cfg.score_receipt if reward else 0.0)
            if gain:
                self.score(peer, gain, now, "receipt")  # a rise: never cuts
        return True

    # Rule S1 (slow or silent).
    def _grace_end(self, peer: str, sent: float, wait: float | None = None) -> float:
        """Until when a push sent to peer at `sent` may still be answered before peer is blamed.

        wait: the push's own answer timeout (rule F6: shorter the further it travelled)."""
        cfg = self.config
        st = self._linked.get(peer)
        timeout = cfg.receipt_timeout_s
        if st is None or st.answered_at <= sent or SLOW_GRACE_FACTOR * st.answer_delay <= timeout:
            return sent + (timeout if wait is None else wait)
        return sent + min(SLOW_GRACE_FACTOR * st.answer_delay, SLOW_GRACE_MAX_FACTOR * timeout)

    # Rule S1 (slow or silent).
    def receipt_overdue(self, pid: bytes, peer: str, sent: float, now: float,
                         wait: float | None = None) -> list[Effect]:
        """No answer from peer for push pid within receipt_timeout_s: wait longer if peer is slow but
        answering, otherwise blame it (score_no_receipt)."""
        st = self._linked.get(peer)
        # Only a neighbour heard from since the push went out is suspect: a silent one is more
        # likely down (keepalives will tell) than a black hole.
        if st is None or st.last_heard <= sent:
            return []
        end = self._grace_end(peer, sent, wait)
        if end > now and len(self._overdue) < self.config.reverse_max:
            self._count("push_answer_late_wait")
            self._overdue[pid] = (peer, sent, end)
            heapq.heappush(self._overdue_heap, (end, pid))
            return []
        return self._blame(pid, peer, sent, now)

    def _blame(self, pid: bytes, peer: str, sent: float, now: float) -> list[Effect]:
        self._count("push_no_answer")
        self._blamed.put(pid, (peer, sent, now + self.config.reverse_ttl_s))
        state = self._linked.get(peer)
        factor = 1.0
        if state is not None:
            judged = state.answers + state.silences
            if judged:
                factor = max(0.0, 1.0 - state.answers / judged / ANSWERING_SHARE)
            state.silences += 1.0
        if not factor:
            self._count("push_no_answer_forgiven")
            return []
        return self.score(peer, self.config.score_no_receipt * factor, now, NO_RECEIPT)

    # Rule S1 (slow, not silent).
    def in_grace(self, pid: bytes) -> bool:
        """True when push pid's next hop, slow but answering, has a longer grace for it (not blamed yet)."""
        return pid in self._overdue

    # Rule S1.
    def sweep_scores(self, now: float) -> None:
        """Forget the blames (pushes blamed on a neighbour) too old for a late answer to give back."""
        self._blamed.sweep(lambda v: v[2] <= now)

    # Rule S1 (slow or silent).
    def grace_expired(self, now: float) -> list[Effect]:
        """Blame the neighbours whose grace for a push ended without an answer."""
        out: list[Effect] = []
        heap = self._overdue_heap
        if not heap:
            return out
        while heap and heap[0][0] <= now:
            end, pid = heapq.heappop(heap)
            late = self._overdue.get(pid)
            if late is None or late[2] != end:
                continue  # answered meanwhile
            del self._overdue[pid]
            st = self._linked.get(late[0])
            if st is not None and st.last_heard > late[1]:
                out += self._blame(pid, late[0], late[1], now)
        return out

    # Rules S1, C2 (a custodian waits for a slow next hop instead of re-sending into it).
    def answer_expected(self, pid: bytes, now: float) -> float | None:
        """When a push overdue from a slow but answering next hop stops being awaited (None: it is
        not, so a custody retry goes ahead)."""
        late = self._overdue.get(pid)
        if late is not None:
            return late[2] if late[2] > now else None
        waited = self._await.get(pid)
        if waited is None:
            return None
        end = self._grace_end(waited[0], waited[2], waited[1] - waited[2])
        return end if end > waited[1] and end > now else None  # only a slow neighbour's longer grace
