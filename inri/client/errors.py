"""Typed errors of the client SDK."""

from __future__ import annotations

import httpx


class ApiError(Exception):
    """A relay answered with a problem+json error (code is the stable problem code)."""

    def __init__(self, code: str, status: int, detail: str, retry_after: float | None = None) -> None:
        super().__init__(f"{code} ({status}): {detail}")
        self.code = code
        self.status = status
        self.detail = detail
        self.retry_after = retry_after

    @classmethod
    def from_response(cls, r: httpx.Response) -> ApiError:
        """Parse a problem+json answer (or make the best of any other error body)."""
        try:
            body = r.json()
            code, detail = str(body.get("code", r.status_code)), str(body.get("detail", ""))
        except (ValueError, AttributeError):
            code, detail = f"http_{r.status_code}", r.text[:200]
        retry = r.headers.get("retry-after")
        try:
            retry_after = float(retry) if retry is not None else None
        except ValueError:
            retry_after = None
        return cls(code, r.status_code, detail, retry_after)


class NoTokensLeft(Exception):
    """The push credential has no unspent token: ask the device for a fresh credential."""
