"""Registration gossip, flood vs tree (issue 18, item 1), side by side in one run of this script.

Each scenario runs twice through the real CLI, `--gossip-scheme flood` and `--gossip-scheme tree` (same
seed, topology, workload and homes), and prints the issue's acceptance figures for both:
gossip_bytes_ratio (<= 1.5 with tree), route_coverage (>= 0.99), route_k2_share (tree not lower than
flood), convergence_p50_s (tree at most 20% slower), delivery_ratio (unchanged), and the push stretch
(median / p95: what a default switch must keep). Set
BENCH_GOSSIP_SCENARIOS to choose (comma-separated; default baseline-1k; churn-10k takes long).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

KEYS = ("gossip_bytes_ratio", "overhead_ratio", "route_coverage", "route_k2_share", "convergence_p50_s",
        "convergence_p90_s", "delivery_ratio", "latency_p50_s", "stretch_median", "stretch_p95", "events_per_s",
        "wall_s")


def run(scenario: str, scheme: str) -> dict[str, Any]:
    args = [sys.executable, "-m", "simulations.cli", "run", scenario, "--trace-level", "off", "--progress", "off",
            "--gossip-scheme", scheme]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return summary


def main() -> None:
    figures = []
    for sc in os.environ.get("BENCH_GOSSIP_SCENARIOS", "baseline-1k").split(","):
        flood, tree = run(sc, "flood"), run(sc, "tree")
        for label, s in (("flood", flood), ("tree", tree)):
            print(f"{sc} {label:5s} " + " ".join(f"{k}={s.get(k)}" for k in KEYS), flush=True)
        slower = tree["convergence_p50_s"] / flood["convergence_p50_s"]
        figures += [
            {"metric": f"{sc} gossip_bytes_ratio tree", "value": tree["gossip_bytes_ratio"], "unit": "",
             "ceiling": "<= 1.5", "note": f"flood {flood['gossip_bytes_ratio']:.3f}"},
            {"metric": f"{sc} convergence_p50 tree / flood", "value": slower, "unit": "x", "ceiling": "<= 1.2",
             "note": f"{tree['convergence_p50_s']:.3f} s vs {flood['convergence_p50_s']:.3f} s"},
            {"metric": f"{sc} route_k2_share tree", "value": tree["route_k2_share"], "unit": "",
             "ceiling": ">= flood", "note": f"flood {flood['route_k2_share']:.4f}"},
            {"metric": f"{sc} route_coverage tree", "value": tree["route_coverage"], "unit": "", "ceiling": ">= 0.99",
             "note": f"delivery tree {tree['delivery_ratio']} flood {flood['delivery_ratio']}"},
        ]
    print(json.dumps({"bench": "gossip_scheme", "figures": figures}))


if __name__ == "__main__":
    main()
