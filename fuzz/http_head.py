"""The HTTP front's request parser (inri/common/front/parse.py) against h11, as h11's fuzz/afl-server.py
fuzzes h11: every input is fed whole and byte by byte.

Invariant: `parse_head` either hands a request to h11 (`DEFER`, or `None`: more bytes, then h11 at the
end), or gives exactly h11's result (a `FastHead`: h11 parses the same method, target, headers and
body from the same bytes), or refuses it, and then an independent reading of the head (below, written
apart from the parser) says it is one of the refused cases (request smuggling, an oversize head). Fed
byte by byte (each call with the scan hint the connection passes), the first verdict that is not
`None` is the one the whole input gives (the same refusal class). A case fails on any other result, and
on any exception from the parser.

`python -m fuzz.http_head [CASES] [SEED]`; tests/test_fuzzing.py runs a short profile, `make bench` the
long one (benchmarks/bench_fuzzing.py).
"""

from __future__ import annotations

import random
import re
import sys
import time

import h11

from fuzz.campaign import Report, format_report, mutate_bytes
from inri.common.front.parse import DEFER, FastHead, Refusal, Verdict, head_ended, parse_head

MAX_HEAD = 1024  # small, so mutations reach the size refusal too
BODY_MAX = 64
TARGET = "front.parse_head"

SEEDS = [
    b"POST /v1/push HTTP/1.1\r\nHost: r.example\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n"
    b'{"a": "bc"}',
    b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\n\r\n",
    b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
    b"POST /d HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\nhi",
    b"GET /v1/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    b"GET /e HTTP/1.0\r\n\r\n",
    b"HEAD /f HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /g HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    b"POST /h HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
    b"GET /i HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
    b"GET /j HTTP/1.1\nHost: x\n\n",
    b"POST /k HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 3\r\n\r\nabc",
    b"GET /l?x=%20 HTTP/1.1\r\nhost:\tx \r\nX-Forwarded-For: 203.0.113.9, 10.0.0.1\r\n\r\n",
]


def _h11_request(data: bytes) -> tuple[h11.Request, bytes, bool] | str:
    """h11's request and body from data (complete: EndOfMessage seen), or why not (error / need data)."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    conn.receive_data(data)
    body = b""
    req = None
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                return (req, body, False) if req is not None else "need data"
            if isinstance(event, h11.Request):
                req = event
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                assert req is not None
                return req, body, True
            else:
                return f"event {event!r}"
    except h11.RemoteProtocolError as exc:
        return f"h11 refused: {exc}"


_LINE_END = re.compile(rb"\r?\n")


def refused_reading(data: bytes) -> str | None:
    """The head of data as h11 delimits it, read apart from the parser: why it must be refused, or None."""
    if data[:1] == b"\n":
        return "bare LF"
    m = re.search(rb"\n\r?\n", data)
    if m is None:
        return "head too large" if len(data) > MAX_HEAD else None
    head = data[:m.end()]
    crlf_end = data.find(b"\r\n\r\n")
    if re.search(rb"(?<!\r)\n", head):
        return "bare LF"
    if len(head) > MAX_HEAD or (crlf_end >= 0 and crlf_end + 4 > MAX_HEAD):
        return "head too large"
    lines = _LINE_END.split(head)[1:-2]
    if any(line[:1] in (b" ", b"\t") for line in lines):
        return "obs-fold"
    names = [line.split(b":", 1)[0].lower() for line in lines]
    lengths = [line for line, name in zip(lines, names, strict=True) if name == b"content-length"]
    if len(lengths) > 1 or any(b"," in line for line in lengths):
        return "Content-Length"
    if lengths and b"transfer-encoding" in names:
        return "Content-Length with Transfer-Encoding"
    return None


def _incremental(data: bytes) -> Verdict:
    """The first verdict that is not None, the bytes fed one at a time with the connection's scan hint."""
    for k in range(1, len(data) + 1):
        hint = max(0, k - 1 - 3)
        verdict = parse_head(data[:k], MAX_HEAD, BODY_MAX, hint)
        if head_ended(bytearray(data[:k]), MAX_HEAD, hint) != (verdict is not None):
            raise AssertionError(f"head_ended disagrees with parse_head ({verdict!r}) at byte {k}")
        if verdict is not None:
            return verdict
    return None


def check(data: bytes) -> str | None:
    """One input: None when the invariant holds, else what broke it."""
    whole = parse_head(data, MAX_HEAD, BODY_MAX)
    step = _incremental(data)
    if whole is not None and type(step) is not type(whole):
        return f"whole {whole!r} but byte by byte {step!r}"
    if isinstance(whole, FastHead) and step != whole:
        return f"whole {whole!r} but byte by byte {step!r}"
    why = refused_reading(data)
    if isinstance(whole, Refusal):
        return None if why is not None else f"refused ({whole.reason}) but the head reads as fine"
    if why is not None and whole is not None:
        return f"not refused ({whole!r}) but the head has {why}"
    if whole is None or whole is DEFER:
        return None  # h11's to parse
    assert isinstance(whole, FastHead)
    got = _h11_request(data)
    if isinstance(got, str):
        return f"fast path took it, h11 says {got}"
    req, body, complete = got
    if (req.method, req.target, req.http_version) != (whole.method, whole.target, b"1.1"):
        return f"request line differs: h11 {req.method!r} {req.target!r} {req.http_version!r}"
    if list(req.headers) != whole.headers:
        return f"headers differ: h11 {list(req.headers)!r}, fast {whole.headers!r}"
    fast_body = data[whole.body_start:whole.body_start + whole.length]
    if len(fast_body) == whole.length and (not complete or body != fast_body):
        return f"body differs: h11 {body!r} (complete {complete}), fast {fast_body!r}"
    return None


# Header lines the mutations insert: the framing and smuggling cases, and their near misses.
LINES = [b"Content-Length: 0", b"Content-Length: 5", b"content-length: 5, 5", b"Content-Length:05",
         b"Content-Length: 99999999999", b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip, chunked",
         b"Host: y", b"host:", b"Connection: close", b"Connection: keep-alive",
         b"Connection: Keep-Alive, Upgrade",
         b"Expect: 100-continue", b"Upgrade: websocket", b" folded", b"\tfolded", b"X: a\nY: b", b"X: \x00",
         b"X : y", b"X:y", b"X-Forwarded-For: 198.51.100.1", b"Forwarded: for=\"[2001:db8::1]:80\"",
         b"X: " + b"v" * 400]


def mutate_head(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    """A byte-level mutation, or a header line inserted or repeated; the head terminator kept half the time."""
    if rng.random() < 0.5:
        out = mutate_bytes(rng, data, pool)
    else:
        lines = data.split(b"\r\n")
        i = rng.randrange(1, max(2, len(lines)))
        line = rng.choice(LINES) if rng.random() < 0.7 else rng.choice(lines)
        lines[i:i] = [line] * rng.choice((1, 1, 1, 2, 40))
        out = b"\r\n".join(lines)
    if b"\r\n\r\n" not in out and rng.random() < 0.5:
        out += b"\r\n\r\n"
    return out


def fuzz_head_parser(cases: int, seed: int = 1) -> Report:
    """cases mutated inputs (and the seeds), each checked whole and byte by byte."""
    rng = random.Random(seed)
    report = Report()
    started = time.perf_counter()
    pool = list(SEEDS)
    for i in range(cases):
        data = SEEDS[i] if i < len(SEEDS) else mutate_head(rng, rng.choice(pool), pool)
        report.cases[TARGET] += 1
        try:
            problem = check(data)
        except Exception as exc:  # noqa: BLE001 - a parser that raises is what the fuzzer looks for
            problem = f"raised {type(exc).__name__}: {exc}"
        if problem is not None:
            report.fail(TARGET, problem, data)
            continue
        verdict = parse_head(data, MAX_HEAD, BODY_MAX)
        kind = ("need more" if verdict is None else "h11" if verdict is DEFER
                else f"refused {verdict.status}" if isinstance(verdict, Refusal) else "fast")
        report.outcomes[f"{TARGET}: {kind}"] += 1
        if len(pool) < 2000 and rng.random() < 0.05:
            pool.append(data)  # mutations of mutations reach further from the seeds
    report.seconds = time.perf_counter() - started
    return report


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    report = fuzz_head_parser(int(args[0]) if args else 20_000, int(args[1]) if len(args) > 1 else 1)
    print(format_report("HTTP head parser vs h11", report))
    return 1 if report.failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
