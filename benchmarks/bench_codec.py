"""The wire codec on msgspec's typed decoder (inri.protocol.codec) against the hand-written one it replaced
(issue 38, item 6; docs/results/2026-11-29-msgspec-codec.md).

The hand-written codec is read from git history (`hand_written_codec`: the parent of the commit that
brought msgspec into codec.py). Per frame kind: median CPU time per call of encode (checked: it
re-decodes), encode_unchecked and decode, for A (the hand-written codec), A' (the same again: the A/A
run, which shows the noise) and B (the msgspec codec), interleaved round by round in one process so
that drift hits all three alike. Ratios
are B/A and A'/A (below 1: faster than A). "cold" decodes cycle through more distinct registrations
than the registration cache holds (gossip: every frame a new registration); the other kinds repeat one
registration (forwarded pushes), as a relay sees them. Also prints each module's line counts.

Usage: python benchmarks/bench_codec.py [--rounds R] [--min-ms MS]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from inri.protocol import codec as typed
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
    RouteError,
    RouteErrorReason,
    RouteSync,
    SyncedRoute,
    Urgency,
    WebPushMeta,
)

ROOT = Path(__file__).resolve().parent.parent
CODEC = "inri/protocol/codec.py"


def hand_written_codec() -> tuple[ModuleType, str] | str:
    """The hand-written codec as a module and its source (from the parent of the first commit whose codec.py imports
    msgspec), or why it cannot be had (no git, or a shallow clone without that commit)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True,
                              timeout=60).stdout

    try:
        adopted = git("log", "--reverse", "--format=%H", "-G", "^import msgspec$", "--", CODEC).split()
        source = git("show", f"{adopted[0]}^:{CODEC}") if adopted else ""
    except (OSError, subprocess.SubprocessError) as exc:
        return f"no git history of {CODEC}: {exc}"
    if "import msgspec" in source or not source:
        return f"no hand-written {CODEC} in this clone's history"
    module = ModuleType("hand_written_codec")
    exec(compile(source, f"{adopted[0][:12]}^:{CODEC}", "exec"), module.__dict__)  # our own history
    return module, source


def frames() -> dict[str, list[Message]]:
    """Frame kind -> the messages one call cycles through (one, or many for the cold cases)."""
    key = new_signing_key(b"\x09" * 32)
    reg = typed.make_registration(key, 7, 1_700_000_000, 3600, b"k" * 32)
    regs = [typed.make_registration(key, e, 1_700_000_000, 3600, b"k" * 32) for e in range(typed.REG_CACHE_MAX + 500)]
    rid = reg.route_id
    wp = WebPushMeta(b"e" * 16, b"a" * 16, 86400, Urgency.NORMAL, ContentEncoding.AES128GCM, None, 3)
    return {
        "push": [Push(b"p" * 16, rid, b"t" * 16, b"c" * 200, 120, 7, 0, 0, reg)],
        "push webpush": [Push(b"p" * 16, rid, b"\0" * 16, b"c" * 3000, 120, 7, 0, 0, reg, wp)],
        "push no reg": [Push(b"p" * 16, rid, b"t" * 16, b"c" * 200, 120, 7, 0, 0, None)],
        "reg_gossip": [RegGossip(reg, 120, 7)],
        "reg_gossip cold": [RegGossip(r, 120, 7) for r in regs],
        "receipt": [Receipt(b"p" * 16, ReceiptStatus.STORED, 7, b"s" * 64)],
        "receipt_batch 16": [ReceiptBatch(rid, tuple((bytes([i]) * 16, ReceiptStatus.STORED, 7) for i in range(16)),
                                          b"s" * 64)],
        "route_error": [RouteError(b"p" * 16, rid, RouteErrorReason.NO_ROUTE)],
        "keepalive": [Keepalive(123456789, False)],
        "hello": [Hello(L.PROTOCOL_VERSION, "n" * 64, "192.0.2.1:4433", ("sync",))],
        "peer_exchange 8": [PeerExchange(tuple(PeerInfo(f"{i:064x}", f"192.0.2.{i}:4433") for i in range(8)))],
        "error": [ErrorFrame(ErrorCode.MALFORMED, "expected 16 bytes")],
        "reg_announce 64": [RegAnnounce(tuple(Announcement(bytes([i]) * 16, i, 3, i % 3) for i in range(64)),
                                        (b"u" * 16,))],
        "route_sync 64": [RouteSync(tuple(SyncedRoute(bytes([i]) * 16, 3, 3600) for i in range(64)))],
    }


def refused() -> list[bytes]:
    """Frames a peer could send that are refused: a field out of range, a cut frame, a wrong version."""
    good = typed.encode(frames()["push"][0])
    bad_ttl = good.replace(bytes([0xCC, 120]), bytes([0xCC, 200]), 1)  # ttl 200 > MAX_TTL (uint8 form)
    bad_ttl = bad_ttl if bad_ttl != good else good[:-1]
    return [good[:-3], bytes([good[0], good[1], 9]) + good[3:], bad_ttl]


def per_call(fn: Callable[[Any], Any], items: list[Any], min_s: float) -> float:
    """CPU seconds of this process per call of fn over items (cycled), timed for at least min_s: CPU time,
    not wall time, so that other processes on a shared machine slow the figures less."""
    n = len(items)
    calls = 0
    started = time.process_time()
    while True:
        for i in range(max(n, 200)):
            fn(items[i % n])
        calls += max(n, 200)
        elapsed = time.process_time() - started
        if elapsed >= min_s:
            return elapsed / calls


def swallow(decode: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def call(data: bytes) -> Any:
        try:
            return decode(data)
        except ValueError:
            return None
    return call


def lines(source: str) -> tuple[int, int]:
    """(all lines, code lines: neither blank nor only a comment, docstrings counted as code)."""
    text = source.splitlines()
    return len(text), sum(1 for s in text if s.strip() and not s.strip().startswith("#"))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--min-ms", type=float, default=30.0)
    args = ap.parse_args(argv)
    got = hand_written_codec()
    if isinstance(got, str):
        print(f"skipped: {got}")
        return 0
    hand, hand_source = got
    impls: dict[str, ModuleType] = {"A": hand, "A'": hand, "B": typed}
    cases: list[tuple[str, str, dict[str, Callable[[Any], Any]], list[Any]]] = []
    for kind, msgs in frames().items():
        data = [hand.encode(m) for m in msgs]
        for m, d in zip(msgs, data, strict=True):
            assert typed.encode(m) == d and typed.decode(d) == hand.decode(d) == m, kind  # same bytes, same message
        if len(msgs) == 1:
            cases.append((kind, "encode", {k: v.encode for k, v in impls.items()}, msgs))
            cases.append((kind, "encode_unchecked", {k: v.encode_unchecked for k, v in impls.items()}, msgs))
        cases.append((kind, "decode", {k: v.decode for k, v in impls.items()}, data))
    cases.append(("refused", "decode", {k: swallow(v.decode) for k, v in impls.items()}, refused()))
    for d in refused():
        assert swallow(hand.decode)(d) is None and swallow(typed.decode)(d) is None
    reg_http = [hand.encode_registration(typed.make_registration(new_signing_key(b"\x09" * 32), 7, 0, 60))]
    cases.append(("registration (HTTP)", "decode", {k: v.decode_registration for k, v in impls.items()}, reg_http))

    times: dict[tuple[str, str, str], list[float]] = {}
    for r in range(args.rounds):
        for kind, op, fns, items in cases:
            order = list(fns) if r % 2 == 0 else list(reversed(fns))  # alternate who goes first
            for name in order:
                times.setdefault((kind, op, name), []).append(per_call(fns[name], items, args.min_ms / 1000))

    print(f"medians of {args.rounds} rounds, CPU microseconds per call; A hand-written, A' the same (A/A), B msgspec")
    print(f"{'frame':22} {'op':17} {'A':>8} {'A_':>8} {'B':>8} {'A_/A':>6} {'B/A':>6}")
    ratios: dict[str, list[float]] = {"encode": [], "encode_unchecked": [], "decode": []}
    aa: list[float] = []
    for kind, op, _fns, _items in cases:
        a, a2, b = (statistics.median(times[(kind, op, n)]) * 1e6 for n in ("A", "A'", "B"))
        ratios[op].append(b / a)
        aa.append(a2 / a)
        print(f"{kind:22} {op:17} {a:8.2f} {a2:8.2f} {b:8.2f} {a2 / a:6.2f} {b / a:6.2f}")
    geo = {op: statistics.geometric_mean(v) for op, v in ratios.items()}
    (hand_all, hand_code), (typed_all, typed_code) = lines(hand_source), lines(Path(typed.__file__).read_text())
    print("geometric mean B/A: " + ", ".join(f"{op} {g:.2f}" for op, g in geo.items())
          + f"; A'/A {statistics.geometric_mean(aa):.2f} (min {min(aa):.2f}, max {max(aa):.2f})")
    print(f"lines: hand-written {hand_all} ({hand_code} code), msgspec {typed_all} ({typed_code} code)")
    figures = [{"metric": f"{op} time msgspec/hand (geo mean)", "value": round(g, 3), "unit": "ratio"}
               for op, g in geo.items()]
    figures.append({"metric": "A/A ratio (geo mean)", "value": round(statistics.geometric_mean(aa), 3),
                    "unit": "ratio"})
    figures += [{"metric": "lines hand-written", "value": hand_all, "unit": "lines"},
                {"metric": "lines msgspec", "value": typed_all, "unit": "lines"}]
    print(json.dumps({"bench": "codec", "figures": figures}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
