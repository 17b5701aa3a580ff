"""Membership, rules M1-M7 (HyParView-like): the active and passive views, links up and down,
reconnection, the outbound quota, priority joins and peer exchange. Keepalive liveness (M2) is
checked in the engine's timer (engine.Engine._tick)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from inri.core.api import (
    Connect,
    Disconnect,
    DisconnectReason,
    Effect,
    Send,
)
from inri.core.gossip import ANNOUNCE_SHARE
from inri.core.neighbours import RECONNECT_BASE_S
from inri.core.state import (
    EngineContext,
    Neighbour,
    RuleGroup,
)
from inri.core.sync import SYNC, SYNC_WINDOW_S
from inri.protocol import limits
from inri.protocol.messages import (
    Hello,
    PeerExchange,
    PeerInfo,
)

if TYPE_CHECKING:  # annotations only (the groups import each other: Engine.__init__ wires them)
    from inri.core.custody import CustodyRules
    from inri.core.gossip import GossipRules
    from inri.core.homed import HomedRoutes
    from inri.core.neighbours import Neighbours
    from inri.core.rtt import RttRules
    from inri.core.scoring import ScoringRules
    from inri.core.stem import StemRules
    from inri.core.stemstate import StemState
    from inri.core.syncstate import SyncState
    from inri.core.tree import TreeGossip
    from inri.core.withdrawals import Withdrawals

PROBATION_S = 2.0  # a full relay waits this long for a "low" Hello on an inbound link (rule M4)
MAKE_ROOM_INTERVAL_S = 60.0  # a full relay makes room for a "low" relay at most this often
LOW = "low"  # Hello feature: the dialler is below active_min
BACK = "back"  # Hello feature: the dialler re-dials a lost neighbour (rule M6)
# Rule M6: for this long after it starts, a full relay lets former neighbours back in ("back" Hello),
# at most active_max of them: a restarted relay's view was filled by whoever dialled first, while its
# former neighbours still hold routes through it (a restarted home refused them as "full").
REJOIN_WINDOW_S = 60.0
# Rule M7: a candidate that refused our link as full is not dialled again for FULL_BACKOFF_MIN_S, then
# twice as long after each further refusal, up to FULL_BACKOFF_MAX_S. A relay below active_min re-dialled
# full relays each time a bootstrap or peer exchange listed them again (every few seconds), for as long
# as the mesh stayed full. Short at first: a full relay often has room again seconds later (a restarted
# relay's former neighbours: a flat 60 s kept it from its next hops, and pushes searched meanwhile).
FULL_BACKOFF_MIN_S = 2.0
FULL_BACKOFF_MAX_S = 60.0
FULL_REMEMBERED_MAX = 256  # candidates remembered as full (the oldest forgotten first)
# Links that ended for these reasons take their route claims with them (peer_down).
_PURGE_ON_DOWN = frozenset((DisconnectReason.MAKE_ROOM, DisconnectReason.OUTBOUND_QUOTA))
# Rule C8: links that failed (the neighbour may be gone for good), not links closed on purpose.
_FAILED = frozenset((DisconnectReason.KEEPALIVE_TIMEOUT, DisconnectReason.LINK_LOST))
# Links that ended for these reasons are not re-dialled.
_NO_REDIAL = frozenset((DisconnectReason.FULL, DisconnectReason.OUTBOUND_QUOTA, DisconnectReason.SCORE,
                        DisconnectReason.BANNED, DisconnectReason.MAKE_ROOM))

class MembershipRules(RuleGroup):
    """M1-M7: who this relay is linked to (the tables: neighbours.Neighbours, held as _neighbours)."""

    # The state this rule group owns (tests/test_core_owners.py; Engine.__init__ builds it).
    _near: dict[str, int]  # candidates a proximity-ranked source called near -> rank (rule M5)
    _far: set[str]  # peers dialled as far links (up or being dialled; rule M5)
    _next_make_room: float
    _next_rejoin: float
    _started_at: float  # M6: when start() ran
    # M7: candidate that refused us as full -> (not dialled until, the backoff that gave it)
    _full_until: dict[str, tuple[float, float]]
    _rejoined: set[str]  # former neighbours let back in since (M6)
    _next_exchange: float  # M1: when the next peer exchange is due
    _next_tick: float | None  # M2: when keepalives, liveness and the other periodic work are next due

    # The rule groups this one calls (given by `wire`).
    _custody_rules: CustodyRules
    _gossip_rules: GossipRules
    _rtt_rules: RttRules
    _scoring_rules: ScoringRules
    _stem_rules: StemRules

    def __init__(self, ctx: EngineContext, homed: HomedRoutes, neighbours: Neighbours, stem: StemState,
                 sync: SyncState, tree: TreeGossip, withdrawals: Withdrawals, listen_addr: str) -> None:
        super().__init__(ctx)
        self._withdrawals = withdrawals
        self._homed = homed
        self._neighbours = neighbours
        self._stem = stem
        self._sync = sync
        self._tree = tree
        self.listen_addr = listen_addr
        self._near: dict[str, int] = {}  # candidates ranked near by a bootstrap -> rank (rule M5)
        self._far: set[str] = set()  # peers dialled as the far link(s) (rule M5)
        self._next_tick: float | None = None
        self._next_exchange = 0.0  # M1's peer exchange
        self._next_make_room = 0.0
        self._next_rejoin = 0.0  # M6, the other side: its own limiter
        self._started_at = 0.0  # M6: former neighbours get back in for a while after start()
        self._rejoined: set[str] = set()
        self._full_until: dict[str, tuple[float, float]] = {}  # M7: candidates that refused us as full

    def wire(self, *, custody: CustodyRules, gossip: GossipRules, rtt: RttRules, scoring: ScoringRules,
             stem: StemRules) -> None:
        """The other rule groups this one calls (Engine.__init__, once all are built)."""
        self._custody_rules = custody
        self._gossip_rules = gossip
        self._rtt_rules = rtt
        self._scoring_rules = scoring
        self._stem_rules = stem

    # Rule M2.
    def _arm_tick(self, now: float) -> None:
        """Run the periodic tick one keepalive interval from now, unless it is armed already."""
        if self._next_tick is None:
            self._next_tick = now + self.config.keepalive_interval_s

    def tick_at(self) -> float | None:
        """When the periodic tick is next due (None: not armed: no neighbour, nothing dialled)."""
        return self._next_tick

    def set_tick(self, at: float | None) -> None:
        """The tick that just ran re-arms itself for `at` (None: nothing left to watch)."""
        self._next_tick = at

    # Rule M1.
    def add_candidates(self, peers: list[PeerInfo], now: float, *, near: int = 0) -> list[Effect]:
        """Relays learned from a bootstrap list, a scenario or peer exchange: into the passive view.

        `near`: the first `near` peers are proximity-ranked, nearest first (a bootstrap's answer lists
        ceil(count/2) nearest, then random others: bootstrap_nodes/ranking.py). Rule M5 dials them first,
        but keeps `far_links` dialled links to candidates not known to be near (the small world).
        """
        nb = self._neighbours
        near_rank = self._near
        for i, p in enumerate(peers):
            if p.node_id == self.relay_id or not nb.add_candidate(p.node_id, p.addr):
                continue
            if i < near:
                near_rank.pop(p.node_id, None)
                near_rank[p.node_id] = i
        nb.trim_candidates(self.config.passive_max)
        if len(near_rank) > 2 * self.config.passive_max:  # bounded: forget the oldest flags
            passive = nb.passive()
            for peer in list(near_rank)[: len(near_rank) - 2 * self.config.passive_max]:
                if peer not in passive:
                    del near_rank[peer]
        return self.refill(now)

    # Rule M1.
    def start(self, now: float, *, sync_routes: bool = True) -> list[Effect]:
        """Begin: arm timers and Connect to passive candidates until active_min links are wanted.

        sync_routes: ask the neighbours whose links come up in the next SYNC_WINDOW_S for the routes they
        hold (rule G11, `[engine] route_sync`); False when every relay of a mesh starts at once (a
        simulation's or MiniNet's first start: nobody holds routes yet)."""
        self._arm_tick(now)
        out: list[Effect] = []
        if sync_routes and self.config.route_sync:
            self._sync.open_window(now + SYNC_WINDOW_S)
            # G11: links that came up before start (a daemon accepts links while it restores custody)
            for peer in sorted(self._linked):
                self._sync.ask(peer)
                out.append(Send(peer, Hello(limits.PROTOCOL_VERSION, self.relay_id, self.listen_addr, (SYNC,))))
        self._started_at = now  # M6
        self._next_exchange = now + self.config.peer_exchange_interval_s * (0.5 + self._rng.random())
        return out + self.refill(now)

    # Rule M1.
    def refill(self, now: float) -> list[Effect]:
        """Dial candidates (former neighbours first) until the active view and the dials under way reach active_max."""
        out: list[Effect] = []
        nb = self._neighbours
        have = nb.links_and_dials()
        if have < self.config.active_max and nb.any_lost():
            active = nb.active()
            for peer, addr, retry_at in nb.lost_by_retry():
                if have >= self.config.active_max or retry_at > now:
                    break
                if not nb.dialling(peer) and peer not in active:
                    nb.dial(peer, now + self.config.connect_timeout_s)
                    out.append(Connect(peer, addr))
                    have += 1
        want = self.config.active_min - have
        passive = nb.passive()
        if want <= 0 or not passive:
            return out
        full = self._full_until
        choices = [p for p in passive if not nb.dialling(p)
                   and not (full and p in full and full[p][0] > now)]
        self._rng.shuffle(choices)
        if self._near:
            choices = self._proximity_order(choices)
        for peer in choices[:want]:
            nb.dial(peer, now + self.config.connect_timeout_s)
            out.append(Connect(peer, passive[peer]))
        return out

    # Rule M5.
    def _proximity_order(self, shuffled: list[str]) -> list[str]:
        """Candidates to dial, best first: while fewer than far_links of our links (up or being dialled)
        are far ones, a random candidate not known to be near first (it becomes a far link); then the
        near ones, nearest first; then the rest at random.

        Proximity alone builds a grid whose diameter grows with the square root of the mesh (the
        issue-17 meshes: 13.5 hops at 5k relays, eccentricity 26); one random long link per relay
        keeps it a small world (Kleinberg; HyParView's random walks), logarithmic in the relays.
        """
        near_rank = self._near
        far = self._far
        nb = self._neighbours
        for p in [p for p in far if p not in nb.active() and not nb.dialling(p)]:
            far.discard(p)
        near = sorted((p for p in shuffled if p in near_rank), key=near_rank.__getitem__)
        others = [p for p in shuffled if p not in near_rank]
        if len(far) < self.config.far_links and others:
            far.add(others[0])
            return [others[0], *near, *others[1:]]
        return near + others

    # Rules M1, M3, M4.
    def peer_up(self, peer: str, now: float, *, outbound: bool, addr: str = "") -> list[Effect]:
        """A link to peer is open (we dialled it: outbound=True). Beyond active_max it is refused (Disconnect)."""
        nb = self._neighbours
        nb.dial_ended(peer)
        active = nb.active()
        if peer in active or peer == self.relay_id:
            return []
        out: list[Effect] = []
        if nb.refused_for_ban(peer, now):
            self._count("peer_refused_banned")
            return [Disconnect(peer, DisconnectReason.BANNED)]
        if len(active) >= self.config.active_max:
            # Full. An outbound link still gets in while we hold fewer than outbound_min dialled links,
            # by evicting an inbound one: inbound connections alone can never take over the view.
            dialled = sum(1 for st in active.values() if st.outbound)
            inbound = sorted(p for p, st in active.items() if not st.outbound)
            if not (outbound and dialled < self.config.outbound_min and inbound):
                if not outbound and nb.is_lost(peer) and now >= self._next_rejoin:
                    # M6 (the other side): a neighbour we lost to a link failure dials us back before
                    # our own re-dial reached it (it restarted: it does not know us, so no "back" in
                    # its Hello). Holding it on probation would swallow our re-dial too (the link
                    # exists), and a home kept out so would stay unreachable from here. One such
                    # eviction per MAKE_ROOM_INTERVAL_S, counted apart from the "low" relays' (M4): a
                    # mesh that formed a minute ago made room for those, and a relay restarted then
                    # found every former neighbour closed to it (its restored routes' next hops).
                    return self._rejoin(peer, now, addr)
                if not outbound and not nb.on_probation(peer):
                    # M4: wait for the dialler's Hello: a relay below active_min gets in anyway.
                    nb.hold(peer, now + PROBATION_S, addr)
                    self._arm_tick(now)
                    return []
                self._count("peer_refused_full")
                if addr:
                    nb.offer_candidate(peer, addr)
                return [Disconnect(peer, DisconnectReason.FULL)]
            victim = self._rng.choice(inbound)
            out.append(Disconnect(victim, DisconnectReason.OUTBOUND_QUOTA))
            out += self.peer_down(victim, now, DisconnectReason.OUTBOUND_QUOTA)
        back = nb.admit(peer) and outbound
        # M4: tell a full relay we are short of neighbours, so it makes room; M6: that we were its
        # neighbour (it may have restarted and been filled by others); G11: ask for its routes.
        sync = self._sync.wanted(now)
        features = ((LOW,) if outbound and len(active) < self.config.priority_join_below else ()) + (
            (BACK,) if back else ()) + ((SYNC,) if sync else ()) + self._withdrawals.features()  # G12
        if sync:
            self._sync.ask(peer)
        if features:
            out.append(Send(peer, Hello(limits.PROTOCOL_VERSION, self.relay_id, self.listen_addr, features)))
        nb.link(peer, Neighbour(addr, outbound, now, self.config.reg_budget_peer_burst,
                                self.config.push_budget_peer_burst))
        out += self._withdrawals.link_up(now)  # G12: routes withdrawn here through it are back
        if self._homed.any() or self._stem.holds_any():  # rule G5: a new neighbour learns the routes homed here (paced:
            # the rest on ticks); with the stem on, stem relays announce the stem routes they hold too
            self._homed.queue(peer, self._stem.held_ids())
            out += self._gossip_rules.announce_homed(peer, now, ANNOUNCE_SHARE * self.config.reg_budget_peer_burst)
        self._arm_tick(now)
        if self._level:
            self._trace(now, "peer_up", peer=peer, reason="outbound" if outbound else "inbound")
        return out

    # Rule M1.
    def peer_down(self, peer: str, now: float, reason: DisconnectReason) -> list[Effect]:
        """The link to peer closed or failed: refill the active view (passive view, lost neighbours)."""
        nb = self._neighbours
        state = nb.unlink(peer)
        if reason == DisconnectReason.FULL:  # M7: it refused us as full: not dialled again for a while
            full = self._full_until
            last = full.pop(peer, None)
            # doubled after each refusal in a row; a refusal long after the last backoff ended starts over
            wait = (FULL_BACKOFF_MIN_S if last is None or now - last[0] > FULL_BACKOFF_MAX_S
                    else min(FULL_BACKOFF_MAX_S, 2 * last[1]))
            full[peer] = (now + wait, wait)
            while len(full) > FULL_REMEMBERED_MAX:
                del full[next(iter(full))]
        if state is None:
            return self.refill(now)
        self._homed.drop_peer(peer)
        self._sync.link_down(peer)  # G11: asked and answered again on a later link
        self._tree.peer_down(peer)  # G9 (tree.py)
        # When it went down: a one-hop route through it (it was the home) is reported `home unreachable`
        # for a while, then searched for (forwarding.py, rule F3). Old entries go (bounded).
        nb.went_down(peer, now, 4 * self.config.active_max + self.config.passive_max)
        # G12: before a purge takes its claims (a home dying is often blamed first); a link we cut ourselves
        # leaves its home up.
        out = self._withdrawals.link_down(peer, now, home=reason not in _PURGE_ON_DOWN)
        # A link the other side closed as full, or for our score, is not re-dialled (the reason is
        # ours, or the remote's: a driver passes it on).
        if state.score <= self.config.score_prefer_below or reason in _PURGE_ON_DOWN:
            # Route claims leave with a distrusted neighbour (a liar that claimed to be a home and then
            # dropped the link) and with a live one we dropped ourselves: either way we must not
            # report its routes' homes unreachable ("home unreachable" means the home went down).
            self._scoring_rules.purge_routes(peer)
        if state.addr and reason not in _NO_REDIAL:
            nb.lose(peer, state.addr, now + RECONNECT_BASE_S)
        if self._level:
            self._trace(now, "peer_down", peer=peer, reason=reason)
        out += self._rtt_rules.reroute_awaited(peer, now) + self.refill(now)  # rtt.py (C5)
        if reason in _FAILED:  # C8: the pushes it held whose route attempts passed here (custody.py)
            out += self._custody_rules.adopt_from(peer, now)
        if self._stem.has_successors():  # G10, G10b: a stem successor lost (stem.py)
            out += self._stem_rules.stem_successor_down(peer, now)
        return out

    # Rule M1.
    def connect_failed(self, peer: str, now: float) -> list[Effect]:
        """A Connect effect did not produce a link: back off (former neighbour) or forget the candidate."""
        nb = self._neighbours
        nb.dial_ended(peer)
        nb.forget_candidate(peer)
        nb.redial_failed(peer, now)  # M6: a former neighbour is re-dialled later, or given up
        return self.refill(now)

    # Rule M6.
    def _rejoin(self, peer: str, now: float, addr: str) -> list[Effect]:
        """Let the lost neighbour peer back in, in place of a random neighbour (made room for)."""
        self._next_rejoin = now + MAKE_ROOM_INTERVAL_S
        active = self._linked
        victim = self._rng.choice(sorted(active))
        victim_addr = active[victim].addr
        self._count("peer_rejoined")
        out: list[Effect] = [Disconnect(victim, DisconnectReason.MAKE_ROOM),
                             *self.peer_down(victim, now, DisconnectReason.MAKE_ROOM)]
        out += self.peer_up(peer, now, outbound=False, addr=addr)
        if victim_addr:
            self._neighbours.keep_candidate(victim, victim_addr)
        return out

    # Rule M4.
    def on_probation_hello(self, peer: str, msg: Hello, now: float) -> list[Effect]:
        """M4: a Hello on an inbound link held while full. "low": make room; otherwise refuse ("back": M6;
        only "sync": the probation goes on, G11)."""
        nb = self._neighbours
        until, addr = nb.end_probation(peer)
        active = nb.active()
        if (BACK in msg.features and now < self._started_at + REJOIN_WINDOW_S
                and len(self._rejoined) < self.config.active_max):
            # M6: a former neighbour is let back in; it takes the place of one that is not.
            others = sorted(p for p in active if p not in self._rejoined)
            if others:
                self._rejoined.add(peer)
                self._count("peer_rejoined")
                victim = self._rng.choice(others)
                victim_addr = active[victim].addr
                out: list[Effect] = [Disconnect(victim, DisconnectReason.MAKE_ROOM),
                                     *self.peer_down(victim, now, DisconnectReason.MAKE_ROOM)]
                out += self.peer_up(peer, now, outbound=False, addr=addr)
                if victim_addr:
                    nb.keep_candidate(victim, victim_addr)
                return out
        if SYNC in msg.features and LOW not in msg.features and BACK not in msg.features:
            # A Hello only asking for routes (G11, a relay in its first minute) claims no room: the
            # probation runs its course, as for a relay that says nothing (refusing it at once made relays
            # cycle through full candidates faster and pick far ones: a built mesh lost its proximity).
            nb.hold(peer, until, addr)
            return []
        if LOW not in msg.features or not active or now < self._next_make_room:
            self._count("peer_refused_full")
            return [Disconnect(peer, DisconnectReason.FULL)]
        # At most one eviction per MAKE_ROOM_INTERVAL_S: a relay cut everywhere for its behaviour is
        # "low" too, and must not be able to churn honest links at will.
        self._next_make_room = now + MAKE_ROOM_INTERVAL_S
        victim = self._rng.choice(sorted(active))
        victim_addr = active[victim].addr
        self._count("peer_made_room")
        out = [Disconnect(victim, DisconnectReason.MAKE_ROOM),
                             *self.peer_down(victim, now, DisconnectReason.MAKE_ROOM)]
        out += self.peer_up(peer, now, outbound=False, addr=addr)
        if victim_addr:
            nb.keep_candidate(victim, victim_addr)  # still a good candidate for later
        return out

    # Rule M1.
    def exchange_due(self, now: float) -> list[Effect]:
        """A peer exchange with a random neighbour, when one is due (every peer_exchange_interval_s)."""
        if now < self._next_exchange or not self._linked:
            return []
        self._next_exchange = now + self.config.peer_exchange_interval_s
        return self._peer_exchange(now)

    def _peer_exchange(self, now: float) -> list[Effect]:
        active = self._linked
        target = self._rng.choice(sorted(active))
        pool = [PeerInfo(p, st.addr) for p, st in active.items() if p != target and st.addr]
        pool += [PeerInfo(p, a) for p, a in self._neighbours.passive().items() if p != target and a]
        if self.listen_addr:
            pool.append(PeerInfo(self.relay_id, self.listen_addr))
        if not pool:
            return []
        sample = self._rng.sample(pool, min(len(pool), limits.MAX_PEERS_IN_EXCHANGE // 2))
        self._linked[target].last_sent = now  # M2
        return [Send(target, PeerExchange(tuple(sample)))]
