"""The engine's shared records and helpers: per-neighbour records, the builders of forwarded frames,
constants, the engine's context (`EngineContext`) and `RuleGroup`, the base of every rule group.

Each rule group (membership.py ... rtt.py) is an object that owns its own state and holds the owner
objects it uses and the other groups it calls (typed with their classes): Engine.__init__ builds and
wires them, so the calls between groups are ordinary method calls on those references.
"""

from __future__ import annotations

import dataclasses
import random
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from inri.core.api import CustodyReleased, CustodyStatus, HomeStore, Send, Verifier
from inri.core.budget import TokenBucket
from inri.core.config import EngineConfig
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


class EngineContext:
    """What an engine is given when it is built (identity, configuration, verifier, home store, random
    stream, trace level and sink, its counters, the linked neighbours' read-only view), and, between
    calls, by its driver: `wall_offset` (wall-clock time is now + wall_offset; Engine.wall_offset writes
    it here). The engine and its rule groups hold the same one."""

    __slots__ = ("relay_id", "config", "verifier", "home", "rng", "level", "emit", "counters", "linked",
                 "wall_offset")

    def __init__(self, relay_id: str, config: EngineConfig, verifier: Verifier, home: HomeStore, rng: random.Random,
                 level: int, emit: Callable[..., None], counters: dict[str, int], linked: Mapping[str, Neighbour]
                 ) -> None:
        self.relay_id = relay_id
        self.config = config
        self.verifier = verifier
        self.home = home
        self.rng = rng
        self.level = level
        self.emit = emit
        self.counters = counters  # one dict for the engine and every group (Engine.stats reads it)
        self.linked = linked
        self.wall_offset = 0.0  # the simulator leaves it 0 (virtual time is both); the daemon sets it


class RuleGroup:
    """The base of every rule group (membership.py ... rtt.py): the engine's context as attributes (read
    on the hot paths: one attribute read, not two) and the helpers every group calls. A group's own
    state is set by its __init__; the other groups it calls are given to it by `wire` (Engine.__init__)."""

    def __init__(self, ctx: EngineContext) -> None:
        self._ctx = ctx  # wall_offset is read here each time: the driver changes it between calls
        self.relay_id = ctx.relay_id
        self.config = ctx.config
        self._verifier = ctx.verifier
        self._home = ctx.home
        self._rng = ctx.rng
        self._level = ctx.level
        self._emit = ctx.emit
        self.counters = ctx.counters
        self._linked = ctx.linked  # the Neighbours' active view, read-only

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

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
            return home.accept_webpush(push, now + self._ctx.wall_offset)
        if home.is_home(push.route_id):
            if self._key_unknown_at_home(push):
                return RouteErrorReason.NOT_HOME
            return home.accept_push(push.route_id, push.token, push.push_id, push.ciphertext,
                                    now + self._ctx.wall_offset)
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
        off = self._ctx.wall_offset
        return expires_at - off if off else expires_at  # offset 0 (simulator): keep the shared int
