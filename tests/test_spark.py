"""The Spark analysis: a hand-computed trace, malformed lines, the simulator cross-check, the report in Chromium.

One local[1] session for the whole module; the tests run one after another.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

pyspark = pytest.importorskip("pyspark", reason="the analysis extra (PySpark) is not installed")

from spark_analysis.job import run  # noqa: E402
from spark_analysis.report import PLOTS, write_compare  # noqa: E402
from spark_analysis.session import find_java_home, get_session  # noqa: E402
from tests import home_costs_trace  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.integration]  # local Spark starts a JVM


@pytest.fixture(scope="module")
def spark():
    if find_java_home() is None:
        pytest.fail("Java 17 is required for the Spark tests (set JAVA_HOME)")
    session = get_session("local[1]", app_name="inri-tests", shuffle_partitions=2)
    yield session
    session.stop()


def row(t: float, relay: str, kind: str, **kw: object) -> dict:
    return {"t": t, "relay": relay, "kind": kind, **kw}


def hand_trace(d: Path) -> None:
    """Four relays on a line 0-1-2-3, 10 ms per link, no processing delay; deadline 1 s, coverage after 0.5 s."""
    rows = [
        # registration A (home 0): everyone has it by 0.03 s
        row(0.0, "0", "reg_originated", msg="A:1", route="A", count=1, bytes=100),
        row(0.01, "1", "route_set", msg="A:1", route="A", peer="0", hops=1, count=1, bytes=100),
        row(0.02, "2", "route_set", msg="A:1", route="A", peer="1", hops=2, count=1, bytes=100),
        row(0.03, "3", "route_set", msg="A:1", route="A", peer="2", hops=3, count=0, bytes=100),
        # registration B (home 3): relay 2 at once, relay 1 late (after coverage) and relay 0 never
        row(1.0, "3", "reg_originated", msg="B:1", route="B", count=1, bytes=100),
        row(1.01, "2", "route_set", msg="B:1", route="B", peer="3", hops=1, count=1, bytes=100),
        row(1.3, "1", "relay_down", reason="churn"),
        row(1.9, "1", "route_set", msg="B:1", route="B", peer="2", hops=2, count=1, bytes=100),
        # P1: 3 -> 2 -> 1 -> 0 in 60 ms (shortest 30 ms): stretch 2.0, 3 hops
        row(2.0, "3", "push_injected", msg="P1", route="A"),
        row(2.0, "3", "push_forwarded", msg="P1", route="A", peer="2", count=1),
        row(2.01, "2", "push_forwarded", msg="P1", route="A", peer="1", count=1),
        row(2.02, "1", "push_forwarded", msg="P1", route="A", peer="0", count=1),
        row(2.06, "0", "push_delivered", msg="P1", route="A", hops=3),
        row(2.07, "1", "receipt_forwarded", msg="P1", peer="2", count=1),
        row(2.08, "2", "receipt_forwarded", msg="P1", peer="3", count=1),
        row(2.09, "3", "push_settled", msg="P1", reason="delivered"),
        # P2: injected at its home relay: delivered, no stretch (same relay), 0 hops
        row(2.5, "0", "push_injected", msg="P2", route="A"),
        row(2.5, "0", "push_delivered", msg="P2", route="A", hops=0),
        # P3: lost; the latest drop reason is ring_end
        row(3.0, "2", "push_injected", msg="P3", route="A"),
        row(3.0, "2", "push_forwarded", msg="P3", route="A", peer="1", count=1),
        row(3.01, "1", "push_dropped", msg="P3", route="A", reason="no_route"),
        row(3.01, "1", "route_error", msg="P3", route="A", peer="2", count=1),
        row(4.0, "2", "push_fallback", msg="P3", route="A", count=2, ttl=1),
        row(4.02, "3", "push_dropped", msg="P3", route="A", reason="ring_end"),
        # P4: its home was down: excluded from delivery_ratio
        row(3.5, "1", "push_injected", msg="P4", route="B"),
        row(3.5, "1", "push_excluded", msg="P4", reason="home_down"),
        row(10.0, "1", "push_dropped", msg="P4", reason="unreachable"),
        # P5: delivered after the 1 s deadline: late
        row(4.0, "2", "push_injected", msg="P5", route="A"),
        row(5.5, "0", "push_delivered", msg="P5", route="A", hops=2),
        row(5.0, "1", "relay_up", reason="churn"),
        # P6: stored at home 0 in 30 ms, and only then its home failed: counted (the old rule excluded it)
        row(6.0, "3", "push_injected", msg="P6", route="A"),
        row(6.03, "0", "push_delivered", msg="P6", route="A", hops=3),
        row(6.5, "3", "push_excluded", msg="P6", reason="home_down"),
    ]
    d.mkdir(parents=True, exist_ok=True)
    with open(d / "events.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    (d / "meta.json").write_text(json.dumps({"schema": 1, "relays": 4, "deadline_s": 1.0, "coverage_after_s": 0.5}))
    (d / "topology.csv").write_text("src,dst,latency_s\n" + "".join(
        f"{a},{b},0.01\n{b},{a},0.01\n" for a, b in ((0, 1), (1, 2), (2, 3))))
    (d / "relays.csv").write_text("relay,processing_s\n" + "".join(f"{i},0.0\n" for i in range(4)))


EXPECTED = {
    "relays": 4,
    "registrations": 2,
    "pushes": 6,
    "pushes_excluded": 1,  # P4 (its home was down at injection); P6 was stored before its home failed
    "excluded_old_rule": 2,
    "pushes_counted": 5,
    "delivered": 3,  # P1, P2, P6
    "delivered_all": 3,
    "delivery_ratio": 0.6,
    "delivery_ratio_old_rule": 0.5,  # P1, P2 of P1, P2, P3, P5
    "delivery_ratio_all": 0.5,
    "gossip_messages": 6,  # A: 1+1+1+0, B: 1+1+1
    "gossip_bytes": 600,
    "overhead_ratio": 1.0,  # 6 / 2 registrations / (4 - 1)
    "hops_p50": 3,  # sorted [0, 3, 3], rank ceil(0.5 * 3) = 2
    "hops_p95": 3,
    "hops_max": 3,
    "latency_p50_s": 0.03,  # sorted [0, 0.03, 0.06]
    "latency_p95_s": 0.06,
    "latency_p99_s": 0.06,
    "recovery_share": 0.2,  # P3 (fallback) of 5 counted
    "fallback_pushes": 1,
    "fallback_messages": 2,
    "messages_per_delivered_push": 3.0,  # forwarded 4 + fallback 2 + receipts 2 + route error 1 = 9, / 3
    # A: 3 of 3 live by 0.5 s. B (t_cov 1.5): relay 1 is down, relays 0 and 2 live; only 2 has it: 1 of 2
    "route_coverage": 0.8,
    "reach_p50": 0.5,  # per registration [0.5, 1.0]
    "reach_p10": 0.5,
    # A needs ceil(0.9 * 3) = 3 arrivals: the third at 0.03 s. B never gets 3: unconverged
    "convergence_p50_s": 0.03,
    "convergence_p90_s": 0.03,
    "unconverged_registrations": 1,
    "loss_by_reason": {"late": 1, "ring_end": 1},
    "pushes_late": 1,  # the `late` one: delivered after the deadline
    "pushes_never_delivered": 1,  # the ring_end one
    "stretch_median": 1.0,  # P6: 0.03 s over 0.03 s; P1: 0.06 s over the 0.03 s shortest path
    "stretch_p95": 2.0,
    "path_stretch_median": None,  # no links.csv: no live graph
    "malformed_lines": 0,
    # Homes 0 (route A) and 3 (route B) have no relay_down row: every push was injected for a live home, so
    # its messages (all 9) go over the 3 delivered; no push waited for a down home; P3 and P4 were never
    # delivered (P4's push_excluded says home_down, but no relay row says its home, 3, went down)
    "messages_per_delivered_push_live_home": 3.0,
    "messages_per_push_home_down": None,
    "pushes_never_delivered_home_up": 2,
}


def test_hand_computed_trace_gives_the_known_answers(spark, tmp_path: Path) -> None:
    hand_trace(tmp_path / "trace")
    summary = run(tmp_path / "trace", tmp_path / "report", spark=spark)
    for key, want in EXPECTED.items():
        got = summary[key]
        if isinstance(want, float):
            assert got == pytest.approx(want, rel=1e-9), key
        else:
            assert got == want, key
    written = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert written["delivered"] == 3
    assert (tmp_path / "report" / "tables" / "pushes.parquet").is_dir()
    assert list((tmp_path / "report" / "tables" / "pushes.csv").glob("*.csv"))


def test_home_cost_figures_follow_each_homes_downtime_in_trace_order(spark, tmp_path: Path) -> None:
    """The hand trace of tests/home_costs_trace.py, whose answers tests/test_sim.py checks in the collector."""
    trace = tmp_path / "trace"
    trace.mkdir()
    with open(trace / "events.jsonl", "w") as f:
        for r in home_costs_trace.ROWS:
            f.write(json.dumps({k: v for k, v in r.items() if v is not None}) + "\n")
    (trace / "meta.json").write_text(json.dumps({"schema": 1, "relays": home_costs_trace.RELAYS,
                                                 "deadline_s": home_costs_trace.DEADLINE_S, "coverage_after_s": 1.0}))
    summary = run(trace, tmp_path / "report", spark=spark, plots=False)
    for key, want in home_costs_trace.EXPECTED.items():
        assert summary[key] == pytest.approx(want, rel=1e-12), key


def test_home_cost_figures_of_a_run_with_homes_going_down_agree_with_the_simulator(spark, tmp_path: Path) -> None:
    """tests/fixtures/homes-down.toml through `inri-sim run`: a run whose pushes meet every state of their
    home (tests/test_sim_topology.py checks the same run against bench_push_costs.py's recount), and Spark
    gives the summary's home figures exactly."""
    fixture = Path(__file__).resolve().parent / "fixtures" / "homes-down.toml"
    proc = subprocess.run([sys.executable, "-m", "simulations.cli", "run", str(fixture), "--trace-dir",
                           str(tmp_path / "trace"), "--trace-level", "summary", "--progress", "off"],
                          capture_output=True, text=True, timeout=120, check=True)
    sim = json.loads(proc.stdout.strip().splitlines()[-1])
    ana = run(tmp_path / "trace", tmp_path / "report", spark=spark, plots=False)
    for key in ("messages_per_delivered_push_live_home", "messages_per_push_home_down",
                "pushes_never_delivered_home_up", "messages_per_delivered_push"):
        assert sim[key] is not None and ana[key] == sim[key], key


def test_multi_home_figures_agree_with_the_simulator(spark, tmp_path: Path) -> None:
    """tests/fixtures/multihome.toml (devices with two homes, one home of each failing under pushes) through
    `inri-sim run`: Spark recomputes the summary's multi-home and single-home figures and agrees exactly."""
    fixture = Path(__file__).resolve().parent / "fixtures" / "multihome.toml"
    proc = subprocess.run([sys.executable, "-m", "simulations.cli", "run", str(fixture), "--trace-dir",
                           str(tmp_path / "trace"), "--trace-level", "summary", "--progress", "off"],
                          capture_output=True, text=True, timeout=120, check=True)
    sim = json.loads(proc.stdout.strip().splitlines()[-1])
    ana = run(tmp_path / "trace", tmp_path / "report", spark=spark, plots=False)
    assert sim["multi_home_pushes"] > 100 and sim["multi_home_fallback_pushes"] > 0  # the paths are covered
    for prefix in ("multi_home", "single_home"):
        for key in ("pushes", "delivered", "delivery_ratio", "never_delivered", "fallback_pushes"):
            name = f"{prefix}_{key}"
            assert name not in ana["from_simulator"] and ana[name] == sim[name], name


def test_malformed_lines_are_counted_not_fatal(spark, tmp_path: Path) -> None:
    hand_trace(tmp_path / "trace")
    with open(tmp_path / "trace" / "events.jsonl", "a") as f:
        f.write("{not json at all\n")
        f.write(json.dumps({"t": "yesterday", "relay": "1", "kind": "route_set"}) + "\n")
        f.write(json.dumps({"relay": "1", "kind": "route_set"}) + "\n")  # no time
    summary = run(tmp_path / "trace", tmp_path / "report", spark=spark, plots=False)
    assert summary["malformed_lines"] == 3
    assert summary["delivered"] == EXPECTED["delivered"] and summary["gossip_messages"] == EXPECTED["gossip_messages"]


@pytest.mark.parametrize("scheme", ["flood", "tree"])
def test_analysis_agrees_with_the_simulator_on_every_shared_key(spark, tmp_path: Path, scheme: str) -> None:
    scenario = tmp_path / "x.toml"
    scenario.write_text(f"""
name = "crosscheck"
seed = 5
duration_s = 60.0
deadline_s = 10.0
coverage_after_s = 2.0
[topology]
kind = "geographic"
relays = 80
[network]
loss = 0.02
[workload]
registrations = 24  # enough for the tree scheme to graft on any seed tried (5-7)
registration_end_s = 4.0
tokens_per_registration = 10
pushes = 100
push_start_s = 6.0
push_end_s = 35.0
[churn]
fail_fraction = 0.15
rejoin_fraction = 0.5
start_s = 6.0
end_s = 35.0
downtime_s = 8.0
[engine]
keepalive_interval_s = 1.0
custody_retry_s = 1.0
gossip_scheme = "{scheme}"
""")
    proc = subprocess.run([sys.executable, "-m", "simulations.cli", "run", str(scenario), "--trace-dir",
                           str(tmp_path / "trace"), "--progress", "off"], capture_output=True, text=True, check=True)
    sim = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sim["pushes_excluded"] > 0 and sim["fallback_pushes"] > 0  # the cross-check covers those paths
    assert sim["excluded_old_rule"] > sim["pushes_excluded"]  # ... both exclusion rules
    links = (tmp_path / "trace" / "links.csv").read_text().splitlines()
    assert len(links) > len((tmp_path / "trace" / "topology.csv").read_text().splitlines())  # run-time links
    assert 0 < sim["recovery_share"] < 1 and sim["path_stretch_p95"] < sim["stretch_p95"]
    assert sim["overlay_penalty_median"] >= 1.0
    # the tree scheme's announcements, grafts and graft answers are in the trace and counted, and so are
    # the route syncs the churn's rejoining relays ask their neighbours for (rule G11)
    kinds = pq.read_table(tmp_path / "trace" / "events.parquet", columns=["kind", "reason"]).to_pylist()
    control = {r["reason"] for r in kinds if r["kind"] == "gossip_control"}
    assert control == {"route_sync"} | (set() if scheme == "flood" else {"announce", "graft", "graft_answer"})
    ana = run(tmp_path / "trace", tmp_path / "report", spark=spark, plots=False)
    assert set(sim) <= set(ana)  # summary.json carries every key of the simulator's summary
    assert "events" in ana["from_simulator"] and "delivered" not in ana["from_simulator"]
    shared = sorted(set(sim) & set(ana) - set(ana["from_simulator"]))  # the keys Spark computed itself
    assert len(shared) >= 20
    new_keys = {"latency_p50_s", "latency_p95_s", "latency_p99_s", "path_stretch_median", "path_stretch_p95",
                "recovery_share", "overlay_penalty_median", "overlay_penalty_p95", "reach_p50", "reach_p10",
                "hops_p95", "hops_max", "excluded_old_rule", "delivery_ratio_old_rule", "gossip_bytes_ratio",
                "messages_per_delivered_push_live_home", "messages_per_push_home_down",
                "pushes_never_delivered_home_up"}
    assert new_keys <= set(shared)
    assert all(sim[k] is not None for k in new_keys)
    for key in shared:
        if "stretch" in key or key.startswith("overlay_penalty"):  # shortest-path sums: float rounding
            assert ana[key] == pytest.approx(sim[key], rel=1e-12), key
        else:
            assert ana[key] == sim[key], key


NOTHING_CONVERGES = """
name = "no-convergence"
seed = 3
duration_s = 30.0
deadline_s = 8.0
coverage_after_s = 2.0
[topology]
relays = 40
[workload]
registrations = 6
registration_end_s = 2.0
tokens_per_registration = 5
pushes = 30
push_start_s = 4.0
push_end_s = 15.0
[engine]
gossip_ttl = 2
"""


def _dom(chromium: str, page: Path) -> str:
    """The page's DOM after load, every image marked with whether it decoded."""
    checked = page.with_name("checked-" + page.name)
    checked.write_text(page.read_text().replace(
        "</body>",
        "<script>window.addEventListener('load', () => { for (const i of document.images) "
        "{ i.setAttribute('data-loaded', i.complete && i.naturalWidth > 0 ? 'yes' : 'no'); } });</script></body>"))
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--dump-dom", checked.as_uri()],
            capture_output=True, text=True, timeout=120,
        ).stdout


def test_report_shows_reach_when_nothing_converges_and_two_runs_side_by_side_in_chromium(
        spark, tmp_path: Path) -> None:
    """A gossip TTL of 2 on 40 relays: no registration reaches 90%, convergence is null, yet the reach and
    coverage plots have data; the compare page shows every plot of both runs."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:  # tests install nothing: CI (.ci/run) installs Debian's chromium beforehand
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    scenario = tmp_path / "x.toml"
    scenario.write_text(NOTHING_CONVERGES)
    subprocess.run([sys.executable, "-m", "simulations.cli", "run", str(scenario), "--trace-dir",
                    str(tmp_path / "trace"), "--progress", "off"], capture_output=True, check=True)
    a = run(tmp_path / "trace", tmp_path / "report", spark=spark)
    assert a["convergence_p50_s"] is None and a["unconverged_registrations"] == a["registrations"] == 6
    assert 0 < a["reach_p50"] < 0.9
    hand_trace(tmp_path / "hand")
    b = run(tmp_path / "hand", tmp_path / "report" / "compare-b", spark=spark)
    compare = write_compare(a, b, tmp_path / "report", tmp_path / "report" / "compare-b", "a", "b")

    dom = _dom(chromium, tmp_path / "report" / "report.html")
    assert dom.count("<img") == len(PLOTS)
    assert dom.count('data-loaded="yes"') == len(PLOTS), dom[-2000:]
    points = {m[0]: int(m[1]) for m in re.findall(r'data-plot="([^"]+)" data-points="(\d+)"', dom)}
    assert set(points) == set(PLOTS)
    assert points["reach_cdf.png"] == points["coverage_over_time.png"] == 6  # one value per registration
    assert points["convergence_cdf.png"] == 0
    assert points["latency_cdf.png"] == points["hops_histogram.png"] == a["delivered"]  # the key figures' pushes

    dom = _dom(chromium, compare)
    assert dom.count('data-loaded="yes"') == dom.count("<img") == 2 * len(PLOTS), dom[-2000:]


ROOT = Path(__file__).resolve().parent.parent
CLUSTER_TEST = "INRI_SPARK_CLUSTER_TEST"  # set by benchmarks/bench_spark.py (make bench): a JVM cluster is slow


def _recipe() -> str:
    """The cluster recipe of deploy/spark/README.md: the code block after its marker comment."""
    text = (ROOT / "deploy" / "spark" / "README.md").read_text()
    return text.split("<!-- cluster-recipe", 1)[1].split("```", 2)[1].strip()


def _processes_under(directory: Path) -> list[int]:
    """Processes whose command line names directory (the cluster's JVMs name their work dir and logs there)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(directory) in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif(not os.environ.get(CLUSTER_TEST), reason=f"a real Spark cluster: make bench ({CLUSTER_TEST}=1)")
def test_docs_cluster_recipe_runs_verbatim_and_equals_local_mode(spark, tmp_path: Path) -> None:
    """deploy/spark/README.md's recipe, verbatim, with the installed console scripts: a standalone master and
    worker from the pip package on loopback, the analysis on them, then down; its summary equals local mode."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    started = time.monotonic()
    try:
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", _recipe()], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=900)
    finally:
        if (tmp_path / "spark-cluster" / "cluster.json").exists():  # the recipe failed before its last line
            subprocess.run([sys.executable, "-m", "spark_analysis.cli", "cluster", "down", "--dir",
                            str(tmp_path / "spark-cluster")], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    print(f"cluster recipe: {time.monotonic() - started:.1f} s")
    cores = os.cpu_count() or 1
    assert re.search(r"Spark master spark://127\.0\.0\.1:\d+, shuffle partitions " + str(2 * cores), proc.stderr)
    assert not (tmp_path / "spark-cluster" / "cluster.json").exists()
    deadline = time.monotonic() + 30
    while _processes_under(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _processes_under(tmp_path)  # master and worker are gone
    on_cluster = json.loads((tmp_path / "reports" / "tiny" / "summary.json").read_text())
    run(tmp_path / "traces" / "tiny", tmp_path / "local", spark=spark, plots=False)
    local = json.loads((tmp_path / "local" / "summary.json").read_text())
    assert on_cluster == local
