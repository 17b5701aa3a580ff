"""Reading a trace directory (docs/trace-schema.md) with an explicit schema; malformed lines are counted."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType

TRACE_SCHEMA = StructType(
    [
        StructField("t", DoubleType()),
        StructField("relay", StringType()),
        StructField("kind", StringType()),
        StructField("msg", StringType()),
        StructField("route", StringType()),
        StructField("peer", StringType()),
        StructField("hops", IntegerType()),
        StructField("ttl", IntegerType()),
        StructField("epoch", LongType()),
        StructField("count", IntegerType()),
        StructField("bytes", IntegerType()),
        StructField("reason", StringType()),
    ]
)
CORRUPT = "_corrupt_record"


@dataclass
class Trace:
    """The events (with a `seq` column giving file order), what was malformed, and the side files."""

    events: DataFrame
    malformed: int
    meta: dict[str, Any]
    topology: list[tuple[int, int, float]] | None  # the initial directed links (src, dst, latency_s)
    processing: dict[int, float] | None
    links: list[tuple[int, int, float]] | None = None  # every directed link of the run (links.csv)
    positions: dict[int, tuple[float, float]] | None = None  # relays.csv x, y (geographic topologies)


def _files(root: Path, suffixes: tuple[str, ...]) -> list[str]:
    return sorted(str(p) for p in root.rglob("*") if p.is_file() and p.name.endswith(suffixes))


def load_trace(spark: SparkSession, trace_dir: str | Path) -> Trace:
    """Read every JSON-lines and Parquet file under trace_dir into one DataFrame of TRACE_SCHEMA."""
    root = Path(trace_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"no trace directory {root}")
    frames: list[DataFrame] = []
    malformed = 0
    jsonl = _files(root, (".jsonl", ".jsonl.gz", ".json.gz"))
    if jsonl:
        schema = StructType([*TRACE_SCHEMA.fields, StructField(CORRUPT, StringType())])
        raw = (
            spark.read.schema(schema)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT)
            .json(jsonl)
        )
        raw = raw.withColumn("_bad", F.col(CORRUPT).isNotNull() | F.col("t").isNull()
                             | F.col("relay").isNull() | F.col("kind").isNull()).cache()
        malformed += raw.filter("_bad").count()
        frames.append(raw.filter(~F.col("_bad")).select(*TRACE_SCHEMA.fieldNames()))
    parquet = _files(root, (".parquet",))
    if parquet:
        pq = spark.read.schema(TRACE_SCHEMA).parquet(*parquet)
        bad = F.col("t").isNull() | F.col("relay").isNull() | F.col("kind").isNull()
        malformed += pq.filter(bad).count()
        frames.append(pq.filter(~bad))
    if not frames:
        raise FileNotFoundError(f"no *.jsonl or *.parquet trace files under {root}")
    events = frames[0]
    for f in frames[1:]:
        events = events.unionByName(f)
    # File order breaks ties between rows with the same time ("latest" drop reason, as written).
    events = events.withColumn("seq", F.monotonically_increasing_id())
    meta_path = root / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    topology = processing = links = positions = None
    if (root / "topology.csv").exists():
        topology = _links(root / "topology.csv")
    if (root / "links.csv").exists():
        links = _links(root / "links.csv")
    if (root / "relays.csv").exists():
        with open(root / "relays.csv") as fh:
            relays = list(csv.DictReader(fh))
        processing = {int(r["relay"]): float(r["processing_s"]) for r in relays}
        if relays and "x" in relays[0]:
            positions = {int(r["relay"]): (float(r["x"]), float(r["y"])) for r in relays}
    return Trace(events, malformed, meta, topology, processing, links, positions)


def _links(path: Path) -> list[tuple[int, int, float]]:
    with open(path) as fh:
        return [(int(r["src"]), int(r["dst"]), float(r["latency_s"])) for r in csv.DictReader(fh)]
