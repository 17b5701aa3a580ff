"""Registration signature checks, plain and cached.

The simulator shares ONE `CachingVerifier` across its thousands of in-process engines, so each
distinct registration is verified once instead of once per relay; a relay daemon uses one per process.
"""

from __future__ import annotations

from inri.protocol.keys import registration_signed_bytes, verify
from inri.protocol.messages import Registration


class SignatureVerifier:
    """Verifies the Ed25519 signature of a registration over its signed fields."""

    def verify_registration(self, registration: Registration) -> bool:
        r = registration
        return verify(
            r.route_key, registration_signed_bytes(r.route_key, r.epoch, r.issued_at, r.lifetime), r.signature
        )


class CachingVerifier(SignatureVerifier):
    """A bounded cache of verification results keyed by the whole registration (every signed field).

    Keying on the full registration, not the signature alone, means a valid signature cannot be
    replayed with another epoch or lifetime. When full, the cache is cleared wholesale: cheaper than
    LRU bookkeeping on the hot path, and a miss only costs one signature check.
    """

    def __init__(self, max_entries: int = 100_000) -> None:
        self._cache: dict[Registration, bool] = {}
        self._max = max_entries
        self.checks = 0  # signature verifications actually performed (the rest were cache hits)

    def verify_registration(self, registration: Registration) -> bool:
        hit = self._cache.get(registration)
        if hit is not None:
            return hit
        self.checks += 1
        ok = super().verify_registration(registration)
        if len(self._cache) >= self._max:
            self._cache.clear()
        self._cache[registration] = ok
        return ok
