"""Keys, ids and signatures (Ed25519 via PyNaCl, blake2b for ids).

A route key is a one-off Ed25519 key pair a device makes for a key period; the route id is the
blake2b-128 hash of its public half, so a registration is self-certifying: any relay checks the
signature against the key the registration carries and the id against the key, without learning
the device or its home relay.
"""

from __future__ import annotations

import hashlib
import struct

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from inri.protocol.limits import ROUTE_ID_BYTES

REGISTRATION_CONTEXT = b"inri/registration/v1\x00"
NODE_ID_BYTES = 16


def route_id_for(route_key: bytes) -> bytes:
    """The blinded route id of a route public key (32 bytes) -> 16 bytes."""
    return hashlib.blake2b(route_key, digest_size=ROUTE_ID_BYTES).digest()


def node_id_for(node_key: bytes) -> str:
    """A relay's node id: hex of blake2b-128 over its Ed25519 public key."""
    return hashlib.blake2b(node_key, digest_size=NODE_ID_BYTES).hexdigest()


def registration_signed_bytes(route_key: bytes, epoch: int, issued_at: int, lifetime: int) -> bytes:
    """The exact bytes a registration signature covers (TTL and hops are not signed: they change)."""
    return REGISTRATION_CONTEXT + route_key + struct.pack(">IQI", epoch, issued_at, lifetime)


def new_signing_key(seed: bytes | None = None) -> SigningKey:
    """A fresh Ed25519 key; a 32-byte seed makes it deterministic (simulator, tests)."""
    return SigningKey(seed) if seed is not None else SigningKey.generate()


def sign(key: SigningKey, message: bytes) -> bytes:
    """Detached 64-byte Ed25519 signature."""
    return key.sign(message).signature


def verify(public_key: bytes, message: bytes, signature: bytes) -> bool:
    """True when signature is a valid Ed25519 signature of message under public_key."""
    try:
        VerifyKey(public_key).verify(message, signature)
    except (BadSignatureError, ValueError, TypeError):
        return False
    return True
