"""Peer records (codec, signatures) and the proximity ranking: properties over arbitrary input."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bootstrap_nodes.config import BootstrapConfig, ConfigError, load_bootstrap_config
from bootstrap_nodes.ranking import Candidate, prefix_of, rank
from bootstrap_nodes.service import Bootstrap, Refused
from inri.common.identity import NodeIdentity
from inri.node.bootstrap_client import load_seed_list, make_record
from inri.protocol.codec import DecodeError
from inri.protocol.peer_record import (
    MAX_RECORD_BYTES,
    decode_record,
    encode_record,
    make_peer_record,
    parse_geo,
    verify_record,
)

KEY = NodeIdentity.from_seed(b"\x07" * 32)
addr = st.builds(lambda a, b, p: f"{a}.{b}.0.1:{p}", st.integers(1, 223), st.integers(0, 255),
                 st.integers(1, 65535))
geo = st.one_of(st.just(""), st.builds(lambda la, lo: f"{la / 10:.1f},{lo / 10:.1f}", st.integers(-900, 900),
                                       st.integers(-1800, 1800)))


@given(st.lists(addr, min_size=1, max_size=4, unique=True), geo, st.integers(0, 65535), st.integers(0, 2**40),
       st.integers(0, 2**63 - 1))
def test_record_round_trip_and_signature(addrs: list[str], g: str, cap: int, ts: int, seq: int) -> None:
    rec = make_peer_record(KEY.signing_key, addrs, g, cap, ts, seq)
    back = decode_record(encode_record(rec))
    assert back == rec and back.node_id == KEY.node_id
    assert verify_record(back)
    assert not verify_record(type(rec)(rec.node_key, rec.addrs, rec.geo, rec.capacity, rec.timestamp, rec.seq + 1
                                       if rec.seq < 2**63 - 1 else 0, rec.signature))


@given(st.binary(max_size=2 * MAX_RECORD_BYTES))
def test_arbitrary_bytes_raise_only_decode_error(data: bytes) -> None:
    try:
        decode_record(data)
    except DecodeError as exc:
        assert exc.code in ("malformed", "too_large", "unsupported_version")


@given(st.lists(st.one_of(st.binary(max_size=40), st.text(max_size=30), st.integers(-(2**63), 2**64 - 1),
                          st.lists(st.text(max_size=20), max_size=5)), min_size=8, max_size=8))
def test_wrong_field_types_raise_decode_error(fields: list[object]) -> None:
    import msgpack

    with pytest.raises(DecodeError):
        decode_record(msgpack.packb([1, *fields[1:]]))


def test_geo_hints_are_coarse_and_in_range() -> None:
    assert parse_geo("48.8,2.3") == (48.8, 2.3)
    for bad in ("48.85,2.3", "91,0", "0,181", "a,b", "48.8", ""):
        assert parse_geo(bad) is None


cands = st.lists(
    st.builds(lambda n, p, g: Candidate(f"n{n}", f"127.0.{p}.{n % 250 + 1}:1", f"127.0.{p}.0/24", g),
              st.integers(0, 60), st.integers(0, 3), geo),
    max_size=40,
)


@given(cands, st.integers(0, 60), st.integers(0, 3), geo, st.integers(0, 40), st.integers(0, 2**32))
def test_ranking_never_returns_asker_or_duplicates(
    pool: list[Candidate], asker_n: int, asker_p: int, g: str, count: int, seed: int
) -> None:
    asker = f"n{asker_n}"
    out = rank(pool, asker=asker, asker_prefix=f"127.0.{asker_p}.0/24", asker_geo=g, count=count,
               rng=random.Random(seed))
    ids = [c.node_id for c in out]
    assert asker not in ids
    assert len(ids) == len(set(ids))
    distinct_others = {c.node_id for c in pool} - {asker}
    assert len(out) == min(count, len(distinct_others))
    # Same-prefix candidates come first, up to the near half of the answer.
    first: dict[str, Candidate] = {}
    for c in pool:
        first.setdefault(c.node_id, c)  # rank keeps the first entry of a repeated node id
    same = {n for n, c in first.items() if c.prefix == f"127.0.{asker_p}.0/24"} - {asker}
    near = (count + 1) // 2
    assert sum(1 for c in out[:near] if c.node_id in same) == min(near, len(same), len(out))


def test_prefixes() -> None:
    assert prefix_of("203.0.113.7") == "203.0.113.0/24"
    assert prefix_of("2001:db8:1:2::5") == "2001:db8:1::/48"
    assert prefix_of("::ffff:203.0.113.7") == "203.0.113.0/24"
    assert prefix_of("example.org") is None


def test_config_errors_are_clear(tmp_path) -> None:
    bad = tmp_path / "b.toml"
    bad.write_text("[bootstrap]\nrecord_ttl_s = 'soon'\n")
    with pytest.raises(ConfigError, match="record_ttl_s"):
        load_bootstrap_config(bad, env={})
    bad.write_text("[bootstrap]\nlisten_port = 1\n")
    with pytest.raises(ConfigError, match="unknown key 'listen_port'"):
        load_bootstrap_config(bad, env={})
    env = {"INRI_BOOTSTRAP_PEERS": "http://a,http://b", "INRI_BOOTSTRAP_ALLOW_PRIVATE": "1"}
    cfg = load_bootstrap_config(None, env=env)
    assert cfg.peers == ("http://a", "http://b") and cfg.allow_private


def test_default_seed_list_parses() -> None:
    urls = load_seed_list()
    assert urls and all(u.startswith("https://") for u in urls)


@pytest.mark.parametrize(("addr", "lab", "public"), [
    ("8.8.8.8:4433", True, True), ("[2606:4700::1111]:4433", True, True),
    ("127.0.0.1:4433", True, False), ("[::1]:4433", True, False),  # ::1 lies in ::/8, "reserved" to Python
    ("10.1.2.3:4433", True, False), ("[fe80::1]:4433", True, False),
    ("0.0.0.0:4433", False, False), ("[::]:4433", False, False), ("224.0.0.1:4433", False, False),
    ("240.0.0.1:4433", False, False), ("relay.example:4433", False, False)])
async def test_which_addresses_a_bootstrap_lists(tmp_path: Path, addr: str, lab: bool, public: bool) -> None:
    """Public IP literals always; loopback, private and link-local only with allow_private (a lab mesh,
    IPv6 included); unspecified, multicast, reserved and names never."""
    ident = NodeIdentity.generate()

    async def proven(a: str, node_id: str) -> bool:
        return True

    for allow_private, listed in ((True, lab), (False, public)):
        boot = Bootstrap(BootstrapConfig(data_dir=str(tmp_path / str(allow_private)), allow_private=allow_private),
                         proven)
        now = int(time.time())
        raw = encode_record(make_record(ident, [addr], None, 1, now * 1000, now))
        if listed:
            assert (await boot.admit(raw, source="announce")).addrs == (addr,)
        else:
            with pytest.raises(Refused) as refused:
                await boot.admit(raw, source="announce")
            assert refused.value.code in ("address_not_allowed", "malformed"), refused.value.detail
