"""The gateway's HTTP API (docs/gateway.md, "The gateway's API"): a bare ASGI app like the relay's.

`POST /v1/wake` with `{"token": "<base64url wake token>"}` is all a home relay ever sends. The
gateway opens the token with its key, checks its limits, and asks the provider to wake the device:

| answer | when | the relay |
|---|---|---|
| 200 `{"status": "sent"}` | the provider accepted the wake-up | starts its coalescing window |
| 410 `token_gone` | the provider says the device token is gone | drops the hook |
| 410 `bad_token` | the token does not open with this key, or names a provider not set up here | drops the hook |
| 429 `rate_limited` + Retry-After | this client address or this device token is over its limit | retries later |
| 503 `provider_backoff` + Retry-After | the provider said later (429, 5xx, unreachable) | retries later |
| 502 `provider_error` | the provider refused for a reason that is not the token (see the log) | retries later |

The gateway keeps no state about devices beyond rate-limit buckets and back-off deadlines, keyed by
a hash of the device token; it logs no device token.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import time
from collections.abc import Callable
from typing import Any, assert_never

import structlog
from nacl.public import PrivateKey

from inri import __version__
from inri.common.addr import rate_key
from inri.common.b64url import b64d
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
from inri.core.budget import KeyedBuckets
from inri.gateway.config import GatewaySection
from inri.gateway.keys import public_key
from inri.gateway.metrics import LATENCY_BUCKETS, gateway_registry
from inri.gateway.provider import Outcome, Provider, Result
from inri.protocol.wake import WAKE_TOKEN_MAX_BYTES, WakeProvider, open_wake_token

log = structlog.get_logger("inri.gateway")

WAKE_BODY_MAX_BYTES = 4096  # {"token": ...}: a 2,096-byte token is 2,795 base64url characters
BLOCKED_MAX = 100_000  # back-off deadlines kept (the oldest go first)
TITLES = {
    "malformed_json": "Request body is not valid JSON",
    "invalid_field": "A field is missing or invalid",
    "too_large": "Request body too large",
    "not_found": "Not found",
    "method_not_allowed": "Method not allowed",
    "rate_limited": "Too many requests",
    "bad_token": "Wake token does not open here",
    "token_gone": "Device token gone",
    "provider_backoff": "Push provider asks to retry later",
    "provider_error": "Push provider refused the request",
    "internal": "Internal error",
}


class GatewayApp:
    """The ASGI application; providers by WakeProvider (those configured)."""

    def __init__(self, cfg: GatewaySection, key: PrivateKey, providers: dict[WakeProvider, Provider], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.key = key
        self.providers = providers
        self.clock = clock
        self.rate = KeyedBuckets(cfg.rate_per_s, cfg.rate_burst, clock=clock)
        self.token_rate = KeyedBuckets(cfg.token_rate_per_s, cfg.token_burst, clock=clock)
        self.blocked: dict[str, float] = {}  # "provider" or "provider:token hash" -> back off until (clock)
        self.http_codes = StatusCounts()
        self.counters: dict[str, int] = {}  # wakes_<provider>_<outcome>, refused_<reason>
        self.latency = {p: [0] * (len(LATENCY_BUCKETS) + 1) for p in WakeProvider}
        self.latency_sum = {p: 0.0 for p in WakeProvider}
        self.router = Router([
            Route("POST", "/v1/wake", self.wake, WAKE_BODY_MAX_BYTES),
            Route("GET", "/v1/key", self.public_key),
            Route("GET", "/healthz", self.health),
            Route("GET", "/metrics", self.metrics),
        ])
        self.registry = gateway_registry(self)

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # no WebSockets here
        path = scope["path"]
        try:
            route, params = self.router.match(scope["method"], path)
            answer: tuple[Any, ...] = await route.handler(Request(scope, receive, route.max_body), **params)
        except Problem as p:
            await respond_problem(send, self.http_codes, p, path, TITLES)
            return
        except Exception:  # a bug must still answer (and not take the connection with it)
            log.exception("request failed", path=path)
            await respond_problem(send, self.http_codes, Problem(500, "internal", "internal error"), path, TITLES)
            return
        status, payload, *extra = answer
        await respond(send, self.http_codes, status, payload, headers=extra[0] if extra else None)

    # -- POST /v1/wake ----------------------------------------------------------------------------

    def _limit(self, buckets: KeyedBuckets, key: str, what: str) -> None:
        wait = buckets.take(key)
        if wait:
            self._count("refused_rate_limited")
            raise Problem(429, "rate_limited", f"too many wake-ups for {what}", retry_after=max(1, math.ceil(wait)))

    def _backing_off(self, keys: tuple[str, ...]) -> None:
        now = self.clock()
        until = max((self.blocked.get(k, -math.inf) for k in keys), default=-math.inf)
        if until > now:
            self._count("refused_backing_off")
            raise Problem(503, "provider_backoff", "the push provider asked to wait",
                          retry_after=max(1, math.ceil(until - now)))

    def _block(self, key: str, seconds: float) -> None:
        self.blocked.pop(key, None)
        self.blocked[key] = self.clock() + seconds
        while len(self.blocked) > BLOCKED_MAX:
            del self.blocked[next(iter(self.blocked))]

    async def wake(self, req: Request) -> tuple[Any, ...]:
        """Open the token, check limits and back-off, ask the provider (see the module docstring)."""
        client = req.scope.get("client")
        self._limit(self.rate, rate_key(str(client[0]) if client else ""), "this client")
        body = await req.json()
        try:
            token = b64d(body.get("token"), "token", max_size=WAKE_TOKEN_MAX_BYTES)
        except ValueError as exc:
            raise Problem(422, "invalid_field", str(exc)) from None
        try:
            target = open_wake_token(self.key, token)
        except ValueError as exc:
            self._count("refused_bad_token")
            raise Problem(410, "bad_token", str(exc)) from None
        provider = self.providers.get(target.provider)
        if provider is None:
            self._count("refused_bad_token")
            raise Problem(410, "bad_token", f"this gateway has no {target.provider.value} provider")
        name = target.provider.value
        token_key = name + ":" + hashlib.blake2b(target.device_token.encode(), digest_size=16).hexdigest()
        self._backing_off((name, token_key))
        self._limit(self.token_rate, token_key, "this device token")
        t0 = time.perf_counter()
        result = await provider.send(target.device_token)
        dt = time.perf_counter() - t0
        self.latency[target.provider][bisect.bisect_left(LATENCY_BUCKETS, dt)] += 1
        self.latency_sum[target.provider] += dt
        self._count(f"wakes_{name}_{result.outcome.value}")
        return self._answer(result, name, token_key)

    def _answer(self, result: Result, name: str, token_key: str) -> tuple[Any, ...]:
        match result.outcome:
            case Outcome.SENT:
                return 200, {"status": "sent"}
            case Outcome.GONE:
                raise Problem(410, "token_gone", f"{name}: {result.reason}")
            case Outcome.BACKOFF:
                wait = result.retry_after
                if result.per_token:
                    wait = wait if wait is not None else self.cfg.token_backoff_s
                    self._block(token_key, wait)
                elif wait is not None:  # the provider as a whole said when (5xx with Retry-After)
                    self._block(name, wait)
                raise Problem(503, "provider_backoff", f"{name}: {result.reason}",
                              retry_after=max(1, math.ceil(wait)) if wait is not None else None)
            case Outcome.FAILED:
                raise Problem(502, "provider_error", f"{name}: {result.reason}")
            case _:
                assert_never(result.outcome)

    # -- the rest ---------------------------------------------------------------------------------

    async def public_key(self, req: Request) -> tuple[int, Any]:
        return 200, {"public_key": public_key(self.key), "format": "x25519-sealed-box",
                     "providers": sorted(p.value for p in self.providers)}

    async def health(self, req: Request) -> tuple[int, Any]:
        return 200, {"status": "ok", "version": __version__}

    async def metrics(self, req: Request) -> tuple[int, Any]:
        return 200, metrics_answer(self.registry)
