"""`inri-analyze TRACE_DIR --out REPORT_DIR [--master URL] [--partitions N] [--compare TRACE_B]`: summary.json,
tables, plots, report.html (and with --compare, compare.html beside them).

`inri-analyze cluster up|down [--dir DIR]`: a local Spark standalone master and worker from the pip package
(spark_analysis/cluster.py). Runs on local[*] by default and unchanged on a cluster
(`--master spark://host:7077`, or through spark-submit: see deploy/spark/README.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

COMPARE_DIR = "compare-b"  # where --compare writes the second run's report, inside --out


def cluster_main(argv: list[str]) -> int:
    """`inri-analyze cluster up|down`."""
    parser = argparse.ArgumentParser(prog="inri-analyze cluster",
                                     description="A Spark standalone master and worker from the pip package.")
    parser.add_argument("action", choices=("up", "down"))
    parser.add_argument("--dir", type=Path, default=Path("spark-cluster"),
                        help="state and logs (default ./spark-cluster)")
    parser.add_argument("--host", default="127.0.0.1", help="address every service binds (default loopback)")
    parser.add_argument("--cores", type=int, help="the worker's cores (default: this machine's)")
    parser.add_argument("--memory", default="2g", help="the worker's memory for executors (default 2g)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for each JVM")
    args = parser.parse_args(argv)
    from spark_analysis.cluster import ClusterError, down, up

    try:
        if args.action == "up":
            state = up(args.dir, host=args.host, cores=args.cores, memory=args.memory, timeout=args.timeout)
            print(f"inri-analyze: master {state.master_url}, one worker with {state.cores} cores "
                  f"(logs in {args.dir}; stop with: inri-analyze cluster down --dir {args.dir})", file=sys.stderr)
            print(state.master_url)
        else:
            state = down(args.dir)
            print(f"inri-analyze: stopped {state.master_url}", file=sys.stderr)
    except ClusterError as exc:
        print(f"inri-analyze: {exc}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["cluster"]:
        return cluster_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="inri-analyze", description="Analyse INRI gossip traces with Spark.",
        epilog="inri-analyze cluster up|down [--dir DIR]: a local Spark standalone cluster (pip pyspark).")
    parser.add_argument("trace_dir", type=Path, help="a trace directory (simulator or relays)")
    parser.add_argument("--out", type=Path, required=True, help="where to write the report")
    parser.add_argument("--master", help="Spark master URL (default local[*], or $INRI_SPARK_MASTER)")
    parser.add_argument("--partitions", type=int,
                        help="shuffle partitions (default: 8 locally, two per executor core on a cluster)")
    parser.add_argument("--compare", type=Path, metavar="TRACE_B",
                        help=f"a second trace: its report goes to OUT/{COMPARE_DIR}, both side by side in "
                             "OUT/compare.html")
    parser.add_argument("--no-plots", action="store_true", help="summary and tables only")
    args = parser.parse_args(argv)
    if args.partitions is not None and args.partitions < 1:
        parser.error("--partitions must be at least 1")
    if args.compare is not None and args.no_plots:
        parser.error("--compare draws plots: drop --no-plots")
    started = time.perf_counter()

    def progress(step: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {step}", file=sys.stderr, flush=True)

    from spark_analysis.job import run
    from spark_analysis.report import write_compare

    try:
        summary = run(args.trace_dir, args.out, master=args.master, partitions=args.partitions,
                      plots=not args.no_plots, progress=progress)
        if args.compare is not None:
            other = args.out / COMPARE_DIR
            progress(f"the second run: {args.compare}")
            summary_b = run(args.compare, other, master=args.master, partitions=args.partitions, progress=progress)
            page = write_compare(summary, summary_b, args.out, other, str(args.trace_dir), str(args.compare))
            progress(f"side by side: {page}")
    except FileNotFoundError as exc:
        print(f"inri-analyze: {exc}", file=sys.stderr)
        return 2
    progress(f"done: {args.out / 'summary.json'}")
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
