"""Web Push capabilities, per-push tags and the endpoint token in the URL (docs/protocol.md "Web Push pushes").

An endpoint URL is `<origin>/wp/v1/<R>/<E>`: R is the base64url signed registration (every relay
verifies it before routing anything), E is `endpoint_id(16) | flags(1) | vapid key prefix(8) | cap(16)
[| seal key(32)] | signature(64)`. The home relay derives `cap = HMAC-SHA256(home key, route id |
endpoint id)[:16]` and stores nothing secret per endpoint. The capability never crosses the mesh: the
entry relay sends a per-push tag, `HMAC(cap, push id | sha256(body) | ttl | urgency | encoding | topic |
vapid key hash)[:16]`, that the home relay recomputes. A relay on the path therefore learns nothing
that lets it mint a push.

The signature (token version 2) is the home relay's Ed25519 signature, under the receipt key of the
registration R (whose private half only the home relay holds, and which R's own signature certifies),
over R's exact bytes and every other byte of E. Any relay checks it with nothing but R, so an altered
byte anywhere in R or E is refused at the entry relay (404) before anything crosses the mesh; the home
relay's capability and tag then prove, as before, that the sender knew the URL.

Version 1 tokens (minted before version 2 existed) carry no signature. Entry relays still accept them
(every one dies with its registration, at most 30 days after it was minted), and the home relay tells
the two versions apart by their domain-separated capabilities and tags: a version 2 token stripped of
its signature and presented as version 1 matches neither, so a token cannot be downgraded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import struct
from dataclasses import dataclass
from enum import IntEnum

from inri.protocol import limits as L
from inri.protocol.keys import verify
from inri.protocol.messages import ContentEncoding, Urgency

CAP_BYTES = 16
VAPID_PREFIX_BYTES = 8
FLAG_RESTRICTED = 0x01
FLAG_SEAL_KEY = 0x02  # the device's X25519 seal key follows: a Matrix gateway seals notifications to it
FLAG_SIGNED = 0x04  # version 2: the home relay's signature ends the token
ENDPOINT_TOKEN_BYTES = L.ENDPOINT_ID_BYTES + 1 + VAPID_PREFIX_BYTES + CAP_BYTES  # without seal key, signature
MAX_ENDPOINT_TOKEN_BYTES = ENDPOINT_TOKEN_BYTES + L.KEY_BYTES + L.SIGNATURE_BYTES
MAX_REGISTRATION_BYTES = 1024  # a registration's wire form, at most (docs/api.md "The registration's wire form")
ENDPOINT_CONTEXT = b"inri/wp-endpoint/v2\x00"  # what the token signature covers starts with this


class TokenVersion(IntEnum):
    """Endpoint token versions: each has its own capability and tag contexts (see the module docstring)."""

    V1 = 1  # unsigned (before issue 41); accepted until their registrations have expired
    V2 = 2  # signed by the home relay under the registration's receipt key


_CAP_CONTEXT = {TokenVersion.V1: b"inri/wp-cap/v1\x00", TokenVersion.V2: b"inri/wp-cap/v2\x00"}
_TAG_CONTEXT = {TokenVersion.V1: b"inri/wp-tag/v1\x00", TokenVersion.V2: b"inri/wp-tag/v2\x00"}

URGENCY_HEADER = {
    "very-low": Urgency.VERY_LOW,
    "low": Urgency.LOW,
    "normal": Urgency.NORMAL,
    "high": Urgency.HIGH,
}
URGENCY_NAME = {v: k for k, v in URGENCY_HEADER.items()}
# A sealed body (Matrix gateway) reaches the device's app as what a standard gateway sends: the
# notification JSON labelled aes128gcm (UnifiedPush connectors hand over what they cannot decrypt).
ENCODING_NAME = {ContentEncoding.AES128GCM: "aes128gcm", ContentEncoding.AESGCM: "aesgcm",
                 ContentEncoding.SEALED: "aes128gcm"}


def vapid_key_hash(vapid_key: bytes | None) -> bytes:
    """SHA-256 of a raw 65-byte VAPID public key; empty for an unrestricted endpoint."""
    return b"" if vapid_key is None else hashlib.sha256(vapid_key).digest()


def capability(home_key: bytes, route_id: bytes, endpoint_id: bytes,
               version: TokenVersion = TokenVersion.V2) -> bytes:
    """The endpoint's capability: only the home relay (which holds home_key) can compute it."""
    return hmac.new(home_key, _CAP_CONTEXT[version] + route_id + endpoint_id, hashlib.sha256).digest()[:CAP_BYTES]


def push_tag(
    cap: bytes,
    push_id: bytes,
    body: bytes,
    ttl_s: int,
    urgency: Urgency,
    encoding: ContentEncoding,
    topic: str | None,
    vapid_hash: bytes,
    version: TokenVersion = TokenVersion.V2,
) -> bytes:
    """The per-push proof that the sender knew the capability, bound to everything the frame says."""
    msg = b"".join((
        _TAG_CONTEXT[version], push_id, hashlib.sha256(body).digest(),
        struct.pack(">IBB", ttl_s, int(urgency), int(encoding)),
        (topic or "").encode().ljust(L.MAX_TOPIC_CHARS + 1, b"\0"), vapid_hash,
    ))
    return hmac.new(cap, msg, hashlib.sha256).digest()[:L.WEBPUSH_TAG_BYTES]


def endpoint_signed_bytes(registration: bytes, token_body: bytes) -> bytes:
    """What a version 2 token's signature covers: the context, R's exact wire bytes (length first) and
    every byte of E before the signature (its flags included)."""
    return ENDPOINT_CONTEXT + struct.pack(">H", len(registration)) + registration + token_body


@dataclass(frozen=True, slots=True)
class EndpointToken:
    """The E part of an endpoint URL (decoded). A minted token is version 2 and unsigned until `signed`."""

    endpoint_id: bytes
    restricted: bool
    vapid_prefix: bytes  # first bytes of sha256(vapid key); zeros when unrestricted
    cap: bytes
    seal_key: bytes | None = None  # the device's X25519 public seal key, when it gave one at minting
    signature: bytes | None = None  # version 2: the home relay's, over endpoint_signed_bytes
    version: TokenVersion = TokenVersion.V2

    def body(self) -> bytes:
        """E without its signature, as the signature covers it (a version 1 token: all of it)."""
        flags = ((FLAG_RESTRICTED if self.restricted else 0) | (FLAG_SEAL_KEY if self.seal_key else 0)
                 | (FLAG_SIGNED if self.version == TokenVersion.V2 else 0))
        return self.endpoint_id + bytes([flags]) + self.vapid_prefix + self.cap + (self.seal_key or b"")

    def encode(self) -> bytes:
        """The raw bytes (base64url in the URL); a version 2 token must be signed first."""
        if self.version == TokenVersion.V1:
            return self.body()
        if self.signature is None:
            raise ValueError("endpoint token: version 2 needs its signature (EndpointToken.signed)")
        return self.body() + self.signature

    def signed(self, signature: bytes) -> EndpointToken:
        """This token with the home relay's signature over `endpoint_signed_bytes(R, self.body())`."""
        return dataclasses.replace(self, signature=signature)

    def authentic(self, registration: bytes, receipt_key: bytes | None) -> bool:
        """True when the signature is the home relay's for this registration (its exact bytes) and token.

        A version 1 token has nothing to check (True): see the module docstring."""
        if self.version == TokenVersion.V1:
            return True
        return (receipt_key is not None and self.signature is not None
                and verify(receipt_key, endpoint_signed_bytes(registration, self.body()), self.signature))

    @classmethod
    def decode(cls, raw: bytes) -> EndpointToken:
        """Parse E; ValueError when it is not a well-formed endpoint token (its signature is not checked here)."""
        flags = raw[L.ENDPOINT_ID_BYTES] if len(raw) > L.ENDPOINT_ID_BYTES else 0
        if flags & ~(FLAG_RESTRICTED | FLAG_SEAL_KEY | FLAG_SIGNED):
            raise ValueError("endpoint token: unknown flags")
        signed = bool(flags & FLAG_SIGNED)
        seal = L.KEY_BYTES if flags & FLAG_SEAL_KEY else 0
        want = ENDPOINT_TOKEN_BYTES + seal + (L.SIGNATURE_BYTES if signed else 0)
        if len(raw) != want:
            raise ValueError(f"endpoint token: expected {want} bytes, got {len(raw)}")
        rest = raw[L.ENDPOINT_ID_BYTES + 1:]
        cap_end = VAPID_PREFIX_BYTES + CAP_BYTES
        return cls(raw[:L.ENDPOINT_ID_BYTES], bool(flags & FLAG_RESTRICTED), rest[:VAPID_PREFIX_BYTES],
                   rest[VAPID_PREFIX_BYTES:cap_end], rest[cap_end:cap_end + seal] or None,
                   rest[cap_end + seal:] if signed else None, TokenVersion.V2 if signed else TokenVersion.V1)

    @classmethod
    def mint(cls, home_key: bytes, route_id: bytes, endpoint_id: bytes, vapid_key: bytes | None,
             seal_key: bytes | None = None) -> EndpointToken:
        """The (version 2, not yet signed) token the home relay puts in an endpoint URL."""
        prefix = vapid_key_hash(vapid_key)[:VAPID_PREFIX_BYTES] if vapid_key else bytes(VAPID_PREFIX_BYTES)
        return cls(endpoint_id, vapid_key is not None, prefix, capability(home_key, route_id, endpoint_id), seal_key)
