"""Mesh shape of the simulator's topology builders (issue 17, items 1 and 2).

For each size, prints the mean shortest path (hops), the eccentricity (largest and mean over the BFS
sources) and the degrees of:

- random: the random builder (min..max degree);
- geographic: nearest relays plus one random far link (simulations/topology.py);
- built: the mesh the shipped bootstrap ranking and membership form (simulations/built.py), with
  rule M5 (near first, `far_links` = 1 random far link);
- built-proximity: the same, far_links = 0 (proximity decides every dialled link);
- built-unranked: the same, the bootstrap's answer handed over unranked (the membership before M5:
  a random choice among the candidates).

Usage: python benchmarks/bench_topology.py [--sizes 1000,5000,10000] [--neighbours 3-4] [--sources 300]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import replace

from inri.core.config import EngineConfig
from simulations.built import built_edges
from simulations.scenario import Topology
from simulations.topology import build, shape


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,5000,10000")
    ap.add_argument("--neighbours", default="3-4", help="min-max degree (active_min-active_max for built)")
    ap.add_argument("--sources", type=int, default=300, help="BFS sources (all relays when the mesh is smaller)")
    ap.add_argument("--kinds", default="random,geographic,built,built-proximity,built-unranked")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    lo, _, hi = args.neighbours.partition("-")
    mn, mx = int(lo), int(hi or lo)
    figures: list[dict[str, object]] = []
    for n in (int(s) for s in args.sizes.split(",")):
        for kind in args.kinds.split(","):
            rng = random.Random(args.seed)
            topo = Topology(kind=kind.split("-")[0], relays=n, min_degree=mn, max_degree=mx)
            cfg = EngineConfig(active_min=mn, active_max=mx)
            t0 = time.perf_counter()
            if kind in ("built-proximity", "built-unranked"):
                pos = [(rng.random(), rng.random()) for _ in range(n)]
                edges, rep = built_edges(n, pos, replace(cfg, far_links=0 if kind == "built-proximity" else 1),
                                         random.Random(rng.getrandbits(64)), ranked=kind == "built-proximity")
                edge_list = sorted(edges)
                formation: dict[str, int] | None = rep.as_dict()
            else:
                net = build(topo, rng, cfg)
                edge_list = net.undirected_edges()
                formation = net.formation
            built_s = time.perf_counter() - t0
            fig = shape(n, edge_list, sources=args.sources, rng=random.Random(args.seed + 1))
            row: dict[str, object] = {"relays": n, "kind": kind, "neighbours": args.neighbours, **fig,
                                      "build_s": round(built_s, 1)}
            if formation:
                row["formation"] = formation
            print(json.dumps(row), flush=True)
            figures.append({"metric": f"mean path {kind} {n}", "value": fig["mean_path"], "unit": "hops",
                            "note": f"eccentricity {fig['eccentricity_max']}"})
            if kind == "built":
                # Issue 17 item 2: within 1.5x of a random 3-regular graph's mean path, same relays.
                reg = build(Topology(kind="random", relays=n, min_degree=3, max_degree=3), random.Random(args.seed))
                ref = shape(n, reg.undirected_edges(), sources=args.sources, rng=random.Random(args.seed + 1))
                figures.append({"metric": f"built / random 3-regular {n}",
                                "value": round(float(fig["mean_path"]) / float(ref["mean_path"]), 3),
                                "unit": "x", "ceiling": 1.5, "note": f"3-regular: {ref['mean_path']} hops"})
    print(json.dumps({"bench": "topology", "figures": figures}))


if __name__ == "__main__":
    main()
