"""The simulator's run loop inlines the event queue, the sends of _apply and _rearm (its hot paths, issue
18): the same scenarios run through the reference methods instead (EventQueue.pop and schedule,
Simulator._apply, Simulator._rearm) must give the same summary, key for key, and the same trace."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from simulations.events import EventKind
from simulations.scenario import Scenario, from_dict
from simulations.sim import Simulator


def scenario(loss_model: str, seed: int, relays: int) -> Scenario:
    """Small, with everything the loop handles: loss, churn (frames to relays that are down, rejoins),
    a partition (cut links), pushes with custody and the transport's loss detection."""
    return from_dict({
        "name": "fastpath", "seed": seed, "duration_s": 50.0, "deadline_s": 20.0, "coverage_after_s": 5.0,
        "topology": {"relays": relays},
        "network": {"loss": 0.05, "loss_model": loss_model},
        "workload": {"registrations": 10, "registration_end_s": 3.0, "tokens_per_registration": 10,
                     "pushes": 60, "push_start_s": 6.0, "push_end_s": 30.0},
        "churn": {"fail_fraction": 0.2, "rejoin_fraction": 0.5, "start_s": 6.0, "end_s": 30.0, "downtime_s": 8.0},
        "partitions": [{"start_s": 12.0, "end_s": 16.0, "fraction": 0.3}],
        "engine": {"keepalive_interval_s": 1.0, "keepalive_misses": 3, "custody_retry_s": 1.0,
                   "forward_jitter_s": 0.004},
    })


def reference_run(sim: Simulator) -> dict[str, Any]:
    """Simulator._run without its inlined paths: every event through the queue's and the simulator's
    own methods."""
    sim._prepare()
    q = sim.q
    events = 0
    while True:
        ev = q.pop()
        if ev is None or ev[0] > sim.sc.duration_s:
            break
        t, _, kind, a, b, payload = ev
        sim.now = t
        events += 1
        if kind == EventKind.FRAME:
            if not sim.alive[b]:
                sim._unacked(a, b, t - sim.net.processing[b] - sim.lat[a].get(b, 0.0))
                continue
            sim._apply(b, sim.engines[b].receive_message(sim.names[a], payload, t))  # type: ignore[arg-type]
            sim._rearm(b)
        elif kind == EventKind.TIMER:
            if not sim.alive[a] or sim.timer_at[a] != t:
                continue
            sim.timer_at[a] = math.inf
            sim._apply(a, sim.engines[a].handle_timer(t))
            sim._rearm(a)
        else:
            sim._control(kind, a, b, payload, t)
    sim.events = events
    return sim._finish(1.0).summary


def without_timing(summary: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in summary.items() if k not in ("events_per_s", "wall_s")}


@pytest.mark.parametrize(("loss_model", "seed", "relays"), [("drop", 3, 40), ("quic", 5, 50)])
def test_the_inlined_run_loop_gives_the_reference_loops_summary(loss_model: str, seed: int, relays: int,
                                                                 tmp_path: Path) -> None:
    sc = scenario(loss_model, seed, relays)
    fast = Simulator(sc, trace_dir=tmp_path / "fast", trace_format="jsonl").run().summary
    ref = reference_run(Simulator(sc, trace_dir=tmp_path / "ref", trace_format="jsonl"))
    assert fast["events"] > 5_000 and fast["frames_lost"] > 0 and fast["pushes_excluded"] > 0  # it was exercised
    assert fast["links_unresponsive"] > 0
    assert without_timing(fast) == without_timing(ref)
    assert (tmp_path / "fast" / "events.jsonl").read_bytes() == (tmp_path / "ref" / "events.jsonl").read_bytes()
