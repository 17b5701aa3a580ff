"""The relay's HTTP/WebSocket API (docs/api.md): a bare ASGI app served by hypercorn's trio worker.

A bare ASGI app rather than a framework: the push path is the hot one, and GUIDE.md section 5 measured
~30% more CPU per request for FastAPI. The router is a table of (method, pattern) -> handler.

Every failure is an `application/problem+json` answer with a stable `code`; no input — malformed
JSON, wrong types, bad base64, oversized bodies, unknown ids — can raise out of a handler. Bodies
larger than the limit get 413 before they are read whole; each client address (/64 for IPv6) has a
token bucket, and an empty one gets 429 with Retry-After.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

import structlog
import trio

from inri import __version__
from inri.common import b64url
from inri.common.b64url import b64e
from inri.core.api import InjectOutcome
from inri.node.asgi import serve_lifespan
from inri.node.config import ApiSection, RelayConfig
from inri.node.metrics import render_metrics
from inri.node.openapi import openapi_document
from inri.node.ratelimit import RateLimiter, client_key
from inri.node.service import RegistrationError, RelayService
from inri.protocol import limits
from inri.protocol.codec import DecodeError, decode_registration

log = structlog.get_logger("inri.api")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

PROBLEM_BASE = "https://inri.dev/problems/"
WS_AUTH_TIMEOUT_S = 10.0
WS_PING_S = 20.0
WS_CLOSE_BAD_AUTH = 4401
WS_CLOSE_GONE = 4404
MAX_ACK_IDS = 500

TITLES = {
    "malformed_json": "Request body is not valid JSON",
    "invalid_field": "A field is missing or invalid",
    "too_large": "Request body too large",
    "bad_registration": "Registration refused",
    "already_registered": "Route key already registered",
    "not_newer": "Registration epoch is not newer",
    "unknown_device": "No such device",
    "bad_credentials": "Device credentials missing or wrong",
    "not_found": "Not found",
    "rate_limited": "Too many requests",
    "overloaded": "Relay overloaded",
    "method_not_allowed": "Method not allowed",
    "internal": "Internal error",
}


class Problem(Exception):
    """An error answer: HTTP status, stable code, human detail, optional Retry-After seconds."""

    def __init__(self, status: int, code: str, detail: str = "", retry_after: int | None = None) -> None:
        super().__init__(detail or code)
        self.status = status
        self.code = code
        self.detail = detail or TITLES.get(code, code)
        self.retry_after = retry_after


def b64d(value: object, field: str, *, size: int | None = None, max_size: int | None = None) -> bytes:
    """Strict base64url (inri.common.b64url) -> bytes, or Problem(422 invalid_field)."""
    try:
        return b64url.b64d(value, field, size, max_size=max_size)
    except ValueError as exc:
        raise Problem(422, "invalid_field", str(exc)) from None


def _int_field(body: dict[str, Any], field: str, default: int, lo: int, hi: int) -> int:
    value = body.get(field, default)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise Problem(422, "invalid_field", f"{field}: expected an integer in {lo}..{hi}")
    return value


def _hex_id(value: str, field: str, size: int) -> bytes:
    try:
        data = bytes.fromhex(value)
    except ValueError:
        data = b""
    if len(data) != size:
        raise Problem(404, "not_found" if field == "push_id" else "unknown_device", f"{field}: no such id")
    return data


class RelayApi:
    """The ASGI application (create_app builds it)."""

    def __init__(
        self,
        service: RelayService,
        config: RelayConfig | None = None,
        neighbours: Callable[[], list[dict[str, Any]]] | None = None,
        extra_metrics: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.service = service
        self.config = config or RelayConfig()
        self.limits: ApiSection = self.config.api
        self.neighbours = neighbours or (lambda: [])
        self.extra_metrics = extra_metrics or (lambda: {})
        self.rate = RateLimiter(self.limits.rate_per_s, self.limits.rate_burst)
        self.device_rate = RateLimiter(self.limits.device_rate_per_s, self.limits.device_rate_burst)
        self.token_rate = RateLimiter(self.limits.token_rate_per_s, self.limits.token_rate_burst)
        self.http_codes: dict[int, int] = {}
        self.tarpitted = 0  # rate-limited requests waiting for their 429 (see ApiSection.tarpit_s)
        self.ws_open = 0
        rid = r"(?P<rid>[^/]+)"
        self.routes: list[tuple[str, re.Pattern[str], Callable[..., Awaitable[tuple[int, Any]]]]] = [
            ("POST", re.compile(r"/v1/devices"), self.register),
            ("POST", re.compile(rf"/v1/devices/{rid}/registration"), self.refresh),
            ("POST", re.compile(rf"/v1/devices/{rid}/tokens"), self.tokens),
            ("DELETE", re.compile(rf"/v1/devices/{rid}"), self.unregister),
            ("GET", re.compile(rf"/v1/devices/{rid}/messages"), self.messages),
            ("POST", re.compile(rf"/v1/devices/{rid}/ack"), self.ack),
            ("POST", re.compile(r"/v1/push"), self.push),
            ("GET", re.compile(r"/v1/push/(?P<pid>[^/]+)"), self.push_status),
            ("GET", re.compile(r"/healthz"), self.health),
            ("GET", re.compile(r"/v1/status"), self.status),
            ("GET", re.compile(r"/metrics"), self.metrics),
            ("GET", re.compile(r"/openapi.json"), self.openapi),
        ]
        self.ws_route = re.compile(rf"/v1/devices/{rid}/stream")

    # -- ASGI plumbing ----------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        elif kind == "lifespan":
            await serve_lifespan(receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            status, payload = await self._dispatch(scope, receive)
        except Problem as p:
            if p.status == 429 and self.limits.tarpit_s > 0 and self.tarpitted < self.limits.tarpit_max:
                self.tarpitted += 1
                try:
                    await trio.sleep(min(self.limits.tarpit_s, float(p.retry_after or 1)))
                finally:
                    self.tarpitted -= 1
            await self._problem(send, p, scope["path"])
            return
        except Exception:  # never let a bug become a dropped connection without an answer
            log.exception("request failed", path=scope["path"], method=scope["method"])
            await self._problem(send, Problem(500, "internal", "internal error"), scope["path"])
            return
        await self._respond(send, status, payload)

    async def _dispatch(self, scope: Scope, receive: Receive) -> tuple[int, Any]:
        path, method = scope["path"], scope["method"]
        allowed = []
        for m, pattern, handler in self.routes:
            match = pattern.fullmatch(path)
            if match is None:
                continue
            if m != method:
                allowed.append(m)
                continue
            if path not in ("/healthz", "/metrics"):
                wait = self.rate.take(client_key(scope))
                if wait:
                    raise Problem(429, "rate_limited", "rate limit exceeded for this client",
                                  retry_after=max(1, math.ceil(wait)))
            ctx = _Request(scope, receive, self.limits.max_body_bytes)
            return await handler(ctx, **match.groupdict())
        if allowed:
            raise Problem(405, "method_not_allowed", f"{method} not allowed here; use {', '.join(allowed)}")
        raise Problem(404, "not_found", f"no endpoint {path}")

    async def _respond(self, send: Send, status: int, payload: Any, headers: list | None = None) -> None:
        self.http_codes[status] = self.http_codes.get(status, 0) + 1
        if isinstance(payload, str):
            body = payload.encode()
            ctype = b"text/plain; version=0.0.4; charset=utf-8"
        elif payload is None:
            body, ctype = b"", b"application/json"
        else:
            body = json.dumps(payload, separators=(",", ":")).encode()
            ctype = b"application/json"
        hdrs = [(b"content-type", ctype), (b"content-length", str(len(body)).encode()), *(headers or [])]
        await send({"type": "http.response.start", "status": status, "headers": hdrs})
        await send({"type": "http.response.body", "body": body})

    async def _problem(self, send: Send, p: Problem, path: str) -> None:
        self.http_codes[p.status] = self.http_codes.get(p.status, 0) + 1
        body = json.dumps({"type": PROBLEM_BASE + p.code, "title": TITLES.get(p.code, p.code), "status": p.status,
                           "detail": p.detail, "code": p.code, "instance": path}).encode()
        hdrs = [(b"content-type", b"application/problem+json"), (b"content-length", str(len(body)).encode())]
        if p.retry_after is not None:
            hdrs.append((b"retry-after", str(p.retry_after).encode()))
        if p.status == 413:
            hdrs.append((b"connection", b"close"))  # we did not read the rest of the body
        await send({"type": "http.response.start", "status": p.status, "headers": hdrs})
        await send({"type": "http.response.body", "body": body})

    # -- auth -------------------------------------------------------------------------------------

    def _device(self, ctx: _Request, rid: str) -> bytes:
        route_id = _hex_id(rid, "device_id", limits.ROUTE_ID_BYTES)
        secret = ctx.bearer()
        if not self.service.store.is_home(route_id):
            raise Problem(404, "unknown_device", "no device with this id is registered here")
        if secret is None or not self.service.store.check_secret(route_id, secret):
            raise Problem(401, "bad_credentials", "missing or wrong device secret (Authorization: Bearer ...)")
        return route_id

    def _registration(self, body: dict[str, Any]) -> Any:
        raw = b64d(body.get("registration"), "registration", max_size=1024)
        try:
            return decode_registration(raw)
        except DecodeError as exc:
            raise Problem(400, "bad_registration", f"registration: {exc.detail}") from None

    # -- handlers ---------------------------------------------------------------------------------

    async def register(self, ctx: _Request) -> tuple[int, Any]:
        body = await ctx.json()
        reg = self._registration(body)
        n = _int_field(body, "tokens", self.limits.tokens_default, 1, self.limits.tokens_max)
        try:
            secret, tokens = self.service.register_device(reg, n)
        except RegistrationError as exc:
            raise Problem(409 if exc.code == "already_registered" else 400, exc.code, exc.detail) from None
        return 201, {"device_id": reg.route_id.hex(), "device_secret": b64e(secret),
                     "tokens": [b64e(t) for t in tokens], "relay": self.service.node_id,
                     "expires_at": reg.expires_at}

    async def refresh(self, ctx: _Request, rid: str) -> tuple[int, Any]:
        route_id = self._device(ctx, rid)
        body = await ctx.json()
        reg = self._registration(body)
        if reg.route_id != route_id:
            raise Problem(400, "bad_registration", "registration is for another route key")
        try:
            self.service.refresh_registration(reg)
        except RegistrationError as exc:
            raise Problem(400, exc.code, exc.detail) from None
        return 200, {"device_id": rid, "epoch": reg.epoch, "expires_at": reg.expires_at}

    async def tokens(self, ctx: _Request, rid: str) -> tuple[int, Any]:
        route_id = self._device(ctx, rid)
        body = await ctx.json(optional=True)
        n = _int_field(body, "count", self.limits.tokens_default, 1, self.limits.tokens_max)
        return 200, {"tokens": [b64e(t) for t in self.service.add_tokens(route_id, n)]}

    async def unregister(self, ctx: _Request, rid: str) -> tuple[int, Any]:
        route_id = self._device(ctx, rid)
        self.service.unregister(route_id)
        return 204, None

    async def messages(self, ctx: _Request, rid: str) -> tuple[int, Any]:
        route_id = self._device(ctx, rid)
        try:
            limit = int(ctx.query().get("limit", "100"))
        except ValueError:
            limit = -1
        if not 1 <= limit <= 1000:
            raise Problem(422, "invalid_field", "limit: expected an integer in 1..1000")
        msgs = self.service.pending(route_id, limit)
        return 200, {"messages": [{"id": p.hex(), "ciphertext": b64e(c), "received_at": t} for p, c, t in msgs]}

    def _ids(self, value: object) -> list[bytes]:
        if not isinstance(value, list) or len(value) > MAX_ACK_IDS:
            raise Problem(422, "invalid_field", f"ids: expected a list of at most {MAX_ACK_IDS} push ids")
        out = []
        for v in value:
            try:
                b = bytes.fromhex(v) if isinstance(v, str) else b""
            except ValueError:
                b = b""
            if len(b) != limits.PUSH_ID_BYTES:
                raise Problem(422, "invalid_field", "ids: each id is a 32-character hex push id")
            out.append(b)
        return out

    async def ack(self, ctx: _Request, rid: str) -> tuple[int, Any]:
        route_id = self._device(ctx, rid)
        body = await ctx.json()
        return 200, {"deleted": self.service.ack(route_id, self._ids(body.get("ids")))}

    async def push(self, ctx: _Request) -> tuple[int, Any]:
        body = await ctx.json()
        reg = self._registration(body)
        token = b64d(body.get("token"), "token", size=limits.TOKEN_BYTES)
        ciphertext = b64d(body.get("ciphertext"), "ciphertext", max_size=limits.MAX_CIPHERTEXT_BYTES)
        for limiter, key, what in ((self.token_rate, token.hex(), "this token"),
                                   (self.device_rate, reg.route_id.hex(), "this device")):
            wait = limiter.take(key)
            if wait:
                raise Problem(429, "rate_limited", f"too many pushes for {what} at this relay",
                              retry_after=max(1, math.ceil(wait)))
        result = self.service.inject_push(reg, token, ciphertext)
        if result.outcome == InjectOutcome.ACCEPTED:
            assert result.push_id is not None
            return 202, {"push_id": result.push_id.hex(), "status": "pending"}
        if result.outcome == InjectOutcome.OVERLOADED:
            raise Problem(503, "overloaded", "custody table full; retry later", retry_after=5)
        if result.outcome == InjectOutcome.TOKEN_MISMATCH:
            raise Problem(422, "invalid_field", "token or ciphertext malformed")
        raise Problem(400, "bad_registration", "the push credential's registration does not verify or has expired")

    async def push_status(self, ctx: _Request, pid: str) -> tuple[int, Any]:
        status = self.service.push_status(_hex_id(pid, "push_id", limits.PUSH_ID_BYTES))
        if status is None:
            raise Problem(404, "not_found", "no push with this id was accepted by this relay")
        return 200, status

    async def health(self, ctx: _Request) -> tuple[int, Any]:
        return 200, {"status": "ok", "node_id": self.service.node_id}

    async def status(self, ctx: _Request) -> tuple[int, Any]:
        return 200, {**self.service.status(), "version": __version__, "neighbours": self.neighbours(),
                     "websockets": self.ws_open}

    async def metrics(self, ctx: _Request) -> tuple[int, Any]:
        return 200, render_metrics(self.service, self, self.extra_metrics())

    async def openapi(self, ctx: _Request) -> tuple[int, Any]:
        return 200, openapi_document(__version__)

    # -- WebSocket stream -------------------------------------------------------------------------

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = self.ws_route.fullmatch(scope["path"])
        first = await receive()
        if first["type"] != "websocket.connect":
            return
        if match is None:
            await send({"type": "websocket.close", "code": 4404})
            return
        if self.rate.take(client_key(scope)):
            await send({"type": "websocket.close", "code": 4429})
            return
        try:
            route_id = _hex_id(match["rid"], "device_id", limits.ROUTE_ID_BYTES)
        except Problem:
            await send({"type": "websocket.close", "code": WS_CLOSE_GONE})
            return
        ctx = _Request(scope, receive, 0)
        secret = ctx.bearer()
        await send({"type": "websocket.accept"})
        if secret is None:
            # Browsers cannot set headers on a WebSocket: the first text frame may carry the secret.
            with trio.move_on_after(WS_AUTH_TIMEOUT_S):
                msg = await receive()
                if msg["type"] == "websocket.receive" and msg.get("text"):
                    try:
                        auth = json.loads(msg["text"]).get("auth")
                        secret = b64d(auth, "auth", size=32)
                    except (ValueError, AttributeError, RecursionError, Problem):
                        secret = None
        store = self.service.store
        if secret is None or not store.is_home(route_id) or not store.check_secret(route_id, secret):
            await send({"type": "websocket.close", "code": WS_CLOSE_BAD_AUTH})
            return
        self.ws_open += 1
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._ws_reader, receive, send, route_id, nursery.cancel_scope)
                await self._ws_writer(send, route_id)
                nursery.cancel_scope.cancel()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away
        finally:
            self.ws_open -= 1

    async def _ws_writer(self, send: Send, route_id: bytes) -> None:
        sent: set[bytes] = set()
        store = self.service.store
        while True:
            for pid, ct, t in self.service.pending(route_id, 1000):
                if pid not in sent:
                    sent.add(pid)
                    await send({"type": "websocket.send", "text": json.dumps(
                        {"type": "message", "id": pid.hex(), "ciphertext": b64e(ct), "received_at": t})})
            if not store.is_home(route_id):
                await send({"type": "websocket.close", "code": WS_CLOSE_GONE})
                return
            with trio.move_on_after(WS_PING_S) as scope:
                await self.service.wait_for_mail(route_id)
            if scope.cancelled_caught:
                await send({"type": "websocket.send", "text": '{"type":"ping"}'})
            if len(sent) > 10_000:
                live = {p for p, _, _ in self.service.pending(route_id, 10_000)}
                sent &= live

    async def _ws_reader(self, receive: Receive, send: Send, route_id: bytes, scope: trio.CancelScope) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "websocket.disconnect":
                scope.cancel()
                return
            text = msg.get("text")
            if not text:
                continue
            try:
                data = json.loads(text)
                if isinstance(data, dict) and data.get("type") == "ack":
                    n = self.service.ack(route_id, self._ids(data.get("ids")))
                    await send({"type": "websocket.send", "text": json.dumps({"type": "acked", "deleted": n})})
            except (ValueError, RecursionError, Problem) as exc:
                detail = exc.detail if isinstance(exc, Problem) else "malformed JSON"
                await send({"type": "websocket.send", "text": json.dumps({"type": "error", "detail": detail})})


class _Request:
    """Request helpers: headers, query, bounded body reading, JSON parsing."""

    def __init__(self, scope: Scope, receive: Receive, max_body: int) -> None:
        self.scope = scope
        self._receive = receive
        self.max_body = max_body

    def header(self, name: bytes) -> str | None:
        for k, v in self.scope.get("headers", []):
            if k.lower() == name:
                return v.decode("latin-1")
        return None

    def bearer(self) -> bytes | None:
        auth = self.header(b"authorization")
        if not auth or not auth.lower().startswith("bearer "):
            return None
        try:
            return b64d(auth[7:].strip(), "authorization", size=32)
        except Problem:
            return None

    def query(self) -> dict[str, str]:
        qs = self.scope.get("query_string", b"").decode("latin-1")
        return dict(parse_qsl(qs))

    async def body(self) -> bytes:
        declared = self.header(b"content-length")
        if declared is not None:
            try:
                if int(declared) > self.max_body:
                    raise Problem(413, "too_large", f"request body over {self.max_body} bytes")
            except ValueError:
                raise Problem(400, "malformed_json", "bad Content-Length") from None
        chunks = []
        size = 0
        while True:
            msg = await self._receive()
            if msg["type"] == "http.disconnect":
                raise Problem(400, "malformed_json", "client disconnected")
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                raise Problem(413, "too_large", f"request body over {self.max_body} bytes")
            chunks.append(chunk)
            if not msg.get("more_body"):
                return b"".join(chunks)

    async def json(self, *, optional: bool = False) -> dict[str, Any]:
        raw = await self.body()
        if not raw.strip() and optional:
            return {}
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):  # deep nesting raises RecursionError
            raise Problem(400, "malformed_json", "request body is not valid JSON") from None
        if not isinstance(data, dict):
            raise Problem(422, "invalid_field", "request body must be a JSON object")
        return data


def create_app(
    service: RelayService,
    *,
    config: RelayConfig | None = None,
    neighbours: Callable[[], list[dict[str, Any]]] | None = None,
    extra_metrics: Callable[[], dict[str, int]] | None = None,
) -> RelayApi:
    """The relay's ASGI app over a running RelayService."""
    return RelayApi(service, config, neighbours, extra_metrics)
