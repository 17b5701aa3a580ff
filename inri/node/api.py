"""The relay's HTTP/WebSocket API (docs/api.md): a bare ASGI app served by hypercorn's trio worker.

Routing, body limits, problem+json and status counts come from `inri.common.http`, shared with the
bootstrap node (why no framework: see there). The router is a table of (method, path) -> handler,
and the OpenAPI document (inri/node/openapi.py) is checked against it by a test.

Every failure an app can see is an `application/problem+json` answer with a stable `code`; no input —
malformed JSON, wrong types, bad base64, oversized bodies, unknown ids — can raise out of a handler.
Bodies larger than their route's limit get 413 before they are read whole; each client address (/64
for IPv6) has a token bucket, and an empty one gets 429 with Retry-After.

Device endpoints never tell whether a route id is homed here: every relay learns every route id from
gossip, so "unknown device" versus "wrong secret" would name a device's home relay to anyone. Both
answer 401 `bad_credentials` after the same work (one indexed lookup, one keyed-hash comparison).
"""

from __future__ import annotations

import hmac
import json
import math
from collections.abc import Callable
from typing import Any

import structlog
import trio

from inri import __version__
from inri.common import b64url
from inri.common.b64url import b64e
from inri.common.http import (
    Problem,
    Receive,
    Request,
    Route,
    Router,
    Scope,
    Send,
    StatusCounts,
    metrics_answer,
    respond,
    respond_problem,
    serve_lifespan,
)
from inri.core.api import InjectOutcome
from inri.node.config import ApiSection, RelayConfig
from inri.node.metrics import relay_registry
from inri.node.openapi import openapi_document
from inri.node.ratelimit import RateLimiter, client_key
from inri.node.service import RegistrationError, RelayService
from inri.node.store import secret_hash
from inri.protocol import limits
from inri.protocol.codec import DecodeError, decode_registration

log = structlog.get_logger("inri.api")

WS_AUTH_TIMEOUT_S = 10.0
WS_PING_S = 20.0
WS_CLOSE_BAD_AUTH = 4401  # bad credentials, or no such device here (the same answer: see module docstring)
WS_CLOSE_GONE = 4404  # no such endpoint, or the device was unregistered while its stream was open
WS_CLOSE_RATE = 4429
MAX_ACK_IDS = 500
MAX_PULL = 1000  # messages per pull (the `limit` query parameter's range is 1..MAX_PULL)
# An ack of MAX_ACK_IDS ids is ~17.5 KB of compact JSON (35 bytes per id), over the general 16 KiB
# limit: the ack route reads up to 64 bytes per id, room for any whitespace a JSON encoder adds.
ACK_MAX_BODY_BYTES = 64 * MAX_ACK_IDS
SECRET_BYTES = 32
_DUMMY_HASH = secret_hash(bytes(SECRET_BYTES))  # compared against when there is no stored hash

TITLES = {
    "malformed_json": "Request body is not valid JSON",
    "invalid_field": "A field is missing or invalid",
    "too_large": "Request body too large",
    "bad_registration": "Registration refused",
    "already_registered": "Route key already registered",
    "not_newer": "Registration epoch is not newer",
    "bad_credentials": "Device credentials missing or wrong",
    "not_found": "Not found",
    "upgrade_required": "WebSocket endpoint",
    "rate_limited": "Too many requests",
    "overloaded": "Relay overloaded",
    "method_not_allowed": "Method not allowed",
    "internal": "Internal error",
}
UNLIMITED_PATHS = frozenset({"/healthz", "/metrics"})


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


def _parse_id(value: str, size: int) -> bytes | None:
    try:
        data = bytes.fromhex(value)
    except ValueError:
        return None
    return data if len(data) == size else None


def _bearer(req: Request) -> bytes | None:
    auth = req.header(b"authorization")
    if not auth or not auth.lower().startswith("bearer "):
        return None
    try:
        return b64d(auth[7:].strip(), "authorization", size=SECRET_BYTES)
    except Problem:
        return None


class RelayApi:
    """The ASGI application (create_app builds it)."""

    def __init__(
        self,
        service: RelayService,
        config: RelayConfig | None = None,
        neighbours: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.service = service
        self.config = config or RelayConfig()
        self.limits: ApiSection = self.config.api
        self.neighbours = neighbours or (lambda: [])
        self.rate = RateLimiter(self.limits.rate_per_s, self.limits.rate_burst)
        self.device_rate = RateLimiter(self.limits.device_rate_per_s, self.limits.device_rate_burst)
        self.token_rate = RateLimiter(self.limits.token_rate_per_s, self.limits.token_rate_burst)
        self.http_codes = StatusCounts()
        self.tarpitted = 0  # rate-limited requests waiting for their 429 (see ApiSection.tarpit_s)
        self.ws_open = 0
        body = self.limits.max_body_bytes
        dev = "/v1/devices/{device_id}"
        self.router = Router([
            Route("POST", "/v1/devices", self.register, body),
            Route("POST", dev + "/registration", self.refresh, body),
            Route("POST", dev + "/tokens", self.tokens, body),
            Route("DELETE", dev, self.unregister),
            Route("GET", dev + "/messages", self.messages),
            Route("POST", dev + "/ack", self.ack, max(body, ACK_MAX_BODY_BYTES)),
            Route("GET", dev + "/stream", self.stream_over_http),
            Route("POST", "/v1/push", self.push, body),
            Route("GET", "/v1/push/{push_id}", self.push_status),
            Route("GET", "/healthz", self.health),
            Route("GET", "/v1/status", self.status),
            Route("GET", "/metrics", self.metrics),
            Route("GET", "/openapi.json", self.openapi),
        ])
        self.ws_route = next(r for r in self.router.routes if r.handler == self.stream_over_http)
        self.registry = relay_registry(service, self)

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
            await respond_problem(send, self.http_codes, p, scope["path"], TITLES)
            return
        except Exception:  # never let a bug become a dropped connection without an answer
            log.exception("request failed", path=scope["path"], method=scope["method"])
            await respond_problem(send, self.http_codes, Problem(500, "internal", "internal error"), scope["path"],
                                  TITLES)
            return
        await respond(send, self.http_codes, status, payload)

    async def _dispatch(self, scope: Scope, receive: Receive) -> tuple[int, Any]:
        path = scope["path"]
        route, params = self.router.match(scope["method"], path)
        if path not in UNLIMITED_PATHS:
            wait = self.rate.take(client_key(scope))
            if wait:
                raise Problem(429, "rate_limited", "rate limit exceeded for this client",
                              retry_after=max(1, math.ceil(wait)))
        return await route.handler(Request(scope, receive, route.max_body), **params)

    # -- auth -------------------------------------------------------------------------------------

    def _authenticated(self, route_id: bytes | None, secret: bytes | None) -> bool:
        """True when secret is the device's; the same work whether or not route_id is homed here."""
        store = self.service.store
        homed = route_id is not None and store.is_home(route_id)
        if homed and secret is not None:
            assert route_id is not None
            return store.check_secret(route_id, secret)
        # No stored hash to compare with (not homed here, or no secret given): do the comparison anyway,
        # so the time to answer says nothing about where the device lives.
        hmac.compare_digest(_DUMMY_HASH, secret_hash(secret or bytes(SECRET_BYTES)))
        return False

    def _device(self, req: Request, device_id: str) -> bytes:
        route_id = _parse_id(device_id, limits.ROUTE_ID_BYTES)
        if route_id is None or not self._authenticated(route_id, _bearer(req)):
            raise Problem(401, "bad_credentials",
                          "missing or wrong device secret (Authorization: Bearer ...), or no such device here")
        return route_id

    def _registration(self, body: dict[str, Any]) -> Any:
        raw = b64d(body.get("registration"), "registration", max_size=1024)
        try:
            return decode_registration(raw)
        except DecodeError as exc:
            raise Problem(400, "bad_registration", f"registration: {exc.detail}") from None

    # -- handlers ---------------------------------------------------------------------------------

    async def register(self, req: Request) -> tuple[int, Any]:
        body = await req.json()
        reg = self._registration(body)
        n = _int_field(body, "tokens", self.limits.tokens_default, 1, self.limits.tokens_max)
        try:
            secret, tokens = self.service.register_device(reg, n)
        except RegistrationError as exc:
            raise Problem(409 if exc.code == "already_registered" else 400, exc.code, exc.detail) from None
        return 201, {"device_id": reg.route_id.hex(), "device_secret": b64e(secret),
                     "tokens": [b64e(t) for t in tokens], "relay": self.service.node_id,
                     "expires_at": reg.expires_at}

    async def refresh(self, req: Request, device_id: str) -> tuple[int, Any]:
        route_id = self._device(req, device_id)
        body = await req.json()
        reg = self._registration(body)
        if reg.route_id != route_id:
            raise Problem(400, "bad_registration", "registration is for another route key")
        try:
            self.service.refresh_registration(reg)
        except RegistrationError as exc:
            raise Problem(400, exc.code, exc.detail) from None
        return 200, {"device_id": device_id, "epoch": reg.epoch, "expires_at": reg.expires_at}

    async def tokens(self, req: Request, device_id: str) -> tuple[int, Any]:
        route_id = self._device(req, device_id)
        body = await req.json(optional=True)
        n = _int_field(body, "count", self.limits.tokens_default, 1, self.limits.tokens_max)
        return 200, {"tokens": [b64e(t) for t in self.service.add_tokens(route_id, n)]}

    async def unregister(self, req: Request, device_id: str) -> tuple[int, Any]:
        route_id = self._device(req, device_id)
        self.service.unregister(route_id)
        return 204, None

    async def messages(self, req: Request, device_id: str) -> tuple[int, Any]:
        route_id = self._device(req, device_id)
        try:
            limit = int(req.query().get("limit", "100"))
        except ValueError:
            limit = -1
        if not 1 <= limit <= MAX_PULL:
            raise Problem(422, "invalid_field", f"limit: expected an integer in 1..{MAX_PULL}")
        msgs = self.service.pending(route_id, limit)
        return 200, {"messages": [{"id": p.hex(), "ciphertext": b64e(c), "received_at": t} for p, c, t in msgs]}

    def _ids(self, value: object) -> list[bytes]:
        if not isinstance(value, list) or len(value) > MAX_ACK_IDS:
            raise Problem(422, "invalid_field", f"ids: expected a list of at most {MAX_ACK_IDS} push ids")
        out = []
        for v in value:
            b = _parse_id(v, limits.PUSH_ID_BYTES) if isinstance(v, str) else None
            if b is None:
                raise Problem(422, "invalid_field", "ids: each id is a 32-character hex push id")
            out.append(b)
        return out

    async def ack(self, req: Request, device_id: str) -> tuple[int, Any]:
        route_id = self._device(req, device_id)
        body = await req.json()
        return 200, {"deleted": self.service.ack(route_id, self._ids(body.get("ids")))}

    async def stream_over_http(self, req: Request, device_id: str) -> tuple[int, Any]:
        raise Problem(426, "upgrade_required", "this endpoint is a WebSocket (docs/api.md, Live stream)",
                      headers=[(b"upgrade", b"websocket")])

    async def push(self, req: Request) -> tuple[int, Any]:
        body = await req.json()
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

    async def push_status(self, req: Request, push_id: str) -> tuple[int, Any]:
        pid = _parse_id(push_id, limits.PUSH_ID_BYTES)
        status = None if pid is None else self.service.push_status(pid)
        if status is None:
            raise Problem(404, "not_found", "no push with this id was accepted by this relay")
        return 200, status

    async def health(self, req: Request) -> tuple[int, Any]:
        return 200, {"status": "ok", "node_id": self.service.node_id}

    async def status(self, req: Request) -> tuple[int, Any]:
        return 200, {**self.service.status(), "version": __version__, "neighbours": self.neighbours(),
                     "websockets": self.ws_open}

    async def metrics(self, req: Request) -> tuple[int, Any]:
        return 200, metrics_answer(self.registry)

    async def openapi(self, req: Request) -> tuple[int, Any]:
        return 200, openapi_document(__version__, self.body_limits())

    def body_limits(self) -> dict[str, int]:
        """'METHOD /path/{param}' -> largest body read, for every route that reads one."""
        return {f"{r.method} {r.template}": r.max_body for r in self.router.routes if r.max_body}

    # -- WebSocket stream -------------------------------------------------------------------------

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        match = self.ws_route.pattern.fullmatch(scope["path"])
        first = await receive()
        if first["type"] != "websocket.connect":
            return
        if match is None:
            await send({"type": "websocket.close", "code": WS_CLOSE_GONE})
            return
        if self.rate.take(client_key(scope)):
            await send({"type": "websocket.close", "code": WS_CLOSE_RATE})
            return
        route_id = _parse_id(match["device_id"], limits.ROUTE_ID_BYTES)
        secret = _bearer(Request(scope, receive, 0))
        await send({"type": "websocket.accept"})
        if secret is None:
            # Browsers cannot set headers on a WebSocket: the first text frame may carry the secret.
            with trio.move_on_after(WS_AUTH_TIMEOUT_S):
                msg = await receive()
                if msg["type"] == "websocket.receive" and msg.get("text"):
                    try:
                        auth = json.loads(msg["text"]).get("auth")
                        secret = b64d(auth, "auth", size=SECRET_BYTES)
                    except (ValueError, AttributeError, RecursionError, Problem):
                        secret = None
        if route_id is None or not self._authenticated(route_id, secret):
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
        service = self.service
        while True:
            # Take the wake-up event *before* reading the mailbox: a message delivered while we are
            # sending the ones read below sets this event, so the wait at the bottom returns at once.
            # (Taken after, such a delivery set an event nobody waited on, and the stream went quiet
            # until the next ping: issue 13, item 0.)
            mail = service.mail_event(route_id)
            for pid, ct, t in service.pending(route_id, MAX_PULL):
                if pid not in sent:
                    sent.add(pid)
                    await send({"type": "websocket.send", "text": json.dumps(
                        {"type": "message", "id": pid.hex(), "ciphertext": b64e(ct), "received_at": t})})
            if not service.store.is_home(route_id):
                await send({"type": "websocket.close", "code": WS_CLOSE_GONE})
                return
            with trio.move_on_after(WS_PING_S) as scope:
                await mail.wait()
            if scope.cancelled_caught:
                await send({"type": "websocket.send", "text": '{"type":"ping"}'})
            if len(sent) > 10_000:
                live = {p for p, _, _ in service.pending(route_id, 10_000)}
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


def create_app(
    service: RelayService,
    *,
    config: RelayConfig | None = None,
    neighbours: Callable[[], list[dict[str, Any]]] | None = None,
) -> RelayApi:
    """The relay's ASGI app over a running RelayService."""
    return RelayApi(service, config, neighbours)
