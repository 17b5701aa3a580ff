"""Registration gossip, rules G1-G5: verified registrations set routes (first arrival), feasible later
arrivals become backup next hops, flood budgets bound what a neighbour or an origin can cost, and a
home announces its registrations to every new neighbour."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from inri.core.api import (
    Effect,
    Send,
    TraceLevel,
)
from inri.core.state import (
    MAX_CLOCK_SKEW_S,
    EngineContext,
    Neighbour,
    RuleGroup,
    make_gossip,
    make_send,
)
from inri.core.tables import Arrival, BoundedMap, RouteEntry, RouteTable
from inri.protocol.codec import encode_unchecked
from inri.protocol.messages import (
    RegGossip,
    Registration,
)

if TYPE_CHECKING:  # annotations only (the groups import each other: Engine.__init__ wires them)
    from inri.core.custody import CustodyRules
    from inri.core.floodstate import FloodState
    from inri.core.homed import HomedRoutes
    from inri.core.kept import CustodyTable
    from inri.core.scoring import ScoringRules
    from inri.core.stem import StemRules
    from inri.core.stemstate import StemState
    from inri.core.tables import CompactRouteTable, RouteTable
    from inri.core.tree import TreeGossip

# Link-up announcements (G5) use a quarter of a neighbour's gossip budget (burst, then rate): the rest
# stays for the gossip it forwards meanwhile, so announcing never costs the home its score there.
ANNOUNCE_SHARE = 0.25
# A full route table evicts route_max / this many of its earliest-expiring routes at once (rule G2): 1%.
EVICT_BATCH_DIVISOR = 100
# Bound once: Enum class attribute lookups cost several times a dict lookup on the per-frame path.
_FULL = TraceLevel.FULL
_NEWER, _STALE, _REPLAYED, _FEASIBLE = Arrival.NEWER, Arrival.STALE, Arrival.REPLAYED, Arrival.FEASIBLE

_REG_TRACE: BoundedMap[tuple[bytes, int], tuple[str, str, int]] = BoundedMap(65536)


def _reg_trace(registration: Registration) -> tuple[str, str, int]:
    """(label, route hex, gossip frame bytes) of a verified registration, computed once per (route, epoch)
    in the process (every relay of a simulation emits the same; keyed without hashing the whole
    registration, which is the cost on the hot path). A re-signed copy of the same epoch can differ
    in size by a varint byte: a trace figure, never a protocol decision."""
    key = (registration.route_id, registration.epoch)
    got = _REG_TRACE.get(key)
    if got is None:
        route_hex = registration.route_id.hex()
        got = (f"{route_hex}:{registration.epoch}", route_hex, _gossip_frame_bytes(registration))
        _REG_TRACE.put(key, got)
    return got


@lru_cache(maxsize=8192)
def _gossip_frame_bytes(registration: Registration) -> int:
    # TTL and hops are positive fixints (< 128) so the frame size depends on the registration only.
    return len(encode_unchecked(RegGossip(registration, 0, 0)))


gossip_frame_bytes = _gossip_frame_bytes  # bytes of one full registration frame (flood) of a registration


class GossipRules(RuleGroup):
    """G1-G4: the route table, built from registration gossip."""

    # The state this rule group owns (tests/test_core_owners.py; Engine.__init__ builds it).
    _emit_row: Callable[[tuple[Any, ...]], None] | None  # the tracer's row fast path (route_set rows)
    _tree_on: bool  # G9: the tree scheme (tree.py) instead of flooding
    reg_duplicates: int  # G3: gossip arrivals of a known (route, epoch): a plain int on the hot path

    # The rule groups this one calls (given by `wire`).
    _custody_rules: CustodyRules
    _scoring_rules: ScoringRules
    _stem_rules: StemRules

    def __init__(self, ctx: EngineContext, custody: CustodyTable, flood: FloodState, homed: HomedRoutes,
                 routes: RouteTable | CompactRouteTable, stem: StemState, tree: TreeGossip,
                 emit_row: Callable[[tuple[Any, ...]], None] | None) -> None:
        super().__init__(ctx)
        self._custody = custody
        self._flood = flood
        self._homed = homed
        self._routes = routes
        self._stem = stem
        self._tree = tree
        # Optional fast path: a tracer may take whole rows in trace-schema column order.
        self._emit_row = emit_row
        # Tree gossip (tree.py, rule G9); the tables stay empty with gossip_scheme "flood".
        self._tree_on = self.config.gossip_scheme == "tree"
        self.reg_duplicates = 0  # gossip arrivals of a known (route, epoch): a plain int on the hot path

    def wire(self, *, custody: CustodyRules, scoring: ScoringRules, stem: StemRules) -> None:
        """The other rule groups this one calls (Engine.__init__, once all are built)."""
        self._custody_rules = custody
        self._scoring_rules = scoring
        self._stem_rules = stem

    def duplicate_count(self) -> int:
        """G3: how many gossip arrivals were of a (route id, epoch) already known (stats)."""
        return self.reg_duplicates

    # Rules G2 (at distance 0: this relay is the home).
    def register(self, registration: Registration, now: float, *, restart: bool = False) -> list[Effect]:
        """A device homed here registered or refreshed: originate its gossip (rule G2 at distance 0).
        restart: the home relay re-registers, as it starts, a registration its store kept (with the stem
        on it then goes out at a new route generation, G10)."""
        rid = registration.route_id
        old = self._routes.get(rid)
        # A route of this epoch learned from another home (distance > 0) is no reason to refuse: the device
        # registered here too (homes in two places, issue 42 item 3), and this relay originates it as well.
        if old is not None and (RouteTable.epoch(old) > registration.epoch
                                or (RouteTable.epoch(old) == registration.epoch and RouteTable.distance(old) == 0)):
            self._count("reg_local_stale")
            return []
        self._routes.originate(rid, registration.epoch, self._local_expiry(registration.expires_at))
        self._homed.keep(registration)  # announced to every neighbour whose link comes up later (G5)
        if self.config.stem:  # G6: a stem before the flood (stem.py); G5 then announces with stem frames
            return self._stem_rules.stem_register(registration, now, restart)
        out: list[Effect] = []
        if self._tree_on:  # G9: full frames along the eager links, announcements on the others (tree.py)
            out = self._tree.forward(registration, self.config.gossip_ttl, 0, None, now, 0.0)
        else:
            gossip = RegGossip(registration, self.config.gossip_ttl, 0)
            for p, st in self._linked.items():
                st.last_sent = now
                out.append(Send(p, gossip))
        if self._level:
            self._trace(now, "reg_originated", msg=f"{rid.hex()}:{registration.epoch}", route=rid.hex(),
                        epoch=registration.epoch, ttl=self.config.gossip_ttl, hops=0, count=len(out),
                        nbytes=_gossip_frame_bytes(registration))
        return out

    # Rule G2.
    def unregister(self, route_id: bytes, now: float) -> list[Effect]:
        """A device homed here unregistered: forget its route here (elsewhere it expires by TTL)."""
        self._routes.pop(route_id, None)
        self._flood.forget(route_id)
        self._homed.forget(route_id)
        self._stem_rules.forget_generation(route_id)
        return []

    # Rule G5.
    def announce_homed(self, peer: str, now: float, budget: float) -> list[Effect]:
        """Announce up to `budget` registrations homed here to a neighbour whose link came up (G5).

        hops 0 and TTL 1: the neighbour takes the route (or a better next hop for it) and forwards
        nothing, so a restarted home costs one frame per registration and link, and no relay further
        away sees a (route, epoch) again that it already had (which it would count as a replay).
        """
        homed = self._homed
        st = self._linked.get(peer)
        if st is None or not homed.queued(peer):
            homed.drop_peer(peer)
            return []
        out: list[Effect] = []
        n = max(1, int(budget))
        stem = self.config.stem
        while n:
            rid = homed.next_for(peer)  # a queue left empty goes
            if rid is None:
                break
            reg = homed.get(rid)
            if stem:  # as a stem frame, from the home and from every stem relay alike (stem.py)
                frame = self._stem_rules.stem_announcement(rid, reg, now)
                if frame is not None:
                    out.append(Send(peer, frame))
                    n -= 1
                    if reg is not None and (self._stem.branching(rid) or self._stem.embargoed((rid, reg.epoch))):
                        # G10b: a neighbour that may not hold this generation yet starts a stem of its own
                        self._stem.add_branch(rid, peer)
            elif reg is not None and reg.expires_at > now + self._ctx.wall_offset:
                out.append(Send(peer, RegGossip(reg, 1, 0)))
                n -= 1
        if out:
            st.last_sent = now
            self._count("reg_announced", len(out))
        return out

    # Rules G1, G4 (refusals are counted and traced).
    def drop_reg(self, now: float, reg: Registration, peer: str, reason: str, penalty: float = 0.0) -> list[Effect]:
        """Refuse a registration copy from peer: counted, traced, and penalty taken from peer's score."""
        self._count("reg_dropped_" + reason)
        if self._level:
            self._trace(now, "reg_dropped", msg=f"{reg.route_id.hex()}:{reg.epoch}", route=reg.route_id.hex(),
                        peer=peer, epoch=reg.epoch, reason=reason)
        return self._scoring_rules.score(peer, penalty, now, reason) if penalty else []

    # Rules G1 (verify, newest epoch), G2 (first arrival), G3 (duplicates), G4 (budgets).
    def on_gossip(self, peer: str, state: Neighbour, msg: RegGossip, now: float) -> list[Effect]:
        """Registration gossip from a neighbour (Engine._on_gossip, a hook, calls it)."""
        if msg.stem:  # G6-G7: a stem frame (stem.py)
            return self._stem_rules.on_stem(peer, state, msg, now)
        cfg = self.config
        reg = msg.registration
        rid = reg.route_id
        epoch = reg.epoch
        routes = self._routes
        entry = routes.get(rid)
        if entry is not None and (msg.generation or self._stem.generations()):  # G10: a route generation (stem.py)
            done = self._stem_rules.generation_arrival(peer, msg, entry, now)
            if done is not None:
                return done
            entry = routes.get(rid)  # None when a higher generation replaced the route
        if entry is not None:
            arrival = routes.arrival(entry, epoch, peer, msg.hops, cfg.route_k)  # one call per frame
            if arrival is not _NEWER:
                if arrival is _STALE:
                    return self.drop_reg(now, reg, peer, "stale_epoch", cfg.score_replay)
                self.reg_duplicates += 1  # the same epoch (most gossip arrivals): G3
                if self._tree_on and not (msg.hops == 0 and msg.ttl == 1):  # G9: a full copy we had: prune
                    self._tree.duplicate(peer, rid, now)
                if self._stem.embargoed((rid, epoch)):  # G7-G8: the flood reached a stem relay
                    return self._stem_rules.stem_flood_back(peer, msg, now)
                if arrival is _REPLAYED:  # it gave us this (route, epoch) before: honest relays forward once
                    if msg.hops == 0 and msg.ttl == 1:  # ...unless it is the home announcing it on a new link (G5)
                        return []
                    if not self._shorter_than_claimed(peer, msg, entry):  # ...or again with fewer hops (G3b)
                        return self.drop_reg(now, reg, peer, "replayed", cfg.score_replay)
                    return self._reforward(peer, msg, now)
                if self._tree_on and self._tree.earlier(peer, msg, entry, now):  # G9: a faster path
                    return []
                if self._flood.is_deep(rid, epoch):  # G3b: a copy with more TTL left
                    again = self._reforward(peer, msg, now)
                    if arrival is _FEASIBLE:
                        again += self._add_backup(peer, msg, entry, rid, now)
                    return again
                if arrival is _FEASIBLE:  # closer than our feasibility distance, and room: a backup
                    return self._add_backup(peer, msg, entry, rid, now)
                if (msg.hops == 0 and msg.ttl == 1 and msg.hops < routes.distance(entry)
                        and routes.worst_hops(entry) > 1):
                    # A home's link-up announcement (G5) with no room left: the home itself, on a link
                    # that came up, is worth more than our worst backup.
                    routes.drop_next_hop(rid, entry, routes.next_hops(entry)[-1])
                    return self._add_backup(peer, msg, routes[rid], rid, now)
                if self._level >= _FULL:
                    self._trace(now, "reg_duplicate", msg=f"{rid.hex()}:{epoch}", route=rid.hex(), peer=peer,
                                hops=msg.hops + 1, epoch=epoch)
                return []
        # Per-neighbour budget (G4): every new (route, epoch) costs the sender one token.
        if not state.reg_budget.take(now, cfg.reg_budget_per_peer_per_s, cfg.reg_budget_peer_burst):
            return self.drop_reg(now, reg, peer, "budget_peer", cfg.score_budget_drop)
        off = self._ctx.wall_offset
        wall = now + off  # registrations carry wall-clock times
        expires_at = reg.expires_at
        if expires_at <= wall:
            return self.drop_reg(now, reg, peer, "expired")
        if reg.issued_at > wall + MAX_CLOCK_SKEW_S:
            return self.drop_reg(now, reg, peer, "future")
        if not self._verifier.verify_registration(reg):
            return self.drop_reg(now, reg, peer, "bad_signature", cfg.score_bad_signature)
        if msg.generation and not self._stem_rules.generation_valid(msg):  # G10: only the home issues generations
            return self.drop_reg(now, reg, peer, "bad_signature", cfg.score_bad_signature)
        if entry is not None:  # a refresh (newer epoch) of a known route id: per-origin budget
            if not self._flood.refresh_allowed(rid, now, cfg.reg_budget_per_origin_per_s, cfg.reg_budget_burst):
                return self.drop_reg(now, reg, peer, "budget_origin")
        elif len(routes) >= cfg.route_max:
            self.evict_route(now)
        hops = msg.hops + 1
        # The route lives as long as the registration (at most 30 days, limits.MAX_LIFETIME_S), on the
        # engine's monotonic clock: a wall-clock step later neither shortens nor stretches it.
        # (_local_expiry inline: once per new (route, epoch); offset 0 keeps the shared int.)
        routes.set_first(rid, epoch, expires_at - off if off else expires_at, peer, hops)
        if msg.generation or self._stem.generations():
            self._stem_rules.set_generation(rid, msg)
        if self._custody:  # C3c (custody.py)
            self._custody_rules.route_renewed(rid, now)
        out: list[Effect] = []
        ttl = msg.ttl - 1
        if hops > ttl:  # G3b: this copy spent more TTL than it has left; a later, shorter one goes on too
            self._flood.went_deep(rid, epoch, hops)
        if self._tree_on:  # G9 (tree.py)
            out = self._tree.first(reg, ttl, hops, peer, now - msg.lag_ms / 1000.0 if msg.lag_ms else now, now,
                                   cfg.forward_jitter_s)
        elif ttl > 0:
            fwd = RegGossip(reg, ttl, hops, False, msg.generation, msg.generation_sig) if msg.generation else \
                make_gossip(reg, ttl, hops)
            jitter = cfg.forward_jitter_s
            for p, st in self._linked.items():
                if p != peer:
                    st.last_sent = now
                    out.append(make_send(p, fwd, self._rng.random() * jitter if jitter else 0.0))
        if self._level:
            label, route_hex, nbytes = _reg_trace(reg)
            if self._tree_on:  # G9: the lag field of the frames forwarded
                nbytes += self._tree.lag_bytes()
            if self._emit_row is not None:  # the hottest trace row: positional, no keyword dict
                self._emit_row((now, self.relay_id, "route_set", label, route_hex, peer, hops, msg.ttl, epoch,
                                len(out), nbytes, None))
            else:
                self._trace(now, "route_set", msg=label, route=route_hex, peer=peer, hops=hops,
                            ttl=msg.ttl, epoch=epoch, count=len(out), nbytes=nbytes)
        return out

    # Rule G3b.
    @staticmethod
    def _shorter_than_claimed(peer: str, msg: RegGossip, entry: RouteEntry) -> bool:
        """peer, already a next hop for this (route, epoch), sends it again with fewer hops than it did,
        and its first copy had spent more TTL than it had left (hops + ttl is the same on every copy
        of one flood): a relay re-forwarding a shorter copy (G3b), not a replay."""
        total = msg.hops + msg.ttl
        return any(p == peer and msg.hops + 1 < h and 2 * (h - 1) > total for p, h in RouteTable.vector(entry))

    # Rule G3b.
    def _reforward(self, peer: str, msg: RegGossip, now: float) -> list[Effect]:
        """Forward a later copy of a (route, epoch) whose first copy spent more than half its TTL here,
        when this copy is shorter than any forwarded so far: latency-first flooding cannot then exhaust
        the hop budget of relays a shorter path reaches (docs/protocol.md, "TTLs"). Each relay does this
        at most once per hop saved, only for the few (route, epoch)s whose first copy came a long way."""
        reg = msg.registration
        hops = msg.hops + 1
        ttl = msg.ttl - 1
        if ttl <= 0 or not self._flood.shorter(reg.route_id, reg.epoch, hops):
            return []
        self._count("reg_reforwarded")
        fwd = RegGossip(reg, ttl, hops, False, msg.generation, msg.generation_sig)
        jitter = self.config.forward_jitter_s
        out: list[Effect] = []
        for p, st in self._linked.items():
            if p != peer:
                st.last_sent = now
                out.append(make_send(p, fwd, self._rng.random() * jitter if jitter else 0.0))
        if self._level:  # summary level: its copies are gossip messages (docs/metrics.md)
            label, route_hex, nbytes = _reg_trace(reg)
            self._trace(now, "reg_reforwarded", msg=label, route=route_hex, peer=peer, hops=hops, ttl=msg.ttl,
                        epoch=reg.epoch, count=len(out), nbytes=nbytes)
        return out

    # Rule G3.
    def _add_backup(self, peer: str, msg: RegGossip, entry: RouteEntry, rid: bytes, now: float) -> list[Effect]:
        # G3: a feasible arrival from a new neighbour while there is room: a backup next hop.
        reg = msg.registration
        if not self._verifier.verify_registration(reg):
            return self.drop_reg(now, reg, peer, "bad_signature", self.config.score_bad_signature)
        self._routes.add_backup(rid, entry, peer, msg.hops + 1)
        if self._level >= _FULL:
            self._trace(now, "route_backup", msg=f"{rid.hex()}:{reg.epoch}", route=rid.hex(), peer=peer,
                        hops=msg.hops + 1, epoch=reg.epoch)
        return []

    # Rules G2 (bounded table).
    def evict_route(self, now: float) -> None:
        """Make room in a full route table: drop the routes that expire first."""
        # Table full: drop the entries that expire first (bounded memory; traced as drops), a batch of
        # route_max / EVICT_BATCH_DIVISOR at once: finding them is one scan of the table (0.2-0.4 s at 1M
        # routes), which a new route per scan would pay for every registration once the table is full.
        batch = max(1, self.config.route_max // EVICT_BATCH_DIVISOR)
        for victim in self._routes.evict_earliest(batch):
            if self._stem.repairable():  # G10 state of the route
                self._stem_rules.forget_generation(victim)
            self._count("routes_evicted")
            if self._level >= _FULL:
                self._trace(now, "route_expired", route=victim.hex(), reason="evicted")

    # Rules G2 (routes live as long as their registration).
    def sweep_routes(self, now: float) -> None:
        """Drop the routes whose registration expired (the engine's sweep)."""
        for r in self._routes.sweep(now):
            self._flood.forget(r)
            self._stem.release(r)
            if self._stem.repairable():  # G10 state of a route gone
                self._stem_rules.forget_generation(r)
            if self._level >= _FULL:
                self._trace(now, "route_expired", route=r.hex(), reason="lifetime")
