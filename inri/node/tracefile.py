"""A relay's trace file: JSON lines in the shared schema (docs/trace-schema.md), salted, size-bounded.

A trace of route ids, push ids, peers and hops is metadata about who gets notified, so on a relay:
- tracing is off by default;
- the `msg` and `route` fields are replaced by salted hashes: blake2b-64(salt || value), hex. The salt
  is random per relay unless configured, so traces of different relays cannot be joined — except in a
  lab mesh whose operator gives every relay the same salt on purpose (`inri mesh up` does);
- files rotate past `max_bytes`, and only `keep` rotated files are kept (retention).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import IO

from inri.core.api import TraceLevel
from inri.core.trace import COLUMNS

LEVELS = {"off": TraceLevel.OFF, "summary": TraceLevel.SUMMARY, "full": TraceLevel.FULL}


class TraceFile:
    """A Tracer writing `trace.jsonl` in directory `path` (rotated to trace.jsonl.1 ... .keep)."""

    def __init__(
        self,
        path: str | Path,
        relay_id: str,
        *,
        level: str = "off",
        salt: str | None = None,
        max_bytes: int = 64 * 1024 * 1024,
        keep: int = 3,
    ) -> None:
        if level not in LEVELS:
            raise ValueError(f"trace level {level!r}: expected off, summary or full")
        self.level = LEVELS[level]
        self.dir = Path(path)
        self.relay_id = relay_id
        self._salt = salt.encode() if salt else os.urandom(16)
        self.max_bytes = max_bytes
        self.keep = keep
        self._file: IO[str] | None = None
        self._size = 0
        self.rows_written = 0

    def label(self, value: str | None) -> str | None:
        """The salted stand-in for a route id or push id (None stays None)."""
        if value is None:
            return None
        return hashlib.blake2b(self._salt + value.encode(), digest_size=8).hexdigest()

    def _open(self) -> IO[str]:
        if self._file is None:
            self.dir.mkdir(parents=True, exist_ok=True)
            p = self.dir / "trace.jsonl"
            self._file = open(p, "a", encoding="utf-8", buffering=1)  # noqa: SIM115 - kept open while tracing
            self._size = p.stat().st_size
        return self._file

    def _rotate(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        base = self.dir / "trace.jsonl"
        for i in range(self.keep, 0, -1):
            src = base if i == 1 else self.dir / f"trace.jsonl.{i - 1}"
            if src.exists():
                os.replace(src, self.dir / f"trace.jsonl.{i}")
        (self.dir / f"trace.jsonl.{self.keep + 1}").unlink(missing_ok=True)

    def emit(
        self,
        t: float,
        relay: str,
        kind: str,
        *,
        msg: str | None = None,
        route: str | None = None,
        peer: str | None = None,
        hops: int | None = None,
        ttl: int | None = None,
        epoch: int | None = None,
        count: int | None = None,
        nbytes: int | None = None,
        reason: str | None = None,
    ) -> None:
        """Write one row (salted ids)."""
        if self.level == TraceLevel.OFF:
            return
        row = (round(t, 6), relay, kind, self.label(msg), self.label(route), peer, hops, ttl, epoch, count, nbytes,
               reason)
        line = json.dumps(dict(zip(COLUMNS, row, strict=True)), separators=(",", ":")) + "\n"
        f = self._open()
        f.write(line)
        self._size += len(line)
        self.rows_written += 1
        if self._size >= self.max_bytes:
            self._rotate()

    def close(self) -> None:
        """Flush and close the current file."""
        if self._file is not None:
            self._file.close()
            self._file = None


def read_trace(directory: str | Path) -> list[dict[str, object]]:
    """Every row of a relay's trace directory, oldest file first (tools and tests)."""
    d = Path(directory)
    files = sorted(d.glob("trace.jsonl.*"), key=lambda p: -int(p.suffix[1:])) + [d / "trace.jsonl"]
    rows: list[dict[str, object]] = []
    for p in files:
        if p.exists():
            with open(p, encoding="utf-8") as f:
                rows += [json.loads(line) for line in f if line.strip()]
    return rows
