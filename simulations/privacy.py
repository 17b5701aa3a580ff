"""Linkability: what relays can infer from what they see, measured against chance.

`inri-sim privacy [--relays N] [--devices D] [--colluders F] [--seed S]` (last line: JSON) runs a simulated mesh in
which every device registers, then rotates its route key (a new, unlinkable route id: the second
"epoch" of the device in the sense of docs/protocol.md), both times at the same home relay, and
reads the trace exactly as relays write it (route_set rows: which relay cached which route id, at
what hop distance, from which neighbour). An observer set is one relay, or a share of colluding
relays pooling what they saw. The adversary is given more than a relay has: the whole topology and
every link latency, so it can compute, for any candidate home relay, the hop distance at which each
observer would have first heard that home's gossip (the latency-shortest path).

Measures (averaged over registrations the observers saw, homes outside the observer set):

- home_guess: the candidate homes consistent with every observation (equal hop distance at every
  observer); the adversary picks one at random. Success = 1/|candidates| if the true home is among
  them. Reported with chance (1 / relays outside the observer set) and the share of registrations
  whose home is pinned down exactly (a single candidate, the right one).
- epoch_link: for the second route id of a device, the adversary links it to a first-period route
  id whose candidate homes intersect its own, at random among those. Success = 1/|those| if the
  device's first route id is among them; chance = 1 / first-period route ids. (Timing is not used:
  a device that rotates on a schedule leaks more; docs/protocol.md says what rotation hides.)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from simulations.extras import require
from simulations.scenario import from_dict
from simulations.sim import Simulator


def _observer_hops(n: int, latency: dict[tuple[int, int], float], processing: list[float],
                   observers: list[int]) -> dict[int, np.ndarray]:
    """hops[c][v]: edges on the latency-shortest path v -> c (what c sees as the hop count of v's gossip)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra

    src = np.fromiter((u for u, _ in latency), dtype=np.int64, count=len(latency))
    dst = np.fromiter((v for _, v in latency), dtype=np.int64, count=len(latency))
    w = np.fromiter((lat + processing[v] for (_, v), lat in latency.items()), dtype=np.float64, count=len(latency))
    reverse = csr_matrix((w, (dst, src)), shape=(n, n))  # paths into c, walked backwards from c
    out: dict[int, np.ndarray] = {}
    _, pred = dijkstra(reverse, directed=True, indices=observers, return_predecessors=True)
    for row, c in enumerate(observers):
        p = pred[row]
        hops = np.full(n, -1, dtype=np.int64)
        hops[c] = 0
        for v in range(n):
            chain = []
            u = v
            while hops[u] < 0 and p[u] >= 0:
                chain.append(u)
                u = p[u]
            base = hops[u]
            for k, x in enumerate(reversed(chain), start=1):
                hops[x] = base + k if base >= 0 else -1
        out[c] = hops
    return out


def measure(relays: int = 1000, devices: int = 100, colluders: float = 0.05, seed: int = 1,
            single_observers: int = 50) -> dict[str, Any]:
    """Run the mesh and measure linkability for one relay and for a colluding share of relays."""
    raw = {
        "name": "privacy", "seed": seed, "duration_s": 60.0, "deadline_s": 30.0, "trace_level": "full",
        "topology": {"kind": "random", "relays": relays},
        "workload": {"registrations": 2 * devices, "registration_start_s": 0.0, "registration_end_s": 30.0,
                     "tokens_per_registration": 1, "pushes": 0, "rotate": True},
        "engine": {"keepalive_interval_s": 2.0},
    }
    with tempfile.TemporaryDirectory() as tmp:
        sim = Simulator(from_dict(raw), seed=seed, trace_dir=Path(tmp))
        sim.run()
        pq = require("pyarrow.parquet", "the privacy measurement")
        t = pq.read_table(Path(tmp) / "events.parquet", columns=["kind", "relay", "route", "hops"]).to_pylist()
    seen: dict[str, dict[int, int]] = {}  # route hex -> {observer relay: hops}
    for r in t:
        if r["kind"] == "route_set":
            seen.setdefault(r["route"], {})[int(r["relay"])] = int(r["hops"])
    routes = [(reg.route_id.hex(), home) for home, reg, _ in sim.work.regs if reg is not None]
    n = sim.net.n
    rng = random.Random(seed)
    all_observers = sorted(rng.sample(range(n), max(1, int(round(colluders * n)))))
    singles = rng.sample(range(n), min(single_observers, n))
    hops = _observer_hops(n, sim.net.latency, sim.net.processing, sorted(set(all_observers) | set(singles)))

    def candidates(route: str, observers: list[int]) -> np.ndarray | None:
        obs = {c: h for c, h in seen.get(route, {}).items() if c in set(observers)}
        if not obs:
            return None
        mask = np.ones(n, dtype=bool)
        mask[observers] = False
        for c, h in obs.items():
            mask &= hops[c] == h
        return mask

    def home_guess(observers: list[int]) -> tuple[float, float, float, int]:
        succ, exact, count = [], 0, 0
        for route, home in routes:
            if home in observers:
                continue
            mask = candidates(route, observers)
            if mask is None:
                continue
            count += 1
            k = int(mask.sum())
            hit = bool(mask[home])
            succ.append(1.0 / k if hit and k else 0.0)
            exact += int(hit and k == 1)
        chance = 1.0 / (n - len(observers))
        return (float(np.mean(succ)) if succ else 0.0), chance, (exact / count if count else 0.0), count

    def epoch_link(observers: list[int]) -> tuple[float, float, int]:
        first = [(routes[2 * d][0], routes[2 * d][1]) for d in range(devices)]
        masks = {r: candidates(r, observers) for r, _ in first}
        succ = []
        for d in range(devices):
            second, home = routes[2 * d + 1]
            if home in observers:
                continue
            m2 = candidates(second, observers)
            if m2 is None:
                continue
            linked = [r for r, _ in first if masks[r] is not None and bool((masks[r] & m2).any())]
            target = routes[2 * d][0]
            succ.append(1.0 / len(linked) if target in linked else 0.0)
        return (float(np.mean(succ)) if succ else 0.0), 1.0 / devices, len(succ)

    one = [home_guess([c]) for c in singles]
    one_link = [epoch_link([c]) for c in singles]
    many = home_guess(all_observers)
    many_link = epoch_link(all_observers)
    return {
        "relays": n, "devices": devices, "seed": seed,
        "single_relay_home_guess": round(float(np.mean([x[0] for x in one])), 5),
        "single_relay_home_exact": round(float(np.mean([x[2] for x in one])), 5),
        "single_relay_epoch_link": round(float(np.mean([x[0] for x in one_link])), 5),
        "colluders": len(all_observers),
        "colluders_home_guess": round(many[0], 5),
        "colluders_home_exact": round(many[2], 5),
        "colluders_epoch_link": round(many_link[0], 5),
        "chance_home": round(many[1], 6),
        "chance_epoch_link": round(many_link[1], 6),
        "registrations_observed": many[3],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inri-sim privacy", description="Linkability against chance.")
    parser.add_argument("--relays", type=int, default=1000)
    parser.add_argument("--devices", type=int, default=100)
    parser.add_argument("--colluders", type=float, default=0.05, help="share of colluding relays (default 0.05)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.relays < 10 or args.devices < 2 or not 0 < args.colluders < 1:
        print("inri-sim privacy: need relays >= 10, devices >= 2, 0 < colluders < 1", file=sys.stderr)
        return 2
    print(json.dumps(measure(args.relays, args.devices, args.colluders, args.seed), sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
