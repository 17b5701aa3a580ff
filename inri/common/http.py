"""The small ASGI toolkit the relay API and the bootstrap node share (no framework on the hot path).

A bare ASGI app rather than Starlette/FastAPI: the relay's push path is the hot one, and FastAPI cost
~30% more CPU per request than a bare ASGI app when measured on this project's target machine kind
(2 cores, hypercorn's trio worker, which served the API then). What both apps need, and what lives here once:

- `Problem`: an error answer, rendered as RFC 9457 `application/problem+json` with a stable `code`;
- `Router`: a table of (method, path pattern) -> handler with a body limit per route; a known path with
  the wrong method is a 405 that carries `Allow`, an unknown path a 404;
- `Request`: headers, query, and a body read against the route's limit (413 before the rest is read);
- `respond` / `respond_problem`, which also count every answer by status (`StatusCounts`);
- `serve_lifespan` for the ASGI lifespan protocol, `metrics_answer` for the Prometheus exposition and
  `MetricsApp`, the app of a listener that serves only it (`[metrics] listen`).

What the HTTP front itself refuses (inri/common/front: HTTP/1.1 it cannot parse or that could be read
two ways: 400, heads over 16 KiB: 431, an unknown transfer coding: 501) never reaches an app: those
answers have an empty body (docs/api.md, Errors).
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

PROBLEM_BASE = "https://inri.dev/problems/"
PROBLEM_TYPE = "application/problem+json"
JSON_TYPE = "application/json"


class Problem(Exception):
    """An error answer: HTTP status, stable code, human detail, optional Retry-After and headers."""

    def __init__(self, status: int, code: str, detail: str = "", *, retry_after: int | None = None,
                 headers: Headers | None = None) -> None:
        super().__init__(detail or code)
        self.status = status
        self.code = code
        self.detail = detail or code
        self.retry_after = retry_after
        self.headers = headers or []


@dataclass(frozen=True)
class Raw:
    """A handler's answer that is not JSON: the body as it is, with its content type."""

    body: bytes
    content_type: str


Handler = Callable[..., Awaitable[tuple[int, Any]]]


@dataclass(frozen=True)
class Route:
    """One endpoint: method, path template (`{name}` segments), handler, largest body it reads."""

    method: str
    template: str
    handler: Handler
    max_body: int = 0
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        regex = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(self.template))
        object.__setattr__(self, "pattern", re.compile(regex))


class Router:
    """Match (method, path) to a route; 404 for an unknown path, 405 with `Allow` for a wrong method."""

    def __init__(self, routes: Iterable[Route]) -> None:
        self.routes = list(routes)
        # (method, path) of routes without parameters that no earlier route of that method matches:
        # the answer of the scan below, found without running every pattern (the push endpoint is hot).
        self._static: dict[tuple[str, str], Route] = {}
        for i, route in enumerate(self.routes):
            if "{" not in route.template and not any(r.method == route.method and r.pattern.fullmatch(route.template)
                                                     for r in self.routes[:i]):
                self._static.setdefault((route.method, route.template), route)

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        route = self._static.get((method, path))
        if route is not None:
            return route, {}
        allowed: list[str] = []
        for route in self.routes:
            m = route.pattern.fullmatch(path)
            if m is None:
                continue
            if route.method == method:
                return route, m.groupdict()
            allowed.append(route.method)
        if allowed:
            allow = ", ".join(sorted(set(allowed)))
            raise Problem(405, "method_not_allowed", f"{method} not allowed here; use {allow}",
                          headers=[(b"allow", allow.encode())])
        raise Problem(404, "not_found", f"no endpoint {path}")


class Request:
    """One HTTP request: headers, query, body bounded by max_body, JSON object parsing."""

    def __init__(self, scope: Scope, receive: Receive, max_body: int) -> None:
        self.scope = scope
        self._receive = receive
        self.max_body = max_body

    @property
    def path(self) -> str:
        return str(self.scope["path"])

    def header(self, name: bytes) -> str | None:
        """The first header called `name` (lower case), decoded as latin-1."""
        for k, v in self.scope.get("headers", []):
            if k.lower() == name:
                return bytes(v).decode("latin-1")
        return None

    def query(self) -> dict[str, str]:
        return dict(parse_qsl(self.scope.get("query_string", b"").decode("latin-1")))

    async def body(self, *, malformed: str = "malformed_json") -> bytes:
        """The whole body; Problem 413 as soon as it is known to exceed max_body (read no further)."""
        declared = self.header(b"content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                raise Problem(400, malformed, "bad Content-Length") from None
            if size > self.max_body:
                raise Problem(413, "too_large", f"request body over {self.max_body} bytes")
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await self._receive()
            if msg["type"] == "http.disconnect":
                raise Problem(400, malformed, "client disconnected")
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise Problem(413, "too_large", f"request body over {self.max_body} bytes")
            chunks.append(chunk)
            if not msg.get("more_body"):
                return b"".join(chunks)

    async def json(self, *, optional: bool = False) -> dict[str, Any]:
        """The body as a JSON object: 400 malformed_json, 422 invalid_field when not an object."""
        raw = await self.body()
        if optional and not raw.strip():
            return {}
        return json_object(raw)


def json_object(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object: Problem 400 malformed_json, 422 invalid_field when not an object."""
    try:
        # json.loads of bytes detects the encoding (UTF-8, -16 or -32) first: a body that opens
        # with two non-zero bytes is UTF-8 in that detection, decoded here as json.loads would.
        data = json.loads(raw.decode("utf-8", "surrogatepass") if raw[:1] == b"{" and raw[1:2] not in (b"", b"\0")
                          else raw)
    except (ValueError, UnicodeDecodeError, RecursionError):  # deep nesting raises RecursionError
        raise Problem(400, "malformed_json", "request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise Problem(422, "invalid_field", "request body must be a JSON object")
    return data


class StatusCounts(dict[int, int]):
    """HTTP answers by status code (exported as `<prefix>_http_responses_total{code}`)."""

    def add(self, status: int) -> None:
        self[status] = self.get(status, 0) + 1

    def metric(self, name: str) -> CounterMetricFamily:
        family = CounterMetricFamily(name, "HTTP responses by status code", labels=["code"])
        for code in sorted(self):
            family.add_metric([str(code)], self[code])
        return family


_compact = json.JSONEncoder(separators=(",", ":")).encode  # json.dumps(payload, separators=(",", ":"))
_CTYPES = {JSON_TYPE: JSON_TYPE.encode(), PROBLEM_TYPE: PROBLEM_TYPE.encode()}


async def respond(send: Send, counts: StatusCounts, status: int, payload: Any, *,
                  content_type: str = JSON_TYPE, headers: Headers | None = None) -> None:
    """Answer with payload: `Raw` as it is, None as an empty body, bytes as JSON already encoded,
    anything else as JSON."""
    counts[status] = counts.get(status, 0) + 1  # StatusCounts.add, inline (every answer)
    if type(payload) is bytes:
        body = payload
    elif isinstance(payload, Raw):
        body, content_type = payload.body, payload.content_type
    elif payload is None:
        body = b""
    else:
        body = _compact(payload).encode()
    ctype = _CTYPES.get(content_type)
    if ctype is None:
        ctype = content_type.encode()
    hdrs = [(b"content-type", ctype), (b"content-length", b"%d" % len(body))]
    if headers:
        hdrs += headers
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


def problem_body(problem: Problem, instance: str, titles: dict[str, str]) -> dict[str, Any]:
    """A Problem as its RFC 9457 object (type, title, status, detail, code, instance)."""
    return {"type": PROBLEM_BASE + problem.code, "title": titles.get(problem.code, problem.code),
            "status": problem.status, "detail": problem.detail, "code": problem.code, "instance": instance}


async def respond_problem(send: Send, counts: StatusCounts, problem: Problem, instance: str,
                          titles: dict[str, str]) -> None:
    """Answer a Problem as application/problem+json (type, title, status, detail, code, instance)."""
    body = problem_body(problem, instance, titles)
    hdrs = list(problem.headers)
    if problem.retry_after is not None:
        hdrs.append((b"retry-after", str(problem.retry_after).encode()))
    if problem.status == 413:
        hdrs.append((b"connection", b"close"))  # the rest of the body was not read
    await respond(send, counts, problem.status, body, content_type=PROBLEM_TYPE, headers=hdrs)


async def serve_lifespan(receive: Receive, send: Send) -> None:
    """Answer the ASGI lifespan protocol (nothing to start or stop) until shutdown."""
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class MetricsApp:
    """The ASGI app of a metrics listener (`[metrics] listen`): `GET /metrics` (registry) and nothing else;
    other paths 404, other methods 405, WebSockets refused. Answers count in counts, as the API's do."""

    def __init__(self, registry: CollectorRegistry, counts: StatusCounts, titles: dict[str, str]) -> None:
        self.registry = registry
        self.counts = counts
        self.titles = titles
        self.router = Router([Route("GET", "/metrics", self._metrics)])

    async def _metrics(self) -> tuple[int, Any]:
        return 200, metrics_answer(self.registry)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        match scope["type"]:
            case "http":
                try:
                    route, _ = self.router.match(scope["method"], scope["path"])
                    status, payload = await route.handler()
                except Problem as p:
                    await respond_problem(send, self.counts, p, scope["path"], self.titles)
                else:
                    await respond(send, self.counts, status, payload)
            case "websocket":
                await send({"type": "websocket.close", "code": 1008})
            case "lifespan":
                await serve_lifespan(receive, send)


def retry_after_seconds(value: str | None, cap: float = 3600.0) -> float | None:
    """A Retry-After header's delay-seconds (RFC 9110 section 10.2.3), at most cap; None when absent or a
    date (the wake-up gateway and the relay's wake hooks both read other servers' Retry-After)."""
    if value is None or not value.strip().isdigit():
        return None
    return min(float(int(value.strip()[:9])), cap)


def metrics_answer(registry: CollectorRegistry) -> Raw:
    """A Prometheus scrape of registry (text format 0.0.4), rendered by prometheus_client."""
    # 0.0.4, not the library's newer 1.0.0 label: every Prometheus 2.x scraper knows it, and with our
    # plain ASCII metric names the two formats are the same bytes.
    return Raw(generate_latest(registry), CONTENT_TYPE_PLAIN_0_0_4)
