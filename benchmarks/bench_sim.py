"""Simulator throughput: events/s and wall time per scenario and trace level.

Runs each scenario through the real CLI (`inri-sim run`) in a subprocess, so the figures include
everything a user pays for (topology, workload, trace writing, the summary). Set BENCH_SIM_SCENARIOS
to a comma-separated list to choose (default: baseline-1k, loss-1k, churn-10k).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any

KEYS = ("delivery_ratio", "delivery_ratio_all", "route_coverage", "stretch_median", "stretch_p95", "overhead_ratio",
        "fallback_pushes", "messages_per_delivered_push", "events", "events_per_s", "wall_s")


def run(scenario: str, level: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        args = [sys.executable, "-m", "simulations.cli", "run", scenario, "--trace-level", level, "--progress", "off"]
        if level != "off":
            args += ["--trace-dir", tmp]
        out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    summary: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return summary


def main() -> None:
    scenarios = os.environ.get("BENCH_SIM_SCENARIOS", "baseline-1k,loss-1k,churn-10k").split(",")
    figures = []
    for sc in scenarios:
        levels = ("off", "summary", "full")
        for level in levels:
            s = run(sc, level)
            print(f"{sc:12s} trace={level:8s} " + " ".join(f"{k}={s.get(k)}" for k in KEYS), flush=True)
            figures.append({"metric": f"{sc} events/s (trace {level})", "value": s["events_per_s"], "unit": "/s",
                            "ceiling": "aim 200,000/s", "note": f"wall {s['wall_s']} s, {s['events']:,} events"})
            if level == "summary":
                figures.append({"metric": f"{sc} delivery_ratio", "value": s["delivery_ratio"], "unit": "",
                                "note": f"all {s['delivery_ratio_all']}, stretch p50 {s['stretch_median']}, "
                                        f"p95 {s['stretch_p95']}, overhead {s['overhead_ratio']}"})
    print(json.dumps({"bench": "simulator", "figures": figures}))


if __name__ == "__main__":
    main()
