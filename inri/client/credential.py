"""Device keys, registrations and push credentials.

A device holds two private keys: a one-off Ed25519 *route key* (its hash is the blinded route id the
mesh routes on; the key signs the registration, so relays verify it without learning anything else)
and an X25519 *seal key* (home apps seal payloads to its public half; only the device opens them).

A push credential is what a device hands its home app: the signed registration, the public seal key
and some one-use tokens. It names neither the device nor its home relay. Within one route key, pushes
are linkable by route id (relays see the same route id); a device that wants fresh unlinkability
rotates its route key (new registration, new route id, new credential) — docs/api.md explains the
hand-over: the device exports a new credential and the home app replaces the old one.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nacl.exceptions import CryptoError
from nacl.public import PrivateKey, PublicKey, SealedBox
from nacl.signing import SigningKey

from inri.common.b64url import b64d, b64e
from inri.protocol import limits
from inri.protocol.codec import DecodeError, decode_registration, encode_registration, make_registration
from inri.protocol.messages import Registration

# b64e/b64d are the shared strict base64url helpers (inri.common.b64url), re-exported for SDK users.
__all__ = ["CREDENTIAL_VERSION", "DeviceKeys", "PushCredential", "b64d", "b64e", "open_sealed", "seal"]

CREDENTIAL_VERSION = 1


def seal(seal_key: bytes, plaintext: bytes) -> bytes:
    """Encrypt plaintext to the device's public seal key (anonymous sender, authenticated content)."""
    ct: bytes = SealedBox(PublicKey(seal_key)).encrypt(plaintext)
    if len(ct) > limits.MAX_CIPHERTEXT_BYTES:
        raise ValueError(f"payload too large: sealed size {len(ct)} > {limits.MAX_CIPHERTEXT_BYTES} bytes")
    return ct


def open_sealed(private_key: PrivateKey, ciphertext: bytes) -> bytes:
    """Decrypt a sealed payload; ValueError if it was not sealed to this key or was altered."""
    try:
        data: bytes = SealedBox(private_key).decrypt(ciphertext)
    except CryptoError:
        raise ValueError("cannot open payload: not sealed to this device, or tampered with") from None
    return data


@dataclass
class DeviceKeys:
    """A device's route key, seal key and current epoch."""

    route_key: SigningKey = field(default_factory=SigningKey.generate)
    seal_key: PrivateKey = field(default_factory=PrivateKey.generate)
    epoch: int = 1
    # The receipt key pair: its public half goes in the signed registration, its private half to the
    # home relay only (it signs the home's receipts: docs/security.md "Receipt signatures").
    receipt_key: SigningKey = field(default_factory=SigningKey.generate)

    def registration(self, lifetime_s: int = 7 * 24 * 3600, now: float | None = None) -> Registration:
        """Sign a registration for the current epoch (issued a minute early: relays' clocks differ)."""
        issued = int(time.time() if now is None else now) - 60
        return make_registration(self.route_key, self.epoch, issued, lifetime_s + 60,
                                 bytes(self.receipt_key.verify_key))

    def receipt_secret(self) -> bytes:
        """The receipt key's 32-byte seed: what the device hands its home relay when it registers."""
        return bytes(self.receipt_key)

    def to_dict(self) -> dict[str, Any]:
        return {"route_key": b64e(bytes(self.route_key)), "seal_key": b64e(bytes(self.seal_key)), "epoch": self.epoch,
                "receipt_key": b64e(bytes(self.receipt_key))}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceKeys:
        # A state file from before receipt keys gets a new one (handed to the home at the next refresh).
        receipt = d.get("receipt_key")
        return cls(SigningKey(b64d(d["route_key"], "route_key", 32)), PrivateKey(b64d(d["seal_key"], "seal_key", 32)),
                   int(d["epoch"]),
                   SigningKey(b64d(receipt, "receipt_key", 32)) if receipt is not None else SigningKey.generate())


@dataclass
class PushCredential:
    """What a home app needs to push to one device: registration, seal key, one-use tokens."""

    registration: Registration
    seal_key: bytes
    tokens: list[bytes]

    def take_token(self) -> bytes:
        from inri.client.errors import NoTokensLeft

        if not self.tokens:
            raise NoTokensLeft("push credential has no tokens left; get a fresh one from the device")
        return self.tokens.pop(0)

    def to_json(self) -> str:
        return json.dumps({"v": CREDENTIAL_VERSION, "registration": b64e(encode_registration(self.registration)),
                           "seal_key": b64e(self.seal_key), "tokens": [b64e(t) for t in self.tokens]})

    @classmethod
    def from_json(cls, text: str) -> PushCredential:
        """Parse and validate strictly; ValueError naming the problem."""
        try:
            d = json.loads(text)
        except (ValueError, RecursionError):
            raise ValueError("push credential is not JSON") from None
        if not isinstance(d, dict) or d.get("v") != CREDENTIAL_VERSION:
            raise ValueError(f"push credential must be an object with v={CREDENTIAL_VERSION}")
        extra = set(d) - {"v", "registration", "seal_key", "tokens"}
        if extra:
            raise ValueError(f"push credential has unknown fields {sorted(extra)}")
        try:
            reg = decode_registration(b64d(d.get("registration"), "registration"))
        except DecodeError as exc:
            raise ValueError(f"registration: {exc.detail}") from None
        tokens = d.get("tokens")
        if not isinstance(tokens, list) or len(tokens) > 10_000:
            raise ValueError("tokens: expected a list")
        return cls(reg, b64d(d.get("seal_key"), "seal_key", 32),
                   [b64d(t, "token", limits.TOKEN_BYTES) for t in tokens])

    def save(self, path: str | Path) -> None:
        _write_private(Path(path), self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> PushCredential:
        return cls.from_json(Path(path).read_text(encoding="utf-8"))


def _write_private(path: Path, text: str) -> None:
    """Write a secret file atomically with mode 0600."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
