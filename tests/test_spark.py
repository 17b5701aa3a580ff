"""The Spark analysis: a hand-computed trace, malformed lines, the simulator cross-check, the report in Chromium.

One local[1] session for the whole module; the tests run one after another.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark", reason="the analysis extra (PySpark) is not installed")

from spark_analysis.job import run  # noqa: E402
from spark_analysis.session import find_java_home, get_session  # noqa: E402

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
    "pushes": 5,
    "pushes_excluded": 1,
    "pushes_counted": 4,
    "delivered": 2,  # P1, P2
    "delivered_all": 2,
    "delivery_ratio": 0.5,
    "delivery_ratio_all": 0.4,
    "gossip_messages": 6,  # A: 1+1+1+0, B: 1+1+1
    "gossip_bytes": 600,
    "overhead_ratio": 1.0,  # 6 / 2 registrations / (4 - 1)
    "hops_p50": 0,  # sorted [0, 3], rank ceil(0.5 * 2) = 1
    "fallback_pushes": 1,
    "fallback_messages": 2,
    "messages_per_delivered_push": 4.5,  # forwarded 4 + fallback 2 + receipts 2 + route error 1 = 9, / 2
    # A: 3 of 3 live by 0.5 s. B (t_cov 1.5): relay 1 is down, relays 0 and 2 live; only 2 has it: 1 of 2
    "route_coverage": 0.8,
    # A needs ceil(0.9 * 3) = 3 arrivals: the third at 0.03 s. B never gets 3: unconverged
    "convergence_p50_s": 0.03,
    "convergence_p90_s": 0.03,
    "unconverged_registrations": 1,
    "loss_by_reason": {"late": 1, "ring_end": 1},
    "stretch_median": 2.0,  # P1: 0.06 s over the 0.03 s shortest path
    "stretch_p95": 2.0,
    "malformed_lines": 0,
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
    assert written["delivered"] == 2
    assert (tmp_path / "report" / "tables" / "pushes.parquet").is_dir()
    assert list((tmp_path / "report" / "tables" / "pushes.csv").glob("*.csv"))


def test_malformed_lines_are_counted_not_fatal(spark, tmp_path: Path) -> None:
    hand_trace(tmp_path / "trace")
    with open(tmp_path / "trace" / "events.jsonl", "a") as f:
        f.write("{not json at all\n")
        f.write(json.dumps({"t": "yesterday", "relay": "1", "kind": "route_set"}) + "\n")
        f.write(json.dumps({"relay": "1", "kind": "route_set"}) + "\n")  # no time
    summary = run(tmp_path / "trace", tmp_path / "report", spark=spark, plots=False)
    assert summary["malformed_lines"] == 3
    assert summary["delivered"] == EXPECTED["delivered"] and summary["gossip_messages"] == EXPECTED["gossip_messages"]


def test_analysis_agrees_with_the_simulator_on_every_shared_key(spark, tmp_path: Path) -> None:
    scenario = tmp_path / "x.toml"
    scenario.write_text("""
name = "crosscheck"
seed = 5
duration_s = 60.0
deadline_s = 10.0
coverage_after_s = 2.0
[topology]
relays = 80
[network]
loss = 0.02
[workload]
registrations = 12
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
""")
    proc = subprocess.run([sys.executable, "-m", "simulations.cli", "run", str(scenario), "--trace-dir",
                           str(tmp_path / "trace"), "--progress", "off"], capture_output=True, text=True, check=True)
    sim = json.loads(proc.stdout.strip().splitlines()[-1])
    assert sim["pushes_excluded"] > 0 and sim["fallback_pushes"] > 0  # the cross-check covers those paths
    ana = run(tmp_path / "trace", tmp_path / "report", spark=spark, plots=False)
    assert set(sim) <= set(ana)  # summary.json carries every key of the simulator's summary
    assert "events" in ana["from_simulator"] and "delivered" not in ana["from_simulator"]
    shared = sorted(set(sim) & set(ana) - set(ana["from_simulator"]))  # the keys Spark computed itself
    assert len(shared) >= 20
    for key in shared:
        if key.startswith("stretch"):
            assert ana[key] == pytest.approx(sim[key], rel=1e-12), key
        else:
            assert ana[key] == sim[key], key


def test_report_html_shows_every_plot_in_chromium(spark, tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:  # tests install nothing: CI (.ci/run) installs Debian's chromium beforehand
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    hand_trace(tmp_path / "trace")
    run(tmp_path / "trace", tmp_path / "report", spark=spark)
    report = tmp_path / "report" / "report.html"
    # Mark every image with whether it decoded, then dump the DOM after load.
    page = report.read_text().replace(
        "</body>",
        "<script>window.addEventListener('load', () => { for (const i of document.images) "
        "{ i.setAttribute('data-loaded', i.complete && i.naturalWidth > 0 ? 'yes' : 'no'); } });</script></body>")
    checked = tmp_path / "report" / "checked.html"
    checked.write_text(page)
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--virtual-time-budget=5000", "--dump-dom", checked.as_uri()],
            capture_output=True, text=True, timeout=120,
        ).stdout
    assert dom.count("<img") == 5
    assert dom.count('data-loaded="yes"') == 5, dom[-2000:]
