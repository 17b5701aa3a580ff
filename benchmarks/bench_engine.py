"""Engine hot paths: registration gossip receptions/s and push forwards/s on one engine (tracing off).

Baseline in the same run: a bare dict-update loop over the same number of items (what Python can
do at best per item), so the ratio says how many dict operations one engine call costs.

Both route tables side by side (issue 18, item 2: routes at 100 B or less, no slower per push
forward): `[engine] route_table = "compact"` (the relay's default) and `"dict"` (the table before,
the simulator's default), runs interleaved, medians. Push forwards are measured on one route (every
lookup hits the same record: the table's code path alone) and on `MANY` routes with each push to a
random one (lookups that miss the CPU caches, as on a relay holding many routes).
"""

from __future__ import annotations

import json
import random
import statistics
import time

from bench_route_memory import TrustAll  # this directory: the script's own (signatures beside the point)

from inri.core.api import Send
from inri.core.config import EngineConfig
from inri.core.engine import Engine
from inri.core.home import MemoryHomeStore
from inri.core.trace import NullTracer
from inri.core.verify import CachingVerifier
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import Push, RegGossip, Registration

N = 50_000
MANY = 200_000  # routes cached for the many-routes push figure
TABLES = ("compact", "dict")


def setup(table: str = "compact") -> tuple[Engine, list[RegGossip]]:
    verifier = CachingVerifier(max_entries=N * 2, identity_max=N * 2)  # shared objects, as in the simulator
    # Budgets are not measured here: every flood budget is lifted, the per-origin one too (every gossip
    # below is a new epoch of one route id; with its budget at 1/s, all but the first few were dropped
    # and the figure measured the drop path, not "set route + forward to 3").
    unlimited = EngineConfig(reg_budget_per_peer_per_s=1e9, reg_budget_peer_burst=10**9,
                             reg_budget_per_origin_per_s=1e9, reg_budget_burst=10**9,
                             push_budget_per_peer_per_s=1e9, push_budget_peer_burst=10**9,
                             route_table=table)  # type: ignore[arg-type]  # one of TABLES
    eng = Engine("me", unlimited, verifier=verifier,
                 home=MemoryHomeStore(), tracer=NullTracer(), rng=random.Random(1))
    for p in ("a", "b", "c", "d"):
        eng.peer_up(p, 0.0, outbound=True)
    key = new_signing_key(b"\x01" * 32)
    gossips = [RegGossip(make_registration(key, e + 1, 0, 10**6), 10, 3) for e in range(N)]
    for g in gossips:  # warm the shared verifier cache, as in the simulator
        verifier.verify_registration(g.registration)
    return eng, gossips


def bench_gossip(table: str = "compact") -> float:
    eng, gossips = setup(table)
    t0 = time.perf_counter()
    for g in gossips:  # each a newer epoch of one route id: full first-arrival path (set + forward x3)
        eng.receive_message("a", g, 1.0)
    rate = N / (time.perf_counter() - t0)
    assert not any(k.startswith("reg_dropped") for k in eng.counters), eng.counters  # measures what it says
    return rate


def bench_push(table: str = "compact") -> float:
    eng, gossips = setup(table)
    eng.receive_message("a", gossips[0], 1.0)
    reg = gossips[0].registration
    pushes = [Push(random.Random(i).randbytes(16), reg.route_id, b"t" * 16, b"c" * 64, 20, 2, 0, 0, None)
              for i in range(N)]
    t0 = time.perf_counter()
    for p in pushes:
        eng.receive_message("b", p, 1.0)
    return N / (time.perf_counter() - t0)


def many_routes(table: str) -> tuple[Engine, list[Push]]:
    """An engine holding MANY routes (half with a backup next hop) and N pushes to random ones."""
    cfg = EngineConfig(route_max=MANY + 1, reg_budget_per_peer_per_s=1e12, reg_budget_peer_burst=10**12,
                       push_budget_per_peer_per_s=1e12, push_budget_peer_burst=10**12,
                       route_table=table)  # type: ignore[arg-type]  # one of TABLES
    eng = Engine("me", cfg, verifier=TrustAll(), home=MemoryHomeStore(), tracer=NullTracer(),
                 rng=random.Random(1))
    for p in ("a", "b", "c", "d"):
        eng.peer_up(p, 0.0, outbound=True)
    rng = random.Random(2)
    rids = []
    for i in range(MANY):
        reg = Registration(rng.randbytes(32), 1, 0, 10**6, b"s" * 64)
        eng.receive_message("a", RegGossip(reg, 0, 3), 1.0)  # ttl 0: cache, do not forward
        if i % 2:
            eng.receive_message("c", RegGossip(reg, 0, 2), 1.0)
        rids.append(reg.route_id)
    pushes = [Push(rng.randbytes(16), rng.choice(rids), b"t" * 16, b"c" * 64, 20, 2, 0, 0, None) for _ in range(N)]
    probe = Push(b"p" * 16, rids[0], b"t" * 16, b"c" * 64, 20, 2, 0, 0, None)
    sent = [e for e in eng.receive_message("b", probe, 1.0) if isinstance(e, Send)]
    assert sent and sent[0].peer == "a", sent  # the push goes to the route's primary
    return eng, pushes


def bench_push_many(table: str) -> float:
    eng, pushes = many_routes(table)
    t0 = time.perf_counter()
    for p in pushes:
        eng.receive_message("b", p, 1.0)
    rate = N / (time.perf_counter() - t0)
    # measures what it says: every push found its route and was forwarded (none dropped or searched)
    assert not any(k.startswith("push_") for k in eng.counters), eng.counters
    return rate


def bench_baseline() -> float:
    d: dict[int, tuple[int, float, int, str, int]] = {}
    t0 = time.perf_counter()
    for i in range(N):
        d[i] = (i, 1.0, 3, "a", 4)
    return N / (time.perf_counter() - t0)


def main() -> None:
    runs = 5
    got: dict[str, dict[str, list[float]]] = {t: {"gossip": [], "push": [], "push_many": []} for t in TABLES}
    for _ in range(runs):  # interleaved: both tables see the same machine load
        for t in TABLES:
            got[t]["gossip"].append(bench_gossip(t))
            got[t]["push"].append(bench_push(t))
    for _ in range(3):  # the many-routes setup takes seconds: 3 runs
        for t in TABLES:
            got[t]["push_many"].append(bench_push_many(t))
    base = statistics.median(bench_baseline() for _ in range(runs))
    med = {t: {k: statistics.median(v) for k, v in got[t].items()} for t in TABLES}
    gossip, push, many = med["compact"]["gossip"], med["compact"]["push"], med["compact"]["push_many"]
    rows = [("registration gossip receptions/s (set route + forward to 3)", "gossip"),
            ("push forwards/s, one route (lookup + reverse state + forward)", "push"),
            (f"push forwards/s, {MANY:,} routes, each push to a random one", "push_many")]
    print(f"{'route table':<64} {'compact (default)':>18} {'dict':>10}")
    for label, key in rows:
        print(f"{label:<64} {med['compact'][key]:>18,.0f} {med['dict'][key]:>10,.0f}")
    print(f"{'baseline dict inserts/s (same run)':<64} {base:>18,.0f}")
    ratio = {k: med["compact"][k] / med["dict"][k] for k in ("gossip", "push", "push_many")}
    print("compact / dict: " + ", ".join(f"{k} {v:.2f}" for k, v in ratio.items()))
    print(json.dumps({"bench": "engine", "figures": [
        {"metric": "gossip receptions/s", "value": round(gossip), "unit": "/s",
         "ceiling": f"dict inserts {base:,.0f}/s; dict table {med['dict']['gossip']:,.0f}/s",
         "note": f"median of {runs}, compact table"},
        {"metric": "push forwards/s", "value": round(push), "unit": "/s",
         "ceiling": f"dict inserts {base:,.0f}/s; dict table {med['dict']['push']:,.0f}/s",
         "note": f"median of {runs}, compact table, one route"},
        {"metric": "push forwards/s, many routes", "value": round(many), "unit": "/s",
         "ceiling": f"dict table {med['dict']['push_many']:,.0f}/s",
         "note": f"median of 3, compact table, {MANY:,} routes"},
    ]}))


if __name__ == "__main__":
    main()
