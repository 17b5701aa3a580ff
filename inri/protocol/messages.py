"""Every relay-to-relay wire message as a frozen, slotted dataclass (h11 style: nouns, no behaviour).

Encoding and strict decoding live in `inri.protocol.codec`; this module only names the messages and
their fields. Byte fields have fixed sizes from `inri.protocol.limits`; ints are unsigned and bounded.

Identity model (docs/protocol.md):
- A device makes a one-off Ed25519 *route key* per key period. route_id = blake2b-128(route_key).
- A `Registration` is signed by the route key and carries an `epoch` that increases with every
  refresh (re-registration) under that key: relays keep the newest epoch, and an older epoch never
  overrides a newer one (AODV destination sequence numbers).
- Tokens are one-use 16-byte permissions under a route id, known and spent only at the home relay.
  Relays route on the route id only, so routing state grows with registrations, not tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from inri.protocol.keys import route_id_for


class MessageType(IntEnum):
    """The first element of every encoded frame."""

    HELLO = 1
    REG_GOSSIP = 2
    PUSH = 3
    RECEIPT = 4
    ROUTE_ERROR = 5
    KEEPALIVE = 6
    PEER_EXCHANGE = 7
    ERROR = 8
    REG_ANNOUNCE = 9  # gossip_scheme "tree": compact announcements (and a prune), batched per neighbour
    REG_GRAFT = 10  # gossip_scheme "tree": ask a neighbour for a full registration it announced
    STEM_REPAIR = 11  # stem on (rule G10): "the stem below me broke", sent back along the stem to the home
    RECEIPT_BATCH = 12  # rule F5b: a home relay's receipts for several pushes of one route under one signature
    ROUTE_SYNC = 13  # rule G11: routes a neighbour holds, sent to a relay that asked for them at link-up
    ROUTE_WITHDRAW = 14  # rule G12: routes the sender lost (or got back), to neighbours that said `withdraw`


class ReceiptStatus(IntEnum):
    """What the home relay did with a push (travels back along the reverse path)."""

    STORED = 1  # token valid and unspent: message stored in the mailbox
    DUPLICATE = 2  # same push id seen before: the same receipt again, nothing stored twice
    SPENT = 3  # token already spent by a different push id
    UNKNOWN_TOKEN = 4  # route id is home here but the token is not one of its tokens
    MAILBOX_FULL = 5  # home refused: mailbox at its cap
    # Web Push pushes only (docs/protocol.md "Web Push pushes"):
    UNKNOWN_ENDPOINT = 6  # no such endpoint of this route id, or its per-push tag does not verify
    GONE = 7  # the endpoint was revoked, or its device unregistered
    RATE_LIMITED = 8  # the endpoint's rate limit at home: try again later
    # Its TTL ran out before the device could take it (TTL 0 with the device's stream closed, or the TTL
    # spent waiting in custody): accepted and dropped, as RFC 8030 says; never stored.
    EXPIRED = 9


class RouteErrorReason(IntEnum):
    """Why a relay could not forward a push (travels back toward the custodian)."""

    NO_ROUTE = 1
    NEXT_HOP_DOWN = 2
    TTL_EXHAUSTED = 3
    NOT_HOME = 4  # route pointed here but this relay is not (or no longer) home
    OVERLOADED = 5
    HOME_UNREACHABLE = 6  # this relay's next hop WAS the home relay, and that link is gone
    DUPLICATE = 7  # this relay already handled this push attempt: its answer went back the first way
    REPAIR_FAILED = 8  # this relay's local repair (radius-2 search) got no answer in time (rule F8)
    REPAIR_FOUND = 9  # a copy of the local repair upstream met a route here and follows it (rule F8b)
    # REPAIR_FAILED, and no relay between the search and here has another next hop for the route: the
    # push's second route attempt would meet the same search again (rule F9)
    DEAD_END = 10


class ErrorCode(IntEnum):
    """Peer error frame codes (stable: operators grep for them)."""

    MALFORMED = 1
    UNSUPPORTED_VERSION = 2
    TOO_LARGE = 3
    BAD_SIGNATURE = 4
    RATE_LIMITED = 5
    NOT_ACCEPTING = 6  # active view full, try another relay
    INTERNAL = 7


@dataclass(frozen=True, slots=True)
class Registration:
    """A signed, self-certifying registration: the only thing about a device the mesh ever sees."""

    route_key: bytes  # 32-byte Ed25519 public key, one-off per device key period
    epoch: int  # u32, increases with every refresh under this key
    issued_at: int  # unix seconds (virtual seconds in the simulator)
    lifetime: int  # seconds the route lives after issued_at
    signature: bytes  # 64 bytes over keys.registration_signed_bytes(...)
    # 32-byte Ed25519 public key the home relay's receipts for this route id are signed with (the device
    # made the pair and gave the private half to its home only): any relay on the path verifies a
    # receipt without learning which relay is the home. None: a registration without one (its
    # receipts cannot be verified; docs/security.md "Receipt signatures").
    receipt_key: bytes | None = None
    # Derived once at construction (not on the wire): relays look these up for every arrival, and one
    # shared object per registration keeps the simulator's 10k engines from each holding a copy.
    route_id: bytes = field(init=False, repr=False, compare=False)
    expires_at: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "route_id", route_id_for(self.route_key))
        object.__setattr__(self, "expires_at", self.issued_at + self.lifetime)


@dataclass(frozen=True, slots=True)
class Hello:
    """First frame on a new link, both ways: who I am, where I listen (node key is bound by TLS)."""

    version: int
    node_id: str
    listen_addr: str  # "host:port" of the sender's QUIC listener ("" if it accepts no inbound)
    features: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RegGossip:
    """Registration gossip: flooded with a TTL; each relay caches where it first arrived from."""

    registration: Registration
    ttl: int  # hops left
    hops: int  # hops travelled so far (0 when sent by the home relay)
    # A stem frame (docs/protocol.md, rules G6-G8): passed to one neighbour, not flooded; ttl and hops
    # are then fixed (gossip_ttl, 0) so they tell a stem relay nothing about its position.
    stem: bool = False
    # Route generation (rule G10): 0, or a re-stem the home relay issued for this (route id, epoch) after
    # its stem broke; a higher generation replaces the routes of a lower one. generation_sig: 64 bytes,
    # the home's Ed25519 signature over keys.generation_signed_bytes(route id, epoch, generation) with
    # the registration's receipt key (so no other relay can issue one); None exactly when generation is 0.
    generation: int = 0
    generation_sig: bytes | None = None
    # Tree gossip (rule G9): milliseconds between the sender's virtual arrival of this (route, epoch)
    # and this frame's sending, as an Announcement's lag_ms; 0 (never with stem or a generation)
    # is not written out.
    lag_ms: int = 0


@dataclass(frozen=True, slots=True)
class Announcement:
    """One entry of a RegAnnounce: the sender holds a route to route_id at this epoch, hops away from
    its home (as RegGossip's hops: what the full frame would have carried)."""

    route_id: bytes
    epoch: int
    hops: int
    # Milliseconds between the sender's own (virtual) arrival of this (route, epoch) and this frame's
    # sending (rule G9: batching, or a full frame that came later than an announcement): the receiver
    # counts the announcement as if it had come that much earlier, as flooding's copy would have.
    # 0 is not written out (a 3-field entry), so each announcement has one encoding.
    lag_ms: int = 0


@dataclass(frozen=True, slots=True)
class RegAnnounce:
    """Lazy push of the tree gossip scheme (Plumtree's IHAVE, docs/protocol.md rule G9), batched per
    neighbour: compact announcements of registrations the sender holds, in place of their full frames on
    links off the eager tree, and two kinds of tree upkeep about route ids the receiver forwarded:
    prunes (its full frame came when the sender already had it: send announcements instead, Plumtree's
    PRUNE) and eager requests (its announcement came before any full frame: send full frames again)."""

    entries: tuple[Announcement, ...]
    prunes: tuple[bytes, ...] = ()  # route ids
    eager: tuple[bytes, ...] = ()  # route ids


@dataclass(frozen=True, slots=True)
class RegGraft:
    """Tree repair (Plumtree's GRAFT): the sender got only announcements of (route_id, epoch) and asks
    for the full registration; the link is eager again (full frames) in both directions."""

    route_id: bytes
    epoch: int


@dataclass(frozen=True, slots=True)
class StemRepair:
    """Rule G10: the sender, a stem relay (or fluff relay's predecessor) of (route_id, epoch, generation),
    lost its stem successor; sent to its predecessor, and on along the stem to the home relay, which
    re-stems the registration at generation + 1."""

    route_id: bytes
    epoch: int
    generation: int


class Urgency(IntEnum):
    """RFC 8030 section 5.3 urgency of a Web Push push (header values in `inri.protocol.webpush`)."""

    VERY_LOW = 1
    LOW = 2
    NORMAL = 3
    HIGH = 4


class ContentEncoding(IntEnum):
    """How a Web Push body is encrypted: RFC 8291 aes128gcm, or the older aesgcm draft (re-framed)."""

    AES128GCM = 1
    AESGCM = 2
    SEALED = 3  # a Matrix gateway notification, sealed to the device's seal key at the entry relay


@dataclass(frozen=True, slots=True)
class WebPushMeta:
    """What a Web Push push carries beside its body. Never the capability, URL, VAPID key or JWT.

    The home relay recomputes the capability from its own key and checks `tag` (inri.protocol.webpush).
    """

    endpoint_id: bytes  # 16 bytes, chosen by the home relay when it minted the endpoint
    tag: bytes  # 16 bytes: HMAC(capability, push id | sha256(body) | ttl | urgency | encoding | topic | vapid)
    ttl_s: int  # seconds the message may wait in the mailbox (0: only if the device's stream is open)
    urgency: Urgency
    encoding: ContentEncoding
    topic: str | None  # at most 32 base64url characters: replaces the unacknowledged message with the same topic
    # Whole seconds the push has already waited in custody when this copy was sent (RFC 8030 5.2: TTL
    # runs from acceptance at the entry relay, not from arrival at home). The custodian rewrites it on
    # every attempt, so it is not in the tag; a relay that changed it could only shorten the stay or
    # lengthen it up to ttl_s, which the tag binds.
    age_s: int = 0


@dataclass(frozen=True, slots=True)
class Push:
    """A push in flight. Routed on route_id; the token is checked and spent only at home."""

    push_id: bytes  # 16 random bytes chosen by the custodian (the relay that accepted it)
    route_id: bytes
    token: bytes
    ciphertext: bytes  # sealed to the device's key; relays never see the content
    ttl: int  # hops left
    hops: int  # hops travelled so far
    attempt: int  # custody re-send counter (0 first); seen-caches key on (push_id, attempt)
    ring: int  # 0: follow cached routes; >0: expanding-ring search with this radius left
    registration: Registration | None  # carried so fallback relays can verify the route id
    # A Web Push push (token is then 16 zero bytes and ciphertext the raw Web Push body); None: native.
    webpush: WebPushMeta | None = None


@dataclass(frozen=True, slots=True)
class Receipt:
    """The home relay's answer, sent back hop by hop along reverse-path state to the custodian."""

    push_id: bytes
    status: ReceiptStatus
    hops: int  # hops the push took to reach home (not signed: it changes on no relay, but proves nothing)
    # 64 bytes: the home relay's Ed25519 signature over keys.receipt_signed_bytes(push id, route id,
    # status) with the registration's receipt key; None when the registration has no receipt key.
    signature: bytes | None = None


@dataclass(frozen=True, slots=True)
class ReceiptBatch:
    """Rule F5b: the home relay's receipts for several pushes of ONE route (one receipt key), answered in
    one scheduling round to one neighbour, under one signature. Passed on whole (the signature covers
    every item); each relay handles the items it holds reverse-path state for."""

    route_id: bytes
    # (push id, status, hops) per push: 2 to limits.MAX_RECEIPTS_PER_BATCH distinct push ids. hops is
    # not signed (as in Receipt).
    items: tuple[tuple[bytes, ReceiptStatus, int], ...]
    # 64 bytes: Ed25519 over keys.receipts_signed_bytes(route id, items) with the receipt key.
    signature: bytes


@dataclass(frozen=True, slots=True)
class RouteError:
    """A relay could not forward push_id; sent back along the reverse path (AODV RERR)."""

    push_id: bytes
    route_id: bytes
    reason: RouteErrorReason


@dataclass(frozen=True, slots=True)
class Keepalive:
    """Link liveness probe (reply=False) and its answer (reply=True) echoing the nonce."""

    nonce: int
    reply: bool


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """One entry of a peer exchange: a relay and where it listens."""

    node_id: str
    addr: str


@dataclass(frozen=True, slots=True)
class SyncedRoute:
    """One entry of a RouteSync: the sender holds a route to route_id, `hops` from its home (its distance),
    for `ttl_s` more seconds (its registration's remaining lifetime)."""

    route_id: bytes
    hops: int
    ttl_s: int


@dataclass(frozen=True, slots=True)
class RouteSync:
    """Rule G11: routes the sender holds, for a neighbour that asked at link-up (a Hello with the feature
    `sync`): a restarted relay re-learns the routes it lacks as provisional routes through the sender.
    Not signed and not forwarded; never sent to a relay that did not ask."""

    entries: tuple[SyncedRoute, ...]


class WithdrawKind(IntEnum):
    """What one RouteWithdraw entry says about the sender's route (rule G12)."""

    NO_ROUTE = 1  # its last live next hop went (a link lost, or withdrawn by the next hop itself)
    HOME_DOWN = 2  # as NO_ROUTE, where the route's home relay is the one lost (its link, hop 0)
    RESTORED = 3  # the route the sender withdrew has a live next hop again, `hops` from its home
    # Rule G13 (Babel's seqno request): the sender has no route it may take (withdrawn, and the routes
    # offered are not feasible) and asks a home of the route id for a newer route generation (G10);
    # `hops`: how many more relays may pass it on towards a home.
    REQUEST = 4


@dataclass(frozen=True, slots=True)
class WithdrawnRoute:
    """One entry of a RouteWithdraw: the sender's route to route_id (of `epoch`) is gone (kind NO_ROUTE,
    HOME_DOWN) or back (RESTORED, at distance `hops`; 0 for a withdrawal), or a request for a newer
    route generation (REQUEST, `hops` the relays it may still pass). `generation`: the sender's route
    generation of that epoch (G10, G13; 0: none): a receiver that holds a newer one ignores the entry (it
    is about a route the newer generation's flood replaced)."""

    route_id: bytes
    epoch: int
    kind: WithdrawKind
    hops: int
    generation: int = 0


@dataclass(frozen=True, slots=True)
class RouteWithdraw:
    """Rule G12: triggered route updates (Babel's and DSDV's), sent to neighbours that said `withdraw` in
    their Hello. A receiver heeds an entry only from a neighbour that is its next hop for the route (a
    withdrawal), or whose withdrawal it heeded (a restore). Not signed; passed on only as this relay's own."""

    entries: tuple[WithdrawnRoute, ...]


@dataclass(frozen=True, slots=True)
class PeerExchange:
    """A sample of the sender's active and passive views (HyParView shuffle)."""

    peers: tuple[PeerInfo, ...]


@dataclass(frozen=True, slots=True)
class ErrorFrame:
    """A peer error: the receiver logs it and may close the link; never crashes on it."""

    code: ErrorCode
    detail: str


Message = (Hello | RegGossip | Push | Receipt | ReceiptBatch | RouteError | Keepalive | PeerExchange | ErrorFrame
           | RegAnnounce | RegGraft | StemRepair | RouteSync | RouteWithdraw)
