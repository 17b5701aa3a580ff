"""The relay engine: the whole INRI relay protocol, sans-IO.

One `Engine` per relay, driven by the daemon (inri.node.service), the simulator (simulations) and the
in-memory harness (inri.core.testing): every method takes `now` (monotonic; wall-clock time is
`now + wall_offset`) and returns effects to carry out (inri.core.api). The rules are grouped by
module, one mixin class each; this module assembles them and holds dispatch and timers.

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

from inri.core.api import Disconnect, DisconnectReason, Effect, HomeStore, Send, Tracer, Verifier
from inri.core.awaited import AwaitedAnswers
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
from inri.core.roundtrip import ROUTE_LEN_MAX, RttEstimator
from inri.core.rtt import RttRules
from inri.core.scoring import ScoringRules
from inri.core.seen import SeenCache
from inri.core.state import SWEEP_INTERVAL_S, make_keepalive, readdress
from inri.core.stem import StemRules
from inri.core.stemstate import StemState
from inri.core.sync import SYNC, SyncRules
from inri.core.syncstate import SyncState
from inri.core.tables import EXPORT_CHUNK, BoundedMap, CompactRouteTable, ExportRow, RouteTable
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
    Push,
    Receipt,
    ReceiptBatch,
    ReceiptStatus,
    RegAnnounce,
    RegGossip,
    RegGraft,
    RouteError,
    RouteSync,
    RouteWithdraw,
    StemRepair,
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


class Engine(MembershipRules, GossipRules, StemRules, SyncRules, ForwardingRules, CustodyRules, ScoringRules,
             RttRules):
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
        self.listen_addr = listen_addr
        self._verifier = verifier
        self._home = home
        self._tracer = tracer
        self._level = int(tracer.level)
        self._emit = tracer.emit
        # Optional fast path: a tracer may take whole rows in trace-schema column order.
        self._emit_row = getattr(tracer, "emit_row", None)
        self._rng = rng
        # Who this relay is linked to, dials, candidates, former neighbours, bans, probations (neighbours.py:
        # rules M1-M7, S2's bans, F3's links down, C7's last frame).
        self._neighbours = Neighbours()
        # The linked neighbours, read by every group on its hot path: the owner's live, read-only view (one
        # attribute read instead of a call per use: a forwarded push read it four times).
        self._linked = self._neighbours.active()
        self._near: dict[str, int] = {}  # candidates ranked near by a bootstrap -> rank (rule M5)
        self._far: set[str] = set()  # peers dialled as the far link(s) (rule M5)
        self._routes = CompactRouteTable() if config.route_table == "compact" else RouteTable()
        self._flood = FloodState()  # floodstate.py (G3b, G4): refresh budgets, far-travelled first copies
        self._seen = SeenCache(config.push_seen_max, config.seen_ttl_s, config.reverse_ttl_s)  # seen.py (F1)
        self._reverse = ReversePaths(config.reverse_max, config.reverse_ttl_s)  # F4, F6b (reverse.py)
        self._custody = CustodyTable()  # C1-C3, C7 (kept.py)
        self._next_tick: float | None = None
        self._next_sweep = 0.0  # the expiry sweeps (engine.py, _sweep)
        self._next_exchange = 0.0  # M1's peer exchange (membership.py)
        self._next_make_room = 0.0
        self._next_rejoin = 0.0  # M6, the other side: its own limiter (membership.py)
        self._started_at = 0.0  # M6: former neighbours get back in for a while after start()
        self._rejoined: set[str] = set()
        self._full_until: dict[str, tuple[float, float]] = {}  # M7: candidates that refused us as full
        # G11 (sync.py): route sync at link-up; provisional routes learnt from it, at most route_max.
        self._sync = SyncState(config.route_max)
        # Pushes forwarded along a route, awaiting an answer (awaited.py: rules F6, S1, C4-C6).
        self._await = AwaitedAnswers(config.reverse_max)
        # F8 (forwarding.py): local repairs this relay started, until their answer is due (a receipt
        # passing back through here ends the wait: the reverse entry goes).
        self._repair_heap: list[tuple[float, bytes, str, bytes, bool]] = []
        # F9 (forwarding.py): push id -> (the next hop a `repair failed` for it came from, expiry), or
        # (None, expiry) where this relay's own search for it found nothing.
        self._steer: BoundedMap[bytes, tuple[str | None, float]] = BoundedMap(config.reverse_max)
        # F8c (forwarding.py): push id -> (`repair found` words heard for a local repair of it, refutations
        # heard, expiry), on the searching relay and on relays between it and a find.
        self._finds: BoundedMap[bytes, tuple[int, int, float]] = BoundedMap(config.reverse_max)
        # F5c (forwarding.py): push id -> (the neighbour that sent its last route copy, that copy's attempt,
        # expiry) when F6b kept the reverse entry of an earlier copy: a `not home` for that copy goes there.
        self._kept_from: BoundedMap[bytes, tuple[str, int, float]] = BoundedMap(config.reverse_max)
        self._rtt = RttEstimator(config)  # rtt.py (C4, C4b): the round-trip estimate
        self._waiting_route: dict[bytes, set[bytes]] = {}  # custody.py (C3c)
        self._renewed_at: BoundedMap[bytes, float] = BoundedMap(ROUTE_LEN_MAX)
        # Slow, not silent (rule S1, scoring.py): pushes past receipt_timeout_s whose next hop keeps
        # answering, slowly, get a longer grace: push id -> (next hop, sent, grace end), with a heap
        # (grace end, push id) for expiry; pushes blamed on a neighbour (push id -> (next hop, sent,
        # expiry)) are remembered so a late answer gives the penalty back.
        self._overdue: dict[bytes, tuple[str, float, float]] = {}
        # (next hop, route id) -> when it first left a push of the route unanswered (rule F6)
        self._hole_suspects: BoundedMap[tuple[str, bytes], float] = BoundedMap(4096)
        self._overdue_heap: list[tuple[float, bytes]] = []
        self._blamed: BoundedMap[bytes, tuple[str, float, float]] = BoundedMap(config.reverse_max)
        self._score_decay = 0.5 ** (config.keepalive_interval_s / config.score_half_life_s)
        # Clocks. `now` (every method's argument) is monotonic: budgets, keepalives, bans, custody and
        # route lifetimes are intervals on it, so a stepped wall clock cannot cut links or expire
        # routes. Registrations carry wall-clock (unix) times: wall time = now + wall_offset. The
        # simulator leaves it 0 (virtual time is both); the daemon sets it before every call.
        self.wall_offset = 0.0
        # Stem phase (stem.py): the key is drawn only with the stem on, so a stem-off run's random
        # stream (and simulator trace) is unchanged.
        self._stem_key = rng.randbytes(32) if config.stem else b""
        self._homed = HomedRoutes()  # homed.py (G5): registrations homed here, link-up announcements queued
        # The stem's routes, embargoes, generations and successors (stemstate.py: G5, G7, G8, G10); stem
        # repair (stem.py, G10): empty unless a stem broke (or stem is off).
        self._stem = StemState()
        self._restem_due: dict[bytes, float] = {}
        self._repair_asked: dict[bytes, tuple[int, int, float]] = {}
        self._repair_due: dict[bytes, tuple[float, int]] = {}
        # Tree gossip (tree.py, rule G9); the tables stay empty with gossip_scheme "flood".
        self._tree_on = config.gossip_scheme == "tree"
        # Rule F5b: receipts answered as a home, held until flush_receipts (None: answered at once, the
        # default; a host that flushes once per round calls hold_receipts): (neighbour, route id, the
        # pushes' receipt key) -> push id -> (status, hops).
        self._receipt_hold: dict[tuple[str, bytes, bytes | None], dict[bytes, tuple[ReceiptStatus, int]]] | None = None
        self.counters: dict[str, int] = {}
        self.reg_duplicates = 0  # gossip arrivals of a known (route, epoch): a plain int on the hot path
        # G9's owner (tree.py): its tables stay empty with gossip_scheme "flood" unless a neighbour announces.
        self._tree = TreeGossip(relay_id, config, self._routes, self._neighbours, rng, self.counters, tracer.emit,
                                self._level)
        # G12's owner (withdrawals.py): route withdrawals sent and heeded; empty with route_withdrawal off.
        self._withdrawals = Withdrawals(config.route_withdrawal, self._routes, self._linked, config.route_k,
                                        config.keepalive_interval_s, self._count, self._route_renewed)

    # Rule M1 (membership.py), and the clock of the engine's own expiry sweeps.
    def start(self, now: float, *, sync_routes: bool = True) -> list[Effect]:
        """Begin: MembershipRules.start (timers, G11's route requests, the first dials); the first expiry
        sweep is due SWEEP_INTERVAL_S from now."""
        self._next_sweep = now + SWEEP_INTERVAL_S
        return super().start(now, sync_routes=sync_routes)

    # ------------------------------------------------------------------------------------------
    # frames (dispatch)

    def receive_frame(self, peer: str, data: bytes, now: float) -> list[Effect]:
        """Decode a frame from peer and handle it; a malformed frame is answered with an ErrorFrame."""
        try:
            msg = decode(data)
        except DecodeError as exc:
            self._count("frames_invalid")
            out: list[Effect] = [Send(peer, ErrorFrame(ErrorCode.MALFORMED, exc.detail[:200]))]
            return out + self._score(peer, self.config.score_invalid_frame, now, "invalid_frame")
        return self.receive_message(peer, msg, now)

    # Dispatch to the rule groups by message type.
    def receive_message(self, peer: str, msg: Message, now: float) -> list[Effect]:
        """Handle a decoded message from a neighbour (the simulator's fast path)."""
        state = self._neighbours.heard_from(peer, now)  # M2's liveness, C7's clock
        if state is None:
            if self._neighbours.on_probation(peer) and isinstance(msg, Hello):
                out = self._on_probation_hello(peer, msg, now)
                self._withdrawals.heard_hello(peer, msg.features, now)  # G12
                if SYNC in msg.features and peer in self._linked:  # G11: admitted, asks for routes
                    out += self._on_sync_request(peer, now)
                return out
            self._count("frames_from_stranger")
            return []
        if type(msg) is RegGossip:  # most frames: one type check, not a class pattern (3x the cost on 3.11)
            return self._on_gossip(peer, state, msg, now)
        if type(msg) is Keepalive:  # the next most frequent (rule M2): as the Keepalive case below
            if not msg.reply:
                state.last_sent = now
                return [make_keepalive(peer, msg.nonce, True)]
            self._keepalive_answered(state, msg.nonce, now)  # rule C4: a link round trip
            return []
        # Most frequent first: gossip, then pushes. A message type added to protocol.messages.Message
        # and not handled here fails type checking (assert_never).
        match msg:
            case RegGossip():
                return self._on_gossip(peer, state, msg, now)
            case Push():
                return self._on_push(peer, msg, now)
            case Receipt():
                return self._on_receipt(peer, msg, now)
            case ReceiptBatch():
                return self._on_receipt_batch(peer, msg, now)
            case RouteError():
                return self._on_route_error(peer, msg, now)
            case RegAnnounce():
                return self._tree.on_announce(peer, state, msg, now)
            case RegGraft():
                return self._tree.on_graft(peer, state, msg, now)
            case StemRepair():
                return self._on_stem_repair(peer, msg, now)
            case RouteSync():
                return self._on_route_sync(peer, msg, now)
            case RouteWithdraw():
                return self._withdrawals.on_frame(peer, msg, now)  # G12 (withdrawals.py)
            case Keepalive():
                if not msg.reply:
                    state.last_sent = now
                    return [Send(peer, Keepalive(msg.nonce, True))]
                self._keepalive_answered(state, msg.nonce, now)  # rule C4: a link round trip
                return []
            case PeerExchange():
                return self.add_candidates(list(msg.peers), now)
            case ErrorFrame():
                self._count("peer_errors")
                return []
            case Hello():  # on an active link: G11's request for routes (M4's probation: handled above)
                self._withdrawals.heard_hello(peer, msg.features, now)  # G12: it takes withdrawals
                return self._on_sync_request(peer, now) if SYNC in msg.features else []
            case _:
                assert_never(msg)

    # ------------------------------------------------------------------------------------------
    # time

    def get_timer(self) -> float | None:
        """The earliest time handle_timer wants to run (None: nothing armed)."""
        t = self._tick_at()  # M2 (membership.py)
        deadline = self._await.next_deadline()  # F6, S1 (awaited.py)
        if deadline is not None and (t is None or deadline < t):
            t = deadline
        retry = self._custody.next_due()  # C2 (kept.py): stale entries dropped here too, not on a wakeup
        if retry is not None and (t is None or retry < t):
            t = retry
        repair = self._repair_next()  # F8 (forwarding.py)
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
            out += self._retry(c, now)
        out += self._tree.timer(now)  # G9 (tree.py)
        out += self._answers_overdue(now)  # F6, S1 (forwarding.py)
        out += self._repairs_unanswered(now)  # F8 (forwarding.py)
        tick = self._tick_at()
        if tick is not None and now >= tick:
            out += self._tick(now)
        return out

    # Rules M2 (keepalives, liveness), S1 (decay, black holes), M4 (probation), M1 (refill, exchange).
    def _tick(self, now: float) -> list[Effect]:
        cfg = self.config
        out: list[Effect] = []
        interval = cfg.keepalive_interval_s
        dead_after = interval * cfg.keepalive_misses
        out += self._grace_expired(now)  # S1 (scoring.py)
        for p in self._homed.waiting():  # link-up announcements left over from peer_up (rule G5)
            out += self._announce_homed(p, now, ANNOUNCE_SHARE * cfg.reg_budget_per_peer_per_s * interval)
        for p in self._sync.answering():  # routes still to send to a neighbour that asked (rule G11)
            out += self._sync_send(p, now)
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
                out += self.peer_down(p, now, DisconnectReason.KEEPALIVE_TIMEOUT)
            elif now - st.last_sent >= ka_after:
                st.nonce += 1
                st.last_sent = st.ka_sent = now
                out.append(make_keepalive(p, st.nonce, False))
        for p in nb.dials_given_up(now):
            out += self.connect_failed(p, now)
        for p in nb.probations_ended(now):  # no "low" Hello came: refuse as full (M4)
            self._count("peer_refused_full")
            out.append(Disconnect(p, DisconnectReason.FULL))
        if self._stem.any_embargo():  # G8
            out += self._stem_embargo(now)
        out += self._restem_due_now(now)  # G10 (stem.py)
        if self._withdrawals.any():  # G12 (withdrawals.py): restores seen late, frames over the budget
            out += self._withdrawals.tick(now)
        out += self._repair_due_now(now)
        if nb.links_and_dials() < cfg.active_max:
            out += self._refill(now)
        out += self._exchange_due(now)  # M1 (membership.py)
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_INTERVAL_S
            self._sweep(now)
        self._set_tick(now + interval if nb.busy() else None)
        return out

    def _sweep(self, now: float) -> None:
        self._sweep_routes(now)  # gossip.py (G2): nothing to do until the table's earliest expiry
        self._seen.sweep(now)
        self._reverse.sweep(now)
        self._sweep_scores(now)  # scoring.py
        self._sweep_repairs(now)  # forwarding.py (F5c, F8c, F9)
        self._sync.sweep(now)  # G11 (syncstate.py)
        expired = self._custody.expire(now)
        if expired:
            self._count("custody_expired", expired)
        self._neighbours.sweep_bans(now)  # S2

    # ------------------------------------------------------------------------------------------
    # introspection

    def route_count(self) -> int:
        """Route ids with at least one next hop (a provisional one, rule G11, included)."""
        return self._routes.routed_count() + (self.provisional_count() if self._sync.any_provisional() else 0)

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
        """Former neighbours (export_anchors) into the redial list of rule M6, due now: the next _refill
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
            "reg_duplicate": self._duplicate_count(),  # G3 (gossip.py)
            **self._counts(),
        }
