"""Spark analysis time on a large simulator trace (issue 5: aim <= 2 minutes for 10 million events on local[2]).

Then the cluster check: tests/test_spark.py's test of deploy/spark/README.md's cluster recipe (a real
standalone master and worker from the pip package on loopback, the analysis on them equal to local mode)
runs here rather than in `make test`, because two more JVMs take longer than a unit test should.

The trace comes from the simulator itself: churn-10k at summary level writes one route_set row per
relay per registration (10,000 relays x 1,000 registrations = 10M rows) plus push and churn rows. Set
BENCH_SPARK_TRACE to reuse an existing trace directory. The simulator's own summary is printed beside
the analysis' so any disagreement shows.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq


def main() -> None:
    tmp = tempfile.TemporaryDirectory()
    trace = Path(os.environ.get("BENCH_SPARK_TRACE") or Path(tmp.name) / "trace")
    if not (trace / "events.parquet").exists():
        print(f"generating the trace with the simulator (churn-10k, summary level) into {trace}", flush=True)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "simulations.cli", "run", "churn-10k", "--trace-dir", str(trace),
                        "--trace-level", "summary", "--progress", "off"], check=True, capture_output=True)
        print(f"  simulated in {time.perf_counter() - t0:.0f} s", flush=True)
    rows = pq.ParquetFile(trace / "events.parquet").metadata.num_rows
    out = Path(tmp.name) / "report"
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "spark_analysis.cli", str(trace), "--out", str(out),
                           "--master", "local[2]"], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    ana = json.loads(proc.stdout.strip().splitlines()[-1])
    sim = json.loads((trace / "meta.json").read_text())["summary"]
    computed = sorted(set(ana) & set(sim) - set(ana.get("from_simulator", [])))
    floats = [k for k in computed if "stretch" in k or k.startswith("overlay_penalty")]  # shortest-path sums
    differ = [k for k in computed if k not in floats and ana[k] != sim[k]]
    differ += [k for k in floats if (ana[k] is None) != (sim[k] is None)
               or (ana[k] is not None and abs(ana[k] - sim[k]) > 1e-9 * abs(sim[k]))]
    print(f"events in trace: {rows:,}")
    print(f"inri-analyze on local[2]: {wall:.1f} s (includes JVM start, plots and report); target <= 120 s")
    print(f"keys differing from the simulator's summary: {differ or 'none'}")
    t0 = time.perf_counter()
    test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_spark.py", "-k",
                           "cluster_recipe"], env={**os.environ, "INRI_SPARK_CLUSTER_TEST": "1"},
                          capture_output=True, text=True)
    cluster_wall = time.perf_counter() - t0
    print(test.stdout[-1500:])
    print(json.dumps({"bench": "spark", "figures": [
        {"metric": f"analysis of {rows / 1e6:.1f}M events, local[2]", "value": round(wall, 1), "unit": "s",
         "ceiling": "target 120 s", "note": f"{len(differ)} keys differ from the simulator"},
        {"metric": "cluster recipe test (master + worker + analysis + local comparison)",
         "value": round(cluster_wall, 1), "unit": "s",
         "note": "passed" if test.returncode == 0 else f"FAILED (exit {test.returncode})"}]}))
    tmp.cleanup()


if __name__ == "__main__":
    main()
