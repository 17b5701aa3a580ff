"""Keys, ids and signatures (Ed25519 via PyNaCl, blake2b for ids).

A route key is a one-off Ed25519 key pair a device makes for a key period; the route id is the
blake2b-128 hash of its public half, so a registration is self-certifying: any relay checks the
signature against the key the registration carries and the id against the key, without learning
the device or its home relay.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from inri.protocol.limits import ROUTE_ID_BYTES

# v2: the signed bytes cover the registration's receipt key (docs/protocol.md "Receipt signatures").
REGISTRATION_CONTEXT = b"inri/registration/v2\x00"
RECEIPT_CONTEXT = b"inri/receipt/v1\x00"
RECEIPTS_CONTEXT = b"inri/receipts/v1\x00"  # rule F5b: a batch of receipts under one signature
GENERATION_CONTEXT = b"inri/generation/v1\x00"
NODE_ID_BYTES = 16


def route_id_for(route_key: bytes) -> bytes:
    """The blinded route id of a route public key (32 bytes) -> 16 bytes."""
    return hashlib.blake2b(route_key, digest_size=ROUTE_ID_BYTES).digest()


def node_id_for(node_key: bytes) -> str:
    """A relay's node id: hex of blake2b-128 over its Ed25519 public key."""
    return hashlib.blake2b(node_key, digest_size=NODE_ID_BYTES).hexdigest()


def registration_signed_bytes(
    route_key: bytes, epoch: int, issued_at: int, lifetime: int, receipt_key: bytes | None = None
) -> bytes:
    """The exact bytes a registration signature covers (TTL and hops are not signed: they change).

    The receipt key is signed too (a flag byte, then the key), so no relay can strip or swap it.
    """
    tail = b"\x00" if receipt_key is None else b"\x01" + receipt_key
    return REGISTRATION_CONTEXT + route_key + struct.pack(">IQI", epoch, issued_at, lifetime) + tail


def receipt_signed_bytes(push_id: bytes, route_id: bytes, status: int) -> bytes:
    """The exact bytes a home relay's receipt signature covers.

    The push id and the route id bind the receipt to one push of one registration (it cannot be
    replayed for another push), the status to what the home did with it.
    """
    return RECEIPT_CONTEXT + push_id + route_id + bytes((status,))


def receipts_signed_bytes(route_id: bytes, items: Iterable[tuple[bytes, int, int]]) -> bytes:
    """The exact bytes a home relay's receipt batch signature covers (rule F5b): the route id, then each
    (push id, status) in the batch's order. Push ids have a fixed length (16 bytes), so the
    concatenation is unambiguous; the context differs from a single receipt's, so neither signature
    passes for the other. hops (the third element) is not covered, as in a single receipt."""
    return RECEIPTS_CONTEXT + route_id + b"".join([pid + bytes((status,)) for pid, status, _ in items])


def generation_signed_bytes(route_id: bytes, epoch: int, generation: int) -> bytes:
    """The exact bytes a home relay's route generation signature covers (rule G10), signed with the
    registration's receipt key: another context than receipts', so neither can pass for the other."""
    return GENERATION_CONTEXT + route_id + struct.pack(">II", epoch, generation)


def receipt_public_key(secret: bytes) -> bytes:
    """The 32-byte public receipt key of a 32-byte receipt key seed (what a registration carries)."""
    return bytes(SigningKey(secret).verify_key)


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
