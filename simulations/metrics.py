"""The summary metrics of docs/metrics.md, computed from trace rows as they stream past.

The simulator feeds every summary-level row here (whatever the trace level written to disk), so its
summary and the Spark analysis (spark_analysis/) derive every shared key from the same records with the
same formulas. Rows must arrive in time order (the simulator emits them so).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import numpy as np

GOSSIP_KINDS = ("reg_originated", "route_set", "gossip_control", "reg_reforwarded")
PUSH_MESSAGE_KINDS = ("push_forwarded", "push_fallback", "receipt_forwarded", "route_error")
# Exclusions the topology decides (docs/metrics.md): counted only when the home was down or cut off
# before the push was delivered. Every other reason (the spammer's pushes) always excludes.
TOPOLOGY_EXCLUSIONS = ("home_down", "partitioned")

# The live-graph timeline: what changes the graph of links both ends hold up, and the pushes measured on it.
_PEER_UP, _PEER_DOWN, _RESET, _PUSH = 0, 1, 2, 3


def nearest_rank(sorted_values: Sequence[float], q: float) -> float | None:
    """x[ceil(q * n)] (1-based) of a sorted list; x[1] when q*n < 1; None when empty."""
    n = len(sorted_values)
    if n == 0:
        return None
    rank = max(1, math.ceil(q * n - 1e-12))
    return sorted_values[min(rank, n) - 1]


class HomeCosts:
    """What pushes cost while their home relay is up and while it is down (docs/metrics.md, issue 42).

    Rows are taken in trace order: a relay is down from its `relay_down` row until its next `relay_up`
    row. A push's home is the relay of the latest `reg_originated` row of its route before its (first)
    `push_injected` row; a push with no such row has no home and is left out of these figures. A push is
    *exposed* when its home is down at its `push_injected` row, or has a `relay_down` row after it and
    before the push's first `push_delivered` row (never delivered: before the end of the trace)."""

    __slots__ = ("down", "home", "live", "exposed", "pending", "messages_live", "messages_down")

    def __init__(self) -> None:
        self.down: set[str] = set()  # relays down at the current row
        self.home: dict[str, str] = {}  # push -> its home at injection
        self.live: set[str] = set()  # pushes whose home was up at injection
        self.exposed: set[str] = set()
        self.pending: dict[str, set[str]] = {}  # home -> its pushes injected and not delivered yet
        self.messages_live = 0  # messages of pushes whose home was up at injection
        self.messages_down = 0  # messages of exposed pushes, written while their home was down

    def injected(self, push: str, home: str | None) -> None:
        """The first push_injected row of a push (home: None when its route has no origin yet)."""
        if home is None:
            return
        self.home[push] = home
        if home in self.down:
            self.exposed.add(push)
        else:
            self.live.add(push)
        self.pending.setdefault(home, set()).add(push)

    def delivered(self, push: str) -> None:
        """The first push_delivered row of a push."""
        home = self.home.get(push)
        if home is not None:
            self.pending[home].discard(push)

    def relay_down(self, relay: str) -> None:
        """A relay_down row: the pushes waiting for this home are exposed."""
        self.down.add(relay)
        waiting = self.pending.get(relay)
        if waiting:
            self.exposed |= waiting

    def relay_up(self, relay: str) -> None:
        """A relay_up row."""
        self.down.discard(relay)

    def messages(self, push: str, count: int) -> None:
        """A row `messages_per_delivered_push` counts (PUSH_MESSAGE_KINDS), standing for `count` messages."""
        home = self.home.get(push)
        if home is None:
            return
        if push in self.live:
            self.messages_live += count
        if home in self.down and push in self.exposed:
            self.messages_down += count

    def summary(self, on_time: AbstractSet[str], delivered: AbstractSet[str],
                not_topology_excluded: AbstractSet[str]) -> dict[str, object]:
        """The three keys. `on_time`: pushes delivered within the deadline; `delivered`: pushes with a
        push_delivered row; `not_topology_excluded`: pushes excluded for a reason the topology does not
        decide (a spammer's), left out of pushes_never_delivered_home_up."""
        live_delivered = len(self.live & on_time)
        never = sum(1 for p in self.home
                    if p not in self.exposed and p not in delivered and p not in not_topology_excluded)
        return {
            "messages_per_delivered_push_live_home": self.messages_live / live_delivered if live_delivered else None,
            "messages_per_push_home_down": self.messages_down / len(self.exposed) if self.exposed else None,
            "pushes_never_delivered_home_up": never,
        }


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
        # Bytes of one full frame of each registration (gossip_bytes_ratio): its reg_originated rows'
        # (the smallest), else (a stem origin writes none) the largest of its route_set rows'.
        self.reg_frame: dict[str, int] = {}
        self.reg_frame_routed: dict[str, int] = {}  # msg without origin bytes -> max route_set bytes
        self.reg_times: dict[str, array[float]] = {}  # msg -> route_set times
        self.reg_relays: dict[str, list[str]] = {}  # msg -> route_set relays (same order)
        self.injected: dict[str, tuple[float, str]] = {}  # push -> (t, relay)
        self.delivered: dict[str, tuple[float, str, int]] = {}  # push -> earliest (t, relay, hops)
        self.excluded: dict[str, tuple[float, str]] = {}  # push -> earliest push_excluded (t, reason)
        self.dropped: dict[str, str] = {}  # push -> latest drop reason
        self.fallback: set[str] = set()
        self.fallback_per_push: dict[str, int] = {}  # push -> ring messages (push_fallback counts)
        self.budget_exhausted: set[str] = set()  # pushes re-sent along routes: the next ring would not fit the budget
        self.settled_delivered: set[str] = set()  # pushes a custodian settled as delivered (a receipt said so)
        self.retried: set[str] = set()  # pushes with a push_retry row
        self.home_of_route: dict[str, str] = {}  # route -> the relay that originated it (its home)
        # Link and push events in row order, for the live graph at each injection (see live_distances).
        self.timeline: list[tuple[int, str, str | None]] = []
        self.transitions: dict[str, list[tuple[float, bool]]] = {}  # relay -> [(t, up)]
        self.home_costs = HomeCosts()
        # Homes in two places (issue 42, item 3): route -> the relays that originated it; push -> its route
        self.route_origins: dict[str, set[str]] = {}
        self.push_route: dict[str, str] = {}
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
            self.home_costs.messages(msg, c)
            if kind == "push_fallback":
                self.fallback_messages += c
                self.fallback.add(msg)
                self.fallback_per_push[msg] = self.fallback_per_push.get(msg, 0) + c
        elif kind == "reg_reforwarded":  # rule G3b: more gossip copies of a known (route, epoch)
            count = row[9] or 0
            self.gossip_messages += count
            self.gossip_bytes += count * (row[10] or 0)
        elif kind == "reg_originated":
            count = row[9] or 0
            self.gossip_messages += count
            self.gossip_bytes += count * (row[10] or 0)
            self.reg_origin.setdefault(msg, (t, relay))
            nb = row[10]
            if nb is not None:
                got = self.reg_frame.get(msg)
                self.reg_frame[msg] = nb if got is None else min(got, nb)
            elif msg not in self.reg_frame:
                self.reg_frame_routed.setdefault(msg, 0)
            if row[4] is not None:
                self.home_of_route[row[4]] = relay
                self.route_origins.setdefault(row[4], set()).add(relay)
        elif kind == "gossip_control":  # tree gossip (G9): announcements, grafts, graft answers
            c = row[9] or 0
            self.gossip_messages += c
            self.gossip_bytes += c * (row[10] or 0)
        elif kind == "push_injected":
            if msg not in self.injected:
                self.injected[msg] = (t, relay)
                if row[4] is not None:
                    self.push_route[msg] = row[4]
                home = self.home_of_route.get(row[4]) if row[4] is not None else None
                self.timeline.append((_PUSH, msg, home))
                self.home_costs.injected(msg, home)
        elif kind == "push_retry":
            self.retried.add(msg)
            if row[11] == "fallback_budget":
                self.budget_exhausted.add(msg)
        elif kind == "peer_up":
            self.timeline.append((_PEER_UP, relay, row[5]))
        elif kind == "peer_down":
            self.timeline.append((_PEER_DOWN, relay, row[5]))
        elif kind == "push_delivered":
            if msg not in self.delivered:
                self.delivered[msg] = (t, relay, row[6] or 0)
                self.home_costs.delivered(msg)
        elif kind == "push_dropped":
            self.dropped[msg] = row[11] or "unknown"
        elif kind == "push_settled":
            if row[11] == "delivered":
                self.settled_delivered.add(msg)
        elif kind == "push_excluded":
            if msg not in self.excluded:
                self.excluded[msg] = (t, row[11] or "unknown")
        elif kind == "relay_down":
            self.transitions.setdefault(relay, []).append((t, False))
            self.timeline.append((_RESET, relay, None))
            self.home_costs.relay_down(relay)
        elif kind == "relay_up":
            self.transitions.setdefault(relay, []).append((t, True))
            self.timeline.append((_RESET, relay, None))
            self.home_costs.relay_up(relay)

    def add_route_set(self, row: tuple[Any, ...]) -> None:
        """Feed one route_set row (what `add` does for that kind, without the dispatch)."""
        self.rows += 1
        count = row[9] or 0
        self.gossip_messages += count
        self.gossip_bytes += count * (row[10] or 0)
        msg = row[3]
        if self.reg_frame_routed and msg in self.reg_frame_routed and row[10] is not None:
            self.reg_frame_routed[msg] = max(self.reg_frame_routed[msg], row[10])
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
    def down_at(self, t: float) -> set[str]:
        """Relays down at time t (relay_down/relay_up rows)."""
        return self._down_at(t)

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

    # -- the live graph ------------------------------------------------------------------------
    def live_distances(self, links: dict[tuple[str, str], float], processing: dict[str, float]) -> dict[str, float]:
        """Per push with a known home other than its injecting relay: the latency-shortest path from the
        injecting relay to the home over the live graph at its injection (docs/metrics.md): links both
        ends hold up (their latest peer_up for each other is not followed by a peer_down, or by a
        relay_down/relay_up of either end, which empties a relay's links), weight latency(u,v) +
        processing(v); `links`: every link of the run with its latency. inf when no live path."""
        graph = _LiveEdges(links, processing)
        pending: list[tuple[str, str, str]] = []
        out: dict[str, float] = {}
        for code, a, b in self.timeline:
            if code == _PUSH:
                inj = self.injected[a][1]
                if b is not None and b != inj:
                    pending.append((a, inj, b))
                continue
            if pending:  # the pushes so far were injected on the graph as it was before this change
                out.update(graph.distances(pending))
                pending.clear()
            if code == _PEER_UP and b is not None:
                graph.peer_up(a, b)
            elif code == _PEER_DOWN and b is not None:
                graph.peer_down(a, b)
            elif code == _RESET:
                graph.reset(a)
        out.update(graph.distances(pending))
        return out

    # -- the summary --------------------------------------------------------------------------
    def on_time(self) -> set[str]:
        """Pushes first stored at their home within the deadline of their injection."""
        return {p for p, (t, _, _) in self.delivered.items()
                if p in self.injected and t - self.injected[p][0] <= self.deadline}

    def home_cost_summary(self) -> dict[str, object]:
        """messages_per_delivered_push_live_home, messages_per_push_home_down and
        pushes_never_delivered_home_up (docs/metrics.md; HomeCosts)."""
        spam = {p for p, (_, why) in self.excluded.items() if why not in TOPOLOGY_EXCLUSIONS}
        return self.home_costs.summary(self.on_time(), self.delivered.keys(), spam)

    def _excluded(self, old_excluded: AbstractSet[str], on_time: AbstractSet[str]) -> set[str]:
        """The pushes excluded by the rule of docs/metrics.md: the home was down or cut off before delivery
        (any time, when not on time); every other reason always excludes."""
        excluded: set[str] = set()
        for p in old_excluded:
            t_x, why = self.excluded[p]
            if why not in TOPOLOGY_EXCLUSIONS or p not in on_time or t_x <= self.delivered[p][0]:
                excluded.add(p)
        return excluded

    def multi_home_summary(self) -> dict[str, object]:
        """Pushes to devices registered at several homes (routes originated by two relays or more: issue
        42, item 3) and, for comparison, to the others: counted, delivered on time, ratio, never delivered,
        searched for (push_fallback rows). The same formulas as delivery_ratio (docs/metrics.md)."""
        pushes = set(self.injected)
        on_time = self.on_time()
        counted = pushes - self._excluded(set(self.excluded) & pushes, on_time)
        multi = {p for p in counted if len(self.route_origins.get(self.push_route.get(p, ""), ())) > 1}
        out: dict[str, object] = {}
        for prefix, group in (("multi_home", multi), ("single_home", counted - multi)):
            delivered = len(group & on_time)
            out[f"{prefix}_pushes"] = len(group)
            out[f"{prefix}_delivered"] = delivered
            out[f"{prefix}_delivery_ratio"] = delivered / len(group) if group else None
            out[f"{prefix}_never_delivered"] = len(group - self.delivered.keys())
            out[f"{prefix}_fallback_pushes"] = len(group & self.fallback)
        return out

    def summary(self, distance: dict[tuple[str, str], float] | None = None,
                links: dict[tuple[str, str], float] | None = None, processing: dict[str, float] | None = None,
                direct: dict[tuple[str, str], float] | None = None) -> dict[str, object]:
        """Every key of docs/metrics.md. `distance[(inject relay, home relay)]` gives the stretch denominators
        over the initial topology; `links` (every link of the run, with its latency) and `processing` the
        live graph of path_stretch and overlay_penalty; `direct[(u, v)]` the direct underlay latency."""
        n = self.relays
        pushes = set(self.injected)
        old_excluded = set(self.excluded) & pushes
        on_time = self.on_time()
        excluded = self._excluded(old_excluded, on_time)
        counted = len(pushes) - len(excluded)
        delivered = on_time - excluded
        delivered_old = on_time - old_excluded
        counted_old = len(pushes) - len(old_excluded)
        regs = len(self.reg_origin)
        hops = sorted(self.delivered[p][2] for p in delivered)
        latency = sorted(self.delivered[p][0] - self.injected[p][0] for p in delivered)
        recovered = (self.retried | self.fallback) & pushes
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
        path_stretch: list[float] = []
        penalty: list[float] = []
        if links is not None:
            live = self.live_distances(links, processing or {})
            for p in sorted(delivered):
                d = live.get(p)
                if d is None or not math.isfinite(d) or d <= 0:
                    continue
                t_inj, r_inj = self.injected[p]
                t_del, r_del, _ = self.delivered[p]
                if p not in recovered:
                    path_stretch.append((t_del - t_inj) / d)
                if direct is not None:
                    dd = direct.get((r_inj, r_del))
                    if dd:
                        penalty.append(d / dd)
            path_stretch.sort()
            penalty.sort()
        # Bytes of one full frame, summed over the registrations (docs/metrics.md, gossip_bytes_ratio).
        frame_bytes = sum(self.reg_frame.get(m) or self.reg_frame_routed.get(m, 0) for m in self.reg_origin)
        coverage_num = coverage_den = 0
        reach: list[float] = []
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
            if live_cov > 0:
                reach.append(len(got) / live_cov)
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
        reach.sort()
        loss: dict[str, int] = {}
        late = 0
        for p in sorted(pushes - excluded - delivered):
            late += p in self.delivered
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
            "excluded_old_rule": len(old_excluded),
            "delivered": len(delivered),
            "delivered_all": delivered_all,
            "delivery_ratio": len(delivered) / counted if counted else 1.0,
            "delivery_ratio_old_rule": len(delivered_old) / counted_old if counted_old else 1.0,
            "delivery_ratio_all": delivered_all / len(pushes) if pushes else 1.0,
            "gossip_messages": self.gossip_messages,
            "gossip_bytes": self.gossip_bytes,
            "overhead_ratio": self.gossip_messages / regs / (n - 1) if regs and n > 1 else None,
            "gossip_bytes_ratio": self.gossip_bytes / ((n - 1) * frame_bytes) if frame_bytes and n > 1 else None,
            "latency_p50_s": nearest_rank(latency, 0.5),
            "latency_p95_s": nearest_rank(latency, 0.95),
            "latency_p99_s": nearest_rank(latency, 0.99),
            "stretch_median": nearest_rank(stretch, 0.5),
            "stretch_p95": nearest_rank(stretch, 0.95),
            "path_stretch_median": nearest_rank(path_stretch, 0.5),
            "path_stretch_p95": nearest_rank(path_stretch, 0.95),
            "overlay_penalty_median": nearest_rank(penalty, 0.5),
            "overlay_penalty_p95": nearest_rank(penalty, 0.95),
            "recovery_share": len(recovered - excluded) / counted if counted else None,
            "hops_p50": nearest_rank(hops, 0.5),
            "hops_p95": nearest_rank(hops, 0.95),
            "hops_max": hops[-1] if hops else None,
            "fallback_pushes": len(self.fallback & pushes),
            "fallback_messages": self.fallback_messages,
            "messages_per_delivered_push": self.push_messages / delivered_all if delivered_all else None,
            **self.home_cost_summary(),
            "route_coverage": coverage_num / coverage_den if coverage_den else None,
            "reach_p50": nearest_rank(reach, 0.5),
            "reach_p10": nearest_rank(reach, 0.1),
            "convergence_p50_s": nearest_rank(convergence, 0.5),
            "convergence_p90_s": nearest_rank(convergence, 0.9),
            "unconverged_registrations": unconverged,
            "loss_by_reason": loss,
            # Counted pushes not delivered on time: those never delivered at all, and those delivered
            # after the deadline (loss_by_reason names the last drop of either kind).
            "pushes_never_delivered": counted - len(delivered) - late,
            "pushes_late": late,
        }


class _LiveEdges:
    """The live graph kept across changes: each directed link has a slot in flat arrays whose weight is
    latency + processing while both ends hold it up and inf otherwise, so a Dijkstra after a change
    costs one array conversion instead of a walk over every relay's links."""

    def __init__(self, links: dict[tuple[str, str], float], processing: dict[str, float]) -> None:
        self.links = links
        self.processing = processing
        self.index = {name: i for i, name in enumerate(sorted({u for u, _ in links} | {v for _, v in links}))}
        self.up: dict[str, set[str]] = {}
        self.slot: dict[tuple[str, str], int] = {}
        self.src: list[int] = []
        self.dst: list[int] = []
        self.w: list[float] = []

    def _set(self, u: str, v: str, live: bool) -> None:
        lat = self.links.get((u, v))
        if lat is None:
            return
        weight = lat + self.processing.get(v, 0.0) if live else math.inf
        s = self.slot.get((u, v))
        if s is None:
            if not live:
                return
            self.slot[(u, v)] = len(self.w)
            self.src.append(self.index[u])
            self.dst.append(self.index[v])
            self.w.append(weight)
        else:
            self.w[s] = weight

    def _pair(self, a: str, b: str, live: bool) -> None:
        self._set(a, b, live)
        self._set(b, a, live)

    def peer_up(self, a: str, b: str) -> None:
        """a holds its link to b up."""
        peers = self.up.setdefault(a, set())
        if b not in peers:
            peers.add(b)
            if a in self.up.get(b, ()):
                self._pair(a, b, True)

    def peer_down(self, a: str, b: str) -> None:
        """a dropped its link to b."""
        peers = self.up.get(a)
        if peers is not None and b in peers:
            peers.discard(b)
            if a in self.up.get(b, ()):
                self._pair(a, b, False)

    def reset(self, a: str) -> None:
        """a failed or restarted: it holds no links."""
        for b in self.up.pop(a, set()):
            if a in self.up.get(b, ()):
                self._pair(a, b, False)

    def distances(self, pending: list[tuple[str, str, str]]) -> dict[str, float]:
        """Shortest path for each (push, source, target), one Dijkstra per distinct source."""
        from scipy.sparse import csr_matrix
        from scipy.sparse.csgraph import dijkstra

        index = self.index
        sources = sorted({s for _, s, _ in pending if s in index})
        w = np.array(self.w, dtype=np.float64)
        live = np.isfinite(w)
        if not sources or not live.any():
            return {p: math.inf for p, _, _ in pending}
        n = len(index)
        graph = csr_matrix((w[live], (np.array(self.src)[live], np.array(self.dst)[live])), shape=(n, n))
        dist = dijkstra(graph, directed=True, indices=[index[s] for s in sources])
        row = {s: i for i, s in enumerate(sources)}
        return {p: float(dist[row[s], index[t]]) if s in row and t in index else math.inf for p, s, t in pending}


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
