"""Trace sinks for the engine: docs/trace-schema.md defines the columns and event kinds."""

from __future__ import annotations

from inri.core.api import TraceLevel

COLUMNS = ("t", "relay", "kind", "msg", "route", "peer", "hops", "ttl", "epoch", "count", "bytes", "reason")

Row = tuple[float, str, str, str | None, str | None, str | None, int | None, int | None, int | None,
            int | None, int | None, str | None]


class NullTracer:
    """Records nothing (trace level off)."""

    level = TraceLevel.OFF

    def emit(self, t: float, relay: str, kind: str, **fields: object) -> None:
        """Discard the event."""


class ListTracer:
    """Keeps rows in memory as tuples in COLUMNS order (tests, and the simulator's collection)."""

    def __init__(self, level: TraceLevel = TraceLevel.FULL) -> None:
        self.level = level
        self.rows: list[Row] = []

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
        """Append one row."""
        self.rows.append((t, relay, kind, msg, route, peer, hops, ttl, epoch, count, nbytes, reason))

    def emit_row(self, row: Row) -> None:
        """Append one row given in COLUMNS order (the engine's fast path)."""
        self.rows.append(row)

    def of_kind(self, kind: str) -> list[Row]:
        """Rows of one kind, in order."""
        return [r for r in self.rows if r[2] == kind]
