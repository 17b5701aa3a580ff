"""Web Push endpoint URLs (minted at the home relay, opened at any relay) and the checks an entry relay
runs on a Web Push request before anything crosses the mesh.

Endpoint URLs: `mint_endpoint` is the one place a relay mints an endpoint URL (the device API and any
other front that hands out Web Push endpoints call it); `endpoint_url` forms the URL of an endpoint
already minted; `open_endpoint` is what every relay runs on a URL's `<R>/<E>` before anything else.
The token format and its signature are in inri/protocol/webpush.py.

RFC 8030 headers (TTL, Urgency, Topic), RFC 8188/8291 body framing (aes128gcm byte for byte; aesgcm
re-framed), and RFC 8292 VAPID (ES256 JWT, `aud` one of this relay's public origins, `exp` at most
24 h ahead). Each failure is a `WebPushError` carrying the HTTP status the sender must see.
ES256 verification uses `cryptography` (already a dependency through aioquic): no hand-written crypto.
"""

from __future__ import annotations

import json
import re
import struct
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from inri.common import b64url
from inri.node.config import RelayConfig
from inri.node.store import Store
from inri.protocol import limits
from inri.protocol.codec import DecodeError, decode_registration, encode_registration
from inri.protocol.messages import ContentEncoding, Registration, Urgency
from inri.protocol.webpush import (
    MAX_ENDPOINT_TOKEN_BYTES,
    MAX_REGISTRATION_BYTES,
    URGENCY_HEADER,
    EndpointToken,
    endpoint_signed_bytes,
)

VAPID_MAX_AHEAD_S = 24 * 3600  # RFC 8292 section 2: exp no more than 24 hours ahead
_TOPIC = re.compile(r"[A-Za-z0-9_-]+=*")
_AES128GCM_HEADER = 21  # salt(16) | rs(4) | idlen(1), then the key id


class WebPushError(Exception):
    """A refusal with the status the sender must see (400, 401, 403, 413)."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


NEEDS_RECEIPT_KEY = ("Web Push endpoints are signed with the registration's receipt key: register with a "
                     "receipt key (and its receipt_secret)")


class EndpointError(Exception):
    """An endpoint cannot be minted for this device (its registration has no receipt key to sign with)."""


def public_origins(config: RelayConfig) -> tuple[str, ...]:
    """The origins this relay answers Web Push on (`[webpush] public_origins`, trailing slashes dropped):
    VAPID `aud` must be one of them, and minted endpoint URLs and `Location` headers use the first.
    Empty: `http://` (or `https://` with `[api] tls_cert`) + the API listen address."""
    return tuple(o.rstrip("/") for o in config.webpush.public_origins) or (
        f"{'https' if config.api.tls_cert else 'http'}://{config.relay.api}",)


def _signing_registration(store: Store, route_id: bytes) -> Registration:
    """The registration an endpoint URL of route_id carries; EndpointError when it has no receipt key."""
    reg = store.registration(route_id)
    if reg is None or reg.receipt_key is None:
        raise EndpointError(NEEDS_RECEIPT_KEY)
    return reg


def endpoint_url(store: Store, origin: str, route_id: bytes, token: EndpointToken) -> str:
    """The URL of a minted endpoint of a device homed here, with its current registration:
    `<origin>/wp/v1/<R>/<E>`, E signed with the device's receipt key (docs/protocol.md "Web Push pushes").

    EndpointError when the registration has no receipt key, or the key this home holds is not the
    registration's (no relay could check the signature)."""
    reg = _signing_registration(store, route_id)
    raw = encode_registration(reg)
    signature = store.sign_receipt(route_id, endpoint_signed_bytes(raw, token.body()), reg.receipt_key)
    signed = None if signature is None else token.signed(signature)
    if signed is None or not signed.authentic(raw, reg.receipt_key):
        raise EndpointError(NEEDS_RECEIPT_KEY)
    return f"{origin}/wp/v1/{b64url.b64e(raw)}/{b64url.b64e(signed.encode())}"


def mint_endpoint(store: Store, origin: str, route_id: bytes, vapid_key: bytes | None, seal_key: bytes | None,
                  now: float) -> tuple[EndpointToken, str]:
    """Mint a Web Push endpoint of a device homed here: (its token, its URL). The one minting function:
    restricted to vapid_key when given; seal_key (the device's X25519 public key) lets the Matrix
    gateway seal notifications to it. EndpointError (nothing stored) when it cannot be signed."""
    _signing_registration(store, route_id)
    token = store.mint_endpoint(route_id, vapid_key, now, seal_key)
    return token, endpoint_url(store, origin, route_id, token)


def _canonical_b64d(text: str, what: str, max_size: int) -> bytes:
    """Strict base64url, and only the one text b64e writes for those bytes (no padding, no stray low
    bits in the last character): two texts of one endpoint would be two URLs that both work."""
    raw = b64url.b64d(text, what, max_size=max_size)
    if b64url.b64e(raw) != text:
        raise ValueError(f"{what}: not in canonical base64url")
    return raw


def open_endpoint(reg_text: str, token_text: str) -> tuple[Registration, EndpointToken]:
    """The registration and token of an endpoint URL's `<R>/<E>`, E's signature checked against R's
    receipt key over R's exact bytes; ValueError for anything else (the relay answers 404 at once).

    R's own signature and freshness are checked when the push is injected (the engine's verifier)."""
    raw_reg = _canonical_b64d(reg_text, "registration", MAX_REGISTRATION_BYTES)
    raw_tok = _canonical_b64d(token_text, "endpoint", MAX_ENDPOINT_TOKEN_BYTES)
    try:
        reg = decode_registration(raw_reg)
    except DecodeError as exc:
        raise ValueError(f"registration: {exc.detail}") from None
    token = EndpointToken.decode(raw_tok)
    if not token.authentic(raw_reg, reg.receipt_key):
        raise ValueError("endpoint token: its signature does not verify")
    return reg, token


@dataclass(frozen=True, slots=True)
class Headers:
    """The parsed RFC 8030 headers of one push."""

    ttl_s: int  # granted (clamped) TTL
    urgency: Urgency
    topic: str | None


def parse_headers(ttl: str | None, urgency: str | None, topic: str | None, ttl_max_s: int) -> Headers:
    """TTL (required, digits, clamped), Urgency (default normal), Topic (<= 32 base64url characters)."""
    if ttl is None or not ttl.strip().isdigit():
        raise WebPushError(400, "bad_ttl", "TTL header missing or not a non-negative integer")
    granted = min(int(ttl.strip()), ttl_max_s)
    if urgency is None:
        level = Urgency.NORMAL
    elif urgency.strip().lower() in URGENCY_HEADER:
        level = URGENCY_HEADER[urgency.strip().lower()]
    else:
        raise WebPushError(400, "bad_urgency", "Urgency must be very-low, low, normal or high")
    if topic is not None:
        topic = topic.strip()
        if len(topic) > limits.MAX_TOPIC_CHARS or not _TOPIC.fullmatch(topic):
            raise WebPushError(400, "bad_topic", "Topic must be at most 32 base64url characters")
    return Headers(granted, level, topic)


def _params(value: str | None) -> dict[str, str]:
    """`a=b; c=d` / `a=b,c=d` header parameters, lowercased names."""
    out: dict[str, str] = {}
    for part in re.split(r"[;,]", value or ""):
        name, sep, val = part.strip().partition("=")
        if sep:
            out[name.strip().lower()] = val.strip().strip('"')
    return out


def frame_body(body: bytes, encoding: str | None, encryption: str | None, crypto_key: str | None) -> tuple[
        bytes, ContentEncoding]:
    """The body as it travels: aes128gcm as sent (one record only), aesgcm re-framed with its headers.

    The aesgcm frame is the common-proxies one: `"aesgcm\\nEncryption: <v>\\nCrypto-Key: dh=<v>\\n" + body`
    (the `p256ecdsa=` VAPID key is dropped: it is no business of the device's).
    """
    enc = (encoding or "").strip().lower()
    if enc == "aes128gcm":
        if encryption is not None or "dh" in _params(crypto_key):
            raise WebPushError(400, "bad_encoding", "aes128gcm carries its salt and key in the body, not in headers")
        if len(body) < _AES128GCM_HEADER:
            raise WebPushError(400, "bad_encoding", "aes128gcm body shorter than its header")
        rs, idlen = struct.unpack(">IB", body[16:_AES128GCM_HEADER])
        start = _AES128GCM_HEADER + idlen
        if rs < 18 or len(body) < start or len(body) - start > rs:
            raise WebPushError(400, "bad_encoding", "aes128gcm body must be exactly one record (RFC 8291)")
        return body, ContentEncoding.AES128GCM
    if enc == "aesgcm":
        salt, dh = _params(encryption).get("salt"), _params(crypto_key).get("dh")
        if not salt or not dh:
            raise WebPushError(400, "bad_encoding", "aesgcm needs Encryption: salt= and Crypto-Key: dh=")
        framed = f"aesgcm\nEncryption: salt={salt}\nCrypto-Key: dh={dh}\n".encode() + body
        if len(framed) > limits.MAX_CIPHERTEXT_BYTES:
            raise WebPushError(413, "too_large", "aesgcm body and its headers exceed 4,096 bytes")
        return framed, ContentEncoding.AESGCM
    if not body and not enc:  # a push without data (RFC 8030: allowed)
        return b"", ContentEncoding.AES128GCM
    raise WebPushError(400, "bad_encoding", "Content-Encoding must be aes128gcm or aesgcm")


def normalise_origin(origin: str) -> str:
    """scheme://host[:port] with default ports dropped, lowercased (VAPID `aud` comparison)."""
    u = urlsplit(origin.strip())
    host = (u.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    default = {"http": 80, "https": 443}.get(u.scheme.lower())
    port = "" if u.port is None or u.port == default else f":{u.port}"
    return f"{u.scheme.lower()}://{host}{port}"


def vapid_credentials(authorization: str | None, crypto_key: str | None) -> tuple[str, bytes] | None:
    """(JWT, raw public key) from `vapid t=..,k=..` or the draft `WebPush <jwt>` + `p256ecdsa=`; None if absent."""
    if not authorization:
        return None
    scheme, _, rest = authorization.strip().partition(" ")
    if scheme.lower() == "vapid":
        p = _params(rest)
        jwt, key = p.get("t"), p.get("k")
    elif scheme.lower() == "webpush":
        jwt, key = rest.strip(), _params(crypto_key).get("p256ecdsa")
    else:
        raise WebPushError(401, "bad_vapid", "Authorization must use the vapid (or WebPush) scheme")
    if not jwt or not key:
        raise WebPushError(401, "bad_vapid", "VAPID needs both the JWT and the public key")
    try:
        raw = b64url.b64d(key, "k", 65)
    except ValueError:
        raise WebPushError(401, "bad_vapid", "VAPID key is not a base64url 65-byte P-256 point") from None
    return jwt, raw


# (JWT, key) -> its claims, for JWTs whose signature verified: an application server signs one JWT and
# reuses it for many pushes (up to its exp), so the ECDSA check runs once per JWT; aud and exp are
# checked on every push. Bounded (the oldest entry goes first).
_VAPID_VERIFIED: dict[tuple[str, bytes], dict[str, Any]] = {}
VAPID_CACHE_MAX = 4096


def verify_vapid(jwt: str, key: bytes, origins: frozenset[str], now: float | None = None) -> None:
    """RFC 8292: ES256 signature by key, `aud` one of origins, `exp` in (now, now + 24 h]."""
    now = time.time() if now is None else now
    claims = _VAPID_VERIFIED.get((jwt, key))
    if claims is None:
        claims = _verify_vapid_signature(jwt, key)
        if len(_VAPID_VERIFIED) >= VAPID_CACHE_MAX:
            del _VAPID_VERIFIED[next(iter(_VAPID_VERIFIED))]
        _VAPID_VERIFIED[(jwt, key)] = claims
    aud, exp = claims.get("aud"), claims.get("exp")
    if not isinstance(aud, str) or normalise_origin(aud) not in origins:
        raise WebPushError(401, "bad_vapid", "VAPID aud is not this relay's origin")
    if not isinstance(exp, int) or isinstance(exp, bool) or exp <= now or exp > now + VAPID_MAX_AHEAD_S:
        raise WebPushError(401, "bad_vapid", "VAPID exp must be in the future and at most 24 h ahead")


def _verify_vapid_signature(jwt: str, key: bytes) -> dict[str, Any]:
    """The claims of an ES256 JWT signed by key; WebPushError when it is malformed or does not verify."""
    try:
        head_b64, claims_b64, sig_b64 = jwt.split(".")
        header = json.loads(b64url.b64d(head_b64, "header"))
        claims = json.loads(b64url.b64d(claims_b64, "claims"))
        sig = b64url.b64d(sig_b64, "signature", 64)
        pub = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), key)
    except (ValueError, TypeError, RecursionError):
        raise WebPushError(401, "bad_vapid", "VAPID JWT or key malformed") from None
    if not isinstance(header, dict) or header.get("alg") != "ES256" or not isinstance(claims, dict):
        raise WebPushError(401, "bad_vapid", "VAPID JWT must be ES256")
    der = encode_dss_signature(int.from_bytes(sig[:32], "big"), int.from_bytes(sig[32:], "big"))
    try:
        pub.verify(der, f"{head_b64}.{claims_b64}".encode(), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise WebPushError(401, "bad_vapid", "VAPID signature does not verify") from None
    return claims
