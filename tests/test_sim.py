"""The simulator: delivery and stretch against an independent shortest path, exclusions, determinism, CLI."""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from inri.core.api import TraceLevel
from simulations.events import EventKind, EventQueue
from simulations.metrics import PUSH_MESSAGE_KINDS, Collector
from simulations.scenario import ScenarioError, from_dict, load
from simulations.sim import Simulator
from tests import home_costs_trace

REQUIRED_KEYS = {
    "relays", "registrations", "pushes", "delivered", "delivery_ratio", "gossip_messages", "gossip_bytes",
    "overhead_ratio", "stretch_median", "stretch_p95", "hops_p50", "fallback_pushes", "events", "events_per_s",
    "wall_s", "pushes_counted", "pushes_excluded", "delivery_ratio_all", "route_coverage", "fallback_messages",
    "messages_per_delivered_push", "convergence_p50_s", "convergence_p90_s", "loss_by_reason",
    "latency_p50_s", "latency_p95_s", "latency_p99_s", "path_stretch_median", "path_stretch_p95", "recovery_share",
    "overlay_penalty_median", "overlay_penalty_p95", "reach_p50", "reach_p10", "hops_p95", "hops_max",
    "excluded_old_rule", "delivery_ratio_old_rule", "pushes_never_delivered", "pushes_late",
    "messages_per_delivered_push_live_home", "messages_per_push_home_down", "pushes_never_delivered_home_up",
}


def small(**over: object) -> dict:
    raw: dict = {
        "name": "small", "seed": 11, "duration_s": 60.0, "deadline_s": 20.0, "coverage_after_s": 5.0,
        "topology": {"relays": 60},
        "workload": {"registrations": 12, "registration_end_s": 3.0, "tokens_per_registration": 10,
                     "pushes": 80, "push_start_s": 8.0, "push_end_s": 30.0},
        "engine": {"keepalive_interval_s": 1.0, "keepalive_misses": 3, "custody_retry_s": 1.0},
    }
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(raw.get(k), dict):
            raw[k] = {**raw[k], **v}
        else:
            raw[k] = v
    return raw


def dijkstra(n: int, edges: dict[tuple[int, int], float], processing: list[float], src: int) -> list[float]:
    adj: list[list[tuple[int, float]]] = [[] for _ in range(n)]
    for (u, v), lat in edges.items():
        adj[u].append((v, lat + processing[v]))
    dist = [float("inf")] * n
    dist[src] = 0.0
    heap = [(0.0, src)]
    while heap:
        d, u = heapq.heappop(heap)
        if d > dist[u]:
            continue
        for v, w in adj[u]:
            if d + w < dist[v]:
                dist[v] = d + w
                heapq.heappush(heap, (dist[v], v))
    return dist


def read_trace(directory: Path) -> list[dict]:
    return pq.read_table(directory / "events.parquet").to_pylist()


def test_tiny_scenario_delivers_everything_with_stretch_from_an_independent_shortest_path(tmp_path: Path) -> None:
    result = Simulator(load("tiny-50"), trace_dir=tmp_path).run()
    s = result.summary
    assert s["delivery_ratio"] == 1.0 and s["delivered"] == s["pushes"] == 60
    assert s["route_coverage"] == 1.0
    rows = read_trace(tmp_path)
    lines = (tmp_path / "topology.csv").read_text().splitlines()[1:]
    edges = {(int(a), int(b)): float(c) for a, b, c in (ln.split(",") for ln in lines)}
    proc = [float(ln.split(",")[1]) for ln in (tmp_path / "relays.csv").read_text().splitlines()[1:]]
    injected = {r["msg"]: r for r in rows if r["kind"] == "push_injected"}
    delivered = {r["msg"]: r for r in rows if r["kind"] == "push_delivered"}
    stretches = []
    for pid, inj in injected.items():
        dl = delivered[pid]
        if inj["relay"] == dl["relay"]:
            continue
        best = dijkstra(len(proc), edges, proc, int(inj["relay"]))[int(dl["relay"])]
        stretch = (dl["t"] - inj["t"]) / best
        assert stretch >= 1.0 - 1e-9  # nothing beats the shortest path
        stretches.append(stretch)
    stretches.sort()
    median = stretches[(len(stretches) + 1) // 2 - 1]
    assert median == pytest.approx(s["stretch_median"], rel=1e-9)
    assert median <= 1.05
    hops = sorted(r["hops"] for r in delivered.values())
    assert s["hops_p50"] == hops[(len(hops) + 1) // 2 - 1]


def test_churn_excludes_exactly_the_pushes_whose_home_went_down(tmp_path: Path) -> None:
    sc = from_dict(small(churn={"fail_fraction": 0.2, "rejoin_fraction": 0.5, "start_s": 8.0, "end_s": 30.0,
                                "downtime_s": 10.0}))
    s = Simulator(sc, trace_dir=tmp_path).run().summary
    rows = read_trace(tmp_path)
    home = {r["route"]: r["relay"] for r in rows if r["kind"] == "reg_originated"}
    downs: dict[str, list[tuple[float, bool]]] = {}
    for r in rows:
        if r["kind"] in ("relay_down", "relay_up"):
            downs.setdefault(r["relay"], []).append((r["t"], r["kind"] == "relay_up"))

    def home_down_during(relay: str, t0: float, t1: float) -> bool:
        state, changes = True, downs.get(relay, [])
        for t, up in changes:
            if t <= t0:
                state = up
        return not state or any(t0 <= t <= t1 and not up for t, up in changes)

    excluded = {r["msg"]: r["reason"] for r in rows if r["kind"] == "push_excluded"}
    assert downs and excluded  # the scenario really churned homes
    for r in rows:
        if r["kind"] == "push_injected":
            home_down = home_down_during(home[r["route"]], r["t"], r["t"] + sc.deadline_s)
            if home_down:  # a push whose home went down during its life is always excluded
                assert r["msg"] in excluded
            elif r["msg"] in excluded:  # otherwise only when failures cut it off from its home
                assert excluded[r["msg"]] == "partitioned"
    assert s["excluded_old_rule"] == len(excluded)
    assert s["delivery_ratio"] >= 0.95
    assert s["delivery_ratio_all"] <= s["delivery_ratio"]


def test_home_cost_figures_follow_each_homes_downtime_in_trace_order() -> None:
    """The hand trace of tests/home_costs_trace.py: messages of pushes whose home was up at injection per
    such push delivered; messages spent while the home is down per push that waited for a down home; pushes
    never delivered whose home never went down; and messages_per_delivered_push as before."""
    c = Collector(home_costs_trace.RELAYS, deadline_s=home_costs_trace.DEADLINE_S, coverage_after_s=1.0)
    columns = ("t", "relay", "kind", "msg", "route", "peer", "hops", "ttl", "epoch", "count", "bytes", "reason")
    c.add_all(tuple(r.get(k) for k in columns) for r in home_costs_trace.ROWS)
    s = c.summary()
    for key, want in home_costs_trace.EXPECTED.items():
        assert s[key] == pytest.approx(want, rel=1e-12), key


def test_home_cost_figures_of_a_churned_run_match_an_independent_reading_of_its_trace(tmp_path: Path) -> None:
    """The summary's home figures, streamed as the run goes, against the trace read whole: every home's
    down and up rows by position, each push's home at injection, its waiting window (injection to first
    delivery, or the end)."""
    # 20% loss (drop) keeps pushes waiting long enough that homes fail under some of them
    sc = from_dict(small(seed=5, network={"loss": 0.2}, churn={"fail_fraction": 0.25, "rejoin_fraction": 0.5,
                                                               "start_s": 8.0, "end_s": 30.0, "downtime_s": 6.0}))
    s = Simulator(sc, trace_dir=tmp_path).run().summary
    rows = read_trace(tmp_path)
    origin: dict[str, list[tuple[int, str]]] = {}
    changes: dict[str, list[tuple[int, bool]]] = {}
    injected: dict[str, int] = {}
    delivered: dict[str, int] = {}
    spam: set[str] = set()
    for i, r in enumerate(rows):
        if r["kind"] == "reg_originated":
            origin.setdefault(r["route"], []).append((i, r["relay"]))
        elif r["kind"] in ("relay_down", "relay_up"):
            changes.setdefault(r["relay"], []).append((i, r["kind"] == "relay_up"))
        elif r["kind"] == "push_injected":
            injected.setdefault(r["msg"], i)
        elif r["kind"] == "push_delivered":
            delivered.setdefault(r["msg"], i)
        elif r["kind"] == "push_excluded" and r["reason"] not in ("home_down", "partitioned"):
            spam.add(r["msg"])

    def down(relay: str, at: int) -> bool:
        before = [up for i, up in changes.get(relay, []) if i < at]
        return bool(before) and not before[-1]

    home = {}
    for p, i in injected.items():
        known = [relay for j, relay in origin.get(rows[i]["route"], []) if j < i]
        if known:
            home[p] = known[-1]
    live = {p for p in home if not down(home[p], injected[p])}
    exposed = {p for p in home if p not in live or any(
        not up and injected[p] < i < delivered.get(p, len(rows)) for i, up in changes.get(home[p], []))}
    m_live = m_down = 0
    for i, r in enumerate(rows):
        if r["kind"] in PUSH_MESSAGE_KINDS and r["msg"] in home:
            c = 1 if r["count"] is None else r["count"]
            m_live += c if r["msg"] in live else 0
            m_down += c if r["msg"] in exposed and down(home[r["msg"]], i) else 0
    on_time = {p for p in live if p in delivered and rows[delivered[p]]["t"] - rows[injected[p]]["t"] <= sc.deadline_s}
    assert len(exposed - live) > 0 and len(exposed & live) > 0 and m_down > 0  # both ways of waiting for a down home
    assert s["messages_per_delivered_push_live_home"] == m_live / len(on_time)
    assert s["messages_per_push_home_down"] == m_down / len(exposed)
    assert s["pushes_never_delivered_home_up"] == len(
        [p for p in home if p not in exposed and p not in delivered and p not in spam])


def test_only_pushes_cut_off_before_delivery_are_excluded(tmp_path: Path) -> None:
    """The exclusion rule looks no further than delivery: a push stored at its home before the home went
    down counts (docs/metrics.md); the old rule (any time in the deadline window) is reported beside it."""
    sc = from_dict(small(churn={"fail_fraction": 0.2, "rejoin_fraction": 0.5, "start_s": 8.0, "end_s": 30.0,
                                "downtime_s": 10.0}))
    s = Simulator(sc, trace_dir=tmp_path).run().summary
    rows = read_trace(tmp_path)
    injected = {r["msg"]: r["t"] for r in rows if r["kind"] == "push_injected"}
    stored: dict[str, float] = {}
    for r in rows:
        if r["kind"] == "push_delivered":
            stored.setdefault(r["msg"], r["t"])
    excluded_at: dict[str, float] = {}
    for r in rows:
        if r["kind"] == "push_excluded":
            excluded_at.setdefault(r["msg"], r["t"])
    on_time = {p for p, t in stored.items() if t - injected[p] <= sc.deadline_s}
    after_delivery = {p for p, t in excluded_at.items() if p in on_time and t > stored[p]}
    assert after_delivery  # the run has pushes whose home failed only after they were stored
    new_rule = set(excluded_at) - after_delivery
    assert s["pushes_excluded"] == len(new_rule) < s["excluded_old_rule"] == len(excluded_at)
    assert s["delivered"] == len(on_time - new_rule)
    assert s["pushes_counted"] == len(injected) - len(new_rule)


def test_hops_mean_links_crossed_in_every_push_row(tmp_path: Path) -> None:
    """push_received and push_delivered at the home carry the same hops (links crossed to get there), and a
    route-mode push with no retry crossed as many links as it was forwarded."""
    Simulator(load("tiny-50"), trace_dir=tmp_path, trace_level=TraceLevel.FULL).run()
    rows = read_trace(tmp_path)
    received = {(r["msg"], r["relay"], r["t"]): r["hops"] for r in rows if r["kind"] == "push_received"}
    forwarded: dict[str, list[dict]] = {}
    for r in rows:
        if r["kind"] == "push_forwarded":
            forwarded.setdefault(r["msg"], []).append(r)
    delivered = [r for r in rows if r["kind"] == "push_delivered"]
    assert delivered
    for d in delivered:
        fw = forwarded.get(d["msg"], [])
        assert d["hops"] == len(fw)
        if fw:
            assert received[(d["msg"], d["relay"], d["t"])] == d["hops"]
            assert sorted(r["hops"] for r in fw) == list(range(len(fw)))  # 0 at the injecting relay


def _row(t: float, relay: str, kind: str, msg: str | None = None, route: str | None = None,
         peer: str | None = None, hops: int | None = None, reason: str | None = None) -> tuple:
    return (t, relay, kind, msg, route, peer, hops, None, None, None, None, reason)


def test_path_stretch_uses_the_live_graph_at_injection_and_leaves_recovery_out() -> None:
    """A line 0-1-2 (10 ms a link) and a run-time link 0-2 (5 ms): a push injected before the shortcut is
    measured against 20 ms, one after it against 5 ms, one that needed a retry is left out of
    path_stretch but counted in recovery_share; latency and hop percentiles over the delivered."""
    c = Collector(3, deadline_s=5.0, coverage_after_s=1.0)
    up = [_row(0.0, a, "peer_up", peer=b) for a, b in (("0", "1"), ("1", "0"), ("1", "2"), ("2", "1"))]
    c.add_all([
        *up,
        _row(0.0, "2", "reg_originated", msg="R:1", route="R"),
        _row(1.0, "0", "push_injected", msg="P1", route="R"),
        _row(1.03, "2", "push_delivered", msg="P1", route="R", hops=2),
        _row(2.0, "0", "peer_up", peer="2"),
        _row(2.0, "2", "peer_up", peer="0"),
        _row(3.0, "0", "push_injected", msg="P2", route="R"),
        _row(3.01, "2", "push_delivered", msg="P2", route="R", hops=1),
        _row(4.0, "0", "push_injected", msg="P3", route="R"),
        _row(5.0, "0", "push_retry", msg="P3", route="R"),
        _row(5.1, "2", "push_delivered", msg="P3", route="R", hops=1),
    ])
    links = {("0", "1"): 0.01, ("1", "0"): 0.01, ("1", "2"): 0.01, ("2", "1"): 0.01, ("0", "2"): 0.005,
             ("2", "0"): 0.005}
    s = c.summary(links=links, processing={"0": 0.0, "1": 0.0, "2": 0.0})
    assert s["path_stretch_median"] == pytest.approx(1.5)  # P1: 30 ms / 20 ms; P2: 10 ms / 5 ms = 2.0
    assert s["path_stretch_p95"] == pytest.approx(2.0)
    assert s["recovery_share"] == pytest.approx(1 / 3)
    assert s["latency_p50_s"] == pytest.approx(0.03) and s["latency_p99_s"] == pytest.approx(1.1)
    assert (s["hops_p50"], s["hops_p95"], s["hops_max"]) == (1, 2, 2)


def test_partition_excludes_pushes_across_the_cut(tmp_path: Path) -> None:
    sc = from_dict(small(partitions=[{"start_s": 10.0, "end_s": 25.0, "fraction": 0.5}]))
    s = Simulator(sc, trace_dir=tmp_path).run().summary
    rows = read_trace(tmp_path)
    reasons = {r["reason"] for r in rows if r["kind"] == "push_excluded"}
    assert reasons == {"partitioned"}
    assert s["pushes_excluded"] > 0
    assert s["delivery_ratio"] >= 0.95


@pytest.mark.integration
def test_same_seed_same_trace_whatever_the_hash_seed(tmp_path: Path) -> None:
    digests = []
    for hash_seed in ("1", "4242"):
        out = tmp_path / hash_seed
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run([sys.executable, "-m", "simulations.cli", "run", "tiny-50", "--trace-dir", str(out),
                        "--trace-format", "jsonl", "--trace-level", "full"], env=env, check=True,
                       capture_output=True)
        digests.append(hashlib.sha256((out / "events.jsonl").read_bytes()).hexdigest())
    assert digests[0] == digests[1]


@pytest.mark.integration
def test_cli_last_line_is_json_with_every_required_key(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "simulations.cli", "run", "tiny-50", "--seed", "3",
                           "--trace-level", "off"], capture_output=True, text=True, check=True)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert REQUIRED_KEYS <= set(summary)
    assert summary["seed"] == 3 and summary["relays"] == 50


@pytest.mark.integration
def test_bad_scenarios_are_refused_with_the_key_at_fault(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="unknown key .bogus."):
        from_dict(small(topology={"bogus": 1}))
    with pytest.raises(ScenarioError, match="more pushes than tokens"):
        from_dict(small(workload={"pushes": 1000}))
    bad = tmp_path / "bad.toml"
    bad.write_text("[engine]\nnot_a_knob = 1\n")
    proc = subprocess.run([sys.executable, "-m", "simulations.cli", "run", str(bad)], capture_output=True, text=True)
    assert proc.returncode == 2 and "not_a_knob" in proc.stderr


def test_geographic_topology_is_connected_with_bounded_degree() -> None:
    sim = Simulator(from_dict(small(topology={"kind": "geographic", "relays": 200})))
    adj = sim.net.neighbours()
    assert all(1 <= len(a) <= 4 for a in adj)
    seen, stack = {0}, [0]
    while stack:
        for v in adj[stack.pop()]:
            if v not in seen:
                seen.add(v)
                stack.append(v)
    assert len(seen) == 200


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_incremental_components_match_a_full_relabel_under_fail_and_rejoin(data: st.DataObject) -> None:
    """The simulator keeps its component labels across churn (a local search per failure, a merge per
    rejoin) instead of relabelling every relay: the partition it keeps must equal a full relabel's."""
    sim = Simulator(from_dict(small(topology={"relays": 24})))
    n = sim.net.n
    # A sparse graph (about 1.3 links per relay), so failures really split components.
    for links in sim.lat:
        links.clear()
    for _ in range(data.draw(st.integers(8, 32), label="links")):
        u, v = data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, n - 1))
        if u != v:
            sim.lat[u][v] = sim.lat[v][u] = 0.01
    tracker = sim.components
    tracker.labels()

    def partition(labels: list[int]) -> set[frozenset[int]]:
        groups: dict[int, set[int]] = {}
        for i in range(n):
            if sim.alive[i]:
                groups.setdefault(labels[i], set()).add(i)
        return {frozenset(g) for g in groups.values()}

    for _ in range(data.draw(st.integers(1, 30), label="steps")):
        relay = data.draw(st.integers(0, n - 1))
        sim._control(EventKind.REJOIN if not sim.alive[relay] else EventKind.FAIL, relay, 0, None, 1.0)
        kept = list(tracker.kept if tracker.kept is not None else tracker.labels())
        tracker.invalidate()
        fresh = tracker.labels()
        assert partition(kept) == partition(fresh)
        assert all(kept[i] == -1 for i in range(n) if not sim.alive[i])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(0.0, 0.01), st.integers(0, 3)), max_size=300))
def test_event_queue_pops_in_heap_order(ops: list[tuple[bool, float, int]]) -> None:
    """EventQueue (calendar buckets) against heapq: same events out in the same order, including events
    pushed for the bucket being read and ties in time (broken by the sequence number). Odd kinds go in
    through `schedule` (which numbers them), even ones through `push` (numbered here)."""
    cal, heap = EventQueue(), []
    now, seq = 0.0, 0
    for is_push, delay, kind in ops:
        if is_push:
            seq += 1
            t = now + (delay if kind > 1 else 0.0)  # kinds 0, 1: due now, in the bucket being read
            if kind % 2:
                cal.schedule(t, kind, 0, 0, None)
            else:
                cal.seq = seq
                cal.push((t, seq, kind, 0, 0, None))
            heapq.heappush(heap, (t, seq, kind, 0, 0, None))
        else:
            got = cal.pop()
            assert got == (heapq.heappop(heap) if heap else None)
            if got is not None:
                now = got[0]
        assert len(cal) == len(heap)
    while heap:
        assert cal.pop() == heapq.heappop(heap)
    assert cal.pop() is None


def test_the_spammed_apis_rate_limits_are_the_relay_daemons_defaults() -> None:
    """simulations/ingress.py copies the daemon's documented [api] defaults (simulations do not import
    the daemon): a change of one default must show here."""
    from inri.node.config import ApiSection
    from simulations.ingress import CLIENT_LIMIT, DEVICE_LIMIT, TOKEN_LIMIT

    api = ApiSection()
    assert (CLIENT_LIMIT.rate_per_s, CLIENT_LIMIT.burst) == (api.rate_per_s, api.rate_burst)
    assert (DEVICE_LIMIT.rate_per_s, DEVICE_LIMIT.burst) == (api.device_rate_per_s, api.device_rate_burst)
    assert (TOKEN_LIMIT.rate_per_s, TOKEN_LIMIT.burst) == (api.token_rate_per_s, api.token_rate_burst)


def _sim_cli_without(module: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    """inri-sim with `module` not importable (as in an install without the sim extra)."""
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            "from simulations.cli import main\n"
            f"raise SystemExit(main({args!r}))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_without_the_sim_extra_the_simulator_says_what_to_install_in_one_line(tmp_path: Path) -> None:
    for module, args in (("pyarrow", ["run", "tiny-50", "--trace-dir", str(tmp_path / "t"), "--progress", "off"]),
                         ("numpy", ["run", "tiny-50", "--progress", "off"])):
        proc = _sim_cli_without(module, args)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1, proc.stderr
        assert lines[0].startswith(f"inri-sim: {module} is not installed") and "pip install 'inri[sim]'" in lines[0]
    # tqdm is optional: no progress bar, one line saying why, and the run goes on.
    proc = _sim_cli_without("tqdm", ["run", "tiny-50", "--progress", "on", "--trace-dir", str(tmp_path / "j"),
                                     "--trace-format", "jsonl"])
    assert proc.returncode == 0, proc.stderr
    assert "inri-sim: no progress bar: tqdm is not installed" in proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["delivery_ratio"] == 1.0


def test_simulations_import_neither_the_daemon_nor_private_names_of_the_engine() -> None:
    """Layering: simulations sit on inri.core and inri.protocol (public names), beside inri.node."""
    import ast

    found = []
    for path in sorted((Path(__file__).parent.parent / "simulations").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("inri"):
                mods, names = [node.module], [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                mods, names = [a.name for a in node.names], []
            else:
                continue
            for mod in mods:
                if mod == "inri.node" or mod.startswith("inri.node.") or "._" in mod:
                    found.append(f"{path.name}: {mod}")
            found += [f"{path.name}: {node.module}.{n}" for n in names if n.startswith("_")]
    assert found == []


def test_scale_100k_is_the_size_issue_18_names() -> None:
    """scale-100k (run by benchmarks/bench_scale.py, too big for a test): 100,000 relays, 1,000
    registrations, 10,000 pushes, 5% churn."""
    sc = load("scale-100k")
    assert (sc.topology.relays, sc.workload.registrations, sc.workload.pushes, sc.churn.fail_fraction) == (
        100_000, 1_000, 10_000, 0.05)


def test_churn_2k_is_churn_10k_at_a_fifth_of_its_size() -> None:
    """churn-2k (the churn runs of docs/results/ and docs/protocol.md) stands for churn-10k at 2,000
    relays: the same faults, mesh shape, timing and engine; a fifth of the relays, registrations, pushes."""
    small, big = load("churn-2k"), load("churn-10k")
    assert small == replace(
        big,
        name="churn-2k",
        topology=replace(big.topology, relays=big.topology.relays // 5),
        workload=replace(big.workload, registrations=big.workload.registrations // 5,
                         pushes=big.workload.pushes // 5),
    )


def _held_at_failure(rows: list[dict], deadline_s: float) -> dict[str, tuple[str, float, float]]:
    """push -> (its injecting relay, when that relay failed holding it, when it rejoined): the pushes a
    custodian held when it failed (injected there, not yet stored at a home) and that it could still
    deliver when it came back (rejoined within their deadline)."""
    stored: dict[str, float] = {}
    for r in rows:
        if r["kind"] == "push_delivered":
            stored.setdefault(r["msg"], r["t"])
    changes: dict[str, list[tuple[float, str]]] = {}
    for r in rows:
        if r["kind"] in ("relay_down", "relay_up"):
            changes.setdefault(r["relay"], []).append((r["t"], r["kind"]))
    held: dict[str, tuple[str, float, float]] = {}
    for r in rows:
        if r["kind"] != "push_injected":
            continue
        p, t0, relay = r["msg"], r["t"], r["relay"]
        seq = changes.get(relay, [])
        for i, (t, kind) in enumerate(seq):
            if kind == "relay_down" and t0 < t < stored.get(p, math.inf):
                up = next((u for u, k in seq[i + 1:] if k == "relay_up"), math.inf)
                if up < t0 + deadline_s:
                    held[p] = (relay, t, up)
                break
    return held


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_rejoined_relay_takes_back_the_custody_its_disk_kept(tmp_path: Path, seed: int) -> None:
    """The daemon commits custody to disk before its 202 and re-adopts it at startup; the simulator's
    churn keeps that disk ([churn] durable_custody, on by default): a relay that fails holding pushes
    tries them again when it rejoins, and delivers pushes only that would deliver. With it off (a crash
    without disk) the pushes it held are never tried again. (Rule C8 is off here: see
    tests/test_custody_backup.py.)"""
    raw = small(seed=seed, deadline_s=60.0, duration_s=100.0, network={"loss": 0.1, "loss_model": "drop"},
                workload={"pushes": 300, "tokens_per_registration": 30},
                # custody_backup off: a neighbour adopting the pushes (rule C8) would deliver some of them
                engine={"custody_retry_s": 3.0, "custody_backup": False},
                churn={"fail_fraction": 0.3, "rejoin_fraction": 1.0, "start_s": 8.0, "end_s": 30.0,
                       "downtime_s": 5.0})
    tried: dict[bool, dict[str, bool]] = {}
    delivered_after: dict[bool, set[str]] = {}
    for durable in (True, False):
        raw["churn"]["durable_custody"] = durable
        sc = from_dict(raw)
        out = tmp_path / str(durable)
        Simulator(sc, trace_dir=out).run()
        rows = read_trace(out)
        held = _held_at_failure(rows, sc.deadline_s)
        assert held  # the run has custodians that failed holding pushes and came back in time
        again = {r["msg"] for r in rows if r["kind"] == "push_retry" and r["msg"] in held
                 and r["relay"] == held[r["msg"]][0] and r["t"] >= held[r["msg"]][2]}
        tried[durable] = {p: p in again for p in held}
        delivered_after[durable] = {r["msg"] for r in rows if r["kind"] == "push_delivered" and r["msg"] in held
                                    and r["t"] >= held[r["msg"]][2]}
    assert all(tried[True].values()), "a rejoined custodian forgot a push its disk kept"
    assert not any(tried[False].values())
    assert delivered_after[True] and len(delivered_after[True]) > len(delivered_after[False])
