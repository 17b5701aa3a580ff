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
        # Identity fast path: the simulator hands the same registration object to thousands of
        # engines; an id() lookup skips hashing its five fields. The entry holds the object itself,
        # so its id cannot be reused while cached.
        self._by_id: dict[int, tuple[Registration, bool]] = {}
        self._max = max_entries
        self.checks = 0  # signature verifications actually performed (the rest were cache hits)

    def verify_registration(self, registration: Registration) -> bool:
        same = self._by_id.get(id(registration))
        if same is not None and same[0] is registration:
            return same[1]
        hit = self._cache.get(registration)
        if hit is None:
            self.checks += 1
            hit = super().verify_registration(registration)
            if len(self._cache) >= self._max:
                self._cache.clear()
                self._by_id.clear()
            self._cache[registration] = hit
        self._by_id[id(registration)] = (registration, hit)
        return hit
