"""The relay engine: the whole INRI relay protocol, sans-IO.

Rules (docs/protocol.md explains them at length):

Registration gossip
  R1. A registration is verified (signature via the injected Verifier, route id = H(route key),
      freshness) before it changes anything. Per route id only the newest epoch counts: an older epoch
      is dropped (stale_epoch), never overriding a newer one (AODV destination sequence numbers).
  R2. The first arrival of (route id, epoch) sets the route: next hop = sender, distance = hops + 1,
      and the registration is forwarded once to every active neighbour but the sender, TTL - 1.
      The route table doubles as the gossip seen-cache: (route, epoch) is seen iff the table holds it.
  R3. A later arrival of the same epoch from another neighbour becomes a backup next hop, up to
      route_k in all, only if feasible (Babel, RFC 8966): the neighbour's own distance (its hops) is
      strictly less than our feasibility distance. Every next hop therefore strictly lowers the
      distance within an epoch and epochs never decrease along a path: routes cannot loop.
  R4. Flood budgets: token buckets per neighbour (all registrations it sends) and per origin route id
      (epoch refreshes); refusals are traced with a reason.

Pushes
  P1. A home app injects at any relay with a push credential's signed registration; the relay
      verifies it first and refuses otherwise (random tokens cannot trigger floods). Accepted pushes
      enter custody (CustodyTaken) until a receipt returns.
  P2. A push follows the route vector (primary, else a live backup; never back to the sender), with
      reverse-path state push id -> previous hop, so receipts and route errors travel back hop by hop.
      A relay handles each (push id, attempt) once.
  P3. At home, the HomeStore spends the token once and stores the message; a receipt goes back. The
      same push id again gets the same receipt (DUPLICATE), nothing is stored twice.
  P4. A relay that cannot forward drops its dead next hops (local repair: a backup takes over) and,
      with none left, sends a RouteError back. The custodian then re-sends with the same push id and
      the next attempt: route first, then expanding-ring soft gossip (radius 1, 3, 5, 7, then the full
      TTL) in which any relay holding a route switches the push back to route mode.

Membership (HyParView-like)
  M1. Active view of active_min..active_max neighbours, passive view of candidates (bootstrap lists,
      peer exchange). A lost neighbour is replaced from the passive view at once.
  M2. Keepalives per neighbour when nothing else was sent for an interval; a neighbour silent for
      keepalive_misses intervals is declared down.
  M3. Outbound quota: a full relay still takes a link it dialled while it holds fewer than
      outbound_min dialled links, by dropping an inbound one.
  M4. Priority joins (HyParView): a relay with fewer than priority_join_below (2) neighbours says
      so in a Hello ("low") on the links it dials. A full relay holds an inbound link on probation
      for PROBATION_S instead of refusing it at once; a "low" Hello gets it in by dropping a random
      neighbour, anything else gets "full". So a relay, or a whole group of relays, cut off from a
      mesh of full relays gets back in.

Peer scoring (zero trust between relays)
  S1. Each neighbour has a score: undecodable frames, forged gossip (bad signature), gossip or pushes
      over its flood budget, replays, and pushes forwarded to it that never produce a receipt or a
      route error (a black hole) lower it; receipts that come back through it raise it. It decays
      towards 0 with a half-life, so old faults are forgiven.
  S2. A low score loses preference (a next hop with a better score is used first), a very low one
      loses the link: the neighbour is cut, refused and not re-dialled for score_ban_s.
"""

from __future__ import annotations

import heapq
import random
from functools import lru_cache

from inri.core.api import (
    Connect,
    CustodyReleased,
    CustodyTaken,
    Delivered,
    Disconnect,
    Effect,
    HomeStore,
    InjectOutcome,
    InjectResult,
    Send,
    TraceLevel,
    Tracer,
    Verifier,
)
from inri.core.config import EngineConfig
from inri.protocol import limits
from inri.protocol.codec import DecodeError, decode, encode_unchecked
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
    ReceiptStatus,
    RegGossip,
    Registration,
    RouteError,
    RouteErrorReason,
)

# Clock skew tolerated on a registration's issued_at (relays' clocks are not synchronised).
MAX_CLOCK_SKEW_S = 300
# How often the engine sweeps expired routes and seen/reverse entries.
SWEEP_INTERVAL_S = 30.0
# Reconnecting to a lost neighbour: 2 s, 4 s, 8 s ... capped at 60 s, given up after 10 failures (~8 min).
RECONNECT_BASE_S = 2.0
LOCAL_REPAIR_RADIUS = 2  # a relay whose route broke searches this far before the custodian must
ROUTE_ATTEMPTS = 2  # custody attempts that follow routes before the expanding ring starts
PARK_FACTOR = 4  # parked custody (escalation exhausted) retries along the route every 4 retry periods
RECONNECT_MAX_S = 60.0
PROBATION_S = 2.0  # a full relay waits this long for a "low" Hello on an inbound link (rule M4)
MAKE_ROOM_INTERVAL_S = 60.0  # a full relay makes room for a "low" relay at most this often
LOW = "low"  # Hello feature: the dialler is below active_min
RECONNECT_MAX_FAILURES = 10
_LOCAL = ""  # reverse-path marker: the push was injected here (this relay is its custodian)
# Reverse-path marker after custody gave up: a receipt that still comes back (the last attempt got
# through late) corrects the final status instead of being lost. Not a valid node id.
_LATE = "\x00late"

_RECEIPT_STATUS = {
    ReceiptStatus.STORED: "delivered",
    ReceiptStatus.DUPLICATE: "delivered",
    ReceiptStatus.SPENT: "spent",
    ReceiptStatus.UNKNOWN_TOKEN: "unknown_token",
    ReceiptStatus.MAILBOX_FULL: "mailbox_full",
}


_REG_TRACE: dict[tuple[bytes, int], tuple[str, str, int]] = {}


def _reg_trace(registration: Registration) -> tuple[str, str, int]:
    """(label, route hex, gossip frame bytes) of a verified registration, computed once per (route, epoch)
    in the process (every relay of a simulation emits the same; keyed without hashing the whole
    registration, which is the cost on the hot path). A re-signed copy of the same epoch can differ
    in size by a varint byte: a trace figure, never a protocol decision."""
    key = (registration.route_id, registration.epoch)
    got = _REG_TRACE.get(key)
    if got is None:
        if len(_REG_TRACE) >= 65536:
            _REG_TRACE.clear()
        route_hex = registration.route_id.hex()
        got = _REG_TRACE[key] = (f"{route_hex}:{registration.epoch}", route_hex, _gossip_frame_bytes(registration))
    return got


@lru_cache(maxsize=8192)
def _gossip_frame_bytes(registration: Registration) -> int:
    # TTL and hops are positive fixints (< 128) so the frame size depends on the registration only.
    return len(encode_unchecked(RegGossip(registration, 0, 0)))


class _Peer:
    """An active neighbour."""

    __slots__ = ("addr", "outbound", "last_heard", "last_sent", "bucket", "bucket_t", "nonce", "score",
                 "pbucket", "pbucket_t")

    def __init__(self, addr: str, outbound: bool, now: float, burst: float, push_burst: float) -> None:
        self.addr = addr
        self.outbound = outbound
        self.last_heard = now
        self.last_sent = now
        self.bucket = burst  # registration gossip budget (tokens)
        self.bucket_t = now
        self.nonce = 0
        self.score = 0.0  # peer score: see EngineConfig.score_*
        self.pbucket = push_burst  # push frame budget (tokens)
        self.pbucket_t = now


class _Custody:
    """A push this relay accepted from a home app, kept until its receipt returns."""

    __slots__ = ("push", "attempt", "ring_step", "deadline", "next_retry", "home_down", "routed")

    def __init__(self, push: Push, deadline: float) -> None:
        self.push = push
        self.attempt = 0
        self.ring_step = 0
        self.home_down = False  # a relay next to the home reported it unreachable
        self.routed = False  # some attempt left along a cached route
        self.deadline = deadline
        self.next_retry = 0.0


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
        self.listen_addr = listen_addr
        self._verifier = verifier
        self._home = home
        self._tracer = tracer
        self._level = int(tracer.level)
        self._emit = tracer.emit
        # Optional fast path: a tracer may take whole rows in trace-schema column order.
        self._emit_row = getattr(tracer, "emit_row", None)
        self._rng = rng
        self._active: dict[str, _Peer] = {}
        self._passive: dict[str, str] = {}  # node id -> addr, oldest first
        self._connecting: dict[str, float] = {}  # node id -> give-up time
        # Former neighbours whose link was lost: re-dialled with exponential backoff while the active
        # view is below active_max, so a mesh torn by a partition or a crash knits itself back.
        self._lost: dict[str, list] = {}  # node id -> [addr, retry_at, failures]
        # route id -> (epoch, expires, feasibility distance, peer1, hops1, peer2, hops2, ...)
        self._routes: dict[bytes, tuple] = {}
        self._routes_expire_from = float("inf")  # no route expires before this (sweeps skip the scan)
        self._origin_bucket: dict[bytes, tuple[float, float]] = {}  # route id -> (tokens, t)
        self._push_seen: dict[tuple[bytes, int], float] = {}  # (push id, attempt) -> expiry
        self._reverse: dict[bytes, tuple[str, float]] = {}  # push id -> (previous hop, expiry)
        self._custody: dict[bytes, _Custody] = {}
        self._timers: list[tuple[float, int, bytes]] = []  # (when, seq, push id) custody retries
        self._seq = 0
        self._next_tick: float | None = None
        self._next_sweep = 0.0
        self._next_exchange = 0.0
        self._banned: dict[str, float] = {}  # node id -> until (cut for its score)
        self._probation: dict[str, tuple[float, str]] = {}  # inbound links held while full: -> (until, addr)
        self._next_make_room = 0.0
        # Pushes forwarded along a route, awaiting an answer: push id -> (next hop, deadline), in
        # deadline order (constant timeout). No answer by then scores the next hop as a black hole.
        self._await: dict[bytes, tuple[str, float]] = {}
        self._score_decay = 0.5 ** (config.keepalive_interval_s / config.score_half_life_s)
        self.counters: dict[str, int] = {}
        self.reg_duplicates = 0  # gossip arrivals of a known (route, epoch): a plain int on the hot path

    # ------------------------------------------------------------------------------------------
    # helpers

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _trace(self, now: float, kind: str, **fields: object) -> None:
        self._emit(now, self.relay_id, kind, **fields)  # type: ignore[arg-type]

    def _arm_tick(self, now: float) -> None:
        if self._next_tick is None:
            self._next_tick = now + self.config.keepalive_interval_s

    def _score(self, peer: str, delta: float, now: float, reason: str) -> list[Effect]:
        """Change peer's score (rule S1); cut and ban it when the score falls too low (S2)."""
        state = self._active.get(peer)
        if state is None:
            return []
        cfg = self.config
        state.score = min(cfg.score_max, state.score + delta)
        if delta < 0:
            self._count("score_" + reason)
        if state.score > cfg.score_disconnect_below:
            return []
        self._count("peer_cut_score")
        self._banned[peer] = now + cfg.score_ban_s
        self._passive.pop(peer, None)
        self._purge_routes(peer)
        if self._level:
            self._trace(now, "peer_scored", peer=peer, reason=reason, count=int(state.score))
        return [Disconnect(peer, "score"), *self.peer_down(peer, now, "score")]

    # ------------------------------------------------------------------------------------------
    # membership

    def add_candidates(self, peers: list[PeerInfo], now: float) -> list[Effect]:
        """Relays learned from a bootstrap list, a scenario or peer exchange: into the passive view."""
        banned = self._banned
        for p in peers:
            if p.node_id == self.relay_id or p.node_id in self._active or (banned and p.node_id in banned):
                continue
            self._passive.pop(p.node_id, None)
            self._passive[p.node_id] = p.addr
        while len(self._passive) > self.config.passive_max:
            del self._passive[next(iter(self._passive))]
        return self._refill(now)

    def start(self, now: float) -> list[Effect]:
        """Begin: arm timers and Connect to passive candidates until active_min links are wanted."""
        self._arm_tick(now)
        self._next_sweep = now + SWEEP_INTERVAL_S
        self._next_exchange = now + self.config.peer_exchange_interval_s * (0.5 + self._rng.random())
        return self._refill(now)

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
        choices = [p for p in self._passive if p not in self._connecting]
        self._rng.shuffle(choices)
        for peer in choices[:want]:
            self._connecting[peer] = now + self.config.connect_timeout_s
            out.append(Connect(peer, self._passive[peer]))
        return out

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
                return [Disconnect(peer, "banned")]
            del self._banned[peer]
        if len(self._active) >= self.config.active_max:
            # Full. An outbound link still gets in while we hold fewer than outbound_min dialled links,
            # by evicting an inbound one: inbound connections alone can never take over the view.
            dialled = sum(1 for st in self._active.values() if st.outbound)
            inbound = sorted(p for p, st in self._active.items() if not st.outbound)
            if not (outbound and dialled < self.config.outbound_min and inbound):
                if not outbound and peer not in self._probation:
                    # M4: wait for the dialler's Hello: a relay below active_min gets in anyway.
                    self._probation[peer] = (now + PROBATION_S, addr)
                    self._arm_tick(now)
                    return []
                self._count("peer_refused_full")
                if addr:
                    self._passive.setdefault(peer, addr)
                return [Disconnect(peer, "full")]
            victim = self._rng.choice(inbound)
            out.append(Disconnect(victim, "outbound_quota"))
            out += self.peer_down(victim, now, "outbound_quota")
        self._passive.pop(peer, None)
        self._lost.pop(peer, None)
        self._probation.pop(peer, None)
        if outbound and len(self._active) < self.config.priority_join_below:
            # M4: tell a full relay we are short of neighbours, so it makes room.
            out.append(Send(peer, Hello(limits.PROTOCOL_VERSION, self.relay_id, self.listen_addr, (LOW,))))
        self._active[peer] = _Peer(addr, outbound, now, self.config.reg_budget_peer_burst,
                                   self.config.push_budget_peer_burst)
        self._arm_tick(now)
        if self._level:
            self._trace(now, "peer_up", peer=peer, reason="outbound" if outbound else "inbound")
        return out

    def peer_down(self, peer: str, now: float, reason: str) -> list[Effect]:
        """The link to peer closed or failed: refill the active view (passive view, lost neighbours)."""
        state = self._active.pop(peer, None)
        self._connecting.pop(peer, None)
        self._probation.pop(peer, None)
        if state is None:
            return self._refill(now)
        # A link the other side closed as full, or for our score, is not re-dialled (the daemon
        # reports "link_closed: <the remote's reason>").
        cause = reason.rpartition(": ")[2]
        if state.score <= self.config.score_prefer_below or cause in ("make_room", "outbound_quota"):
            # Route claims leave with a distrusted neighbour (a liar that claimed to be a home and then
            # dropped the link) and with a live one we dropped ourselves: either way we must not
            # report its routes' homes unreachable ("home unreachable" means the home went down).
            self._purge_routes(peer)
        if state.addr and cause not in ("full", "outbound_quota", "score", "banned", "make_room"):
            self._lost[peer] = [state.addr, now + RECONNECT_BASE_S, 0]
        if self._level:
            self._trace(now, "peer_down", peer=peer, reason=reason)
        return self._refill(now)

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

    # ------------------------------------------------------------------------------------------
    # frames

    def _purge_routes(self, peer: str) -> None:
        """Forget every route claim of a neighbour cut for its score (O(routes); cuts are rare).

        A liar's claims must not outlive its link: a neighbour that claimed to be the home (distance 1
        here) would otherwise make this relay report the home unreachable once the liar is gone. The
        feasibility distance becomes that of the next hops left (none left: unknown), as in Babel.
        """
        routes = self._routes
        for rid, e in list(routes.items()):
            if peer not in e:
                continue
            i = e.index(peer)
            rest = e[3:i] + e[i + 2:]
            fd = min(rest[1::2]) if rest else limits.MAX_TTL + 1
            routes[rid] = (e[0], e[1], fd, *rest)
            self._count("routes_purged")

    def receive_frame(self, peer: str, data: bytes, now: float) -> list[Effect]:
        """Decode a frame from peer and handle it; a malformed frame is answered with an ErrorFrame."""
        try:
            msg = decode(data)
        except DecodeError as exc:
            self._count("frames_invalid")
            out: list[Effect] = [Send(peer, ErrorFrame(ErrorCode.MALFORMED, exc.detail[:200]))]
            return out + self._score(peer, self.config.score_invalid_frame, now, "invalid_frame")
        return self.receive_message(peer, msg, now)

    def receive_message(self, peer: str, msg: Message, now: float) -> list[Effect]:
        """Handle a decoded message from a neighbour (the simulator's fast path)."""
        state = self._active.get(peer)
        if state is None:
            if peer in self._probation and type(msg) is Hello:
                return self._on_probation_hello(peer, msg, now)  # type: ignore[arg-type]
            self._count("frames_from_stranger")
            return []
        state.last_heard = now
        t = type(msg)
        if t is RegGossip:
            return self._on_gossip(peer, state, msg, now)  # type: ignore[arg-type]
        if t is Push:
            return self._on_push(peer, msg, now)  # type: ignore[arg-type]
        if t is Receipt:
            return self._on_receipt(peer, msg, now)  # type: ignore[arg-type]
        if t is RouteError:
            return self._on_route_error(peer, msg, now)  # type: ignore[arg-type]
        if t is Keepalive:
            if not msg.reply:  # type: ignore[union-attr]
                state.last_sent = now
                return [Send(peer, Keepalive(msg.nonce, True))]  # type: ignore[union-attr]
            return []
        if t is PeerExchange:
            return self.add_candidates(list(msg.peers), now)  # type: ignore[union-attr]
        if t is ErrorFrame:
            self._count("peer_errors")
            return []
        if t is Hello:
            return []
        return []

    def _on_probation_hello(self, peer: str, msg: Hello, now: float) -> list[Effect]:
        """M4: a Hello on an inbound link held while full. "low": make room; otherwise refuse."""
        _, addr = self._probation.pop(peer)
        if LOW not in msg.features or not self._active or now < self._next_make_room:
            self._count("peer_refused_full")
            return [Disconnect(peer, "full")]
        # At most one eviction per MAKE_ROOM_INTERVAL_S: a relay cut everywhere for its behaviour is
        # "low" too, and must not be able to churn honest links at will.
        self._next_make_room = now + MAKE_ROOM_INTERVAL_S
        victim = self._rng.choice(sorted(self._active))
        victim_addr = self._active[victim].addr
        self._count("peer_made_room")
        out: list[Effect] = [Disconnect(victim, "make_room"), *self.peer_down(victim, now, "make_room")]
        out += self.peer_up(peer, now, outbound=False, addr=addr)
        if victim_addr:
            self._passive[victim] = victim_addr  # still a good candidate for later
        return out

    # ------------------------------------------------------------------------------------------
    # registration gossip

    def register(self, registration: Registration, now: float) -> list[Effect]:
        """A device homed here registered or refreshed: originate its gossip (rule R2 at distance 0)."""
        rid = registration.route_id
        old = self._routes.get(rid)
        if old is not None and old[0] >= registration.epoch:
            self._count("reg_local_stale")
            return []
        self._routes[rid] = (registration.epoch, registration.expires_at, 0)
        if registration.expires_at < self._routes_expire_from:
            self._routes_expire_from = registration.expires_at
        gossip = RegGossip(registration, self.config.gossip_ttl, 0)
        out: list[Effect] = []
        for p, st in self._active.items():
            st.last_sent = now
            out.append(Send(p, gossip))
        if self._level:
            self._trace(now, "reg_originated", msg=f"{rid.hex()}:{registration.epoch}", route=rid.hex(),
                        epoch=registration.epoch, ttl=self.config.gossip_ttl, hops=0, count=len(out),
                        nbytes=_gossip_frame_bytes(registration))
        return out

    def unregister(self, route_id: bytes, now: float) -> list[Effect]:
        """A device homed here unregistered: forget its route here (elsewhere it expires by TTL)."""
        self._routes.pop(route_id, None)
        self._origin_bucket.pop(route_id, None)
        return []

    def _drop_reg(self, now: float, reg: Registration, peer: str, reason: str, penalty: float = 0.0) -> list[Effect]:
        self._count("reg_dropped_" + reason)
        if self._level:
            self._trace(now, "reg_dropped", msg=f"{reg.route_id.hex()}:{reg.epoch}", route=reg.route_id.hex(),
                        peer=peer, epoch=reg.epoch, reason=reason)
        return self._score(peer, penalty, now, reason) if penalty else []

    def _on_gossip(self, peer: str, state: _Peer, msg: RegGossip, now: float) -> list[Effect]:
        cfg = self.config
        reg = msg.registration
        rid = reg.route_id
        epoch = reg.epoch
        entry = self._routes.get(rid)
        if entry is not None:
            if epoch == entry[0]:  # a duplicate (most gossip arrivals): R3
                self.reg_duplicates += 1
                # The only str items of an entry are its next hops: `peer in entry` needs no slice.
                if peer in entry:  # it gave us this (route, epoch) before: honest relays forward once
                    return self._drop_reg(now, reg, peer, "replayed", cfg.score_replay)
                if msg.hops < entry[2] and len(entry) < 3 + 2 * cfg.route_k:  # feasible, and room
                    return self._add_backup(peer, msg, entry, rid, now)
                if self._level >= TraceLevel.FULL:
                    self._trace(now, "reg_duplicate", msg=f"{rid.hex()}:{epoch}", route=rid.hex(), peer=peer,
                                hops=msg.hops + 1, epoch=epoch)
                return []
            if epoch < entry[0]:
                return self._drop_reg(now, reg, peer, "stale_epoch", cfg.score_replay)
        # Per-neighbour budget (R4): every new (route, epoch) costs the sender one token.
        elapsed = now - state.bucket_t
        state.bucket_t = now
        tokens = min(cfg.reg_budget_peer_burst, state.bucket + elapsed * cfg.reg_budget_per_peer_per_s)
        if tokens < 1.0:
            state.bucket = tokens
            return self._drop_reg(now, reg, peer, "budget_peer", cfg.score_budget_drop)
        state.bucket = tokens - 1.0
        if reg.expires_at <= now:
            return self._drop_reg(now, reg, peer, "expired")
        if reg.issued_at > now + MAX_CLOCK_SKEW_S:
            return self._drop_reg(now, reg, peer, "future")
        if not self._verifier.verify_registration(reg):
            return self._drop_reg(now, reg, peer, "bad_signature", cfg.score_bad_signature)
        if entry is not None:  # a refresh (newer epoch) of a known route id: per-origin budget
            btok, bt = self._origin_bucket.get(rid, (float(cfg.reg_budget_burst), now))
            btok = min(float(cfg.reg_budget_burst), btok + (now - bt) * cfg.reg_budget_per_origin_per_s)
            if btok < 1.0:
                self._origin_bucket[rid] = (btok, now)
                return self._drop_reg(now, reg, peer, "budget_origin")
            self._origin_bucket[rid] = (btok - 1.0, now)
        elif len(self._routes) >= cfg.route_max:
            self._evict_route(now)
        hops = msg.hops + 1
        # The route lives as long as the registration (at most 30 days, limits.MAX_LIFETIME_S).
        self._routes[rid] = (epoch, reg.expires_at, hops, peer, hops)
        if reg.expires_at < self._routes_expire_from:
            self._routes_expire_from = reg.expires_at
        out: list[Effect] = []
        ttl = msg.ttl - 1
        if ttl > 0:
            fwd = RegGossip(reg, ttl, hops)
            jitter = cfg.forward_jitter_s
            for p, st in self._active.items():
                if p != peer:
                    st.last_sent = now
                    out.append(Send(p, fwd, self._rng.random() * jitter if jitter else 0.0))
        if self._level:
            label, route_hex, nbytes = _reg_trace(reg)
            if self._emit_row is not None:  # the hottest trace row: positional, no keyword dict
                self._emit_row((now, self.relay_id, "route_set", label, route_hex, peer, hops, msg.ttl, epoch,
                                len(out), nbytes, None))
            else:
                self._trace(now, "route_set", msg=label, route=route_hex, peer=peer, hops=hops,
                            ttl=msg.ttl, epoch=epoch, count=len(out), nbytes=nbytes)
        return out

    def _add_backup(self, peer: str, msg: RegGossip, entry: tuple, rid: bytes, now: float) -> list[Effect]:
        # R3: a feasible arrival from a new neighbour while there is room: a backup next hop.
        reg = msg.registration
        if not self._verifier.verify_registration(reg):
            return self._drop_reg(now, reg, peer, "bad_signature", self.config.score_bad_signature)
        self._routes[rid] = (*entry, peer, msg.hops + 1)
        if self._level >= TraceLevel.FULL:
            self._trace(now, "route_backup", msg=f"{rid.hex()}:{reg.epoch}", route=rid.hex(), peer=peer,
                        hops=msg.hops + 1, epoch=reg.epoch)
        return []

    def _evict_route(self, now: float) -> None:
        # Table full: drop the entry that expires first (bounded memory; traced as a drop).
        victim = min(self._routes, key=lambda r: self._routes[r][1])
        del self._routes[victim]
        self._count("routes_evicted")
        if self._level >= TraceLevel.FULL:
            self._trace(now, "route_expired", route=victim.hex(), reason="evicted")

    def _next_hop(self, rid: bytes, exclude: str, alternate: bool = False, low_ok: bool = False) -> str | None:
        """The first live next hop for rid other than `exclude` whose score is not low (None: none).

        low_ok: fall back to a live next hop with a low score (rule S2) when no other is left.

        Next hops whose link is down are skipped, not forgotten: when the link comes back (a crashed
        neighbour restarting, a partition healing), the route works again at once.
        alternate: prefer the backup over the primary (odd custody attempts take the other path, so a
        re-send does not walk into the same silent failure as the first copy).
        """
        entry = self._routes.get(rid)
        if entry is None or len(entry) < 5:
            return None
        active = self._active
        hops = entry[3::2]
        if alternate and len(hops) > 1:
            hops = hops[1:] + hops[:1]
        fallback = None
        floor = self.config.score_prefer_below
        for p in hops:
            st = active.get(p)
            if st is not None and p != exclude:
                if st.score >= floor:
                    return p
                if fallback is None:
                    fallback = p  # low score (S2): only when no better next hop is alive
        return fallback if low_ok else None

    def _home_adjacent(self, rid: bytes) -> bool:
        """True when our route for rid had distance 1 (the home relay was our neighbour) and no live
        next hop remains: the home relay itself is unreachable from here, not just a path to it."""
        entry = self._routes.get(rid)
        return entry is not None and entry[2] == 1 and (len(entry) < 5 or entry[3] not in self._active)

    def has_route(self, route_id: bytes) -> bool:
        """True when a live next hop is known for route_id."""
        return self._next_hop(route_id, _LOCAL, low_ok=True) is not None

    # ------------------------------------------------------------------------------------------
    # pushes

    def inject_push(
        self,
        registration: Registration,
        token: bytes,
        ciphertext: bytes,
        now: float,
        *,
        push_id: bytes | None = None,
    ) -> InjectResult:
        """A home app pushes here with a push credential's registration and one token (rule P1)."""
        reason = None
        if len(token) != limits.TOKEN_BYTES or len(ciphertext) > limits.MAX_CIPHERTEXT_BYTES:
            outcome, reason = InjectOutcome.TOKEN_MISMATCH, "malformed"
        elif registration.expires_at <= now or registration.issued_at > now + MAX_CLOCK_SKEW_S:
            outcome, reason = InjectOutcome.BAD_REGISTRATION, "stale_registration"
        elif not self._verifier.verify_registration(registration):
            outcome, reason = InjectOutcome.BAD_REGISTRATION, "bad_signature"
        elif len(self._custody) >= self.config.custody_max:
            outcome, reason = InjectOutcome.OVERLOADED, "custody_full"
        if reason is not None:
            self._count("push_refused_" + reason)
            if self._level:
                self._trace(now, "push_refused", route=registration.route_id.hex(), reason=reason)
            return InjectResult(outcome, None, [])
        pid = push_id if push_id is not None else self._rng.randbytes(limits.PUSH_ID_BYTES)
        push = Push(pid, registration.route_id, token, ciphertext, self.config.push_ttl, 0, 0, 0, registration)
        custody = _Custody(push, now + self.config.custody_deadline_s)
        self._custody[pid] = custody
        if self._level:
            self._trace(now, "push_injected", msg=pid.hex(), route=push.route_id.hex(), ttl=push.ttl)
        effects: list[Effect] = [CustodyTaken(push, custody.deadline)]
        effects += self._attempt(custody, now)
        return InjectResult(InjectOutcome.ACCEPTED, pid, effects)

    def restore_custody(self, push: Push, deadline: float, attempt: int, now: float) -> list[Effect]:
        """Re-adopt a push this relay held in custody before a restart (the daemon reads it from disk).

        It is re-sent with the same push id and a higher attempt number, so relays whose seen-caches
        still hold the earlier attempt forward it, and the home relay answers DUPLICATE if it already
        stored it: a push answered 202 is neither lost nor delivered twice across a crash.
        """
        pid = push.push_id
        if pid in self._custody:
            return []
        if deadline <= now:
            self._count("custody_expired")
            return [CustodyReleased(pid, "expired")]
        custody = _Custody(push, deadline)
        custody.attempt = max(0, attempt)
        # A restarted relay has no routes yet: skip straight to ring searches after the route attempts.
        custody.ring_step = max(0, custody.attempt - ROUTE_ATTEMPTS)
        self._custody[pid] = custody
        if custody.attempt >= self.config.custody_max_attempts:
            return self._parked_attempt(custody, now)
        return self._attempt(custody, now)

    def _attempt(self, c: _Custody, now: float) -> list[Effect]:
        """Send attempt number c.attempt of a push in custody: route first, then widening rings."""
        push = c.push
        pid = push.push_id
        if self._home.is_home(push.route_id):
            status = self._home.accept_push(push.route_id, push.token, pid, push.ciphertext, now)
            return self._deliver_local(pid, push, status, now) + self._settle(pid, status, 0, now)
        cfg = self.config
        self._reverse[pid] = (_LOCAL, now + cfg.reverse_ttl_s)
        # Retry periods 1, 1, 2, 2, 3, 3 x custody_retry_s: every escalation step (route, backups,
        # rings, full TTL) gets its turn within 12 retry periods (24 s by default), so black holes
        # on the routes cost latency, not pushes, within a 30 s deadline.
        c.next_retry = now + cfg.custody_retry_s * (1 + c.attempt // 2)
        self._schedule(pid, c.next_retry)
        self._mark_seen((pid, c.attempt * 2), now)
        self._mark_seen((pid, c.attempt * 2 + 1), now)
        if c.attempt and self._level:
            self._trace(now, "push_retry", msg=pid.hex(), route=push.route_id.hex(), count=c.attempt)
        # The first two attempts follow the route when there is one (the second prefers backups all
        # along the way); every later attempt (no receipt in time, or a route error) widens the ring:
        # 1, 3, 5, 7, then the full TTL.
        if c.attempt < ROUTE_ATTEMPTS or c.home_down:
            c.home_down = False
            nh = self._next_hop(push.route_id, _LOCAL, alternate=c.attempt == 1)
            if nh is not None:
                c.routed = True
                return [self._forward(Push(pid, push.route_id, push.token, push.ciphertext, cfg.push_ttl, 0,
                                           c.attempt, 0, push.registration), nh, now)]
        radii = limits.RING_RADII
        ring = radii[c.ring_step] if c.ring_step < len(radii) else cfg.push_ttl
        c.ring_step += 1
        msg = Push(pid, push.route_id, push.token, push.ciphertext, cfg.push_ttl, 0, c.attempt, ring,
                   push.registration)
        return self._ring_flood(msg, _LOCAL, now)

    def _mark_seen(self, key: tuple[bytes, int], now: float) -> None:
        """Enter a (push id, attempt, mode) key in the seen-cache, oldest evicted past push_seen_max."""
        seen = self._push_seen
        if key not in seen and len(seen) >= self.config.push_seen_max:
            del seen[next(iter(seen))]
        seen[key] = now + self.config.seen_ttl_s

    def _forward(self, msg: Push, nh: str, now: float) -> Send:
        self._active[nh].last_sent = now
        pending = self._await
        pid = msg.push_id
        if pid in pending:
            del pending[pid]  # re-insert at the end: the dict stays in deadline order
        elif len(pending) >= self.config.reverse_max:
            del pending[next(iter(pending))]
        pending[pid] = (nh, now + self.config.receipt_timeout_s)
        if self._level:
            self._trace(now, "push_forwarded", msg=msg.push_id.hex(), route=msg.route_id.hex(), peer=nh,
                        hops=msg.hops, ttl=msg.ttl, count=1)
        jitter = self.config.forward_jitter_s
        return Send(nh, msg, self._rng.random() * jitter if jitter else 0.0)

    def _ring_flood(self, msg: Push, sender: str, now: float) -> list[Effect]:
        out: list[Effect] = []
        for p, st in self._active.items():
            if p != sender:
                st.last_sent = now
                out.append(Send(p, msg))
        if self._level:
            self._trace(now, "push_fallback", msg=msg.push_id.hex(), route=msg.route_id.hex(), hops=msg.hops,
                        ttl=msg.ring, count=len(out))
        return out

    def _on_push(self, peer: str, msg: Push, now: float) -> list[Effect]:
        pid = msg.push_id
        cfg = self.config
        state = self._active[peer]
        refill = (now - state.pbucket_t) * cfg.push_budget_per_peer_per_s
        tokens = min(cfg.push_budget_peer_burst, state.pbucket + refill)
        state.pbucket_t = now
        if tokens < 1.0:
            state.pbucket = tokens
            self._count("push_dropped_budget_peer")
            if self._level:
                self._trace(now, "push_dropped", msg=pid.hex(), route=msg.route_id.hex(), peer=peer, hops=msg.hops,
                            ttl=msg.ttl, reason="budget_peer")
            return self._score(peer, cfg.score_budget_drop, now, "budget_peer")
        state.pbucket = tokens - 1.0
        # Seen per (push, attempt, mode): a ring copy that met a route continues in route mode through
        # relays that already saw (and flooded) the ring copy of the same attempt.
        key = (pid, msg.attempt * 2 + (1 if msg.ring else 0))
        if key in self._push_seen:
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
        if len(self._push_seen) >= cfg.push_seen_max:
            del self._push_seen[next(iter(self._push_seen))]
        self._push_seen[key] = now + cfg.seen_ttl_s
        rid = msg.route_id
        if self._level >= TraceLevel.FULL:
            self._trace(now, "push_received", msg=pid.hex(), route=rid.hex(), peer=peer, hops=msg.hops,
                        ttl=msg.ttl)
        if pid not in self._custody:  # a custodian keeps its own LOCAL reverse marker
            if len(self._reverse) >= cfg.reverse_max:
                del self._reverse[next(iter(self._reverse))]
                self._count("reverse_evicted")
            self._reverse[pid] = (peer, now + cfg.reverse_ttl_s)
        if self._home.is_home(rid):
            status = self._home.accept_push(rid, msg.token, pid, msg.ciphertext, now)
            out = self._deliver_local(pid, msg, status, now, hops=msg.hops + 1)
            out.append(Send(peer, Receipt(pid, status, msg.hops + 1)))
            return out
        if msg.ttl <= 1:
            return self._push_drop(peer, msg, now, "ttl", RouteErrorReason.TTL_EXHAUSTED)
        if msg.ring:
            if msg.registration is None or msg.registration.route_id != rid or not (
                self._verifier.verify_registration(msg.registration)
            ):
                return self._push_drop(peer, msg, now, "bad_registration", None)
            nh = self._next_hop(rid, peer, alternate=bool(msg.attempt & 1))
            if nh is not None:  # a route is known here: leave the ring, follow the route (once)
                route_key = (pid, msg.attempt * 2)
                if route_key in self._push_seen:
                    self._count("push_seen_dropped")
                    return []
                self._mark_seen(route_key, now)
                return [self._forward(Push(pid, rid, msg.token, msg.ciphertext, msg.ttl - 1, msg.hops + 1,
                                           msg.attempt, 0, msg.registration), nh, now)]
            if self._home_adjacent(rid):  # tell the custodian: widening the ring cannot help
                return self._push_drop(peer, msg, now, "home_unreachable", RouteErrorReason.HOME_UNREACHABLE)
            if msg.ring <= 1:
                return self._push_drop(peer, msg, now, "ring_end", None)
            return self._ring_flood(Push(pid, rid, msg.token, msg.ciphertext, msg.ttl - 1, msg.hops + 1,
                                         msg.attempt, msg.ring - 1, msg.registration), peer, now)
        nh = self._next_hop(rid, peer, alternate=bool(msg.attempt & 1))
        if nh is None:
            low = self._next_hop(rid, peer, low_ok=True)  # a live next hop with a low score (S2)
            if low is not None and (msg.attempt == 0 or self._active[low].score > cfg.score_avoid_below):
                # Low but not very low, or the push's first attempt: most likely an honest relay
                # upstream of a failure (blame for a missing receipt is diffuse); use it rather than
                # flood the neighbourhood. Re-sent attempts (the custodian saw a failure) avoid it.
                return [self._forward(Push(pid, rid, msg.token, msg.ciphertext, msg.ttl - 1, msg.hops + 1,
                                           msg.attempt, 0, msg.registration), low, now)]
            if low is None and self._home_adjacent(rid):
                return self._push_drop(peer, msg, now, "home_unreachable", RouteErrorReason.HOME_UNREACHABLE)
            ring_key = (pid, msg.attempt * 2 + 1)
            if (msg.registration is not None and msg.ttl > LOCAL_REPAIR_RADIUS and len(self._active) > 1
                    and ring_key not in self._push_seen):
                # Local repair (AODV): our route broke; ask the neighbourhood before giving up. Neighbours
                # with a route of their own (not through us: the sender is excluded) carry it on.
                self._count("push_local_repair")
                self._mark_seen(ring_key, now)
                return self._ring_flood(Push(pid, rid, msg.token, msg.ciphertext, msg.ttl - 1, msg.hops + 1,
                                             msg.attempt, LOCAL_REPAIR_RADIUS, msg.registration), peer, now)
            if low is not None:  # the neighbourhood was asked: the low-scored next hop is the last resort
                return [self._forward(Push(pid, rid, msg.token, msg.ciphertext, msg.ttl - 1, msg.hops + 1,
                                           msg.attempt, 0, msg.registration), low, now)]
            return self._push_drop(peer, msg, now, "no_route", RouteErrorReason.NO_ROUTE)
        return [self._forward(Push(pid, rid, msg.token, msg.ciphertext, msg.ttl - 1, msg.hops + 1, msg.attempt,
                                   0, msg.registration), nh, now)]

    def _push_drop(
        self, peer: str, msg: Push, now: float, reason: str, error: RouteErrorReason | None
    ) -> list[Effect]:
        self._count("push_dropped_" + reason)
        if self._level:
            self._trace(now, "push_dropped", msg=msg.push_id.hex(), route=msg.route_id.hex(), peer=peer,
                        hops=msg.hops, ttl=msg.ttl, reason=reason)
        if error is None:  # ring copies die quietly: other copies are still searching
            return []
        self._reverse.pop(msg.push_id, None)
        if self._level:
            self._trace(now, "route_error", msg=msg.push_id.hex(), route=msg.route_id.hex(), peer=peer,
                        reason=reason, count=1)
        return [Send(peer, RouteError(msg.push_id, msg.route_id, error))]

    def _deliver_local(
        self, pid: bytes, msg: Push, status: ReceiptStatus, now: float, hops: int = 0
    ) -> list[Effect]:
        if status == ReceiptStatus.STORED:
            if self._level:
                self._trace(now, "push_delivered", msg=pid.hex(), route=msg.route_id.hex(), hops=hops)
            return [Delivered(msg.route_id, pid)]
        if status == ReceiptStatus.DUPLICATE:
            if self._level:
                self._trace(now, "push_duplicate", msg=pid.hex(), route=msg.route_id.hex(), hops=hops)
            return []
        reason = _RECEIPT_STATUS[status]
        self._count("push_dropped_" + reason)
        if self._level:
            self._trace(now, "push_dropped", msg=pid.hex(), route=msg.route_id.hex(), hops=hops, reason=reason)
        return []

    def _on_receipt(self, peer: str, msg: Receipt, now: float) -> list[Effect]:
        waited = self._await.pop(msg.push_id, None)
        if waited is not None and waited[0] == peer:
            self._score(peer, self.config.score_receipt, now, "receipt")  # a rise: never cuts
        back = self._reverse.pop(msg.push_id, None)
        if back is None:
            self._count("receipt_orphan")
            return []
        prev = back[0]
        if prev == _LOCAL:
            return self._settle(msg.push_id, msg.status, msg.hops, now)
        if prev == _LATE:
            self._count("receipt_late")
            return [CustodyReleased(msg.push_id, _RECEIPT_STATUS[msg.status], msg.hops)]
        if prev not in self._active:
            self._count("receipt_lost_link")
            return []
        self._active[prev].last_sent = now
        if self._level:
            self._trace(now, "receipt_forwarded", msg=msg.push_id.hex(), peer=prev, hops=msg.hops, count=1)
        return [Send(prev, msg)]

    def _settle(self, pid: bytes, status: ReceiptStatus, hops: int, now: float) -> list[Effect]:
        c = self._custody.pop(pid, None)
        self._reverse.pop(pid, None)
        if c is None:
            return []
        final = _RECEIPT_STATUS[status]
        if self._level:
            self._trace(now, "push_settled", msg=pid.hex(), route=c.push.route_id.hex(), hops=hops, reason=final)
        return [CustodyReleased(pid, final, hops)]

    def _on_route_error(self, peer: str, msg: RouteError, now: float) -> list[Effect]:
        if msg.reason == RouteErrorReason.DUPLICATE:
            # A relay down the path had this attempt already (its answer went back the way the first
            # copy came): no black hole and no broken route. Neutral for the score; passed back along
            # this copy's reverse path so no relay on it blames its next hop; a custodian keeps custody.
            waited = self._await.get(msg.push_id)
            if waited is None or waited[0] != peer:
                self._count("route_error_unexpected")
                return []
            del self._await[msg.push_id]
            self._count("route_error_duplicate")
            back = self._reverse.get(msg.push_id)
            if back is None or back[0] in (_LOCAL, _LATE) or back[0] not in self._active:
                return []
            del self._reverse[msg.push_id]
            if self._level:
                self._trace(now, "receipt_forwarded", msg=msg.push_id.hex(), peer=back[0], reason="duplicate",
                            count=1)
            return [Send(back[0], msg)]
        waited = self._await.get(msg.push_id)
        if waited is not None and waited[0] == peer:
            # An answer, if not a receipt: no black hole there. It earns what a receipt earns, so a
            # neighbour blamed while the home behind it was down (not yet detected) recovers.
            del self._await[msg.push_id]
            self._score(peer, self.config.score_receipt, now, "receipt")
        back = self._reverse.pop(msg.push_id, None)
        if back is None:
            return []
        prev = back[0]
        # The neighbour that sent the error cannot reach the home: stop using it as a next hop for this
        # route (a backup takes over). Relays further back keep their routes: their next hop is fine.
        # A home that is down is no fault of the path, and the route is right again when it returns.
        entry = self._routes.get(msg.route_id)
        if entry is not None and msg.reason != RouteErrorReason.HOME_UNREACHABLE and peer in entry[3::2]:
            i = 3 + 2 * entry[3::2].index(peer)
            self._routes[msg.route_id] = entry[:i] + entry[i + 2:]
        if prev == _LOCAL:
            c = self._custody.get(msg.push_id)
            if c is None:
                return []
            if msg.reason == RouteErrorReason.HOME_UNREACHABLE:
                # The home relay is down: flooding cannot reach it. Keep custody and re-send along the
                # route at the next scheduled retry (it may be back by then); never widen the ring.
                c.home_down = True
                return []
            if c.attempt + 1 >= self.config.custody_max_attempts:
                return []  # parked: the next slow retry is already scheduled
            return self._retry(c, now)
        if prev not in self._active:
            return []
        if self._level:
            self._trace(now, "receipt_forwarded", msg=msg.push_id.hex(), peer=prev, reason="route_error", count=1)
        return [Send(prev, msg)]

    def _retry(self, c: _Custody, now: float) -> list[Effect]:
        pid = c.push.push_id
        if now >= c.deadline:
            self._custody.pop(pid, None)
            self._reverse[pid] = (_LATE, now + self.config.reverse_ttl_s)
            # expired: routes existed but no receipt came back in time; unreachable: no relay on our
            # side ever had a route to the device.
            final = "expired" if c.routed else "unreachable"
            if self._level:
                self._trace(now, "push_settled", msg=pid.hex(), route=c.push.route_id.hex(), reason=final)
                self._trace(now, "push_dropped", msg=pid.hex(), route=c.push.route_id.hex(), reason=final)
            return [CustodyReleased(pid, final)]
        c.attempt += 1
        if c.attempt >= self.config.custody_max_attempts:
            return self._parked_attempt(c, now)
        return self._attempt(c, now)

    def _parked_attempt(self, c: _Custody, now: float) -> list[Effect]:
        """After the escalation (route, backups, rings, full TTL): keep custody until the deadline.

        A home relay that crashed comes back and re-gossips its registrations, so the route returns:
        a parked push is re-sent along it every PARK_FACTOR retry periods (never flooded: that was
        tried), so a push answered 202 survives a home relay's downtime up to the custody deadline.
        """
        cfg = self.config
        pid = c.push.push_id
        c.next_retry = min(now + cfg.custody_retry_s * PARK_FACTOR, c.deadline)
        self._schedule(pid, c.next_retry)
        nh = self._next_hop(c.push.route_id, _LOCAL, low_ok=True)
        if nh is None:
            return []
        c.routed = True
        self._reverse[pid] = (_LOCAL, now + cfg.reverse_ttl_s)
        self._mark_seen((pid, c.attempt * 2), now)
        push = c.push
        if self._level:
            self._trace(now, "push_retry", msg=pid.hex(), route=push.route_id.hex(), count=c.attempt)
        return [self._forward(Push(pid, push.route_id, push.token, push.ciphertext, cfg.push_ttl, 0, c.attempt, 0,
                                   push.registration), nh, now)]

    def _schedule(self, pid: bytes, when: float) -> None:
        self._seq += 1
        heapq.heappush(self._timers, (when, self._seq, pid))

    # ------------------------------------------------------------------------------------------
    # time

    def get_timer(self) -> float | None:
        """The earliest time handle_timer wants to run (None: nothing armed)."""
        t = self._next_tick
        if self._timers:
            first = self._timers[0][0]
            if t is None or first < t:
                return first
        return t

    def handle_timer(self, now: float) -> list[Effect]:
        """Custody retries, keepalives, liveness, peer exchange and expiry sweeps that are due."""
        out: list[Effect] = []
        timers = self._timers
        while timers and timers[0][0] <= now:
            when, _, pid = heapq.heappop(timers)
            c = self._custody.get(pid)
            if c is not None and c.next_retry == when:
                out += self._retry(c, now)
        if self._next_tick is not None and now >= self._next_tick:
            out += self._tick(now)
        return out

    def _tick(self, now: float) -> list[Effect]:
        cfg = self.config
        out: list[Effect] = []
        interval = cfg.keepalive_interval_s
        dead_after = interval * cfg.keepalive_misses
        pending = self._await
        while pending:
            pid, (nh, deadline) = next(iter(pending.items()))
            if deadline > now:
                break
            del pending[pid]
            st = self._active.get(nh)
            # Only a neighbour heard from since the push went out is suspect: a silent one is more
            # likely down (keepalives will tell) than a black hole.
            if st is not None and st.last_heard > deadline - cfg.receipt_timeout_s:
                self._count("push_no_answer")
                out += self._score(nh, cfg.score_no_receipt, now, "no_receipt")
        decay = self._score_decay
        for p in list(self._active):
            st = self._active[p]
            if st.score:
                st.score *= decay
            if now - st.last_heard > dead_after:
                out.append(Disconnect(p, "keepalive_timeout"))
                out += self.peer_down(p, now, "keepalive_timeout")
            elif now - st.last_sent >= interval * 0.99:
                st.nonce += 1
                st.last_sent = now
                out.append(Send(p, Keepalive(st.nonce, False)))
        for p, give_up in list(self._connecting.items()):
            if now >= give_up:
                out += self.connect_failed(p, now)
        for p, (until, _) in list(self._probation.items()):
            if now >= until:  # no "low" Hello came: refuse as full
                del self._probation[p]
                self._count("peer_refused_full")
                out.append(Disconnect(p, "full"))
        if len(self._active) + len(self._connecting) < cfg.active_max:
            out += self._refill(now)
        if now >= self._next_exchange and self._active:
            self._next_exchange = now + cfg.peer_exchange_interval_s
            out += self._peer_exchange(now)
        if now >= self._next_sweep:
            self._next_sweep = now + SWEEP_INTERVAL_S
            self._sweep(now)
        busy = self._active or self._connecting or self._passive or self._lost or self._probation
        self._next_tick = now + interval if busy else None
        return out

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

    def _sweep(self, now: float) -> None:
        if now >= self._routes_expire_from:
            self._sweep_routes(now)
        for key in [key for key, exp in self._push_seen.items() if exp <= now]:
            del self._push_seen[key]
        for pid in [pid for pid, v in self._reverse.items() if v[1] <= now and v[0] != _LOCAL]:
            del self._reverse[pid]
        for pid in [pid for pid, c in self._custody.items() if now >= c.deadline]:
            del self._custody[pid]
            self._count("custody_expired")
        for peer in [p for p, until in self._banned.items() if until <= now]:
            del self._banned[peer]

    def _sweep_routes(self, now: float) -> None:
        expired = [r for r, e in self._routes.items() if e[1] <= now]
        self._routes_expire_from = min((e[1] for e in self._routes.values() if e[1] > now), default=float("inf"))
        for r in expired:
            del self._routes[r]
            self._origin_bucket.pop(r, None)
            if self._level >= TraceLevel.FULL:
                self._trace(now, "route_expired", route=r.hex(), reason="lifetime")

    # ------------------------------------------------------------------------------------------
    # introspection

    def route_count(self) -> int:
        """Route ids with at least one next hop."""
        return sum(1 for e in self._routes.values() if len(e) >= 5)

    def active_peers(self) -> list[str]:
        """The active view, sorted."""
        return sorted(self._active)

    def passive_peers(self) -> list[str]:
        """The passive view (candidates), oldest first."""
        return list(self._passive)

    def next_hops(self, route_id: bytes) -> list[tuple[str, int]]:
        """The cached route vector for route_id: [(next hop, distance), ...], primary first."""
        entry = self._routes.get(route_id)
        if entry is None:
            return []
        return list(zip(entry[3::2], entry[4::2], strict=True))

    def peer_scores(self) -> dict[str, float]:
        """The score of every active neighbour (rule S1), rounded."""
        return {p: round(st.score, 2) for p, st in sorted(self._active.items())}

    def route_epoch(self, route_id: bytes) -> int | None:
        """The newest epoch known for route_id."""
        entry = self._routes.get(route_id)
        return None if entry is None else entry[0]

    def stats(self) -> dict[str, int]:
        """Table sizes and counters."""
        return {
            "routes": len(self._routes),
            "seen": len(self._push_seen),
            "reverse": len(self._reverse),
            "custody": len(self._custody),
            "active": len(self._active),
            "passive": len(self._passive),
            "connecting": len(self._connecting),
            "lost": len(self._lost),
            "banned": len(self._banned),
            "awaiting_receipt": len(self._await),
            "reg_duplicate": self.reg_duplicates,
            **self.counters,
        }

    def link_congested(self, peer: str, now: float) -> list[Effect]:
        """The daemon dropped frames for peer: its send queue is full (it withholds flow control)."""
        # Temporary (helper "node"): the refactored engine's link_congested replaces this at merge.
        return self._score(peer, -1.0, now, "congested")
