"""A relay's signed announcement to bootstrap nodes: who it is, where it listens, roughly where it is.

Wire form: msgpack [version, node_key, addrs, geo, capacity, timestamp, seq, signature], at most
`MAX_RECORD_BYTES`. The signature (Ed25519, by the node key) covers every other field behind a
domain-separation context, so a record signed for a bootstrap can never be confused with any other
INRI signature. The node id is derived from the key (keys.node_id_for), never sent.

Geo hints are coarse on purpose: "lat,lon" with at most one decimal (~11 km), or empty.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass, field
from typing import Any

import msgpack

from inri.protocol import limits
from inri.protocol.codec import DecodeError
from inri.protocol.keys import node_id_for, sign, verify

RECORD_CONTEXT = b"inri/peer-record/v1\x00"
RECORD_VERSION = 1
MAX_RECORD_BYTES = 1024  # four addresses and a hint fit in ~400 bytes; a bigger record is abuse
MAX_ADDRS = 4
MAX_SEQ = 2**63 - 1
_GEO = re.compile(r"^-?\d{1,2}(\.\d)?,-?\d{1,3}(\.\d)?$")


def parse_geo(geo: str) -> tuple[float, float] | None:
    """'48.8,2.3' -> (48.8, 2.3); None for '' or anything not a coarse, in-range lat,lon."""
    if not geo or not _GEO.match(geo):
        return None
    lat_s, lon_s = geo.split(",")
    lat, lon = float(lat_s), float(lon_s)
    if not (-90 <= lat <= 90 and -180 <= lon <= 180):
        return None
    return lat, lon


def geo_distance_km(a: tuple[float, float], b: tuple[float, float]) -> float:
    """Great-circle distance (haversine, Earth radius 6371 km)."""
    la1, lo1, la2, lo2 = map(math.radians, (*a, *b))
    h = math.sin((la2 - la1) / 2) ** 2 + math.cos(la1) * math.cos(la2) * math.sin((lo2 - lo1) / 2) ** 2
    return 2 * 6371.0 * math.asin(min(1.0, math.sqrt(h)))


def _check_addr(addr: object) -> str:
    if type(addr) is not str or not 3 <= len(addr) <= limits.MAX_ADDR_CHARS:
        raise DecodeError("malformed", "address must be a host:port string")
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise DecodeError("malformed", f"address {addr[:60]!r} is not host:port")
    return addr


@dataclass(frozen=True, slots=True)
class PeerRecord:
    """A relay's signed announcement (see module docstring)."""

    node_key: bytes  # 32-byte Ed25519 public key
    addrs: tuple[str, ...]  # QUIC "host:port" ("[v6]:port"), 1..4
    geo: str  # coarse "lat,lon" or ""
    capacity: int  # u16, relative
    timestamp: int  # unix seconds when signed
    seq: int  # strictly increasing per node key (replays of older records are refused)
    signature: bytes
    node_id: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "node_id", node_id_for(self.node_key))


def signed_bytes(node_key: bytes, addrs: tuple[str, ...], geo: str, capacity: int, timestamp: int, seq: int) -> bytes:
    """The exact bytes a record signature covers."""
    body: bytes = msgpack.packb([list(addrs), geo], use_bin_type=True)
    return RECORD_CONTEXT + node_key + struct.pack(">HQQ", capacity, timestamp, seq) + body


def make_peer_record(
    signing_key: Any, addrs: list[str], geo: str, capacity: int, timestamp: int, seq: int
) -> PeerRecord:
    """Build and sign a record with a nacl SigningKey (validated like a decoded one)."""
    node_key = bytes(signing_key.verify_key)
    t = tuple(addrs)
    sig = sign(signing_key, signed_bytes(node_key, t, geo, capacity, timestamp, seq))
    record = PeerRecord(node_key, t, geo, capacity, timestamp, seq, sig)
    decode_record(encode_record(record))  # refuse to build what no bootstrap would accept
    return record


def encode_record(r: PeerRecord) -> bytes:
    """Record -> wire bytes."""
    data: bytes = msgpack.packb([RECORD_VERSION, r.node_key, list(r.addrs), r.geo, r.capacity, r.timestamp,
                                 r.seq, r.signature], use_bin_type=True)
    return data


def decode_record(data: bytes) -> PeerRecord:
    """Wire bytes -> record; every problem raises DecodeError (code 'malformed', 'too_large', ...).

    The signature is NOT checked here (verify_record does), so callers can tell "malformed" from
    "forged" in their answers.
    """
    if type(data) is not bytes:
        raise DecodeError("malformed", "record must be bytes")
    if len(data) > MAX_RECORD_BYTES:
        raise DecodeError("too_large", f"record over {MAX_RECORD_BYTES} bytes")
    try:
        raw = msgpack.unpackb(data, raw=False, max_map_len=0, max_ext_len=0, max_array_len=16, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types on garbage
        raise DecodeError("malformed", f"not msgpack: {type(exc).__name__}") from None
    if type(raw) is not list or len(raw) != 8:
        raise DecodeError("malformed", "record must be an array of 8 fields")
    version, key, addrs, geo, capacity, timestamp, seq, sig = raw
    if version != RECORD_VERSION:
        raise DecodeError("unsupported_version", f"record version {version!r}")
    if type(key) is not bytes or len(key) != limits.KEY_BYTES:
        raise DecodeError("malformed", "node_key must be 32 bytes")
    if type(addrs) is not list or not 1 <= len(addrs) <= MAX_ADDRS:
        raise DecodeError("malformed", f"addrs must list 1..{MAX_ADDRS} addresses")
    checked = tuple(_check_addr(a) for a in addrs)
    if len(set(checked)) != len(checked):
        raise DecodeError("malformed", "addrs has duplicates")
    if type(geo) is not str or (geo and parse_geo(geo) is None):
        raise DecodeError("malformed", "geo must be '' or a coarse 'lat,lon' (one decimal)")
    for name, value, hi in (("capacity", capacity, 65535), ("timestamp", timestamp, limits.MAX_TIMESTAMP),
                            ("seq", seq, MAX_SEQ)):
        if type(value) is not int or not 0 <= value <= hi:
            raise DecodeError("malformed", f"{name} must be an integer in 0..{hi}")
    if type(sig) is not bytes or len(sig) != limits.SIGNATURE_BYTES:
        raise DecodeError("malformed", "signature must be 64 bytes")
    return PeerRecord(key, checked, geo, capacity, timestamp, seq, sig)


def verify_record(r: PeerRecord) -> bool:
    """True when the signature is the node key's over the record's fields."""
    return verify(r.node_key, signed_bytes(r.node_key, r.addrs, r.geo, r.capacity, r.timestamp, r.seq), r.signature)
