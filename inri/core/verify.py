"""Registration signature checks, plain and cached.

The simulator shares ONE `CachingVerifier` across its thousands of in-process engines, so each
distinct registration is verified once instead of once per relay; a relay daemon uses one per process.
"""

from __future__ import annotations

from collections import OrderedDict

from inri.protocol.keys import (
    generation_signed_bytes,
    receipt_signed_bytes,
    receipts_signed_bytes,
    registration_signed_bytes,
    verify,
)
from inri.protocol.messages import Receipt, ReceiptBatch, Registration

DEFAULT_MAX_ENTRIES = 16_384  # distinct registrations remembered (about 6 MB at most in a daemon)
ID_FAST_PATH_MAX = 1024  # objects remembered by identity by default (a daemon decodes a new object per frame)


class SignatureVerifier:
    """Verifies the Ed25519 signature of a registration over its signed fields."""

    def verify_registration(self, registration: Registration) -> bool:
        r = registration
        return verify(
            r.route_key,
            registration_signed_bytes(r.route_key, r.epoch, r.issued_at, r.lifetime, r.receipt_key),
            r.signature,
        )

    def verify_receipt(self, receipt_key: bytes, route_id: bytes, receipt: Receipt) -> bool:
        """True when receipt carries the home relay's valid signature for this push, route and status."""
        sig = receipt.signature
        if sig is None:
            return False
        return verify(receipt_key, receipt_signed_bytes(receipt.push_id, route_id, receipt.status), sig)

    def verify_receipts(self, receipt_key: bytes, batch: ReceiptBatch) -> bool:
        """True when batch carries the home relay's valid signature (rule F5b) for its route and items."""
        return verify(receipt_key, receipts_signed_bytes(batch.route_id, batch.items), batch.signature)

    def verify_generation(self, receipt_key: bytes, route_id: bytes, epoch: int, generation: int,
                          signature: bytes) -> bool:
        """True when signature is the home relay's (the receipt key's) over this route generation (G10)."""
        return verify(receipt_key, generation_signed_bytes(route_id, epoch, generation), signature)


class CachingVerifier(SignatureVerifier):
    """A bounded LRU of verification results keyed by the registration's content (every signed field).

    Keying on content, not object identity, is what bounds the daemon's memory: it decodes a new
    Registration object from every push and gossip frame, and an identity-keyed table kept one entry
    per object (about 500 B per push until a wholesale clear at 100,000). Keying on the full
    registration, not the signature alone, means a valid signature cannot be replayed with another
    epoch or lifetime. A miss only costs one signature check.
    """

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES, *, identity_max: int = ID_FAST_PATH_MAX) -> None:
        """`identity_max` bounds the identity fast path: small in a daemon, whose objects are new per frame
        (each entry keeps its object alive), and as large as the number of registrations in a simulator,
        whose engines share one object per registration (a fast path smaller than that is cleared over and
        over and every lookup pays the content hash: a third of bench_engine's gossip rate)."""
        if max_entries < 1 or identity_max < 1:
            raise ValueError("max_entries and identity_max must be >= 1")
        self._cache: OrderedDict[Registration, bool] = OrderedDict()
        # Identity fast path, itself bounded: the simulator hands the same registration object to
        # thousands of engines, and an id() lookup skips hashing its five fields (and the LRU
        # bookkeeping: recency is refreshed only by content lookups). The entry holds
        # the object, so its id cannot be reused while cached; cleared wholesale when full.
        self._by_id: dict[int, tuple[Registration, bool]] = {}
        self._max = max_entries
        self._id_max = min(max_entries, identity_max)
        self.checks = 0  # signature verifications actually performed (the rest were cache hits)
        # Receipts: every relay on the reverse path checks the same receipt; in the simulator they share
        # this verifier, so each receipt is checked once. Keyed on everything the check depends on.
        self._receipts: OrderedDict[tuple[bytes, bytes, Receipt], bool] = OrderedDict()
        self._batches: OrderedDict[tuple[bytes, ReceiptBatch], bool] = OrderedDict()  # rule F5b
        # Route generations (G10): every relay a re-stem reaches checks the same signature.
        self._generations: OrderedDict[tuple[bytes, bytes, int, int, bytes], bool] = OrderedDict()

    def __len__(self) -> int:
        """Registrations remembered (at most max_entries)."""
        return len(self._cache)

    def verify_registration(self, registration: Registration) -> bool:
        same = self._by_id.get(id(registration))
        if same is not None and same[0] is registration:
            return same[1]
        cache = self._cache
        hit = cache.get(registration)
        if hit is None:
            self.checks += 1
            hit = super().verify_registration(registration)
            cache[registration] = hit
            if len(cache) > self._max:
                cache.popitem(last=False)  # least recently used
        else:
            cache.move_to_end(registration)
        if len(self._by_id) >= self._id_max:
            self._by_id.clear()
        self._by_id[id(registration)] = (registration, hit)
        return hit

    def verify_generation(self, receipt_key: bytes, route_id: bytes, epoch: int, generation: int,
                          signature: bytes) -> bool:
        gkey = (receipt_key, route_id, epoch, generation, signature)
        cache = self._generations
        hit = cache.get(gkey)
        if hit is None:
            self.checks += 1
            hit = super().verify_generation(receipt_key, route_id, epoch, generation, signature)
            cache[gkey] = hit
            if len(cache) > self._max:
                cache.popitem(last=False)
        return hit

    def verify_receipts(self, receipt_key: bytes, batch: ReceiptBatch) -> bool:
        key = (receipt_key, batch)
        cache = self._batches
        hit = cache.get(key)
        if hit is None:
            self.checks += 1
            hit = super().verify_receipts(receipt_key, batch)
            cache[key] = hit
            if len(cache) > self._max:
                cache.popitem(last=False)
        return hit

    def verify_receipt(self, receipt_key: bytes, route_id: bytes, receipt: Receipt) -> bool:
        key = (receipt_key, route_id, receipt)
        cache = self._receipts
        hit = cache.get(key)
        if hit is None:
            self.checks += 1
            hit = super().verify_receipt(receipt_key, route_id, receipt)
            cache[key] = hit
            if len(cache) > self._max:
                cache.popitem(last=False)
        return hit
