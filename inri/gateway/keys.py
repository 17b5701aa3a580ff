"""The gateway's sealing key: an X25519 key pair; apps seal device tokens to its public half.

The file holds one line, the 32-byte private key in base64url, and is written with mode 0600. The
public half goes into the app (or is fetched from `GET /v1/key`); rotating the key means every
installed app re-seals its device token and registers its hook again (docs/gateway.md).
"""

from __future__ import annotations

import os
from pathlib import Path

from nacl.public import PrivateKey

from inri.common.b64url import b64d, b64e

KEY_FILE_HEADER = "# inri gateway sealing key (X25519, base64url); keep private\n"


def generate_key(path: str | Path) -> PrivateKey:
    """A new key written to path (refused if the file exists: an app's tokens are sealed to the old one)."""
    key = PrivateKey.generate()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(KEY_FILE_HEADER + b64e(bytes(key)) + "\n")
    return key


def load_key(path: str | Path) -> PrivateKey:
    """The key in path; ValueError naming the file when it is missing or not a key file."""
    try:
        lines = Path(path).read_text(encoding="ascii").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the sealing key ({exc}); make one with `inri gateway keygen`") from None
    body = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    try:
        if len(body) != 1:
            raise ValueError
        return PrivateKey(b64d(body[0], "key", 32))
    except ValueError:
        raise ValueError(f"{path}: not a sealing key file (one base64url line of 32 bytes)") from None


def public_key(key: PrivateKey) -> str:
    """The public half, base64url (what the app seals device tokens to)."""
    return b64e(bytes(key.public_key))
