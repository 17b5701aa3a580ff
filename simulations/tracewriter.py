"""Writes a simulator trace directory (docs/trace-schema.md): events as batched Parquet or JSON lines,
plus meta.json, topology.csv (the initial directed links with latencies), links.csv (every directed link
of the run, run-time links included, with its latency) and relays.csv (processing delays, positions)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inri.core.trace import COLUMNS, Row
from simulations.extras import require

if TYPE_CHECKING:
    from simulations.scenario import Scenario
    from simulations.topology import Network

BATCH_ROWS = 500_000


def parquet_schema() -> Any:
    """The events table's Arrow schema (pyarrow is imported only for Parquet traces)."""
    pa = require("pyarrow", "a Parquet trace")
    return pa.schema(
        [
            ("t", pa.float64()),
            ("relay", pa.string()),
            ("kind", pa.string()),
            ("msg", pa.string()),
            ("route", pa.string()),
            ("peer", pa.string()),
            ("hops", pa.int32()),
            ("ttl", pa.int32()),
            ("epoch", pa.int64()),
            ("count", pa.int32()),
            ("bytes", pa.int32()),
            ("reason", pa.string()),
        ]
    )


class TraceWriter:
    """Buffers rows and writes them in batches: one Parquet file (row groups) or one .jsonl file."""

    def __init__(self, directory: Path, fmt: str = "parquet") -> None:
        if fmt not in ("parquet", "jsonl"):
            raise ValueError("trace format must be parquet or jsonl")
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        for old in ("events.parquet", "events.jsonl"):
            (self.dir / old).unlink(missing_ok=True)
        self.fmt = fmt
        self._rows: list[Row] = []
        self._schema: Any = parquet_schema() if fmt == "parquet" else None  # fails now, not after the run
        self._pq: Any = None  # the pyarrow.parquet.ParquetWriter, from the first batch
        self._jsonl = open(self.dir / "events.jsonl", "w") if fmt == "jsonl" else None  # noqa: SIM115
        self.rows_written = 0

    def add(self, row: Row) -> None:
        """Queue one row (COLUMNS order)."""
        self._rows.append(row)
        if len(self._rows) >= BATCH_ROWS:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered."""
        if not self._rows:
            return
        rows, self._rows = self._rows, []
        self.rows_written += len(rows)
        if self._jsonl is not None:
            self._jsonl.write("".join(json.dumps(dict(zip(COLUMNS, r, strict=True))) + "\n" for r in rows))
            return
        pa = require("pyarrow", "a Parquet trace")
        schema = self._schema
        cols = list(zip(*rows, strict=True))
        table = pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(cols, schema, strict=True)],
                                     schema=schema)
        if self._pq is None:
            pq = require("pyarrow.parquet", "a Parquet trace")
            self._pq = pq.ParquetWriter(self.dir / "events.parquet", schema, compression="zstd")
        self._pq.write_table(table)

    def close(self, meta: dict[str, object], net: Network, live: Sequence[dict[int, float]] | None = None,
              scenario: Scenario | None = None) -> None:
        """Flush, close, and write meta.json, topology.csv, links.csv and relays.csv. `live`: every link of
        the run (the simulator's link table). With `scenario`, meta.json also gets `windows` (when churn,
        partitions and loss were on: the report shades them) and, for a geographic topology, `underlay`
        (the direct-latency model of overlay_penalty)."""
        self.flush()
        if self._pq is not None:
            self._pq.close()
        if self._jsonl is not None:
            self._jsonl.close()
        if scenario is not None:
            meta = {**meta, "windows": scenario_windows(scenario)}
            if net.positions is not None:
                topo = scenario.topology
                meta["underlay"] = {"geo_base_s": topo.geo_base_s, "geo_per_unit_s": topo.geo_per_unit_s}
        (self.dir / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        with open(self.dir / "topology.csv", "w") as f:
            f.write("src,dst,latency_s\n")
            for (u, v), lat in sorted(net.latency.items()):
                f.write(f"{u},{v},{lat!r}\n")
        if live is not None:
            # Links opened at run time (membership replacements) are in no other file; their up and
            # down times are the peer_up / peer_down rows of the events.
            with open(self.dir / "links.csv", "w") as f:
                f.write("src,dst,latency_s\n")
                for u, out in enumerate(live):
                    for v in sorted(out):
                        f.write(f"{u},{v},{out[v]!r}\n")
        with open(self.dir / "relays.csv", "w") as f:
            if net.positions is None:
                f.write("relay,processing_s\n")
                for i, p in enumerate(net.processing):
                    f.write(f"{i},{p!r}\n")
            else:
                f.write("relay,processing_s,x,y\n")
                for i, (p, (x, y)) in enumerate(zip(net.processing, net.positions, strict=True)):
                    f.write(f"{i},{p!r},{x!r},{y!r}\n")


def scenario_windows(sc: Scenario) -> list[dict[str, object]]:
    """The intervals a run was disturbed in: churn, each partition, and loss (the whole run)."""
    out: list[dict[str, object]] = []
    if sc.churn.fail_fraction > 0:
        out.append({"kind": "churn", "start_s": sc.churn.start_s, "end_s": sc.churn.end_s})
    out += [{"kind": "partition", "start_s": p.start_s, "end_s": p.end_s} for p in sc.partitions]
    if sc.loss > 0:
        out.append({"kind": "loss", "start_s": 0.0, "end_s": sc.duration_s})
    return out
