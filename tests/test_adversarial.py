"""Adversarial scenarios at 200 relays (the 1k versions run in `make bench`): the shipped engine,
scoring included, against black holes, hijacking forgers, a registration spammer and a push spammer.
Each runs beside the same scenario with its adversaries switched off."""

from __future__ import annotations

from typing import Any

import pytest

from simulations.scenario import ScenarioError, from_dict
from simulations.sim import Simulator

BASE: dict[str, Any] = {
    "seed": 4,
    "duration_s": 90.0,
    "deadline_s": 30.0,
    "topology": {"relays": 200},
    "workload": {"registrations": 40, "tokens_per_registration": 20, "pushes": 400, "registration_end_s": 10.0,
                 "push_start_s": 20.0, "push_end_s": 60.0},
    "engine": {"keepalive_interval_s": 2.0},
}


def run(adversary: dict[str, Any], on: bool = True, **engine: Any) -> dict[str, Any]:
    raw = {**BASE, "adversaries": [adversary], "engine": {**BASE["engine"], **engine}}
    return Simulator(from_dict(raw, "adv-test"), adversaries=on).run().summary


def test_ten_percent_black_holes_cost_latency_not_pushes() -> None:
    hostile = run({"kind": "black_hole", "fraction": 0.1})
    honest = run({"kind": "black_hole", "fraction": 0.1}, on=False)
    assert hostile["hostile_relays"] == {"black_hole": 20}
    assert honest["delivery_ratio"] == 1.0 and hostile["delivery_ratio"] >= 0.99
    # The same homes and pushes: the black holes cost retries (messages), not deliveries.
    assert hostile["pushes"] == honest["pushes"] == 400
    assert hostile["messages_per_delivered_push"] > honest["messages_per_delivered_push"]
    assert hostile["cuts_of_honest"] == 0


def test_hijacking_forgers_are_cut_everywhere_and_cost_no_push() -> None:
    s = run({"kind": "forger", "count": 6, "rate_per_s": 20.0, "start_s": 12.0})
    assert s["hostile_relays"] == {"forger": 6}
    assert s["delivery_ratio"] == 1.0
    assert s["hostile_isolated"] == 6 and s["cuts_of_hostile"] >= 6 and s["cuts_of_honest"] == 0
    assert s["primary_via_hostile"] == 0.0  # their route claims were forgotten with their links


def test_a_registration_spammer_reaches_no_more_than_its_budget() -> None:
    adv = {"kind": "reg_spammer", "count": 1, "rate_per_s": 1000.0, "start_s": 12.0, "end_s": 40.0}
    hostile, honest = run(adv), run(adv, on=False)
    burst = 400  # reg_budget_peer_burst: what one link admits at once; 20 over-budget drops cut it
    links = hostile["cuts_of_hostile"] + 4
    assert hostile["spam_registrations"] >= 2000  # 2,000 per 2 s tick until every link is cut
    assert 0 < hostile["spam_routes_cached_max"] <= links * (burst + 20)
    assert hostile["spam_routes_cached_max"] < hostile["spam_registrations"] / 2
    assert hostile["cuts_of_hostile"] >= 1 and hostile["cuts_of_honest"] == 0
    # Honest registrations converge as before.
    assert hostile["route_coverage"] == honest["route_coverage"] == 1.0
    assert hostile["convergence_p50_s"] == pytest.approx(honest["convergence_p50_s"], rel=0.05)
    assert hostile["delivery_ratio"] == 1.0


def test_a_push_spammer_at_ten_times_capacity_costs_honest_pushes_little_latency_and_nothing_lost() -> None:
    adv = {"kind": "push_spammer", "rate_x": 10.0, "capacity_per_s": 1000.0, "honest_share": 0.3,
           "start_s": 15.0, "end_s": 65.0}
    hostile, quiet = run(adv), run(adv, on=False)
    assert hostile["victim_honest_pushes"] == quiet["victim_honest_pushes"] > 50
    assert hostile["victim_honest_lost"] == 0 and hostile["honest_refused"] == 0
    assert hostile["victim_latency_p99_s"] <= 2 * quiet["victim_latency_p99_s"]
    # ~500,000 offered; the relay's per-device limit (10/s, burst 50) lets ~550 in.
    assert hostile["spam_offered"] > 400_000 and hostile["spam_accepted"] <= 50 + 10 * 50 + 1
    assert quiet["spam_offered"] == 0
    assert hostile["delivery_ratio"] == 1.0  # spam pushes are excluded; every honest one arrived


def test_adversary_tables_are_checked() -> None:
    with pytest.raises(ScenarioError, match="kind must be one of"):
        from_dict({**BASE, "adversaries": [{"kind": "gremlin"}]})
    with pytest.raises(ScenarioError, match="unknown key 'share'"):
        from_dict({**BASE, "adversaries": [{"kind": "black_hole", "share": 0.1}]})
    with pytest.raises(ScenarioError, match="leave no honest relay"):
        from_dict({**BASE, "adversaries": [{"kind": "black_hole", "count": 200}]})


def test_linkability_is_measured_against_chance() -> None:
    from simulations.privacy import measure

    m = measure(relays=200, devices=30, colluders=0.05, seed=2, single_observers=20)
    assert m["registrations_observed"] > 40 and m["colluders"] == 10
    for key in ("single_relay_home_guess", "colluders_home_guess", "single_relay_epoch_link", "colluders_epoch_link"):
        assert 0.0 <= m[key] <= 1.0
    # What the measurement shows (docs/results/2026-11-25-stem-privacy.md): hop counts let observers narrow
    # the home down, and pooling 5% of the relays pins it; a single relay stays far from certain.
    assert m["chance_home"] < m["single_relay_home_guess"] <= m["colluders_home_guess"]
    assert m["single_relay_home_exact"] < 0.1
    assert m["chance_epoch_link"] < m["colluders_epoch_link"]


def test_adversary_hooks_exist_on_the_engine() -> None:
    """Every method a hostile relay overrides is a documented hook (inri.core.engine.HOOKS) that the
    engine still has: renaming one in the engine fails here instead of silently disabling an attack."""
    from inri.core.engine import HOOKS, Engine
    from simulations import adversary

    hostile = [c for c in vars(adversary).values() if isinstance(c, type) and issubclass(c, Engine) and c is not Engine]
    assert hostile
    overridden = set()
    for cls in hostile:
        for name, fn in vars(cls).items():
            if callable(fn) and hasattr(Engine, name):
                assert getattr(fn, "__override__", False), f"{cls.__name__}.{name} overrides without @override"
                overridden.add(name)
            if getattr(fn, "__override__", False):
                assert callable(getattr(Engine, name, None)), f"{cls.__name__}.{name}: no such engine method"
    assert overridden <= set(HOOKS), f"undocumented hooks: {overridden - set(HOOKS)}"
    for name in HOOKS:
        assert callable(getattr(Engine, name, None)), f"HOOKS names {name}, which Engine no longer has"
