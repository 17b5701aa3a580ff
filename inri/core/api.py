"""The sans-IO engine's contract: its inputs, its effects, and the three objects a driver injects.

Drivers (the trio daemon in `inri.node`, the simulator in `simulations`) own sockets, clocks, disks
and trace files. They call `Engine` methods with an explicit `now` (seconds, float; a monotonic
clock in the daemon, virtual time in the simulator; wall-clock time is `now + Engine.wall_offset`)
and carry out the returned effects in order. They re-arm one timer at `Engine.get_timer()` and call
`Engine.handle_timer(now)` when it fires (aioquic style).

Injected objects:
- `Verifier`: checks registration signatures. The simulator shares one caching verifier across its
  thousands of in-process engines (one check per distinct registration, not per relay).
- `HomeStore`: the home relay's tokens and mailboxes. The core decides, the store remembers:
  `MemoryHomeStore` (inri.core.home) for the simulator and tests, SQLite in the daemon.
- `Tracer`: receives trace events (docs/trace-schema.md). Its `level` decides what the engine emits.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Protocol

from inri.protocol.messages import Message, Push, Receipt, ReceiptBatch, ReceiptStatus, Registration


class TraceLevel(IntEnum):
    """off: nothing; summary: what the metrics need; full: every frame decision."""

    OFF = 0
    SUMMARY = 1
    FULL = 2


class Tracer(Protocol):
    """Receives trace events. Field meanings: docs/trace-schema.md. Unused fields are None.

    A tracer may also offer `emit_row(row)`, taking a whole row as a tuple in the schema's column order
    (inri.core.trace.COLUMNS); the engine then uses it for its hottest row (route_set).
    """

    level: TraceLevel

    def emit(
        self,
        t: float,
        relay: str,
        kind: str,
        *,
        msg: str | None = None,
        route: str | None = None,
        peer: str | None = None,
        hops: int | None = None,
        ttl: int | None = None,
        epoch: int | None = None,
        count: int | None = None,
        nbytes: int | None = None,
        reason: str | None = None,
    ) -> None: ...


class Verifier(Protocol):
    """Checks that a registration's signature is valid for its route key."""

    def verify_registration(self, registration: Registration) -> bool: ...

    def verify_receipt(self, receipt_key: bytes, route_id: bytes, receipt: Receipt) -> bool:
        """True when receipt's signature is the home relay's, under receipt_key, for this route id."""
        ...

    def verify_receipts(self, receipt_key: bytes, batch: ReceiptBatch) -> bool:
        """True when batch's signature is the home relay's, under receipt_key, for its route and items (F5b)."""
        ...

    def verify_generation(self, receipt_key: bytes, route_id: bytes, epoch: int, generation: int,
                          signature: bytes) -> bool:
        """True when signature is the home relay's, under receipt_key, over this route generation (G10)."""
        ...


class HomeStore(Protocol):
    """The home relay's view of its own registrations: tokens, spends, mailboxes.

    All methods are synchronous and cheap (in-memory, or one SQLite transaction in the daemon).
    """

    def is_home(self, route_id: bytes) -> bool: ...

    def receipt_keys(self, route_id: bytes) -> Container[bytes] | None:
        """The public receipt keys whose private halves this home holds for route_id (rule F5c): the
        current registration's and each superseded one's until its registration expired (an unregistered
        device's too, while its Web Push endpoints answer GONE); empty when its device handed none over.
        None when this relay does not answer for route_id (it is not its home)."""
        ...

    def sign_receipt(self, route_id: bytes, message: bytes, receipt_key: bytes | None) -> bytes | None:
        """Sign message (keys.receipt_signed_bytes, receipts_signed_bytes, generation_signed_bytes) with the
        private half of receipt_key, the receipt key of the registration the push carried (rule F5c:
        current or superseded, see receipt_keys); receipt_key None: the current registration's (no
        relay can judge such a receipt). None when this home holds no such key (the receipt then goes
        unsigned)."""
        ...

    def accept_push(
        self, route_id: bytes, token: bytes, push_id: bytes, ciphertext: bytes, now: float
    ) -> ReceiptStatus:
        """Spend token for push_id and store the message, once.

        STORED the first time; DUPLICATE when push_id already spent this token (nothing stored
        again); SPENT when another push id spent it; UNKNOWN_TOKEN; MAILBOX_FULL.
        """
        ...

    def accept_webpush(self, push: Push, now: float) -> ReceiptStatus | None:
        """Check a Web Push push's tag against the endpoint's capability and store it, once.

        None when this relay is not (and was not) the route id's home: the push travels on.
        STORED, EXPIRED (its TTL left is 0 and the device's stream is closed: accepted and dropped, as
        RFC 8030 says), DUPLICATE, UNKNOWN_ENDPOINT (no such endpoint or a wrong tag), GONE (revoked, or
        the device unregistered), RATE_LIMITED, MAILBOX_FULL.
        """
        ...


# ---------------------------------------------------------------------------------------------
# Reasons and statuses (str enums: their values are what traces, counters and the API show).


class DisconnectReason(StrEnum):
    """Why a link ended: the reason of a `Disconnect` effect, and what `Engine.peer_down` is told.

    The first six are the engine's own (a driver passes the remote engine's reason on to the other
    side: a QUIC close carries it); the engine acts on them (no re-dial after FULL, SCORE, ...).
    """

    SCORE = "score"  # cut for its peer score (rule S2)
    BANNED = "banned"  # refused: still banned for its score
    FULL = "full"  # refused: the active view is full
    OUTBOUND_QUOTA = "outbound_quota"  # an inbound link dropped for a link we dialled (rule M3)
    MAKE_ROOM = "make_room"  # dropped to make room for a relay short of neighbours (rule M4)
    KEEPALIVE_TIMEOUT = "keepalive_timeout"  # silent for keepalive_misses intervals (rule M2)
    LINK_LOST = "link_lost"  # the link failed or closed for any other reason (network, crash)

    @classmethod
    def from_remote(cls, text: str) -> DisconnectReason:
        """The reason a peer gave when it closed a link (free text on the wire): LINK_LOST if unknown."""
        try:
            return cls(text)
        except ValueError:
            return cls.LINK_LOST


class CustodyStatus(StrEnum):
    """The final status of a push whose custody ended (`CustodyReleased.status`)."""

    DELIVERED = "delivered"  # the home stored it (or had it already: receipt DUPLICATE)
    SPENT = "spent"  # its token was spent by another push
    UNKNOWN_TOKEN = "unknown_token"
    MAILBOX_FULL = "mailbox_full"
    UNKNOWN_ENDPOINT = "unknown_endpoint"  # Web Push: no such endpoint (or a forged tag)
    GONE = "gone"  # Web Push: endpoint revoked or device unregistered
    RATE_LIMITED = "rate_limited"  # Web Push: the endpoint's limit at home
    # Rule F5c: the home does not hold the receipt key of the push's registration (the device signed one
    # it never registered there, or the home lost it): at the home at once, elsewhere at the deadline
    # (the `not home` answer is unsigned: until then the push is retried along its route)
    UNKNOWN_REGISTRATION = "unknown_registration"
    # No receipt by the deadline though routes existed (hops None), or the home dropped it because its
    # Web Push TTL had run out (receipt EXPIRED: hops set)
    EXPIRED = "expired"
    UNREACHABLE = "unreachable"  # no route to the device was ever found


# ---------------------------------------------------------------------------------------------
# Effects: what the driver must do, in order.


@dataclass(frozen=True, slots=True)
class Send:
    """Send msg to a neighbour after `delay` seconds (forwarding jitter; 0 = now)."""

    peer: str
    msg: Message
    delay: float = 0.0


@dataclass(frozen=True, slots=True)
class Connect:
    """Open a link to a relay (membership wants another active neighbour).

    The driver later calls `Engine.peer_up` on success or `Engine.connect_failed` on failure.
    """

    peer: str
    addr: str


@dataclass(frozen=True, slots=True)
class Disconnect:
    """Close the link to peer (dead, misbehaving, or over the active-view size)."""

    peer: str
    reason: DisconnectReason


@dataclass(frozen=True, slots=True)
class Delivered:
    """A push was stored in a mailbox at this (home) relay: wake the device's live stream."""

    route_id: bytes
    push_id: bytes


@dataclass(frozen=True, slots=True)
class CustodyTaken:
    """This relay accepted push into custody: persist it before answering the home app 202."""

    push: Push
    deadline: float  # give up (status "expired"/"unreachable") after this time (engine clock: monotonic)


@dataclass(frozen=True, slots=True)
class CustodyReleased:
    """Custody of push_id ended: the daemon deletes it from disk and records the final status.

    status: see `CustodyStatus`. A receipt after the deadline corrects the status with a second
    CustodyReleased.
    """

    push_id: bytes
    status: CustodyStatus
    hops: int | None = None


Effect = Send | Connect | Disconnect | Delivered | CustodyTaken | CustodyReleased


# ---------------------------------------------------------------------------------------------
# Results of direct calls.


class InjectOutcome(IntEnum):
    """What became of a push a home app injected at this relay."""

    ACCEPTED = 1  # in custody, effects carry it on its way
    BAD_REGISTRATION = 2  # signature, route id or freshness check failed: refused, nothing sent
    TOKEN_MISMATCH = 3  # malformed token / route id pair
    OVERLOADED = 4  # custody table full or per-route injection budget exhausted


@dataclass(frozen=True, slots=True)
class InjectResult:
    """Outcome of `Engine.inject_push` plus the effects to carry out."""

    outcome: InjectOutcome
    push_id: bytes | None
    effects: list[Effect] = field(default_factory=list)
    reason: str = ""  # why a push was refused (the engine's push_refused_<reason> counter)
