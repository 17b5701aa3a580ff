"""Homes in two places (issue 42, item 3) in the simulator: the scenario keys, the homes and failures they
plan, the device that drops duplicates by push id, and the summary's multi-home figures, each checked
against an independent reading of the run's trace."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from simulations.scenario import ScenarioError, from_dict, load
from simulations.sim import Simulator
from tests.test_sim import small

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "multihome.toml"


def test_multi_home_keys_are_checked() -> None:
    with pytest.raises(ScenarioError, match="homes_per_device must be 2 to 3"):
        from_dict(small(workload={"multi_home_share": 0.2, "homes_per_device": 4}))
    with pytest.raises(ScenarioError, match="multi_home_failures = 2: at most homes_per_device - 1"):
        from_dict(small(workload={"multi_home_share": 0.2}, churn={"multi_home_failures": 2}))
    with pytest.raises(ScenarioError, match="multi_home_share must be in"):
        from_dict(small(workload={"multi_home_share": 1.5}))
    with pytest.raises(ScenarioError, match="multi_home_reregister_s and refresh_interval_s cannot be combined"):
        from_dict(small(workload={"multi_home_share": 0.2, "multi_home_reregister_s": 1.0, "refresh_interval_s": 9.0}))
    assert load("multihome-5k").workload.multi_home_share == 0.2  # the shipped scenario loads


def test_a_run_with_multi_home_devices_counts_what_its_trace_shows(tmp_path: Path) -> None:
    """Every multi-home device is registered at two distinct homes, which both originate its route; one of
    each pair fails during the pushes and never both; the summary's multi-home figures, the pushes stored
    at each home and the duplicates the device dropped are what the trace says."""
    sim = Simulator(load(FIXTURE), trace_dir=tmp_path)
    s = sim.run().summary
    rows = pq.read_table(tmp_path / "events.parquet").to_pylist()
    work = sim.work
    assert work.homes and all(len(set(h)) == 2 for h in work.homes.values())
    origins: dict[str, set[str]] = {}
    down: dict[str, list[float]] = {}
    for r in rows:
        if r["kind"] == "reg_originated":
            origins.setdefault(r["route"], set()).add(r["relay"])
        elif r["kind"] == "relay_down":
            down.setdefault(r["relay"], []).append(r["t"])
    for reg_index, homes in work.homes.items():
        reg = work.regs[reg_index][1]
        assert reg is not None and origins[reg.route_id.hex()] == {str(h) for h in homes}
        failed = [h for h in homes if str(h) in down]
        assert len(failed) == 1, (homes, failed)  # multi_home_failures = 1, never the last home
    multi_routes = {reg.route_id.hex() for r, (_, reg, _) in enumerate(work.regs) if r in work.homes and reg}
    route_of = {r["msg"]: r["route"] for r in rows if r["kind"] == "push_injected"}
    stores: dict[str, set[str]] = {}
    for r in rows:
        if r["kind"] == "push_delivered" and route_of.get(r["msg"]) in multi_routes:
            stores.setdefault(r["msg"], set()).add(r["relay"])
    assert s["multi_home_duplicates_dropped"] == sum(len(v) - 1 for v in stores.values()) > 0
    assert sum(s["multi_home_stored_per_home"]) == sum(len(v) for v in stores.values())
    injected_at: dict[str, float] = {}
    delivered_at: dict[str, float] = {}
    excluded_at: dict[str, float] = {}
    for r in rows:
        for kind, seen in (("push_injected", injected_at), ("push_delivered", delivered_at),
                           ("push_excluded", excluded_at)):
            if r["kind"] == kind:
                seen.setdefault(r["msg"], r["t"])
    deadline = sim.sc.deadline_s
    # docs/metrics.md: a push excluded for its home (down, cut off) still counts when delivered on time before
    excluded = {p for p, t in excluded_at.items()
                if not (p in delivered_at and delivered_at[p] - injected_at[p] <= deadline and t > delivered_at[p])}
    fallback = {r["msg"] for r in rows if r["kind"] == "push_fallback"}
    multi = {p for p, route in route_of.items() if route in multi_routes and p not in excluded}
    assert s["multi_home_pushes"] == len(multi) > 100
    assert s["multi_home_never_delivered"] == len(multi - stores.keys())
    assert s["multi_home_fallback_pushes"] == len(multi & fallback)
    assert s["multi_home_delivered"] <= len(multi & stores.keys())
    assert s["single_home_pushes"] + s["multi_home_pushes"] == s["pushes_counted"]


def test_a_push_to_a_multi_home_device_is_excluded_only_when_all_its_homes_are_down(tmp_path: Path) -> None:
    """The exclusion rule (docs/metrics.md) takes every home of a device: pushes injected while one of a
    device's two homes is down are counted, and the ones excluded as `home_down` met both homes down."""
    sim = Simulator(load(FIXTURE), trace_dir=tmp_path)
    sim.run()
    rows = pq.read_table(tmp_path / "events.parquet").to_pylist()
    homes = {reg.route_id.hex(): {str(h) for h in sim.work.homes[r]}
             for r, (_, reg, _) in enumerate(sim.work.regs) if r in sim.work.homes and reg is not None}
    down: set[str] = set()
    route_of: dict[str, str] = {}
    one_down = 0
    for r in rows:
        kind = r["kind"]
        if kind == "relay_down":
            down.add(r["relay"])
        elif kind == "relay_up":
            down.discard(r["relay"])
        elif kind == "push_injected" and r["route"] in homes:
            route_of[r["msg"]] = r["route"]
            one_down += bool(homes[r["route"]] & down)
        elif kind == "push_excluded" and r["msg"] in route_of and r["reason"] == "home_down":
            assert homes[route_of[r["msg"]]] <= down, r
    assert one_down > 20  # the fixture does inject while a home is down


def test_a_device_that_registers_again_after_a_home_failed_gets_every_push(tmp_path: Path) -> None:
    """[workload] multi_home_reregister_s: a multi-home device re-registers at a new epoch that long after one
    of its homes failed (its stream there dropped); its live home originates the new epoch, whose flood
    leads every relay to it. The fixture's pushes are then all delivered (without it: 12 never are)."""
    raw = tomllib.loads(FIXTURE.read_text())
    raw["workload"]["multi_home_reregister_s"] = 1.0
    sim = Simulator(from_dict(raw), trace_dir=tmp_path)
    s = sim.run().summary
    rows = pq.read_table(tmp_path / "events.parquet").to_pylist()
    failed_at = {r["relay"]: r["t"] for r in rows if r["kind"] == "relay_down"}
    for r, homes in sim.work.homes.items():
        reg = sim.work.regs[r][1]
        assert reg is not None
        down = [str(h) for h in homes if str(h) in failed_at]
        live = [str(h) for h in homes if str(h) not in failed_at]
        assert reg.epoch == 1 + len(down)  # one new epoch per failed home
        route = reg.route_id.hex()
        again = [x for x in rows if x["kind"] == "reg_originated" and x["route"] == route and x["epoch"] == 2]
        assert {x["relay"] for x in again} >= set(live)
        assert all(x["t"] == pytest.approx(failed_at[down[0]] + 1.0) for x in again if x["relay"] in live)
    assert s["multi_home_never_delivered"] == 0 and s["multi_home_delivery_ratio"] == 1.0
