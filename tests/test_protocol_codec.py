"""The wire codec: round trips, nothing but DecodeError out of any bytes, and nothing out of spec decoded.

The spec (docs/protocol.md, inri/protocol/limits.py) is restated here, independently of the codec, as
`SPEC`: every property that feeds the decoder something also checks that whatever it accepted has
exactly its type's field count and every field in range, so removing a check from the codec fails
these tests rather than passing them silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from enum import IntEnum

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
    encode_unchecked,
    make_registration,
)
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import (
    ContentEncoding,
    ErrorCode,
    ErrorFrame,
    Hello,
    Keepalive,
    MessageType,
    PeerExchange,
    PeerInfo,
    Push,
    Receipt,
    ReceiptStatus,
    RegGossip,
    Registration,
    RouteError,
    RouteErrorReason,
    RouteSync,
    RouteWithdraw,
    StemRepair,
    SyncedRoute,
    Urgency,
    WebPushMeta,
    WithdrawKind,
    WithdrawnRoute,
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
    receipt_key=st.none() | blob(L.KEY_BYTES),
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
    st.builds(Receipt, push_id=blob(16), status=st.sampled_from(ReceiptStatus), hops=st.integers(0, 255),
              signature=st.none() | blob(L.SIGNATURE_BYTES)),
    st.builds(RouteError, push_id=blob(16), route_id=blob(16), reason=st.sampled_from(RouteErrorReason)),
    st.builds(Keepalive, nonce=st.integers(0, L.MAX_NONCE), reply=st.booleans()),
    st.builds(PeerExchange, peers=st.lists(st.builds(PeerInfo, short_text, short_text),
                                           max_size=L.MAX_PEERS_IN_EXCHANGE).map(tuple)),
    st.builds(ErrorFrame, code=st.sampled_from(ErrorCode), detail=short_text),
    # Rule G10: a route generation (a flood or stem frame of a re-stem) and a stem repair request.
    st.builds(RegGossip, registration=registrations, ttl=st.integers(0, L.MAX_TTL), hops=st.integers(0, 255),
              stem=st.booleans(), generation=st.integers(1, L.MAX_EPOCH), generation_sig=blob(L.SIGNATURE_BYTES)),
    st.builds(StemRepair, route_id=blob(L.ROUTE_ID_BYTES), epoch=st.integers(0, L.MAX_EPOCH),
              generation=st.integers(0, L.MAX_EPOCH)),
    # Rule G9: tree gossip with a lag (when flooding's copy would have come)
    st.builds(RegGossip, registration=registrations, ttl=st.integers(0, L.MAX_TTL), hops=st.integers(0, 255),
              lag_ms=st.integers(1, L.MAX_ANNOUNCE_LAG_MS)),
    # Rule G11: routes a neighbour holds, for a relay that asked at link-up
    st.builds(RouteSync, entries=st.lists(st.builds(SyncedRoute, route_id=blob(L.ROUTE_ID_BYTES),
                                                    hops=st.integers(0, L.MAX_TTL),
                                                    ttl_s=st.integers(0, L.MAX_LIFETIME_S)),
                                          min_size=1, max_size=8).map(tuple)),
    # Rule G12: route withdrawals (hops 0) and restores
    st.builds(RouteWithdraw, entries=st.lists(
        st.builds(WithdrawnRoute, route_id=blob(L.ROUTE_ID_BYTES), epoch=st.integers(0, L.MAX_EPOCH),
                  kind=st.sampled_from(WithdrawKind), hops=st.integers(0, L.MAX_TTL),
                  generation=st.integers(0, L.MAX_EPOCH)).map(
            lambda w: w if w.kind in (WithdrawKind.RESTORED, WithdrawKind.REQUEST) else replace(w, hops=0)),
        min_size=1, max_size=8).map(tuple)),
)


# -- the spec, restated as the tests' oracle ---------------------------------------------------

Check = Callable[[object], bool]


def uint(maximum: int) -> Check:
    return lambda v: type(v) is int and 0 <= v <= maximum


def exact_bytes(n: int) -> Check:
    return lambda v: type(v) is bytes and len(v) == n


def text(maximum: int) -> Check:
    return lambda v: type(v) is str and len(v) <= maximum


def enum(kind: type[IntEnum]) -> Check:
    return lambda v: type(v) is int and v in {int(x) for x in kind}


def fields(spec: list[Check]) -> Check:
    """An array of exactly len(spec) elements, each passing its check."""
    return lambda v: type(v) is list and len(v) == len(spec) and all(c(x) for c, x in zip(spec, v, strict=True))


def optional(check: Check) -> Check:
    return lambda v: v is None or check(v)


REGISTRATION = [exact_bytes(L.KEY_BYTES), uint(L.MAX_EPOCH), uint(L.MAX_TIMESTAMP), uint(L.MAX_LIFETIME_S),
                exact_bytes(L.SIGNATURE_BYTES), optional(exact_bytes(L.KEY_BYTES))]
REG_INTS = {1: L.MAX_EPOCH, 2: L.MAX_TIMESTAMP, 3: L.MAX_LIFETIME_S}  # registration position -> maximum
SPEC: dict[int, list[Check]] = {
    MessageType.HELLO: [uint(2**16), text(L.MAX_NODE_ID_CHARS), text(L.MAX_ADDR_CHARS),
                        lambda v: type(v) is list and len(v) <= 16 and all(text(64)(x) for x in v)],
    MessageType.REG_GOSSIP: [fields(REGISTRATION), uint(L.MAX_TTL), uint(255)],
    MessageType.PUSH: [exact_bytes(L.PUSH_ID_BYTES), exact_bytes(L.ROUTE_ID_BYTES), exact_bytes(L.TOKEN_BYTES),
                       lambda v: type(v) is bytes and len(v) <= L.MAX_CIPHERTEXT_BYTES, uint(L.MAX_TTL), uint(255),
                       uint(255), uint(L.MAX_TTL), lambda v: v is None or fields(REGISTRATION)(v)],
    MessageType.RECEIPT: [exact_bytes(L.PUSH_ID_BYTES), enum(ReceiptStatus), uint(255),
                          optional(exact_bytes(L.SIGNATURE_BYTES))],
    MessageType.ROUTE_ERROR: [exact_bytes(L.PUSH_ID_BYTES), exact_bytes(L.ROUTE_ID_BYTES), enum(RouteErrorReason)],
    MessageType.KEEPALIVE: [uint(L.MAX_NONCE), lambda v: type(v) is bool],
    MessageType.PEER_EXCHANGE: [lambda v: type(v) is list and len(v) <= L.MAX_PEERS_IN_EXCHANGE and all(
        fields([text(L.MAX_NODE_ID_CHARS), text(L.MAX_ADDR_CHARS)])(p) for p in v)],
    MessageType.ERROR: [enum(ErrorCode), text(L.MAX_ERROR_DETAIL_CHARS)],
    MessageType.STEM_REPAIR: [exact_bytes(L.ROUTE_ID_BYTES), uint(L.MAX_EPOCH), uint(L.MAX_EPOCH)],
    MessageType.ROUTE_SYNC: [lambda v: type(v) is list and 1 <= len(v) <= L.MAX_SYNCED_ROUTES and all(
        fields([exact_bytes(L.ROUTE_ID_BYTES), uint(L.MAX_TTL), uint(L.MAX_LIFETIME_S)])(e) for e in v)],
    MessageType.ROUTE_WITHDRAW: [lambda v: type(v) is list and 1 <= len(v) <= L.MAX_WITHDRAWN_ROUTES and all(
        fields([exact_bytes(L.ROUTE_ID_BYTES), uint(L.MAX_EPOCH), enum(WithdrawKind), uint(L.MAX_TTL),
                uint(L.MAX_EPOCH)])(e)
        and (e[2] in (WithdrawKind.RESTORED, WithdrawKind.REQUEST) or e[3] == 0) for e in v)],
}
# RegGossip's other shapes: a stem frame (a 4th field, always true) and a route generation (G10:
# stem flag, generation >= 1, the home's 64-byte signature).
GOSSIP_STEM = [*SPEC[MessageType.REG_GOSSIP], lambda v: v is True]
GOSSIP_GENERATION = [*SPEC[MessageType.REG_GOSSIP], lambda v: type(v) is bool,
                     lambda v: uint(L.MAX_EPOCH)(v) and v >= 1, exact_bytes(L.SIGNATURE_BYTES)]
GOSSIP_LAG = [*SPEC[MessageType.REG_GOSSIP], lambda v: v is None,
              lambda v: uint(L.MAX_ANNOUNCE_LAG_MS)(v) and v >= 1]
# frame position (after type and version) -> maximum, for every integer field with a range
INT_FIELDS: dict[int, dict[int, int]] = {
    MessageType.HELLO: {0: 2**16}, MessageType.REG_GOSSIP: {1: L.MAX_TTL, 2: 255},
    MessageType.PUSH: {4: L.MAX_TTL, 5: 255, 6: 255, 7: L.MAX_TTL}, MessageType.RECEIPT: {2: 255},
    MessageType.KEEPALIVE: {0: L.MAX_NONCE}, MessageType.STEM_REPAIR: {1: L.MAX_EPOCH, 2: L.MAX_EPOCH},
}


def within_spec(frame: bytes) -> bool:
    """The frame's array has exactly its type's fields, each of the right type and in range."""
    raw = msgpack.unpackb(frame, raw=False)
    if not (type(raw) is list and len(raw) >= 2 and raw[0] in SPEC and raw[1] == L.PROTOCOL_VERSION):
        return False
    shapes = [SPEC[raw[0]]] + ([GOSSIP_STEM, GOSSIP_GENERATION, GOSSIP_LAG]
                               if raw[0] == MessageType.REG_GOSSIP else [])
    return any(fields(shape)(raw[2:]) for shape in shapes)


def decodes_only_within_spec(frame: bytes) -> None:
    """decode(frame) raises DecodeError, or the frame is within the spec and round-trips."""
    try:
        msg = decode(frame)
    except DecodeError as exc:
        assert exc.code in {"malformed", "too_large", "unsupported_version"}
        return
    assert within_spec(frame), f"decoded a frame out of spec: {msgpack.unpackb(frame, raw=False)!r:.300}"
    assert decode(encode(msg)) == msg


def out_of_range(maximum: int) -> st.SearchStrategy[int]:
    return st.one_of(st.integers(maximum + 1, 2**64 - 1), st.integers(-(2**63), -1), st.just(maximum + 1))


def raw_fields(msg: object) -> list[object]:
    raw = msgpack.unpackb(encode(msg), raw=False)  # type: ignore[arg-type]
    assert within_spec(encode(msg))  # type: ignore[arg-type]  # the oracle agrees with the encoder
    return list(raw)


@given(messages, st.one_of(st.none(), st.integers(0, 3), st.binary(max_size=4), st.text(max_size=4)))
def test_a_frame_with_one_field_too_many_is_refused(msg: object, extra: object) -> None:
    raw = raw_fields(msg)
    with pytest.raises(DecodeError) as err:
        decode(msgpack.packb([*raw, extra], use_bin_type=True))
    assert err.value.code == "malformed"


@given(messages)
def test_a_frame_with_one_field_too_few_is_refused(msg: object) -> None:
    raw = raw_fields(msg)
    with pytest.raises(DecodeError) as err:
        decode(msgpack.packb(raw[:-1], use_bin_type=True))
    assert err.value.code == "malformed"


@given(registrations, st.integers(1, 3), st.sampled_from([RegGossip, Push]))
def test_an_embedded_registration_with_a_field_too_many_or_too_few_is_refused(
    reg: Registration, extra: int, kind: type
) -> None:
    msg = RegGossip(reg, 3, 0) if kind is RegGossip else Push(b"p" * 16, b"r" * 16, b"t" * 16, b"", 3, 0, 0, 0, reg)
    raw = raw_fields(msg)
    pos = 2 if kind is RegGossip else 10
    inner = list(raw[pos])  # type: ignore[call-overload]
    for wrong in ([*inner, *range(extra)], inner[:-extra]):
        raw[pos] = wrong
        with pytest.raises(DecodeError):
            decode(msgpack.packb(raw, use_bin_type=True))
    with pytest.raises(DecodeError):
        decode_registration(msgpack.packb([L.PROTOCOL_VERSION, *_reg_list(reg), b""], use_bin_type=True))
    with pytest.raises(DecodeError):
        decode_registration(msgpack.packb([L.PROTOCOL_VERSION, *_reg_list(reg)[:-1]], use_bin_type=True))


def _reg_list(reg: Registration) -> list[object]:
    return [reg.route_key, reg.epoch, reg.issued_at, reg.lifetime, reg.signature, reg.receipt_key]


@given(messages, st.data())
def test_every_integer_field_out_of_its_range_is_refused(msg: object, data: st.DataObject) -> None:
    raw = raw_fields(msg)
    mtype = int(raw[0])  # type: ignore[call-overload]
    targets: list[tuple[list[object], int, int]] = [(raw, 2 + i, m) for i, m in INT_FIELDS.get(mtype, {}).items()]
    reg_pos = {MessageType.REG_GOSSIP: 2, MessageType.PUSH: 10}.get(MessageType(mtype))
    if reg_pos is not None and raw[reg_pos] is not None:
        targets += [(raw[reg_pos], i, m) for i, m in REG_INTS.items()]  # type: ignore[misc]
    if not targets:
        return
    where, i, maximum = data.draw(st.sampled_from(targets))
    where[i] = data.draw(out_of_range(maximum))
    with pytest.raises(DecodeError) as err:
        decode(msgpack.packb(raw, use_bin_type=True))
    assert err.value.code == "malformed"


@given(registrations, st.sampled_from(sorted(REG_INTS)), st.data())
def test_a_registration_field_out_of_range_is_refused_over_http_encoding_too(
    reg: Registration, i: int, data: st.DataObject
) -> None:
    raw = _reg_list(reg)
    raw[i] = data.draw(out_of_range(REG_INTS[i]))
    with pytest.raises(DecodeError):
        decode_registration(msgpack.packb([L.PROTOCOL_VERSION, *raw], use_bin_type=True))


@given(messages)
def test_every_message_round_trips(msg: object) -> None:
    assert decode(encode(msg)) == msg  # type: ignore[arg-type]


@given(st.binary(max_size=2048))
def test_arbitrary_bytes_raise_only_decode_error(data: bytes) -> None:
    decodes_only_within_spec(data)


@given(messages, st.data())
def test_mutated_frames_raise_only_decode_error(msg: object, data: st.DataObject) -> None:
    frame = bytearray(encode(msg))  # type: ignore[arg-type]
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(frame) - 1))
        frame[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(frame)))
    for candidate in (bytes(frame), bytes(frame[:cut])):
        decodes_only_within_spec(candidate)


@given(st.lists(st.one_of(st.integers(-(2**63), 2**64 - 1), st.integers(0, 300), st.binary(max_size=40),
                          st.binary(min_size=16, max_size=16), st.text(max_size=10), st.none(), st.booleans(),
                          st.floats(allow_nan=False)), max_size=12))
def test_wellformed_msgpack_of_wrong_shape_is_refused(values: list[object]) -> None:
    data = msgpack.packb(values, use_bin_type=True)
    decodes_only_within_spec(data)
    # The same values behind a real type and version: still nothing out of spec gets through.
    for mtype in MessageType:
        decodes_only_within_spec(msgpack.packb([int(mtype), L.PROTOCOL_VERSION, *values], use_bin_type=True))


def test_out_of_range_values_are_refused_both_ways() -> None:
    reg = make_registration(KEY, 1, 100, 3600)
    with pytest.raises(EncodeError):
        encode(RegGossip(reg, L.MAX_TTL + 1, 0))
    with pytest.raises(EncodeError):
        encode(Keepalive(2**64, False))  # beyond msgpack's 64 bits: a clear error, not OverflowError
    frame = msgpack.packb([2, L.PROTOCOL_VERSION, [reg.route_key, 2**40 + 5, 0, 0, reg.signature, None], 3, 0])
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
        reg = decode_registration(data)
    except DecodeError:
        return
    raw = msgpack.unpackb(data, raw=False)
    assert type(raw) is list and raw[0] == L.PROTOCOL_VERSION and fields(REGISTRATION)(raw[1:])
    assert decode_registration(encode_registration(reg)) == reg


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


@given(registrations, st.booleans(), st.integers(1, L.MAX_EPOCH), blob(L.SIGNATURE_BYTES), st.data())
def test_a_route_generation_has_one_encoding_and_its_fields_are_checked(
    reg: Registration, stem: bool, generation: int, sig: bytes, data: st.DataObject
) -> None:
    msg = RegGossip(reg, 5, 2, stem, generation, sig)
    raw = raw_fields(msg)
    assert len(raw) == 8 and raw[5:] == [stem, generation, sig]
    assert decode(encode(msg)) == msg
    # Generation 0 is a plain flood or stem frame, never a 6-field one; the flag must be a boolean; the
    # signature exactly 64 bytes; the generation within u32.
    wrong = data.draw(st.sampled_from([(6, 0), (5, 1), (5, None), (7, sig[:63]), (7, None), (7, sig + b"x"),
                                       (6, L.MAX_EPOCH + 1), (6, -1)]))
    bad = list(raw)
    bad[wrong[0]] = wrong[1]
    with pytest.raises(DecodeError) as err:
        decode(msgpack.packb(bad, use_bin_type=True))
    assert err.value.code == "malformed"
    with pytest.raises(EncodeError):
        encode(RegGossip(reg, 5, 2, stem, 0, sig))
    with pytest.raises(EncodeError):
        encode(RegGossip(reg, 5, 2, stem, generation, None))


def test_frames_without_a_generation_keep_their_old_encoding() -> None:
    reg = make_registration(new_signing_key(b"g" * 32), 1, 1000, 3600)
    assert len(msgpack.unpackb(encode(RegGossip(reg, 5, 2)), raw=False)) == 5
    assert msgpack.unpackb(encode(RegGossip(reg, 5, 0, True)), raw=False)[5] is True
    assert decode(encode(RegGossip(reg, 5, 0, True))) == RegGossip(reg, 5, 0, True, 0, None)


# -- decode once, forward without re-encoding (issue 16) ----------------------------------------------

webpush_metas = st.builds(
    WebPushMeta, endpoint_id=blob(L.ENDPOINT_ID_BYTES), tag=blob(L.WEBPUSH_TAG_BYTES),
    ttl_s=st.integers(0, L.MAX_WEBPUSH_TTL_S), urgency=st.sampled_from(Urgency),
    encoding=st.sampled_from(ContentEncoding), topic=st.none() | st.text(max_size=L.MAX_TOPIC_CHARS),
    age_s=st.integers(0, L.MAX_WEBPUSH_TTL_S))
pushes = st.builds(Push, push_id=blob(16), route_id=blob(16), token=blob(16),
                   ciphertext=st.binary(max_size=L.MAX_CIPHERTEXT_BYTES), ttl=st.integers(0, L.MAX_TTL),
                   hops=st.integers(0, 255), attempt=st.integers(0, 255), ring=st.integers(0, L.MAX_TTL),
                   registration=st.none() | registrations, webpush=st.none() | webpush_metas)


@given(pushes)
def test_a_push_encoded_without_a_check_is_exactly_what_the_checked_encoder_writes(push: Push) -> None:
    """A forwarding relay encodes pushes with encode_unchecked (no second check, issue 16): for every
    valid push that is encode()'s frame, which decodes back to the push."""
    frame = encode_unchecked(push)
    assert frame == encode(push)
    assert decode(frame) == push


@given(registrations, st.sampled_from(sorted(REG_INTS)), st.sampled_from(["bool", "float"]))
def test_a_registration_decoded_before_does_not_let_a_bool_or_a_float_through(
    reg: Registration, pos: int, kind: str
) -> None:
    """The decoder remembers registrations it decoded (a push carries one per frame): a later frame with
    the same fields but a bool or a float where an integer belongs (equal as a dict key) is refused."""
    raw = msgpack.unpackb(encode(RegGossip(reg, 3, 1)), raw=False)
    assert decode(msgpack.packb(raw, use_bin_type=True)) == RegGossip(reg, 3, 1)  # remembered now
    value = raw[2][pos]
    if kind == "bool" and value not in (0, 1):
        value = 1
        raw[2][pos] = 1
        decode(msgpack.packb(raw, use_bin_type=True))  # a valid one with 1 remembered too
    raw[2][pos] = bool(value) if kind == "bool" else float(value)
    with pytest.raises(DecodeError):
        decode(msgpack.packb(raw, use_bin_type=True))


def test_a_version_that_only_equals_the_protocol_version_is_refused() -> None:
    """2.0 (a float) == 2 in Python, but each message has one encoding: a frame or registration whose
    version is not the integer 2 is refused, not decoded into a message that re-encodes differently."""
    with pytest.raises(DecodeError) as err:
        decode(msgpack.packb([int(MessageType.KEEPALIVE), float(L.PROTOCOL_VERSION), 1, False]))
    assert err.value.code == "unsupported_version"
    reg = make_registration(KEY, 1, 100, 3600)
    with pytest.raises(DecodeError) as err:
        decode_registration(msgpack.packb([float(L.PROTOCOL_VERSION), *_reg_list(reg)], use_bin_type=True))
    assert err.value.code == "malformed"
