"""The relay engine: the whole INRI relay protocol, sans-IO.

One `Engine` per relay, driven by the daemon (inri.node.service), the simulator (simulations) and the
in-memory harness (inri.core.testing): every method takes `now` (monotonic; wall-clock time is
`now + wall_offset`) and returns effects to carry out (inri.core.api). The rules are grouped by
module, one rule-group object each (membership.py ... rtt.py), which owns its state and calls the
other groups through typed references; this module builds and wires them, and holds the public API
(delegating to the groups), dispatch and timers.

The rules themselves are stated once, in the rule index of docs/protocol.md ("Rule index": each rule's
label, statement and the modules it lives in), and explained there at length; code cites them by label
where it implements them, and tests/test_rule_index.py checks that the index and those citations agree.

Extension point: hostile relays (simulations/adversary.py) subclass Engine and override only the
methods listed in `HOOKS`; tests/test_adversarial.py checks they still exist with these names.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import assert_never

from inri.core.api import (
    Disconnect,
    DisconnectReason,
    Effect,
    HomeStore,
    InjectResult,
    Send,
    Tracer,
    Verifier,
)
from inri.core.awaited import AwaitedAnswers
from inri.core.backups import BackupCopies
from inri.core.config import EngineConfig
from inri.core.custody import CustodyRules
from inri.core.floodstate import FloodState
from inri.core.forwarding import ForwardingRules
from inri.core.gossip import ANNOUNCE_SHARE, GossipRules
from inri.core.homed import HomedRoutes
from inri.core.kept import CustodyTable
from inri.core.membership import MembershipRules
from inri.core.neighbours import Neighbours
from inri.core.reverse import ReversePaths
from inri.core.roundtrip import RttEstimator
from inri.core.rtt import RttRules
from inri.core.scoring import ScoringRules
from inri.core.seen import SeenCache
from inri.core.state import SWEEP_INTERVAL_S, EngineContext, Neighbour, make_keepalive, readdress
from inri.core.stem import StemRules
from inri.core.stemstate import StemState
from inri.core.sync import SYNC, SyncRules
from inri.core.syncstate import SyncState
from inri.core.tables import EXPORT_CHUNK, CompactRouteTable, ExportRow, RouteTable
from inri.core.tree import TreeGossip
from inri.core.withdrawals import Withdrawals
from inri.protocol.codec import DecodeError, decode
from inri.protocol.messages import (
    ErrorCode,
    ErrorFrame,
    Hello,
    Keepalive,
    Message,
    PeerExchange,
    PeerInfo,
    Push,
    Receipt,
    ReceiptBatch,
    RegAnnounce,
    RegGossip,
    RegGraft,
    Registration,
    RouteError,
    RouteSync,
    RouteWithdraw,
    StemRepair,
    WebPushMeta,
)

__all__ = ["HOOKS", "Engine", "readdress"]


# The extension point for hostile relays (simulations/adversary.py): the methods a subclass may
# override to change one behaviour, with what each receives. Renaming one breaks
# tests/test_adversarial.py::test_adversary_hooks_exist, so an attack cannot silently turn off.
HOOKS = {
    "_on_push": "(peer, msg: Push, now) -> effects: a push frame from a neighbour (F1-F4)",
    "_on_gossip": "(peer, state: Neighbour, msg: RegGossip, now) -> effects: registration gossip (G1-G4)",
    "_tick": "(now) -> effects: the periodic timer (keepalives M2, scoring S1, sweeps)",
}


class Engine:
    """One relay's protocol state. Every method takes `now` and returns effects to carry out."""

    def __init__(
        self,
        relay_id: str,
        config: EngineConfig,
        *,
        verifier: Verifier,
        home: HomeStore,
        tracer: Tracer,
        rng: random.Random,
        listen_addr: str = "",
    ) -> None:
        self.relay_id = relay_id
        self.config = config
        self.listen_addr = listen_addr  # given to neighbours in Hello and peer exchange (membership.py)
        self._tracer = tracer
        # Who this relay is linked to, dials, candidates, former neighbours, bans, probations (neighbours.py:
        # rules M1-M7, S2's bans, F3's links down, C7's last frame).
        self._neighbours = Neighbours()
        # The linked neighbours, read by every group on its hot path: the owner's live, read-only view (one
        # attribute read instead of a call per use: a forwarded push read it four times).
        self._linked = self._neighbours.active()
        self.counters: dict[str, int] = {}
        # Clocks. `now` (every method's argument) is monotonic: budgets, keepalives, bans, custody and
        # route lifetimes are intervals on it, so a stepped wall clock cannot cut links or expire
        # routes. Registrations carry wall-clock (unix) times: wall time = now + wall_offset, kept in the
        # context every group reads (the `wall_offset` property). The simulator leaves it 0 (virtual time
        # is both); the daemon sets it before every call.
        self._ctx = ctx = EngineContext(relay_id, config, verifier, home, rng, int(tracer.level), tracer.emit,
                                        self.counters, self._linked)
        # The owner objects (tests/test_core_owners.py: OWNER_OBJECTS): built once here and never rebound, each
        # given to the rule groups that use it.
        self._routes = routes = CompactRouteTable() if config.route_table == "compact" else RouteTable()
        self._flood = flood = FloodState()  # floodstate.py (G3b, G4): refresh budgets, far-travelled first copies
        self._seen = seen = SeenCache(config.push_seen_max, config.seen_ttl_s, config.reverse_ttl_s)  # seen.py (F1)
        self._reverse = reverse = ReversePaths(config.reverse_max, config.reverse_ttl_s)  # F4, F6b (reverse.py)
        self._custody = custody = CustodyTable()  # C1-C3, C7 (kept.py)
        # C8 (backups.py): copies of neighbours' route attempts, adopted when a custodian's link fails
        self._backups = backups = BackupCopies(config.custody_backup_max, config.reverse_ttl_s)
        # G11 (sync.py): route sync at link-up; provisional routes learnt from it, at most route_max.
        self._sync = sync = SyncState(config.route_max)
        # Pushes forwarded along a route, awaiting an answer (awaited.py: rules F6, S1, C4-C6).
        self._await = awaited = AwaitedAnswers(config.reverse_max)
        self._rtt = rtt = RttEstimator(config)  # rtt.py (C4, C4b): the round-trip estimate
        self._homed = homed = HomedRoutes()  # homed.py (G5): registrations homed here, link-up announcements queued
        # The stem's routes, embargoes, generations and successors (stemstate.py: G5, G7, G8, G10).
        self._stem = stem = StemState()
        # G9's owner (tree.py): its tables stay empty with gossip_scheme "flood" unless a neighbour announces.
        self._tree = tree = TreeGossip(relay_id, config, routes, self._neighbours, rng, self.counters, tracer.emit,
                                       ctx.level)
        # G12's owner (withdrawals.py): route withdrawals sent and heeded; empty with route_withdrawal off. A
        # restored route wakes the pushes waiting for it (C3c: custody's rules, built below).
        self._withdrawals = withdrawals = Withdrawals(
            config.route_withdrawal, routes, self._linked, config.route_k, config.keepalive_interval_s, self._count,
            lambda rid, now: self._custody_rules.route_renewed(rid, now),
            regenerate=lambda rid, now: self._stem_rules.regenerate(rid, now),  # G13 at a home (stem.py)
            generation=stem.generation_of,
            stem_keeps=stem.keeps, stem_on=config.stem,  # G12 with the stem (withdrawals.py)
            trace=(lambda now, frames: tracer.emit(now, relay_id, "gossip_control", count=frames, reason="withdraw"))
            if ctx.level else None)
        nb = self._neighbours
        # The rule groups, each owning its own state (built by its __init__), then wired to the groups it calls.
        # The stem's key is the only random draw among them (StemRules, with the stem on): the order of
        # construction keeps the random stream as it was.
        self._membership_rules = membership = MembershipRules(ctx, homed, nb, stem, sync, tree, withdrawals,
                                                                      listen_addr)
        self._gossip_rules = gossip = GossipRules(ctx, custody, flood, homed, routes, stem, tree,
                                                  getattr(tracer, "emit_row", None))
        self._stem_rules = stem_rules = StemRules(ctx, custody, flood, homed, routes, stem)
        self._sync_rules = sync_rules = SyncRules(ctx, routes, sync)
        self._forwarding_rules = forwarding = ForwardingRules(ctx, awaited, custody, nb, reverse, routes, rtt, seen,
                                                              stem, sync, withdrawals, backups)
        self._custody_rules = custody_rules = CustodyRules(ctx, custody, nb, reverse, routes, rtt, seen,
                                                           withdrawals, backups)
        self._scoring_rules = scoring = ScoringRules(ctx, awaited, nb, routes, sync, withdrawals)
        self._rtt_rules = rtt_rules = RttRules(ctx, awaited, reverse, routes, rtt, seen)
        membership.wire(custody=custody_rules, gossip=gossip, rtt=rtt_rules, scoring=scoring, stem=stem_rules)
        gossip.wire(custody=custody_rules, scoring=scoring, stem=stem_rules)
        stem_rules.wire(custody=custody_rules, gossip=gossip)
        forwarding.wire(custody=custody_rules, rtt=rtt_rules, scoring=scoring, sync=sync_rules)
        custody_rules.wire(forwarding=forwarding, rtt=rtt_rules, scoring=scoring)
        scoring.wire(membership=membership)
        rtt_rules.wire(forwarding=forwarding)
        # HOOKS: dispatch calls self._on_push and self._on_gossip. Unless the class overrides one (a hostile
        # relay), the instance's own attribute is the rule group's method, so a frame costs no call through
        # the engine's method (2% of a forwarded push, bench_engine); one set on the instance later wins too.
        cls = type(self)
        if cls._on_push is Engine._on_push:
            self._on_push = forwarding.on_push  # type: ignore[method-assign]
        if cls._on_gossip is Engine._on_gossip:
            self._on_gossip = gossip.on_gossip  # type: ignore[method-assign]
        self._next_sweep = 0.0  # the expiry sweeps (_sweep)
        self._score_decay = 0.5 ** (config.keepalive_interval_s / config.score_half_life_s)

    @property
    def wall_offset(self) -> float:
        """Wall-clock time minus `now` (seconds): 0 in the simulator; the daemon sets it before every call."""
        return self._ctx.wall_offset

    @wall_offset.setter
    def wall_offset(self, offset: float) -> None:
        self._ctx.wall_offset = offset

    def _count(self, name: str, n: int = 1) -> None:
        """Add n to the counter `name` (the dict every rule group counts into)."""
        self.counters[name] = self.counters.get(name, 0) + n

    # The hooks of HOOKS: a hostile relay (simulations/adversary.py) overrides them and calls super(); dispatch
    # calls them (an engine that overrides neither calls the rule group's method directly: __init__).
    def _on_push(self, peer: str, msg: Push, now: float) -> list[Effect]:
        """A push frame from a neighbour (ForwardingRules.on_push, rules F1-F4)."""
        return self._forwarding_rules.on_push(peer, msg, now)

    def _on_gossip(self, peer: str, state: Neighbour, msg: RegGossip, now: float) -> list[Effect]:
        """Registration gossip from a neighbour (GossipRules.on_gossip, rules G1-G4)."""
        return self._gossip_rules.on_gossip(peer, state, msg, now)

    # Rule M1 (membership.py), and the clock of the engine's own expiry sweeps.
    def start(self, now: float, *, sync_routes: bool = True) -> list[Effect]:
        """Begin: MembershipRules.start (timers, G11's route requests, the first dials); the first expiry
        sweep is due SWEEP_INTERVAL_S from now."""
        self._next_sweep = now + SWEEP_INTERVAL_S
        return self._membership_rules.start(now, sync_routes=sync_routes)

    # ------------------------------------------------------------------------------------------
    # frames (dispatch)

    def receive_frame(self, peer: str, data: bytes, now: float) -> list[Effect]:
        """Decode a frame from peer and handle it; a malformed frame is answered with an ErrorFrame."""
        try:
            msg = decode(data)
        except DecodeError as exc:
            self._count("frames_invalid")
            out: list[Effect] = [Send(peer, ErrorFrame(ErrorCode.MALFORMED, exc.detail[:200]))]
            return out + self._scoring_rules.score(peer, self.config.score_invalid_frame, now, "invalid_frame")
        return self.receive_message(peer, msg, now)

    # Dispatch to the rule groups by message type.
    def receive_message(self, peer: str, msg: Message, now: float) -> list[Effect]:
        """Handle a decoded message from a neighbour (the simulator's fast path)."""
        state = self._neighbours.heard_from(peer, now)  # M2's liveness, C7's clock
        if state is None:
            if self._neighbours.on_probation(peer) and isinstance(msg, Hello):
                out = self._membership_rules.on_probation_hello(peer, msg, now)
                self._withdrawals.heard_hello(peer, msg.features, now)  # G12
                if SYNC in msg.features and peer in self._linked:  # G11: admitted, asks for routes
                    out += self._sync_rules.on_sync_request(peer, now)
                return out
            self._count("frames_from_stranger")
            return []
        if type(msg) is RegGossip:  # most frames: one type check, not a class pattern (3x the cost on 3.11)
            return self._on_gossip(peer, state, msg, now)
        if type(msg) is Keepalive:  # the next most frequent (rule M2): as the Keepalive case below
            if not msg.reply:
                state.last_sent = now
                return [make_keepalive(peer, msg.nonce, True)]
            self._rtt_rules.keepalive_answered(state, msg.nonce, now)  # rule C4: a link round trip
            return []
        # Most frequent first: gossip, then pushes. A message type added to protocol.messages.Message
        # and not handled here fails type checking (assert_never).
        match msg:
            case RegGossip():
                return self._on_gossip(peer, state, msg, now)
            case Push():
                return self._on_push(peer, msg, now)
            case Receipt():
                return self._forwarding_rules.on_receipt(peer, msg, now)
            case ReceiptBatch():
                return self._forwarding_rules.on_receipt_batch(peer, msg, now)
            case RouteError():
                return self._forwarding_rules.on_route_error(peer, msg, now)
            case RegAnnounce():
                return self._tree.on_announce(peer, state, msg, now)
            case RegGraft():
                return self._tree.on_graft(peer, state, msg, now)
            case StemRepair():
                return self._stem_rules.on_stem_repair(peer, msg, now)
            case RouteSync():
                return self._sync_rules.on_route_sync(peer, msg, now)
            case RouteWithdraw():
                return self._withdrawals.on_frame(peer, msg, now)  # G12 (withdrawals.py)
            case Keepalive():
                if not msg.reply:
                    state.last_sent = now
                    return [Send(peer, Keepalive(msg.nonce, True))]
                self._rtt_rules.keepalive_answered(state, msg.nonce, now)  # rule C4: a link round trip
                return []
            case PeerExchange():
                return self._membership_rules.add_candidates(list(msg.peers), now)
            case ErrorFrame():
                self._count("peer_errors")
                return []
            case Hello():  # on an active link: G11's request for routes (M4's probation: handled above)
                self._withdrawals.heard_hello(peer, msg.features, now)  # G12: it takes withdrawals
                return self._sync_rules.on_sync_request(peer, now) if SYNC in msg.features else []
            case _:
                assert_never(msg)

    # ------------------------------------------------------------------------------------------
    # time

    def get_timer(self) -> float | None:
        """The earliest time handle_timer wants to run (None: nothing armed)."""
        t = self._membership_rules.tick_at()  # M2 (membership.py)
        deadline = self._await.next_deadline()  # F6, S1 (awaited.py)
        if deadline is not None and (t is None or deadline < t):
            t = deadline
        retry = self._custody.next_due()  # C2 (kept.py): stale entries dropped here too, not on a wakeup
        if retry is not None and (t is None or retry < t):
            t = retry
        repair = self._forwarding_rules.repair_next()  # F8 (forwarding.py)
        if repair is not None and (t is None or repair < t):
            t = repair
        tree = self._tree.next_due()  # G9 (tree.py)
        if tree is not None and (t is None or tree < t):
            return tree
        return t

    def handle_timer(self, now: float) -> list[Effect]:
        """Custody retries, keepalives, liveness, peer exchange and expiry sweeps that are due."""
        out: list[Effect] = []
        custody = self._custody
        while (c := custody.pop_due(now)) is not None:  # C2
            out += self._custody_rules.retry(c, now)
        out += self._tree.timer(now)  # G9 (tree.py)
        out += self._forwarding_rules.answers_overdue(now)  # F6, S1 (forwarding.py)
        out += self._forwarding_rules.repairs_unanswered(now)  # F8 (forwarding.py)
        tick = self._membership_rules.tick_at()
        if tick is not None and now >= tick:
            out += self._tick(now)
        return out

    # Rules M2 (keepalives, liveness), S1 (decay, black holes), M4 (probation), M1 (refill, exchange).
    def _tick(self, now: float) -> list[Effect]:
        cfg = self.config
        out: list[Effect] = []
        interval = cfg.keepalive_interval_s
        dead_after = interval * cfg.keepalive_misses
        out += self._scoring_rules.grace_expired(now)  # S1 (scoring.py)
        for p in self._homed.waiting():  # link-up announcements left over from peer_up (rule G5)
            out += self._gossip_rules.announce_homed(p, now, ANNOUNCE_SHARE * cfg.reg_budget_per_peer_per_s * interval)
        for p in self._sync.answering():  # routes still to send to a neighbour that asked (rule G11)
            out += self._sync_rules.sync_send(p, now)
        decay = self._score_decay
        ka_after = interval * 0.99
        nb = self._neighbours
        active = nb.active()
        for p in list(active):
            st = active[p]
            if st.score:
                st.score *= decay
            if st.silences:
                st.answers *= decay
                st.silences *= decay
            if now - st.last_heard > dead_after:
                out.append(Disconnect(p, DisconnectReason.KEEPALIVE_TIMEOUT))
                out += self._membership_rules.peer_down(p, now, DisconnectReason.KEEPALIVE_TIMEOUT)
            elif now - st.last_sent >= ka_after:
                st.nonce += 1
                st.last_sent = st.ka_sent = now
                out.append(make_keepalive(p, st.nonce, False))
        for p in nb.dials_given_up(now):
            out += self._membership_rules.connect_failed(p, now)
        for p in nb.probations_ended(now):  # no "low" Hello came: refuse as full (M4)
            self._count("peer_refused_full")
            out.append(Disconnect(p, DisconnectReason.FULL))
        if self._stem.any_embargo():  # G8
            out += self._stem_rules.stem_embargo(now)
        out += self._stem_rules.restem_due_now(now)  # G10 (stem.py)
        if self._withdrawals.any():  # G12 (withdrawals.py): restores seen late, frames over the budget
            out += self._withdrawals.tick(now)
        out += self._stem_rules.repair_due_now(now)
        if nb.links_and_dials() < cfg.active_max:
            out += self._membership_rules.refill(now)
        out += self._membership_rules.exchange_due(now)  # M1 (membership.py)
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_INTERVAL_S
            self._sweep(now)
        self._membership_rules.set_tick(now + interval if nb.busy() else None)
        return out

    def _sweep(self, now: float) -> None:
        self._gossip_rules.sweep_routes(now)  # gossip.py (G2): nothing to do until the table's earliest expiry
        self._seen.sweep(now)
        self._reverse.sweep(now)
        self._scoring_rules.sweep_scores(now)  # scoring.py
        self._forwarding_rules.sweep_repairs(now)  # forwarding.py (F5c, F8c, F9)
        self._sync.sweep(now)  # G11 (syncstate.py)
        expired = self._custody.expire(now)
        if expired:
            self._count("custody_expired", expired)
        self._neighbours.sweep_bans(now)  # S2

    # ------------------------------------------------------------------------------------------
    # the rule groups' entry points (the engine's public API)

    def add_candidates(self, peers: list[PeerInfo], now: float, *, near: int = 0) -> list[Effect]:
        """Relays learned from a bootstrap list, a scenario or peer exchange: into the passive view
        (MembershipRules.add_candidates)."""
        return self._membership_rules.add_candidates(peers, now, near=near)

    def peer_up(self, peer: str, now: float, *, outbound: bool, addr: str = '') -> list[Effect]:
        """A link to peer is open (we dialled it: outbound=True) (MembershipRules.peer_up)."""
        return self._membership_rules.peer_up(peer, now, outbound=outbound, addr=addr)

    def peer_down(self, peer: str, now: float, reason: DisconnectReason) -> list[Effect]:
        """The link to peer closed or failed: refill the active view (passive view, lost neighbours)
        (MembershipRules.peer_down)."""
        return self._membership_rules.peer_down(peer, now, reason)

    def connect_failed(self, peer: str, now: float) -> list[Effect]:
        """A Connect effect did not produce a link: back off (former neighbour) or forget the candidate
        (MembershipRules.connect_failed)."""
        return self._membership_rules.connect_failed(peer, now)

    def register(self, registration: Registration, now: float, *, restart: bool = False) -> list[Effect]:
        """A device homed here registered or refreshed: originate its gossip (rule G2 at distance 0)
        (GossipRules.register)."""
        return self._gossip_rules.register(registration, now, restart=restart)

    def unregister(self, route_id: bytes, now: float) -> list[Effect]:
        """A device homed here unregistered: forget its route here (elsewhere it expires by TTL)
        (GossipRules.unregister)."""
        return self._gossip_rules.unregister(route_id, now)

    def provisional_count(self) -> int:
        """Route ids this relay reaches only through a provisional route (rule G11) whose neighbour is up: one
        through a neighbour whose link went down forwards nothing (`provisional_hop`) until that neighbour
        links again, so it is no route to count (a relay restarted amid link churn listed routes it could not
        use, and searched for their pushes) (SyncRules.provisional_count)."""
        return self._sync_rules.provisional_count()

    def has_route(self, route_id: bytes) -> bool:
        """True when a live next hop is known for route_id (ForwardingRules.has_route)."""
        return self._forwarding_rules.has_route(route_id)

    def flush_receipts(self, now: float) -> list[Effect]:
        """The receipts held since the last flush (a host that called hold_receipts), one frame per (neighbour,
        route, receipt key the pushes carried): a ReceiptBatch under one signature for two or more (at most
        receipt_batch_max each), a plain Receipt for one (ForwardingRules.flush_receipts)."""
        return self._forwarding_rules.flush_receipts(now)

    def hold_receipts(self) -> None:
        """Rule F5b: from now on the receipts this relay answers as a home are held until flush_receipts (a host
        that calls it once per round; the simulator and MiniNet answer each push at once)
        (ForwardingRules.hold_receipts)."""
        return self._forwarding_rules.hold_receipts()

    def receipts_held(self) -> bool:
        """True when receipts wait for flush_receipts (ForwardingRules.receipts_held)."""
        return self._forwarding_rules.receipts_held()

    def inject_push(self, registration: Registration, token: bytes, ciphertext: bytes, now: float, *,
                    push_id: bytes | None = None, webpush: WebPushMeta | None = None) -> InjectResult:
        """A home app pushes here with a push credential's registration and one token (rule C1)
        (CustodyRules.inject_push)."""
        return self._custody_rules.inject_push(registration, token, ciphertext, now, push_id=push_id, webpush=webpush)

    def restore_custody(self, push: Push, deadline: float, attempt: int, now: float) -> list[Effect]:
        """Re-adopt a push this relay held in custody before a restart (the daemon reads it from disk)
        (CustodyRules.restore_custody)."""
        return self._custody_rules.restore_custody(push, deadline, attempt, now)

    def link_congested(self, peer: str, now: float) -> list[Effect]:
        """The driver's bounded send queue for peer dropped frames: peer does not read (rule S1)
        (ScoringRules.link_congested)."""
        return self._scoring_rules.link_congested(peer, now)

    def link_unresponsive(self, peer: str, now: float) -> list[Effect]:
        """The driver's transport got no acknowledgement from peer for what it sent (rule C6): peer is a suspect
        next hop until a frame from it arrives, and the pushes awaited from it go another way now
        (RttRules.link_unresponsive)."""
        return self._rtt_rules.link_unresponsive(peer, now)

    # ------------------------------------------------------------------------------------------
    # introspection

    def held_custody(self) -> list[tuple[Push, float, int]]:
        """(push, deadline, attempt) of every push in custody here, in the order taken: what the daemon
        has on disk (its CustodyTaken rows and the attempt numbers it sent), for a driver that models a
        crash that keeps the disk (the simulator's churn) and gives it back through restore_custody."""
        return [(c.push, c.deadline, c.attempt) for c in self._custody.records()]

    def route_count(self) -> int:
        """Route ids with at least one next hop (a provisional one, rule G11, included)."""
        provisional = self._sync_rules.provisional_count() if self._sync.any_provisional() else 0
        return self._routes.routed_count() + provisional

    def route_table_kind(self) -> str:
        """How the route table is stored: "compact" or "dict" (`[engine] route_table`)."""
        return "compact" if isinstance(self._routes, CompactRouteTable) else "dict"

    def active_peers(self) -> list[str]:
        """The active view, sorted."""
        return sorted(self._linked)

    def listed_peers(self) -> list[str]:
        """The active neighbours this relay has heard from since their link came up, sorted (rule M7): the
        other end holds the link too. What a relay lists as its neighbours (docs/api.md, /v1/status)."""
        return sorted(p for p, st in self._linked.items() if st.last_heard > st.up_at)

    def passive_peers(self) -> list[str]:
        """The passive view (candidates), oldest first."""
        return list(self._neighbours.passive())

    def next_hops(self, route_id: bytes) -> list[tuple[str, int]]:
        """The cached route vector for route_id: [(next hop, distance), ...], primary first."""
        entry = self._routes.get(route_id)
        return [] if entry is None else RouteTable.vector(entry)

    def export_routes(self) -> list[tuple[bytes, int, float, tuple[tuple[str, int], ...]]]:
        """Learned routes, to be kept across a restart: [(route id, epoch, wall-clock expiry, ((next hop,
        distance), ...)), ...]. Routes homed here (the store keeps their registrations) and routes with
        no next hop left are not included."""
        return self._routes.export_rows(self.wall_offset)

    def export_route_chunks(self, size: int = EXPORT_CHUNK) -> Iterator[list[ExportRow]]:
        """export_routes in lists of about `size` rows, so that a daemon can serve other work between
        them (1M routes take seconds to read out); the engine may change meanwhile (tables.export_chunks)."""
        return self._routes.export_chunks(self.wall_offset, size)

    def restore_routes(self, rows: list[tuple[bytes, int, float, tuple[tuple[str, int], ...]]], now: float) -> int:
        """Routes this relay had learned before a restart (export_routes), verified then: a restarted
        relay has them again as its links come up (their next hops are used once active), instead of
        searching for every route until each device refreshes (rule G2). Known or expired routes, and
        rows beyond route_max, are skipped. Returns how many were restored."""
        routes = self._routes
        off = self.wall_offset
        n = 0
        for rid, epoch, wall_expiry, hops in rows:
            if len(routes) >= self.config.route_max:
                break
            expires = wall_expiry - off
            if expires <= now or not hops or rid in routes:
                continue
            (peer, distance), *backups = hops
            routes.set_first(rid, epoch, expires, peer, distance)
            for p, d in backups[: max(0, self.config.route_k - 1)]:
                entry = routes.get(rid)
                if entry is not None and not RouteTable.claims(entry, p):
                    routes.add_backup(rid, entry, p, d)
            n += 1
        self._count("routes_restored", n)
        return n

    def export_anchors(self) -> list[tuple[str, str]]:
        """The active neighbours with a known address, [(node id, address), ...]: kept across a restart
        (inri/node/routesnap.py) so that the next hops of the restored routes are dialled first."""
        return sorted((p, st.addr) for p, st in self._linked.items() if st.addr)

    def restore_anchors(self, anchors: list[tuple[str, str]], now: float) -> int:
        """Former neighbours (export_anchors) into the redial list of rule M6, due now: the next refill
        (start) dials them before any candidate of the passive view. Returns how many (at most
        active_max; banned relays and this relay skipped)."""
        n = 0
        nb = self._neighbours
        for peer, addr in anchors:
            if n >= self.config.active_max:
                break
            if peer == self.relay_id or nb.is_banned(peer) or nb.is_lost(peer) or not addr:
                continue
            nb.lose(peer, addr, now)
            n += 1
        return n

    def routes_with_next_hops(self, route_ids: list[bytes], k: int) -> int:
        """How many of route_ids have a route with at least k next hops here."""
        hops_of = self._routes.next_hops_of
        return sum(1 for rid in route_ids if len(hops_of(rid)) >= k)

    def peer_scores(self) -> dict[str, float]:
        """The score of every active neighbour (rule S1), rounded."""
        return {p: round(st.score, 2) for p, st in sorted(self._linked.items())}

    def route_epoch(self, route_id: bytes) -> int | None:
        """The newest epoch known for route_id."""
        entry = self._routes.get(route_id)
        return None if entry is None else RouteTable.epoch(entry)

    def stats(self) -> dict[str, int]:
        """Table sizes and counters."""
        return {
            "routes": len(self._routes),
            "seen": len(self._seen),
            "reverse": len(self._reverse),
            "custody": len(self._custody),
            **self._neighbours.sizes(),  # active, passive, connecting, lost, banned
            "routes_provisional": self._sync.provisional_size(),
            "awaiting_receipt": len(self._await),
            "reg_duplicate": self._gossip_rules.duplicate_count(),  # G3 (gossip.py)
            **self.counters,
        }
