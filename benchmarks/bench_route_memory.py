"""Bytes per cached route, measured with tracemalloc over 1,000,000 routes in one engine (aim <= 100 B).

Counted: everything the engine keeps to hold the routes (table slots, entries, distances), the
16-byte route ids included. Each route id is a fresh bytes object made inside the measured window and
dropped after its gossip (as a daemon drops a frame after handling it): a table that keeps the object as
its key is charged for it (49 B), one that copies the 16 bytes is charged for the copy. Not counted:
the registrations (in the simulator they are shared objects; a daemon drops them after verification).
"""

from __future__ import annotations

import json
import random
import tracemalloc

from inri.core.config import EngineConfig
from inri.core.engine import Engine
from inri.core.home import MemoryHomeStore
from inri.core.trace import NullTracer
from inri.protocol.messages import Receipt, ReceiptBatch, RegGossip, Registration

ROUTES = 1_000_000


class TrustAll:
    """Signatures are beside the point here: memory is."""

    def verify_registration(self, registration: Registration) -> bool:
        return True

    def verify_receipt(self, receipt_key: bytes, route_id: bytes, receipt: Receipt) -> bool:
        return True

    def verify_receipts(self, receipt_key: bytes, batch: ReceiptBatch) -> bool:
        return True

    def verify_generation(self, receipt_key: bytes, route_id: bytes, epoch: int, generation: int,
                          signature: bytes) -> bool:
        return True


def main() -> None:
    cfg = EngineConfig(route_max=ROUTES + 1, reg_budget_per_peer_per_s=1e12, reg_budget_peer_burst=10**12,
                       route_table="compact")  # the dict table is the "old layout" row below
    eng = Engine("me", cfg, verifier=TrustAll(), home=MemoryHomeStore(), tracer=NullTracer(), rng=random.Random(1))
    eng.peer_up("a", 0.0, outbound=True)
    eng.peer_up("b", 0.0, outbound=True)
    rng = random.Random(2)
    regs = [Registration(rng.randbytes(32), 1, 0, 10**6, b"s" * 64) for _ in range(ROUTES)]
    rids = [reg.route_id for reg in regs]  # computed at construction; copied below, inside the window
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i, reg in enumerate(regs):
        # a fresh route id object per route, as a frame decoded off the wire carries (else the table's
        # keys would be the shared objects made before the window, and cost nothing here)
        object.__setattr__(reg, "route_id", bytes(bytearray(rids[i])))
        eng.receive_message("a", RegGossip(reg, 0, 3), 1.0)  # ttl 0: cache, do not forward
        if i % 2:
            eng.receive_message("b", RegGossip(reg, 0, 2), 1.0)  # half get a backup next hop
        object.__setattr__(reg, "route_id", rids[i])  # the fresh object is dropped unless the engine kept it
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    per_route = (after - before) / ROUTES
    routed = eng.route_count()
    del eng
    old = dict_of_tuples(rids)
    print(f"routes cached: {routed:,}")
    print(f"engine allocations per route (route id included): {per_route:.1f} B")
    print(f"a dict of flat tuples keyed by the route id (the table before issue 18), same routes: {old:.1f} B")
    print(json.dumps({"bench": "route_memory", "figures": [
        {"metric": "bytes per cached route", "value": round(per_route, 1), "unit": "B",
         "ceiling": f"target 100 B; dict of tuples {old:.0f} B",
         "note": "tracemalloc, 1M routes, half with a backup, key included"}]}))


def dict_of_tuples(rids: list[bytes]) -> float:
    """Bytes per route of the former layout (dict: route id object -> (epoch, expires, distance, peer, hops,
    ...)), filled with the same routes and measured the same way: the baseline beside the figure."""
    table: dict[bytes, tuple[object, ...]] = {}
    expires = 10**6  # one shared object, as the registrations of the engine run share theirs
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for i, rid in enumerate(rids):
        key = bytes(bytearray(rid))
        e: tuple[object, ...] = (1, expires, 4, "a", 4)
        table[key] = (*e, "b", 3) if i % 2 else e
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return (after - before) / len(rids)


if __name__ == "__main__":
    main()
