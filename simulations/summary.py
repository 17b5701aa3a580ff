"""The run's summary (docs/metrics.md): the collector's figures, the adversary figures, the run's own
counts, and the CLI's last line."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from pathlib import Path

from inri.core.engine import Engine
from simulations.adversary import Adversary, RegSpammer
from simulations.metrics import Collector, shortest_latencies
from simulations.scenario import Topology
from simulations.topology import Network
from simulations.workload import PushPlan, Roles, Workload


@dataclass
class Result:
    """The run's summary (the CLI's last line) and where the trace went."""

    summary: dict[str, object]
    trace_dir: Path | None = None
    extra: dict[str, object] = field(default_factory=dict)


def summary_line(result: Result) -> str:
    """The CLI's last line: the summary as one JSON object."""
    return json.dumps(result.summary, sort_keys=True)


def delivery_summary(collector: Collector, net: Network, names: Sequence[str], work: Workload,
                     live: Sequence[dict[int, float]] | None = None, topo: Topology | None = None) -> dict[str, object]:
    """The collector's figures, with each push's latency set against the shortest path of the initial
    topology from the relay it was injected at to its home (stretch_*), and against the live graph at
    injection (path_stretch_*, overlay_penalty_*). `live`: every link of the run with its latency (the
    simulator's link table: the topology plus links opened at run time); `topo` gives the direct
    underlay latency of geographic topologies."""
    pairs = {(p.inject, h) for p in work.pushes for h in work.homes_of(p.reg_index)}  # each home (multi-home)
    dist_idx = shortest_latencies(net.n, net.latency, net.processing, pairs)
    distance = {(names[u], names[v]): d for (u, v), d in dist_idx.items()}
    links = None if live is None else run_links(live, names)
    processing = {names[i]: p for i, p in enumerate(net.processing)}
    direct = None
    if net.positions is not None and topo is not None:
        direct = {(names[u], names[v]): direct_latency(net, topo, u, v) for u, v in pairs}
    return collector.summary(distance, links, processing, direct)


def run_links(live: Sequence[dict[int, float]], names: Sequence[str]) -> dict[tuple[str, str], float]:
    """Every directed link of the run by relay name, with its latency."""
    return {(names[u], names[v]): lat for u, out in enumerate(live) for v, lat in out.items()}


def direct_latency(net: Network, topo: Topology, u: int, v: int) -> float:
    """The direct underlay latency u -> v of a geographic topology (its distance term, no asymmetry),
    plus v's processing delay: what one overlay link straight to v would cost."""
    assert net.positions is not None
    (x1, y1), (x2, y2) = net.positions[u], net.positions[v]
    return topo.geo_base_s + math.hypot(x1 - x2, y1 - y2) * topo.geo_per_unit_s + net.processing[v]


def adversary_summary(tables: Sequence[Adversary], roles: Roles, hostile_on: bool, engines: Sequence[Engine],
                      alive: Sequence[bool], names: Sequence[str], work: Workload,
                      scored: Sequence[tuple[str, str | None, str | None]],
                      settled_delivered: AbstractSet[str] = frozenset(),
                      delivered: Mapping[str, object] | None = None) -> dict[str, object]:
    """Figures of hostile relays (docs/metrics.md, "Adversarial scenarios"), read from the engines at the
    end of the run and from the honest relays' scoring cuts (`scored`: peer_scored rows). `tables`: the
    scenario's `[[adversaries]]`. `settled_delivered`: pushes a custodian settled as delivered;
    `delivered`: pushes a home stored (the collector's)."""
    delivered = delivered or {}
    out: dict[str, object] = {"adversaries_on": hostile_on}
    kinds: dict[str, int] = {}
    for a in roles.role:
        if a is not None:
            kinds[a.kind] = kinds.get(a.kind, 0) + 1
    out["hostile_relays"] = kinds
    n = len(engines)
    hostile = {names[i] for i in range(n) if roles.role[i] is not None}
    honest_cuts = [(r, p) for r, p, _ in scored if r not in hostile]
    out["cuts_of_hostile"] = sum(1 for _, p in honest_cuts if p in hostile)
    out["cuts_of_honest"] = sum(1 for _, p in honest_cuts if p not in hostile)
    honest_names = {names[i] for i in roles.honest}
    index = {name: i for i, name in enumerate(names)}
    out["hostile_isolated"] = sum(1 for h in hostile if not honest_names & set(engines[index[h]].active_peers()))
    # Route vectors whose primary next hop is hostile, over honest live relays and honest routes.
    routes = [reg.route_id for _, reg, _ in work.regs if reg is not None]
    primary = hostile_primary = 0
    for i in roles.honest:
        if not alive[i]:
            continue
        eng = engines[i]
        for rid in routes:
            hops = eng.next_hops(rid)
            if hops:
                primary += 1
                hostile_primary += hops[0][0] in hostile
    out["primary_via_hostile"] = hostile_primary / primary if primary else None
    spam_routes: set[bytes] = set()
    for eng in engines:
        if isinstance(eng, RegSpammer):
            spam_routes |= eng.spam_routes
    if any(a.kind == "receipt_forger" for a in tables):
        # Forged receipts sent, and what became of them: refused by an honest relay (rule F5), or
        # believed: pushes a custodian settled as delivered that no home ever stored.
        out["receipts_forged"] = sum(engines[i].counters.get("adversary_receipts_forged", 0)
                                     for i in range(n) if roles.role[i] is not None)
        out["receipts_refused"] = sum(engines[i].counters.get("receipt_refused", 0) for i in roles.honest)
        out["settled_not_delivered"] = len(settled_delivered - set(delivered))
    if any(a.kind in ("reg_spammer", "forger") for a in tables):
        out["spam_frames_sent"] = sum(getattr(eng, "spam_sent", 0) for eng in engines)
    if spam_routes:
        cached = [sum(1 for r in spam_routes if engines[i].route_epoch(r) is not None)
                  for i in roles.honest if alive[i]]
        out["spam_registrations"] = len(spam_routes)
        out["spam_routes_cached_max"] = max(cached) if cached else 0
        out["spam_routes_cached_mean"] = round(sum(cached) / len(cached), 1) if cached else 0
    return out


def scope_reach(collector: Collector, net: Network, names: Sequence[str], ttl: int) -> dict[str, object]:
    """Reach within the gossip TTL's scope: over registrations, the relays within `ttl` hops of the home
    on the initial topology (fewest hops) and live at t0 + coverage_after, the share that holds a route
    by then (pooled as route_coverage). With first arrivals only, latency-first flooding can spend a
    copy's TTL on long detours and leave relays inside the scope unreached (docs/protocol.md, "TTLs")."""
    adj = net.neighbours()
    index = {name: i for i, name in enumerate(names)}
    num = den = 0
    down_cache: dict[float, set[str]] = {}
    for msg, (t0, origin) in collector.reg_origin.items():
        o = index.get(origin)
        if o is None:
            continue
        t_cov = t0 + collector.coverage_after
        down = down_cache.get(t_cov)
        if down is None:
            down = down_cache[t_cov] = collector.down_at(t_cov)
        dist = {o: 0}
        frontier = [o]
        for d in range(1, ttl + 1):
            nxt = []
            for u in frontier:
                for v in adj[u]:
                    if v not in dist:
                        dist[v] = d
                        nxt.append(v)
            if not nxt:
                break
            frontier = nxt
        scope = {names[v] for v in dist if v != o} - down
        got = {r for tt, r in zip(collector.reg_times.get(msg, ()), collector.reg_relays.get(msg, []), strict=True)
               if tt <= t_cov}
        num += len(scope & got)
        den += len(scope)
    return {"scope_reach": num / den if den else None}


def cut_reasons(scored: Sequence[tuple[str, str | None, str | None]]) -> dict[str, int]:
    """Scoring cuts (peer_scored rows) by the reason of the score change that made them."""
    out: dict[str, int] = {}
    for _, _, reason in scored:
        key = reason or "unknown"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def score_penalties(engines: Sequence[Engine]) -> dict[str, int]:
    """Every score penalty the relays gave a neighbour in the run, by reason (the engines' score_*
    counters: docs/protocol.md, "Peer scoring")."""
    out: dict[str, int] = {}
    for eng in engines:
        for name, n in eng.counters.items():
            if name.startswith("score_"):
                out[name] = out.get(name, 0) + n
    return dict(sorted(out.items()))


def fallback_summary(engines: Sequence[Engine], collector: Collector) -> dict[str, object]:
    """The fallback budget (docs/protocol.md, "Repair and fallback") and its effect: the budget in
    messages per push, the pushes whose custodian stopped searching because the next ring would not
    fit it (they were re-sent along routes instead), and the most ring messages any one push cost."""
    budget = engines[0].config.fallback_budget if engines else None
    per_push = collector.fallback_per_push
    return {
        "fallback_budget": budget,
        "fallback_budget_exhausted": len(collector.budget_exhausted),
        "fallback_messages_max_push": max(per_push.values(), default=0),
    }


def delivered_at(collector: Collector, plan: PushPlan) -> float | None:
    """When the push of a plan was first stored at its home, or None."""
    got = collector.delivered.get(plan.push_id) if plan.push_id else None
    return None if got is None else got[0]


def route_k2_share(engines: Sequence[Engine], alive: Sequence[bool], work: Workload) -> float | None:
    """At the end of the run, over every registration and every live relay but its home: the share of
    (relay, registration) pairs whose route holds 2 or more next hops (a backup; docs/metrics.md)."""
    routes = [reg.route_id for _, reg, _ in work.regs if reg is not None]
    homes = [home for home, reg, _ in work.regs if reg is not None]
    pairs = with_two = 0
    for i, eng in enumerate(engines):
        if alive[i]:
            own = [rid for rid, home in zip(routes, homes, strict=True) if home != i]
            pairs += len(own)
            with_two += eng.routes_with_next_hops(own, 2)
    return with_two / pairs if pairs else None
