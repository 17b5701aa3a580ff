"""Issue 17: meshes built by the shipped code (kind "built"), their small-world shape (rule M5), the
geographic builder's degrees, and scenario validation through the CLI."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from inri.core.api import Connect
from inri.core.config import EngineConfig
from inri.core.engine import Engine
from inri.core.home import MemoryHomeStore
from inri.core.trace import NullTracer
from inri.core.verify import CachingVerifier
from inri.protocol import limits
from inri.protocol.messages import PeerInfo
from simulations.built import built_edges
from simulations.scenario import Topology
from simulations.topology import Network, build, shape


def _positions(n: int, seed: int) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    return [(rng.random(), rng.random()) for _ in range(n)]


@pytest.mark.parametrize("seed", [1, 2])
def test_built_mesh_is_connected_with_the_membership_degrees(seed: int) -> None:
    n = 200
    net = build(Topology(kind="built", relays=n, min_degree=3, max_degree=4), random.Random(seed),
                EngineConfig(active_min=3, active_max=4))
    deg = [len(a) for a in net.neighbours()]
    assert max(deg) <= 4  # active_max: the membership refuses more
    assert sum(d < 3 for d in deg) <= n * 0.03  # nearly every relay reached active_min
    assert shape(n, net.undirected_edges())["reachable"] == 1.0
    assert net.formation is not None and net.formation["dials"] >= n * 3 // 2
    assert net.positions is not None  # run-time links get geographic latencies


@pytest.mark.parametrize(("n", "seed"), [(400, 4)])
def test_the_far_link_keeps_a_built_mesh_a_small_world(n: int, seed: int) -> None:
    """Proximity alone (far_links = 0) builds a grid-like mesh; rule M5's one far link per relay keeps
    the mean shortest path within 1.25x of a random mesh of the same degrees."""
    cfg = EngineConfig(active_min=3, active_max=4)
    pos = _positions(n, seed)
    m5, _ = built_edges(n, pos, cfg, random.Random(seed))
    near_only, _ = built_edges(n, pos, replace(cfg, far_links=0), random.Random(seed))
    rand = build(Topology(kind="random", relays=n, min_degree=3, max_degree=4), random.Random(seed))
    path_m5 = shape(n, m5)["mean_path"]
    path_near = shape(n, near_only)["mean_path"]
    path_rand = shape(n, rand.undirected_edges())["mean_path"]
    assert path_m5 <= 1.25 * path_rand
    assert path_near >= 1.3 * path_m5


def _engine(cfg: EngineConfig) -> Engine:
    return Engine("me", cfg, verifier=CachingVerifier(), home=MemoryHomeStore(), tracer=NullTracer(),
                  rng=random.Random(5), listen_addr="me")


def test_ranked_candidates_dial_one_far_then_the_nearest() -> None:
    eng = _engine(EngineConfig(active_min=3, active_max=4))
    peers = [PeerInfo(f"n{i}", f"n{i}") for i in range(8)] + [PeerInfo(f"f{i}", f"f{i}") for i in range(8)]
    dialled = [e.peer for e in eng.add_candidates(peers, 0.0, near=8) if isinstance(e, Connect)]
    assert len(dialled) == 3
    assert dialled[0].startswith("f") and dialled[1:] == ["n0", "n1"]


def test_unranked_candidates_are_dialled_at_random_as_before() -> None:
    picks = set()
    for seed in range(6):
        eng = Engine("me", EngineConfig(), verifier=CachingVerifier(), home=MemoryHomeStore(), tracer=NullTracer(),
                     rng=random.Random(seed), listen_addr="me")
        peers = [PeerInfo(f"p{i}", f"p{i}") for i in range(16)]
        picks |= {e.peer for e in eng.add_candidates(peers, 0.0) if isinstance(e, Connect)}
    assert len(picks) > 6  # not always the first ones


def test_geographic_builder_honours_min_degree() -> None:
    """Issue 17: the geographic builder left 4.6% of relays at degree 2 against min_degree = 3."""
    for seed in (1, 2, 3):
        net = build(Topology(kind="geographic", relays=500, min_degree=3, max_degree=3), random.Random(seed))
        assert net.degrees() == {3: 500}


def _run(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "s.toml"
    path.write_text(text)
    return subprocess.run([sys.executable, "-m", "simulations.cli", "run", str(path), "--trace-level", "off"],
                          capture_output=True, text=True, timeout=300)


_SMALL = """name = "s"
duration_s = 30.0
[workload]
registrations = 5
pushes = 20
push_start_s = 10.0
push_end_s = 20.0
"""


@pytest.mark.integration
@pytest.mark.parametrize(("text", "named"), [
    (f"[engine]\ngossip_ttl = {limits.MAX_TTL + 1}\n", "[engine] gossip_ttl"),
    (f"[engine]\npush_ttl = {limits.MAX_TTL + 1}\n", "[engine] push_ttl"),
    ("[topology]\nrelays = 50\nmax_degree = 5\n", "[topology] max_degree = 5 contradicts [engine] active_max"),
    ("[topology]\nrelays = 50\nmin_degree = 2\n", "[topology] min_degree = 2 contradicts [engine] active_min"),
    ("[topology]\nkind = \"built\"\nrelays = 50\nmax_degree = 3\n",
     "[topology] max_degree = 3 contradicts [engine] active_max = 4"),
    ("[topology]\nrelays = 51\nmin_degree = 3\nmax_degree = 3\n[engine]\nactive_max = 3\n", "odd number of link ends"),
    ("[topology]\nkind = \"ring\"\n", "[topology] kind must be one of random, geographic, built"),
    ("[engine]\nfar_links = 4\n", "[engine] far_links"),
    ("[topology]\nclusters = 4\n", "[topology] clusters places relays on the square: it needs kind geographic"),
])
def test_the_cli_refuses_contradictions_naming_the_key(tmp_path: Path, text: str, named: str) -> None:
    proc = _run(tmp_path, _SMALL + text)
    assert proc.returncode == 2, proc.stdout[-300:]
    assert named in proc.stderr


@pytest.mark.integration
def test_the_cli_runs_a_built_mesh_and_prints_the_degrees_built(tmp_path: Path) -> None:
    proc = _run(tmp_path, _SMALL + "[topology]\nkind = \"built\"\nrelays = 120\n")
    assert proc.returncode == 0, proc.stderr[-500:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sum(summary["topology_degrees"].values()) == 120
    assert summary["topology_formation"]["dials"] > 0
    assert summary["delivery_ratio"] == 1.0
    assert "of degree" in proc.stderr


def test_the_route_ideal_bench_follows_latency_first_or_fewest_hop_paths() -> None:
    # A line 0-1-2-3 of 1 ms links and a direct 0-3 link of 10 ms: the latency-first path takes the line
    # (3 hops), a per-hop cost above the difference takes the direct link (1 hop, 10 ms).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.bench_route_ideal import _paths
    from simulations.topology import Network

    net = Network(4, {}, [0.0] * 4)
    for a, b, lat in [(0, 1, 0.001), (1, 2, 0.001), (2, 3, 0.001), (0, 3, 0.010)]:
        net.latency[(a, b)] = net.latency[(b, a)] = lat
    adj: list[list[tuple[int, float]]] = [[] for _ in range(4)]
    for (u, v), lat in sorted(net.latency.items()):
        adj[u].append((v, lat))
    lat0, hops0 = _paths(net, adj, 0, 0.0)
    assert hops0[3] == 3 and abs(lat0[3] - 0.003) < 1e-12
    lat1, hops1 = _paths(net, adj, 0, 0.005)
    assert hops1[3] == 1 and abs(lat1[3] - 0.010) < 1e-12
    assert hops1[2] == 2 and abs(lat1[2] - 0.002) < 1e-12  # 2 hops of 1 ms beat 1 hop of 10 ms + 1 ms


@pytest.mark.integration
def test_the_route_ideal_bench_prints_fewer_hops_and_more_stretch_as_hops_cost_more(tmp_path: Path) -> None:
    path = tmp_path / "g.toml"
    path.write_text(_SMALL + "[topology]\nkind = \"geographic\"\nrelays = 300\nmin_degree = 3\nmax_degree = 3\n"
                    "[engine]\nactive_min = 3\nactive_max = 3\n")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_route_ideal.py"), "--scenario", str(path),
                           "--sources", "30", "--homes", "10", "--costs-ms", "0,20,1000", "--json"],
                          capture_output=True, text=True, timeout=120, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr[-500:]
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["per_hop_cost_ms"] for r in rows] == [0.0, 20.0, 1000.0]
    assert rows[0]["stretch_p95"] == 1.0 and rows[0]["relays"] == 300
    assert rows[0]["hops_mean"] >= rows[1]["hops_mean"] >= rows[2]["hops_mean"]
    assert rows[2]["hops_mean"] < rows[0]["hops_mean"]  # a geographic mesh: latency-first takes more hops
    assert all(r["stretch_median"] >= 1.0 and r["messages_push_and_receipt"] == round(2 * r["hops_mean"], 1)
               for r in rows)


def _run_and_count_costs(scenario: Path, out: Path, *args: str) -> tuple[dict, dict]:
    """`inri-sim run SCENARIO` with a JSON-lines summary trace in `out`, then bench_push_costs.py over that
    trace: the run's summary and the bench's figures."""
    run = subprocess.run([sys.executable, "-m", "simulations.cli", "run", str(scenario), *args, "--trace-dir",
                          str(out), "--trace-level", "summary", "--trace-format", "jsonl", "--progress", "off"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-500:]
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_push_costs.py"), str(out), "--json"],
                          capture_output=True, text=True, timeout=120, cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.returncode == 0, proc.stderr[-500:]
    return json.loads(run.stdout.strip().splitlines()[-1]), json.loads(proc.stdout)


@pytest.mark.integration
def test_the_push_costs_bench_splits_the_messages_the_summary_counts(tmp_path: Path) -> None:
    # A small mesh with loss and churn, so that pushes are re-sent and some homes go down: the bench's
    # classes add up to every push, and its mean per delivered push is the run's own figure.
    path = tmp_path / "c.toml"
    text = _SMALL.replace("pushes = 20", "pushes = 200")
    text = text.replace("registrations = 5", "registrations = 20\ntokens_per_registration = 20")
    path.write_text(text + "[topology]\nrelays = 80\n[network]\nloss = 0.03\n"
                    "[churn]\nfail_fraction = 0.2\nstart_s = 10.0\nend_s = 20.0\ndowntime_s = 5.0\n")
    summary, r = _run_and_count_costs(path, tmp_path / "trace", "--seed", "3")
    classes = r["classes"]
    assert sum(c["pushes"] for c in classes.values()) == r["pushes"] == summary["pushes"]
    assert r["delivered"] == summary["delivered_all"]
    assert classes["re-sent"]["pushes"] > 0
    assert abs(sum(c["messages_share"] for c in classes.values()) - 1.0) < 0.01
    assert r["messages_per_delivered_push"] == pytest.approx(summary["messages_per_delivered_push"], abs=0.006)


HOMES_DOWN = Path(__file__).resolve().parent / "fixtures" / "homes-down.toml"


@pytest.mark.integration
def test_the_home_figures_of_a_run_are_what_the_push_costs_bench_recounts(tmp_path: Path) -> None:
    """`inri-sim run` prints messages_per_delivered_push_live_home and messages_per_push_home_down beside
    messages_per_delivered_push (issue 42, item 4), and they are exactly what bench_push_costs.py recounts
    from the trace by row position (docs/metrics.md, "The home's state"), with pushes of all three home
    states in the run: up throughout, failed while the push waited, down at injection."""
    summary, r = _run_and_count_costs(HOMES_DOWN, tmp_path / "trace")
    home = r["home"]
    classes = home["classes"]
    assert sum(c["pushes"] for c in classes.values()) == summary["pushes"]
    assert classes["no home in the trace"]["pushes"] == 0
    for state in ("home up throughout", "home failed while it waited", "home down at injection"):
        assert classes[state]["pushes"] > 0, state
    # some homes came back before their pushes were delivered: what these pushes spent after that is not
    # spent while the home was down
    came_back = classes["home down at injection"]
    assert came_back["delivered"] > 0 and came_back["while_home_down_mean"] < came_back["mean"]
    for key in ("messages_per_delivered_push_live_home", "messages_per_push_home_down"):
        assert summary[key] is not None and summary[key] == pytest.approx(home[key], rel=1e-12), key
    assert summary["messages_per_delivered_push_live_home"] != summary["messages_per_delivered_push"]


def test_clustered_relays_gather_around_their_metros_in_a_connected_mesh() -> None:
    """`[topology] clusters` (issue 42's other geographies): relays crowd a few metro areas instead of the
    whole square, the mesh stays connected within its degrees, for the geographic and the built kind."""

    def cells(net: Network) -> int:
        assert net.positions is not None
        return len({(int(x * 10), int(y * 10)) for x, y in net.positions})

    uniform = build(Topology(kind="geographic", relays=600, min_degree=2, max_degree=3), random.Random(4))
    metros = build(Topology(kind="geographic", relays=600, min_degree=2, max_degree=3, clusters=3,
                            cluster_spread=0.02), random.Random(4))
    assert cells(uniform) >= 95 and cells(metros) <= 20  # of the square's 100 tenths
    for net, lo, hi in ((metros, 2, 3), (build(Topology(kind="built", relays=150, min_degree=2, max_degree=4,
                                                         clusters=3, cluster_spread=0.03), random.Random(5),
                                                EngineConfig(active_min=2, active_max=4)), 2, 4)):
        got = shape(net.n, net.undirected_edges())
        assert got["reachable"] == 1.0 and lo <= got["degree_min"] and got["degree_max"] <= hi, got


@pytest.mark.integration
def test_the_sparse_runner_measures_two_versions_side_by_side_and_resumes(tmp_path: Path) -> None:
    """benchmarks/bench_sparse.py on a small churned mesh, this checkout beside itself: both versions' rows,
    the home figures read from each trace equal to the simulator's own (no MISMATCH), the worst over seeds,
    the JSON line for run_all; run again with the same --results file, nothing is measured again (the
    baseline's Python does not exist the second time)."""
    path = tmp_path / "c.toml"
    text = _SMALL.replace("pushes = 20", "pushes = 120")
    text = text.replace("registrations = 5", "registrations = 12\ntokens_per_registration = 20")
    path.write_text(text + "[topology]\nkind = \"geographic\"\nrelays = 80\n[network]\nloss = 0.03\n"
                    "[churn]\nfail_fraction = 0.2\nstart_s = 10.0\nend_s = 20.0\ndowntime_s = 5.0\n")
    root = Path(__file__).resolve().parents[1]
    results = tmp_path / "results.jsonl"

    def bench(python: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(root / "benchmarks" / "bench_sparse.py"), "--scenarios", str(path),
                               "--seeds", "1-2", "--loss-models", "quic,drop", "--baseline-dir", str(root),
                               "--baseline-python", python, "--results", str(results), "--no-privacy"],
                              capture_output=True, text=True, timeout=600, cwd=root,
                              env={**os.environ, "PYTHONPATH": str(root)})

    proc = bench(sys.executable)
    assert proc.returncode == 0, proc.stderr[-1000:]
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith(("| this |", "| baseline |"))]
    assert len(rows) == 8 + 4  # 2 seeds x 2 loss models x 2 versions, then the worst of each
    assert "MISMATCH" not in proc.stdout
    records = [json.loads(ln) for ln in results.read_text().splitlines()]
    assert len(records) == 8 and {r["stem"] for r in records} == {"on"}
    for r in records:
        twin = next(o for o in records if o["version"] != r["version"] and (o["seed"], o["loss_model"]) ==
                    (r["seed"], r["loss_model"]))
        same = ("delivery_ratio", "messages_per_delivered_push_live_home", "messages_per_push_home_down",
                "pushes_never_delivered_home_up", "latency_p99_s", "stretch_p95")
        assert [r[k] for k in same] == [twin[k] for k in same]  # one code, two checkouts: the same run
    assert any(r["messages_per_push_home_down"] for r in records)  # homes really went down under pushes
    assert all(r["ideal_latency_first"] > 0 and r["live_home_over_ideal"] > 0 for r in records)
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["bench"] == "sparse" and figures["figures"]
    again = bench(str(tmp_path / "no-such-python"))
    assert again.returncode == 0, again.stderr[-1000:]
    assert len(results.read_text().splitlines()) == 8
    assert [ln for ln in again.stdout.splitlines() if ln.startswith("| ")] == \
        [ln for ln in proc.stdout.splitlines() if ln.startswith("| ")]


@pytest.mark.integration
def test_the_sparse_runners_quick_mode_prints_runs_privacy_and_the_bench_line(tmp_path: Path) -> None:
    """benchmarks/bench_sparse.py's quick mode (a small scenario, `--privacy-relays 120 --privacy-devices
    20`; `make bench` runs the same path at full size): the run's row and its worst over seeds, the privacy
    row with `inri-sim privacy`'s own figures for that seed, the JSON line run_all reads (the run's bars and
    the three privacy figures), and both records in --results."""
    path = tmp_path / "q.toml"
    path.write_text(_SMALL + "[topology]\nkind = \"geographic\"\nrelays = 60\n")
    root = Path(__file__).resolve().parents[1]
    results = tmp_path / "results.jsonl"
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_sparse.py"), "--scenarios", str(path),
                           "--privacy-relays", "120", "--privacy-devices", "20", "--results", str(results)],
                          capture_output=True, text=True, timeout=300, cwd=root, env=env)
    assert proc.returncode == 0, proc.stderr[-1000:]
    direct = subprocess.run([sys.executable, "-m", "simulations.cli", "privacy", "--stem", "on", "--seed", "1",
                             "--relays", "120", "--devices", "20"], capture_output=True, text=True, timeout=300,
                            cwd=root, env=env)
    assert direct.returncode == 0, direct.stderr[-1000:]
    p = json.loads(direct.stdout.strip().splitlines()[-1])
    lines = proc.stdout.splitlines()
    assert len([ln for ln in lines if ln.startswith("| this | q | 1 | quic | 1.0000 | 0 (0) |")]) == 2  # run, worst
    [priv] = [ln.split(" | ") for ln in lines if ln.startswith("| this | 1 | on |")]
    one_relay = round(p["single_relay_home_guess"] / p["single_relay_chance_home"], 3)
    floor = round(p["single_relay_floor"] / p["single_relay_chance_home"], 3)
    assert priv[3:7] == [str(p["colluders_home_exact"]), str(p["colluders_epoch_link"]), f"{one_relay}x", f"{floor}x"]
    assert any(ln.startswith("privacy worst (this, seeds 1)") for ln in lines)
    bench = json.loads(lines[-1])
    assert bench["bench"] == "sparse"
    figures = {f["metric"]: (f["value"], f["ceiling"]) for f in bench["figures"]}
    assert figures["q quic: delivery_ratio (worst)"] == (1.0, ">= 0.999")
    assert figures["q quic: pushes never delivered, home up (worst)"] == (0, "0")
    assert figures["q quic: msgs/delivered push, live home / ideal (worst)"][1] == "<= 2x"  # no churn: the 3% bar
    assert figures["privacy: colluders pin the home (worst)"] == (p["colluders_home_exact"], 0.10)
    assert figures["privacy: colluders link route ids (worst)"] == (p["colluders_epoch_link"], 0.2)
    assert figures["privacy: one relay over the floor of any stem (worst)"] == (round(one_relay - floor, 3), 0.1)
    records = [json.loads(ln) for ln in results.read_text().splitlines()]
    assert [r["kind"] for r in records] == ["run", "privacy"]
    assert (records[1]["relays"], records[1]["devices"], records[1]["seed"]) == (120, 20, 1)
