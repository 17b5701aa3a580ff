"""Fuzzing INRI's input surfaces: every decoder in process, and a running relay's HTTP API and QUIC port.

A seeded mutational fuzzer (deterministic for a seed): it starts from valid inputs of each target and
mutates them at the byte level (bit flips, random bytes, truncation, insertion, splicing) and at the
structure level (the msgpack or JSON tree: type swaps, boundary integers, resized fields, dropped or
extra items). A case *fails* when a decoder raises anything but its documented error, when a value
that decodes does not survive a round trip, when the relay answers 5xx or a 4xx without a problem
body with a stable `code`, when the relay goes down, writes a traceback or counts a failure of its HTTP
server (a listener restarted, a connection ended on an error of its own), or when a rejected input
changed the relay's state.

Used by tests/test_fuzzing.py (short profile, CI) and benchmarks/bench_fuzzing.py (100,000 decoder
cases, 10,000 live cases). `python -m fuzz --api URL --quic ADDR --node-id ID` fuzzes a relay of your
own (give it a lab config: every case counts against its rate limits).

Seed requests carry their binary fields in base64url, the API's encoding, so that an unmutated or
lightly mutated seed gets past field validation and the fuzzer reaches the code behind it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from inri.common.b64url import b64e
from inri.protocol import limits
from inri.protocol.codec import DecodeError, decode, decode_registration, encode, encode_registration, make_registration
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
    ReceiptBatch,
    ReceiptStatus,
    RegGossip,
    RouteError,
    RouteErrorReason,
    RouteSync,
    RouteWithdraw,
    SyncedRoute,
    WithdrawKind,
    WithdrawnRoute,
)

BOUNDARY_INTS = (0, 1, -1, 127, 128, 255, 256, 65535, 65536, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1,
                 -(2**63), 2**64 - 1)


@dataclass
class Report:
    """What a campaign did: cases per target, outcomes, failures (with reproducers)."""

    cases: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)  # "target: accepted" / "target: rejected <code>"
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def fail(self, target: str, what: str, data: object) -> None:
        if len(self.failures) < 50:
            shown = data.hex() if isinstance(data, bytes) else repr(data)
            self.failures.append(f"{target}: {what}; input {shown[:400]}")
        self.outcomes[f"{target}: FAILED"] += 1

    @property
    def total(self) -> int:
        return sum(self.cases.values())

    def merge(self, other: Report) -> None:
        self.cases.update(other.cases)
        self.outcomes.update(other.outcomes)
        self.failures += other.failures[: max(0, 50 - len(self.failures))]
        self.seconds += other.seconds


# -- mutation -----------------------------------------------------------------------------------

def mutate_bytes(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """One to four byte-level mutations."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        if op == 0 and b:  # bit flip
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
        elif op == 1 and b:  # random byte
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 2 and b:  # truncate
            del b[rng.randrange(len(b)):]
        elif op == 3:  # insert random bytes
            i = rng.randrange(len(b) + 1)
            b[i:i] = rng.randbytes(rng.choice((1, 2, 4, 8, 33, 300)))
        elif op == 4 and b:  # delete a range
            i = rng.randrange(len(b))
            del b[i:i + rng.randint(1, 16)]
        elif op == 5 and pool:  # splice with another sample
            other = rng.choice(pool)
            b = b[: rng.randrange(len(b) + 1)] + other[rng.randrange(len(other) + 1):]
        elif op == 6 and b:  # duplicate a chunk
            i = rng.randrange(len(b))
            b[i:i] = b[i:i + rng.randint(1, 32)]
    return bytes(b)


def mutate_tree(rng: random.Random, value: Any, depth: int = 0) -> Any:
    """A structural mutation of a msgpack/JSON value: one node changed, the rest kept."""
    if isinstance(value, list) and value and depth < 6 and rng.random() < 0.7:
        v = list(value)
        op = rng.randrange(5)
        i = rng.randrange(len(v))
        if op == 0:
            v[i] = mutate_tree(rng, v[i], depth + 1)
        elif op == 1:
            del v[i]
        elif op == 2:
            v.insert(i, _random_leaf(rng))
        elif op == 3:
            v[i], v[-1] = v[-1], v[i]
        else:
            v = v + v[: rng.randint(1, len(v))]
        return v
    if isinstance(value, dict) and value and depth < 6 and rng.random() < 0.7:
        d = dict(value)
        key = rng.choice(list(d))
        op = rng.randrange(4)
        if op == 0:
            d[key] = mutate_tree(rng, d[key], depth + 1)
        elif op == 1:
            del d[key]
        elif op == 2:
            name = rng.choice(("x", "", "v", "registration", "token", "count", "ids", "limit", "a" * 300))
            d[name] = _random_leaf(rng)
        else:
            d[key] = _random_leaf(rng)
        return d
    return _random_leaf(rng, like=value)


def _random_leaf(rng: random.Random, like: Any = None) -> Any:
    op = rng.randrange(10)
    if isinstance(like, int) and not isinstance(like, bool) and op < 5:
        return rng.choice(BOUNDARY_INTS + (like + 1, like - 1, like * 2))
    if isinstance(like, (bytes, str)) and op < 5:
        n = len(like)
        size = rng.choice((0, 1, max(0, n - 1), n + 1, n * 2, 4096, 70000))
        if isinstance(like, bytes):
            return rng.randbytes(size)
        return "".join(rng.choice("aZ09+/=_-:.\u00e9\u0000 ") for _ in range(min(size, 5000)))
    return rng.choice((None, True, False, 0, -1, 2**64 - 1, 1.5, float("nan"), "", "x" * 70, b"", b"\x00" * 16,
                       [], {}, [1, 2], {"a": 1}))


def _pack(value: Any) -> bytes:
    try:
        packed: bytes = msgpack.packb(value, use_bin_type=True)
        return packed
    except (OverflowError, TypeError, ValueError):
        return b"\xc1"


# -- decoder targets ---------------------------------------------------------------------------

def _samples() -> dict[str, list[Any]]:
    """Valid inputs of every decoder target (the fuzzer's seeds)."""
    from inri.client.credential import DeviceKeys, PushCredential, seal
    from inri.common.identity import NodeIdentity
    from inri.protocol.peer_record import encode_record, make_peer_record

    key = new_signing_key(b"\x05" * 32)
    reg = make_registration(key, 3, 1_700_000_000, 3600)
    frames: list[Any] = [
        Hello(1, "ab" * 16, "127.0.0.1:4433", ("x",)),
        RegGossip(reg, 16, 2),
        Push(b"p" * 16, reg.route_id, b"t" * 16, b"c" * 64, 24, 3, 1, 0, reg),
        Push(b"q" * 16, reg.route_id, b"t" * 16, b"", 24, 0, 2, 3, None),
        Receipt(b"p" * 16, ReceiptStatus.STORED, 4),
        ReceiptBatch(reg.route_id, ((b"p" * 16, ReceiptStatus.STORED, 4), (b"q" * 16, ReceiptStatus.SPENT, 5)),
                     b"s" * 64),
        RouteError(b"p" * 16, reg.route_id, RouteErrorReason.NO_ROUTE),
        Keepalive(7, False),
        PeerExchange((PeerInfo("cd" * 16, "10.0.0.1:4433"), PeerInfo("ef" * 16, "[::1]:4433"))),
        ErrorFrame(ErrorCode.MALFORMED, "bad"),
        RouteSync((SyncedRoute(reg.route_id, 3, 3600), SyncedRoute(b"r" * 16, 0, 1))),
        RouteWithdraw((WithdrawnRoute(reg.route_id, 3, WithdrawKind.HOME_DOWN, 0, 7),
                       WithdrawnRoute(b"r" * 16, 1, WithdrawKind.RESTORED, 4))),
    ]
    ident = NodeIdentity.generate()
    record = make_peer_record(ident.signing_key, ["198.51.100.7:4433"], "48.9,2.3", 100, 1_700_000_000, 1)
    keys = DeviceKeys()
    cred = PushCredential(keys.registration(), bytes(keys.seal_key.public_key), [b"k" * 16, b"l" * 16])
    return {
        "codec.decode": [encode(f) for f in frames],
        "codec.decode_registration": [encode_registration(reg)],
        "peer_record.decode_record": [encode_record(record)],
        "bootstrap_client.peer_entry": [
            {"record": b64e(encode_record(record))}],
        "credential.from_json": [cred.to_json()],
        "credential.open_sealed": [(keys.seal_key, seal(bytes(keys.seal_key.public_key), b"hello"))],
        "addr.parse_addr": ["127.0.0.1:4433", "[::1]:4433", "relay.example:443"],
        "peer_record.parse_geo": ["48.9,2.3", "-33.9,151.2"],
        "relay_config.env": [{"INRI_API_RATE_PER_S": "50", "INRI_RELAY_PROFILE": "test", "INRI_ENGINE_ACTIVE_MAX": "5",
                              "INRI_TRACE_LEVEL": "summary", "INRI_RELAY_GEO": "48.9,2.3"}],
        "scenario.from_dict": [_scenario_seed()],
    }


def _scenario_seed() -> dict[str, Any]:
    import tomllib
    from importlib import resources

    text = resources.files("simulations").joinpath("scenarios", "black-holes-1k.toml").read_text()
    return tomllib.loads(text)


def _tomlish(value: Any) -> Any:
    """What tomllib can produce: no None, no bytes (a scenario file is TOML)."""
    if isinstance(value, dict):
        return {str(k): _tomlish(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_tomlish(v) for v in value if v is not None]
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return value


def _targets() -> dict[str, tuple[Callable[[Any], Any], tuple[type[BaseException], ...], str]]:
    """name -> (function, documented exceptions, input kind: bytes | tree | text | sealed)."""
    from inri.client.credential import PushCredential, open_sealed
    from inri.common.addr import parse_addr
    from inri.node.bootstrap_client import verified_entry
    from inri.node.config import ConfigError, load_config
    from inri.protocol.peer_record import decode_record, parse_geo, verify_record
    from simulations.scenario import ScenarioError, from_dict

    def record(data: bytes) -> Any:
        r = decode_record(data)
        verify_record(r)  # a decoded record's signature check must not raise either
        return r

    return {
        "codec.decode": (decode, (DecodeError,), "bytes"),
        "codec.decode_registration": (decode_registration, (DecodeError,), "bytes"),
        "peer_record.decode_record": (record, (DecodeError,), "bytes"),
        "bootstrap_client.peer_entry": (verified_entry, (), "tree"),
        "credential.from_json": (PushCredential.from_json, (ValueError,), "text"),
        "credential.open_sealed": (lambda kc: open_sealed(kc[0], kc[1]), (ValueError,), "sealed"),
        "addr.parse_addr": (parse_addr, (ValueError,), "text"),
        "peer_record.parse_geo": (parse_geo, (), "text"),
        # Environment variables are text: every value a string, like the process environment.
        "relay_config.env": (lambda env: load_config(None, env={str(k): str(v) for k, v in env.items()}
                                                     if isinstance(env, dict) else {}), (ConfigError,), "tree"),
        "scenario.from_dict": (lambda raw: from_dict(_tomlish(raw) if isinstance(raw, dict) else {"name": raw}),
                               (ScenarioError,), "tree"),
    }


def _round_trip(target: str, value: Any) -> bool:
    """A value that decoded must encode and decode to itself."""
    if target == "codec.decode":
        return bool(decode(encode(value)) == value)
    if target == "codec.decode_registration":
        return bool(decode_registration(encode_registration(value)) == value)
    if target == "peer_record.decode_record":
        from inri.protocol.peer_record import decode_record, encode_record

        return bool(decode_record(encode_record(value)) == value)
    return True


def _case(rng: random.Random, kind: str, seed: Any, pool: list[Any]) -> Any:
    if kind == "bytes":
        if rng.random() < 0.4:
            try:
                tree = msgpack.unpackb(seed, raw=False, strict_map_key=False)
            except Exception:  # noqa: BLE001 - a seed is always valid msgpack; belt and braces
                tree = None
            if tree is not None:
                return _pack(mutate_tree(rng, tree))
        return mutate_bytes(rng, seed, pool) if rng.random() < 0.95 else rng.randbytes(rng.randrange(64))
    if kind == "tree":
        return mutate_tree(rng, seed)
    if kind == "sealed":
        key, ct = seed
        return key, mutate_bytes(rng, ct, [ct])
    # text
    if rng.random() < 0.05:  # deep nesting (RecursionError in json and tomllib)
        return rng.choice(("[", '{"a":', "a=[")) * rng.choice((1000, 3000))
    if rng.random() < 0.5 and seed.startswith("{"):
        return json.dumps(mutate_tree(rng, json.loads(seed)), default=lambda o: b64e(o)
                          if isinstance(o, bytes) else str(o))
    raw = mutate_bytes(rng, seed.encode(), [s.encode() for s in pool])
    return raw.decode("utf-8", errors="replace")


def fuzz_decoders(cases: int, seed: int = 1,
                  extra: dict[str, tuple[Callable[[Any], Any], tuple[type[BaseException], ...], str, list[Any]]]
                  | None = None) -> Report:
    """Spread `cases` over every decoder target (plus `extra` ones: name -> (fn, errors, kind, seeds))."""
    rng = random.Random(seed)
    targets = {name: (*spec, _samples()[name]) for name, spec in _targets().items()}
    targets.update(extra or {})
    names = sorted(targets)
    report = Report()
    started = time.perf_counter()
    for i in range(cases):
        name = names[i % len(names)]
        fn, allowed, kind, seeds = targets[name]
        data = _case(rng, kind, rng.choice(seeds), seeds)
        report.cases[name] += 1
        try:
            value = fn(data)
        except allowed as exc:
            code = getattr(exc, "code", type(exc).__name__)
            report.outcomes[f"{name}: rejected {code}"] += 1
            continue
        except RecursionError:
            report.outcomes[f"{name}: FAILED"] += 1
            report.fail(name, "recursion", data)
            continue
        except Exception as exc:  # noqa: BLE001 - the point: anything else is a finding
            report.fail(name, f"raised {type(exc).__name__}: {exc}", data)
            continue
        try:
            ok = _round_trip(name, value)
        except Exception as exc:  # noqa: BLE001
            report.fail(name, f"round trip raised {type(exc).__name__}: {exc}", data)
            continue
        if not ok:
            report.fail(name, "decoded value does not survive a round trip", data)
        else:
            report.outcomes[f"{name}: {'rejected (None)' if value is None else 'accepted'}"] += 1
    report.seconds = time.perf_counter() - started
    return report


# -- a live relay ------------------------------------------------------------------------------

STATE_KEYS = ("routes", "custody", "devices", "messages_stored")


async def _state(client: Any, api: str) -> tuple[Any, ...]:
    """The relay state a rejected request must not change.

    Read once more on a fresh connection when the pooled one turns out closed: a server may close a
    keep-alive connection after an answer (e.g. one given before reading a large body), and a GET
    sent on it meanwhile gets no answer; HTTP clients retry such idempotent requests. A relay that
    is really down fails the second read too.
    """
    import httpx

    try:
        r = await client.get(api + "/v1/status")
    except httpx.RemoteProtocolError:
        async with httpx.AsyncClient(timeout=10) as fresh:
            r = await fresh.get(api + "/v1/status")
    st = r.json()
    return tuple(st[k] for k in STATE_KEYS)


async def _server_failures(client: Any, api: str) -> tuple[float, float]:
    """The relay's inri_http_restarts_total and inri_http_connection_errors_total: what a client never sees
    (its connection is served again, or its answer came before the crash)."""
    from inri.node.metrics import parse_metrics

    metrics = parse_metrics((await client.get(api + "/metrics")).text)
    return metrics.get("inri_http_restarts_total", 0.0), metrics.get("inri_http_connection_errors_total", 0.0)


async def fuzz_http(api: str, cases: int, seed: int = 1) -> Report:
    """Mutated requests against every route of a running relay's HTTP API.

    A device is registered first (its id and secret make the device routes reachable). Rejected
    requests (4xx) must leave the relay's state (routes, custody, devices, stored messages) as it
    was: it is compared before and after every rejected case.
    """
    import httpx

    from inri.client import DeviceClient

    rng = random.Random(seed)
    report = Report()
    dev = DeviceClient(api)
    await dev.register(tokens=20)
    cred = dev.export_credential(10)
    did, secret = dev.device_id, dev.secret
    auth = {"authorization": f"Bearer {secret}"}
    reg_b64 = b64e(encode_registration(cred.registration))
    fresh = b64e(encode_registration(make_registration(new_signing_key(rng.randbytes(32)), 1, int(time.time()), 3600)))
    bodies: list[tuple[str, str, dict[str, str], Any]] = [
        ("POST", "/v1/devices", {}, {"registration": fresh, "tokens": 5}),
        ("POST", f"/v1/devices/{did}/registration", auth, {"registration": reg_b64}),
        ("POST", f"/v1/devices/{did}/tokens", auth, {"count": 3}),
        ("GET", f"/v1/devices/{did}/messages?limit=5", auth, None),
        ("POST", f"/v1/devices/{did}/ack", auth, {"ids": ["00" * 16]}),
        ("POST", "/v1/push", {}, {"registration": reg_b64, "token": b64e(b"\x00" * 16),
                                  "ciphertext": b64e(b"x" * 80)}),
        ("GET", "/v1/push/" + "00" * 16, {}, None),
        ("GET", "/v1/status", {}, None),
        ("DELETE", f"/v1/devices/{'ab' * 16}", auth, None),
        ("GET", "/openapi.json", {}, None),
    ]
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=10) as client:
        failed_before = await _server_failures(client, api)
        for i in range(cases):
            method, path, headers, body = bodies[i % len(bodies)]
            op = rng.randrange(10)
            content: bytes | None = None
            hdrs = dict(headers)
            if op <= 4 and body is not None:
                content = json.dumps(mutate_tree(rng, body), default=str).encode()
                hdrs["content-type"] = "application/json"
            elif op == 5:
                content = rng.randbytes(rng.choice((0, 10, 1000, 70_000)))
                if rng.random() < 0.3:  # deep nesting: json.loads raises RecursionError, not ValueError
                    content = rng.choice((b"[", b'{"a":')) * rng.choice((1000, 3000, 15000))
                hdrs["content-type"] = rng.choice(("application/json", "text/plain", "application/octet-stream"))
            elif op == 6:
                method = rng.choice(("PUT", "PATCH", "GET", "POST", "DELETE", "OPTIONS"))
            elif op == 7:
                path = mutate_bytes(rng, path.encode(), []).decode("latin-1")
                path = "/" + "".join(c for c in path if 33 <= ord(c) < 127 and c not in "#?")[:2000]
            elif op == 8:
                hdrs["authorization"] = rng.choice(("Bearer", "Bearer !", "Bearer " + "A" * 5000, "Basic abc",
                                                    "Bearer " + b64e(rng.randbytes(32))))
            else:
                hdrs["x-junk"] = "y" * rng.choice((10, 4000))
                if body is not None:
                    content = json.dumps(body).encode()
                    hdrs["content-type"] = "application/json"
            target = f"http {method} {path.split('?')[0][:40]}"
            report.cases["http"] += 1
            before = await _state(client, api)
            try:
                r = await client.request(method, api + path, content=content, headers=hdrs)
            except httpx.LocalProtocolError:
                report.outcomes["http: not sendable (client refused)"] += 1
                continue
            except httpx.HTTPError as exc:
                report.fail(target, f"transport error {type(exc).__name__}: {exc}", content or b"")
                continue
            if r.status_code >= 500:
                report.fail(target, f"answered {r.status_code}: {r.text[:200]}", content or b"")
                continue
            if r.status_code >= 400:
                try:
                    problem = r.json()
                    code = problem["code"]
                except (ValueError, KeyError, TypeError):
                    report.fail(target, f"{r.status_code} without a problem body: {r.text[:200]}", content or b"")
                    continue
                if not r.headers.get("content-type", "").startswith("application/problem+json"):
                    report.fail(target, f"{r.status_code} problem with content-type "
                                        f"{r.headers.get('content-type')}", content or b"")
                    continue
                after = await _state(client, api)
                if after != before:
                    report.fail(target, f"rejected ({r.status_code} {code}) but state changed {before} -> {after}",
                                content or b"")
                    continue
                report.outcomes[f"http: rejected {r.status_code} {code}"] += 1
            else:
                report.outcomes[f"http: accepted {r.status_code}"] += 1
        if (await client.get(api + "/healthz")).status_code != 200:
            report.fail("http", "relay not healthy after the campaign", b"")
        failed = await _server_failures(client, api)
        if failed != failed_before:  # an answer then a crash is invisible to the client (issue 41 item 9)
            report.fail("http", f"the HTTP server failed during the campaign: {failed_before} -> {failed} "
                                "(listener restarts, connection errors)", b"")
    report.seconds = time.perf_counter() - started
    return report


async def fuzz_quic(api: str, quic_addr: str, node_id: str, cases: int, seed: int = 1) -> Report:
    """Mutated frames over an authenticated QUIC link, and raw UDP garbage at the QUIC port.

    A link carries frames until the relay cuts it for its score (five undecodable frames: docs/
    protocol.md, Peer scoring): then the campaign comes back with a new node key. The relay must
    answer every undecodable frame with an error frame, never change its routes or custody for a
    rejected frame, and stay up.
    """
    import httpx
    import trio

    from inri.common.addr import parse_addr
    from inri.common.identity import NodeIdentity
    from inri.node.quic import ConnectError, LinkClosed, QuicEndpoint

    rng = random.Random(seed)
    report = Report()
    seeds = _samples()["codec.decode"]
    host, port = parse_addr(quic_addr)
    started = time.perf_counter()
    async with httpx.AsyncClient(timeout=10) as client, trio.open_nursery() as nursery:
        ep: QuicEndpoint | None = None
        link = None
        sent = 0
        while sent < cases:
            if link is None:
                ep = QuicEndpoint(NodeIdentity.generate(), idle_timeout_s=5)
                await ep.bind("127.0.0.1", 0)
                await nursery.start(ep.serve, None)
                try:
                    link = await ep.connect(quic_addr, expect_node_id=node_id)
                except ConnectError as exc:
                    report.fail("quic", f"relay refused a fresh peer: {exc}", b"")
                    break
            before = await _state(client, api)
            if rng.random() < 0.1:  # raw UDP garbage at the port (not a QUIC packet)
                sock = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_DGRAM)
                await sock.bind(("127.0.0.1", 0))
                await sock.sendto(rng.randbytes(rng.choice((1, 40, 1200, 1350))), (host, port))
                sock.close()
                report.cases["udp"] += 1
                report.outcomes["udp: ignored"] += 1
                sent += 1
                continue
            frame = _case(rng, "bytes", rng.choice(seeds), seeds)[: limits.MAX_FRAME_BYTES]
            report.cases["quic"] += 1
            sent += 1
            try:
                valid = decode(frame)
            except DecodeError:
                valid = None
            try:
                await link.send(frame)
                if valid is None:
                    with trio.fail_after(5):
                        reply = decode(await link.receive())
                        # The relay's own keepalives, hellos and peer exchanges may come first, and
                        # answers to an earlier decodable push (a receipt, or a route error such as
                        # `duplicate` for a push id it saw before), and the registrations it homes,
                        # which it announces to every link that comes up (rule G5).
                        while isinstance(reply, (Keepalive, PeerExchange, Hello, Receipt, ReceiptBatch,
                                                 RouteError, RegGossip)):
                            reply = decode(await link.receive())
                    if not isinstance(reply, ErrorFrame):
                        report.fail("quic", f"answered {type(reply).__name__}, not an error frame", frame)
                        continue
                    report.outcomes["quic: rejected with error frame"] += 1
                else:
                    report.outcomes[f"quic: decodable {type(valid).__name__}"] += 1
            except LinkClosed as exc:
                report.outcomes[f"quic: link cut ({exc})"] += 1
                link = None
            except trio.TooSlowError:
                report.fail("quic", "no error frame within 5 s", frame)
                link = None
            if valid is None and await _state(client, api) != before:
                report.fail("quic", "an undecodable frame changed the relay's state", frame)
        if (await client.get(api + "/healthz")).status_code != 200:
            report.fail("quic", "relay not healthy after the campaign", b"")
        nursery.cancel_scope.cancel()
    report.seconds = time.perf_counter() - started
    return report


def format_report(title: str, report: Report) -> str:
    """A human-readable summary."""
    lines = [f"{title}: {report.total:,} cases in {report.seconds:.1f} s "
             f"({report.total / report.seconds if report.seconds else 0:,.0f}/s), failures: "
             f"{sum(v for k, v in report.outcomes.items() if k.endswith('FAILED'))}"]
    for k, v in sorted(report.cases.items()):
        lines.append(f"  cases {k}: {v:,}")
    for k, v in sorted(report.outcomes.items()):
        lines.append(f"  {k}: {v:,}")
    lines += [f"  FAILURE {f}" for f in report.failures[:20]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__.split("\n")[0])
    parser.add_argument("--decoder-cases", type=int, default=10_000)
    parser.add_argument("--api", help="a running relay's API URL (give it a lab config)")
    parser.add_argument("--quic", help="its QUIC address host:port")
    parser.add_argument("--node-id", help="its node id (GET /healthz)")
    parser.add_argument("--live-cases", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=int.from_bytes(os.urandom(4), "big"))
    args = parser.parse_args(argv)
    print(f"seed {args.seed}")
    rep = fuzz_decoders(args.decoder_cases, args.seed)
    print(format_report("decoders", rep))
    bad = bool(rep.failures)
    if args.api:
        import trio

        http = trio.run(fuzz_http, args.api, args.live_cases, args.seed)
        print(format_report("http", http))
        bad |= bool(http.failures)
        if args.quic and args.node_id:
            quic = trio.run(fuzz_quic, args.api, args.quic, args.node_id, args.live_cases, args.seed)
            print(format_report("quic", quic))
            bad |= bool(quic.failures)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
