"""The engine's state, shared by its rule groups: per-neighbour and per-push records, the sentinels
of the reverse path, constants, and `EngineState`, the base every rule-group mixin builds on.

`EngineState` declares every table the rule groups read (the engine's __init__ fills them) and,
for the type checker only, the methods one rule group calls in another: the dependencies between
groups are listed in one place.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from inri.core.api import CustodyReleased, CustodyStatus, DisconnectReason, Effect, HomeStore, Send, Verifier
from inri.core.awaited import AwaitedAnswers
from inri.core.budget import TokenBucket
from inri.core.config import EngineConfig
from inri.core.floodstate import FloodState
from inri.core.homed import HomedRoutes
from inri.core.kept import Custody, CustodyTable
from inri.core.reverse import ReversePaths
from inri.core.roundtrip import RttEstimator
from inri.core.seen import SeenCache
from inri.core.stemstate import StemState
from inri.core.syncstate import SyncState
from inri.core.tables import CompactRouteTable, RouteEntry, RouteTable
from inri.protocol.messages import (
    Keepalive,
    Message,
    Push,
    Receipt,
    ReceiptStatus,
    RegGossip,
    Registration,
    RouteErrorReason,
    WebPushMeta,
)

if TYPE_CHECKING:  # tree.py and neighbours.py build on this module (Neighbour, make_send)
    from inri.core.neighbours import Neighbours
    from inri.core.tree import TreeGossip
    from inri.core.withdrawals import Withdrawals

# Clock skew tolerated on a registration's issued_at (relays' clocks are not synchronised).
MAX_CLOCK_SKEW_S = 300
# How often the engine sweeps expired routes and seen/reverse entries.
SWEEP_INTERVAL_S = 30.0


RECEIPT_STATUS = {
    ReceiptStatus.STORED: CustodyStatus.DELIVERED,
    ReceiptStatus.DUPLICATE: CustodyStatus.DELIVERED,
    ReceiptStatus.SPENT: CustodyStatus.SPENT,
    ReceiptStatus.UNKNOWN_TOKEN: CustodyStatus.UNKNOWN_TOKEN,
    ReceiptStatus.MAILBOX_FULL: CustodyStatus.MAILBOX_FULL,
    ReceiptStatus.UNKNOWN_ENDPOINT: CustodyStatus.UNKNOWN_ENDPOINT,
    ReceiptStatus.GONE: CustodyStatus.GONE,
    ReceiptStatus.RATE_LIMITED: CustodyStatus.RATE_LIMITED,
    ReceiptStatus.EXPIRED: CustodyStatus.EXPIRED,
}


# readdress and make_send fill a new Push's or Send's slots directly. The __init__ of a frozen dataclass sets
# each field with object.__setattr__, which made building the forwarded copy about a quarter of a
# relay's cost per push (CPython 3.11); the slot descriptors' own setters do the same at half the cost.
# Neither class has a __post_init__ (nothing is derived or checked at construction): the objects are
# identical to what the class builds, and a changed field list fails at import, not silently.
def _slot_setters(cls: type, names: tuple[str, ...]) -> tuple[Any, ...]:
    """The slot setters of dataclass cls, whose fields must be exactly `names`."""
    if tuple(f.name for f in dataclasses.fields(cls)) != names or hasattr(cls, "__post_init__"):
        raise RuntimeError(f"{cls.__name__} changed: update its builder in inri/core/state.py (sets fields one by one)")
    return tuple(getattr(cls, name).__set__ for name in names)


(_set_push_id, _set_route_id, _set_token, _set_ciphertext, _set_ttl, _set_hops, _set_attempt, _set_ring,
 _set_registration, _set_webpush) = _slot_setters(Push, ("push_id", "route_id", "token", "ciphertext", "ttl", "hops",
                                                         "attempt", "ring", "registration", "webpush"))
_set_peer, _set_msg, _set_delay = _slot_setters(Send, ("peer", "msg", "delay"))
_set_pid_r, _set_status_r, _set_hops_r, _set_signature_r = _slot_setters(Receipt, ("push_id", "status", "hops",
                                                                                  "signature"))
_set_pid_c, _set_status_c, _set_hops_c = _slot_setters(CustodyReleased, ("push_id", "status", "hops"))
_set_nonce, _set_reply = _slot_setters(Keepalive, ("nonce", "reply"))
(_set_registration_g, _set_ttl_g, _set_hops_g, _set_stem_g, _set_generation_g,
 _set_generation_sig_g, _set_lag_ms_g) = _slot_setters(RegGossip, ("registration", "ttl", "hops", "stem", "generation",
                                                                   "generation_sig", "lag_ms"))
_new_object = object.__new__


def readdress(push: Push, ttl: int, hops: int, attempt: int, ring: int) -> Push:
    """A copy of push with new hop fields; id, route, token, ciphertext, registration and Web Push
    metadata kept. Equal to Push(...) with the same fields (built faster: see _slot_setters)."""
    new: Push = _new_object(Push)
    _set_push_id(new, push.push_id)
    _set_route_id(new, push.route_id)
    _set_token(new, push.token)
    _set_ciphertext(new, push.ciphertext)
    _set_ttl(new, ttl)
    _set_hops(new, hops)
    _set_attempt(new, attempt)
    _set_ring(new, ring)
    _set_registration(new, push.registration)
    _set_webpush(new, push.webpush)
    return new


def new_push(push_id: bytes, route_id: bytes, token: bytes, ciphertext: bytes, ttl: int, hops: int, attempt: int,
             ring: int, registration: Registration | None, webpush: WebPushMeta | None) -> Push:
    """Push(...) with these fields (built faster: see _slot_setters)."""
    new: Push = _new_object(Push)
    _set_push_id(new, push_id)
    _set_route_id(new, route_id)
    _set_token(new, token)
    _set_ciphertext(new, ciphertext)
    _set_ttl(new, ttl)
    _set_hops(new, hops)
    _set_attempt(new, attempt)
    _set_ring(new, ring)
    _set_registration(new, registration)
    _set_webpush(new, webpush)
    return new


def make_receipt(push_id: bytes, status: ReceiptStatus, hops: int) -> Receipt:
    """Receipt(push_id, status, hops), unsigned (built faster: see _slot_setters)."""
    new: Receipt = _new_object(Receipt)
    _set_pid_r(new, push_id)
    _set_status_r(new, status)
    _set_hops_r(new, hops)
    _set_signature_r(new, None)
    return new


def released(push_id: bytes, status: CustodyStatus, hops: int | None) -> CustodyReleased:
    """CustodyReleased(push_id, status, hops) (built faster: see _slot_setters)."""
    new: CustodyReleased = _new_object(CustodyReleased)
    _set_pid_c(new, push_id)
    _set_status_c(new, status)
    _set_hops_c(new, hops)
    return new


def make_send(peer: str, msg: Message, delay: float) -> Send:
    """Send(peer, msg, delay), built faster (see _slot_setters): for the per-frame forwarding loops."""
    new: Send = _new_object(Send)
    _set_peer(new, peer)
    _set_msg(new, msg)
    _set_delay(new, delay)
    return new


def make_gossip(registration: Registration, ttl: int, hops: int) -> RegGossip:
    """RegGossip(registration, ttl, hops), built faster (see _slot_setters): the copy a relay floods on."""
    new: RegGossip = _new_object(RegGossip)
    _set_registration_g(new, registration)
    _set_ttl_g(new, ttl)
    _set_hops_g(new, hops)
    _set_stem_g(new, False)
    _set_generation_g(new, 0)
    _set_generation_sig_g(new, None)
    _set_lag_ms_g(new, 0)  # flood copies carry no lag (G9's tree frames are built in tree.py)
    return new


def make_keepalive(peer: str, nonce: int, reply: bool) -> Send:
    """Send(peer, Keepalive(nonce, reply)), built faster (see _slot_setters): keepalives and their answers
    are about a quarter of a relay's frames (rule M2)."""
    ka: Keepalive = _new_object(Keepalive)
    _set_nonce(ka, nonce)
    _set_reply(ka, reply)
    new: Send = _new_object(Send)
    _set_peer(new, peer)
    _set_msg(new, ka)
    _set_delay(new, 0.0)
    return new


class Neighbour:
    """An active neighbour: its link, liveness, flood budgets (G4) and score (S1)."""

    __slots__ = ("addr", "outbound", "last_heard", "last_sent", "reg_budget", "nonce", "score", "push_budget",
                 "congested_at", "answered_at", "answer_delay", "answers", "silences", "ka_sent", "unresponsive_at",
                 "queue_order", "queue_sent", "queue_delay", "queue_heard", "push_out", "budget_penalized_at",
                 "up_at")

    def __init__(self, addr: str, outbound: bool, now: float, burst: float, push_burst: float) -> None:
        self.addr = addr
        self.outbound = outbound
        # Rule M7: when the link came up; once a frame came from it since (last_heard later), the other
        # end holds the link too (a relay sends nothing to a link it holds on probation, M4).
        self.up_at = now
        self.last_heard = now
        self.last_sent = now
        self.reg_budget = TokenBucket(burst, now)  # registration gossip budget
        self.nonce = 0
        self.score = 0.0  # peer score: see EngineConfig.score_*
        self.push_budget = TokenBucket(push_burst, now)  # push frame budget
        # Pushes injected here whose route's next hop is this neighbour (rule C1): kept within its push
        # budget (custody.py, OUT_BUDGET_SHARE), and when its budget last cost it score (forwarding.py).
        self.push_out = TokenBucket(push_burst / 2, now)
        self.budget_penalized_at = -float("inf")
        self.congested_at = -float("inf")  # when link_congested last cost it score
        # Slowness is not silence (rule S1): when it last answered a push we forwarded (receipt or
        # route error), and the moving average of how long its answers took (late ones included).
        self.answered_at = -float("inf")
        self.answer_delay = 0.0
        # Rule C7 (custody.py): the pushes this relay holds in custody and sent it once, in the order
        # sent (settled ones leave from the front); of those answered (no re-send: which copy was
        # answered is unknown), when the latest-sent one had been sent and how long its answer took (a
        # queue answers in order); and when a receipt for one of them last came back from it.
        self.queue_order: deque[tuple[float, bytes]] | None = None  # made at the first such push
        self.queue_sent = -float("inf")
        self.queue_delay = 0.0
        self.queue_heard = -float("inf")
        # Pushes forwarded to it that it answered, and that it was blamed for (no answer in time),
        # decayed as the score is: a link is cut for missing answers only when it answers almost none
        # (scoring.BLACK_HOLE_SHARE): loss and churn make honest relays miss some, a black hole all.
        self.answers = 0.0
        self.silences = 0.0
        self.ka_sent = -1.0  # when the keepalive numbered `nonce` left (rule C4: a link round trip)
        # Rule C6: when the driver's transport last reported it unresponsive (nothing it was sent was
        # acknowledged); it is a suspect next hop until a frame from it arrives (last_heard is later).
        self.unresponsive_at = -float("inf")


class EngineState:
    """What every rule group sees: the engine's tables and helpers (filled by Engine.__init__)."""

    relay_id: str
    config: EngineConfig
    wall_offset: float
    counters: dict[str, int]
    _verifier: Verifier
    _home: HomeStore
    _level: int
    _emit: Callable[..., None]
    _rng: random.Random
    _linked: Mapping[str, Neighbour]  # the Neighbours' active view, read-only (Engine.__init__)
    _neighbours: Neighbours  # neighbours.py (M1-M7, S2's bans, F3, C7): the active view, candidates, dials, bans
    _routes: RouteTable | CompactRouteTable  # tables.py (G2, G3, F7): the route table and its expiry
    _flood: FloodState  # floodstate.py (G3b, G4): refresh budgets per route id, far-travelled first copies
    _seen: SeenCache  # seen.py (F1, F6b, F8b, F8c, F10): copies handled here, notes per push
    _reverse: ReversePaths
    _custody: CustodyTable
    _await: AwaitedAnswers  # awaited.py (F6, S1, C4-C6): pushes forwarded, awaiting an answer
    _rtt: RttEstimator  # rtt.py (C4, C4b): the per-link round-trip estimate and route lengths
    _tree: TreeGossip  # tree.py (G9): tree gossip and its tables
    # Item 2 of issue 15 (a home relay that restarts): registrations homed here and their link-up
    # announcements (homed.py, G5).
    _homed: HomedRoutes
    _stem: StemState  # stemstate.py (G5, G7, G8, G10): stem routes held, embargoes, generations, successors
    _sync: SyncState  # syncstate.py (G11): route sync at link-up, provisional routes
    _withdrawals: Withdrawals  # withdrawals.py (G12): route withdrawals sent and heeded

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _counts(self) -> dict[str, int]:
        """The counters `_count` keeps (the dict itself: stats copies it)."""
        return self.counters

    def _trace(self, now: float, kind: str, **fields: Any) -> None:
        self._emit(now, self.relay_id, kind, **fields)

    def _accept_at_home(self, push: Push, now: float) -> ReceiptStatus | RouteErrorReason | None:
        """Rule F2: the home store's verdict on push, or None when this relay is not its home.

        Rule F5c: RouteErrorReason.NOT_HOME (nothing stored, no token spent) when it is the home but
        holds no private half of the receipt key of the registration push carries (the device signed a
        registration it never registered here, or this home lost it): no receipt it could send would
        verify on the way back, and one that does not costs the relay that sends it (F5)."""
        home = self._home
        if push.webpush is not None:
            if self._key_unknown_at_home(push):
                return RouteErrorReason.NOT_HOME
            return home.accept_webpush(push, now + self.wall_offset)
        if home.is_home(push.route_id):
            if self._key_unknown_at_home(push):
                return RouteErrorReason.NOT_HOME
            return home.accept_push(push.route_id, push.token, push.push_id, push.ciphertext, now + self.wall_offset)
        return None

    def _key_unknown_at_home(self, push: Push) -> bool:
        """Rule F5c: this relay answers for push's route id but holds no key of its registration's receipt key."""
        reg = push.registration
        if reg is None or reg.receipt_key is None or reg.route_id != push.route_id:
            return False  # no relay can judge its receipt by it: the current key signs (F5)
        keys = self._home.receipt_keys(push.route_id)
        return keys is not None and reg.receipt_key not in keys

    def _local_expiry(self, expires_at: int) -> float:
        """A registration's wall-clock expiry as a time on the engine's monotonic clock."""
        off = self.wall_offset
        return expires_at - off if off else expires_at  # offset 0 (simulator): keep the shared int


    if TYPE_CHECKING:  # calls from one rule group into another (implemented in the module named)
        # membership.py
        def peer_down(self, peer: str, now: float, reason: DisconnectReason) -> list[Effect]: ...
        # gossip.py
        def _announce_homed(self, peer: str, now: float, budget: float) -> list[Effect]: ...
        # scoring.py
        def _score(self, peer: str, delta: float, now: float, reason: str) -> list[Effect]: ...
        def _purge_routes(self, peer: str) -> None: ...
        def _answered(self, peer: str, pid: bytes, now: float, *, reward: bool = True,
                      any_peer: bool = False) -> bool: ...
        def _answer_expected(self, pid: bytes, now: float) -> float | None: ...
        def _in_grace(self, pid: bytes) -> bool: ...
        def _receipt_overdue(self, pid: bytes, peer: str, sent: float, now: float,
                             wait: float | None = None) -> list[Effect]: ...
        # forwarding.py
        def _next_hop(self, rid: bytes, exclude: str | None, alternate: bool = False,
                      low_ok: bool = False) -> str | None: ...
        def _forward(self, msg: Push, nh: str, now: float) -> Send: ...
        def _report_home_silent(self, pid: bytes, nh: str, now: float, rid: bytes) -> list[Effect]: ...
        def _home_hop(self, rid: bytes, entry: RouteEntry, nh: str) -> bool: ...
        def _ring_flood(self, msg: Push, sender: str | None, now: float) -> list[Effect]: ...
        def _watch_repair(self, msg: Push, prev: str, now: float) -> None: ...
        def _steer_known(self, pid: bytes) -> bool: ...
        def _steer_hop(self, pid: bytes, rid: bytes, prev: str | None, nh: str | None,
                       now: float) -> str | None: ...
        def _deliver_local(self, pid: bytes, msg: Push, status: ReceiptStatus, now: float,
                           hops: int = 0) -> list[Effect]: ...
        # gossip.py
        def _drop_reg(self, now: float, reg: Registration, peer: str, reason: str,
                      penalty: float = 0.0) -> list[Effect]: ...
        def _evict_route(self, now: float) -> None: ...
        # stem.py
        def _stem_register(self, registration: Registration, now: float, restart: bool = False) -> list[Effect]: ...
        def _on_stem(self, peer: str, state: Neighbour, msg: RegGossip, now: float) -> list[Effect]: ...
        def _stem_flood_back(self, peer: str, msg: RegGossip, now: float) -> list[Effect]: ...
        def _stem_announcement(self, rid: bytes, homed: Registration | None, now: float) -> RegGossip | None: ...
        def _generation_arrival(self, peer: str, msg: RegGossip, entry: RouteEntry,
                                now: float) -> list[Effect] | None: ...
        def _generation_valid(self, msg: RegGossip) -> bool: ...
        def _forget_generation(self, rid: bytes) -> None: ...
        def _set_generation(self, rid: bytes, msg: RegGossip) -> None: ...
        def _stem_successor_down(self, peer: str, now: float) -> list[Effect]: ...
        # sync.py
        def _provisional_hop(self, rid: bytes, exclude: str | None) -> str | None: ...
        # rtt.py
        def _retry_period(self, rid: bytes) -> float: ...
        def _receipt_rtt(self, peer: str, msg: Receipt, now: float) -> None: ...
        def _reroute_awaited(self, peer: str, now: float, counter: str = ...) -> list[Effect]: ...
        def _keep_awaiting(self, pid: bytes, nh: str, now: float) -> bool: ...
        def _unresponsive(self, peer: str) -> bool: ...
        def _repair_stranded(self, msg: Push, suspect: str, prev: str | None, now: float) -> list[Effect]: ...
        # custody.py
        def _home_down(self, c: Custody, now: float) -> None: ...
        def _await_route(self, c: Custody, now: float) -> None: ...
        def _route_renewed(self, rid: bytes, now: float) -> None: ...
        def _settle(self, pid: bytes, status: ReceiptStatus | CustodyStatus, hops: int,
                    now: float) -> list[Effect]: ...
        def _retry(self, c: Custody, now: float) -> list[Effect]: ...
        def _attempt(self, c: Custody, now: float) -> list[Effect]: ...
