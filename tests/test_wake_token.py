"""Wake tokens (inri/protocol/wake.py): sealed to the gateway, uniform in size, and opened strictly.

`open_wake_token` is the gateway's parser of what any relay (or anyone) POSTs: it is fuzzed with random
bytes, with altered sealed tokens, and with hostile plaintexts sealed to the right key."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nacl.public import PrivateKey, PublicKey, SealedBox

from inri.protocol.wake import (
    PAD_BYTES,
    WAKE_TOKEN_MAX_BYTES,
    WakeProvider,
    WakeTarget,
    open_wake_token,
    seal_wake_token,
)
from tests.gateway_fakes import apns_device_token, fcm_device_token

KEY = PrivateKey.generate()
PUB = bytes(KEY.public_key)


def test_round_trip_for_both_providers() -> None:
    apns, fcm = apns_device_token(), fcm_device_token()
    assert open_wake_token(KEY, seal_wake_token(PUB, "apns", apns)) == WakeTarget(WakeProvider.APNS, apns)
    assert open_wake_token(KEY, seal_wake_token(PUB, WakeProvider.FCM, fcm)) == WakeTarget(WakeProvider.FCM, fcm)


def test_an_iphone_and_an_android_phone_seal_to_the_same_size() -> None:
    """The home relay must not tell platforms apart by the token's length (64 vs ~160 characters)."""
    sizes = {len(seal_wake_token(PUB, "apns", apns_device_token())),
             len(seal_wake_token(PUB, "fcm", fcm_device_token()))}
    assert sizes == {PAD_BYTES + 48}
    long_fcm = "a" * 700  # a longer token steps up by 256 bytes, never to its own exact size
    assert len(seal_wake_token(PUB, "fcm", long_fcm)) == PAD_BYTES + 256 * 1 + 48


def test_the_relay_holds_nothing_it_can_read_and_each_seal_differs() -> None:
    token = apns_device_token()
    a, b = seal_wake_token(PUB, "apns", token), seal_wake_token(PUB, "apns", token)
    assert a != b  # an ephemeral key per seal: two hooks of one phone are not linkable by their bytes
    for sealed in (a, b):
        assert token.encode() not in sealed and bytes.fromhex(token) not in sealed
    with pytest.raises(ValueError, match="not sealed to this gateway"):
        open_wake_token(PrivateKey.generate(), a)


@pytest.mark.parametrize("provider, device_token", [
    ("apns", "../../3/device/x"), ("apns", "zz" * 32), ("apns", "ab"), ("fcm", "has space" * 4),
    ("fcm", "x" * 2000), ("gcm", "a" * 64), ("", "a" * 64),
])
def test_device_tokens_that_are_not_one_are_refused_at_sealing(provider: str, device_token: str) -> None:
    with pytest.raises(ValueError):
        seal_wake_token(PUB, provider, device_token)


def _sealed_plain(plain: bytes) -> bytes:
    return bytes(SealedBox(PublicKey(PUB)).encrypt(plain.ljust(PAD_BYTES)))


@pytest.mark.parametrize("plain", [
    {"v": 2, "p": "apns", "t": "ab" * 32},
    {"v": True, "p": "apns", "t": "ab" * 32},  # True == 1 in Python: the version must be the integer 1
    {"v": 1, "p": "apns", "t": "ab" * 32, "x": 1},
    {"v": 1, "p": "apns"},
    {"v": 1, "p": "apns", "t": "ab" * 31 + "/."},  # a path in the APNs URL
    {"v": 1, "p": "fcm", "t": 12345},
    {"v": 1, "p": ["apns"], "t": "ab" * 32},
    [1, "apns", "ab" * 32],
])
def test_hostile_plaintexts_sealed_to_the_right_key_are_refused(plain: object) -> None:
    with pytest.raises(ValueError):
        open_wake_token(KEY, _sealed_plain(json.dumps(plain).encode()))


def test_non_json_and_non_ascii_plaintexts_are_refused() -> None:
    for plain in (b"\xff\xfe" * 10, b"[" * 400, b'{"v":1,"p":"apns","t":"\xc3\xa9"}'):
        with pytest.raises(ValueError):
            open_wake_token(KEY, _sealed_plain(plain))


@given(st.binary(max_size=WAKE_TOKEN_MAX_BYTES + 10))
def test_random_bytes_never_open_and_never_raise_anything_but_value_error(data: bytes) -> None:
    with pytest.raises(ValueError):
        open_wake_token(KEY, data)


@given(st.integers(min_value=0, max_value=PAD_BYTES + 47), st.integers(min_value=1, max_value=255))
def test_a_sealed_token_altered_in_any_byte_is_refused(pos: int, flip: int) -> None:
    sealed = bytearray(seal_wake_token(PUB, "apns", "ab" * 32))
    sealed[pos] ^= flip
    with pytest.raises(ValueError):
        open_wake_token(KEY, bytes(sealed))


@given(st.binary(min_size=0, max_size=PAD_BYTES))
def test_any_plaintext_sealed_to_the_key_opens_or_raises_value_error(plain: bytes) -> None:
    try:
        target = open_wake_token(KEY, _sealed_plain(plain))
    except ValueError:
        return
    assert isinstance(target, WakeTarget)


def test_cut_byte_by_byte_every_prefix_is_refused() -> None:
    sealed = seal_wake_token(PUB, "fcm", fcm_device_token())
    for n in range(len(sealed)):
        with pytest.raises(ValueError):
            open_wake_token(KEY, sealed[:n])
