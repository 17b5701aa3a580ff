"""The simulator's twin of a lab mesh of real relays (`inri mesh up --link-delay-ms ... --link-loss ...`).

A lab run (benchmarks/bench_impaired_links.py, tests/test_impaired_links.py) records the links the real
relays chose, where devices registered and which relay each push entered at and when. `replay` runs
the same workload on the same topology in the simulator, with every link's one-way latency the lab's
link delay, the lab's loss under `loss_model = "quic"` (a lost packet is retransmitted after aioquic's
probe timeout: simulations/linkmodel.py) and the relays' engine configuration, and returns each push's
latency (None: not delivered within the deadline), so both can be set side by side.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from inri.core.config import EngineConfig
from inri.protocol.keys import new_signing_key
from simulations.events import EventKind
from simulations.scenario import Scenario, Topology, Workload
from simulations.sim import Simulator
from simulations.summary import delivered_at
from simulations.topology import Network
from simulations.workload import PushPlan


@dataclass(frozen=True)
class LabPush:
    """One push of a lab run: seconds after the run's start, the relay it entered at, its device."""

    t: float
    inject: int
    device: int


def replay(
    relays: int,
    links: list[tuple[int, int]],
    homes: list[int],
    pushes: list[LabPush],
    *,
    delay_s: float,
    loss: float,
    engine: EngineConfig,
    processing_s: float = 0.001,
    loss_model: str = "quic",
    deadline_s: float = 30.0,
    registered_at: float = 1.0,
    seed: int = 1,
) -> list[float | None]:
    """Each push's latency in the simulator (None: not delivered by the deadline).

    links: undirected relay links (relay indices); homes[d]: device d's home relay; the devices register
    at `registered_at`, push times are on the same clock. processing_s: per frame a relay handles.
    """
    end = max((p.t for p in pushes), default=0.0) + deadline_s + 5.0
    sc = Scenario(name="lab-twin", seed=seed, duration_s=end, deadline_s=deadline_s, loss=loss, loss_model=loss_model,
                  topology=Topology(relays=relays), workload=Workload(registrations=0, pushes=0), engine=engine)
    latency = {}
    for u, v in links:
        latency[(u, v)] = latency[(v, u)] = delay_s
    sim = Simulator(sc, seed=seed, network=Network(relays, latency, [processing_s] * relays))
    rng = random.Random(seed)
    work, q = sim.work, sim.q
    for d, home in enumerate(homes):
        tokens = [rng.randbytes(16) for _ in range(sum(1 for p in pushes if p.device == d))]
        work.regs.append((home, None, new_signing_key(rng.randbytes(32))))
        work.reg_tokens.append(tokens)
        q.schedule(registered_at, EventKind.REGISTER, home, d, (1, tokens))
    used = [0] * len(homes)
    for b, p in enumerate(pushes):
        work.pushes.append(PushPlan(p.t, p.device, p.inject, work.reg_tokens[p.device][used[p.device]]))
        used[p.device] += 1
        q.schedule(p.t, EventKind.PUSH, p.inject, b, None)
    sim.run()
    out: list[float | None] = []
    for plan in work.pushes:
        at = delivered_at(sim.collector, plan)
        out.append(None if at is None or at - plan.t > deadline_s else at - plan.t)
    return out


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty list."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]
