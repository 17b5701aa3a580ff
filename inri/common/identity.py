"""A relay's persistent Ed25519 node key: its node id, its TLS certificate key, its announcement signer."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from nacl.signing import SigningKey

from inri.protocol.keys import node_id_for

KEY_FILE_MAGIC = b"inri-node-key-v1\n"


@dataclass(frozen=True)
class NodeIdentity:
    """An Ed25519 key pair; node_id = blake2b-128 of the public key, hex (inri.protocol.keys.node_id_for)."""

    signing_key: SigningKey
    public_key: bytes = field(init=False)
    node_id: str = field(init=False)

    def __post_init__(self) -> None:
        pub = bytes(self.signing_key.verify_key)
        object.__setattr__(self, "public_key", pub)
        object.__setattr__(self, "node_id", node_id_for(pub))

    @classmethod
    def generate(cls) -> NodeIdentity:
        """A fresh random identity."""
        return cls(SigningKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> NodeIdentity:
        """A deterministic identity from a 32-byte seed (tests, simulations)."""
        return cls(SigningKey(seed))

    @property
    def seed(self) -> bytes:
        """The 32-byte private seed (the TLS certificate key is built from it)."""
        return bytes(self.signing_key)

    @classmethod
    def load_or_create(cls, path: Path) -> NodeIdentity:
        """Read the key file at path, or create it (mode 0600) with a new key.

        The file is written to a temporary name and renamed, so a crash never leaves half a key; a file
        that exists but is not a key raises ValueError rather than silently replacing the relay's identity.
        """
        path = Path(path)
        if path.exists():
            data = path.read_bytes()
            if not data.startswith(KEY_FILE_MAGIC) or len(data) != len(KEY_FILE_MAGIC) + 64:
                raise ValueError(f"{path}: not an INRI node key file (expected {KEY_FILE_MAGIC!r} + 64 hex chars)")
            try:
                seed = bytes.fromhex(data[len(KEY_FILE_MAGIC):].decode("ascii"))
            except (UnicodeDecodeError, ValueError) as exc:
                raise ValueError(f"{path}: corrupt node key file: {exc}") from None
            return cls.from_seed(seed)
        ident = cls.generate()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(KEY_FILE_MAGIC + ident.seed.hex().encode("ascii"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return ident

    def sign(self, data: bytes) -> bytes:
        """Detached 64-byte Ed25519 signature of data."""
        return self.signing_key.sign(data).signature
