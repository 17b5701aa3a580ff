"""APNs: one content-free wake-up per request, over HTTP/2 with token-based authentication.

Apple's contract ("Sending notification requests to APNs", "Establishing a token-based connection to
APNs", "Handling notification responses from APNs"):

- `POST /3/device/<device token>` over HTTP/2, `authorization: bearer <provider token>`: an ES256 JWT
  with header {alg: ES256, kid: key id} and claims {iss: team id, iat: now}, signed with the team's
  .p8 key. Refresh it no more than once every 20 minutes and no less than once every 60 minutes
  (`token_refresh_s`, 50 minutes by default): one token serves every request in between.
- headers `apns-topic` (the bundle id), `apns-push-type` (background or alert), `apns-priority`
  (5 for background: Apple refuses 10 for a content-available-only payload; 10 for alert),
  `apns-expiration` (unix time; APNs stores the wake-up until then), `apns-collapse-id`.
- the payload carries nothing of the message: `{"aps":{"content-available":1}}` (background), or a
  fixed alert text with `mutable-content` so the app's notification service extension can pull the
  real message from its home relay and replace the text on the device.

Answers (`reason` in the JSON body): 200 sent; 400 BadDeviceToken / DeviceTokenNotForTopic and 410
(Unregistered, ExpiredToken) -> the token is gone; 403 ExpiredProviderToken -> a new provider token
and one retry (at most once per 20 minutes, Apple's TooManyProviderTokenUpdates); 429 TooManyRequests
(this device token) and 5xx -> back off; anything else (another 403: the key, topic or team is wrong;
another 400: a bug) -> failed, logged: no device is to blame.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

import httpx
import structlog

from inri.common.http import retry_after_seconds
from inri.gateway.config import APNS_REFRESH_MIN_S, ApnsSection
from inri.gateway.jws import compact, es256, load_p8
from inri.gateway.provider import Outcome, Result
from inri.protocol.wake import WakeProvider

log = structlog.get_logger("inri.gateway.apns")

GONE_REASONS = frozenset({"BadDeviceToken", "DeviceTokenNotForTopic", "Unregistered", "ExpiredToken"})
EXPIRED_PROVIDER_TOKEN = "ExpiredProviderToken"
PRIORITY = {"background": "5", "alert": "10"}


class ApnsProvider:
    """Sends wake-ups to APNs (module docstring); `client` is an HTTP/2 httpx client for base_url."""

    name = WakeProvider.APNS

    def __init__(self, cfg: ApnsSection, key_path: str, client: httpx.AsyncClient, *,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.client = client
        self.clock = clock  # unix time: the JWT's iat and apns-expiration leave the process
        self._sign = es256(load_p8(key_path))
        self._token: str | None = None
        self._token_at = -math.inf
        self._forced_at = -math.inf  # last refresh on an ExpiredProviderToken answer
        self.counters: dict[str, int] = {}
        self.payload = json.dumps(self._payload(), separators=(",", ":")).encode()

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def _payload(self) -> dict[str, Any]:
        if self.cfg.push_type == "background":
            return {"aps": {"content-available": 1}}
        alert = {k: v for k, v in (("title", self.cfg.alert_title), ("body", self.cfg.alert_body)) if v}
        return {"aps": {"alert": alert, "mutable-content": 1}}

    def provider_token(self, *, force: bool = False) -> str:
        """The current ES256 provider token, a new one when older than token_refresh_s (or forced)."""
        now = self.clock()
        if force or self._token is None or now - self._token_at >= self.cfg.token_refresh_s:
            self._token = compact({"alg": "ES256", "kid": self.cfg.key_id},
                                  {"iss": self.cfg.team_id, "iat": int(now)}, self._sign)
            self._token_at = now
            self._count("token_refreshes")
        return self._token

    def _headers(self) -> dict[str, str]:
        expiration = int(self.clock()) + self.cfg.expiration_s if self.cfg.expiration_s else 0
        headers = {"authorization": "bearer " + self.provider_token(), "apns-topic": self.cfg.topic,
                   "apns-push-type": self.cfg.push_type, "apns-priority": PRIORITY[self.cfg.push_type],
                   "apns-expiration": str(expiration), "content-type": "application/json"}
        if self.cfg.collapse_id:
            headers["apns-collapse-id"] = self.cfg.collapse_id
        return headers

    async def send(self, device_token: str) -> Result:
        """One wake-up to device_token (a hex APNs device token, checked by inri.protocol.wake)."""
        url = self.cfg.base_url.rstrip("/") + "/3/device/" + device_token
        answer = await self._post(url)
        if isinstance(answer, tuple) and answer[0] == 403 and answer[1] == EXPIRED_PROVIDER_TOKEN:
            now = self.clock()
            if now - self._forced_at >= APNS_REFRESH_MIN_S:  # never more often (TooManyProviderTokenUpdates)
                self._forced_at = now
                self.provider_token(force=True)
                answer = await self._post(url)
        return answer if isinstance(answer, Result) else self._result(*answer)

    async def _post(self, url: str) -> Result | tuple[int, str, str | None]:
        """One request: (status, reason, Retry-After), or the Result when APNs could not be reached."""
        try:
            r = await self.client.post(url, content=self.payload, headers=self._headers())
        except httpx.HTTPError as exc:
            self._count("unreachable")
            return Result(Outcome.BACKOFF, f"unreachable: {type(exc).__name__}")
        self._count(f"status_{r.status_code}")
        return r.status_code, _reason(r), r.headers.get("retry-after")

    def _result(self, status: int, reason: str, retry_after: str | None) -> Result:
        if status == 200:
            return Result(Outcome.SENT, "sent")
        if status == 410 or (status == 400 and reason in GONE_REASONS):
            return Result(Outcome.GONE, reason or str(status))
        if status == 429:
            return Result(Outcome.BACKOFF, reason or "TooManyRequests", retry_after_seconds(retry_after),
                          per_token=reason != "TooManyProviderTokenUpdates")
        if status >= 500 or (status == 403 and reason == EXPIRED_PROVIDER_TOKEN):
            return Result(Outcome.BACKOFF, reason or str(status), retry_after_seconds(retry_after))
        log.error("APNs refused a wake-up for a reason that is not the device token: check [apns]",
                  status=status, reason=reason)
        return Result(Outcome.FAILED, reason or str(status))


def _reason(r: httpx.Response) -> str:
    """The `reason` of an APNs error body ("" when there is none or it is not APNs JSON)."""
    if not r.content or len(r.content) > 4096:
        return ""
    try:
        body = json.loads(r.content)
    except ValueError:
        return ""
    reason = body.get("reason") if isinstance(body, dict) else None
    return reason if isinstance(reason, str) and reason.isalnum() else ""
