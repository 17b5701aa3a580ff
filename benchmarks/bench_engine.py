"""Engine hot paths: registration gossip receptions/s and push forwards/s on one engine (tracing off).

Baseline in the same run: a bare dict-update loop over the same number of items (what Python can
do at best per item), so the ratio says how many dict operations one engine call costs.
"""

from __future__ import annotations

import json
import random
import statistics
import time

from inri.core.config import EngineConfig
from inri.core.engine import Engine
from inri.core.home import MemoryHomeStore
from inri.core.trace import NullTracer
from inri.core.verify import CachingVerifier
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import Push, RegGossip

N = 50_000


def setup() -> tuple[Engine, list[RegGossip]]:
    verifier = CachingVerifier(max_entries=N * 2, identity_max=N * 2)  # shared objects, as in the simulator
    # Budgets are not measured here: every flood budget is lifted, the per-origin one too (every gossip
    # below is a new epoch of one route id; with its budget at 1/s, all but the first few were dropped
    # and the figure measured the drop path, not "set route + forward to 3").
    unlimited = EngineConfig(reg_budget_per_peer_per_s=1e9, reg_budget_peer_burst=10**9,
                             reg_budget_per_origin_per_s=1e9, reg_budget_burst=10**9,
                             push_budget_per_peer_per_s=1e9, push_budget_peer_burst=10**9)
    eng = Engine("me", unlimited, verifier=verifier,
                 home=MemoryHomeStore(), tracer=NullTracer(), rng=random.Random(1))
    for p in ("a", "b", "c", "d"):
        eng.peer_up(p, 0.0, outbound=True)
    key = new_signing_key(b"\x01" * 32)
    gossips = [RegGossip(make_registration(key, e + 1, 0, 10**6), 10, 3) for e in range(N)]
    for g in gossips:  # warm the shared verifier cache, as in the simulator
        verifier.verify_registration(g.registration)
    return eng, gossips


def bench_gossip() -> float:
    eng, gossips = setup()
    t0 = time.perf_counter()
    for g in gossips:  # each a newer epoch of one route id: full first-arrival path (set + forward x3)
        eng.receive_message("a", g, 1.0)
    rate = N / (time.perf_counter() - t0)
    assert not any(k.startswith("reg_dropped") for k in eng.counters), eng.counters  # measures what it says
    return rate


def bench_push() -> float:
    eng, gossips = setup()
    eng.receive_message("a", gossips[0], 1.0)
    reg = gossips[0].registration
    pushes = [Push(random.Random(i).randbytes(16), reg.route_id, b"t" * 16, b"c" * 64, 20, 2, 0, 0, None)
              for i in range(N)]
    t0 = time.perf_counter()
    for p in pushes:
        eng.receive_message("b", p, 1.0)
    return N / (time.perf_counter() - t0)


def bench_baseline() -> float:
    d: dict[int, tuple[int, float, int, str, int]] = {}
    t0 = time.perf_counter()
    for i in range(N):
        d[i] = (i, 1.0, 3, "a", 4)
    return N / (time.perf_counter() - t0)


def main() -> None:
    runs = 5
    gossip = statistics.median(bench_gossip() for _ in range(runs))
    push = statistics.median(bench_push() for _ in range(runs))
    base = statistics.median(bench_baseline() for _ in range(runs))
    print(f"registration gossip receptions/s (set route + forward to 3): {gossip:,.0f}")
    print(f"push forwards/s (route lookup + reverse state + forward):     {push:,.0f}")
    print(f"baseline dict inserts/s (same run):                          {base:,.0f}")
    print(json.dumps({"bench": "engine", "figures": [
        {"metric": "gossip receptions/s", "value": round(gossip), "unit": "/s",
         "ceiling": f"dict inserts {base:,.0f}/s", "note": f"median of {runs}"},
        {"metric": "push forwards/s", "value": round(push), "unit": "/s",
         "ceiling": f"dict inserts {base:,.0f}/s", "note": f"median of {runs}"},
    ]}))


if __name__ == "__main__":
    main()
