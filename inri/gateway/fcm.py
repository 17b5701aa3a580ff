"""FCM HTTP v1: one data-only, high-priority wake-up per request, authorised by a service account.

Google's contract ("FCM HTTP v1 API", "projects.messages.send", "ErrorCode", "Using OAuth 2.0 for
Server to Server Applications"):

- An access token from the service account's `token_uri`: POST the form grant_type =
  urn:ietf:params:oauth:grant-type:jwt-bearer (RFC 7523) with `assertion` an RS256 JWT, header
  {alg: RS256, typ: JWT, kid: private_key_id}, claims {iss: client_email, scope:
  https://www.googleapis.com/auth/firebase.messaging, aud: token_uri, iat, exp: iat + 3600}. The
  answer's access_token is used until REFRESH_MARGIN_S before its expires_in runs out; one fetch at a
  time (concurrent wake-ups wait for the same token).
- `POST /v1/projects/<project>/messages:send`, `authorization: Bearer <access token>`, body
  {"message": {"token": ..., "data": {"inri": "wake"}, "android": {"priority": "HIGH", "ttl",
  "collapse_key"}, "apns": {background headers and content-available}}}: no `notification`, no
  content; `data` only says what kind of message it is.
- Errors carry `error.status` and, for FCM's own, a `google.firebase.fcm.v1.FcmError` detail with an
  `errorCode`: UNREGISTERED, INVALID_ARGUMENT (an invalid registration token) and SENDER_ID_MISMATCH
  -> the token is gone; QUOTA_EXCEEDED, UNAVAILABLE, INTERNAL -> back off, honouring Retry-After;
  401 (UNAUTHENTICATED, an access token Google no longer takes) -> a new access token and one retry.
  An INVALID_ARGUMENT whose `google.rpc.BadRequest` names a field other than message.token is this
  gateway's message at fault, not the device's token: failed, logged, the hook stays.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

import httpx
import structlog
import trio

from inri.common.http import retry_after_seconds
from inri.gateway.config import FcmSection, ServiceAccount
from inri.gateway.jws import compact, load_rsa_pem, rs256
from inri.gateway.provider import Outcome, Result
from inri.protocol.wake import WakeProvider

log = structlog.get_logger("inri.gateway.fcm")

SCOPE = "https://www.googleapis.com/auth/firebase.messaging"
GRANT_TYPE = "urn:ietf:params:oauth:grant-type:jwt-bearer"
ASSERTION_LIFETIME_S = 3600  # Google: exp at most one hour after iat
REFRESH_MARGIN_S = 300.0  # a cached access token is replaced this long before it expires
FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"
GONE_CODES = frozenset({"UNREGISTERED", "INVALID_ARGUMENT", "SENDER_ID_MISMATCH"})
BACKOFF_CODES = frozenset({"QUOTA_EXCEEDED", "UNAVAILABLE", "INTERNAL"})
ANSWER_MAX_BYTES = 65536  # a token or error answer larger than this is not Google's


class TokenError(Exception):
    """No access token: `outcome` says whether to back off (Google unreachable) or fail (credentials)."""

    def __init__(self, outcome: Outcome, reason: str) -> None:
        super().__init__(reason)
        self.outcome, self.reason = outcome, reason


class FcmProvider:
    """Sends wake-ups through FCM HTTP v1 (module docstring); `client` is an httpx client (HTTP/2)."""

    name = WakeProvider.FCM

    def __init__(self, cfg: FcmSection, account: ServiceAccount, client: httpx.AsyncClient, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.account = account
        self.client = client
        self.clock = clock  # unix time: iat/exp leave the process
        self._sign = rs256(load_rsa_pem(account.private_key, "service account private_key"))
        self._access: str | None = None
        self._access_until = -math.inf
        self._lock = trio.Lock()
        self.counters: dict[str, int] = {}
        self.url = f"{cfg.base_url.rstrip('/')}/v1/projects/{cfg.project_id}/messages:send"

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    async def access_token(self, *, stale: str | None = None) -> str:
        """The cached access token, or a new one (when expiring, or when `stale` is the one refused)."""
        async with self._lock:
            if self._access is not None and self._access != stale and \
                    self.clock() < self._access_until - REFRESH_MARGIN_S:
                return self._access
            now = int(self.clock())
            assertion = compact({"alg": "RS256", "typ": "JWT", "kid": self.account.private_key_id},
                                {"iss": self.account.client_email, "scope": SCOPE, "aud": self.account.token_uri,
                                 "iat": now, "exp": now + ASSERTION_LIFETIME_S}, self._sign)
            try:
                r = await self.client.post(self.account.token_uri,
                                           data={"grant_type": GRANT_TYPE, "assertion": assertion})
            except httpx.HTTPError as exc:
                raise TokenError(Outcome.BACKOFF, f"token endpoint unreachable: {type(exc).__name__}") from None
            self._count(f"token_status_{r.status_code}")
            body = _json(r)
            token, expires = body.get("access_token"), body.get("expires_in")
            if r.status_code != 200 or not isinstance(token, str) or not token \
                    or not isinstance(expires, int) or expires <= 0:
                error = str(body.get("error", ""))[:64]
                if r.status_code >= 500 or r.status_code == 429:
                    raise TokenError(Outcome.BACKOFF, f"token endpoint {r.status_code}")
                log.error("Google refused the service account's assertion: check [fcm] service_account",
                          status=r.status_code, error=error)
                raise TokenError(Outcome.FAILED, error or f"token endpoint {r.status_code}")
            self._count("token_refreshes")
            self._access, self._access_until = token, self.clock() + expires
            return token

    def message(self, device_token: str) -> dict[str, Any]:
        """The messages:send body: data only, high priority, nothing of the message it announces."""
        c = self.cfg
        return {"message": {
            "token": device_token,
            "data": {"inri": "wake"},
            "android": {"priority": "HIGH", "ttl": f"{c.ttl_s}s", "collapse_key": c.collapse_key},
            # An iOS app on FCM: a background wake-up (APNs priority 5 with content-available only).
            "apns": {"headers": {"apns-push-type": "background", "apns-priority": "5",
                                 "apns-collapse-id": c.collapse_key},
                     "payload": {"aps": {"content-available": 1}}},
        }}

    async def send(self, device_token: str) -> Result:
        """One wake-up to device_token (an FCM registration token, checked by inri.protocol.wake)."""
        stale: str | None = None
        for _ in range(2):
            try:
                access = await self.access_token(stale=stale)
            except TokenError as exc:
                return Result(exc.outcome, exc.reason)
            try:
                r = await self.client.post(self.url, json=self.message(device_token),
                                           headers={"authorization": "Bearer " + access})
            except httpx.HTTPError as exc:
                self._count("unreachable")
                return Result(Outcome.BACKOFF, f"unreachable: {type(exc).__name__}")
            self._count(f"status_{r.status_code}")
            if r.status_code == 401 and stale is None:  # UNAUTHENTICATED: a new access token, once
                stale = access
                continue
            return self._result(r)
        return Result(Outcome.FAILED, "UNAUTHENTICATED")

    def _result(self, r: httpx.Response) -> Result:
        if r.status_code == 200:
            return Result(Outcome.SENT, "sent")
        error = _json(r).get("error")
        error = error if isinstance(error, dict) else {}
        details = [d for d in error.get("details", []) if isinstance(d, dict)] \
            if isinstance(error.get("details"), list) else []
        code = next((str(d.get("errorCode")) for d in details if d.get("@type") == FCM_ERROR), "")
        status = str(error.get("status", ""))
        code = code or status
        fields = [str(v.get("field", "")) for d in details if d.get("@type") == BAD_REQUEST
                  for v in (d.get("fieldViolations") or []) if isinstance(v, dict)]
        retry = retry_after_seconds(r.headers.get("retry-after"))
        if code in GONE_CODES or r.status_code == 404:
            if code == "INVALID_ARGUMENT" and any(f != "message.token" for f in fields):
                log.error("FCM refused the wake-up message itself: check [fcm]", fields=fields[:5])
                return Result(Outcome.FAILED, "INVALID_ARGUMENT")
            return Result(Outcome.GONE, code or "UNREGISTERED")
        if code in BACKOFF_CODES or r.status_code == 429 or r.status_code >= 500:
            return Result(Outcome.BACKOFF, code or str(r.status_code), retry,
                          per_token=code == "QUOTA_EXCEEDED")
        log.error("FCM refused a wake-up for a reason that is not the device token: check [fcm]",
                  status=r.status_code, code=code)
        return Result(Outcome.FAILED, code or str(r.status_code))


def _json(r: httpx.Response) -> dict[str, Any]:
    """A JSON object answer, or {} (too large, not JSON, not an object)."""
    if len(r.content) > ANSWER_MAX_BYTES:
        return {}
    try:
        body = json.loads(r.content)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
