"""base64url (RFC 4648 section 5), the one encoding of binary fields in every JSON body INRI speaks.

Encoding drops the padding; decoding accepts it or not, and is strict: only the URL-safe alphabet,
because Python's `urlsafe_b64decode` silently discards characters outside it (so `"a+b/"` would
decode to something instead of being refused).
"""

from __future__ import annotations

import base64
import binascii
import re

_ALPHABET = re.compile(r"[A-Za-z0-9_-]*={0,2}")
_TO_STANDARD = bytes.maketrans(b"-_", b"+/")
_DEFAULT_MAX = 65536  # bounds the text we even look at when the caller gives no size


def b64e(data: bytes) -> str:
    """base64url without padding."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64d(text: object, what: str = "value", size: int | None = None, *, max_size: int | None = None) -> bytes:
    """Strict base64url (padding optional) -> bytes; ValueError naming `what` otherwise.

    size: the exact decoded length required; max_size: the largest decoded length accepted (checked on
    the text's length first, so an oversized value costs no decoding).
    """
    if not isinstance(text, str):
        raise ValueError(f"{what}: expected a base64url string")
    if len(text) > 4 * ((max_size or size or _DEFAULT_MAX) + 3) // 3 + 4:
        raise ValueError(f"{what}: at most {max_size or size or _DEFAULT_MAX} bytes")
    try:
        if "=" in text or "+" in text or "/" in text:
            if not _ALPHABET.fullmatch(text):
                raise ValueError
            # The alphabet is checked above: binascii decodes the standard alphabet without base64's wrappers.
            data = binascii.a2b_base64((text + "=" * (-len(text) % 4)).encode("ascii").translate(_TO_STANDARD))
        else:
            # Unpadded (what b64e writes): strict binascii refuses any character outside the alphabet
            # itself ('+' and '/' are excluded above), with no regular expression pass over the text.
            data = binascii.a2b_base64((text + "=" * (-len(text) % 4)).encode("ascii").translate(_TO_STANDARD),
                                       strict_mode=True)
    except (binascii.Error, ValueError):  # UnicodeEncodeError (not ASCII) is a ValueError
        raise ValueError(f"{what}: not valid base64url") from None
    if size is not None and len(data) != size:
        raise ValueError(f"{what}: expected {size} bytes, got {len(data)}")
    if max_size is not None and len(data) > max_size:
        raise ValueError(f"{what}: at most {max_size} bytes")
    return data
