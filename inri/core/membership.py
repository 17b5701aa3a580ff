"""Membership, rules M1-M7 (HyParView-like): the active and passive views, links up and down,
reconnection, the outbound quota, priority joins and peer exchange. Keepalive liveness (M2) is
checked in the engine's timer (engine.Engine._tick)."""

from __future__ import annotations

from inri.core.api import (
    Connect,
    Disconnect,
    DisconnectReason,
    Effect,
    Send,
)
from inri.core.gossip import ANNOUNCE_SHARE
from inri.core.state import (
    SWEEP_INTERVAL_S,
    EngineState,
    Neighbour,
)
from inri.core.sync import SYNC, SYNC_WINDOW_S
from inri.protocol import limits
from inri.protocol.messages import (
    Hello,
    PeerExchange,
    PeerInfo,
)

# Reconnecting to a lost neighbour: 2 s, 4 s, 8 s ... capped at 60 s, given up after 10 failures (~8 min).
RECONNECT_BASE_S = 2.0
RECONNECT_MAX_S = 60.0
RECONNECT_MAX_FAILURES = 10
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
# Links that ended for these reasons are not re-dialled.
_NO_REDIAL = frozenset((DisconnectReason.FULL, DisconnectReason.OUTBOUND_QUOTA, DisconnectReason.SCORE,
                        DisconnectReason.BANNED, DisconnectReason.MAKE_ROOM))

class MembershipRules(EngineState):
    """M1-M4: who this relay is linked to."""

    # The state this rule group owns (tests/test_core_owners.py; Engine.__init__ builds it).
    _near: dict[str, int]  # candidates a proximity-ranked source called near -> rank (rule M5)
    _far: set[str]  # peers dialled as far links (up or being dialled; rule M5)
    _next_make_room: float
    _next_rejoin: float
    _started_at: float  # M6: when start() ran
    # M7: candidate that refused us as full -> (not dialled until, the backoff that gave it)
    _full_until: dict[str, tuple[float, float]]
    _rejoined: set[str]  # former neighbours let back in since (M6)
    listen_addr: str
    _next_tick: float | None  # M2: when keepalives, liveness and the other periodic work are next due

    # Rule M2.
    def _arm_tick(self, now: float) -> None:
        """Run the periodic tick one keepalive interval from now, unless it is armed already."""
        if self._next_tick is None:
            self._next_tick = now + self.config.keepalive_interval_s

    def _tick_at(self) -> float | None:
        """When the periodic tick is next due (None: not armed: no neighbour, nothing dialled)."""
        return self._next_tick

    def _set_tick(self, at: float | None) -> None:
        """The tick that just ran re-arms itself for `at` (None: nothing left to watch)."""
        self._next_tick = at

    # Rule M1.
    def add_candidates(self, peers: list[PeerInfo], now: float, *, near: int = 0) -> list[Effect]:
        """Relays learned from a bootstrap list, a scenario or peer exchange: into the passive view.

        `near`: the first `near` peers are proximity-ranked, nearest first (a bootstrap's answer lists
        ceil(count/2) nearest, then random others: bootstrap_nodes/ranking.py). Rule M5 dials them first,
        but keeps `far_links` dialled links to candidates not known to be near (the small world).
        """
        banned = self._banned
        near_rank = self._near
        for i, p in enumerate(peers):
            if p.node_id == self.relay_id or p.node_id in self._active or (banned and p.node_id in banned):
                continue
            self._passive.pop(p.node_id, None)
            self._passive[p.node_id] = p.addr
            if i < near:
                near_rank.pop(p.node_id, None)
                near_rank[p.node_id] = i
        while len(self._passive) > self.config.passive_max:
            del self._passive[next(iter(self._passive))]
        if len(near_rank) > 2 * self.config.passive_max:  # bounded: forget the oldest flags
            for peer in list(near_rank)[: len(near_rank) - 2 * self.config.passive_max]:
                if peer not in self._passive:
                    del near_rank[peer]
        return self._refill(now)

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
            for peer in sorted(self._active):
                self._sync.ask(peer)
                out.append(Send(peer, Hello(limits.PROTOCOL_VERSION, self.relay_id, self.listen_addr, (SYNC,))))
        self._started_at = now  # M6
        self._next_sweep = now + SWEEP_INTERVAL_S
        self._next_exchange = now + self.config.peer_exchange_interval_s * (0.5 + self._rng.random())
        return out + self._refill(now)

    # Rule M1.
    def _refill(self, now: float) -> list[Effect]:
        out: list[Effect] = []
        have = len(self._active) + len(self._connecting)
        if have < self.config.active_max and self._lost:
            for peer, (addr, retry_at, _) in sorted(self._lost.items(), key=lambda kv: kv[1][1]):
                if have >= self.config.active_max or retry_at > now:
                    break
                if peer not in self._connecting and peer not in self._active:
                    self._connecting[peer] = now + self.config.connect_timeout_s
                    out.append(Connect(peer, addr))
                    have += 1
        want = self.config.active_min - have
        if want <= 0 or not self._passive:
            return out
        full = self._full_until
        choices = [p for p in self._passive if p not in self._connecting
                   and not (full and p in full and full[p][0] > now)]
        self._rng.shuffle(choices)
        if self._near:
            choices = self._proximity_order(choices)
        for peer in choices[:want]:
            self._connecting[peer] = now + self.config.connect_timeout_s
            out.append(Connect(peer, self._passive[peer]))
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
        for p in [p for p in far if p not in self._active and p not in self._connecting]:
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
        self._connecting.pop(peer, None)
        if peer in self._active or peer == self.relay_id:
            return []
        out: list[Effect] = []
        until = self._banned.get(peer)
        if until is not None:
            if until > now:
                self._count("peer_refused_banned")
                return [Disconnect(peer, DisconnectReason.BANNED)]
            del self._banned[peer]
        if len(self._active) >= self.config.active_max:
            # Full. An outbound link still gets in while we hold fewer than outbound_min dialled links,
            # by evicting an inbound one: inbound connections alone can never take over the view.
            dialled = sum(1 for st in self._active.values() if st.outbound)
            inbound = sorted(p for p, st in self._active.items() if not st.outbound)
            if not (outbound and dialled < self.config.outbound_min and inbound):
                if not outbound and peer in self._lost and now >= self._next_rejoin:
                    # M6 (the other side): a neighbour we lost to a link failure dials us back before
                    # our own re-dial reached it (it restarted: it does not know us, so no "back" in
                    # its Hello). Holding it on probation would swallow our re-dial too (the link
                    # exists), and a home kept out so would stay unreachable from here. One such
                    # eviction per MAKE_ROOM_INTERVAL_S, counted apart from the "low" relays' (M4): a
                    # mesh that formed a minute ago made room for those, and a relay restarted then
                    # found every former neighbour closed to it (its restored routes' next hops).
                    return self._rejoin(peer, now, addr)
                if not outbound and peer not in self._probation:
                    # M4: wait for the dialler's Hello: a relay below active_min gets in anyway.
                    self._probation[peer] = (now + PROBATION_S, addr)
                    self._arm_tick(now)
                    return []
                self._count("peer_refused_full")
                if addr:
                    self._passive.setdefault(peer, addr)
                return [Disconnect(peer, DisconnectReason.FULL)]
            victim = self._rng.choice(inbound)
            out.append(Disconnect(victim, DisconnectReason.OUTBOUND_QUOTA))
            out += self.peer_down(victim, now, DisconnectReason.OUTBOUND_QUOTA)
        self._passive.pop(peer, None)
        back = self._lost.pop(peer, None) is not None and outbound
        self._probation.pop(peer, None)
        # M4: tell a full relay we are short of neighbours, so it makes room; M6: that we were its
        # neighbour (it may have restarted and been filled by others); G11: ask for its routes.
        sync = self._sync.wanted(now)
        features = ((LOW,) if outbound and len(self._active) < self.config.priority_join_below else ()) + (
            (BACK,) if back else ()) + ((SYNC,) if sync else ())
        if sync:
            self._sync.ask(peer)
        if features:
            out.append(Send(peer, Hello(limits.PROTOCOL_VERSION, self.relay_id, self.listen_addr, features)))
        self._active[peer] = Neighbour(addr, outbound, now, self.config.reg_budget_peer_burst,
                                   self.config.push_budget_peer_burst)
        self._down_since.pop(peer, None)
        if self._homed.any() or self._stem.holds_any():  # rule G5: a new neighbour learns the routes homed here (paced:
            # the rest on ticks); with the stem on, stem relays announce the stem routes they hold too
            self._homed.queue(peer, self._stem.held_ids())
            out += self._announce_homed(peer, now, ANNOUNCE_SHARE * self.config.reg_budget_peer_burst)
        self._arm_tick(now)
        if self._level:
            self._trace(now, "peer_up", peer=peer, reason="outbound" if outbound else "inbound")
        return out

    # Rule M1.
    def peer_down(self, peer: str, now: float, reason: DisconnectReason) -> list[Effect]:
        """The link to peer closed or failed: refill the active view (passive view, lost neighbours)."""
        state = self._active.pop(peer, None)
        self._connecting.pop(peer, None)
        self._probation.pop(peer, None)
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
            return self._refill(now)
        self._homed.drop_peer(peer)
        self._sync.link_down(peer)  # G11: asked and answered again on a later link
        self._tree.peer_down(peer)  # G9 (tree.py)
        # When it went down: a one-hop route through it (it was the home) is reported `home unreachable`
        # for a while, then searched for (forwarding.py, rule F3). Old entries go (bounded).
        if len(self._down_since) >= 4 * self.config.active_max + self.config.passive_max:
            for p in sorted(self._down_since, key=self._down_since.__getitem__)[: len(self._down_since) // 2]:
                del self._down_since[p]
        self._down_since[peer] = now
        # A link the other side closed as full, or for our score, is not re-dialled (the reason is
        # ours, or the remote's: a driver passes it on).
        if state.score <= self.config.score_prefer_below or reason in _PURGE_ON_DOWN:
            # Route claims leave with a distrusted neighbour (a liar that claimed to be a home and then
            # dropped the link) and with a live one we dropped ourselves: either way we must not
            # report its routes' homes unreachable ("home unreachable" means the home went down).
            self._purge_routes(peer)
        if state.addr and reason not in _NO_REDIAL:
            self._lost[peer] = [state.addr, now + RECONNECT_BASE_S, 0]
        if self._level:
            self._trace(now, "peer_down", peer=peer, reason=reason)
        out = self._reroute_awaited(peer, now) + self._refill(now)  # rtt.py (C5)
        if self._stem.has_successors():  # G10, G10b: a stem successor lost (stem.py)
            out += self._stem_successor_down(peer, now)
        return out

    # Rule M1.
    def connect_failed(self, peer: str, now: float) -> list[Effect]:
        """A Connect effect did not produce a link: back off (former neighbour) or forget the candidate."""
        self._connecting.pop(peer, None)
        self._passive.pop(peer, None)
        lost = self._lost.get(peer)
        if lost is not None:
            lost[2] += 1
            if lost[2] >= RECONNECT_MAX_FAILURES:
                del self._lost[peer]
            else:
                lost[1] = now + min(RECONNECT_MAX_S, RECONNECT_BASE_S * 2 ** lost[2])
        return self._refill(now)

    # Rule M6.
    def _rejoin(self, peer: str, now: float, addr: str) -> list[Effect]:
        """Let the lost neighbour peer back in, in place of a random neighbour (made room for)."""
        self._next_rejoin = now + MAKE_ROOM_INTERVAL_S
        victim = self._rng.choice(sorted(self._active))
        victim_addr = self._active[victim].addr
        self._count("peer_rejoined")
        out: list[Effect] = [Disconnect(victim, DisconnectReason.MAKE_ROOM),
                             *self.peer_down(victim, now, DisconnectReason.MAKE_ROOM)]
        out += self.peer_up(peer, now, outbound=False, addr=addr)
        if victim_addr:
            self._passive[victim] = victim_addr
        return out

    # Rule M4.
    def _on_probation_hello(self, peer: str, msg: Hello, now: float) -> list[Effect]:
        """M4: a Hello on an inbound link held while full. "low": make room; otherwise refuse ("back": M6;
        only "sync": the probation goes on, G11)."""
        until, addr = self._probation.pop(peer)
        if (BACK in msg.features and now < self._started_at + REJOIN_WINDOW_S
                and len(self._rejoined) < self.config.active_max):
            # M6: a former neighbour is let back in; it takes the place of one that is not.
            others = sorted(p for p in self._active if p not in self._rejoined)
            if others:
                self._rejoined.add(peer)
                self._count("peer_rejoined")
                victim = self._rng.choice(others)
                victim_addr = self._active[victim].addr
                out: list[Effect] = [Disconnect(victim, DisconnectReason.MAKE_ROOM),
                                     *self.peer_down(victim, now, DisconnectReason.MAKE_ROOM)]
                out += self.peer_up(peer, now, outbound=False, addr=addr)
                if victim_addr:
                    self._passive[victim] = victim_addr
                return out
        if SYNC in msg.features and LOW not in msg.features and BACK not in msg.features:
            # A Hello only asking for routes (G11, a relay in its first minute) claims no room: the
            # probation runs its course, as for a relay that says nothing (refusing it at once made relays
            # cycle through full candidates faster and pick far ones: a built mesh lost its proximity).
            self._probation[peer] = (until, addr)
            return []
        if LOW not in msg.features or not self._active or now < self._next_make_room:
            self._count("peer_refused_full")
            return [Disconnect(peer, DisconnectReason.FULL)]
        # At most one eviction per MAKE_ROOM_INTERVAL_S: a relay cut everywhere for its behaviour is
        # "low" too, and must not be able to churn honest links at will.
        self._next_make_room = now + MAKE_ROOM_INTERVAL_S
        victim = self._rng.choice(sorted(self._active))
        victim_addr = self._active[victim].addr
        self._count("peer_made_room")
        out = [Disconnect(victim, DisconnectReason.MAKE_ROOM),
                             *self.peer_down(victim, now, DisconnectReason.MAKE_ROOM)]
        out += self.peer_up(peer, now, outbound=False, addr=addr)
        if victim_addr:
            self._passive[victim] = victim_addr  # still a good candidate for later
        return out

    # Rule M1.
    def _peer_exchange(self, now: float) -> list[Effect]:
        target = self._rng.choice(sorted(self._active))
        pool = [PeerInfo(p, st.addr) for p, st in self._active.items() if p != target and st.addr]
        pool += [PeerInfo(p, a) for p, a in self._passive.items() if p != target and a]
        if self.listen_addr:
            pool.append(PeerInfo(self.relay_id, self.listen_addr))
        if not pool:
            return []
        sample = self._rng.sample(pool, min(len(pool), limits.MAX_PEERS_IN_EXCHANGE // 2))
        self._active[target].last_sent = now
        return [Send(target, PeerExchange(tuple(sample)))]
