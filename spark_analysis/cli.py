"""`inri-analyze TRACE_DIR --out REPORT_DIR [--master URL]`: summary.json, tables, plots, report.html.

Runs on local[*] by default and unchanged on a cluster (`--master spark://host:7077`, or through
spark-submit: see deploy/spark/README.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inri-analyze", description="Analyse INRI gossip traces with Spark.")
    parser.add_argument("trace_dir", type=Path, help="a trace directory (simulator or relays)")
    parser.add_argument("--out", type=Path, required=True, help="where to write the report")
    parser.add_argument("--master", help="Spark master URL (default local[*], or $INRI_SPARK_MASTER)")
    parser.add_argument("--no-plots", action="store_true", help="summary and tables only")
    args = parser.parse_args(argv)
    started = time.perf_counter()

    def progress(step: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {step}", file=sys.stderr, flush=True)

    from spark_analysis.job import run

    try:
        summary = run(args.trace_dir, args.out, master=args.master, plots=not args.no_plots, progress=progress)
    except FileNotFoundError as exc:
        print(f"inri-analyze: {exc}", file=sys.stderr)
        return 2
    progress(f"done: {args.out / 'summary.json'}")
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
