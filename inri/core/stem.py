"""The stem phase of registration gossip (Dandelion++, Fanti et al. 2018), rules G6-G8.

Without it the home relay starts the flood at hops 0, and a handful of colluding relays triangulate
it from the hop counts at which each first hears the gossip (docs/protocol.md, "What relays learn").
With `[engine] stem = true` the home relay instead hands the registration to ONE neighbour in a stem
frame; each stem relay either passes it on to one neighbour or, with probability
`stem_fluff_probability` (q), "fluffs": starts the ordinary flood (rules G1-G4) as if it were a
relay at distance 2 + noise. The stem length L is geometric: P(L = k) = (1 - q)^(k-1) q, k >= 1.

- G6. Successor choice is a keyed pseudo-random function of (this relay's secret stem key, the
  current stem period, route id): the successor (among the active neighbours, sorted, but the
  predecessor) and the fluff coin. So every refresh (later epoch) of one route id takes the same path
  within a period (refreshes give an intersection attack nothing new), while two route ids, even of
  one device, take independent paths; and what a relay learns about one route id's path tells it
  nothing about another's (the graph-learning attack of Dandelion's first version needs a fixed
  per-neighbour mapping to learn). A stem frame carries no position: ttl and hops are fixed
  (gossip_ttl, 0), so a stem relay cannot tell whether its predecessor is the home.
- G7. Each stem relay keeps the reverse path as its route: next hop = its predecessor, distance 2,
  and takes no backup from the flood (a flood copy, hops >= 2, is never feasible against distance 2,
  rule G3), so pushes reach the home only through the stem and routes stay loop-free: every flood
  route ends at the fluff relay, every stem route at the home. A stem that comes back to a relay
  already on it (a loop) is bounced back to its sender, which fluffs. The predecessor being the only
  way to the home, a `no route` answer or an unanswered push from it drops nothing (`StemState.keeps`).
  With the predecessor down, or silent since a push left, the stem relay answers `home unreachable`
  (forwarding.py, `home_hop`), as the home's own neighbour does with the stem off (F3, F6): behind
  it is the home, or a failed stem relay the home re-stems around (G10), and no ring search finds a
  way in meanwhile (every flood route leads into the stem). It answered `no route` before, and every
  push to a dead home then cost a cascade of local repairs and rings 1-7 (churn-10k: 480 messages per
  delivered push, 96.7 with the stem off).
- G8. Fail-safe (Dandelion++ embargo): every stem relay, the home included, arms a timer of
  stem_embargo_s x (1 + U[0, 1)); the flood of its (route id, epoch) coming back cancels it; if it
  expires first (a stem relay dropped the frame, or crashed) the relay fluffs itself. The fluff relay
  floods to every neighbour, its predecessor included, and the first flood copy to reach a stem relay
  (or the home) is forwarded on like any relay's (G2): so the flood walks back down the stem at once,
  and relays nearer a stem relay or the home than the fluff relay route to it directly, not via the
  fluff relay and back down the stem. The flood is then an ordinary flood from the fluff relay over the
  whole mesh (the hop counts grow from it), and the stem's length costs pushes little stretch.
- G10. Re-stem. A relay whose stem successor's link goes down (the home, or a stem relay: the
  successor, or the fluff relay, failed) cannot re-root the routes below the break within the epoch
  (feasibility distances never grow; G7 keeps no backup). The home can: it re-stems the registration
  at route generation g + 1 (at least the seconds since the registration was issued), signed with the
  registration's receipt key, whose private half only the home holds; a stem relay asks for it with a
  StemRepair frame to its predecessor, passed back along the stem (each relay accepts one only from its
  own stem successor, once per generation and half stem_embargo_s; the relay that started it asks
  again every stem_embargo_s, REPAIR_TRIES requests in all, until a new generation reaches it; the home
  re-stems at most once per stem_embargo_s). The new
  stem takes the same keyed draws (G6), so it retraces the stem up to the break and goes around the
  failed relay; its flood replaces every route of an older generation of the epoch, and frames of an
  older generation are dropped. A relay cannot forge a generation (it would redirect a route id's
  routes mesh-wide), and a registration without a receipt key is not re-stemmed.
- G10b. A home that issues a generation with no neighbour up (a restart, or before its first link) has
  no stem successor: the link-up announcements (G5) hand the generation to each new neighbour, which
  takes it as a stem of its own; so may a neighbour whose link comes up before the generation's flood
  came back to the home (its embargo is still armed). Until the next generation each of them is a
  stem successor for G10 (`StemState.branching`): its link going down re-stems, and it may ask for one.
- G5 with the stem on: link-up announcements are stem frames, from the home and from every stem relay
  whose stem route works, so they do not single the home out; a flood relay takes the sender as a
  next hop at distance 2 (a stem route never passes a flood relay: loop-free).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from inri.core.api import Effect, Send, TraceLevel
from inri.core.budget import TokenBucket
from inri.core.state import MAX_CLOCK_SKEW_S, EngineContext, Neighbour, RuleGroup
from inri.core.stemstate import STEM_DISTANCE
from inri.core.tables import RouteEntry, RouteTable
from inri.protocol.keys import generation_signed_bytes
from inri.protocol.messages import RegGossip, Registration, StemRepair

if TYPE_CHECKING:  # annotations only (the groups import each other: Engine.__init__ wires them)
    from inri.core.custody import CustodyRules
    from inri.core.floodstate import FloodState
    from inri.core.gossip import GossipRules
    from inri.core.homed import HomedRoutes
    from inri.core.kept import CustodyTable
    from inri.core.stemstate import StemState
    from inri.core.tables import CompactRouteTable, RouteTable

# G10: a relay whose stem successor's link went down sends its StemRepair this many times in all (once per
# stem_embargo_s) until a new generation of the epoch reaches it: one lost frame on the way back up the
# stem must not leave the routes below the break dead (a stem relay below it answers `home unreachable`,
# G7, so custodians wait for the re-stem instead of searching).
REPAIR_TRIES = 3
# G13: the route generations a home issues on request, a second (and at once), all its route ids together:
# each costs a flood, and any neighbour may ask (withdrawals.py); one route id at most once per
# stem_embargo_s besides.
REGEN_PER_S = 1.0
REGEN_BURST = 20.0
_SCALE = float(1 << 64)


class StemRules(RuleGroup):
    """G6-G8: the stem (anonymity) phase before the flood."""

    # The state this rule group owns (tests/test_core_owners.py; Engine.__init__ builds it).
    _stem_key: bytes  # this relay's secret for its successor choices (G6)
    _restem_due: dict[bytes, float]
    _repair_asked: dict[bytes, tuple[int, int, float]]
    _repair_due: dict[bytes, tuple[float, int]]
    _regen_budget: TokenBucket  # G13: the generations this home issues on request, all route ids together

    # The rule groups this one calls (given by `wire`).
    _custody_rules: CustodyRules
    _gossip_rules: GossipRules

    def __init__(self, ctx: EngineContext, custody: CustodyTable, flood: FloodState, homed: HomedRoutes,
                 routes: RouteTable | CompactRouteTable, stem: StemState) -> None:
        super().__init__(ctx)
        self._custody = custody
        self._flood = flood
        self._homed = homed
        self._routes = routes
        self._stem = stem
        # Stem phase (stem.py): the key is drawn only with the stem on, so a stem-off run's random
        # stream (and simulator trace) is unchanged.
        self._stem_key = self._rng.randbytes(32) if self.config.stem else b""
        self._restem_due: dict[bytes, float] = {}
        self._repair_asked: dict[bytes, tuple[int, int, float]] = {}
        self._repair_due: dict[bytes, tuple[float, int]] = {}
        self._regen_budget = TokenBucket(REGEN_BURST, 0.0)

    def wire(self, *, custody: CustodyRules, gossip: GossipRules) -> None:
        """The other rule groups this one calls (Engine.__init__, once all are built)."""
        self._custody_rules = custody
        self._gossip_rules = gossip

    # Rule G6.
    def _stem_draw(self, rid: bytes, now: float) -> tuple[float, int]:
        """(fluff coin in [0, 1), successor index draw) for rid in the current stem period: keyed and
        deterministic, so refreshes of rid take the same path while the period lasts."""
        period = int(now // self.config.stem_epoch_s)
        h = hashlib.blake2b(period.to_bytes(8, "big") + rid, key=self._stem_key, digest_size=16).digest()
        return int.from_bytes(h[:8], "big") / _SCALE, int.from_bytes(h[8:], "big")

    def _stem_successor(self, rid: bytes, exclude: str | None, draw: int) -> str | None:
        options = sorted(p for p in self._linked if p != exclude)
        return options[draw % len(options)] if options else None

    # Rules G6, G8 (at the home: rule G2 with a stem in front).
    def _stem_originate(self, registration: Registration, now: float, reason: str = "stem") -> list[Effect]:
        """The home relay's first step: the registration goes to one neighbour as a stem frame."""
        _, draw = self._stem_draw(registration.route_id, now)
        succ = self._stem_successor(registration.route_id, None, draw)
        if succ is not None:
            self._arm_embargo(registration, None, succ, now)
            self._stem.pass_on(registration.route_id, succ)  # G10: its link going down re-stems
            self._stem.end_branches(registration.route_id)
        else:  # G10b: every neighbour the link-up announcements give it to starts a stem of its own
            self._stem.start_branches(registration.route_id)
        if self._level:
            self._trace(now, "reg_originated", msg=f"{registration.route_id.hex()}:{registration.epoch}",
                        route=registration.route_id.hex(), epoch=registration.epoch, ttl=self.config.gossip_ttl,
                        hops=0, count=int(succ is not None), peer=succ,
                        reason=reason)
        if succ is None:
            # No neighbour yet (a home starting up): the link-up announcements (G5) take it to the first
            # neighbours as stem frames. No embargo: a home that floods would name itself.
            return []
        return [self._stem_send(succ, registration, now)]

    # Rules G6, G10 (at the home: rule G2 with a stem in front).
    def stem_register(self, registration: Registration, now: float, restart: bool = False) -> list[Effect]:
        """A registration homed here registered or refreshed. One re-registered as the home starts
        (restart) may have routes of its epoch along a stem that no longer leads here, which a stem
        frame of the same generation would not replace (relays keep the first arrival of an epoch): it
        goes out at a new route generation (G10) when the registration has a receipt key."""
        rid = registration.route_id
        if restart and registration.receipt_key is not None:
            out = self._restem(rid, now)
            if self._stem.generation_of(rid, registration.epoch):
                return out
        return self._stem_originate(registration, now)

    def _stem_send(self, peer: str, registration: Registration, now: float) -> Send:
        self._linked[peer].last_sent = now  # M2
        return Send(peer, self._gossip(registration, self.config.gossip_ttl, 0, True))

    def _gossip(self, reg: Registration, ttl: int, hops: int, stem: bool = False) -> RegGossip:
        """A gossip frame of reg at this relay's generation of its (route id, epoch) (G10)."""
        g = self._stem.generation(reg.route_id)
        if g is not None and g[0] == reg.epoch:
            return RegGossip(reg, ttl, hops, stem, g[1], g[2])
        return RegGossip(reg, ttl, hops, stem)

    def _arm_embargo(self, registration: Registration, pred: str | None, succ: str | None, now: float) -> None:
        until = now + self.config.stem_embargo_s * (1.0 + self._rng.random())
        self._stem.arm((registration.route_id, registration.epoch), (until, registration, pred, succ))

    # Rules G1 and G4 (the same checks as the flood's), G6, G7.
    def on_stem(self, peer: str, state: Neighbour, msg: RegGossip, now: float) -> list[Effect]:
        """A stem frame from peer: become a stem relay of (route id, epoch), then pass it on or fluff."""
        cfg = self.config
        reg = msg.registration
        rid = reg.route_id
        key = (rid, reg.epoch)
        routes = self._routes
        entry = routes.get(rid)
        if entry is not None and (msg.generation or self._stem.generations()):  # G10
            done = self.generation_arrival(peer, msg, entry, now)
            if done is not None:
                return done
            entry = routes.get(rid)
        if entry is not None:
            known = routes.epoch(entry)
            if reg.epoch == known:
                waiting = self._stem.waiting(key)
                if waiting is None:  # the flood of this epoch is out: a link-up announcement (G5)
                    return self._stem_offer(peer, reg, entry, now)
                # The stem came back to a relay on it (G7). Every relay bounces it to the sender, and
                # the sender, seeing its own successor bounce it, fluffs: so a bounce tells nothing
                # about who bounced (the home bounces like any other), and the home never fluffs.
                if peer != waiting[3]:
                    self._count("stem_bounced")
                    return [self._stem_send(peer, reg, now)]
                self._count("stem_loop")
                self._stem.end_embargo(key)
                self._stem.drop_successor(rid)
                return self._stem_fluff(reg, None, now)
            if reg.epoch < known:
                return self._gossip_rules.drop_reg(now, reg, peer, "stale_epoch", cfg.score_replay)
        if not state.reg_budget.take(now, cfg.reg_budget_per_peer_per_s, cfg.reg_budget_peer_burst):
            return self._gossip_rules.drop_reg(now, reg, peer, "budget_peer", cfg.score_budget_drop)
        wall = now + self._ctx.wall_offset
        if reg.expires_at <= wall:
            return self._gossip_rules.drop_reg(now, reg, peer, "expired")
        if reg.issued_at > wall + MAX_CLOCK_SKEW_S:
            return self._gossip_rules.drop_reg(now, reg, peer, "future")
        if not self._verifier.verify_registration(reg):
            return self._gossip_rules.drop_reg(now, reg, peer, "bad_signature", cfg.score_bad_signature)
        if msg.generation and not self.generation_valid(msg):
            return self._gossip_rules.drop_reg(now, reg, peer, "bad_signature", cfg.score_bad_signature)
        if entry is not None:
            if not self._flood.refresh_allowed(rid, now, cfg.reg_budget_per_origin_per_s, float(cfg.reg_budget_burst)):
                return self._gossip_rules.drop_reg(now, reg, peer, "budget_origin")
        elif len(routes) >= cfg.route_max:
            self._gossip_rules.evict_route(now)
        routes.set_first(rid, reg.epoch, self._local_expiry(reg.expires_at), peer, STEM_DISTANCE)
        if msg.generation or self._stem.generations():
            self.set_generation(rid, msg)
        if self._custody:  # C3c (custody.py)
            self._custody_rules.route_renewed(rid, now)
        self._stem.drop_successor(rid)
        self._stem.hold(rid, reg)  # announced to new neighbours while the stem route lives (G5)
        coin, draw = self._stem_draw(rid, now)
        if not any(p != peer for p in self._linked):
            # A dead end (no neighbour but the predecessor): its flood would reach nobody. Hand the stem
            # back as a loop is (G7): the predecessor fluffs, and its flood ends the embargo here.
            self._count("stem_dead_end")
            self._arm_embargo(reg, peer, peer, now)
            if self._level:
                self._trace_stem(now, reg, peer, 1)
            return [self._stem_send(peer, reg, now)]
        succ = None if coin < cfg.stem_fluff_probability else self._stem_successor(rid, peer, draw)
        if succ is None:  # fluff
            if self._level:
                self._trace_stem(now, reg, peer, 0)
            return self._stem_fluff(reg, None, now)  # to the predecessor too (G8: the flood walks back down the stem)
        self._arm_embargo(reg, peer, succ, now)
        self._stem.pass_on(rid, succ)  # G10
        if self._level:
            self._trace_stem(now, reg, peer, 1)
        return [self._stem_send(succ, reg, now)]

    # Rule G5 with the stem on.
    def stem_announcement(self, rid: bytes, homed: Registration | None, now: float) -> RegGossip | None:
        """The link-up announcement of rid (G5) with the stem on: a stem frame, sent alike by the home and
        by every stem relay whose route still works (its predecessor's link is up), so a new neighbour
        cannot tell the home from a stem relay. None: nothing (left) to announce."""
        entry = self._routes.get(rid)
        if entry is None:
            self._stem.release(rid)
            return None
        distance = RouteTable.distance(entry)
        reg = homed if distance == 0 else self._stem.held(rid)
        if reg is None or reg.epoch != RouteTable.epoch(entry):
            self._stem.release(rid)  # superseded by a newer epoch's flood
            return None
        if reg.expires_at <= now + self._ctx.wall_offset:
            return None
        if distance and not (distance == STEM_DISTANCE and RouteTable.primary(entry) in self._linked):
            return None  # a broken stem route: announcing it would draw pushes into a dead end
        return self._gossip(reg, self.config.gossip_ttl, 0, True)

    def _stem_offer(self, peer: str, reg: Registration, entry: RouteEntry, now: float) -> list[Effect]:
        """A stem frame of a (route id, epoch) whose flood is out: peer announces a stem route (G5). A
        flood relay takes peer as a next hop at distance STEM_DISTANCE (replacing its worst when full),
        loop-free: a stem route leads down the stem to the home, never through a flood relay. The home
        and stem relays keep their routes (G7)."""
        routes = self._routes
        rid = reg.route_id
        if RouteTable.distance(entry) <= STEM_DISTANCE or RouteTable.claims(entry, peer):
            return []
        full = not RouteTable.has_room(entry, self.config.route_k)
        if full and RouteTable.worst_hops(entry) <= STEM_DISTANCE:
            return []
        if not self._verifier.verify_registration(reg):
            return self._gossip_rules.drop_reg(now, reg, peer, "bad_signature", self.config.score_bad_signature)
        if full:
            routes.drop_next_hop(rid, entry, RouteTable.next_hops(entry)[-1])
            entry = routes[rid]
        routes.add_backup(rid, entry, peer, STEM_DISTANCE)
        self._count("stem_offer_taken")
        if self._level >= TraceLevel.FULL:
            self._trace(now, "route_backup", msg=f"{rid.hex()}:{reg.epoch}", route=rid.hex(), peer=peer,
                        hops=STEM_DISTANCE, epoch=reg.epoch, reason="stem_announce")
        return []

    def _trace_stem(self, now: float, reg: Registration, peer: str, count: int) -> None:
        # A stem relay caches a route like a flooding relay does (route_set, so coverage counts it);
        # reason "stem" tells the rows apart (count 1: passed on, 0: fluffed here).
        self._trace(now, "route_set", msg=f"{reg.route_id.hex()}:{reg.epoch}", route=reg.route_id.hex(), peer=peer,
                    hops=STEM_DISTANCE, ttl=self.config.gossip_ttl, epoch=reg.epoch, count=count, reason="stem")

    # Rules G6 (fluff), G8 (the fail-safe fluffs the same way).
    def _stem_fluff(self, reg: Registration, skip: str | None, now: float) -> list[Effect]:
        """Start the flood here, at hops STEM_DISTANCE + U{0..stem_hop_noise}: the flood's hop counts
        measure distance from this relay, not from the home, and the noise hides even that from a
        lone observer."""
        cfg = self.config
        hops = STEM_DISTANCE + (self._rng.randint(0, cfg.stem_hop_noise) if cfg.stem_hop_noise else 0)
        gossip = self._gossip(reg, cfg.gossip_ttl, hops)
        out: list[Effect] = []
        for p, st in self._linked.items():
            if p != skip:
                st.last_sent = now
                out.append(Send(p, gossip))
        self._count("stem_fluffed")
        if self._level >= TraceLevel.FULL:
            self._trace(now, "reg_fluffed", msg=f"{reg.route_id.hex()}:{reg.epoch}", route=reg.route_id.hex(),
                        epoch=reg.epoch, hops=hops, count=len(out))
        return out

    # Rules G7, G8.
    def stem_flood_back(self, peer: str, msg: RegGossip, now: float) -> list[Effect]:
        """The flood reached a stem relay (or the home) for the first time: its embargo is over, and it
        forwards the flood once like any relay (G2) while its own route stays the stem. So relays
        beyond a stem relay route to it directly instead of via the fluff relay and back along the
        stem (shorter pushes); the hop counts still grow from the fluff relay, so they reveal nothing
        more. Not to its stem successor, whose route points here: a copy from its own next hop would
        be a replay to it (G3)."""
        reg = msg.registration
        waiting = self._stem.end_embargo((reg.route_id, reg.epoch))
        ttl = msg.ttl - 1
        if ttl <= 0:
            return []
        fwd = RegGossip(reg, ttl, msg.hops + 1, False, msg.generation, msg.generation_sig)
        out: list[Effect] = []
        for p, st in self._linked.items():
            if p != peer and p != waiting[3]:
                st.last_sent = now
                out.append(Send(p, fwd))
        return out

    # Rule G8 (from the engine's periodic timer).
    def stem_embargo(self, now: float) -> list[Effect]:
        """Fluff every stem registration whose flood did not come back in time."""
        out: list[Effect] = []
        for key, (_, reg, pred, succ) in self._stem.pop_overdue(now):
            entry = self._routes.get(key[0])
            if entry is None or RouteTable.epoch(entry) != key[1] or reg.expires_at <= now + self._ctx.wall_offset:
                continue  # superseded, unregistered or expired meanwhile
            if not self._linked:  # nobody to tell yet: try again later
                self._stem.arm(key, (now + self.config.stem_embargo_s, reg, pred, succ))
                continue
            self._count("stem_embargo_fired")
            # Not to the successor: its route points here. And this relay (the home too) keeps it as its
            # stem successor (G10): that route still leads through here, so its link going down still
            # re-stems. It did not (the fail-safe forgot it): a home that had flooded itself left the
            # relays below its successor answering `home unreachable` (G7) with no re-stem to come.
            out += self._stem_fluff(reg, succ, now)
        return out

    # Rule G10: route generations, issued by the home to re-stem a registration whose stem broke.
    def forget_generation(self, rid: bytes) -> None:
        """rid's route is gone (expired, evicted, unregistered): so is its G10 state."""
        self._stem.forget(rid)
        self._repair_asked.pop(rid, None)
        self._repair_due.pop(rid, None)
        self._restem_due.pop(rid, None)

    def generation_valid(self, msg: RegGossip) -> bool:
        """The frame's generation carries the home's signature under the registration's receipt key."""
        reg = msg.registration
        return (reg.receipt_key is not None and msg.generation_sig is not None
                and self._verifier.verify_generation(reg.receipt_key, reg.route_id, reg.epoch, msg.generation,
                                                     msg.generation_sig))

    def set_generation(self, rid: bytes, msg: RegGossip) -> None:
        """The route of rid was just set from msg (a first arrival of its epoch or generation)."""
        if msg.generation and msg.generation_sig is not None:
            self._stem.set_generation(rid, msg.registration.epoch, msg.generation, msg.generation_sig)
        else:
            self._stem.drop_generation(rid)

    def generation_arrival(self, peer: str, msg: RegGossip, entry: RouteEntry, now: float) -> list[Effect] | None:
        """A gossip frame (flood or stem) of the epoch held here, at another generation than ours. A lower
        one is a copy from before a re-stem: dropped (no fault: it was in flight). A higher one, signed by
        the home, replaces this relay's route of that epoch (and its stem state) and is then handled as a
        first arrival. None: go on with the ordinary rules (re-read the route: it may be gone);
        a list: the frame is done with."""
        reg = msg.registration
        rid = reg.route_id
        epoch = RouteTable.epoch(entry)
        if epoch != reg.epoch:
            return None  # another epoch: G1 decides
        known = self._stem.generation_of(rid, epoch)
        if msg.generation == known:
            return None
        if msg.generation < known:
            self._count("reg_stale_generation")
            return []
        cfg = self.config
        if not self._verifier.verify_registration(reg) or not self.generation_valid(msg):
            return self._gossip_rules.drop_reg(now, reg, peer, "bad_signature", cfg.score_bad_signature)
        if RouteTable.distance(entry) == 0:  # the home itself (restarted since it issued it): adopt it
            self.set_generation(rid, msg)
            return None
        # G4: a generation costs what a refresh costs
        if not self._flood.refresh_allowed(rid, now, cfg.reg_budget_per_origin_per_s, float(cfg.reg_budget_burst)):
            return self._gossip_rules.drop_reg(now, reg, peer, "budget_origin")
        self._routes.pop(rid, None)
        self._stem.release(rid)
        self._stem.drop_successor(rid)
        self._stem.cancel_embargo((rid, epoch))
        self._flood.forget_deep(rid, epoch)
        self._count("route_regenerated")
        return None

    def stem_successor_down(self, peer: str, now: float) -> list[Effect]:
        """The link to peer went down: for every route id this relay passed on its stem to peer, the home
        re-stems it, and a stem relay asks its predecessor to have the home do so."""
        out: list[Effect] = []
        for rid in self._stem.passed_to(peer):
            self._stem.drop_successor(rid)
            entry = self._routes.get(rid)
            if entry is None:
                continue
            if RouteTable.distance(entry) == 0:
                out += self._restem(rid, now)
            else:
                asked = self._ask_repair(rid, entry, now)
                if asked:
                    self._repair_due[rid] = (now + self.config.stem_embargo_s, REPAIR_TRIES - 1)
                out += asked
        for rid in self._stem.branched_to(peer):  # G10b: at a home
            self._stem.drop_branch(rid, peer)
            out += self._restem(rid, now)
        return out

    def _ask_repair(self, rid: bytes, entry: RouteEntry, now: float) -> list[Effect]:
        """A stem relay whose stem broke below it: a StemRepair to its predecessor, once per (epoch,
        generation), again only after half a stem_embargo_s (the relay below the break repeats its
        request when no new generation came: REPAIR_TRIES)."""
        epoch = RouteTable.epoch(entry)
        held = self._stem.held(rid)
        pred = RouteTable.primary(entry)
        if (held is None or held.epoch != epoch or RouteTable.distance(entry) != STEM_DISTANCE
                or pred is None or pred not in self._linked):
            return []
        generation = self._stem.generation_of(rid, epoch)
        last = self._repair_asked.get(rid)
        if (last is not None and last[:2] == (epoch, generation)
                and now - last[2] < self.config.stem_embargo_s / 2):
            return []
        if len(self._repair_asked) >= self.config.route_max:
            self._repair_asked.clear()
        self._repair_asked[rid] = (epoch, generation, now)
        self._count("stem_repair_sent")
        self._linked[pred].last_sent = now  # M2
        return [Send(pred, StemRepair(rid, epoch, generation))]

    def repair_due_now(self, now: float) -> list[Effect]:
        """G10: a StemRepair this relay started (its stem successor's link went down) brought no new
        generation within stem_embargo_s (a frame lost on the way up, or the home is down): ask again,
        REPAIR_TRIES times in all."""
        out: list[Effect] = []
        if not self._repair_due:
            return out
        for rid, (due, left) in list(self._repair_due.items()):
            if due > now:
                continue
            del self._repair_due[rid]
            entry = self._routes.get(rid)
            last = self._repair_asked.get(rid)
            if entry is None or last is None:
                continue
            epoch = RouteTable.epoch(entry)
            if last[:2] != (epoch, self._stem.generation_of(rid, epoch)):
                continue  # a new generation (or epoch) came: the stem was mended
            sent = self._ask_repair(rid, entry, now)
            if sent:
                self._count("stem_repair_repeated")
                if left > 1:
                    self._repair_due[rid] = (now + self.config.stem_embargo_s, left - 1)
            out += sent
        return out

    def on_stem_repair(self, peer: str, msg: StemRepair, now: float) -> list[Effect]:
        """G10: peer, to which this relay passed the stem of (route id, epoch, generation), says the stem
        broke below it. Only the current successor may say so, once per generation on each relay: a
        stranger cannot make the home re-stem, and the home re-stems at most once per stem_embargo_s."""
        rid = msg.route_id
        entry = self._routes.get(rid)
        successor = self._stem.is_successor(rid, peer)
        if (entry is None or RouteTable.epoch(entry) != msg.epoch or not successor
                or self._stem.generation_of(rid, msg.epoch) != msg.generation):
            self._count("stem_repair_ignored")
            return []
        if RouteTable.distance(entry) == 0:
            return self._restem(rid, now)
        return self._ask_repair(rid, entry, now)

    def _restem(self, rid: bytes, now: float) -> list[Effect]:
        """The home relay re-stems a registration homed here at the next generation, signed with the
        registration's receipt key: the stem frame takes the same successor draws as before (G6) around
        the failed relay, and its flood replaces every route of the older generation."""
        reg = self._homed.get(rid)
        entry = self._routes.get(rid)
        if (reg is None or entry is None or RouteTable.distance(entry) != 0 or RouteTable.epoch(entry) != reg.epoch
                or reg.expires_at <= now + self._ctx.wall_offset):
            return []
        last = self._stem.restemmed_at(rid)
        gap = self.config.stem_embargo_s
        if last is not None and now - last < gap:  # paced: one generation per stem_embargo_s
            self._restem_due[rid] = last + gap
            return []
        self._restem_due.pop(rid, None)
        # The next generation: at least the seconds since the registration was issued (wall clock), so a
        # home that restarted, and forgot the generations it issued, still issues a higher one.
        generation = max(self._stem.generation_of(rid, reg.epoch) + 1,
                         int(now + self._ctx.wall_offset) - reg.issued_at, 1)
        sig = (None if reg.receipt_key is None  # F5c: under the key the relays check it against (G10)
               else self._home.sign_receipt(rid, generation_signed_bytes(rid, reg.epoch, generation), reg.receipt_key))
        if sig is None:  # a registration without a receipt key: it waits for the device's refresh
            self._count("stem_restem_unsigned")
            return []
        self._stem.restemmed(rid, now)
        self._stem.set_generation(rid, reg.epoch, generation, sig)
        self._stem.cancel_embargo((rid, reg.epoch))
        self._count("stem_restemmed")
        return self._stem_originate(reg, now, "restem")

    # Rule G13 (withdrawals.py: a route request reached a home of the route id).
    def regenerate(self, rid: bytes, now: float) -> list[Effect]:
        """A relay with no route it may take asked this home for a newer route to rid: with the stem on, the
        home re-stems it (G10); off, it floods the next route generation itself, which replaces every
        relay's route of the epoch (as a re-stem's flood does). Paced: once per stem_embargo_s per route
        id, REGEN_PER_S in all."""
        reg = self._homed.get(rid)
        entry = self._routes.get(rid)
        if (reg is None or entry is None or RouteTable.distance(entry) != 0 or RouteTable.epoch(entry) != reg.epoch
                or reg.expires_at <= now + self._ctx.wall_offset or reg.receipt_key is None):
            self._count("route_regenerate_refused")
            return []
        last = self._stem.restemmed_at(rid)
        if last is not None and now - last < self.config.stem_embargo_s:
            self._count("route_regenerate_paced")
            return []
        if not self._regen_budget.take(now, REGEN_PER_S, REGEN_BURST):
            self._count("route_regenerate_over_budget")
            return []
        if self.config.stem:
            return self._restem(rid, now)
        generation = max(self._stem.generation_of(rid, reg.epoch) + 1,
                         int(now + self._ctx.wall_offset) - reg.issued_at, 1)
        sig = self._home.sign_receipt(rid, generation_signed_bytes(rid, reg.epoch, generation), reg.receipt_key)
        if sig is None:  # F5c: this home holds no private half of the receipt key
            self._count("route_regenerate_refused")
            return []
        self._stem.restemmed(rid, now)
        self._stem.set_generation(rid, reg.epoch, generation, sig)
        self._count("route_regenerated_home")
        gossip = RegGossip(reg, self.config.gossip_ttl, 0, False, generation, sig)
        out: list[Effect] = []
        for p, st in self._linked.items():
            st.last_sent = now
            out.append(Send(p, gossip))
        if self._level:  # the flood's first copies: gossip messages, and this home is the route's origin now
            self._trace(now, "reg_originated", msg=f"{rid.hex()}:{reg.epoch}", route=rid.hex(), epoch=reg.epoch,
                        ttl=self.config.gossip_ttl, hops=0, count=len(out), reason="regenerate")
        return out

    def restem_due_now(self, now: float) -> list[Effect]:
        """G10: the re-stems put off by their pace that are due now."""
        out: list[Effect] = []
        if not self._restem_due:
            return out
        for rid, due in list(self._restem_due.items()):
            if due <= now:
                del self._restem_due[rid]
                out += self._restem(rid, now)
        return out
