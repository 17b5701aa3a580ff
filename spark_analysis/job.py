"""The analysis job: load, compute, write. Also the spark-submit entry point (`python -m spark_analysis.job`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import SparkSession

from spark_analysis.load import load_trace
from spark_analysis.metrics import analyse
from spark_analysis.report import write_html, write_plots
from spark_analysis.session import get_session


def run(
    trace_dir: Path,
    out: Path,
    *,
    master: str | None = None,
    partitions: int | None = None,
    plots: bool = True,
    progress: Callable[[str], None] = lambda _: None,
    spark: SparkSession | None = None,
) -> dict[str, object]:
    """Analyse trace_dir into out/ (summary.json, tables/, plots, report.html); returns the summary."""
    progress("starting Spark")
    spark = spark or get_session(master, shuffle_partitions=partitions)
    progress(f"Spark master {spark.sparkContext.master}, "
             f"shuffle partitions {spark.conf.get('spark.sql.shuffle.partitions')}")
    progress("reading the trace")
    trace = load_trace(spark, trace_dir)
    analysis = analyse(spark, trace, progress)
    out.mkdir(parents=True, exist_ok=True)
    progress("writing tables (Parquet and CSV)")
    for name, df in analysis.tables.items():
        df.write.mode("overwrite").parquet(str(out / "tables" / f"{name}.parquet"))
        df.coalesce(1).write.mode("overwrite").option("header", True).csv(str(out / "tables" / f"{name}.csv"))
    (out / "summary.json").write_text(json.dumps(analysis.summary, indent=2, sort_keys=True) + "\n")
    if plots:
        progress("drawing plots")
        names = write_plots(analysis, out)
        write_html(analysis, out, names, str(trace_dir))
    return analysis.summary


if __name__ == "__main__":  # spark-submit spark_analysis/job.py TRACE_DIR REPORT_DIR
    if len(sys.argv) != 3:
        print("usage: job.py TRACE_DIR REPORT_DIR", file=sys.stderr)
        raise SystemExit(2)
    summary = run(Path(sys.argv[1]), Path(sys.argv[2]), spark=SparkSession.builder.getOrCreate(),
                  progress=lambda s: print(s, file=sys.stderr, flush=True))
    print(json.dumps(summary, sort_keys=True))
