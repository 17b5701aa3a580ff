"""The engines' tracer in the simulator: every row feeds the metrics collector, and the trace writer
at the run's trace level."""

from __future__ import annotations

from inri.core.api import TraceLevel
from inri.core.trace import Row
from simulations.metrics import Collector
from simulations.tracewriter import TraceWriter

SUMMARY_KINDS = frozenset(
    {
        "reg_originated", "route_set", "reg_dropped", "push_injected", "push_refused", "push_forwarded",
        "push_fallback", "push_delivered", "push_duplicate", "push_dropped", "push_retry", "push_settled",
        "receipt_forwarded", "route_error", "peer_up", "peer_down", "relay_down", "relay_up", "push_excluded",
        "peer_scored", "receipt_refused", "gossip_control", "reg_reforwarded",
    }
)


class SimTracer:
    """The engines' tracer: feeds the metrics collector and, at its level, the trace writer.

    Engines always run at least at summary level so the summary can be computed even when nothing
    is written (trace level off).
    """

    def __init__(self, collector: Collector, writer: TraceWriter | None, level: TraceLevel) -> None:
        self.level = TraceLevel.FULL if level == TraceLevel.FULL else TraceLevel.SUMMARY
        self._collector = collector
        self._writer = writer if level != TraceLevel.OFF else None
        self._full = level == TraceLevel.FULL
        self.scored: list[tuple[str, str | None, str | None]] = []  # (relay, cut peer, reason): peer_scored rows

    def emit(self, t: float, relay: str, kind: str, *, msg: str | None = None, route: str | None = None,
             peer: str | None = None, hops: int | None = None, ttl: int | None = None,
             epoch: int | None = None, count: int | None = None, nbytes: int | None = None,
             reason: str | None = None) -> None:
        """Record one event."""
        self.emit_row((t, relay, kind, msg, route, peer, hops, ttl, epoch, count, nbytes, reason))

    def emit_row(self, row: Row) -> None:
        """Record one row given in trace column order."""
        if row[2] == "route_set":  # the hottest row (one per relay per registration): the short way
            self._collector.add_route_set(row)
            if self._writer is not None:
                self._writer.add(row)
            return
        summary = row[2] in SUMMARY_KINDS
        if summary:
            self._collector.add(row)
            if row[2] == "peer_scored":
                self.scored.append((row[1], row[5], row[11]))
        if self._writer is not None and (summary or self._full):
            self._writer.add(row)
