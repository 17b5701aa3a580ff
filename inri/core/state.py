"""The engine's state, shared by its rule groups: per-neighbour and per-push records, the sentinels
of the reverse path, constants, and `EngineState`, the base every rule-group mixin builds on.

`EngineState` declares every table the rule groups read (the engine's __init__ fills them) and,
for the type checker only, the methods one rule group calls in another: the dependencies between
groups are listed in one place.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any

from inri.core.api import CustodyStatus, DisconnectReason, Effect, HomeStore, Send, Verifier
from inri.core.budget import TokenBucket
from inri.core.config import EngineConfig
from inri.core.tables import BoundedMap, RouteTable
from inri.protocol.messages import Push, ReceiptStatus

# Clock skew tolerated on a registration's issued_at (relays' clocks are not synchronised).
MAX_CLOCK_SKEW_S = 300
# How often the engine sweeps expired routes and seen/reverse entries.
SWEEP_INTERVAL_S = 30.0


class ReverseMark(Enum):
    """Reverse-path entries that are not a previous hop (push id -> previous hop or one of these)."""

    LOCAL = 1  # the push was injected here: this relay is its custodian
    # Custody gave up: a receipt that still comes back (the last attempt got through late) corrects
    # the final status instead of being lost.
    LATE = 2


RECEIPT_STATUS = {
    ReceiptStatus.STORED: CustodyStatus.DELIVERED,
    ReceiptStatus.DUPLICATE: CustodyStatus.DELIVERED,
    ReceiptStatus.SPENT: CustodyStatus.SPENT,
    ReceiptStatus.UNKNOWN_TOKEN: CustodyStatus.UNKNOWN_TOKEN,
    ReceiptStatus.MAILBOX_FULL: CustodyStatus.MAILBOX_FULL,
    ReceiptStatus.UNKNOWN_ENDPOINT: CustodyStatus.UNKNOWN_ENDPOINT,
    ReceiptStatus.GONE: CustodyStatus.GONE,
    ReceiptStatus.RATE_LIMITED: CustodyStatus.RATE_LIMITED,
}


def readdress(push: Push, ttl: int, hops: int, attempt: int, ring: int) -> Push:
    """A copy of push with new hop fields; id, route, token, ciphertext and registration kept.

    (Positional construction: dataclasses.replace costs several times more on the forwarding path.)
    """
    return Push(push.push_id, push.route_id, push.token, push.ciphertext, ttl, hops, attempt, ring, push.registration,
                push.webpush)


class Neighbour:
    """An active neighbour: its link, liveness, flood budgets (G4) and score (S1)."""

    __slots__ = ("addr", "outbound", "last_heard", "last_sent", "reg_budget", "nonce", "score", "push_budget",
                 "congested_at", "answered_at", "answer_delay")

    def __init__(self, addr: str, outbound: bool, now: float, burst: float, push_burst: float) -> None:
        self.addr = addr
        self.outbound = outbound
        self.last_heard = now
        self.last_sent = now
        self.reg_budget = TokenBucket(burst, now)  # registration gossip budget
        self.nonce = 0
        self.score = 0.0  # peer score: see EngineConfig.score_*
        self.push_budget = TokenBucket(push_burst, now)  # push frame budget
        self.congested_at = -float("inf")  # when link_congested last cost it score
        # Slowness is not silence (rule S1): when it last answered a push we forwarded (receipt or
        # route error), and the moving average of how long its answers took (late ones included).
        self.answered_at = -float("inf")
        self.answer_delay = 0.0


class Custody:
    """A push this relay accepted from a home app, kept until its receipt returns (C1-C3)."""

    __slots__ = ("push", "attempt", "ring_step", "deadline", "next_retry", "home_down", "routed")

    def __init__(self, push: Push, deadline: float) -> None:
        self.push = push
        self.attempt = 0
        self.ring_step = 0
        self.home_down = False  # a relay next to the home reported it unreachable
        self.routed = False  # some attempt left along a cached route
        self.deadline = deadline
        self.next_retry = 0.0


class EngineState:
    """What every rule group sees: the engine's tables and helpers (filled by Engine.__init__)."""

    relay_id: str
    config: EngineConfig
    listen_addr: str
    wall_offset: float
    counters: dict[str, int]
    reg_duplicates: int
    _verifier: Verifier
    _home: HomeStore
    _level: int
    _emit: Callable[..., None]
    _emit_row: Callable[[tuple[Any, ...]], None] | None
    _rng: random.Random
    _active: dict[str, Neighbour]
    _passive: dict[str, str]
    _connecting: dict[str, float]
    _lost: dict[str, list[Any]]
    _routes: RouteTable
    _origin_bucket: dict[bytes, TokenBucket]
    _push_seen: BoundedMap[tuple[bytes, int], float]
    _reverse: BoundedMap[bytes, tuple[str | ReverseMark, float]]
    _custody: dict[bytes, Custody]
    _timers: list[tuple[float, int, bytes]]
    _seq: int
    _next_tick: float | None
    _next_sweep: float
    _next_exchange: float
    _banned: dict[str, float]
    _probation: dict[str, tuple[float, str]]
    _next_make_room: float
    _await: BoundedMap[bytes, tuple[str, float]]
    _overdue: dict[bytes, tuple[str, float, float]]
    _overdue_heap: list[tuple[float, bytes]]
    _blamed: BoundedMap[bytes, tuple[str, float, float]]
    _score_decay: float

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _trace(self, now: float, kind: str, **fields: Any) -> None:
        self._emit(now, self.relay_id, kind, **fields)

    def _accept_at_home(self, push: Push, now: float) -> ReceiptStatus | None:
        """Rule F2: the home store's verdict on push, or None when this relay is not its home."""
        if push.webpush is not None:
            return self._home.accept_webpush(push, now + self.wall_offset)
        if self._home.is_home(push.route_id):
            return self._home.accept_push(push.route_id, push.token, push.push_id, push.ciphertext,
                                          now + self.wall_offset)
        return None

    def _local_expiry(self, expires_at: int) -> float:
        """A registration's wall-clock expiry as a time on the engine's monotonic clock."""
        off = self.wall_offset
        return expires_at - off if off else expires_at  # offset 0 (simulator): keep the shared int

    def _arm_tick(self, now: float) -> None:
        if self._next_tick is None:
            self._next_tick = now + self.config.keepalive_interval_s

    if TYPE_CHECKING:  # calls from one rule group into another (implemented in the module named)
        # membership.py
        def add_candidates(self, peers: list[Any], now: float) -> list[Effect]: ...
        def peer_up(self, peer: str, now: float, *, outbound: bool, addr: str = "") -> list[Effect]: ...
        def peer_down(self, peer: str, now: float, reason: DisconnectReason) -> list[Effect]: ...
        def connect_failed(self, peer: str, now: float) -> list[Effect]: ...
        def _refill(self, now: float) -> list[Effect]: ...
        # scoring.py
        def _score(self, peer: str, delta: float, now: float, reason: str) -> list[Effect]: ...
        def _purge_routes(self, peer: str) -> None: ...
        def _answered(self, peer: str, pid: bytes, now: float, *, reward: bool = True,
                      any_peer: bool = False) -> bool: ...
        def _answer_expected(self, pid: bytes, now: float) -> float | None: ...
        # forwarding.py
        def _next_hop(self, rid: bytes, exclude: str | None, alternate: bool = False,
                      low_ok: bool = False) -> str | None: ...
        def _forward(self, msg: Push, nh: str, now: float) -> Send: ...
        def _ring_flood(self, msg: Push, sender: str | None, now: float) -> list[Effect]: ...
        def _mark_seen(self, key: tuple[bytes, int], now: float) -> None: ...
        def _deliver_local(self, pid: bytes, msg: Push, status: ReceiptStatus, now: float,
                           hops: int = 0) -> list[Effect]: ...
        # custody.py
        def _settle(self, pid: bytes, status: ReceiptStatus, hops: int, now: float) -> list[Effect]: ...
        def _retry(self, c: Custody, now: float) -> list[Effect]: ...
