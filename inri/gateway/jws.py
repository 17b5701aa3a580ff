"""The two JWTs the gateway signs: APNs provider tokens (ES256) and Google's OAuth2 assertion (RS256).

Hand-written over `cryptography` (already a dependency) rather than with a JWT library: the gateway
only *produces* compact JWS (RFC 7515) from its own keys and fixed headers, and never parses an
untrusted token, so the part of a JWT library that carries the risk (verification, algorithm
confusion, claim checks) is not needed; what remains is base64url of two JSON objects and one
signature, about twenty lines. ES256 is the one subtlety: JWS wants the raw 64-byte r||s
(RFC 7518 section 3.4), `cryptography` gives DER. The test fakes of APNs and Google verify these
tokens independently against the configured public keys (tests/gateway_fakes.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, padding, rsa
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from inri.common.b64url import b64e

Signer = Callable[[bytes], bytes]


def compact(header: dict[str, Any], claims: dict[str, Any], sign: Signer) -> str:
    """header.claims.signature, each part base64url (JWS compact serialization, RFC 7515 section 7.1)."""
    head = b64e(json.dumps(header, separators=(",", ":")).encode())
    body = b64e(json.dumps(claims, separators=(",", ":")).encode())
    signing_input = f"{head}.{body}".encode("ascii")
    return f"{head}.{body}.{b64e(sign(signing_input))}"


def es256(key: ec.EllipticCurvePrivateKey) -> Signer:
    """ECDSA P-256 with SHA-256, as JWS writes it: r and s, 32 bytes each (RFC 7518 section 3.4)."""

    def sign(data: bytes) -> bytes:
        r, s = decode_dss_signature(key.sign(data, ec.ECDSA(hashes.SHA256())))
        return r.to_bytes(32, "big") + s.to_bytes(32, "big")

    return sign


def rs256(key: rsa.RSAPrivateKey) -> Signer:
    """RSASSA-PKCS1-v1_5 with SHA-256 (RFC 7518 section 3.3)."""

    def sign(data: bytes) -> bytes:
        return key.sign(data, padding.PKCS1v15(), hashes.SHA256())

    return sign


def load_p8(path: str | Path) -> ec.EllipticCurvePrivateKey:
    """The APNs auth key (.p8: a PKCS#8 PEM P-256 key); ValueError naming the file otherwise."""
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror or exc}") from None
    except (ValueError, TypeError):
        raise ValueError(f"{path}: not a PEM private key (expected the .p8 file Apple gives)") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ValueError(f"{path}: not a P-256 key (APNs keys are ES256)")
    return key


def load_rsa_pem(text: str, what: str) -> rsa.RSAPrivateKey:
    """An RSA private key in PEM (a service account's private_key); ValueError naming `what` otherwise."""
    try:
        key = serialization.load_pem_private_key(text.encode(), password=None)
    except (ValueError, TypeError):
        raise ValueError(f"{what}: not a PEM private key") from None
    if not isinstance(key, rsa.RSAPrivateKey):
        raise ValueError(f"{what}: not an RSA key (Google service accounts sign RS256)")
    return key
