"""The wire codec: round trips, and nothing but DecodeError out of any bytes."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from inri.core.verify import CachingVerifier, SignatureVerifier
from inri.protocol import limits as L
from inri.protocol.codec import (
    DecodeError,
    EncodeError,
    decode,
    decode_registration,
    encode,
    encode_registration,
    make_registration,
)
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import (
    ErrorCode,
    ErrorFrame,
    Hello,
    Keepalive,
    PeerExchange,
    PeerInfo,
    Push,
    Receipt,
    ReceiptStatus,
    RegGossip,
    Registration,
    RouteError,
    RouteErrorReason,
)

KEY = new_signing_key(b"\x01" * 32)


def blob(n: int) -> st.SearchStrategy[bytes]:
    return st.binary(min_size=n, max_size=n)


registrations = st.builds(
    Registration,
    route_key=blob(L.KEY_BYTES),
    epoch=st.integers(0, L.MAX_EPOCH),
    issued_at=st.integers(0, L.MAX_TIMESTAMP),
    lifetime=st.integers(0, L.MAX_LIFETIME_S),
    signature=blob(L.SIGNATURE_BYTES),
)
short_text = st.text(max_size=40)
messages = st.one_of(
    st.builds(Hello, version=st.integers(0, 2**16), node_id=short_text, listen_addr=short_text,
              features=st.lists(short_text, max_size=5).map(tuple)),
    st.builds(RegGossip, registration=registrations, ttl=st.integers(0, L.MAX_TTL), hops=st.integers(0, 255)),
    st.builds(Push, push_id=blob(16), route_id=blob(16), token=blob(16),
              ciphertext=st.binary(max_size=L.MAX_CIPHERTEXT_BYTES), ttl=st.integers(0, L.MAX_TTL),
              hops=st.integers(0, 255), attempt=st.integers(0, 255), ring=st.integers(0, L.MAX_TTL),
              registration=st.none() | registrations),
    st.builds(Receipt, push_id=blob(16), status=st.sampled_from(ReceiptStatus), hops=st.integers(0, 255)),
    st.builds(RouteError, push_id=blob(16), route_id=blob(16), reason=st.sampled_from(RouteErrorReason)),
    st.builds(Keepalive, nonce=st.integers(0, L.MAX_NONCE), reply=st.booleans()),
    st.builds(PeerExchange, peers=st.lists(st.builds(PeerInfo, short_text, short_text),
                                           max_size=L.MAX_PEERS_IN_EXCHANGE).map(tuple)),
    st.builds(ErrorFrame, code=st.sampled_from(ErrorCode), detail=short_text),
)


@given(messages)
def test_every_message_round_trips(msg: object) -> None:
    assert decode(encode(msg)) == msg  # type: ignore[arg-type]


@given(st.binary(max_size=2048))
def test_arbitrary_bytes_raise_only_decode_error(data: bytes) -> None:
    try:
        decode(data)
    except DecodeError as exc:
        assert exc.code in {"malformed", "too_large", "unsupported_version"}


@given(messages, st.data())
def test_mutated_frames_raise_only_decode_error(msg: object, data: st.DataObject) -> None:
    frame = bytearray(encode(msg))  # type: ignore[arg-type]
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(frame) - 1))
        frame[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(frame)))
    for candidate in (bytes(frame), bytes(frame[:cut])):
        try:
            decode(candidate)
        except DecodeError:
            pass


@given(st.lists(st.one_of(st.integers(-(2**63), 2**64 - 1), st.binary(max_size=40), st.text(max_size=10),
                          st.none(), st.booleans(), st.floats(allow_nan=False)), max_size=12))
def test_wellformed_msgpack_of_wrong_shape_is_refused(fields: list[object]) -> None:
    data = msgpack.packb(fields, use_bin_type=True)
    try:
        decode(data)
    except DecodeError:
        pass


def test_out_of_range_values_are_refused_both_ways() -> None:
    reg = make_registration(KEY, 1, 100, 3600)
    with pytest.raises(EncodeError):
        encode(RegGossip(reg, L.MAX_TTL + 1, 0))
    with pytest.raises(EncodeError):
        encode(Keepalive(2**64, False))  # beyond msgpack's 64 bits: a clear error, not OverflowError
    frame = msgpack.packb([2, 1, [reg.route_key, 2**40 + 5, 0, 0, reg.signature], 3, 0])
    with pytest.raises(DecodeError) as err:
        decode(frame)
    assert err.value.code == "malformed"


def test_version_and_size_have_their_own_codes() -> None:
    with pytest.raises(DecodeError) as err:
        decode(msgpack.packb([6, 99, 1, False]))
    assert err.value.code == "unsupported_version"
    with pytest.raises(DecodeError) as err:
        decode(b"\x00" * (L.MAX_FRAME_BYTES + 1))
    assert err.value.code == "too_large"


@given(registrations)
def test_registration_codec_round_trips(reg: Registration) -> None:
    assert decode_registration(encode_registration(reg)) == reg


@given(st.binary(max_size=300))
def test_registration_decoder_raises_only_decode_error(data: bytes) -> None:
    try:
        decode_registration(data)
    except DecodeError:
        pass


def test_signatures_bind_every_signed_field() -> None:
    reg = make_registration(KEY, 3, 1000, 600)
    v = SignatureVerifier()
    assert v.verify_registration(reg)
    for forged in (
        Registration(reg.route_key, 4, reg.issued_at, reg.lifetime, reg.signature),
        Registration(reg.route_key, reg.epoch, reg.issued_at, reg.lifetime + 1, reg.signature),
        Registration(bytes(new_signing_key(b"\x02" * 32).verify_key), 3, 1000, 600, reg.signature),
    ):
        assert not v.verify_registration(forged)


def test_caching_verifier_checks_each_distinct_registration_once() -> None:
    cv = CachingVerifier(max_entries=10)
    reg = make_registration(KEY, 1, 0, 60)
    bad = Registration(reg.route_key, 2, 0, 60, reg.signature)
    assert [cv.verify_registration(r) for r in (reg, reg, bad, bad, reg)] == [True, True, False, False, True]
    assert cv.checks == 2
