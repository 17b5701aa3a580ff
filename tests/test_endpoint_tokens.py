"""Endpoint tokens authenticated whole (issue 41, item 5): the home relay signs every byte of an endpoint URL's
`<R>/<E>` with the registration's receipt key; any relay opens it with R alone; a version 1 (unsigned) token
still opens, and a version 2 token cannot be downgraded into one the home accepts.

The same checks through real relays (404 at the entry, no push frame): tests/test_webpush.py."""

from __future__ import annotations

import dataclasses
import os
import string
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inri.common.b64url import b64e
from inri.core.home import MemoryHomeStore
from inri.node.store import Store
from inri.node.webpush import EndpointError, endpoint_url, mint_endpoint, open_endpoint
from inri.protocol.codec import encode_registration, make_registration
from inri.protocol.keys import new_signing_key, receipt_public_key
from inri.protocol.messages import ContentEncoding, Push, ReceiptStatus, Urgency, WebPushMeta
from inri.protocol.webpush import (
    FLAG_SIGNED,
    EndpointToken,
    TokenVersion,
    capability,
    push_tag,
    vapid_key_hash,
)

RECEIPT_SECRET = b"\x05" * 32
REG = make_registration(new_signing_key(b"\x07" * 32), 1, int(time.time()) - 60, 7 * 24 * 3600,
                        receipt_public_key(RECEIPT_SECRET))
VAPID = b"\x04" + b"\x11" * 64
SEAL = b"\x22" * 32
ORIGIN = "https://push.example.org"
B64_ALPHABET = string.ascii_letters + string.digits + "-_"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "s.db")
    s.add_device(REG, b"s" * 32, [], 0.0, RECEIPT_SECRET)
    return s


def _parts(url: str) -> tuple[str, str]:
    r, e = url.rsplit("/", 2)[-2:]
    return r, e


def _push(tok: EndpointToken, body: bytes, version: TokenVersion, vapid: bytes | None = None) -> Push:
    """What an entry relay sends for a push to tok (its tag made as a relay of `version` makes it)."""
    pid = os.urandom(16)
    tag = push_tag(tok.cap, pid, body, 60, Urgency.NORMAL, ContentEncoding.AES128GCM, None, vapid_key_hash(vapid),
                   version)
    return Push(pid, REG.route_id, bytes(16), body, 16, 0, 0, 0, REG,
                WebPushMeta(tok.endpoint_id, tag, 60, Urgency.NORMAL, ContentEncoding.AES128GCM, None))


@pytest.mark.parametrize(("vapid", "seal"), [(None, SEAL), (VAPID, None), (None, None)])
def test_every_altered_byte_and_character_is_refused(store: Store, vapid: bytes | None, seal: bytes | None) -> None:
    tok, url = mint_endpoint(store, ORIGIN, REG.route_id, vapid, seal, 0.0)
    assert url.startswith(ORIGIN + "/wp/v1/")
    r, e = _parts(url)
    reg, opened = open_endpoint(r, e)
    assert reg == REG and opened.endpoint_id == tok.endpoint_id and opened.version == TokenVersion.V2
    assert (opened.restricted, opened.seal_key, opened.cap) == (vapid is not None, seal, tok.cap)
    raw_r, raw_e = encode_registration(REG), opened.encode()
    altered = 0
    for which, raw in (("r", raw_r), ("e", raw_e)):
        for i in range(len(raw)):
            for flip in (0x01, 0x80, 0xFF):
                b = bytearray(raw)
                b[i] ^= flip
                texts = (b64e(bytes(b)), e) if which == "r" else (r, b64e(bytes(b)))
                with pytest.raises(ValueError):
                    open_endpoint(*texts)
                altered += 1
    # Every character of the URL's texts, replaced by each other base64url character: the ones that decode
    # to other bytes fail the signature, the ones that decode to the same bytes (the low bits of the last
    # character) are not the canonical text.
    for which, text in (("r", r), ("e", e)):
        for i in range(len(text)):
            for c in B64_ALPHABET[(i * 7) % 64:][:8]:
                if c == text[i]:
                    continue
                t = text[:i] + c + text[i + 1:]
                with pytest.raises(ValueError):
                    open_endpoint(*((t, e) if which == "r" else (r, t)))
                altered += 1
    for extra in ("=", "A", ""):  # padding, a character more, one fewer
        with pytest.raises(ValueError):
            open_endpoint(r, e + extra if extra else e[:-1])
    assert altered > 3 * (len(raw_r) + len(raw_e))


def test_an_equivalent_registration_encoding_is_refused(store: Store) -> None:
    """msgpack allows other encodings of the same registration (int32 for a uint32 issued_at): its own
    signature still verifies, the endpoint's (over R's exact bytes) does not."""
    _tok, url = mint_endpoint(store, ORIGIN, REG.route_id, None, SEAL, 0.0)
    r, e = _parts(url)
    raw = bytearray(encode_registration(REG))
    i = raw.index(b"\xce" + REG.issued_at.to_bytes(4, "big"))
    raw[i] = 0xD2  # int32: the same value
    from inri.protocol.codec import decode_registration
    assert decode_registration(bytes(raw)) == REG
    with pytest.raises(ValueError):
        open_endpoint(b64e(bytes(raw)), e)


def test_a_version_1_url_opens_and_a_downgraded_one_is_refused_at_home(tmp_path: Path) -> None:
    """URLs minted before tokens were signed keep working (until their registration expires); a signed token
    stripped of its signature opens at the entry like one of them, but its capability is the version 2
    one, so the home answers unknown endpoint, for both home stores."""
    home_key = os.urandom(32)
    memory = MemoryHomeStore(home_key=home_key)
    memory.add_registration(REG, [], RECEIPT_SECRET)
    sqlite = Store(tmp_path / "s.db")
    sqlite.home_key = home_key
    sqlite.add_device(REG, b"s" * 32, [], 0.0, RECEIPT_SECRET)
    eid = sqlite.mint_endpoint(REG.route_id, None, 0.0, SEAL).endpoint_id
    memory.endpoints.setdefault(REG.route_id, {})[eid] = None  # the same endpoint at both homes
    legacy = EndpointToken(eid, False, bytes(8), capability(home_key, REG.route_id, eid, TokenVersion.V1), SEAL,
                           version=TokenVersion.V1)
    r = b64e(encode_registration(REG))
    reg, opened = open_endpoint(r, b64e(legacy.encode()))
    assert opened == legacy and opened.encode()[16] & FLAG_SIGNED == 0
    current = EndpointToken.mint(home_key, REG.route_id, eid, None, SEAL)
    url = endpoint_url(sqlite, ORIGIN, REG.route_id, current)
    _, signed = open_endpoint(*_parts(url))
    downgraded = dataclasses.replace(signed, signature=None, version=TokenVersion.V1)
    _, opened_down = open_endpoint(r, b64e(downgraded.encode()))  # the entry cannot tell it from a V1 token
    for home in (memory, sqlite):
        assert home.accept_webpush(_push(legacy, b"v1", TokenVersion.V1), time.time()) == ReceiptStatus.STORED
        assert home.accept_webpush(_push(signed, b"v2", TokenVersion.V2), time.time()) == ReceiptStatus.STORED
        assert (home.accept_webpush(_push(opened_down, b"down", TokenVersion.V1), time.time())
                == ReceiptStatus.UNKNOWN_ENDPOINT)
        # Each version's tag made with the other's capability (or context) is refused too.
        assert (home.accept_webpush(_push(legacy, b"x", TokenVersion.V2), time.time())
                == ReceiptStatus.UNKNOWN_ENDPOINT)


def test_no_receipt_key_no_endpoint(tmp_path: Path) -> None:
    """A registration without a receipt key gives nothing to sign with: minting is refused, nothing stored."""
    bare = make_registration(new_signing_key(b"\x09" * 32), 1, int(time.time()) - 60, 3600)
    s = Store(tmp_path / "s.db")
    s.add_device(bare, b"s" * 32, [], 0.0)
    with pytest.raises(EndpointError):
        mint_endpoint(s, ORIGIN, bare.route_id, None, None, 0.0)
    assert s.endpoints(bare.route_id) == []


@given(st.text(max_size=400), st.text(max_size=300))
def test_open_endpoint_refuses_any_text_with_a_value_error(r: str, e: str) -> None:
    try:
        open_endpoint(r, e)
    except ValueError:
        return
    raise AssertionError("random texts opened as an endpoint")


@given(st.binary(max_size=1100), st.binary(max_size=160))
def test_open_endpoint_refuses_any_bytes_with_a_value_error(r: bytes, e: bytes) -> None:
    with pytest.raises(ValueError):
        open_endpoint(b64e(r), b64e(e))
