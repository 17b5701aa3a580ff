"""The simulator's twin of a lab mesh of real relays (`inri mesh up --link-delay-ms ... --link-loss ...`).

A lab run (benchmarks/bench_impaired_links.py, tests/test_impaired_links.py) records the links the real
relays chose, where devices registered and which relay each push entered at and when. `replay` runs
the same workload on the same topology in the simulator, with every link's one-way latency the lab's
link delay, the lab's loss under `loss_model = "quic"` (a lost packet is retransmitted after aioquic's
probe timeout: simulations/linkmodel.py) and the relays' engine configuration, and returns each push's
latency (None: not delivered within the deadline), so both can be set side by side.

`routes`: the routes the real relays had learned (their `routes.msgpack`, written when they stop). With
only a few registrations, which next hop each relay holds is one random draw per run: a relay keeps
the first announcement that reaches it as its primary next hop, and a later, shorter one only as a
backup, so one announcement delayed on the host (a lost packet, a stalled process) leaves a longer
route in place for the whole run. A twin that learns its own routes draws again and can differ on
that alone; given `routes`, each device's registration is stored at its home without gossip and every
other relay starts with the real relay's route (next hops and distances), so both sides run the same
pushes over the same links along the same routes and only the links' behaviour (delay, loss, QUIC's
recovery) and the engine's own reactions to it decide the latencies.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from inri.core.api import Effect, Send
from inri.core.config import EngineConfig
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import Registration
from simulations.events import EventKind
from simulations.scenario import Scenario, Topology, Workload
from simulations.sim import Simulator
from simulations.summary import delivered_at
from simulations.topology import Network
from simulations.workload import PushPlan


@dataclass
class _LabNetwork(Network):
    """The lab's links; a link a twin relay opens during the run (as real relays may) has the lab's
    delay too, not the scenario topology's default latency."""

    delay_s: float = 0.0

    def link_latency(self, u: int, v: int, rng: random.Random, topo: Topology) -> tuple[float, float]:
        return self.delay_s, self.delay_s


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
    routes: dict[int, dict[int, list[tuple[int, int]]]] | None = None,
    host_rtt_s: float = 0.0,
    host_rttvar_s: float = 0.0,
) -> list[float | None]:
    """Each push's latency in the simulator (None: not delivered by the deadline).

    links: undirected relay links (relay indices); homes[d]: device d's home relay; the devices register
    at `registered_at`, push times are on the same clock. processing_s: per frame a relay handles.
    routes[relay][device]: that relay's next hops (relay, distance) for the device, primary first
    (module docstring); None: the twin learns its routes by gossip, as the relays did.
    host_rtt_s, host_rttvar_s: what the relays' QUIC RTT estimates hold beyond the path's round trip and
    the ACK delay (the host getting to each datagram at both ends), and their RTT variance: they set the
    twin's probe timeout to the relays' (linkmodel.py).
    """
    end = max((p.t for p in pushes), default=0.0) + deadline_s + 5.0
    sc = Scenario(name="lab-twin", seed=seed, duration_s=end, deadline_s=deadline_s, loss=loss, loss_model=loss_model,
                  topology=Topology(relays=relays), workload=Workload(registrations=0, pushes=0), engine=engine)
    latency = {}
    for u, v in links:
        latency[(u, v)] = latency[(v, u)] = delay_s
    sim = Simulator(sc, seed=seed, network=_LabNetwork(relays, latency, [processing_s] * relays, delay_s=delay_s))
    sim.host_rtt_s, sim.host_rttvar_s = host_rtt_s, host_rttvar_s
    rng = random.Random(seed)
    work, q = sim.work, sim.q
    for d, home in enumerate(homes):
        tokens = [rng.randbytes(16) for _ in range(sum(1 for p in pushes if p.device == d))]
        work.regs.append((home, None, new_signing_key(rng.randbytes(32))))
        work.reg_tokens.append(tokens)
        q.schedule(registered_at, EventKind.REGISTER, home, d, (1, tokens))
    if routes is not None:
        for d, home in enumerate(homes):
            _seed_routes(sim, home, d, routes)
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


def _seed_routes(sim: Simulator, home: int, device: int, routes: dict[int, dict[int, list[tuple[int, int]]]]) -> None:
    """At its registration, store device's registration at home without gossip, and give every other
    relay the route the real relay had (replay, `routes`)."""
    eng = sim.engines[home]
    register = eng.register

    def register_quietly(reg: Registration, now: float) -> list[Effect]:
        effects: list[Effect] = [e for e in register(reg, now) if not isinstance(e, Send)]
        for relay, by_device in routes.items():
            hops = by_device.get(device)
            other = sim.engines[relay]
            if relay != home and hops:
                far = other.wall_offset + now + 365 * 86400.0
                other.restore_routes([(reg.route_id, reg.epoch, far, tuple((sim.names[r], k) for r, k in hops))], now)
        return effects

    eng.register = register_quietly  # type: ignore[method-assign,assignment]


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of a non-empty list."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))]
