"""What the HTTP front counts, read by the relay's and the bootstrap's /metrics at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["FrontStats", "Phase", "ShedReason"]


class Phase(StrEnum):
    """What a connection was waiting for when its deadline passed (label `phase`)."""

    HEAD = "head"  # a request head (and, for the first, the TLS handshake)
    BODY = "body"
    IDLE = "idle"  # the next request
    WRITE = "write"  # the client to read an answer or a WebSocket message
    PONG = "websocket_pong"  # any frame after a WebSocket Ping
    LINGER = "linger"  # the client to stop sending after an answer that closes the connection


class ShedReason(StrEnum):
    """Why a new connection was answered 503 and closed (label `reason`)."""

    CONNECTIONS = "connections_max"
    CLIENT = "connections_per_client_max"


@dataclass
class FrontStats:
    """Counters of one HTTP front (plain ints and dicts: nothing but an increment on any path)."""

    open: int = 0  # connections being served now (shed ones not included)
    accepted: int = 0
    websockets_open: int = 0
    shed: dict[str, int] = field(default_factory=dict)
    deadline_closes: dict[str, int] = field(default_factory=dict)
    refused: dict[int, int] = field(default_factory=dict)  # input answered by the front itself: 400, 431, 501
    websocket_pings: int = 0
    errors: int = 0  # connections that ended on an error of the server's own (a bug), logged with a traceback
    restarts: int = 0  # listeners that failed and accept again

    def metrics(self, prefix: str) -> Iterator[Metric]:
        """The counters as Prometheus families named prefix_* (e.g. inri_http_restarts_total)."""
        yield GaugeMetricFamily(f"{prefix}_connections", "connections served now", value=self.open)
        yield GaugeMetricFamily(f"{prefix}_websockets", "WebSocket connections open now", value=self.websockets_open)
        yield CounterMetricFamily(f"{prefix}_connections_accepted", "connections accepted and served",
                                  value=self.accepted)
        labelled: tuple[tuple[str, str, str, dict[str, int]], ...] = (
            ("connections_shed", "new connections answered 503 and closed", "reason", self.shed),
            ("deadline_closes", "connections closed at a deadline, by what they waited for", "phase",
             self.deadline_closes),
            ("refused", "requests the server refused before the application (empty body)", "status",
             {str(status): n for status, n in self.refused.items()}))
        for name, help_, label, counts in labelled:
            family = CounterMetricFamily(f"{prefix}_{name}", help_, labels=[label])
            for key in sorted(counts):
                family.add_metric([str(key)], counts[key])
            yield family
        yield CounterMetricFamily(f"{prefix}_websocket_pings", "WebSocket Pings sent to silent clients",
                                  value=self.websocket_pings)
        yield CounterMetricFamily(f"{prefix}_connection_errors", "connections ended by a server error (logged)",
                                  value=self.errors)
        yield CounterMetricFamily(f"{prefix}_restarts", "listeners that failed and were served again (logged)",
                                  value=self.restarts)
