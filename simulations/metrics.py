"""The summary metrics of docs/metrics.md, computed from trace rows as they stream past.

The simulator feeds every summary-level row here (whatever the trace level written to disk), so its
summary and the Spark analysis (spark_analysis/) derive every shared key from the same records with the
same formulas. Rows must arrive in time order (the simulator emits them so).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

GOSSIP_KINDS = ("reg_originated", "route_set")
PUSH_MESSAGE_KINDS = ("push_forwarded", "push_fallback", "receipt_forwarded", "route_error")


def nearest_rank(sorted_values: Sequence[float], q: float) -> float | None:
    """x[ceil(q * n)] (1-based) of a sorted list; x[1] when q*n < 1; None when empty."""
    n = len(sorted_values)
    if n == 0:
        return None
    rank = max(1, math.ceil(q * n - 1e-12))
    return sorted_values[min(rank, n) - 1]


class Collector:
    """Streams trace rows (t, relay, kind, msg, route, peer, hops, ttl, epoch, count, bytes, reason)."""

    def __init__(self, relays: int, deadline_s: float, coverage_after_s: float) -> None:
        self.relays = relays
        self.deadline = deadline_s
        self.coverage_after = coverage_after_s
        self.gossip_messages = 0
        self.gossip_bytes = 0
        self.push_messages = 0
        self.fallback_messages = 0
        self.reg_origin: dict[str, tuple[float, str]] = {}  # msg -> (t0, origin relay)
        self.reg_times: dict[str, array[float]] = {}  # msg -> route_set times
        self.reg_relays: dict[str, list[str]] = {}  # msg -> route_set relays (same order)
        self.injected: dict[str, tuple[float, str]] = {}  # push -> (t, relay)
        self.delivered: dict[str, tuple[float, str, int]] = {}  # push -> earliest (t, relay, hops)
        self.excluded: set[str] = set()
        self.dropped: dict[str, str] = {}  # push -> latest drop reason
        self.fallback: set[str] = set()
        self.settled_delivered: set[str] = set()  # pushes a custodian settled as delivered (a receipt said so)
        self.transitions: dict[str, list[tuple[float, bool]]] = {}  # relay -> [(t, up)]
        self.rows = 0

    def add(self, row: tuple[Any, ...]) -> None:
        """Feed one row (trace column order)."""
        self.rows += 1
        t, relay, kind, msg = row[0], row[1], row[2], row[3]
        if kind == "route_set":
            self.rows -= 1
            self.add_route_set(row)
        elif kind in PUSH_MESSAGE_KINDS:
            c = 1 if row[9] is None else row[9]
            self.push_messages += c
            if kind == "push_fallback":
                self.fallback_messages += c
                self.fallback.add(msg)
        elif kind == "reg_originated":
            count = row[9] or 0
            self.gossip_messages += count
            self.gossip_bytes += count * (row[10] or 0)
            self.reg_origin.setdefault(msg, (t, relay))
        elif kind == "push_injected":
            self.injected.setdefault(msg, (t, relay))
        elif kind == "push_delivered":
            if msg not in self.delivered:
                self.delivered[msg] = (t, relay, row[6] or 0)
        elif kind == "push_dropped":
            self.dropped[msg] = row[11] or "unknown"
        elif kind == "push_settled":
            if row[11] == "delivered":
                self.settled_delivered.add(msg)
        elif kind == "push_excluded":
            self.excluded.add(msg)
        elif kind == "relay_down":
            self.transitions.setdefault(relay, []).append((t, False))
        elif kind == "relay_up":
            self.transitions.setdefault(relay, []).append((t, True))

    def add_route_set(self, row: tuple[Any, ...]) -> None:
        """Feed one route_set row (what `add` does for that kind, without the dispatch)."""
        self.rows += 1
        count = row[9] or 0
        self.gossip_messages += count
        self.gossip_bytes += count * (row[10] or 0)
        msg = row[3]
        times = self.reg_times.get(msg)
        if times is None:
            times = self.reg_times[msg] = array("d")
            self.reg_relays[msg] = []
        times.append(row[0])
        self.reg_relays[msg].append(row[1])

    def add_all(self, rows: Iterable[tuple[Any, ...]]) -> None:
        """Feed many rows."""
        for r in rows:
            self.add(r)

    # -- liveness ---------------------------------------------------------------------------
    def _down_at(self, t: float) -> set[str]:
        down = set()
        for relay, trans in self.transitions.items():
            state = True
            for tt, up in trans:
                if tt > t:
                    break
                state = up
            if not state:
                down.add(relay)
        return down

    # -- the summary --------------------------------------------------------------------------
    def summary(self, distance: dict[tuple[str, str], float] | None = None) -> dict[str, object]:
        """Every key of docs/metrics.md. `distance[(inject relay, home relay)]` gives stretch denominators."""
        n = self.relays
        pushes = set(self.injected)
        excluded = self.excluded & pushes
        counted = len(pushes) - len(excluded)
        on_time = {
            p for p, (t, _, _) in self.delivered.items() if p in pushes and t - self.injected[p][0] <= self.deadline
        }
        delivered = on_time - excluded
        regs = len(self.reg_origin)
        hops = sorted(self.delivered[p][2] for p in delivered)
        stretch: list[float] = []
        if distance is not None:
            for p in delivered:
                t_inj, r_inj = self.injected[p]
                t_del, r_del, _ = self.delivered[p]
                if r_inj == r_del:
                    continue
                d = distance.get((r_inj, r_del))
                if d:
                    stretch.append((t_del - t_inj) / d)
            stretch.sort()
        coverage_num = coverage_den = 0
        convergence: list[float] = []
        unconverged = 0
        for msg, (t0, origin) in self.reg_origin.items():
            t_cov = t0 + self.coverage_after
            down_cov = self._down_at(t_cov)
            down0 = self._down_at(t0)
            live_cov = n - len(down_cov) - (0 if origin in down_cov else 1)
            times = self.reg_times.get(msg, array("d"))
            relays = self.reg_relays.get(msg, [])
            got = {r for tt, r in zip(times, relays, strict=True) if tt <= t_cov and r != origin and r not in down_cov}
            coverage_num += len(got)
            coverage_den += live_cov
            live0 = n - len(down0) - (0 if origin in down0 else 1)
            need = math.ceil(0.9 * live0 - 1e-12)
            others = sorted(tt for tt, r in zip(times, relays, strict=True) if r != origin)
            if need <= 0:
                convergence.append(0.0)
            elif len(others) >= need:
                convergence.append(others[need - 1] - t0)
            else:
                unconverged += 1
        convergence.sort()
        loss: dict[str, int] = {}
        for p in sorted(pushes - excluded - delivered):
            reason = self.dropped.get(p)
            if reason is None:
                reason = "late" if p in self.delivered else "unknown"
            loss[reason] = loss.get(reason, 0) + 1
        delivered_all = len(on_time)
        return {
            "relays": n,
            "registrations": regs,
            "pushes": len(pushes),
            "pushes_counted": counted,
            "pushes_excluded": len(excluded),
            "delivered": len(delivered),
            "delivered_all": delivered_all,
            "delivery_ratio": len(delivered) / counted if counted else 1.0,
            "delivery_ratio_all": delivered_all / len(pushes) if pushes else 1.0,
            "gossip_messages": self.gossip_messages,
            "gossip_bytes": self.gossip_bytes,
            "overhead_ratio": self.gossip_messages / regs / (n - 1) if regs and n > 1 else None,
            "stretch_median": nearest_rank(stretch, 0.5),
            "stretch_p95": nearest_rank(stretch, 0.95),
            "hops_p50": nearest_rank(hops, 0.5),
            "fallback_pushes": len(self.fallback & pushes),
            "fallback_messages": self.fallback_messages,
            "messages_per_delivered_push": self.push_messages / delivered_all if delivered_all else None,
            "route_coverage": coverage_num / coverage_den if coverage_den else None,
            "convergence_p50_s": nearest_rank(convergence, 0.5),
            "convergence_p90_s": nearest_rank(convergence, 0.9),
            "unconverged_registrations": unconverged,
            "loss_by_reason": loss,
        }


def shortest_latencies(
    n: int,
    latency: dict[tuple[int, int], float],
    processing: Sequence[float],
    pairs: Iterable[tuple[int, int]],
) -> dict[tuple[int, int], float]:
    """Directed shortest path u->v with weight latency(u,v) + processing(v), for the requested pairs."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra

    pairs = sorted(set(pairs))
    if not pairs:
        return {}
    src = np.fromiter((u for u, _ in latency), dtype=np.int64, count=len(latency))
    dst = np.fromiter((v for _, v in latency), dtype=np.int64, count=len(latency))
    w = np.fromiter((lat + processing[v] for (_, v), lat in latency.items()), dtype=np.float64, count=len(latency))
    graph = csr_matrix((w, (src, dst)), shape=(n, n))
    sources = sorted({u for u, _ in pairs})
    targets = sorted({v for _, v in pairs})
    # One Dijkstra per distinct source, or per distinct target on the transposed graph (the same path
    # sums, walked backwards): pushes come from thousands of relays but go to far fewer homes.
    reverse = len(targets) < len(sources)
    if reverse:
        graph = graph.T.tocsr()
    roots = targets if reverse else sources
    by_root: dict[int, list[tuple[int, int]]] = {}
    for u, v in pairs:
        by_root.setdefault(v if reverse else u, []).append((u, v))
    out: dict[tuple[int, int], float] = {}
    for start in range(0, len(roots), 256):  # bounded memory: 256 rows of n floats at a time
        chunk = roots[start:start + 256]
        dist = dijkstra(graph, directed=True, indices=chunk)
        for i, root in enumerate(chunk):
            for u, v in by_root[root]:
                out[(u, v)] = float(dist[i, u if reverse else v])
    return out
