"""Bytes per cached route, measured with tracemalloc over 1,000,000 routes in one engine (aim <= 200 B).

Counted: everything the engine allocates to hold the routes (table slots, entries, distances),
plus the 16-byte route id keys themselves. Not counted: the registrations (in the simulator they are
shared objects; a daemon drops them after verification).
"""

from __future__ import annotations

import json
import random
import tracemalloc

from inri.core.config import EngineConfig
from inri.core.engine import Engine
from inri.core.home import MemoryHomeStore
from inri.core.trace import NullTracer
from inri.protocol.messages import Receipt, RegGossip, Registration

ROUTES = 1_000_000


class TrustAll:
    """Signatures are beside the point here: memory is."""

    def verify_registration(self, registration: Registration) -> bool:
        return True

    def verify_receipt(self, receipt_key: bytes, route_id: bytes, receipt: Receipt) -> bool:
        return True


def main() -> None:
    cfg = EngineConfig(route_max=ROUTES + 1, reg_budget_per_peer_per_s=1e12, reg_budget_peer_burst=10**12)
    eng = Engine("me", cfg, verifier=TrustAll(), home=MemoryHomeStore(), tracer=NullTracer(), rng=random.Random(1))
    eng.peer_up("a", 0.0, outbound=True)
    eng.peer_up("b", 0.0, outbound=True)
    rng = random.Random(2)
    regs = [Registration(rng.randbytes(32), 1, 0, 10**6, b"s" * 64) for _ in range(ROUTES)]
    # route ids are computed at construction; measure only what the engine keeps per route
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i, reg in enumerate(regs):
        eng.receive_message("a", RegGossip(reg, 0, 3), 1.0)  # ttl 0: cache, do not forward
        if i % 2:
            eng.receive_message("b", RegGossip(reg, 0, 2), 1.0)  # half get a backup next hop
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    key_bytes = sum(len(r.route_id) + 33 for r in regs[:1]) * ROUTES  # bytes object header + 16 bytes
    per_route = (after - before) / ROUTES
    print(f"routes cached: {eng.route_count():,}")
    print(f"engine allocations per route: {per_route:.1f} B (+ {key_bytes / ROUTES:.0f} B for the route id key)")
    print(json.dumps({"bench": "route_memory", "figures": [
        {"metric": "bytes per cached route", "value": round(per_route + key_bytes / ROUTES, 1), "unit": "B",
         "ceiling": "target 200 B", "note": "tracemalloc, 1M routes, half with a backup, key included"}]}))


if __name__ == "__main__":
    main()
