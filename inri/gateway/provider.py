"""What a push provider (APNs, FCM) answered, in the terms the gateway answers a relay in."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol

from inri.protocol.wake import WakeProvider


class Outcome(enum.Enum):
    """A provider's answer to one wake-up, and what the gateway tells the home relay (docs/gateway.md)."""

    SENT = "sent"  # accepted by Apple/Google: 200
    GONE = "gone"  # the device token is gone for good: 410, the relay drops the hook
    BACKOFF = "backoff"  # later (429, 5xx, unreachable): 503 with Retry-After, the relay retries
    FAILED = "failed"  # refused for a reason that is not the token (the gateway's configuration): 502


@dataclass(frozen=True, slots=True)
class Result:
    """One provider answer: the outcome, the provider's reason (e.g. "Unregistered"), its Retry-After."""

    outcome: Outcome
    reason: str
    retry_after: float | None = None
    per_token: bool = False  # BACKOFF for this device token only (APNs TooManyRequests, FCM QUOTA_EXCEEDED)


class Provider(Protocol):
    """A push provider: sends one content-free wake-up to one device token."""

    name: WakeProvider
    counters: dict[str, int]  # responses by status, token refreshes (for /metrics)

    async def send(self, device_token: str) -> Result: ...

