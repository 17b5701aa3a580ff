"""The relay's HTTP/WebSocket API (docs/api.md): a bare ASGI app served by the HTTP front (inri/common/front).

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

import functools
import hashlib
import hmac
import json
import math
import os
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
import trio
from cryptography.hazmat.primitives.asymmetric import ec
from nacl.public import PublicKey, SealedBox

from inri import __version__
from inri.common import b64url
from inri.common.b64url import b64e
from inri.common.front import FrontStats
from inri.common.http import (
    Problem,
    Receive,
    Request,
    Route,
    Router,
    Scope,
    Send,
    StatusCounts,
    json_object,
    metrics_answer,
    problem_body,
    respond,
    respond_problem,
    serve_lifespan,
)
from inri.core.api import CustodyStatus, InjectOutcome
from inri.core.budget import KeyedBuckets
from inri.node.agents import Agents
from inri.node.config import ApiSection, RelayConfig
from inri.node.metrics import relay_registry
from inri.node.mozpush import SUBPROTOCOL, Limits
from inri.node.mozpush_ws import MOZPUSH_PATH, MozPushServer
from inri.node.openapi import openapi_document
from inri.node.ratelimit import RateLimiter, client_key, client_key_of
from inri.node.service import RegistrationError, RelayService
from inri.node.store import secret_hash
from inri.node.wake import Hook, HookError
from inri.node.wakepolicy import Owner, OwnerKind
from inri.node.webpush import (
    EndpointError,
    Headers,
    WebPushError,
    endpoint_url,
    frame_body,
    mint_endpoint,
    normalise_origin,
    open_endpoint,
    parse_headers,
    public_origins,
    vapid_credentials,
    verify_vapid,
)
from inri.protocol import limits
from inri.protocol.codec import DecodeError, decode_registration
from inri.protocol.messages import ContentEncoding, Registration, Urgency, WebPushMeta
from inri.protocol.wake import WAKE_TOKEN_MAX_BYTES
from inri.protocol.webpush import (
    ENCODING_NAME,
    URGENCY_NAME,
    VAPID_PREFIX_BYTES,
    EndpointToken,
    TokenVersion,
    push_tag,
    vapid_key_hash,
)

WebPushInfo = tuple[bytes, str | None, Urgency, ContentEncoding, float]  # ..., expires_at (wall clock)
WEBPUSH_RECEIPT_WAIT_S = 1.5  # how long a Web Push sender waits for the home's receipt (then 201 anyway)
NEGATIVE_CACHE_S = 600.0  # a 404/410 from home is answered here again for this long
NEGATIVE_CACHE_MAX = 100_000
MATRIX_MAX_DEVICES = 20  # pushkeys per Matrix notify (a homeserver sends one per pusher)
# The home relay's answer (custody status) -> (HTTP status, problem code); absent: 201.
WEBPUSH_ANSWERS: dict[str, tuple[int, str]] = {
    CustodyStatus.UNKNOWN_ENDPOINT: (404, "not_found"),
    CustodyStatus.GONE: (410, "gone"),
    CustodyStatus.RATE_LIMITED: (429, "rate_limited"),
    CustodyStatus.MAILBOX_FULL: (429, "mailbox_full"),
}

log = structlog.get_logger("inri.api")

WS_AUTH_TIMEOUT_S = 10.0
WS_PING_S = 20.0
WS_CLOSE_BAD_AUTH = 4401  # bad credentials, or no such device here (the same answer: see module docstring)
WS_CLOSE_GONE = 4404  # no such endpoint, or the device was unregistered while its stream was open
WS_CLOSE_RATE = 4429
MUX_STREAM_PATH = "/v1/stream"
MUX_MAX_DEVICES = 64  # route ids one multiplexed stream serves (one route key per app subscription)
MAX_ACK_IDS = 500
MAX_PULL = 1000  # messages per pull (the `limit` query parameter's range is 1..MAX_PULL)
# An ack of MAX_ACK_IDS ids is ~17.5 KB of compact JSON (35 bytes per id), over the general 16 KiB
# limit: the ack route reads up to 64 bytes per id, room for any whitespace a JSON encoder adds.
ACK_MAX_BODY_BYTES = 64 * MAX_ACK_IDS
SECRET_BYTES = 32
PUSH_BATCH_MAX = 100  # pushes per POST /v1/push/batch
DECODED_CACHE_MAX = 4096  # registrations kept decoded (RelayApi._decoded; the oldest goes first)
_DUMMY_HASH = secret_hash(bytes(SECRET_BYTES))  # compared against when there is no stored hash

TITLES = {
    "malformed_json": "Request body is not valid JSON",
    "invalid_field": "A field is missing or invalid",
    "too_large": "Request body too large",
    "bad_registration": "Registration refused",
    "unsupported_version": "Registration of another protocol version",
    "bad_receipt_key": "Receipt secret missing, unexpected or not the registration's",
    "already_registered": "Route key already registered",
    "not_newer": "Registration epoch is not newer",
    "bad_credentials": "Device credentials missing or wrong",
    "not_found": "Not found",
    "upgrade_required": "WebSocket endpoint",
    "rate_limited": "Too many requests",
    "overloaded": "Relay overloaded",
    "method_not_allowed": "Method not allowed",
    "internal": "Internal error",
    "too_many_endpoints": "Too many Web Push endpoints",
    "gone": "Web Push endpoint revoked or gone",
    "forbidden_key": "Endpoint restricted to another VAPID key",
    "bad_vapid": "VAPID authorization missing or invalid",
    "bad_ttl": "TTL header missing or invalid",
    "bad_urgency": "Urgency header invalid",
    "bad_topic": "Topic header invalid",
    "bad_encoding": "Content-Encoding or body framing invalid",
    "mailbox_full": "Device mailbox full",
    "forbidden_hook": "Wake hook address refused",
    "receipt_key_required": "Web Push endpoints need a registration with a receipt key",
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


def _message_json(pid: bytes, ct: bytes, t: float, wp: WebPushInfo | None) -> dict[str, Any]:
    """A mailbox message as pull and the stream show it; a Web Push one says so and carries its headers."""
    out: dict[str, Any] = {"id": pid.hex(), "ciphertext": b64e(ct), "received_at": t}
    if wp is not None:
        eid, topic, urgency, encoding, expires_at = wp
        # ttl: seconds the message has left (RFC 8030 5.2: counted from the entry relay's acceptance).
        out.update(kind="webpush", body=out["ciphertext"], encoding=ENCODING_NAME[encoding],
                   urgency=URGENCY_NAME[urgency], topic=topic, endpoint_id=eid.hex(),
                   ttl=max(0, math.floor(expires_at - time.time())))
        if encoding == ContentEncoding.SEALED:
            out["sealed"] = True  # the SDK opens it with the device's seal key
    return out


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
        self.front = FrontStats()  # the HTTP front serving this app counts here (inri_http_* metrics)
        self.tarpitted = 0  # rate-limited requests waiting for their 429 (see ApiSection.tarpit_s)
        self.ws_open = 0
        body = self.limits.max_body_bytes
        dev = "/v1/devices/{device_id}"
        self._push_max_body = body
        self.router = Router([
            Route("POST", "/v1/devices", self.register, body),
            Route("POST", dev + "/registration", self.refresh, body),
            Route("POST", dev + "/tokens", self.tokens, body),
            Route("DELETE", dev, self.unregister),
            Route("GET", dev + "/messages", self.messages),
            Route("POST", dev + "/ack", self.ack, max(body, ACK_MAX_BODY_BYTES)),
            Route("GET", dev + "/stream", self.stream_over_http),
            Route("GET", MUX_STREAM_PATH, self.mux_stream_over_http),
            Route("POST", dev + "/endpoints", self.mint_endpoint, body),
            Route("GET", dev + "/endpoints", self.list_endpoints),
            Route("DELETE", dev + "/endpoints/{endpoint_id}", self.revoke_endpoint),
            Route("PUT", dev + "/wake", self.set_wake, body),
            Route("GET", dev + "/wake", self.get_wake),
            Route("DELETE", dev + "/wake", self.delete_wake),
            Route("POST", "/v1/push", self.push, body),  # also fast_post (the HTTP front's shortcut)
            Route("POST", "/v1/push/batch", self.push_batch, body * PUSH_BATCH_MAX),
            Route("POST", "/wp/v1/{reg}/{endpoint}", self.webpush, limits.MAX_CIPHERTEXT_BYTES),
            Route("GET", "/_matrix/push/v1/notify", self.matrix_discovery),
            Route("POST", "/_matrix/push/v1/notify", self.matrix_notify, body),
            Route("GET", "/v1/push/{push_id}", self.push_status),
            Route("GET", MOZPUSH_PATH, self.mozpush_over_http),
            Route("GET", "/healthz", self.health),
            Route("GET", "/v1/status", self.status),
            *([] if self.config.metrics.listen else [Route("GET", "/metrics", self.metrics)]),  # else its listener
            Route("GET", "/openapi.json", self.openapi),
        ])
        wp = self.config.webpush
        self.wp_origins = public_origins(self.config)
        self.service.store.endpoint_limits = KeyedBuckets(wp.endpoint_rate_per_s, wp.endpoint_burst)
        self.wp_aud = frozenset(normalise_origin(o) for o in self.wp_origins)
        self.vapid_rate = RateLimiter(wp.vapid_rate_per_s, wp.vapid_burst)
        self.wp_endpoint_rate = RateLimiter(wp.endpoint_rate_per_s, wp.endpoint_burst)
        # Negative cache: hash(route id, endpoint id, cap) -> (404 or 410, until). Keyed with the
        # capability so a forged push (whose id travels in frames) cannot make a genuine endpoint 404.
        self.wp_gone: dict[bytes, tuple[int, float]] = {}
        self.wp_counts: dict[str, int] = {}  # inri_webpush_* counters
        self.streams: dict[bytes, int] = {}  # route id -> open streams (a TTL 0 Web Push is stored only then)
        self.ws_route = next(r for r in self.router.routes if r.handler == self.stream_over_http)
        # Mozilla Push (Firefox, Sunup): docs/browsers.md. Endpoints are minted as the device API mints them.
        mp = self.config.mozpush
        session_limits = Limits(mp.hello_timeout_s, mp.ping_min_interval_s, mp.channels_max, mp.inflight_max)
        self.agents = Agents(service, lambda rid, tok, key: endpoint_url(service.store, self.wp_origins[0], rid, tok),
                             session_limits=session_limits, registration_lifetime_s=mp.registration_lifetime_s,
                             agent_idle_max_s=mp.agent_idle_max_s, register_rate=self.rate)
        self.mozpush = MozPushServer(self.agents, session_limits, idle_timeout_s=mp.idle_timeout_s,
                                     connect_rate=self.rate)
        service.delivery_hooks.append(self.mozpush.delivered)
        self.service.store.stream_open = lambda rid: self.streams.get(rid, 0) > 0 or self.mozpush.connected_route(rid)
        self.registry = relay_registry(service, self)
        # Registrations as decoded from their base64url text (an app sends one push credential's
        # registration with every push of that device): decoded and validated once, then the same
        # (immutable) object, whose signature check the verifier then finds by identity.
        self._decoded: dict[str, Registration] = {}
        # Endpoint URLs' (R, E) texts whose token signature verified (a sender pushes to one URL many
        # times): opened once (open_endpoint: ~60 us, an Ed25519 check), then one dict lookup.
        self._opened: dict[tuple[str, str], tuple[Registration, EndpointToken]] = {}

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
        await self._answer(send, scope["path"], scope["method"], self._dispatch(scope, receive))

    async def fast_post(self, target: bytes, client: tuple[Any, ...] | None, body: bytes, exchange: Any) -> bool:
        """The HTTP front's shortcut (inri/common/front) for the hot `POST /v1/push`, its body read: the same
        limits, checks, answers and counts as through __call__, without building an ASGI scope, matching
        routes or wrapping the body in a Request. False for any other target (it goes through __call__).

        exchange: the front's request, with `send` (ASGI) and `answer_json(status, body)`, which writes a
        complete application/json answer without ASGI messages (the 202 of every push)."""
        if target != b"/v1/push":
            return False
        # The 202 leaves once the push is committed, written by the group commit's task (the front's
        # answer_json's `after`): the request's task does not wait for the commit.
        await self._answer(exchange.send, "/v1/push", "POST", self._push_body(client, body, durable=False),
                           functools.partial(exchange.answer_json, after=self.service.store.after_commit))
        return True

    async def _push_body(self, client: tuple[Any, ...] | None, body: bytes, *, durable: bool = True) -> tuple[int, Any]:
        """POST /v1/push as _dispatch runs it (the client's rate limit, then the handler), from its body."""
        self._limit_client(client_key_of(client))
        if len(body) > self._push_max_body:
            raise Problem(413, "too_large", f"request body over {self._push_max_body} bytes")
        return await self._pushed(json_object(body), durable=durable)

    def _limit_client(self, key: str) -> None:
        wait = self.rate.take(key)
        if wait:
            raise Problem(429, "rate_limited", "rate limit exceeded for this client",
                          retry_after=max(1, math.ceil(wait)))

    async def _answer(self, send: Send, path: str, method: str, work: Awaitable[tuple[Any, ...]],
                      answer_json: Callable[[int, bytes], Awaitable[None]] | None = None) -> None:
        """Run a request's handler and answer: its result, its Problem (problem+json), or 500.

        answer_json: the front's writer of a complete JSON answer, for a result that is JSON bytes
        already (as respond() would send it: application/json, its length)."""
        try:
            status, payload, *extra = await work
        except Problem as p:
            # Only a rate limit is tarpitted (a client hammering): backpressure (`overloaded`) and a full
            # mailbox ask a well-behaved app to slow down, and get their Retry-After at once.
            if p.code == "rate_limited" and self.limits.tarpit_s > 0 and self.tarpitted < self.limits.tarpit_max:
                self.tarpitted += 1
                try:
                    await trio.sleep(min(self.limits.tarpit_s, float(p.retry_after or 1)))
                finally:
                    self.tarpitted -= 1
            await respond_problem(send, self.http_codes, p, path, TITLES)
            return
        except Exception:  # never let a bug become a dropped connection without an answer
            log.exception("request failed", path=path, method=method)
            await respond_problem(send, self.http_codes, Problem(500, "internal", "internal error"), path, TITLES)
            return
        if answer_json is not None and not extra and type(payload) is bytes:
            codes = self.http_codes
            codes[status] = codes.get(status, 0) + 1  # as respond() counts it
            await answer_json(status, payload)
            return
        await respond(send, self.http_codes, status, payload, headers=extra[0] if extra else None)

    async def _dispatch(self, scope: Scope, receive: Receive) -> tuple[Any, ...]:
        path = scope["path"]
        route, params = self.router.match(scope["method"], path)
        # Web Push is limited per VAPID key (or per address when unsigned) in its handler: big app
        # servers push from few addresses.
        if path not in UNLIMITED_PATHS and route.handler != self.webpush:
            self._limit_client(client_key(scope))
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
        text = body.get("registration")
        reg = self._decoded.get(text) if isinstance(text, str) else None
        if reg is not None:
            return reg
        raw = b64d(text, "registration", max_size=1024)
        try:
            reg = decode_registration(raw)
        except DecodeError as exc:
            # unsupported_version: another protocol version's wire form (docs/api.md); anything else bad_registration
            code = "unsupported_version" if exc.code == "unsupported_version" else "bad_registration"
            raise Problem(400, code, f"registration: {exc.detail}") from None
        assert isinstance(text, str)  # b64d refused anything else
        self._remember(self._decoded, text, reg)
        return reg

    @staticmethod
    def _remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
        if len(cache) >= DECODED_CACHE_MAX:
            del cache[next(iter(cache))]
        cache[key] = value

    def _receipt_secret(self, body: dict[str, Any]) -> bytes | None:
        """The optional `receipt_secret`: the 32-byte seed of the device's receipt key (kept at this home)."""
        raw = body.get("receipt_secret")
        return None if raw is None else b64d(raw, "receipt_secret", size=32)

    # -- handlers ---------------------------------------------------------------------------------

    async def register(self, req: Request) -> tuple[int, Any]:
        body = await req.json()
        reg = self._registration(body)
        n = _int_field(body, "tokens", self.limits.tokens_default, 1, self.limits.tokens_max)
        try:
            secret, tokens = self.service.register_device(reg, n, self._receipt_secret(body))
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
            self.service.refresh_registration(reg, self._receipt_secret(body))
        except RegistrationError as exc:
            raise Problem(400, exc.code, exc.detail) from None
        return 200, {"device_id": device_id, "epoch": reg.epoch, "expires_at": reg.expires_at}

    async def tokens(self, req: Request, device_id: str) -> tuple[int, Any]:
        route_id = self._device(req, device_id)
        body = await req.json(optional=True)
        given = body.get("tokens")
        if given is None:
            n = _int_field(body, "count", self.limits.tokens_default, 1, self.limits.tokens_max)
            return 200, {"tokens": [b64e(t) for t in self.service.add_tokens(route_id, n)]}
        # A device homed at several relays installs the tokens its first home issued at the others, so a
        # push with any of its credentials' tokens is accepted at whichever home the mesh delivers it to
        # (docs/api.md "Homes in two places").
        if "count" in body:
            raise Problem(422, "invalid_field", "give either count or tokens, not both")
        if not isinstance(given, list) or not 1 <= len(given) <= self.limits.tokens_max:
            raise Problem(422, "invalid_field", f"tokens: expected a list of 1..{self.limits.tokens_max} tokens")
        tokens = [b64d(t, "tokens[]", size=limits.TOKEN_BYTES) for t in given]
        self.service.install_tokens(route_id, tokens)
        return 200, {"tokens": [b64e(t) for t in tokens]}

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
        meta = self.service.store.webpush_meta(route_id)
        return 200, {"messages": [_message_json(p, c, t, meta.get(p)) for p, c, t in msgs]}

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

    async def mozpush_over_http(self, req: Request) -> tuple[int, Any]:
        raise Problem(426, "upgrade_required", "this endpoint is a Mozilla Push WebSocket (docs/browsers.md)",
                      headers=[(b"upgrade", b"websocket")])

    async def mux_stream_over_http(self, req: Request) -> tuple[int, Any]:
        raise Problem(426, "upgrade_required", "this endpoint is a WebSocket (docs/api.md, Multiplexed stream)",
                      headers=[(b"upgrade", b"websocket")])

    # -- Web Push endpoints (minted at the home relay) ----------------------------------------------

    def _endpoint_json(self, tok: EndpointToken, url: str, vapid_key: bytes | None) -> dict[str, Any]:
        return {"endpoint_id": tok.endpoint_id.hex(), "url": url, "restricted": tok.restricted,
                "vapid_key": None if vapid_key is None else b64e(vapid_key)}

    async def mint_endpoint(self, req: Request, device_id: str) -> tuple[int, Any]:
        route_id = self._device(req, device_id)
        body = await req.json(optional=True)
        key = body.get("vapid_key")
        vapid_key = None
        if key is not None:
            vapid_key = b64d(key, "vapid_key", size=65)
            if vapid_key[0] != 4:
                raise Problem(422, "invalid_field", "vapid_key: expected an uncompressed P-256 point (0x04...)")
            try:
                ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), vapid_key)
            except ValueError:
                raise Problem(422, "invalid_field", "vapid_key: not a point on P-256") from None
        seal_key = None if body.get("seal_key") is None else b64d(body.get("seal_key"), "seal_key",
                                                                   size=limits.KEY_BYTES)
        store = self.service.store
        if len(store.endpoints(route_id)) >= self.config.webpush.endpoints_max:
            raise Problem(409, "too_many_endpoints",
                          f"this device has {self.config.webpush.endpoints_max} endpoints; revoke one first")
        try:
            tok, url = mint_endpoint(store, self.wp_origins[0], route_id, vapid_key, seal_key,
                                     self.service.wall_clock())
        except EndpointError as exc:
            raise Problem(409, "receipt_key_required", str(exc)) from None
        return 201, self._endpoint_json(tok, url, vapid_key)

    async def list_endpoints(self, req: Request, device_id: str) -> tuple[int, Any]:
        route_id = self._device(req, device_id)
        store = self.service.store
        try:
            return 200, {"endpoints": [self._endpoint_json(t, endpoint_url(store, self.wp_origins[0], route_id, t), k)
                                       for t, k in store.endpoints(route_id)]}
        except EndpointError as exc:
            raise Problem(409, "receipt_key_required", str(exc)) from None

    async def revoke_endpoint(self, req: Request, device_id: str, endpoint_id: str) -> tuple[int, Any]:
        route_id = self._device(req, device_id)
        eid = _parse_id(endpoint_id, limits.ENDPOINT_ID_BYTES)
        if eid is None:
            raise Problem(422, "invalid_field", "endpoint_id: expected 32 hex characters")
        # Idempotent (a DELETE retried after a lost answer succeeds); device endpoints never answer 404.
        self.service.store.revoke_endpoint(route_id, eid)
        return 204, None

    # -- wake hooks (docs/api.md "Wake hooks", docs/gateway.md) -------------------------------------------

    @staticmethod
    def _hook_json(hook: Hook | None) -> dict[str, Any]:
        # No hook: nulls, not 404 (device endpoints never answer 404: see the module docstring).
        return {"url": None if hook is None else hook.url, "created": None if hook is None else hook.created}

    async def set_wake(self, req: Request, device_id: str) -> tuple[int, Any]:
        route_id = self._device(req, device_id)
        body = await req.json()
        token = b64d(body.get("token"), "token", max_size=WAKE_TOKEN_MAX_BYTES)
        try:
            hook = self.service.wake.set_hook(Owner(OwnerKind.DEVICE, route_id), body.get("url"), token,
                                              self.service.wall_clock())
        except HookError as exc:
            raise Problem(422, exc.code, exc.detail) from None
        return 200, self._hook_json(hook)

    async def get_wake(self, req: Request, device_id: str) -> tuple[int, Any]:
        return 200, self._hook_json(self.service.wake.hook(Owner(OwnerKind.DEVICE, self._device(req, device_id))))

    async def delete_wake(self, req: Request, device_id: str) -> tuple[int, Any]:
        self.service.wake.remove_hook(Owner(OwnerKind.DEVICE, self._device(req, device_id)))
        return 204, None  # idempotent, as every device DELETE

    async def push(self, req: Request) -> tuple[int, Any]:
        return await self._pushed(await req.json())

    async def _pushed(self, body: dict[str, Any], *, durable: bool = True) -> tuple[int, Any]:
        """durable=False: the caller answers only once the store committed (an after-commit action)."""
        push_id = self._inject(body)
        if durable:
            await self.service.store.durable()  # 202 only once custody is committed (grouped per round)
        # {"push_id": ..., "status": "pending"} as respond() encodes it, without the encoder (every push).
        return 202, b'{"push_id":"%s","status":"pending"}' % push_id.hex().encode()

    async def push_batch(self, req: Request) -> tuple[int, Any]:
        """Many pushes in one request (docs/api.md "Push batch"): each checked, limited and accepted exactly
        as POST /v1/push would, with its own result; the 202s only once all accepted ones are durable."""
        body = await req.json()
        items = body.get("pushes")
        if not isinstance(items, list) or not 1 <= len(items) <= PUSH_BATCH_MAX:
            raise Problem(422, "invalid_field", f"pushes: expected a list of 1 to {PUSH_BATCH_MAX} push objects")
        client = client_key(req.scope)
        results: list[dict[str, Any]] = []
        accepted = 0
        for i, item in enumerate(items):
            try:
                # The request took one of the client's tokens (as a single push does): each further
                # push takes one more, so a batch is limited like the same pushes sent one by one.
                wait = self.rate.take(client) if i else 0.0
                if wait:
                    raise Problem(429, "rate_limited", "rate limit exceeded for this client",
                                  retry_after=max(1, math.ceil(wait)))
                if not isinstance(item, dict):
                    raise Problem(422, "invalid_field", "request body must be a JSON object")
                push_id = self._inject(item)
            except Problem as p:
                result = problem_body(p, f"{req.path}#{i}", TITLES)
                if p.retry_after is not None:
                    result["retry_after"] = p.retry_after
                results.append(result)
                continue
            accepted += 1
            results.append({"status": 202, "push_id": push_id.hex(), "push_status": "pending"})
        if accepted:
            await self.service.store.durable()  # every 202 in the answer is committed (one group commit)
        return 200, {"accepted": accepted, "results": results}

    def _inject(self, body: dict[str, Any]) -> bytes:
        """One push (a POST /v1/push body) verified, limited and taken into custody: its push id, or the
        Problem to answer. Not durable yet: the caller awaits store.durable() before answering."""
        reg = self._registration(body)
        token = b64d(body.get("token"), "token", size=limits.TOKEN_BYTES)
        ciphertext = b64d(body.get("ciphertext"), "ciphertext", max_size=limits.MAX_CIPHERTEXT_BYTES)
        wait = self.token_rate.take(token.hex())
        what = "this token"
        if not wait:
            wait = self.device_rate.take(reg.route_id.hex())
            what = "this device"
        if wait:
            raise Problem(429, "rate_limited", f"too many pushes for {what} at this relay",
                          retry_after=max(1, math.ceil(wait)))
        result = self.service.inject_push(reg, token, ciphertext)
        if result.outcome == InjectOutcome.ACCEPTED:
            assert result.push_id is not None
            return result.push_id
        if result.outcome == InjectOutcome.OVERLOADED:
            # Backpressure (docs/api.md): custody beyond what the path drains; the app slows down.
            raise Problem(429, "overloaded", "relay overloaded: more pushes in custody than the path drains; "
                          "retry later", retry_after=self.service.retry_after_s)
        if result.outcome == InjectOutcome.TOKEN_MISMATCH:
            raise Problem(422, "invalid_field", "token or ciphertext malformed")
        raise Problem(400, "bad_registration", "the push credential's registration does not verify or has expired")

    # -- Web Push (RFC 8030/8291/8292) at any relay --------------------------------------------------

    def _wp_count(self, name: str) -> None:
        self.wp_counts[name] = self.wp_counts.get(name, 0) + 1

    async def webpush(self, req: Request, reg: str, endpoint: str) -> tuple[Any, ...]:
        """Verify a Web Push push here, then route it with custody like /v1/push (docs/api.md "Web Push")."""
        try:
            return await self._webpush(req, reg, endpoint)
        except WebPushError as exc:
            self._wp_count(f"refused_{exc.status}")
            headers = [(b"www-authenticate", b"vapid")] if exc.status == 401 else []
            raise Problem(exc.status, exc.code, exc.detail, headers=headers) from None
        except Problem as p:
            self._wp_count(f"refused_{p.status}")
            raise

    # -- Matrix push gateway (/_matrix/push/v1/notify) ------------------------------------------------

    async def matrix_discovery(self, req: Request) -> tuple[int, Any]:
        return 200, {"unifiedpush": {"gateway": "matrix"}}

    async def matrix_notify(self, req: Request) -> tuple[int, Any]:
        """Deliver the notification (without `devices`) to each INRI pushkey, sealed to its device here."""
        body = await req.json()
        note = body.get("notification")
        devices = note.get("devices") if isinstance(note, dict) else None
        if not isinstance(note, dict) or not isinstance(devices, list) or not all(isinstance(d, dict) for d in devices):
            raise Problem(422, "invalid_field", "notification.devices: expected a list of objects")
        # What the device receives is the Push Gateway API body minus `devices`: `{"notification": {...}}`,
        # the UnifiedPush Matrix convention that Element, Element X and FUTO Circles parse.
        payload = json.dumps({"notification": {k: v for k, v in note.items() if k != "devices"}},
                             separators=(",", ":")).encode()
        if len(devices) > MATRIX_MAX_DEVICES:
            raise Problem(422, "invalid_field", f"notification.devices: at most {MATRIX_MAX_DEVICES}")
        ok = [False] * len(devices)

        async def one(i: int, pushkey: object) -> None:
            ok[i] = isinstance(pushkey, str) and await self._matrix_push(pushkey, payload)

        async with trio.open_nursery() as nursery:  # each waits up to 1.5 s for its home: wait together
            for i, d in enumerate(devices):
                nursery.start_soon(one, i, d.get("pushkey"))
        return 200, {"rejected": [d.get("pushkey") for d, good in zip(devices, ok, strict=True) if not good]}

    async def _matrix_push(self, pushkey: str, payload: bytes) -> bool:
        """True when pushkey is an INRI endpoint with a seal key and its home did not refuse the push."""
        m = re.fullmatch(r"(https?://[^/]+)/wp/v1/([A-Za-z0-9_-]+)/([A-Za-z0-9_-]+)", pushkey)
        # A pushkey is served by the gateway at its own origin (the UnifiedPush convention: a client finds
        # the gateway by putting /_matrix/push/v1/notify on the pushkey's origin); any other is not ours.
        if m is None or not self._own_origin(m[1]):
            return False
        opened = self._open_endpoint(m[2], m[3])
        if opened is None:  # not an INRI endpoint, or one altered (its signature does not verify)
            return False
        reg, tok = opened
        if tok.seal_key is None or tok.restricted:  # restricted endpoints take only their VAPID key's pushes
            return False
        try:
            sealed = SealedBox(PublicKey(tok.seal_key)).encrypt(payload)
        except (ValueError, TypeError):
            return False
        if len(sealed) > limits.MAX_CIPHERTEXT_BYTES:
            return False
        try:
            await self._route_webpush(reg, tok, sealed, Headers(self.config.webpush.ttl_max_s, Urgency.NORMAL, None),
                                      ContentEncoding.SEALED, None)
        except Problem as p:
            return p.status == 429  # transient: not a reason for the homeserver to drop the pushkey
        return True

    async def _webpush(self, req: Request, reg_b64: str, endpoint_b64: str) -> tuple[Any, ...]:
        wp = self.config.webpush
        opened = self._open_endpoint(reg_b64, endpoint_b64)
        if opened is None:  # broken, or any byte altered: unknown endpoint, decided here (no mesh search)
            raise Problem(404, "not_found", "no such Web Push endpoint")
        reg, tok = opened
        length = req.header(b"content-length")
        if length is not None and length.strip().isdigit() and int(length) > limits.MAX_CIPHERTEXT_BYTES:
            raise Problem(413, "too_large", f"Web Push bodies are at most {limits.MAX_CIPHERTEXT_BYTES} bytes")
        heads = parse_headers(req.header(b"ttl"), req.header(b"urgency"), req.header(b"topic"), wp.ttl_max_s)
        crypto_key = req.header(b"crypto-key")
        creds = vapid_credentials(req.header(b"authorization"), crypto_key)
        if tok.restricted and creds is None:
            raise WebPushError(401, "bad_vapid", "this endpoint is restricted to one VAPID key: sign the push")
        vapid_key = None
        if creds is not None:
            verify_vapid(creds[0], creds[1], self.wp_aud)
            vapid_key = creds[1]
            if tok.restricted and vapid_key_hash(vapid_key)[:VAPID_PREFIX_BYTES] != tok.vapid_prefix:
                raise Problem(403, "forbidden_key", "this endpoint is restricted to another VAPID key")
        limiter, key = ((self.vapid_rate, vapid_key.hex()) if vapid_key is not None
                        else (self.rate, client_key(req.scope)))
        for lim, k, what in ((limiter, key, "this sender"),
                             (self.wp_endpoint_rate, (reg.route_id + tok.endpoint_id).hex(), "this endpoint")):
            wait = lim.take(k)
            if wait:
                raise Problem(429, "rate_limited", f"too many pushes from {what} at this relay",
                              retry_after=max(1, math.ceil(wait)))
        neg_key = hashlib.sha256(reg.route_id + tok.endpoint_id + tok.cap).digest()
        cached = self.wp_gone.get(neg_key)
        if cached is not None and cached[1] > time.monotonic():
            raise Problem(cached[0], "not_found" if cached[0] == 404 else "gone", "endpoint unknown or revoked")
        body, encoding = frame_body(await req.body(), req.header(b"content-encoding"), req.header(b"encryption"),
                                    crypto_key)
        pid = await self._route_webpush(reg, tok, body, heads, encoding, vapid_key if tok.restricted else None,
                                        neg_key)
        self._wp_count("accepted")
        location = f"{self.wp_origins[0]}/v1/push/{pid.hex()}"
        return 201, None, [(b"location", location.encode()), (b"ttl", str(heads.ttl_s).encode())]

    def _own_origin(self, origin: str) -> bool:
        """True when origin is one of this relay's public origins (default ports and case aside)."""
        try:
            return normalise_origin(origin) in self.wp_aud
        except ValueError:  # e.g. a port that is not a number
            return False

    def _open_endpoint(self, reg_b64: str, endpoint_b64: str) -> tuple[Registration, EndpointToken] | None:
        """open_endpoint (inri/node/webpush.py) once per distinct URL; None when it does not open."""
        key = (reg_b64, endpoint_b64)
        opened = self._opened.get(key)
        if opened is None:
            try:
                reg, tok = open_endpoint(reg_b64, endpoint_b64)
            except ValueError:
                return None
            # One object per registration text, whatever the endpoint (the verifier finds it by identity).
            shared = self._decoded.get(reg_b64)
            if shared is None:
                self._remember(self._decoded, reg_b64, reg)
            opened = (shared or reg, tok)
            self._remember(self._opened, key, opened)
        return opened

    async def _route_webpush(
        self, reg: Registration, tok: EndpointToken, body: bytes, heads: Headers, encoding: ContentEncoding,
        vapid_key: bytes | None, neg_key: bytes | None = None,
    ) -> bytes:
        """Tag, take custody, wait briefly for the home's answer: the push id, or the Problem to answer."""
        if tok.version == TokenVersion.V1 and reg.expires_at <= self.service.wall_clock():
            # An unsigned (version 1) token can be altered: it dies with its registration, as documented.
            # Rule C1b's longer life (an expired registration whose home keeps the route alive) is for
            # signed tokens only.
            raise Problem(404, "not_found", "the endpoint's registration does not verify or has expired")
        if neg_key is None:
            neg_key = hashlib.sha256(reg.route_id + tok.endpoint_id + tok.cap).digest()
            cached = self.wp_gone.get(neg_key)
            if cached is not None and cached[1] > time.monotonic():
                raise Problem(cached[0], "not_found" if cached[0] == 404 else "gone", "endpoint unknown or revoked")
        pid = os.urandom(limits.PUSH_ID_BYTES)
        vhash = vapid_key_hash(vapid_key)
        tag = push_tag(tok.cap, pid, body, heads.ttl_s, heads.urgency, encoding, heads.topic, vhash, tok.version)
        meta = WebPushMeta(tok.endpoint_id, tag, heads.ttl_s, heads.urgency, encoding, heads.topic)
        settled = trio.Event()
        self.service.settle_waiters[pid] = settled
        result = self.service.inject_push(reg, bytes(limits.TOKEN_BYTES), body, push_id=pid, webpush=meta)
        if result.outcome == InjectOutcome.OVERLOADED:
            self.service.settle_waiters.pop(pid, None)
            raise Problem(429, "overloaded", "relay overloaded: more pushes in custody than the path drains; "
                          "retry later", retry_after=self.service.retry_after_s)
        if result.outcome != InjectOutcome.ACCEPTED:
            self.service.settle_waiters.pop(pid, None)
            raise Problem(404, "not_found", "the endpoint's registration does not verify or has expired")
        with trio.move_on_after(WEBPUSH_RECEIPT_WAIT_S):
            await settled.wait()
        self.service.settle_waiters.pop(pid, None)
        status = self.service.push_status(pid) or {}
        answer = WEBPUSH_ANSWERS.get(str(status.get("status")))
        if answer is not None:
            code, problem_code = answer
            if code in (404, 410):
                self.wp_gone[neg_key] = (code, time.monotonic() + NEGATIVE_CACHE_S)
                while len(self.wp_gone) > NEGATIVE_CACHE_MAX:
                    self.wp_gone.pop(next(iter(self.wp_gone)))
            raise Problem(code, problem_code, f"the home relay answered {status.get('status')}",
                          retry_after=5 if code == 429 else None)
        await self.service.store.durable()  # custody committed before the 201 (group commit: Store.run)
        return pid

    async def push_status(self, req: Request, push_id: str) -> tuple[int, Any]:
        pid = _parse_id(push_id, limits.PUSH_ID_BYTES)
        status = None if pid is None else self.service.push_status(pid)
        if status is None:
            raise Problem(404, "not_found", "no push with this id was accepted by this relay")
        return 200, status

    async def health(self, req: Request) -> tuple[int, Any]:
        reach = self.service.reachability
        reasons = reach.degraded_reasons(self.service.clock())  # isolated too long, unreachable: reachability.py
        if reasons:
            return 503, {"status": "degraded", "node_id": self.service.node_id, "reasons": reasons}
        return 200, {"status": "ok", "node_id": self.service.node_id}

    async def status(self, req: Request) -> tuple[int, Any]:
        return 200, {**self.service.status(), "version": __version__, "neighbours": self.neighbours(),
                     "websockets": self.ws_open, "mozpush": self.mozpush.status(),
                     "reachability": self.service.reachability.status(self.service.clock())}

    async def metrics(self, req: Request) -> tuple[int, Any]:
        return 200, metrics_answer(self.registry)

    async def openapi(self, req: Request) -> tuple[int, Any]:
        return 200, openapi_document(__version__, self.body_limits())

    def body_limits(self) -> dict[str, int]:
        """'METHOD /path/{param}' -> largest body read, for every route that reads one."""
        return {f"{r.method} {r.template}": r.max_body for r in self.router.routes if r.max_body}

    # -- WebSocket stream -------------------------------------------------------------------------

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        if self.config.mozpush.enabled and (path == MOZPUSH_PATH or (
                path == "/" and SUBPROTOCOL in (scope.get("subprotocols") or []))):
            await self.mozpush.serve(scope, receive, send)
            return
        match = self.ws_route.pattern.fullmatch(scope["path"])
        first = await receive()
        if first["type"] != "websocket.connect":
            return
        if scope["path"] == MUX_STREAM_PATH:
            await self._ws_mux(scope, receive, send)
            return
        if match is None:
            await send({"type": "websocket.close", "code": WS_CLOSE_GONE})
            return
        if self.rate.take(client_key(scope)):
            await send({"type": "websocket.close", "code": WS_CLOSE_RATE})
            return
        route_id = _parse_id(match["device_id"], limits.ROUTE_ID_BYTES)
        secret = _bearer(Request(scope, receive, 0))
        if secret is not None and route_id is not None and self._authenticated(route_id, secret):
            # Counted open before the client sees the handshake complete: a TTL 0 Web Push sent right
            # after the client's connect returns must find the stream open (it is stored only then).
            self.streams[route_id] = self.streams.get(route_id, 0) + 1
            try:
                await send({"type": "websocket.accept"})
                await self._ws_serve(receive, send, route_id)
            finally:
                self._stream_closed(route_id)
            return
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
        self.streams[route_id] = self.streams.get(route_id, 0) + 1
        try:
            await self._ws_serve(receive, send, route_id)
        finally:
            self._stream_closed(route_id)

    def _stream_closed(self, route_id: bytes) -> None:
        self.streams[route_id] -= 1
        if not self.streams[route_id]:
            del self.streams[route_id]
            self.service.wake.stream_closed(route_id)  # what it left unacknowledged wakes the device

    async def _ws_serve(self, receive: Receive, send: Send, route_id: bytes) -> None:
        """An authenticated device stream: messages out, acks in, until either side ends it."""
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

    async def _ws_mux(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One WebSocket serving many route ids (docs/api.md "Multiplexed stream").

        The client subscribes devices with their secrets in text frames; each gets its own writer task
        (the same one as the single-device stream, its frames labelled with `device_id`), acks name the
        device. Sends are serialised: ASGI frames from several tasks must not interleave.
        """
        if self.rate.take(client_key(scope)):
            await send({"type": "websocket.close", "code": WS_CLOSE_RATE})
            return
        await send({"type": "websocket.accept"})
        lock = trio.Lock()

        async def send_one(message: dict[str, Any]) -> None:
            async with lock:
                await send(message)

        async def reply(**frame: Any) -> None:
            await send_one({"type": "websocket.send", "text": json.dumps(frame)})

        served: dict[bytes, trio.CancelScope] = {}

        async def serve_one(route_id: bytes, cancel: trio.CancelScope) -> None:
            try:
                with cancel:
                    await self._ws_writer(send_one, route_id, label=route_id.hex())
            finally:
                served.pop(route_id, None)
                self._stream_closed(route_id)

        self.ws_open += 1
        try:
            async with trio.open_nursery() as nursery:
                while True:
                    msg = await receive()
                    if msg["type"] == "websocket.disconnect":
                        break
                    try:
                        data = json.loads(msg.get("text") or "null")
                        if not isinstance(data, dict):
                            raise ValueError("expected a JSON object")
                        kind, devices = data.get("type"), data.get("devices")
                        if kind == "subscribe":
                            if (not isinstance(devices, list) or not all(isinstance(d, dict) for d in devices)
                                    or len(served) + len(devices) > MUX_MAX_DEVICES):
                                raise Problem(422, "invalid_field", "devices: a list of {device_id, auth} objects, "
                                              f"at most {MUX_MAX_DEVICES} per stream")
                            for d in devices:
                                label = d.get("device_id")
                                rid = _parse_id(label, limits.ROUTE_ID_BYTES) if isinstance(label, str) else None
                                try:
                                    secret = b64d(d.get("auth"), "auth", size=SECRET_BYTES)
                                except Problem:
                                    secret = None
                                if rid is None or not self._authenticated(rid, secret):
                                    await reply(type="refused", device_id=label, code="bad_credentials")
                                    continue
                                if rid not in served:
                                    # Counted open before "subscribed" goes out (a TTL 0 push right after
                                    # must find the stream open), closed by its writer task.
                                    self.streams[rid] = self.streams.get(rid, 0) + 1
                                    served[rid] = trio.CancelScope()
                                    nursery.start_soon(serve_one, rid, served[rid])
                                await reply(type="subscribed", device_id=rid.hex())
                        elif kind == "unsubscribe":
                            label = data.get("device_id")
                            rid = _parse_id(label, limits.ROUTE_ID_BYTES) if isinstance(label, str) else None
                            if rid in served:
                                served[rid].cancel()
                            await reply(type="unsubscribed", device_id=label)
                        elif kind == "ack":
                            label = data.get("device_id")
                            rid = _parse_id(label, limits.ROUTE_ID_BYTES) if isinstance(label, str) else None
                            if rid is None or rid not in served:
                                raise Problem(422, "invalid_field", "device_id: not subscribed on this stream")
                            n = self.service.ack(rid, self._ids(data.get("ids")))
                            await reply(type="acked", device_id=label, deleted=n)
                        else:
                            raise ValueError("type: expected subscribe, unsubscribe or ack")
                    except (ValueError, RecursionError, Problem) as exc:
                        await reply(type="error", detail=exc.detail if isinstance(exc, Problem) else str(exc))
                nursery.cancel_scope.cancel()
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away
        finally:
            self.ws_open -= 1

    async def _ws_writer(self, send: Send, route_id: bytes, label: str | None = None) -> None:
        """Send route_id's messages until it is no longer homed here; label: the multiplexed stream's device_id."""
        sent: set[bytes] = set()
        tag = {} if label is None else {"device_id": label}
        service = self.service
        while True:
            # Take the wake-up event *before* reading the mailbox: a message delivered while we are
            # sending the ones read below sets this event, so the wait at the bottom returns at once.
            # (Taken after, such a delivery set an event nobody waited on, and the stream went quiet
            # until the next ping: issue 13, item 0.)
            mail = service.mail_event(route_id)
            meta = service.store.webpush_meta(route_id)
            for pid, ct, t in service.pending(route_id, MAX_PULL):
                if pid not in sent:
                    sent.add(pid)
                    await send({"type": "websocket.send", "text": json.dumps(
                        {"type": "message", **tag, **_message_json(pid, ct, t, meta.get(pid))})})
            if not service.store.is_home(route_id):
                if label is None:
                    await send({"type": "websocket.close", "code": WS_CLOSE_GONE})
                else:  # the other devices on this connection go on
                    await send({"type": "websocket.send", "text": json.dumps({"type": "gone", **tag})})
                return
            with trio.move_on_after(WS_PING_S) as scope:
                await mail.wait()
            if scope.cancelled_caught:
                await send({"type": "websocket.send", "text": json.dumps({"type": "ping", **tag})})
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
