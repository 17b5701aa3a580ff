"""Web Push capabilities, per-push tags and the endpoint token in the URL (docs/protocol.md "Web Push").

An endpoint URL is `<origin>/wp/v1/<R>/<E>`: R is the base64url signed registration (every relay
verifies it before routing anything), E is `endpoint_id(16) | flags(1) | vapid key prefix(8) | cap(16)`.
The home relay derives `cap = HMAC-SHA256(home key, route id | endpoint id)[:16]` and stores nothing
secret per endpoint. The capability never crosses the mesh: the entry relay sends a per-push tag,
`HMAC(cap, push id | sha256(body) | ttl | urgency | encoding | topic | vapid key hash)[:16]`, that the
home relay recomputes. A relay on the path therefore learns nothing that lets it mint a push.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass

from inri.protocol import limits as L
from inri.protocol.messages import ContentEncoding, Urgency

CAP_BYTES = 16
VAPID_PREFIX_BYTES = 8
FLAG_RESTRICTED = 0x01
FLAG_SEAL_KEY = 0x02  # the device's X25519 seal key follows: a Matrix gateway seals notifications to it
ENDPOINT_TOKEN_BYTES = L.ENDPOINT_ID_BYTES + 1 + VAPID_PREFIX_BYTES + CAP_BYTES

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


def capability(home_key: bytes, route_id: bytes, endpoint_id: bytes) -> bytes:
    """The endpoint's capability: only the home relay (which holds home_key) can compute it."""
    return hmac.new(home_key, b"inri/wp-cap/v1\0" + route_id + endpoint_id, hashlib.sha256).digest()[:CAP_BYTES]


def push_tag(
    cap: bytes,
    push_id: bytes,
    body: bytes,
    ttl_s: int,
    urgency: Urgency,
    encoding: ContentEncoding,
    topic: str | None,
    vapid_hash: bytes,
) -> bytes:
    """The per-push proof that the sender knew the capability, bound to everything the frame says."""
    msg = b"".join((
        b"inri/wp-tag/v1\0", push_id, hashlib.sha256(body).digest(),
        struct.pack(">IBB", ttl_s, int(urgency), int(encoding)),
        (topic or "").encode().ljust(L.MAX_TOPIC_CHARS + 1, b"\0"), vapid_hash,
    ))
    return hmac.new(cap, msg, hashlib.sha256).digest()[:L.WEBPUSH_TAG_BYTES]


@dataclass(frozen=True, slots=True)
class EndpointToken:
    """The E part of an endpoint URL (decoded)."""

    endpoint_id: bytes
    restricted: bool
    vapid_prefix: bytes  # first bytes of sha256(vapid key); zeros when unrestricted
    cap: bytes
    seal_key: bytes | None = None  # the device's X25519 public seal key, when it gave one at minting

    def encode(self) -> bytes:
        """The raw bytes (base64url in the URL)."""
        flags = (FLAG_RESTRICTED if self.restricted else 0) | (FLAG_SEAL_KEY if self.seal_key else 0)
        return self.endpoint_id + bytes([flags]) + self.vapid_prefix + self.cap + (self.seal_key or b"")

    @classmethod
    def decode(cls, raw: bytes) -> EndpointToken:
        """Parse E; ValueError when it is not a well-formed endpoint token."""
        flags = raw[L.ENDPOINT_ID_BYTES] if len(raw) > L.ENDPOINT_ID_BYTES else 0
        want = ENDPOINT_TOKEN_BYTES + (L.KEY_BYTES if flags & FLAG_SEAL_KEY else 0)
        if len(raw) != want:
            raise ValueError(f"endpoint token: expected {want} bytes, got {len(raw)}")
        if flags & ~(FLAG_RESTRICTED | FLAG_SEAL_KEY):
            raise ValueError("endpoint token: unknown flags")
        rest = raw[L.ENDPOINT_ID_BYTES + 1:]
        return cls(raw[:L.ENDPOINT_ID_BYTES], bool(flags & FLAG_RESTRICTED), rest[:VAPID_PREFIX_BYTES],
                   rest[VAPID_PREFIX_BYTES:VAPID_PREFIX_BYTES + CAP_BYTES],
                   rest[VAPID_PREFIX_BYTES + CAP_BYTES:] or None)

    @classmethod
    def mint(cls, home_key: bytes, route_id: bytes, endpoint_id: bytes, vapid_key: bytes | None,
             seal_key: bytes | None = None) -> EndpointToken:
        """The token the home relay puts in a newly minted endpoint URL."""
        prefix = vapid_key_hash(vapid_key)[:VAPID_PREFIX_BYTES] if vapid_key else bytes(VAPID_PREFIX_BYTES)
        return cls(endpoint_id, vapid_key is not None, prefix, capability(home_key, route_id, endpoint_id), seal_key)
