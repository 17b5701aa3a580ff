"""CachingVerifier: bounded memory however many registration objects pass through it (issue 13 item 1)."""

from __future__ import annotations

import tracemalloc

from inri.core.verify import CachingVerifier
from inri.protocol.codec import decode_registration, encode_registration, make_registration
from inri.protocol.keys import new_signing_key

KEY = new_signing_key(b"\x07" * 32)


def test_verifying_fresh_copies_of_one_registration_keeps_memory_flat() -> None:
    """The daemon decodes a new Registration object from every push: the cache must not keep one per object."""
    wire = encode_registration(make_registration(KEY, 1, 1_000, 3_600))
    cv = CachingVerifier()
    for _ in range(2_000):  # warm up: the one entry, allocator pools
        assert cv.verify_registration(decode_registration(wire))
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for _ in range(30_000):
            assert cv.verify_registration(decode_registration(wire))
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # The old identity-keyed table held ~400 B per object here (~12 MB); a bounded cache holds ~0.
    assert after - before < 256 * 1024, f"verifier grew by {after - before} bytes over 30,000 checks"
    assert cv.checks == 1 and len(cv) == 1


def test_distinct_registrations_are_bounded_lru() -> None:
    regs = [make_registration(KEY, e, 1_000, 3_600) for e in range(1, 41)]
    cv = CachingVerifier(max_entries=16)
    hot = encode_registration(regs[0])
    for r in regs:
        assert cv.verify_registration(r)
        assert cv.verify_registration(decode_registration(hot))  # kept hot: never evicted
    assert len(cv) == 16 and cv.checks == 40
    assert cv.verify_registration(decode_registration(encode_registration(regs[0])))
    assert cv.checks == 40  # a copy of the hot one is a hit (keyed by content)
    assert cv.verify_registration(decode_registration(encode_registration(regs[1])))
    assert cv.checks == 41  # an evicted one is checked again
