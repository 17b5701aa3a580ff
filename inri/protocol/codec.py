"""Strict msgpack encoding of the wire messages.

A frame is a msgpack array ``[type, version, field, ...]``. Decoding checks everything: the frame
size, the array shape, the type and version, every field's type, byte length and integer range. A
malformed frame raises `DecodeError` and nothing else (arbitrary bytes included: property-tested);
encoding an out-of-range value raises `EncodeError` (msgpack itself overflows past 64 bits).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgpack

from inri.protocol import limits as L
from inri.protocol.keys import registration_signed_bytes, sign
from inri.protocol.messages import (
    Announcement,
    ContentEncoding,
    ErrorCode,
    ErrorFrame,
    Hello,
    Keepalive,
    Message,
    MessageType,
    PeerExchange,
    PeerInfo,
    Push,
    Receipt,
    ReceiptBatch,
    ReceiptStatus,
    RegAnnounce,
    RegGossip,
    RegGraft,
    Registration,
    RouteError,
    RouteErrorReason,
    RouteSync,
    StemRepair,
    SyncedRoute,
    Urgency,
    WebPushMeta,
)

__all__ = [
    "DecodeError",
    "EncodeError",
    "decode",
    "decode_registration",
    "encode",
    "encode_registration",
    "make_registration",
]


class DecodeError(ValueError):
    """A frame that is not a valid INRI message. `code` is stable: malformed, too_large, unsupported_version."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class EncodeError(ValueError):
    """A message whose fields are out of the protocol's ranges (a local bug, not a peer's)."""


# --------------------------------------------------------------------------------------------
# field checks (shared by encode and decode: one definition of what is valid)


def _bytes(value: object, size: int, name: str) -> bytes:
    if type(value) is not bytes or len(value) != size:
        raise DecodeError("malformed", f"{name}: expected {size} bytes")
    return value


def _uint(value: object, maximum: int, name: str) -> int:
    if type(value) is not int or value < 0 or value > maximum:
        raise DecodeError("malformed", f"{name}: expected an integer in 0..{maximum}")
    return value


def _str(value: object, maximum: int, name: str) -> str:
    if type(value) is not str or len(value) > maximum:
        raise DecodeError("malformed", f"{name}: expected a string of at most {maximum} characters")
    return value


def _fields(raw: list[Any], count: int, name: str) -> list[Any]:
    if len(raw) != count:
        raise DecodeError("malformed", f"{name}: expected {count} fields, got {len(raw)}")
    return raw


def _reg_to_list(reg: Registration) -> list[Any]:
    return [reg.route_key, reg.epoch, reg.issued_at, reg.lifetime, reg.signature, reg.receipt_key]


def _optional_bytes(value: object, size: int, name: str) -> bytes | None:
    return None if value is None else _bytes(value, size, name)


# Registrations decoded lately, by their exact fields: every push frame carries its registration, so
# a relay forwarding many pushes of one device decodes the same one over and over (issue 16: decode
# once). A hit returns the object decoded before (equal, immutable): no re-validation, no route id
# hash, and the verifier's identity fast path (verify.py) answers its signature check. Only valid
# registrations are entered; a lookup is made only when the integer fields are ints (1 == True ==
# 1.0 in a Python dict key: a bool or a float must still be refused). Bounded: cleared when full.
_REG_CACHE: dict[tuple[Any, ...], Registration] = {}
REG_CACHE_MAX = 4096


def _reg_from_list(raw: object) -> Registration:
    if type(raw) is not list:
        raise DecodeError("malformed", "registration: expected an array")
    if len(raw) == 6 and type(raw[1]) is int and type(raw[2]) is int and type(raw[3]) is int:
        key = tuple(raw)
        try:
            hit = _REG_CACHE.get(key)
        except TypeError:  # an unhashable field (a list where bytes belong): malformed, refused below
            hit = None
            key = ()
        if hit is not None:
            return hit
        reg = _reg_checked(raw)
        if key:
            if len(_REG_CACHE) >= REG_CACHE_MAX:
                _REG_CACHE.clear()
            _REG_CACHE[key] = reg
        return reg
    return _reg_checked(raw)


def _reg_checked(raw: list[Any]) -> Registration:
    f = _fields(raw, 6, "registration")
    return Registration(
        route_key=_bytes(f[0], L.KEY_BYTES, "route_key"),
        epoch=_uint(f[1], L.MAX_EPOCH, "epoch"),
        issued_at=_uint(f[2], L.MAX_TIMESTAMP, "issued_at"),
        lifetime=_uint(f[3], L.MAX_LIFETIME_S, "lifetime"),
        signature=_bytes(f[4], L.SIGNATURE_BYTES, "signature"),
        receipt_key=_optional_bytes(f[5], L.KEY_BYTES, "receipt_key"),
    )


# --------------------------------------------------------------------------------------------
# per-message field lists: (to_fields, from_fields) tables, dispatched by type


def _hello_from(f: list[Any]) -> Hello:
    _fields(f, 4, "hello")
    feats = f[3]
    if type(feats) is not list or len(feats) > 16:
        raise DecodeError("malformed", "features: expected at most 16 strings")
    return Hello(
        version=_uint(f[0], 2**16, "version"),
        node_id=_str(f[1], L.MAX_NODE_ID_CHARS, "node_id"),
        listen_addr=_str(f[2], L.MAX_ADDR_CHARS, "listen_addr"),
        features=tuple(_str(x, 64, "feature") for x in feats),
    )


def _gossip_from(f: list[Any]) -> RegGossip:
    # 3 fields (flood), 4 with the stem flag (then only ever `true`: a flood frame omits it), 5 for tree
    # gossip with a lag (rule G9): [registration, ttl, hops, nil, lag_ms >= 1], or 6 for a
    # route generation >= 1 (rule G10): [registration, ttl, hops, stem (bool), generation, signature].
    # Each message has one encoding: generation 0 is never written out.
    if len(f) == 6:
        if type(f[3]) is not bool:
            raise DecodeError("malformed", "reg_gossip: field 4 (stem) must be a boolean")
        generation = _uint(f[4], L.MAX_EPOCH, "generation")
        if generation == 0:
            raise DecodeError("malformed", "reg_gossip: generation 0 is written as a 3- or 4-field frame")
        return RegGossip(
            registration=_reg_from_list(f[0]),
            ttl=_uint(f[1], L.MAX_TTL, "ttl"),
            hops=_uint(f[2], 255, "hops"),
            stem=f[3],
            generation=generation,
            generation_sig=_bytes(f[5], L.SIGNATURE_BYTES, "generation_sig"),
        )
    if len(f) == 5:  # tree gossip with a lag (G9): [registration, ttl, hops, nil, lag_ms]
        if f[3] is not None:  # nil: neither a stem flag nor a truncated 6-field frame
            raise DecodeError("malformed", "reg_gossip: field 4 must be nil in a 5-field frame")
        lag = _uint(f[4], L.MAX_ANNOUNCE_LAG_MS, "lag_ms")
        if lag == 0:
            raise DecodeError("malformed", "reg_gossip: lag_ms 0 is written as a 3-field frame")
        return RegGossip(registration=_reg_from_list(f[0]), ttl=_uint(f[1], L.MAX_TTL, "ttl"),
                         hops=_uint(f[2], 255, "hops"), lag_ms=lag)
    if len(f) == 4 and f[3] is not True:
        raise DecodeError("malformed", "reg_gossip: field 4 (stem) must be true when present")
    if len(f) != 4:
        _fields(f, 3, "reg_gossip")
    return RegGossip(
        registration=_reg_from_list(f[0]),
        ttl=_uint(f[1], L.MAX_TTL, "ttl"),
        hops=_uint(f[2], 255, "hops"),
        stem=len(f) == 4,
    )


def _stem_repair_from(f: list[Any]) -> StemRepair:
    _fields(f, 3, "stem_repair")
    return StemRepair(_bytes(f[0], L.ROUTE_ID_BYTES, "route_id"), _uint(f[1], L.MAX_EPOCH, "epoch"),
                      _uint(f[2], L.MAX_EPOCH, "generation"))


def _webpush_from(f: object) -> WebPushMeta:
    # 6 fields from relays that carry no age (the push then counts as fresh), 7 with its age.
    if type(f) is not list or len(f) not in (6, 7):
        raise DecodeError("malformed", "webpush: expected 6 or 7 fields")
    topic = f[5]
    if topic is not None:
        topic = _str(topic, L.MAX_TOPIC_CHARS, "webpush.topic")
    return WebPushMeta(
        endpoint_id=_bytes(f[0], L.ENDPOINT_ID_BYTES, "webpush.endpoint_id"),
        tag=_bytes(f[1], L.WEBPUSH_TAG_BYTES, "webpush.tag"),
        ttl_s=_uint(f[2], L.MAX_WEBPUSH_TTL_S, "webpush.ttl_s"),
        urgency=_enum(Urgency, f[3], "webpush.urgency"),
        encoding=_enum(ContentEncoding, f[4], "webpush.encoding"),
        topic=topic,
        age_s=_uint(f[6], L.MAX_WEBPUSH_TTL_S, "webpush.age_s") if len(f) == 7 else 0,
    )


def _push_from(f: list[Any]) -> Push:
    # A native push has 9 fields; a Web Push push a 10th (its WebPushMeta), so native frames keep
    # their exact bytes.
    if len(f) != 10:
        _fields(f, 9, "push")
    ct = f[3]
    if type(ct) is not bytes or len(ct) > L.MAX_CIPHERTEXT_BYTES:
        raise DecodeError("malformed", f"ciphertext: expected at most {L.MAX_CIPHERTEXT_BYTES} bytes")
    return Push(
        push_id=_bytes(f[0], L.PUSH_ID_BYTES, "push_id"),
        route_id=_bytes(f[1], L.ROUTE_ID_BYTES, "route_id"),
        token=_bytes(f[2], L.TOKEN_BYTES, "token"),
        ciphertext=ct,
        ttl=_uint(f[4], L.MAX_TTL, "ttl"),
        hops=_uint(f[5], 255, "hops"),
        attempt=_uint(f[6], 255, "attempt"),
        ring=_uint(f[7], L.MAX_TTL, "ring"),
        registration=None if f[8] is None else _reg_from_list(f[8]),
        webpush=_webpush_from(f[9]) if len(f) == 10 else None,
    )


def _enum(kind: type[Any], value: object, name: str) -> Any:
    if type(value) is not int:
        raise DecodeError("malformed", f"{name}: expected an integer")
    try:
        return kind(value)
    except ValueError:
        raise DecodeError("malformed", f"{name}: unknown value {value}") from None


def _receipt_from(f: list[Any]) -> Receipt:
    _fields(f, 4, "receipt")
    return Receipt(
        push_id=_bytes(f[0], L.PUSH_ID_BYTES, "push_id"),
        status=_enum(ReceiptStatus, f[1], "status"),
        hops=_uint(f[2], 255, "hops"),
        signature=_optional_bytes(f[3], L.SIGNATURE_BYTES, "signature"),
    )


def _receipt_batch_from(f: list[Any]) -> ReceiptBatch:
    _fields(f, 3, "receipt_batch")
    raw = f[1]
    if type(raw) is not list or not 2 <= len(raw) <= L.MAX_RECEIPTS_PER_BATCH:
        raise DecodeError("malformed", f"items: expected 2 to {L.MAX_RECEIPTS_PER_BATCH} receipts")
    items = []
    for it in raw:
        if type(it) is not list or len(it) != 3:
            raise DecodeError("malformed", "receipt item: expected [push_id, status, hops]")
        items.append((_bytes(it[0], L.PUSH_ID_BYTES, "push_id"), _enum(ReceiptStatus, it[1], "status"),
                      _uint(it[2], 255, "hops")))
    if len({it[0] for it in items}) != len(items):
        raise DecodeError("malformed", "items: a push id appears twice")
    return ReceiptBatch(
        route_id=_bytes(f[0], L.ROUTE_ID_BYTES, "route_id"),
        items=tuple(items),
        signature=_bytes(f[2], L.SIGNATURE_BYTES, "signature"),
    )


def _route_error_from(f: list[Any]) -> RouteError:
    _fields(f, 3, "route_error")
    return RouteError(
        push_id=_bytes(f[0], L.PUSH_ID_BYTES, "push_id"),
        route_id=_bytes(f[1], L.ROUTE_ID_BYTES, "route_id"),
        reason=_enum(RouteErrorReason, f[2], "reason"),
    )


def _keepalive_from(f: list[Any]) -> Keepalive:
    _fields(f, 2, "keepalive")
    if type(f[1]) is not bool:
        raise DecodeError("malformed", "reply: expected a boolean")
    return Keepalive(nonce=_uint(f[0], L.MAX_NONCE, "nonce"), reply=f[1])


def _peer_exchange_from(f: list[Any]) -> PeerExchange:
    _fields(f, 1, "peer_exchange")
    out = []
    for p in _bounded_list(f[0], L.MAX_PEERS_IN_EXCHANGE, "peers"):
        if type(p) is not list or len(p) != 2:
            raise DecodeError("malformed", "peer: expected [node_id, addr]")
        out.append(PeerInfo(_str(p[0], L.MAX_NODE_ID_CHARS, "node_id"), _str(p[1], L.MAX_ADDR_CHARS, "addr")))
    return PeerExchange(peers=tuple(out))


def _error_from(f: list[Any]) -> ErrorFrame:
    _fields(f, 2, "error")
    return ErrorFrame(
        code=_enum(ErrorCode, f[0], "code"), detail=_str(f[1], L.MAX_ERROR_DETAIL_CHARS, "detail")
    )


def _bounded_list(raw: object, limit: int, name: str) -> list[Any]:
    if type(raw) is not list or len(raw) > limit:
        raise DecodeError("malformed", f"{name}: expected at most {limit} entries")
    return raw


def _route_ids(raw: object, name: str) -> tuple[bytes, ...]:
    if type(raw) is not list or len(raw) > L.MAX_ANNOUNCEMENTS:
        raise DecodeError("malformed", f"{name}: expected at most {L.MAX_ANNOUNCEMENTS} route ids")
    return tuple(_bytes(r, L.ROUTE_ID_BYTES, name) for r in raw)


def _announce_from(f: list[Any]) -> RegAnnounce:
    # [entries] or [entries, prunes] or [entries, prunes, eager]: trailing empty lists are left out, so
    # each message has one encoding (a present last list is never empty), and there is always something.
    if not 1 <= len(f) <= 3:
        raise DecodeError("malformed", f"reg_announce: expected 1 to 3 fields, got {len(f)}")
    if len(f) > 1 and f[-1] == []:
        raise DecodeError("malformed", "reg_announce: a trailing empty list must be left out")
    entries = []
    for e in _bounded_list(f[0], L.MAX_ANNOUNCEMENTS, "announcements"):
        if type(e) is not list or len(e) not in (3, 4):
            raise DecodeError("malformed", "announcement: expected [route_id, epoch, hops] or [..., lag_ms]")
        lag = _uint(e[3], L.MAX_ANNOUNCE_LAG_MS, "lag_ms") if len(e) == 4 else 0
        if len(e) == 4 and lag == 0:
            raise DecodeError("malformed", "announcement: lag_ms 0 is written as a 3-field entry")
        entries.append(Announcement(_bytes(e[0], L.ROUTE_ID_BYTES, "route_id"), _uint(e[1], L.MAX_EPOCH, "epoch"),
                                    _uint(e[2], 255, "hops"), lag))
    if not entries and len(f) == 1:
        raise DecodeError("malformed", "reg_announce: empty")
    return RegAnnounce(tuple(entries), _route_ids(f[1], "prunes") if len(f) > 1 else (),
                       _route_ids(f[2], "eager") if len(f) > 2 else ())


def _route_sync_from(f: list[Any]) -> RouteSync:
    _fields(f, 1, "route_sync")
    raw = _bounded_list(f[0], L.MAX_SYNCED_ROUTES, "synced routes")
    if not raw:
        raise DecodeError("malformed", "route_sync: empty")
    entries = []
    for e in raw:
        if type(e) is not list or len(e) != 3:
            raise DecodeError("malformed", "synced route: expected [route_id, hops, ttl_s]")
        entries.append(SyncedRoute(_bytes(e[0], L.ROUTE_ID_BYTES, "route_id"), _uint(e[1], L.MAX_TTL, "hops"),
                                   _uint(e[2], L.MAX_LIFETIME_S, "ttl_s")))
    return RouteSync(tuple(entries))


def _graft_from(f: list[Any]) -> RegGraft:
    _fields(f, 2, "reg_graft")
    return RegGraft(_bytes(f[0], L.ROUTE_ID_BYTES, "route_id"), _uint(f[1], L.MAX_EPOCH, "epoch"))


_DECODERS: dict[int, Callable[[list[Any]], Message]] = {
    MessageType.HELLO: _hello_from,
    MessageType.REG_GOSSIP: _gossip_from,
    MessageType.PUSH: _push_from,
    MessageType.RECEIPT: _receipt_from,
    MessageType.RECEIPT_BATCH: _receipt_batch_from,
    MessageType.ROUTE_ERROR: _route_error_from,
    MessageType.KEEPALIVE: _keepalive_from,
    MessageType.PEER_EXCHANGE: _peer_exchange_from,
    MessageType.ERROR: _error_from,
    MessageType.REG_ANNOUNCE: _announce_from,
    MessageType.REG_GRAFT: _graft_from,
    MessageType.STEM_REPAIR: _stem_repair_from,
    MessageType.ROUTE_SYNC: _route_sync_from,
}


def _webpush_to_list(w: WebPushMeta) -> list[Any]:
    return [w.endpoint_id, w.tag, w.ttl_s, int(w.urgency), int(w.encoding), w.topic, w.age_s]


def _to_fields(msg: Message) -> tuple[MessageType, list[Any]]:
    if type(msg) is Push:  # the hot one first (as the isinstance branch below)
        reg = None if msg.registration is None else _reg_to_list(msg.registration)
        fields = [msg.push_id, msg.route_id, msg.token, msg.ciphertext, msg.ttl, msg.hops, msg.attempt, msg.ring, reg]
        if msg.webpush is not None:
            fields.append(_webpush_to_list(msg.webpush))
        return MessageType.PUSH, fields
    if isinstance(msg, RegGossip):
        fields = [_reg_to_list(msg.registration), msg.ttl, msg.hops]
        if msg.generation or msg.generation_sig is not None:  # G10 (the decoder refuses generation 0)
            return MessageType.REG_GOSSIP, fields + [msg.stem, msg.generation, msg.generation_sig]
        if msg.lag_ms:
            if msg.stem:
                raise EncodeError("RegGossip: a stem frame carries no lag")
            return MessageType.REG_GOSSIP, fields + [None, msg.lag_ms]
        return MessageType.REG_GOSSIP, fields + [True] if msg.stem else fields
    if isinstance(msg, Push):
        reg = None if msg.registration is None else _reg_to_list(msg.registration)
        return MessageType.PUSH, [
            msg.push_id, msg.route_id, msg.token, msg.ciphertext,
            msg.ttl, msg.hops, msg.attempt, msg.ring, reg,
        ] + ([] if msg.webpush is None else [_webpush_to_list(msg.webpush)])
    if isinstance(msg, Receipt):
        return MessageType.RECEIPT, [msg.push_id, int(msg.status), msg.hops, msg.signature]
    if isinstance(msg, ReceiptBatch):
        return MessageType.RECEIPT_BATCH, [msg.route_id, [[p, int(s), h] for p, s, h in msg.items], msg.signature]
    if isinstance(msg, RouteError):
        return MessageType.ROUTE_ERROR, [msg.push_id, msg.route_id, int(msg.reason)]
    if isinstance(msg, Keepalive):
        return MessageType.KEEPALIVE, [msg.nonce, msg.reply]
    if isinstance(msg, PeerExchange):
        return MessageType.PEER_EXCHANGE, [[[p.node_id, p.addr] for p in msg.peers]]
    if isinstance(msg, Hello):
        return MessageType.HELLO, [msg.version, msg.node_id, msg.listen_addr, list(msg.features)]
    if isinstance(msg, ErrorFrame):
        return MessageType.ERROR, [int(msg.code), msg.detail]
    if isinstance(msg, RegAnnounce):
        fields = [[[a.route_id, a.epoch, a.hops, a.lag_ms] if a.lag_ms else [a.route_id, a.epoch, a.hops]
                   for a in msg.entries], list(msg.prunes), list(msg.eager)]
        while len(fields) > 1 and not fields[-1]:
            fields.pop()
        return MessageType.REG_ANNOUNCE, fields
    if isinstance(msg, RegGraft):
        return MessageType.REG_GRAFT, [msg.route_id, msg.epoch]
    if isinstance(msg, StemRepair):
        return MessageType.STEM_REPAIR, [msg.route_id, msg.epoch, msg.generation]
    if isinstance(msg, RouteSync):
        if not msg.entries:
            raise EncodeError("RouteSync: no entries")
        return MessageType.ROUTE_SYNC, [[[e.route_id, e.hops, e.ttl_s] for e in msg.entries]]
    raise EncodeError(f"not a wire message: {type(msg).__name__}")


# One packer for every frame (msgpack.packb makes a new one per call). Packer.pack runs in C without
# releasing the GIL or calling back into Python (no `default` hook), and empties its buffer after
# each call, also when packing fails (OverflowError ...): safe to share.
_pack = msgpack.Packer(use_bin_type=True).pack


def encode(msg: Message) -> bytes:
    """Encode a message as one frame. Raises EncodeError if any field is out of range."""
    mtype, fields = _to_fields(msg)
    try:
        frame: bytes = _pack([int(mtype), L.PROTOCOL_VERSION, *fields])
    except (OverflowError, TypeError, ValueError) as exc:  # msgpack overflows past 64 bits
        raise EncodeError(f"{type(msg).__name__}: {exc}") from None
    try:
        # The decoder is the single definition of validity: what it refuses we never send.
        _decode_checked(frame)
    except DecodeError as exc:
        raise EncodeError(str(exc)) from None
    return frame


def encode_unchecked(msg: Message) -> bytes:
    """Encode without re-validating (hot paths that only re-send decoded or engine-built frames)."""
    mtype, fields = _to_fields(msg)
    frame: bytes = _pack([int(mtype), L.PROTOCOL_VERSION, *fields])
    return frame


def decode(data: bytes) -> Message:
    """Decode one frame; raises DecodeError (and only DecodeError) on anything malformed."""
    return _decode_checked(data)


def _decode_checked(data: bytes) -> Message:
    if type(data) is not bytes:
        raise DecodeError("malformed", "frame must be bytes")
    if len(data) > L.MAX_FRAME_BYTES:
        raise DecodeError("too_large", f"frame of {len(data)} bytes exceeds {L.MAX_FRAME_BYTES}")
    try:
        raw = msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            max_bin_len=L.MAX_FRAME_BYTES,
            max_str_len=L.MAX_FRAME_BYTES,
            max_array_len=1024,
            max_map_len=0,
            max_ext_len=0,
        )
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types (ValueError, ExtraData, FormatError, ...)
        raise DecodeError("malformed", f"not msgpack: {type(exc).__name__}") from None
    if type(raw) is not list or len(raw) < 2:
        raise DecodeError("malformed", "frame must be an array [type, version, ...]")
    mtype, version = raw[0], raw[1]
    if type(mtype) is not int or mtype not in _DECODERS:
        raise DecodeError("malformed", f"unknown message type {mtype!r}")
    if type(version) is not int or version != L.PROTOCOL_VERSION:  # 2.0 == 2: one encoding per message
        raise DecodeError("unsupported_version", f"version {version!r}, this relay speaks {L.PROTOCOL_VERSION}")
    try:
        return _DECODERS[mtype](raw[2:])
    except DecodeError:
        raise
    except Exception as exc:  # noqa: BLE001 - defence in depth: never leak another exception type to a caller
        raise DecodeError("malformed", f"{type(exc).__name__}") from None


_REG_BYTES: dict[Registration, bytes] = {}


def push_registration_bytes(reg: Registration) -> bytes:
    """The msgpack bytes a push frame ends with for reg (the link layer refers to them: node/regref.py).

    Cached by registration (REG_CACHE_MAX of them): a relay forwards many pushes per registration."""
    got = _REG_BYTES.get(reg)
    if got is None:
        if len(_REG_BYTES) >= REG_CACHE_MAX:
            _REG_BYTES.clear()
        got = _REG_BYTES[reg] = _pack(_reg_to_list(reg))
    return got


def encode_registration(reg: Registration) -> bytes:
    """A registration alone (push credentials carry it over HTTP, base64-encoded)."""
    data: bytes = msgpack.packb([L.PROTOCOL_VERSION, *_reg_to_list(reg)], use_bin_type=True)
    return data


def decode_registration(data: bytes) -> Registration:
    """Inverse of encode_registration; raises DecodeError."""
    if type(data) is not bytes or len(data) > 1024:
        raise DecodeError("malformed", "registration must be at most 1024 bytes")
    try:
        raw = msgpack.unpackb(data, raw=False, max_map_len=0, max_ext_len=0, max_array_len=16)
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types
        raise DecodeError("malformed", f"not msgpack: {type(exc).__name__}") from None
    if type(raw) is list and raw and type(raw[0]) is int and raw[0] != L.PROTOCOL_VERSION:
        # First, as for frames: a version 1 registration has 6 elements, and its client should hear why.
        raise DecodeError("unsupported_version", f"version {raw[0]!r}, this relay speaks {L.PROTOCOL_VERSION}")
    if type(raw) is not list or len(raw) != 7 or type(raw[0]) is not int or raw[0] != L.PROTOCOL_VERSION:
        raise DecodeError("malformed",
                          "registration must be [version, key, epoch, issued_at, lifetime, sig, receipt_key]")
    return _reg_from_list(raw[1:])


def make_registration(
    key: Any, epoch: int, issued_at: int, lifetime: int, receipt_key: bytes | None = None
) -> Registration:
    """Sign a registration with a route key (nacl SigningKey).

    receipt_key: the public half of the device's receipt key pair (keys.receipt_public_key), whose
    private half the device hands to its home relay: the home's receipts are then verifiable.
    """
    route_key = bytes(key.verify_key)
    sig = sign(key, registration_signed_bytes(route_key, epoch, issued_at, lifetime, receipt_key))
    return Registration(route_key, epoch, issued_at, lifetime, sig, receipt_key)
