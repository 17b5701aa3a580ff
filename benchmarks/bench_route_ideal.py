"""What a push costs at best on a scenario's mesh (issue 17: the messages and stretch bars).

Builds the scenario's network exactly as `inri-sim run` does for the seed (the same topology stream),
then, over pairs (injecting relay, home relay) drawn at random, follows the path that minimises
`latency + per-hop cost` (per hop: the link's latency plus the receiving relay's processing, the
weights of `stretch_*`, docs/metrics.md) for several per-hop costs:

- per-hop cost 0 is the latency-first route that registration flooding learns (the first arrival);
- a large per-hop cost is the fewest-hop route (latency breaks ties).

For each it prints the mean hops, the messages a push and its receipt cost along that path with
nothing lost and nothing failed (2 x hops: one `push_forwarded` and one `receipt_forwarded` per link,
the terms of `messages_per_delivered_push`) and the path's latency over the latency-first path's
(the stretch such a route has with no recovery). Each row is the floor for routes of its kind (loss,
churn and searches only add to it); the fewest-hop row is the floor for any routing that sends a push
and its receipt hop by hop.

Usage: python benchmarks/bench_route_ideal.py [--scenario geo-5k-3n] [--seed 5] [--sources 200]
       [--homes 40] [--costs-ms 0,5,10,20,50,1000]
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import time
from collections.abc import Sequence

from simulations.metrics import nearest_rank
from simulations.scenario import Scenario, load
from simulations.topology import Network, build
from simulations.workload import Streams


def _paths(net: Network, adj: list[list[tuple[int, float]]], src: int, cost: float) -> tuple[list[float], list[int]]:
    """Dijkstra from src over latency + processing + cost per hop: (latency, hops) of the chosen path
    to every relay (latency inf where unreachable)."""
    n = net.n
    inf = float("inf")
    best = [inf] * n
    lat = [inf] * n
    hops = [0] * n
    best[src] = 0.0
    lat[src] = 0.0
    heap = [(0.0, src)]
    while heap:
        d, u = heapq.heappop(heap)
        if d > best[u]:
            continue
        for v, w in adj[u]:
            nd = d + w + cost
            if nd < best[v]:
                best[v] = nd
                lat[v] = lat[u] + w
                hops[v] = hops[u] + 1
                heapq.heappush(heap, (nd, v))
    return lat, hops


def _pct(xs: list[float], q: float) -> float:
    got = nearest_rank(sorted(xs), q)
    assert got is not None
    return got


def measure(sc: Scenario, seed: int, sources: int = 200, homes: int = 40,
            costs: Sequence[float] = (0.0,)) -> list[dict[str, object]]:
    """One row per per-hop cost (seconds; 0 is always measured, first): the scenario's mesh for the seed
    as `inri-sim run` builds it, `sources` x `homes` pairs drawn with a fixed stream."""
    net = build(sc.topology, Streams.from_seed(seed).topo, sc.engine)
    adj: list[list[tuple[int, float]]] = [[] for _ in range(net.n)]
    for (u, v), link_s in sorted(net.latency.items()):
        adj[u].append((v, link_s + net.processing[v]))
    rng = random.Random(1)
    srcs = rng.sample(range(net.n), min(sources, net.n))
    dsts = [rng.randrange(net.n) for _ in range(homes)]
    base: dict[tuple[int, int], float] = {}
    rows: list[dict[str, object]] = []
    for cost in sorted({0.0, *costs}):
        hops_all: list[int] = []
        stretch: list[float] = []
        for s in srcs:
            lat, hops = _paths(net, adj, s, cost)
            for h in dsts:
                if h == s or lat[h] == float("inf"):
                    continue
                if cost == 0.0:
                    base[(s, h)] = lat[h]
                hops_all.append(hops[h])
                stretch.append(lat[h] / base[(s, h)])
        mean_hops = statistics.fmean(hops_all)
        rows.append({"scenario": sc.name, "seed": seed, "relays": net.n, "links": len(net.latency) // 2,
                     "per_hop_cost_ms": cost * 1000.0, "pairs": len(hops_all), "hops_mean": round(mean_hops, 2),
                     "hops_p50": _pct([float(h) for h in hops_all], 0.5),
                     "messages_push_and_receipt": round(2 * mean_hops, 1),
                     "stretch_median": round(_pct(stretch, 0.5), 3), "stretch_p95": round(_pct(stretch, 0.95), 3)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="geo-5k-3n")
    ap.add_argument("--seed", type=int, default=None, help="the scenario's seed unless given")
    ap.add_argument("--sources", type=int, default=200, help="injecting relays drawn")
    ap.add_argument("--homes", type=int, default=40, help="home relays drawn (pairs: sources x homes)")
    ap.add_argument("--costs-ms", default="0,5,10,20,50,1000", help="per-hop costs added to the latency")
    ap.add_argument("--json", action="store_true", help="one JSON line per cost instead of the table")
    args = ap.parse_args()
    sc = load(args.scenario)
    seed = sc.seed if args.seed is None else args.seed
    t0 = time.perf_counter()
    rows = measure(sc, seed, args.sources, args.homes, [float(c) / 1000.0 for c in args.costs_ms.split(",")])
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return
    r0 = rows[0]
    print(f"{r0['scenario']} seed {seed}: {r0['relays']} relays, {r0['links']} links, {r0['pairs']} pairs, "
          f"{time.perf_counter() - t0:.0f} s")
    print("| per-hop cost (ms) | hops mean / p50 | push + receipt messages, nothing lost | stretch median / p95 |")
    print("|---|---|---|---|")
    for r in rows:
        label = "0 (latency-first)" if r["per_hop_cost_ms"] == 0 else f"{r['per_hop_cost_ms']:g}"
        print(f"| {label} | {r['hops_mean']:.2f} / {r['hops_p50']:.0f} | {r['messages_push_and_receipt']:.1f} "
              f"| {r['stretch_median']:.3f} / {r['stretch_p95']:.3f} |")
    last = rows[-1]
    print(json.dumps({"bench": "route_ideal", "figures": [
        {"metric": f"{r0['scenario']}: push + receipt messages, latency-first route, nothing lost",
         "value": r0["messages_push_and_receipt"], "unit": "messages"},
        {"metric": f"{r0['scenario']}: push + receipt messages, fewest-hop route ({last['per_hop_cost_ms']:g} ms/hop)",
         "value": last["messages_push_and_receipt"], "unit": "messages",
         "note": f"stretch p95 {last['stretch_p95']}"}]}))


if __name__ == "__main__":
    main()
