"""Round trips, rules C4-C5: retries that follow the path round trips a relay measures.

C4. A custodian re-sends a push along its route when no receipt came back within the route's
    expected round trip, not after a fixed period: retry period = clamp(d x (srtt + 4 x rttvar),
    receipt_timeout_min_s, custody_retry_s), with d the route's distance (links to the home) and
    srtt / rttvar a per-link round-trip estimate (RFC 6298's smoothing, alpha 1/8, beta 1/4) fed by
      - every receipt that comes back through a neighbour this relay forwarded the push to: the delay
        since the forward divided by the links still ahead then (receipt hops - hops at the forward),
        first attempts only (Karn: a re-sent push's receipt may answer either copy);
      - until the first such receipt, keepalive round trips on its own links (a prior for a relay that
        never forwarded a push; its own links are not the path's, so receipts replace them).
    Before the first sample the period is custody_retry_s (the fixed period of earlier versions). Ring
    searches (attempts 2 and later) keep custody_retry_s periods: their paths are not known. So do
    re-sends after `home unreachable`: a home that is down is not back within a round trip, and
    short periods would spend the whole escalation while it restarts (seen with real relays).
    Blame is not retimed: a forwarded push counts against its next hop only after receipt_timeout_s
    (and a slow answering neighbour's longer grace, rule S1), however early the custodian re-sends.
    A re-send is cheap (at most a duplicate the home answers `duplicate`), a blame can cut a link:
    a shorter retry period must not make scoring cut honest slow neighbours. A re-send to another
    next hop keeps the first next hop awaited, so a black hole is still blamed on time.
C5. A relay whose link goes down re-sends, at once, every route-mode push it forwarded on that link
    and still awaits an answer for, over another live next hop of the route (never back to the
    relay it came from): the custodian need not wait for its retry.
C6. A relay whose transport reports a neighbour unresponsive (`Engine.link_unresponsive`: nothing
    sent to it was acknowledged within the transport's loss detection; the daemon reports QUIC's
    second probe timeout in a row, about 3 x (link RTT + 26 ms), where keepalives take
    keepalive_interval_s x keepalive_misses) does what C5 does for a link that went down: it
    re-sends the route-mode pushes still awaited from it over another live next hop of their routes,
    at once (with none left, and unless it is the home: local repair, a radius-2 search as in F3,
    once per attempt). The link stays up (keepalives still decide), but the neighbour is a suspect next hop, used
    only as a low-scored one is (rule S2: when no other is alive), until a frame from it arrives.
    Under churn the pushes that met a relay that had just died were most of the latency tail: the
    custodian's retry came 0.6-1.9 s after the push, the link's keepalive timeout seconds later.

C4b. With the stem on, a route's distance is not its length: the flood starts at 2 + U{0..stem_hop_noise}
    hops (G6), and a stem relay is at distance 2 whatever the stem's length. The custodian then takes
    d = the hops of the last receipt that came back for the route id (the links the push took to the
    home, stem included), when that is the smaller; before the first receipt, the distance.

With `adaptive_retry = false` the custodian re-sends after custody_retry_s periods as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from inri.core.api import Effect, Send
from inri.core.forwarding import LOCAL_REPAIR_RADIUS
from inri.core.state import EngineContext, Neighbour, RuleGroup, readdress
from inri.core.tables import RouteTable
from inri.protocol.messages import Push, Receipt

if TYPE_CHECKING:  # annotations only (the groups import each other: Engine.__init__ wires them)
    from inri.core.awaited import AwaitedAnswers
    from inri.core.forwarding import ForwardingRules
    from inri.core.reverse import ReversePaths
    from inri.core.roundtrip import RttEstimator
    from inri.core.seen import SeenCache
    from inri.core.tables import CompactRouteTable, RouteTable

_UNRESPONSIVE = "push_rerouted_unresponsive"  # rule C6's counter (and how reroute_awaited knows it)


class RttRules(RuleGroup):
    """C4-C6: retry periods from the round-trip estimate (RttEstimator), re-sends on link loss."""

    # The rule groups this one calls (given by `wire`).
    _forwarding_rules: ForwardingRules

    def __init__(self, ctx: EngineContext, awaited: AwaitedAnswers, reverse: ReversePaths,
                 routes: RouteTable | CompactRouteTable, rtt: RttEstimator, seen: SeenCache) -> None:
        super().__init__(ctx)
        self._await = awaited
        self._reverse = reverse
        self._routes = routes
        self._rtt = rtt
        self._seen = seen

    def wire(self, *, forwarding: ForwardingRules) -> None:
        """The other rule groups this one calls (Engine.__init__, once all are built)."""
        self._forwarding_rules = forwarding

    # Rule C4 (keepalive samples).
    def keepalive_answered(self, state: Neighbour, nonce: int, now: float) -> None:
        """A keepalive reply: one link round trip, if it answers the last keepalive we sent."""
        if nonce == state.nonce and state.ka_sent >= 0.0:
            self._rtt.sample(now - state.ka_sent, False)
            state.ka_sent = -1.0  # one sample per keepalive

    # Rule C4 (receipt samples).
    def receipt_rtt(self, peer: str, msg: Receipt, now: float) -> None:
        """A receipt from peer: a sample of the round trip over the links ahead of our forward."""
        waited = self._await.get(msg.push_id)
        if waited is None or waited[0] != peer:
            return
        sent_msg = waited[4]
        ahead = msg.hops - sent_msg.hops
        if sent_msg.attempt or ahead <= 0:
            return  # Karn: which copy answered is unknown; or a receipt that cannot be ours
        self._rtt.sample((now - waited[2]) / ahead, True)

    # Rule C4 (period).
    def retry_period(self, rid: bytes) -> float:
        """How long a custodian waits for the receipt of a push sent along rid's route."""
        rtt = self._rtt
        if not rtt.active():
            return self.config.custody_retry_s
        entry = self._routes.get(rid)
        if entry is None:
            return self.config.custody_retry_s
        return rtt.path_period(rtt.route_links(rid, RouteTable.distance(entry)))

    # Rule C6.
    def link_unresponsive(self, peer: str, now: float) -> list[Effect]:
        """The driver's transport got no acknowledgement from peer for what it sent (rule C6): peer is
        a suspect next hop until a frame from it arrives, and the pushes awaited from it go another way
        now. The link stays: keepalives decide whether peer is down (a lossy link recovers)."""
        st = self._linked.get(peer)
        if st is None or not self.config.adaptive_retry:
            return []
        st.unresponsive_at = now
        self._count("peer_unresponsive")
        if self._level:
            self._trace(now, "peer_unresponsive", peer=peer)
        return self.reroute_awaited(peer, now, _UNRESPONSIVE)

    # Rules C5, C6.
    def reroute_awaited(self, peer: str, now: float, counter: str = "push_rerouted_link_down") -> list[Effect]:
        """peer's link went down (C5), or peer is unresponsive (C6): re-send the route-mode pushes still
        awaited from it over another live next hop of their routes (peer is no longer active, or a
        suspect that next_hop passes over, so it is never chosen)."""
        if not self.config.adaptive_retry or not self._await:
            return []
        stranded = self._await.awaited_from(peer, now)
        out: list[Effect] = []
        for pid, msg in stranded:
            back = self._reverse.back(pid)
            prev = back[0] if back is not None and isinstance(back[0], str) else None
            nh = self._forwarding_rules.next_hop(msg.route_id, prev, alternate=(msg.attempt & 1) == 1)
            if nh is None:
                # No other way from here. The link that went was the home's own: say so upstream now
                # (its custodian keeps custody and retries when the home is back; nobody upstream
                # tears down its route). Otherwise the custodian's retry takes it from here (C5), or,
                # for an unresponsive next hop (C6), local repair asks the neighbourhood first.
                got = self._forwarding_rules.report_home_silent(pid, peer, now, msg.route_id)
                if got:
                    self._await.discard(pid)
                elif counter == _UNRESPONSIVE:
                    got = self.repair_stranded(msg, peer, prev, now)
                out += got
                continue
            self._await.discard(pid)
            self._count(counter)
            send: Send = self._forwarding_rules.forward(msg, nh, now)
            out.append(send)
        return out

    # Rule C6.
    def unresponsive(self, peer: str) -> bool:
        """True when the transport reported peer unresponsive and nothing came from it since."""
        st = self._linked.get(peer)
        return st is not None and st.unresponsive_at > st.last_heard

    # Rule C6 (local repair, as F3 does for a route with no live next hop).
    def repair_stranded(self, msg: Push, suspect: str, prev: str | None, now: float) -> list[Effect]:
        """A push for (msg: the copy sent on) the unresponsive next hop `suspect`, with no other next hop
        left here: ring copies of radius LOCAL_REPAIR_RADIUS around this relay (not back to prev), once
        per attempt, where the push would otherwise wait for its custodian's retry. Not when suspect is
        the home itself (its neighbour at distance 1): no search finds a home that stopped answering
        (its custodian hears `home unreachable`, C5's way, and retries later)."""
        entry = self._routes.get(msg.route_id)
        if (msg.registration is None or len(self._linked) < 2
                or self._seen.copy_seen(msg.push_id, msg.attempt, True)
                or (entry is not None and self._forwarding_rules.home_hop(msg.route_id, entry, suspect))):
            return []
        self._count("push_local_repair")
        self._seen.mark_ring(msg.push_id, msg.attempt, LOCAL_REPAIR_RADIUS, now)
        if prev is not None:
            self._forwarding_rules.watch_repair(msg, prev, now)  # F8
        copy = readdress(msg, msg.ttl, msg.hops, msg.attempt, LOCAL_REPAIR_RADIUS)
        return self._forwarding_rules.ring_flood(copy, prev, now)

    # Rule C4 (a re-send keeps the first next hop awaited).
    def keep_awaiting(self, pid: bytes, nh: str, now: float) -> bool:
        """True when push pid, about to be awaited from nh, is still awaited from another next hop:
        that one keeps its wait (forwarding.py, _await_answer). A copy re-sent early (C4) to another
        next hop must not let the first next hop off: a black hole is still blamed on time."""
        waited = self._await.get(pid)
        return (waited is not None and waited[0] != nh and waited[1] > now and self.config.adaptive_retry)
