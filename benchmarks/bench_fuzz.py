"""Fuzz campaign: every INRI decoder in process, then a live relay's HTTP API, WebSocket and QUIC port.

    python benchmarks/bench_fuzz.py

    BENCH_FUZZ_DECODER_CASES  100000    spread round-robin over every decoder target
    BENCH_FUZZ_LIVE_CASES     10000     against relay R1 of a lab mesh (2 relays, 1 bootstrap) on 127.0.0.1
    BENCH_FUZZ_SEED           20261123  the cases are deterministic for a seed (the relay's timing is not)
    BENCH_FUZZ_LAB_DIR        (temp)    where the lab mesh lives (`inri mesh down --dir` it if this is killed)

A seeded mutational fuzzer. It starts from valid inputs of every target and mutates them with the byte
and tree mutators of `inri.fuzzing` (bit flips, truncation, insertion, splicing; type swaps, boundary
integers, resized, dropped or extra fields) and its own: field swaps, type confusion, deep nesting
(JSON and msgpack), oversize values, truncation and random input. The case's mutation is named in
every failure, with its input as a reproducer.

Decoder targets (part a): `inri.protocol.codec.decode` (one target per message type: its seeds are
valid frames of that type), `decode_registration`, peer records (`decode_record` + `verify_record`),
`parse_geo`, `quic.parse_addr`, `quic.parse_auth` (the link-auth proof), `PushCredential.from_json`,
`open_sealed`, `metrics.parse_metrics`, the relay's bootstrap client (a peer entry; a whole peer-list
answer through `fetch_peers`), the bootstrap node (`Bootstrap.admit` of a record; `_sync_from` of a
peer's record list), the seed list, relay and bootstrap config files and environment, and scenario
files. A decoder must return or raise its documented error; a value that decodes must survive
encode -> decode where the API has an encoder; a record the bootstrap refuses must leave its store
as it was.

Live targets (part b): every route of the relay's /openapi.json over HTTP (mutated JSON bodies, binary
bodies, wrong methods and content types, bad paths, queries and credentials, huge and many headers,
raw malformed HTTP/1.1 on a socket); the device WebSocket (auth and ack messages); the QUIC port as an
authenticated peer (mutated frames) and at the link layer (mutated auth proofs, bad length prefixes,
wrong streams), and raw UDP datagrams (random, mutated QUIC Initial packets, bad headers).

A case *crashes* when: a decoder raises anything else or breaks its round trip; the relay answers 5xx,
or a 4xx that is not `application/problem+json` with a `code` that docs/api.md lists for that
status; a WebSocket closes with 1011/1006 (an exception escaped the app); an undecodable frame is not
answered with an ErrorFrame (docs/protocol.md); a new 'Traceback' or error-level line appears in the
relay's log; a rejected input changes the relay's state. Every 50 live cases the relay must answer
/healthz with its node id, still run, complete a QUIC handshake proving its node key, and the other
lab processes must not have logged an error.

State check: for every rejected live case (4xx, WebSocket error or close, ErrorFrame, refused link,
UDP garbage) the campaign compares, before and after the case, /v1/status (routes, custody, devices,
messages_stored) and row counts of the relay's SQLite store opened read-only (devices, sum of device
epochs, tokens, spent tokens, mailbox, custody, push_status). Accepted cases may change state. A
decodable QUIC frame is followed by a Keepalive whose reply proves the relay has handled the frame,
so its effects never leak into the next case's comparison.

Known findings: real bugs this campaign found that are not fixed yet are listed in KNOWN_FINDINGS
(reproducers in /tmp/fuzz_findings.md). A failure that matches one is counted under its id, shown
in the table, and does not fail the run; everything else does. Exit status 1 on any crash. The last
line printed is the JSON that benchmarks/run_all.py collects.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import platform
import random
import re
import sqlite3
import struct
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgpack
import trio

from inri.fuzzing import mutate_bytes, mutate_tree

ROOT = Path(__file__).resolve().parent.parent
BATCH = 50  # live cases between health checks
KEEP_FAILURES = 200  # reproducers kept for unknown crashes (3 more per known finding)


# -- what counts ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class KnownFinding:
    """A real bug this campaign found and reported, not fixed yet.

    A failure whose target matches `target` and whose text matches `pattern` (both regexes) counts
    under `id` instead of as a crash, so the campaign keeps gating everything else.
    """

    id: str
    target: str
    pattern: str
    summary: str


KNOWN_FINDINGS: tuple[KnownFinding, ...] = (
    KnownFinding("F1", r"^http ", r"RecursionError",
                 "a deeply nested JSON body (e.g. 3,000 '[') on any JSON route answers 500 internal and logs a "
                 "traceback: _Request.json (inri/node/api.py) catches ValueError, not json's RecursionError"),
    KnownFinding("F2", r"^http ", r"server-level (400|431|501) with an empty body",
                 "hypercorn answers malformed HTTP/1.1 (bad request line, conflicting Content-Length, bad chunks, "
                 "NUL in a header, no Host) and headers over 16 KiB with an empty 400/431, and an unknown "
                 "transfer-coding with an empty 501 (RFC 9112 says 501), before the app runs: no problem+json, "
                 "against docs/api.md 'Every error is application/problem+json'"),
    KnownFinding("F3", r"^ws ", r"-deep: WebSocket closed with 1011",
                 "a deeply nested JSON text message on /v1/devices/{id}/stream (auth or ack) raises RecursionError "
                 "out of RelayApi._websocket/_ws_reader: the socket dies with 1011 and nothing is logged "
                 "(hypercorn's errorlog is off)"),
    KnownFinding("F4", r"^credential\.PushCredential\.from_json$", r"RecursionError",
                 "PushCredential.from_json raises RecursionError, not ValueError, for deeply nested JSON"),
    KnownFinding("F5", r"^bootstrap_client\.fetch_peers$",
                 r"RecursionError|AttributeError: '\w+' object has no attribute 'get'",
                 "BootstrapClient.fetch_peers/announce leak RecursionError (deeply nested JSON answer) and "
                 "AttributeError (_problem() on an error answer whose JSON is not an object); the relay's "
                 "bootstrap loop catches them but logs a traceback each round"),
    KnownFinding("F6", r"^bootstrap\._sync_from$", r"RecursionError",
                 "a peer bootstrap's /v1/records answer nested deeply raises RecursionError out of "
                 "Bootstrap._sync_from, which sync_loop does not catch: the bootstrap process dies"),
    KnownFinding("F7", r"^(relay_config\.toml|bootstrap_config\.toml|scenario\.load|bootstrap_client\.load_seed_list)$",
                 r"raised (UnicodeDecodeError|RecursionError|ValueError: Exceeds the limit)",
                 "TOML readers leak UnicodeDecodeError (not UTF-8), RecursionError (deeply nested arrays) and "
                 "ValueError (integers over 4,300 digits) instead of ConfigError/ScenarioError: read_toml and "
                 "scenario.load catch only TOMLDecodeError, so `inri relay`/`inri-sim` print a traceback"),
)


def _documented_problem_codes() -> dict[str, int]:
    """code -> HTTP status, from the table in docs/api.md (the codes clients may match on)."""
    text = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    return {m[1]: int(m[2]) for m in re.finditer(r"^\| `(\w+)` \| (\d{3}) \|", text, re.MULTILINE)}


@dataclass
class Failure:
    """One crashing case: where, which mutation, what went wrong, the input (hex for bytes)."""

    target: str
    mutation: str
    what: str
    data: str
    known: str = ""


@dataclass
class Tally:
    """What a campaign ran and found, per target."""

    known_findings: tuple[KnownFinding, ...] = KNOWN_FINDINGS
    cases: Counter[str] = field(default_factory=Counter)
    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))
    accepted: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    rejected: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    crashes: Counter[str] = field(default_factory=Counter)
    known: defaultdict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    failures: list[Failure] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # campaign-level: a route without seeds, a relay down

    def accept(self, target: str, outcome: str = "accepted") -> None:
        self.accepted[target][outcome] += 1

    def reject(self, target: str, code: str) -> None:
        self.rejected[target][code] += 1

    def fail(self, target: str, mutation: str, what: str, data: Any) -> None:
        text = f"{mutation}: {what}"
        fid = next((k.id for k in self.known_findings
                    if re.search(k.target, target) and re.search(k.pattern, text, re.DOTALL)), "")
        if fid:
            self.known[target][fid] += 1
            keep = sum(1 for f in self.failures if f.known == fid) < 3
        else:
            self.crashes[target] += 1
            keep = sum(1 for f in self.failures if not f.known) < KEEP_FAILURES
        if keep:
            self.failures.append(Failure(target, mutation, what[:1000], _show(data), fid))

    @property
    def crash_count(self) -> int:
        return sum(self.crashes.values()) + len(self.problems)


def _show(data: Any) -> str:
    if isinstance(data, bytes | bytearray):
        return "hex:" + bytes(data[:800]).hex() + ("..." if len(data) > 800 else "") + f" ({len(data)} bytes)"
    text = repr(data)
    return text[:1600] + ("..." if len(text) > 1600 else "")


# -- mutation ------------------------------------------------------------------------------------

TYPE_ZOO: tuple[Any, ...] = (None, True, False, 0, -1, 1, 2**32, 2**64 - 1, -(2**63), 1.5, float("inf"), "",
                             "x" * 300, b"", b"\x00" * 33, [], [[]], {}, {"a": 1})
SPECIAL_TEXT = ("", " ", "\x00", "\ufeff", "\ud800", "nan", "inf", "-0", "1e309", "9" * 5000, "\u0664\u0668,\u0662",
                "\U0001f984", "\r\n", "a" * 70_000, "[]", "{}", "null", "\"", "\\")


def _pack(value: Any) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (OverflowError, TypeError, ValueError):
        return b"\xc1"  # never used by msgpack: the same kind of garbage the value would have been


def _unpack(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def _json(value: Any) -> str:
    return json.dumps(value, default=lambda o: base64.b64encode(o).decode() if isinstance(o, bytes) else str(o))


def _swap(rng: random.Random, value: Any) -> Any:
    """Two fields of an array (or two values of an object) change places."""
    if isinstance(value, list) and len(value) >= 2:
        v = list(value)
        i, j = rng.sample(range(len(v)), 2)
        v[i], v[j] = v[j], v[i]
        return v
    if isinstance(value, dict) and len(value) >= 2:
        d = dict(value)
        a, b = rng.sample(sorted(d), 2)
        d[a], d[b] = d[b], d[a]
        return d
    return mutate_tree(rng, value)


def _confuse(rng: random.Random, value: Any) -> Any:
    """One field (or the whole value) becomes a value of another type."""
    if isinstance(value, list) and value and rng.random() < 0.85:
        v = list(value)
        i = rng.randrange(len(v))
        v[i] = _confuse(rng, v[i]) if isinstance(v[i], list | dict) and rng.random() < 0.3 else rng.choice(TYPE_ZOO)
        return v
    if isinstance(value, dict) and value and rng.random() < 0.85:
        d = dict(value)
        d[rng.choice(sorted(d))] = rng.choice(TYPE_ZOO)
        return d
    return rng.choice(TYPE_ZOO)


def _grow(rng: random.Random, value: Any) -> Any:
    """One field made huge (70 KB bytes or text, a list repeated), or a huge field appended."""
    big: Any = rng.choice((b"\xab" * 70_000, "A" * 70_000, list(range(70_000))))
    if isinstance(value, list) and value:
        v = list(value)
        i = rng.randrange(len(v))
        if isinstance(v[i], bytes):
            v[i] = rng.randbytes(70_000)
        elif isinstance(v[i], str):
            v[i] = "A" * 70_000
        elif isinstance(v[i], list):
            v[i] = v[i] * 2000
        else:
            v.append(big)
        return v
    if isinstance(value, dict) and value:
        d = dict(value)
        d[rng.choice(sorted(d))] = big
        return d
    return big


def _depth(rng: random.Random) -> int:
    return rng.choice((64, 600, 3000, 20_000))


def make_case(rng: random.Random, kind: str, seed: Any, pool: tuple[Any, ...]) -> tuple[str, Any]:
    """(mutation name, input) for a decoder of this kind, from one of its valid seeds.

    Kinds: msgpack (bytes that are msgpack), json (a JSON text), text (a short string), file (bytes of
    a text file), tree (a parsed object), sealed ((key, ciphertext)), response ((HTTP status, body)).
    """
    r = rng.random()
    if kind == "msgpack":
        if r < 0.30:
            return "tree", _pack(mutate_tree(rng, _unpack(seed)))
        if r < 0.62:
            return "bytes", mutate_bytes(rng, seed, list(pool))
        if r < 0.70:
            return "swap", _pack(_swap(rng, _unpack(seed)))
        if r < 0.78:
            return "type", _pack(_confuse(rng, _unpack(seed)))
        if r < 0.84:
            return "truncate", seed[: rng.randrange(len(seed) + 1)]
        if r < 0.89:
            if rng.random() < 0.3:  # a header claiming 4 G elements, then the seed
                return "oversize", rng.choice((b"\xdd\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff")) + seed
            return "oversize", _pack(_grow(rng, _unpack(seed)))
        if r < 0.94:
            return "deep", rng.choice((b"\x91", b"\x92\x01", b"\x81\xa1k", b"\x91\x93\x01\x01")) * _depth(rng) + b"\xc0"
        return "random", rng.randbytes(rng.choice((0, 1, 2, 8, 64, 1024)))
    if kind == "json":
        if r < 0.30:
            return "tree", _json(mutate_tree(rng, json.loads(seed)))
        if r < 0.55:
            return "bytes", mutate_bytes(rng, seed.encode(), [p.encode() for p in pool]).decode("utf-8", "replace")
        if r < 0.62:
            return "swap", _json(_swap(rng, json.loads(seed)))
        if r < 0.72:
            return "type", _json(_confuse(rng, json.loads(seed)))
        if r < 0.78:
            return "truncate", seed[: rng.randrange(len(seed) + 1)]
        if r < 0.84:
            return "oversize", _json(_grow(rng, json.loads(seed)))
        if r < 0.93:
            n = _depth(rng)
            opening, closing = rng.choice((("[", "]"), ('{"a":', "}"), ('{"v":[', "]}")))
            return "deep", opening * n + "1" + (closing * n if rng.random() < 0.7 else "")
        return "random", rng.choice(SPECIAL_TEXT) if rng.random() < 0.5 else rng.randbytes(64).decode("latin-1")
    if kind == "text":
        if r < 0.55:
            return "bytes", mutate_bytes(rng, seed.encode(), [p.encode() for p in pool]).decode("utf-8", "replace")
        if r < 0.72:
            return "special", rng.choice(SPECIAL_TEXT)
        if r < 0.82:
            return "truncate", seed[: rng.randrange(len(seed) + 1)]
        if r < 0.87:
            return "oversize", seed * 5000
        if r < 0.92:
            return "deep", "[" * _depth(rng)
        return "random", rng.randbytes(rng.choice((1, 8, 64))).decode("latin-1")
    if kind == "file":
        if r < 0.60:
            return "bytes", mutate_bytes(rng, seed, list(pool))
        if r < 0.70:
            return "special", rng.choice(SPECIAL_TEXT).encode("utf-8", "surrogatepass")
        if r < 0.80:
            return "truncate", seed[: rng.randrange(len(seed) + 1)]
        if r < 0.85:
            return "oversize", seed + b"x = " + b"1" * 100_000 + b"\n"
        if r < 0.90:
            return "deep", b"x = " + b"[" * _depth(rng) + b"1"
        return "random", rng.randbytes(rng.choice((1, 8, 64, 1024)))
    if kind == "tree":
        if r < 0.75:
            return "tree", mutate_tree(rng, seed)
        if r < 0.83:
            return "swap", _swap(rng, seed)
        if r < 0.93:
            return "type", _confuse(rng, seed)
        nested: Any = 1  # deep, but no deeper than a parser of text (JSON, TOML) could have produced
        for _ in range(rng.choice((50, 200, 400))):
            nested = [nested] if rng.random() < 0.5 else {"a": nested}
        return "deep", nested
    if kind == "sealed":
        key, ct = seed
        if r < 0.75:
            return "bytes", (key, mutate_bytes(rng, ct, [ct]))
        if r < 0.90:
            return "truncate", (key, ct[: rng.randrange(len(ct) + 1)])
        return "random", (key, rng.randbytes(rng.choice((0, 48, 100, 70_000))))
    if kind == "response":
        status = 200 if rng.random() < 0.8 else rng.choice((204, 400, 404, 413, 429, 500, 503))
        if r < 0.05:
            return "binary", (status, rng.randbytes(rng.choice((0, 10, 1000))))
        mutation, text = make_case(rng, "json", seed, pool)
        return mutation, (status, text.encode("utf-8", "surrogatepass"))
    raise ValueError(f"unknown input kind {kind!r}")


# -- decoder targets -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Decoder:
    """One decoding entry point: fn(input) returns, or raises one of `errors` (its documented ones)."""

    fn: Callable[[Any], Any]
    errors: tuple[type[BaseException], ...]
    kind: str  # how cases are made from seeds (make_case)
    seeds: tuple[Any, ...]
    round_trip: Callable[[Any], Any] | None = None  # decoded value -> that value encoded and decoded again


def _tomlish(value: Any) -> Any:
    """What tomllib can produce: no None, no bytes (scenario.from_dict takes parsed TOML)."""
    if isinstance(value, dict):
        return {str(k): _tomlish(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_tomlish(v) for v in value if v is not None]
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return value


def _mocked_client(status: int, body: bytes) -> httpx.AsyncClient:
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers={"content-type": "application/json"})

    return httpx.AsyncClient(transport=httpx.MockTransport(answer), trust_env=False)


def frame_seeds(reg: Any, reg2: Any) -> dict[str, list[bytes]]:
    """Valid frames of every message type (message type name -> encoded frames), around two registrations."""
    from inri.protocol.codec import encode
    from inri.protocol.messages import (
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
        RouteError,
        RouteErrorReason,
    )

    frames = [
        Hello(1, "ab" * 16, "127.0.0.1:4433", ("x",)), Hello(1, "cd" * 16, "", ("low",)), Hello(2, "", "[::1]:1", ()),
        RegGossip(reg, 16, 2), RegGossip(reg2, 0, 255),
        Push(b"p" * 16, reg.route_id, b"t" * 16, b"c" * 64, 24, 3, 1, 0, reg),
        Push(b"q" * 16, reg2.route_id, b"u" * 16, b"", 0, 255, 255, 3, None),
        *(Receipt(b"r" * 16, s, 4) for s in ReceiptStatus),
        *(RouteError(b"e" * 16, reg.route_id, why) for why in RouteErrorReason),
        Keepalive(7, False), Keepalive(2**63 - 1, True),
        PeerExchange(()), PeerExchange((PeerInfo("cd" * 16, "10.0.0.1:4433"), PeerInfo("ef" * 16, "[::1]:4433"))),
        *(ErrorFrame(code, "detail") for code in ErrorCode),
    ]
    by_type: dict[str, list[bytes]] = defaultdict(list)
    for f in frames:
        raw = encode(f)
        by_type[MessageType(_unpack(raw)[0]).name].append(raw)
    return dict(by_type)


def decoder_targets(workdir: Path) -> tuple[dict[str, Decoder], list[str]]:
    """Every decoder and its seeds; and problems (a message type without seeds)."""
    from bootstrap_nodes.config import BootstrapConfig, load_bootstrap_config
    from bootstrap_nodes.config import ConfigError as BootstrapConfigError
    from bootstrap_nodes.service import Bootstrap, Refused
    from inri import mesh
    from inri.client.credential import DeviceKeys, PushCredential, open_sealed, seal
    from inri.node.bootstrap_client import BootstrapClient, BootstrapError, _verified, load_seed_list
    from inri.node.config import ConfigError, load_config
    from inri.node.identity import NodeIdentity
    from inri.node.metrics import parse_metrics
    from inri.node.quic import AUTH_CONTEXT, format_addr, parse_addr, parse_auth
    from inri.protocol.codec import (
        DecodeError,
        decode,
        decode_registration,
        encode,
        encode_registration,
        make_registration,
    )
    from inri.protocol.keys import new_signing_key
    from inri.protocol.messages import MessageType
    from inri.protocol.peer_record import decode_record, encode_record, make_peer_record, parse_geo, verify_record
    from simulations.scenario import ScenarioError, from_dict, parse_level
    from simulations.scenario import load as load_scenario

    now = int(time.time())
    reg = make_registration(new_signing_key(b"\x05" * 32), 3, now - 60, 3600)
    reg2 = make_registration(new_signing_key(b"\x06" * 32), 4_000_000_000, 1_700_000_000, 7 * 24 * 3600)
    by_type = frame_seeds(reg, reg2)
    problems = [f"codec: message type {t.name} has no seed frame" for t in MessageType if t.name not in by_type]

    def codec_rt(value: Any) -> Any:
        return decode(encode(value))

    targets: dict[str, Decoder] = {
        f"codec.decode[{name}]": Decoder(decode, (DecodeError,), "msgpack", tuple(seeds), codec_rt)
        for name, seeds in sorted(by_type.items())
    }
    targets["codec.decode_registration"] = Decoder(
        decode_registration, (DecodeError,), "msgpack", (encode_registration(reg), encode_registration(reg2)),
        lambda v: decode_registration(encode_registration(v)))

    node = NodeIdentity.from_seed(b"\x07" * 32)
    records = [make_peer_record(node.signing_key, ["127.0.0.1:4433"], "48.9,2.3", 100, now, 5),
               make_peer_record(NodeIdentity.from_seed(b"\x08" * 32).signing_key,
                                ["[::1]:4433", "8.8.8.8:443", "10.0.0.1:1"], "", 0, now, 1)]
    raw_records = tuple(encode_record(r) for r in records)

    def record(data: bytes) -> Any:
        r = decode_record(data)
        verify_record(r)  # a decoded record's signature check must not raise either
        return r

    targets["peer_record.decode_record+verify"] = Decoder(
        record, (DecodeError,), "msgpack", raw_records, lambda v: decode_record(encode_record(v)))
    targets["peer_record.parse_geo"] = Decoder(
        parse_geo, (), "text", ("48.9,2.3", "-33.9,151.2", "0,0", "90,-180"),
        lambda v: parse_geo(f"{v[0]},{v[1]}"))
    targets["quic.parse_addr"] = Decoder(
        parse_addr, (ValueError,), "text", ("127.0.0.1:4433", "[::1]:4433", "relay.example:443"),
        lambda v: parse_addr(format_addr(*v)))

    server = NodeIdentity.from_seed(b"\x09" * 32)
    proofs = []
    for i, addr in enumerate(("127.0.0.1:9", "", "[::1]:4433")):
        client = NodeIdentity.from_seed(bytes([10 + i]) * 32)
        sig = client.sign(AUTH_CONTEXT + server.public_key + client.public_key + addr.encode())
        proofs.append(msgpack.packb([client.public_key, addr, sig], use_bin_type=True))
    targets["quic.parse_auth"] = Decoder(
        lambda frame: parse_auth(frame, server.public_key), (), "msgpack", tuple(proofs))

    keys = DeviceKeys()
    creds = (PushCredential(keys.registration(), bytes(keys.seal_key.public_key), [b"k" * 16, b"l" * 16]).to_json(),
             PushCredential(reg2, b"\x01" * 32, []).to_json())
    targets["credential.PushCredential.from_json"] = Decoder(
        PushCredential.from_json, (ValueError,), "json", creds, lambda v: PushCredential.from_json(v.to_json()))
    targets["credential.open_sealed"] = Decoder(
        lambda kc: open_sealed(kc[0], kc[1]), (ValueError,), "sealed",
        ((keys.seal_key, seal(bytes(keys.seal_key.public_key), b"hello")),
         (keys.seal_key, seal(bytes(keys.seal_key.public_key), b"x" * 3000))))
    metrics_text = ('# HELP inri_pushes_total Pushes.\n# TYPE inri_pushes_total counter\n'
                    'inri_pushes_total{outcome="stored"} 3\ninri_routes 12\n'
                    'inri_push_latency_seconds_bucket{le="+Inf"} 4\ninri_push_latency_seconds_sum 0.25\n')
    targets["metrics.parse_metrics"] = Decoder(parse_metrics, (ValueError,), "text", (metrics_text,))

    entries = [{"node_id": r.node_id, "addr": r.addrs[0], "geo": r.geo, "capacity": r.capacity,
                "record": base64.urlsafe_b64encode(encode_record(r)).decode().rstrip("=")} for r in records]
    targets["bootstrap_client.peer_entry"] = Decoder(_verified, (), "tree", tuple(entries))
    peers_client = BootstrapClient(["http://bootstrap.invalid"])

    def fetch_peers(response: tuple[int, bytes]) -> Any:
        peers_client._client = lambda: _mocked_client(*response)  # type: ignore[method-assign]
        return trio.run(peers_client.fetch_peers, "ab" * 16, None, 16)

    targets["bootstrap_client.fetch_peers"] = Decoder(
        fetch_peers, (BootstrapError,), "response", (json.dumps({"peers": entries}), json.dumps({"peers": []})))

    async def always_reachable(addr: str, node_id: str) -> bool:
        return True

    boot = Bootstrap(BootstrapConfig(data_dir=str(workdir / "bootstrap"), allow_private=True), always_reachable,
                     clock=lambda: float(now))

    def store_state() -> list[tuple[str, int, float]]:
        return sorted((k, e.record.seq, e.expires_at) for k, e in boot.store.entries.items())

    def admit(raw: bytes) -> Any:
        before = store_state()
        try:
            return trio.run(functools.partial(boot.admit, raw, source="127.0.0.1"))
        except Refused:
            if store_state() != before:
                raise AssertionError("a refused record changed the bootstrap's store") from None
            raise

    targets["bootstrap.admit"] = Decoder(admit, (Refused,), "msgpack", raw_records,
                                         lambda v: decode_record(encode_record(v)))

    def sync(response: tuple[int, bytes]) -> None:
        async def run() -> None:
            async with _mocked_client(*response) as client:
                await boot._sync_from(client, "http://peer.invalid", {})

        trio.run(run)

    # sync_loop catches these four around every _sync_from (bootstrap_nodes/service.py).
    targets["bootstrap._sync_from"] = Decoder(
        sync, (httpx.HTTPError, ValueError, KeyError, TypeError), "response",
        (json.dumps({"records": [base64.urlsafe_b64encode(r).decode() for r in raw_records], "now": now}),))

    scratch = workdir / "case.toml"

    def from_file(load: Callable[[Path], Any]) -> Callable[[bytes], Any]:
        def run(data: bytes) -> Any:
            scratch.write_bytes(data)
            return load(scratch)

        return run

    targets["bootstrap_client.load_seed_list"] = Decoder(
        from_file(load_seed_list), (ValueError,), "file", ((ROOT / "bootstrap_nodes" / "default.toml").read_bytes(),))
    relay_toml = mesh.relay_config(workdir / "relay", 8080, 4433, ["http://127.0.0.1:1"], "salt").encode()
    targets["relay_config.toml"] = Decoder(
        from_file(lambda p: load_config(p, env={})), (ConfigError,), "file", (relay_toml,))
    targets["relay_config.env"] = Decoder(
        lambda env: load_config(None, env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {}),
        (ConfigError,), "tree",
        ({"INRI_API_RATE_PER_S": "50", "INRI_RELAY_PROFILE": "test", "INRI_ENGINE_ACTIVE_MAX": "5",
          "INRI_TRACE_LEVEL": "summary", "INRI_RELAY_GEO": "48.9,2.3"},))
    boot_toml = (b'[bootstrap]\nlisten = "127.0.0.1:8470"\ndata_dir = "x"\nallow_private = true\n'
                 b'peers = ["http://127.0.0.1:1"]\nrate_per_s = 2.0\nrate_burst = 20\n')
    targets["bootstrap_config.toml"] = Decoder(
        from_file(lambda p: load_bootstrap_config(p, env={})), (BootstrapConfigError,), "file", (boot_toml,))
    scenario_toml = (ROOT / "simulations" / "scenarios" / "black-holes-1k.toml").read_bytes()
    targets["scenario.load"] = Decoder(from_file(load_scenario), (ScenarioError,), "file", (scenario_toml,))
    import tomllib

    targets["scenario.from_dict"] = Decoder(
        lambda raw: from_dict(_tomlish(raw) if isinstance(raw, dict) else {"name": raw}), (ScenarioError,), "tree",
        (tomllib.loads(scenario_toml.decode()),))
    targets["scenario.parse_level"] = Decoder(parse_level, (ScenarioError,), "text", ("off", "summary", "full"))
    return targets, problems


def _code(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    return str(code) if isinstance(code, str) else type(exc).__name__


def check_decoder(tally: Tally, name: str, dec: Decoder, mutation: str, data: Any) -> None:
    """Run one case through one decoder and record what happened."""
    try:
        value = dec.fn(data)
    except dec.errors as exc:
        tally.reject(name, _code(exc))
        return
    except Exception as exc:  # the point of the campaign: any other exception is a finding
        tally.fail(name, mutation, f"raised {type(exc).__name__}: {str(exc)[:300]}", data)
        return
    if value is None:
        tally.reject(name, "None")
        return
    if dec.round_trip is not None:
        try:
            again = dec.round_trip(value)
        except Exception as exc:
            tally.fail(name, mutation, f"round trip of {value!r:.200} raised {type(exc).__name__}: {exc}", data)
            return
        if again != value:
            tally.fail(name, mutation, f"round trip changed {value!r:.200} into {again!r:.200}", data)
            return
    tally.accept(name)


def run_decoders(cases: int, seed: int, *, extra: dict[str, Decoder] | None = None,
                 tally: Tally | None = None) -> Tally:
    """`cases` cases round-robin over every decoder target (plus `extra` ones)."""
    tally = tally if tally is not None else Tally()
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="inri-fuzz-") as tmp:
        targets, problems = decoder_targets(Path(tmp))
        tally.problems += problems
        targets.update(extra or {})
        names = sorted(targets)
        for i in range(cases):
            name = names[i % len(names)]
            dec = targets[name]
            started = time.perf_counter()
            mutation, data = make_case(rng, dec.kind, rng.choice(dec.seeds), dec.seeds)
            check_decoder(tally, name, dec, mutation, data)
            tally.seconds[name] += time.perf_counter() - started
            tally.cases[name] += 1
    return tally


# -- the live relay ------------------------------------------------------------------------------

STATE_NAMES = ("routes", "custody", "devices", "messages_stored", "db.devices", "db.sum(epoch)", "db.tokens",
               "db.spent_tokens", "db.mailbox", "db.custody", "db.push_status")
STATE_SQL = ("SELECT (SELECT count(*) FROM devices), (SELECT coalesce(sum(epoch), 0) FROM devices), "
             "(SELECT count(*) FROM tokens), (SELECT count(*) FROM tokens WHERE spent_by IS NOT NULL), "
             "(SELECT count(*) FROM mailbox), (SELECT count(*) FROM custody), (SELECT count(*) FROM push_status)")
_ERROR_LINE = re.compile(r'Traceback|"level": "(error|critical)"|^\S+ \[(error|critical)')


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child of ours counts as gone
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


class LogTail:
    """New complete lines of a log file since the last look; the error-level ones, summarised."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0

    def errors(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        found = []
        for line in data[:end].decode("utf-8", "replace").splitlines():
            if _ERROR_LINE.search(line):
                try:
                    rec = json.loads(line)
                    last = str(rec.get("exception", "")).strip().splitlines()[-1:] or [""]
                    found.append(f"{rec.get('event')} {last[0]}".strip())
                except (ValueError, AttributeError):
                    found.append(line[:300])
        return found


class Relay:
    """The relay under test and what the campaign checks on it: state, log, health."""

    def __init__(self, info: dict[str, Any], lab_logs: list[Path], client: httpx.AsyncClient) -> None:
        self.api: str = info["api"]
        self.quic: str = info["quic"]
        self.node_id: str = info["node_id"]
        self.pid: int = info["pid"]
        self.client = client
        self.log = LogTail(Path(info["log"]))
        self.lab_logs = [LogTail(p) for p in lab_logs]
        db = Path(info["data_dir"]) / "relay.sqlite3"
        self.db = sqlite3.connect(f"file:{db}?mode=ro", uri=True, check_same_thread=False)

    async def state(self) -> tuple[int, ...]:
        try:
            r = await self.client.get(self.api + "/v1/status")
        except httpx.TransportError:  # a pooled connection the server had just closed: once more
            r = await self.client.get(self.api + "/v1/status")
        st = r.json()
        rows = self.db.execute(STATE_SQL).fetchone()
        return (st["routes"], st["custody"], st["devices"], st["messages_stored"], *rows)

    async def finish(self, tally: Tally, target: str, mutation: str, data: Any, before: tuple[int, ...] | None,
                     issues: list[str]) -> bool:
        """The checks every live case ends with; True if the case passed them all."""
        if before is not None:
            after = await self.state()
            if after != before:
                diff = ", ".join(f"{n} {a} -> {b}" for n, a, b in zip(STATE_NAMES, before, after, strict=True)
                                 if a != b)
                issues.append(f"rejected input changed the relay's state: {diff}")
        errors = self.log.errors()
        if errors:
            issues.append("relay log: " + " | ".join(errors[:3]))
        if issues:
            tally.fail(target, mutation, "; ".join(issues), data)
        return not issues

    async def health(self) -> str | None:
        """None when the relay runs, answers /healthz with its node id and proves its key over QUIC."""
        from inri.node.identity import NodeIdentity
        from inri.node.quic import probe

        if not _alive(self.pid):
            return "the relay process exited"
        try:
            r = await self.client.get(self.api + "/healthz")
            if r.status_code != 200 or r.json().get("node_id") != self.node_id:
                return f"/healthz answered {r.status_code} {r.text[:200]}"
        except (httpx.HTTPError, ValueError) as exc:
            return f"/healthz failed: {type(exc).__name__}: {exc}"
        if not await probe(NodeIdentity.generate(), self.quic, self.node_id, timeout_s=5.0):
            return "no QUIC handshake proving the relay's node key"
        return None


def classify_http(status: int, headers: dict[str, str], body: bytes, codes: dict[str, int],
                  method: str = "GET") -> tuple[str, str | None]:
    """(outcome, issue or None) for one HTTP answer (header names lower-case)."""
    code = "-"
    problem: Any = None
    if method == "HEAD" and status >= 400:  # an answer to HEAD has no body: its headers are what we can check
        ctype = headers.get("content-type", "")
        ok = status < 500 and (ctype.startswith("application/problem+json") or not ctype)
        return f"{status} (HEAD)", None if ok else f"answered HEAD with {status} {ctype!r}"
    if headers.get("content-type", "").startswith("application/problem+json"):
        try:
            problem = json.loads(body)
            code = str(problem.get("code"))
        except (ValueError, AttributeError):
            problem = None
    if status >= 400 and not headers.get("content-type") and not body:
        return f"{status} (server)", (f"server-level {status} with an empty body, not problem+json "
                                      "(hypercorn answered before the app saw the request)")
    if status >= 500:
        return f"{status} {code}", f"answered {status} {code}: {body[:200]!r}"
    if status < 400:
        return f"{status}", None
    if problem is None or not isinstance(problem, dict):
        return f"{status} ?", f"{status} without a problem+json body: {headers.get('content-type')!r} {body[:200]!r}"
    if codes.get(code) != status or problem.get("status") != status:
        return f"{status} {code}", f"{status} with code {code!r}, which docs/api.md does not list for {status}"
    return f"{status} {code}", None


def _render(method: str, path: str, headers: dict[str, str], body: bytes | None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1", "connection: close",
             *(f"{k}: {v}" for k, v in headers.items())]
    if body is not None:
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", "replace") + (body or b"")


RAW_SPECIALS: tuple[bytes, ...] = (
    b"GARBAGE\r\n\r\n",
    b"POST /v1/push HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 7\r\n\r\n{}{}{}{",
    b"POST /v1/push HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    b"POST /v1/push HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    b"POST /v1/push HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nffffffffffffffff\r\n{}\r\n",
    b"POST /v1/push HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    b"POST /v1/push HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\n{}",
    b"POST /v1/push HTTP/1.1\r\nhost: x\r\ncontent-length: 99999999999999999999999\r\n\r\n{}",
    b"POST /v1/push HTTP/1.1\r\nhost: x\r\ncontent-length: 1e3\r\n\r\n{}",
    b"POST /v1/push HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"registration\":",
    b"GET /healthz HTTP/1.1\nhost: x\n\n",
    b"GET /healthz\r\n\r\n",
    b"GET /healthz HTTP/0.9\r\n\r\n",
    b"GET /healthz HTTP/2.0\r\nhost: x\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nhost: x\r\nhost: y\r\n\r\n",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"GET http://127.0.0.1/v1/status HTTP/1.1\r\nhost: x\r\n\r\n",
    b"CONNECT 127.0.0.1:1 HTTP/1.1\r\nhost: x\r\n\r\n",
    b"OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nhost: x\r\nbad header\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-folded: a\r\n b\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-nul: \x00\x01\r\n\r\n",
    b"GET /v1/\xff\xfe/status HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET /v1/devices/%00%ff%2e%2e/messages HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET /../../etc/passwd HTTP/1.1\r\nhost: x\r\n\r\n",
    b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\nhost: x\r\n\r\n",
    b"POST /v1/devices HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 2\r\n\r\n{}",
    b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(32) + b"\x00\x00\x02\x13\x01\x01\x00",
)


@dataclass
class Route:
    """One route of /openapi.json as a valid request: the seed of its cases."""

    method: str
    template: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None = None
    query: str = ""


class HttpFuzzer:
    """Mutated requests against every route of the relay's /openapi.json."""

    OPS = ("body", "body-binary", "body-oversize", "content-type", "method", "path", "query", "auth",
           "headers-huge", "headers-many", "raw", "valid")
    WEIGHTS = (40, 6, 3, 5, 8, 9, 5, 8, 3, 2, 8, 3)

    def __init__(self, relay: Relay, tally: Tally, client: httpx.AsyncClient) -> None:
        self.relay = relay
        self.tally = tally
        self.client = client  # its own, without keep-alive: a mangled request never spoils the next one
        self.codes = _documented_problem_codes()
        self.routes: list[Route] = []
        self.device: Any = None
        self.spare: Any = None

    async def setup(self, rng: random.Random) -> None:
        from inri.client import DeviceClient, HomeAppClient
        from inri.client.credential import b64e
        from inri.protocol.codec import encode_registration, make_registration
        from inri.protocol.keys import new_signing_key

        api = self.relay.api
        self.device = DeviceClient(api)
        await self.device.register(tokens=60)
        await self._new_spare()
        cred = self.device.export_credential(10)
        async with HomeAppClient([api], client=self.relay.client) as app:
            push_id = (await app.push(cred, b"fuzz")).push_id
        did = self.device.device_id
        auth = {"authorization": f"Bearer {self.device.secret}"}
        self.device.keys.epoch += 1
        newer = b64e(encode_registration(self.device.keys.registration()))
        fresh = b64e(encode_registration(make_registration(new_signing_key(rng.randbytes(32)), 1,
                                                           int(time.time()) - 60, 3600)))
        reg = b64e(encode_registration(cred.registration))
        ct = b64e(b"\x00" * 80)
        seeds = {
            ("POST", "/v1/devices"): ("/v1/devices", {}, {"registration": fresh, "tokens": 5}, ""),
            ("POST", "/v1/devices/{device_id}/registration"): (
                f"/v1/devices/{did}/registration", auth, {"registration": newer}, ""),
            ("POST", "/v1/devices/{device_id}/tokens"): (f"/v1/devices/{did}/tokens", auth, {"count": 3}, ""),
            ("DELETE", "/v1/devices/{device_id}"): ("spare", {}, None, ""),
            ("GET", "/v1/devices/{device_id}/messages"): (f"/v1/devices/{did}/messages", auth, None, "limit=5"),
            ("POST", "/v1/devices/{device_id}/ack"): (f"/v1/devices/{did}/ack", auth, {"ids": [push_id]}, ""),
            ("GET", "/v1/devices/{device_id}/stream"): (f"/v1/devices/{did}/stream", auth, None, ""),
            ("POST", "/v1/push"): ("/v1/push", {}, {"registration": reg, "token": b64e(cred.tokens[0]),
                                                   "ciphertext": ct}, ""),
            ("GET", "/v1/push/{push_id}"): (f"/v1/push/{push_id}", {}, None, ""),
            ("GET", "/healthz"): ("/healthz", {}, None, ""),
            ("GET", "/v1/status"): ("/v1/status", {}, None, ""),
            ("GET", "/metrics"): ("/metrics", {}, None, ""),
            ("GET", "/openapi.json"): ("/openapi.json", {}, None, ""),
        }
        doc = (await self.relay.client.get(api + "/openapi.json")).json()
        for template, operations in sorted(doc["paths"].items()):
            for method in sorted(operations):
                key = (method.upper(), template)
                if key not in seeds:
                    self.tally.problems.append(f"/openapi.json route {key[0]} {template} has no fuzz seed")
                    continue
                path, headers, body, query = seeds[key]
                self.routes.append(Route(key[0], template, path, dict(headers), body, query))
        if not self.routes:
            self.tally.problems.append("/openapi.json lists no routes")

    async def _new_spare(self) -> None:
        """A device for the DELETE route to delete (re-made each time a case deletes it)."""
        from inri.client import DeviceClient

        self.spare = DeviceClient(self.relay.api)
        await self.spare.register(tokens=1)

    def _request(self, route: Route) -> tuple[str, str, dict[str, str], bytes | None]:
        if route.path == "spare":
            return (route.method, f"/v1/devices/{self.spare.device_id}",
                    {"authorization": f"Bearer {self.spare.secret}"}, None)
        path = route.path + (f"?{route.query}" if route.query else "")
        headers = dict(route.headers)
        body = None
        if route.body is not None:
            body = json.dumps(route.body).encode()
            headers["content-type"] = "application/json"
        return route.method, path, headers, body

    async def case(self, rng: random.Random) -> None:
        route = rng.choice(self.routes)
        target = f"http {route.method} {route.template}"
        op = rng.choices(self.OPS, self.WEIGHTS)[0]
        method, path, headers, body = self._request(route)
        mutation = op
        raw: bytes | None = None
        if op == "body":
            sub, text = make_case(rng, "json", json.dumps(route.body or {}), ())
            mutation, body = f"body-{sub}", text.encode("utf-8", "surrogatepass")
            headers["content-type"] = "application/json"
        elif op == "body-binary":
            body = rng.randbytes(rng.choice((0, 1, 100, 4000)))
            headers["content-type"] = rng.choice(("application/json", "application/octet-stream", "text/plain"))
        elif op == "body-oversize":
            body = b"{" + b'"a":' * rng.choice((5000, 50_000, 300_000)) + b"1}"
        elif op == "content-type":
            ctype = rng.choice(("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                "application/msgpack", "application/json; charset=utf-16", "\u00e9/\u00e9", ""))
            headers["content-type"] = ctype
        elif op == "method":
            method = rng.choice(("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD", "TRACE", "FUZZ"))
        elif op == "path":
            mangled = mutate_bytes(rng, path.encode(), [r.path.encode() for r in self.routes]).decode("latin-1")
            path = rng.choice((
                "/" + "".join(c for c in mangled if 33 <= ord(c) < 127 and c not in "#")[:3000],
                path + rng.choice(("/", "//", "/..", "%00", "%2F..%2F", "/" + "x" * 5000, ";x=1", "%ff")),
                path.replace("/v1/", rng.choice(("/V1/", "/v2/", "//v1/", "/v1//"))),
            ))
        elif op == "query":
            path = path.split("?")[0] + "?" + rng.choice((
                "limit=", "limit=0", "limit=-1", "limit=1001", "limit=abc", "limit=" + "9" * 5000, "limit=1&limit=2",
                "limit=%00", "limit=1e3", "limit=%205", "limit=\u0665".encode().decode("latin-1"), "a" * 9000, "&&&=",
            ))
        elif op == "auth":
            headers["authorization"] = rng.choice((
                "Bearer", "Bearer ", "Bearer !", "bearer " + "A" * 43, "Bearer " + "A" * 5000, "Basic YTpi",
                "Bearer " + base64.urlsafe_b64encode(rng.randbytes(32)).decode(), "Bearer ====",
                "Bearer " + base64.b64encode(rng.randbytes(32)).decode(), "Bearer \u00e9".encode().decode("latin-1")))
        elif op == "headers-huge":
            headers["x-fuzz"] = "y" * rng.choice((4000, 17_000, 70_000, 300_000))
        elif op == "headers-many":
            headers.update({f"x-fuzz-{i}": "z" for i in range(rng.choice((100, 1000)))})
        elif op == "raw":
            if rng.random() < 0.5:
                mutation, raw = "raw-special", rng.choice(RAW_SPECIALS)
            else:
                mutation, raw = "raw-bytes", mutate_bytes(rng, _render(method, path, headers, body), [])
        before = await self.relay.state()
        self.tally.cases[target] += 1
        started = time.perf_counter()
        answer = await (self._raw(raw) if raw is not None else self._httpx(method, path, headers, body))
        self.tally.seconds[target] += time.perf_counter() - started
        data: Any = raw if raw is not None else {"method": method, "path": path[:300], "headers": {
            k: v[:200] for k, v in headers.items()}, "body": (body or b"")[:2000]}
        if isinstance(answer, str):  # no HTTP answer: the server closed the connection or never answered
            if await self.relay.finish(self.tally, target, mutation, data, before, []):
                self.tally.reject(target, answer)
            return
        status, hdrs, content = answer
        outcome, issue = classify_http(status, hdrs, content, self.codes, method if raw is None else "GET")
        rejected = status >= 400
        if await self.relay.finish(self.tally, target, mutation, data, before if rejected else None,
                                   [issue] if issue else []):
            (self.tally.reject if rejected else self.tally.accept)(target, outcome)
        if route.path == "spare" and status == 204 and method == "DELETE":
            await self._new_spare()

    async def _httpx(self, method: str, path: str, headers: dict[str, str],
                     body: bytes | None) -> tuple[int, dict[str, str], bytes] | str:
        raw_headers = {k: v.encode("latin-1", "replace") for k, v in headers.items()}
        try:
            r = await self.client.request(method, self.relay.api + path, headers=raw_headers, content=body)
        except httpx.LocalProtocolError:
            return "not sendable (client refused)"
        except httpx.HTTPError as exc:
            return f"no answer ({type(exc).__name__})"
        return r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.content

    async def _raw(self, data: bytes) -> tuple[int, dict[str, str], bytes] | str:
        host, port = self.relay.api.removeprefix("http://").rsplit(":", 1)
        buf = b""
        with trio.move_on_after(5):
            stream = await trio.open_tcp_stream(host, int(port))
            async with stream:
                try:
                    await stream.send_all(data)
                    await stream.send_eof()  # an incomplete request is answered now, not at a timeout
                    while not _complete(buf) and (chunk := await stream.receive_some(65536)):
                        buf += chunk
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    pass  # the server closed first; what it sent is in buf
        while re.match(rb"HTTP/1\.[01] 1\d\d", buf) and b"\r\n\r\n" in buf:  # interim (100 Continue) answers
            buf = buf.partition(b"\r\n\r\n")[2]
        if not buf:
            return "no answer (connection closed)"
        m = re.match(rb"HTTP/1\.[01] (\d{3})[^\r\n]*\r\n", buf)
        if m is None:
            return "non-HTTP/1.1 answer (h2 preface)" if buf[:2] == b"\x00\x00" else "unparsable answer"
        head, _, content = buf.partition(b"\r\n\r\n")
        hdrs = {}
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            hdrs[k.strip().lower().decode("latin-1")] = v.strip().decode("latin-1")
        if hdrs.get("content-length", "").isdigit():  # more answers may follow (a mutated request pipelined)
            content = content[: int(hdrs["content-length"])]
        return int(m[1]), hdrs, content


def _complete(answer: bytes) -> bool:
    """A whole HTTP/1.1 answer with a Content-Length (the server may keep the connection open after it)."""
    while re.match(rb"HTTP/1\.[01] 1\d\d", answer) and b"\r\n\r\n" in answer:
        answer = answer.partition(b"\r\n\r\n")[2]
    head, sep, body = answer.partition(b"\r\n\r\n")
    m = re.search(rb"\r\ncontent-length: *(\d+)", head, re.IGNORECASE)
    return bool(sep) and m is not None and len(body) >= int(m[1])


class WsFuzzer:
    """Mutated messages on the device WebSocket: the auth message, ack messages, binary frames, bad paths."""

    def __init__(self, relay: Relay, tally: Tally, http: HttpFuzzer) -> None:
        self.relay = relay
        self.tally = tally
        self.http = http

    async def case(self, rng: random.Random) -> None:
        from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

        dev = self.http.device
        target = "ws /v1/devices/{device_id}/stream"
        op = rng.choice(("auth", "auth", "ack", "ack", "ack", "binary", "path"))
        did = dev.device_id
        if op == "path":
            did = mutate_bytes(rng, did.encode(), []).decode("latin-1")
            did = "".join(c for c in did if c.isascii() and c.isalnum())[:200] or "x"
        url = self.relay.api.replace("http://", "ws://") + f"/v1/devices/{did}/stream"
        header = [] if op == "auth" else [(b"authorization", f"Bearer {dev.secret}".encode())]
        if op == "auth":
            mutation, text = make_case(rng, "json", json.dumps({"auth": dev.secret}), ())
            message: str | bytes = text
        elif op == "ack":
            mutation, message = make_case(rng, "json", json.dumps({"type": "ack", "ids": ["00" * 16]}), ())
        elif op == "binary":
            mutation, message = "binary", rng.randbytes(rng.choice((1, 100, 5000)))
        else:
            mutation, message = "path", json.dumps({"type": "ack", "ids": []})
        mutation = f"{op}-{mutation}" if op != mutation else op
        before = await self.relay.state()
        self.tally.cases[target] += 1
        started = time.perf_counter()
        outcome, issue, rejected = "?", None, True
        try:
            with trio.fail_after(10):
                async with open_websocket_url(url, extra_headers=header, connect_timeout=5,
                                              disconnect_timeout=2) as ws:
                    await ws.send_message(message)
                    if op == "auth":
                        with trio.move_on_after(1.0):
                            await ws.get_message()  # closed at once if refused; pending mail if accepted
                        outcome, rejected = "auth accepted", False
                    else:
                        outcome, rejected = await self._ack_replies(ws, message)
        except ConnectionClosed as exc:
            code = exc.reason.code if exc.reason else None
            outcome = f"closed {code}"
            if code in (1006, 1011) or code is None:
                issue = (f"WebSocket closed with {code}: an exception escaped the app (hypercorn's errorlog is off, "
                         "so the relay logs nothing)")
        except HandshakeError as exc:
            status = getattr(exc, "status_code", None)
            outcome = f"upgrade refused {status}"
            if status is None or status >= 500:
                issue = f"WebSocket upgrade refused with {status} ({type(exc).__name__}: {exc})"
        except trio.TooSlowError:
            issue = "no reply within 10 s"
        self.tally.seconds[target] += time.perf_counter() - started
        if await self.relay.finish(self.tally, target, mutation, message, before if rejected else None,
                                   [issue] if issue else []):
            (self.tally.reject if rejected else self.tally.accept)(target, outcome)

    async def _ack_replies(self, ws: Any, message: str | bytes) -> tuple[str, bool]:
        """Send a sentinel ack after the case: its reply proves the case's reply (if any) came first."""
        expect = 0
        if isinstance(message, str) and message:  # the relay skips empty and binary messages
            try:
                data = json.loads(message)
                expect = int(isinstance(data, dict) and data.get("type") == "ack")
            except (ValueError, RecursionError):
                expect = 1  # the relay answers {"type": "error"}
        await ws.send_message('{"type": "ack", "ids": []}')
        replies = []
        with trio.fail_after(5):
            while len(replies) < expect + 1:
                reply = json.loads(await ws.get_message())
                if reply.get("type") in ("error", "acked"):
                    replies.append(reply)
        if not expect:
            return "ignored", True
        first = replies[0]
        if first["type"] == "error":
            return "error reply", True
        return "acked", False


STREAM_LEN = struct.Struct(">I")


async def _serve_endpoint(ep: Any, scope: trio.CancelScope, *,
                          task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with scope:
        await ep.serve(None, task_status=task_status)


class QuicFuzzer:
    """Mutated frames from an authenticated peer (a fresh node key after every cut link)."""

    def __init__(self, relay: Relay, tally: Tally, nursery: trio.Nursery, seeds: dict[str, list[bytes]]) -> None:
        self.relay = relay
        self.tally = tally
        self.nursery = nursery
        self.seeds = seeds
        self.pool = tuple(f for frames in seeds.values() for f in frames)
        self.link: Any = None
        self.scope: trio.CancelScope | None = None

    async def _connect(self, rng: random.Random) -> None:
        from inri.node.identity import NodeIdentity
        from inri.node.quic import QuicEndpoint

        if self.scope is not None:
            self.scope.cancel()
        ep = QuicEndpoint(NodeIdentity.from_seed(rng.randbytes(32)), idle_timeout_s=10)
        await ep.bind("127.0.0.1", 0)
        self.scope = trio.CancelScope()
        await self.nursery.start(_serve_endpoint, ep, self.scope)
        self.link = await ep.connect(self.relay.quic, expect_node_id=self.relay.node_id)

    async def case(self, rng: random.Random) -> None:
        from inri.node.quic import ConnectError, LinkClosed
        from inri.protocol import limits
        from inri.protocol.codec import DecodeError, decode, encode
        from inri.protocol.messages import ErrorFrame, Keepalive

        kind = rng.choice(sorted(self.seeds))
        target = f"quic frame {kind}"
        mutation, frame = make_case(rng, "msgpack", rng.choice(self.seeds[kind]), self.pool)
        frame = frame[: limits.MAX_FRAME_BYTES]
        try:
            valid: Any = decode(frame)
        except DecodeError:
            valid = None
        self.tally.cases[target] += 1
        started = time.perf_counter()
        if self.link is None or self.link.closed:
            try:
                await self._connect(rng)
            except ConnectError as exc:
                self.tally.problems.append(f"the relay refused a fresh peer: {exc}")
                return
        before = await self.relay.state()
        issues: list[str] = []
        replies: list[Any] = []
        outcome = "?"
        try:
            await self.link.send(frame)
            nonce = rng.randrange(2**63)
            await self.link.send(encode(Keepalive(nonce, False)))  # a barrier: answered after the frame
            with trio.fail_after(5):
                while True:
                    reply = decode(await self.link.receive())
                    if isinstance(reply, Keepalive) and not reply.reply:
                        await self.link.send(encode(Keepalive(reply.nonce, True)))
                    elif isinstance(reply, Keepalive) and reply.nonce == nonce:
                        break
                    elif isinstance(reply, ErrorFrame):
                        replies.append(reply)
        except LinkClosed as exc:
            outcome = f"link cut ({str(exc)[:40]})"
            self.link = None
        except trio.TooSlowError:
            issues.append("no reply to the keepalive sent after the frame within 5 s")
            self.link = None
        except DecodeError as exc:
            issues.append(f"the relay sent an undecodable frame: {exc}")
        errors = [r for r in replies if isinstance(r, ErrorFrame)]
        if outcome == "?":
            if valid is None and not errors:
                issues.append("an undecodable frame was not answered with an ErrorFrame (docs/protocol.md)")
            elif errors:
                outcome = f"{'undecodable' if valid is None else 'decodable'}: ErrorFrame {errors[0].code.name}"
            else:
                outcome = f"decodable {type(valid).__name__}"
        rejected = valid is None or bool(errors) or outcome.startswith("link cut")
        self.tally.seconds[target] += time.perf_counter() - started
        if await self.relay.finish(self.tally, target, mutation, frame, before if rejected else None, issues):
            (self.tally.reject if rejected else self.tally.accept)(target, outcome)


class QuicLinkFuzzer:
    """The link layer under the frames: mutated auth proofs, bad length prefixes, wrong streams.

    It drives a handshake itself (QuicEndpoint internals) to send what `connect` never would.
    """

    OPS = ("auth", "auth", "auth", "auth", "prefix-huge", "prefix-short", "other-stream", "split", "fin")

    def __init__(self, relay: Relay, tally: Tally, nursery: trio.Nursery) -> None:
        self.relay = relay
        self.tally = tally
        self.nursery = nursery
        self.ep: Any = None

    async def _handshake(self) -> Any:
        from aioquic.quic.connection import QuicConnection

        from inri.node.identity import NodeIdentity
        from inri.node.quic import QuicEndpoint, parse_addr

        if self.ep is None:
            self.ep = QuicEndpoint(NodeIdentity.generate(), idle_timeout_s=10)
            await self.ep.bind("127.0.0.1", 0)
            await self.nursery.start(_serve_endpoint, self.ep, trio.CancelScope())
        remote = parse_addr(self.relay.quic)
        quic = QuicConnection(configuration=self.ep._client_config)
        quic.connect(remote, now=trio.current_time())
        conn = self.ep._add(quic, remote, outbound=True)
        conn.poke()
        with trio.move_on_after(5):
            await conn.handshake_done.wait()
        return conn

    async def case(self, rng: random.Random) -> None:
        from inri.node.quic import AUTH_CONTEXT, _peer_key
        from inri.protocol import limits

        target = "quic link (auth, framing)"
        op = rng.choice(self.OPS)
        self.tally.cases[target] += 1
        started = time.perf_counter()
        conn = await self._handshake()
        if not conn.handshake_done.is_set() or conn.closed:
            conn.close("fuzz: no handshake")
            self.tally.problems.append(f"no QUIC handshake with the relay ({conn.close_reason or 'timeout'})")
            return
        me = self.ep.identity
        server_key = _peer_key(conn.quic) or b""  # read off the certificate, as connect() does
        proof = msgpack.packb([me.public_key, self.ep.listen_addr,
                               me.sign(AUTH_CONTEXT + server_key + me.public_key + self.ep.listen_addr.encode())])
        stream, fin, mutation = 0, False, op
        if op == "auth":
            sub, frame = make_case(rng, "msgpack", proof, (proof,))
            mutation, payload = f"auth-{sub}", STREAM_LEN.pack(len(frame)) + frame
        elif op == "prefix-huge":
            payload = STREAM_LEN.pack(rng.choice((limits.MAX_FRAME_BYTES + 1, 2**24, 2**32 - 1))) + rng.randbytes(16)
        elif op == "prefix-short":
            payload = STREAM_LEN.pack(len(proof) + rng.randint(1, 100)) + proof
        elif op == "other-stream":
            stream, payload = rng.choice((2, 4, 8)), STREAM_LEN.pack(len(proof)) + proof
        else:
            payload, fin = STREAM_LEN.pack(len(proof)) + proof, op == "fin"
        before = await self.relay.state()
        if op == "split":
            for i in range(len(payload)):
                conn.quic.send_stream_data(stream, payload[i:i + 1])
                conn.poke()
                await trio.sleep(0)
        else:
            conn.quic.send_stream_data(stream, payload, end_stream=fin)
            conn.poke()
        with trio.move_on_after(0.3):  # on loopback the relay answers a complete proof within milliseconds
            await conn.auth_result.wait()
        if conn.authed is not None:
            outcome, rejected = "link up (ok)", False
        elif conn.closed:
            outcome, rejected = f"closed: {conn.close_reason[:40]}", True
        else:
            outcome, rejected = "pending (the relay drops it after 5 s)", True
        conn.close("fuzz case done")
        self.tally.seconds[target] += time.perf_counter() - started
        if await self.relay.finish(self.tally, target, mutation, payload, before if rejected else None, []):
            (self.tally.reject if rejected else self.tally.accept)(target, outcome)


class UdpFuzzer:
    """Datagrams at the QUIC port that are not (or not quite) QUIC: no answer is expected, no harm allowed."""

    def __init__(self, relay: Relay, tally: Tally) -> None:
        self.relay = relay
        self.tally = tally
        self.sock: Any = None
        self.initial = b""

    def _initial(self) -> bytes:
        from aioquic.quic.configuration import QuicConfiguration
        from aioquic.quic.connection import QuicConnection

        from inri.node.quic import ALPN, parse_addr

        quic = QuicConnection(configuration=QuicConfiguration(is_client=True, alpn_protocols=[ALPN]))
        quic.connect(parse_addr(self.relay.quic), now=time.monotonic())
        return quic.datagrams_to_send(now=time.monotonic())[0][0]

    async def case(self, rng: random.Random) -> None:
        from inri.node.quic import parse_addr

        target = "udp datagram"
        if self.sock is None:
            self.sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
            await self.sock.bind(("127.0.0.1", 0))
        if not self.initial or rng.random() < 0.05:
            self.initial = self._initial()
        op = rng.choice(("random", "initial", "initial", "short-header", "long-header"))
        if op == "random":
            data = rng.randbytes(rng.choice((0, 1, 7, 40, 1199, 1200, 1350, 1500)))
        elif op == "initial":
            data = mutate_bytes(rng, self.initial, [self.initial])
        elif op == "short-header":
            data = bytes([0x40 | rng.randrange(64)]) + rng.randbytes(rng.choice((8, 20, 1200)))
        else:
            version = rng.choice((b"\x00\x00\x00\x00", b"\x00\x00\x00\x01", b"\xff\x00\x00\x1d", rng.randbytes(4)))
            data = (bytes([0xC0 | rng.randrange(64)]) + version + bytes([rng.choice((0, 8, 20, 255))])
                    + rng.randbytes(rng.choice((8, 40, 1250))))
        self.tally.cases[target] += 1
        started = time.perf_counter()
        before = await self.relay.state()
        await self.sock.sendto(data, parse_addr(self.relay.quic))
        await trio.sleep(0.001)
        self.tally.seconds[target] += time.perf_counter() - started
        if await self.relay.finish(self.tally, target, op, data, before, []):
            self.tally.reject(target, f"{op}: no answer expected")


LIVE_SHARES = (("http", 0.55), ("ws", 0.07), ("quic", 0.26), ("quic-link", 0.04), ("udp", 0.08))


async def run_live(info: dict[str, Any], cases: int, seed: int, *, tally: Tally | None = None) -> Tally:
    """`cases` live cases against relay R1 of a lab mesh (`inri.mesh.up` info), health-checked per batch."""
    from inri.protocol.codec import make_registration
    from inri.protocol.keys import new_signing_key

    tally = tally if tally is not None else Tally()
    rng = random.Random(seed)
    relay_info = info["relays"][0]
    lab_logs = [Path(r["log"]) for r in info["relays"][1:]] + [Path(b["log"]) for b in info["bootstraps"]]
    plan = [name for name, share in LIVE_SHARES for _ in range(round(cases * share))]
    plan = (plan + ["http"] * cases)[:cases]
    rng.shuffle(plan)
    no_keepalive = httpx.Limits(max_keepalive_connections=0)
    async with (httpx.AsyncClient(timeout=15) as client,
                httpx.AsyncClient(timeout=15, limits=no_keepalive) as fuzz_client, trio.open_nursery() as nursery):
        relay = Relay(relay_info, lab_logs, client)
        earlier = relay.log.errors() + [e for t in relay.lab_logs for e in t.errors()]
        if earlier:
            tally.problems.append("lab logged errors before the campaign: " + " | ".join(earlier[:3]))
        http = HttpFuzzer(relay, tally, fuzz_client)
        await http.setup(rng)
        # Registrations long expired: an unmutated seed frame must not plant a route through a fuzz peer
        # (the relay forgets a peer's routes when its link goes, which would look like state drift).
        seeds = frame_seeds(make_registration(new_signing_key(b"\x05" * 32), 3, 1_700_000_000, 3600),
                            make_registration(new_signing_key(b"\x06" * 32), 9, 1_600_000_000, 60))
        fuzzers: dict[str, Any] = {"http": http, "ws": WsFuzzer(relay, tally, http),
                                   "quic": QuicFuzzer(relay, tally, nursery, seeds),
                                   "quic-link": QuicLinkFuzzer(relay, tally, nursery), "udp": UdpFuzzer(relay, tally)}
        for i, name in enumerate(plan):
            try:
                await fuzzers[name].case(rng)
            except Exception as exc:  # a bug of the campaign itself: reported, and it fails the run
                tally.problems.append(f"campaign error in a {name} case: {type(exc).__name__}: {exc}")
            if (i + 1) % BATCH == 0 or i + 1 == len(plan):
                down = await relay.health()
                lab = [f"{t.path.name}: {e}" for t in relay.lab_logs for e in t.errors()]
                if lab:
                    tally.fail("lab (other relay, bootstrap)", "batch", "log: " + " | ".join(lab[:3]), "")
                if down:
                    tally.problems.append(f"after live case {i + 1}: {down}")
                    break
        relay.db.close()
        nursery.cancel_scope.cancel()
    return tally


def run_live_lab(cases: int, seed: int, *, lab_dir: str | None = None, tally: Tally | None = None) -> Tally:
    """Start a lab mesh (2 relays, 1 bootstrap, 127.0.0.1) in lab_dir (or a temporary one), fuzz R1, stop it."""
    from inri import mesh

    with tempfile.TemporaryDirectory(prefix="inri-fuzz-lab-") as tmp:
        d = lab_dir or tmp
        info = mesh.up(d, relays=2, bootstraps=1, timeout_s=60, min_neighbours=1)
        try:
            return trio.run(functools.partial(run_live, info, cases, seed, tally=tally))
        finally:
            mesh.down(d)


def exit_status(*tallies: Tally) -> int:
    """1 when any campaign crashed (known findings excluded), else 0."""
    return 1 if any(t.crash_count for t in tallies) else 0


# -- figures -------------------------------------------------------------------------------------


def table(tally: Tally, title: str) -> str:
    """cases, cases/s, accepted, rejections by code, crashes and known findings per target."""
    headers = ("target", "cases", "cases/s", "accepted", "rejected (top codes)", "crashes", "known")
    rows = []
    for name in sorted(tally.cases):
        n, s = tally.cases[name], tally.seconds[name]
        rej = tally.rejected[name]
        top = ", ".join(f"{k} {v:,}" for k, v in rej.most_common(4)) + (f", +{len(rej) - 4} more" if len(rej) > 4
                                                                        else "")
        known = ", ".join(f"{k} {v}" for k, v in sorted(tally.known[name].items()))
        rows.append((name, f"{n:,}", f"{n / s:,.0f}" if s else "-", f"{sum(tally.accepted[name].values()):,}",
                     top or "-", str(tally.crashes[name]), known or "-"))
    total, secs = sum(tally.cases.values()), sum(tally.seconds.values())
    rows.append((f"ALL {title}", f"{total:,}", f"{total / secs:,.0f}" if secs else "-",
                 f"{sum(sum(c.values()) for c in tally.accepted.values()):,}",
                 f"{sum(sum(c.values()) for c in tally.rejected.values()):,}", str(tally.crash_count),
                 str(sum(sum(c.values()) for c in tally.known.values()))))
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [f"== {title}", "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def findings(tally: Tally) -> str:
    """Campaign problems, crashes (with reproducers) and known findings seen."""
    out = [f"PROBLEM {p}" for p in tally.problems]
    out += [f"CRASH {f.target} [{f.mutation}] {f.what}\n    input {f.data[:600]}"
            for f in tally.failures if not f.known]
    for k in tally.known_findings:
        seen = [f for f in tally.failures if f.known == k.id]
        if seen:
            n = sum(c[k.id] for c in tally.known.values())
            out.append(f"KNOWN {k.id} ({n} cases, not counted as crashes): {k.summary}\n"
                       f"    e.g. {seen[0].target} [{seen[0].mutation}] {seen[0].what[:300]}\n"
                       f"    input {seen[0].data[:300]}")
    return "\n".join(out)


def main() -> int:
    n_dec = int(os.environ.get("BENCH_FUZZ_DECODER_CASES", "100000"))
    n_live = int(os.environ.get("BENCH_FUZZ_LIVE_CASES", "10000"))
    seed = int(os.environ.get("BENCH_FUZZ_SEED", "20261123"))
    machine = f"{os.cpu_count()} CPUs, {platform.system()} {platform.machine()}, Python {platform.python_version()}"
    print(f"fuzz campaign: seed {seed}, {n_dec:,} decoder cases, {n_live:,} live cases; machine: {machine}", flush=True)
    started = time.perf_counter()
    dec = run_decoders(n_dec, seed)
    dec_wall = time.perf_counter() - started
    print(table(dec, "decoders (in process)"), flush=True)
    started = time.perf_counter()
    live = run_live_lab(n_live, seed, lab_dir=os.environ.get("BENCH_FUZZ_LAB_DIR")) if n_live > 0 else Tally()
    live_wall = time.perf_counter() - started
    print(table(live, "live relay (HTTP, WebSocket, QUIC, UDP; cases/s include the state checks)"), flush=True)
    for tally in (dec, live):
        text = findings(tally)
        if text:
            print(text)
    crashes = dec.crash_count + live.crash_count
    known = sum(sum(c.values()) for t in (dec, live) for c in t.known.values())
    print(f"crashes: {crashes}; known findings (excluded): {known}; wall: decoders {dec_wall:.1f} s, "
          f"live {live_wall:.1f} s (incl. lab start/stop); machine: {machine}")
    figures = []
    for label, t, wall in (("decoders", dec, dec_wall), ("live", live, live_wall)):
        total = sum(t.cases.values())
        secs = sum(t.seconds.values())
        figures += [
            {"metric": f"fuzz {label}: cases", "value": total, "unit": "cases",
             "note": f"{len(t.cases)} targets, {total / secs if secs else 0:,.0f} cases/s, wall {wall:.0f} s"},
            {"metric": f"fuzz {label}: crashes", "value": t.crash_count, "unit": "", "ceiling": "0",
             "note": f"known findings excluded: {sum(sum(c.values()) for c in t.known.values())}"},
        ]
    figures.append({"metric": "machine", "value": os.cpu_count() or 0, "unit": "CPUs", "note": machine})
    print(json.dumps({"bench": "fuzz", "figures": figures}))
    return exit_status(dec, live)


if __name__ == "__main__":
    sys.exit(main())
