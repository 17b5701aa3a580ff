"""HTTP/1.1 request heads, parsed by a pure function: the front's fast path and its refusals.

`parse_head(buf, ...)` looks at the bytes a connection has received and returns what to do with them:
`None` (the head is not complete yet), a `FastHead` (a request the front serves itself), a
`Refusal` (answered with its status, then the connection closes) or `DEFER` (h11 parses this request,
from its first byte). It keeps no state between calls and does no I/O, so it is fuzzed as a function
(fuzz/http_head.py): every input, whole and byte by byte, either goes to h11 or gives exactly h11's
result, except for the refusals below.

Why hand-written (measured, issue 16 item 2): h11's event objects and state machine cost more than the
relay's push handler, so the common request is parsed here, on h11's own grammar (its request-line and
header-field expressions, h11/_abnf.py): HTTP/1.1, exactly one Host, a Content-Length body up to
`body_max` (or none), no Transfer-Encoding, Expect, Upgrade or Connection other than keep-alive, not
HEAD or CONNECT. Anything else goes to h11, so unusual input gets h11's answers.

Refused whatever the parser (request smuggling, RFC 9112 section 11.2): h11 is lenient where a proxy in
front may not be, so two parsers could see different requests in the same bytes. Refused with 400
(RFC 9112 sections 2.2, 5.2 and 6.3): a bare LF in a head (h11 accepts LF as a line end), obs-fold
(h11 unfolds continuation lines), more than one Content-Length or a list in one (h11 merges equal
values), Content-Length together with Transfer-Encoding (h11 lets chunked win). A head longer than
`max_head` is refused with 431 (h11 does so only while it is incomplete).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = ["DEFER", "FastHead", "Refusal", "Verdict", "head_ended", "parse_head"]

# h11's grammar (h11/_abnf.py: method and token, request-target, field-name, field-value), HTTP/1.1 only.
_REQUEST_LINE = re.compile(rb"([-!#$%&'*+.^_`|~0-9a-zA-Z]+) ([\x21-\x7e]+) HTTP/1\.1")
_HEADER = re.compile(rb"([-!#$%&'*+.^_`|~0-9a-zA-Z]+):[ \t]*((?:[^\x00\s]+(?:[ \t]+[^\x00\s]+)*)?)[ \t]*")
# Request and header lines parsed lately (clients repeat theirs on every request): request line ->
# (method, target), header line -> (lower-case name, value). Only lines the expressions match are kept;
# each table is cleared when it holds LINES_CACHED_MAX (a memo of a pure function: results never differ).
_REQUEST_LINES: dict[bytes, tuple[bytes, bytes]] = {}
_FIELDS: dict[bytes, tuple[bytes, bytes]] = {}
LINES_CACHED_MAX = 1024
# Request headers the fast path leaves to h11 (framing, upgrades, continue, close semantics).
_H11_HEADERS = frozenset((b"transfer-encoding", b"expect", b"upgrade", b"connection", b"content-length", b"host"))


@dataclass(frozen=True, slots=True)
class FastHead:
    """A request the front serves itself: its body is `length` bytes from `body_start`."""

    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]  # names in lower case, as h11 gives them
    length: int
    body_start: int


@dataclass(frozen=True, slots=True)
class Refusal:
    """Input refused: answered `status` with an empty body, then the connection closes."""

    status: int
    reason: str


class _Defer:
    """h11 parses this request (from the first byte of the buffer)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DEFER"


DEFER: Final = _Defer()
Verdict = FastHead | Refusal | _Defer | None

BARE_LF = Refusal(400, "bare LF in the request head")
OBS_FOLD = Refusal(400, "obsolete line folding in the request head")
CONTENT_LENGTHS = Refusal(400, "more than one Content-Length")
LENGTH_AND_CHUNKED = Refusal(400, "Content-Length with Transfer-Encoding")
HEAD_TOO_LARGE = Refusal(431, "request head too large")


def parse_head(buf: bytes, max_head: int, body_max: int, scan_from: int = 0) -> Verdict:
    """What to do with buf, the bytes received since the last request (see the module docstring).

    scan_from: where a head terminator may start, as a hint when buf grew from a shorter buffer that
    gave None (len(shorter) - 3 at most); the result is the same as with 0.
    """
    end = buf.find(b"\r\n\r\n", scan_from)
    if end < 0:
        if _bare_lf_end(buf, scan_from):
            return BARE_LF
        return HEAD_TOO_LARGE if len(buf) > max_head else None
    if end + 4 > max_head:
        return HEAD_TOO_LARGE
    lines = buf[:end].split(b"\r\n")
    request_line = _REQUEST_LINES.get(lines[0])
    if request_line is None:
        m = _REQUEST_LINE.fullmatch(lines[0])
        if m is None:
            return _slow(buf, end)
        request_line = m.group(1), m.group(2)
        if len(_REQUEST_LINES) >= LINES_CACHED_MAX:
            _REQUEST_LINES.clear()
        _REQUEST_LINES[lines[0]] = request_line
    method, target = request_line
    if method == b"HEAD" or method == b"CONNECT":
        return _slow(buf, end)
    headers: list[tuple[bytes, bytes]] = []
    hosts = 0
    length = -1
    for line in lines[1:]:
        field = _FIELDS.get(line)
        if field is None:
            h = _HEADER.fullmatch(line)
            if h is None:
                return _slow(buf, end)
            name, value = h.groups()
            field = name.lower(), value
            if len(_FIELDS) >= LINES_CACHED_MAX:
                _FIELDS.clear()
            _FIELDS[line] = field
        name, value = field
        if name in _H11_HEADERS:
            if name == b"host":
                hosts += 1
            elif name == b"content-length" and value.isdigit() and len(value) < 10 and length < 0:
                length = int(value)
            elif name != b"connection" or value.lower() != b"keep-alive":
                return _slow(buf, end)
        headers.append(field)
    if hosts != 1 or length > body_max:
        return _slow(buf, end)
    return FastHead(method, target, headers, max(length, 0), end + 4)


def head_ended(buf: bytes | bytearray, max_head: int, scan_from: int = 0) -> bool:
    """parse_head(buf, max_head, ...) would not be None (the same scan hint): for a connection that collects
    a head in pieces in a bytearray, so that it copies the bytes once, when they are complete."""
    return buf.find(b"\r\n\r\n", scan_from) >= 0 or _bare_lf_end(buf, scan_from) or len(buf) > max_head


def _bare_lf_end(buf: bytes | bytearray, scan_from: int) -> bool:
    """h11 ends a head at its first "\\n\\r?\\n" (or a leading LF): without a CRLF CRLF, such an end
    has a bare LF."""
    lo = max(0, scan_from - 1)
    return buf.find(b"\n\n", lo) >= 0 or buf.find(b"\n\r\n", lo) >= 0 or buf[:1] == b"\n"


def _slow(buf: bytes, end: int) -> Refusal | _Defer:
    """A complete head the fast path does not take: refused (smuggling), or h11's."""
    head = buf[:end + 4]
    if head.count(b"\n") != head.count(b"\r\n"):
        return BARE_LF
    lengths = 0
    chunked = False
    for line in head[:end].split(b"\r\n")[1:]:
        if line[:1] in (b" ", b"\t"):
            return OBS_FOLD
        name, _, value = line.partition(b":")
        name = name.lower()
        if name == b"content-length":
            lengths += 1
            if b"," in value:
                return CONTENT_LENGTHS
        elif name == b"transfer-encoding":
            chunked = True
    if lengths > 1:
        return CONTENT_LENGTHS
    if lengths and chunked:
        return LENGTH_AND_CHUNKED
    return DEFER
