"""The codec (msgspec's typed decoder) against the hand-written one it replaced: identical bytes,
identical decodes, identical refusal codes (issue 38; docs/results/2026-11-29-msgspec-codec.md).

Every frame kind is encoded by both (bytes compared), every encoded or hostile input decoded by both
(messages or DecodeError codes compared): hypothesis properties, the fuzz campaign's mutators,
byte-by-byte changes and cuts of one frame of every kind, and every field of it replaced by values of
other types and at every limit. The hand-written codec comes from git history (bench_codec.py).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.bench_codec import hand_written_codec
from fuzz.campaign import mutate_bytes, mutate_tree
from inri.protocol import codec as new
from inri.protocol import limits as L
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import (
    Announcement,
    ContentEncoding,
    ErrorCode,
    ErrorFrame,
    Hello,
    Keepalive,
    Message,
    PeerExchange,
    PeerInfo,
    Push,
    Receipt,
    ReceiptBatch,
    ReceiptStatus,
    RegAnnounce,
    RegGossip,
    RegGraft,
    RouteError,
    RouteErrorReason,
    RouteSync,
    RouteWithdraw,
    StemRepair,
    SyncedRoute,
    Urgency,
    WebPushMeta,
)
from tests.test_protocol_codec import blob, messages, pushes, registrations

_old = hand_written_codec()
if isinstance(_old, str):
    pytest.skip(_old, allow_module_level=True)
old: Any = _old[0]

ids = blob(16)
announcements = st.builds(Announcement, route_id=ids, epoch=st.integers(0, L.MAX_EPOCH), hops=st.integers(0, 255),
                          lag_ms=st.integers(0, L.MAX_ANNOUNCE_LAG_MS))
all_messages = st.one_of(
    messages.filter(lambda m: not isinstance(m, RouteWithdraw)), pushes,  # type 14 (G12) came after it
    st.builds(ReceiptBatch, route_id=ids,
              items=st.lists(st.tuples(ids, st.sampled_from(ReceiptStatus), st.integers(0, 255)), min_size=2,
                             max_size=6, unique_by=lambda it: it[0]).map(tuple),
              signature=blob(L.SIGNATURE_BYTES)),
    st.builds(RegAnnounce, entries=st.lists(announcements, max_size=5).map(tuple),
              prunes=st.lists(ids, max_size=3).map(tuple), eager=st.lists(ids, max_size=3).map(tuple)).filter(
        lambda m: bool(m.entries or m.prunes or m.eager)),
    st.builds(RegGraft, route_id=ids, epoch=st.integers(0, L.MAX_EPOCH)),
)


def outcome(decode: Callable[[bytes], Any], data: bytes) -> tuple[str, Any]:
    """What a decoder made of data: the value, or its DecodeError's code (anything else fails the test)."""
    try:
        return "ok", decode(data)
    except (old.DecodeError, new.DecodeError) as exc:
        return "refused", exc.code


def withdrawal(data: bytes) -> bool:
    """data is a frame of type 14 (RouteWithdraw, rule G12), which the hand-written codec never knew: it
    refuses every one, the new codec checks them (tests/test_protocol_codec.py, fuzz/campaign.py)."""
    try:
        raw = msgpack.unpackb(data, max_array_len=1024, max_map_len=0, max_ext_len=0)
    except Exception:  # noqa: BLE001 - msgpack raises many types
        return False
    return type(raw) is list and len(raw) > 1 and type(raw[0]) is int and raw[0] == 14


def same(data: bytes) -> None:
    if not withdrawal(data):
        assert outcome(old.decode, data) == outcome(new.decode, data), data.hex()
    assert outcome(old.decode_registration, data) == outcome(new.decode_registration, data), data.hex()


@given(all_messages)
def test_both_codecs_write_the_same_bytes_and_read_them_back_alike(msg: Message) -> None:
    frame = old.encode(msg)
    assert new.encode(msg) == frame == new.encode_unchecked(msg) == old.encode_unchecked(msg)
    assert new.decode(frame) == old.decode(frame) == msg


@given(registrations)
def test_both_codecs_write_the_same_registration_bytes(reg: Any) -> None:
    data = old.encode_registration(reg)
    assert new.encode_registration(reg) == data
    assert new.push_registration_bytes(reg) == old.push_registration_bytes(reg)
    assert new.decode_registration(data) == old.decode_registration(data) == reg
    same(data)


@given(all_messages, st.data())
def test_mutated_frames_get_the_same_answer_from_both(msg: Message, data: st.DataObject) -> None:
    frame = bytearray(old.encode(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
    same(bytes(frame))
    same(bytes(frame[: data.draw(st.integers(0, len(frame)))]))


@given(st.binary(max_size=512))
def test_arbitrary_bytes_get_the_same_answer_from_both(data: bytes) -> None:
    same(data)


@given(st.lists(st.one_of(st.integers(-(2**63), 2**64 - 1), st.integers(0, 300), st.binary(max_size=40),
                          blob(16), blob(64), st.text(max_size=10), st.none(), st.booleans(), st.floats(),
                          st.just([]), st.just({})), max_size=12),
       st.integers(0, 15), st.sampled_from([L.PROTOCOL_VERSION, 1, 3, 2.0, True, "2", None]))
def test_wellformed_msgpack_of_any_shape_gets_the_same_answer_from_both(values: list[Any], mtype: int,
                                                                        version: object) -> None:
    same(msgpack.packb(values, use_bin_type=True))
    same(msgpack.packb([mtype, version, *values], use_bin_type=True))
    same(msgpack.packb([version, *values], use_bin_type=True))


KEY = new_signing_key(b"\x07" * 32)
REG = old.make_registration(KEY, 5, 1_700_000_000, 3600, b"k" * 32)
EVERY_KIND: list[Message] = [
    Hello(2, "n" * 64, "127.0.0.1:4433", ("sync", "x" * 64)),
    RegGossip(REG, 16, 2), RegGossip(REG, 16, 0, True), RegGossip(REG, 16, 2, lag_ms=300),
    RegGossip(REG, 16, 0, True, 3, b"g" * 64),
    Push(b"p" * 16, REG.route_id, b"t" * 16, b"c" * 40, 24, 3, 1, 0, REG),
    Push(b"p" * 16, REG.route_id, b"\0" * 16, b"c" * 40, 24, 3, 1, 5, None,
         WebPushMeta(b"e" * 16, b"a" * 16, 60, Urgency.HIGH, ContentEncoding.AESGCM, "topic", 7)),
    Receipt(b"p" * 16, ReceiptStatus.STORED, 4, b"s" * 64), Receipt(b"p" * 16, ReceiptStatus.SPENT, 4),
    ReceiptBatch(REG.route_id, ((b"p" * 16, ReceiptStatus.STORED, 4), (b"q" * 16, ReceiptStatus.GONE, 5)), b"s" * 64),
    RouteError(b"p" * 16, REG.route_id, RouteErrorReason.DEAD_END),
    Keepalive(L.MAX_NONCE, True),
    PeerExchange((PeerInfo("a" * 64, "10.0.0.1:4433"), PeerInfo("b", "[::1]:1"))),
    ErrorFrame(ErrorCode.UNSUPPORTED_VERSION, "why"),
    RegAnnounce((Announcement(b"r" * 16, 1, 2), Announcement(b"s" * 16, 1, 2, 9)), (b"u" * 16,), (b"v" * 16,)),
    RegAnnounce((), (b"u" * 16,)), RegGraft(b"r" * 16, 9), StemRepair(b"r" * 16, 1, 2),
    RouteSync((SyncedRoute(b"r" * 16, 3, 60),)),
]


@pytest.mark.parametrize("msg", EVERY_KIND, ids=lambda m: type(m).__name__)
def test_every_byte_of_a_frame_changed_or_cut_gets_the_same_answer_from_both(msg: Message) -> None:
    frame = old.encode(msg)
    assert new.encode(msg) == frame
    for i in range(len(frame)):
        same(frame[:i])
        for value in {0x00, 0x01, 0x02, 0x7F, 0xC0, 0xC1, 0xC2, 0xC3, 0xCC, 0xDC, 0xFF, frame[i] ^ 1, frame[i] ^ 0x80}:
            same(frame[:i] + bytes([value]) + frame[i + 1:])
        same(frame[:i] + frame[i + 1:])


def test_the_fuzz_campaigns_mutations_get_the_same_answer_from_both() -> None:
    rng = random.Random(38)
    seeds = [old.encode(m) for m in EVERY_KIND] + [old.encode_registration(REG)]
    for _ in range(20_000):
        seed = rng.choice(seeds)
        if rng.random() < 0.5:
            try:
                case = msgpack.packb(mutate_tree(rng, msgpack.unpackb(seed, raw=False)), use_bin_type=True)
            except (OverflowError, TypeError, ValueError):
                continue
        else:
            case = mutate_bytes(rng, seed, seeds)
        same(case)


@pytest.mark.parametrize("msg", EVERY_KIND, ids=lambda m: type(m).__name__)
def test_every_field_replaced_by_a_value_of_another_type_gets_the_same_answer_from_both(msg: Message) -> None:
    raw = msgpack.unpackb(old.encode(msg), raw=False)
    others: list[Any] = [None, True, False, 0, 2, -1, 2**64 - 1, 2.0, "", "x" * 70, b"", b"\0" * 16, b"\0" * 32,
                         b"\0" * 64, [], [b"\0" * 16, 1, 1], {}, {"a": 1}]
    for path in _paths(raw):
        for value in others + _near_limits(_at(raw, path)):
            same(msgpack.packb(_replaced(raw, path, value), use_bin_type=True))


SIZES = sorted({n + d for n in (0, 16, 32, 64, L.MAX_TOPIC_CHARS, L.MAX_NODE_ID_CHARS, L.MAX_ADDR_CHARS,
                                L.MAX_ERROR_DETAIL_CHARS, L.MAX_CIPHERTEXT_BYTES, L.MAX_PEERS_IN_EXCHANGE,
                                L.MAX_ANNOUNCEMENTS, L.MAX_RECEIPTS_PER_BATCH) for d in (-1, 0, 1) if n + d >= 0})
INTS = sorted({n + d for n in (0, 255, L.MAX_TTL, 2**16, L.MAX_ANNOUNCE_LAG_MS, L.MAX_EPOCH, L.MAX_TIMESTAMP,
                               L.MAX_LIFETIME_S, L.MAX_NONCE) for d in (-1, 0, 1)} | {2**64 - 1, -(2**63)})


def _near_limits(value: Any) -> list[Any]:
    """Values of value's type at and around every limit: sizes for bytes, str and arrays, integers."""
    if type(value) is int:
        return list(INTS)
    if type(value) in (bytes, str):
        return [value[:1] * n if value else type(value)(n) if type(value) is bytes else "x" * n for n in SIZES]
    if type(value) is list and value:
        return [[value[0]] * n for n in SIZES if n <= 300]
    return []


def _at(value: Any, path: tuple[int, ...]) -> Any:
    for i in path:
        value = value[i]
    return value


def _paths(value: Any, prefix: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    out = [prefix] if prefix else []
    if isinstance(value, list):
        for i, item in enumerate(value):
            out += _paths(item, (*prefix, i))
    return out


def _replaced(value: Any, path: tuple[int, ...], new_value: Any) -> Any:
    if not path:
        return new_value
    copy = list(value)
    copy[path[0]] = _replaced(copy[path[0]], path[1:], new_value)
    return copy
