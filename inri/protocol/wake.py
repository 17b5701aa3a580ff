"""Wake tokens: an APNs or FCM device token sealed to an app's wake-up gateway (docs/gateway.md).

A phone that cannot hold a socket registers a *wake hook* at its home relay: the URL of its app's
gateway and an opaque token. The token is the device token, sealed (libsodium sealed box: X25519,
anonymous sender) to the gateway's public key, so the home relay stores and sends bytes it cannot
read, and only the gateway, run by the app's developer, learns which APNs/FCM token to wake.

Plaintext (version 1), chosen so that a Swift or Kotlin app builds it with a JSON encoder and any
libsodium binding (`crypto_box_seal`):

    {"v":1,"p":"apns"|"fcm","t":"<device token>"}   then ASCII spaces up to the padded size

Padding: to PAD_BYTES, or to the next multiple of PAD_STEP above it, so the sealed length does not
tell an APNs token (64 hex characters) from an FCM one (about 160 characters): the home relay cannot
tell iPhones from Android phones by the token's size. Trailing spaces are JSON whitespace.

`open_wake_token` is the gateway's parser of what a relay hands it: every malformed input raises
ValueError (fuzzed in tests/test_wake_token.py).
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass

from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox

WAKE_TOKEN_VERSION = 1
PAD_BYTES = 512  # every plaintext is at least this long (an FCM token is about 160 characters)
PAD_STEP = 256
PLAINTEXT_MAX_BYTES = 2048
SEAL_OVERHEAD_BYTES = 48  # crypto_box_seal: ephemeral public key (32) + MAC (16)
WAKE_TOKEN_MAX_BYTES = PLAINTEXT_MAX_BYTES + SEAL_OVERHEAD_BYTES
WAKE_TOKEN_MIN_BYTES = PAD_BYTES + SEAL_OVERHEAD_BYTES
# APNs device tokens are hex (32 bytes today; Apple says not to assume the length): they go into the
# request path /3/device/<token>, so nothing but hex is accepted. FCM registration tokens are
# base64url-like with ':' (the instance id prefix).
_APNS_TOKEN = re.compile(r"[0-9a-fA-F]{16,400}")
_FCM_TOKEN = re.compile(r"[A-Za-z0-9_:.\-]{16,1800}")


class WakeProvider(enum.StrEnum):
    """Which push service wakes the phone (the `p` field)."""

    APNS = "apns"
    FCM = "fcm"


_TOKEN_RULES = {WakeProvider.APNS: _APNS_TOKEN, WakeProvider.FCM: _FCM_TOKEN}


@dataclass(frozen=True, slots=True)
class WakeTarget:
    """What a wake token holds: the provider and the device token it wakes."""

    provider: WakeProvider
    device_token: str


def _check(provider: object, device_token: object) -> WakeTarget:
    try:
        prov = WakeProvider(provider if isinstance(provider, str) else "")
    except ValueError:
        raise ValueError(f"unknown provider {provider!r:.20} (apns or fcm)") from None
    if not isinstance(device_token, str) or not _TOKEN_RULES[prov].fullmatch(device_token):
        raise ValueError(f"not a valid {prov.value} device token")
    return WakeTarget(prov, device_token)


def wake_plaintext(provider: WakeProvider | str, device_token: str) -> bytes:
    """The padded JSON plaintext of a wake token (what `seal_wake_token` seals)."""
    target = _check(provider, device_token)
    body = json.dumps({"v": WAKE_TOKEN_VERSION, "p": target.provider.value, "t": target.device_token},
                      separators=(",", ":")).encode("ascii")
    size = PAD_BYTES if len(body) <= PAD_BYTES else PAD_BYTES + -(-(len(body) - PAD_BYTES) // PAD_STEP) * PAD_STEP
    if size > PLAINTEXT_MAX_BYTES:
        raise ValueError("device token too long")
    return body + b" " * (size - len(body))


def seal_wake_token(gateway_public_key: bytes, provider: WakeProvider | str, device_token: str) -> bytes:
    """The opaque wake token for a hook: the device token sealed to the gateway's X25519 public key."""
    if len(gateway_public_key) != 32:
        raise ValueError("gateway public key: expected 32 bytes (X25519)")
    sealed: bytes = SealedBox(PublicKey(gateway_public_key)).encrypt(wake_plaintext(provider, device_token))
    return sealed


def open_wake_token(gateway_key: PrivateKey, token: bytes) -> WakeTarget:
    """The provider and device token inside a wake token; ValueError for anything else."""
    if not WAKE_TOKEN_MIN_BYTES <= len(token) <= WAKE_TOKEN_MAX_BYTES:
        raise ValueError("wake token: wrong size")
    try:
        plain: bytes = SealedBox(gateway_key).decrypt(token)
    except CryptoError:
        raise ValueError("wake token: not sealed to this gateway's key, or altered") from None
    try:
        data = json.loads(plain.decode("ascii"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ValueError("wake token: plaintext is not ASCII JSON") from None
    if (not isinstance(data, dict) or set(data) != {"v", "p", "t"} or type(data["v"]) is not int
            or data["v"] != WAKE_TOKEN_VERSION):
        raise ValueError(f"wake token: expected version {WAKE_TOKEN_VERSION} with exactly v, p, t")
    return _check(data["p"], data["t"])
