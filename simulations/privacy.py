"""Linkability: what relays can infer from what they see, measured against chance.

`inri-sim privacy [--relays N] [--devices D] [--colluders F] [--seed S] [--stem on|off|both]` (a table,
then, last line, JSON) runs a simulated mesh, with the stem phase (inri/core/stem.py) on, off or both, in
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

from inri.core.stemstate import STEM_DISTANCE
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
            single_observers: int | None = None, stem: bool = False, pushes: int = 1000,
            engine: dict[str, Any] | None = None, link_observers: int = 50) -> dict[str, Any]:
    """Run the mesh (stem phase on or off) and measure linkability for one relay and for a colluding
    share of relays, plus the price: stretch, convergence and delivery of `pushes` pushes. `engine`:
    further [engine] keys (e.g. the stem's parameters). One relay's home guess is averaged over
    `single_observers` relays (None: every relay; the first spy is a rare event, about one registration
    in n per relay, so 50 relays left it within a factor of 3 of its mean), its epoch link over the
    first `link_observers` of them (the slow part)."""
    raw = {
        "name": "privacy", "seed": seed, "duration_s": 90.0, "deadline_s": 30.0, "trace_level": "full",
        "topology": {"kind": "random", "relays": relays},
        "workload": {"registrations": 2 * devices, "registration_start_s": 0.0, "registration_end_s": 30.0,
                     "tokens_per_registration": max(1, -(-pushes // (2 * devices)) + 1), "pushes": pushes,
                     "push_start_s": 35.0, "push_end_s": 55.0, "rotate": True},
        "engine": {"keepalive_interval_s": 2.0, **(engine or {}), "stem": stem},
    }
    with tempfile.TemporaryDirectory() as tmp:
        sim = Simulator(from_dict(raw), seed=seed, trace_dir=Path(tmp))
        result = sim.run()
        pq = require("pyarrow.parquet", "the privacy measurement")
        t = pq.read_table(Path(tmp) / "events.parquet",
                          columns=["t", "kind", "relay", "route", "peer", "hops", "reason"]).to_pylist()
    cfg = sim.sc.engine
    seen: dict[str, dict[int, int]] = {}  # route hex -> {observer relay: flood hops}
    stem_seen: dict[str, list[tuple[float, int, int]]] = {}  # route hex -> [(t, stem relay, its predecessor)]
    for r in t:
        if r["kind"] == "route_backup" and r["reason"] == "stem_announce":  # G5 with the stem: the sender
            # is the home or a stem relay, as a stem frame's sender is (stem.py)
            stem_seen.setdefault(r["route"], []).append((r["t"], int(r["relay"]), int(r["peer"])))
        elif r["kind"] == "route_set":
            if r["reason"] == "stem":
                stem_seen.setdefault(r["route"], []).append((r["t"], int(r["relay"]), int(r["peer"])))
            else:
                seen.setdefault(r["route"], {})[int(r["relay"])] = int(r["hops"])
    routes = [(reg.route_id.hex(), home) for home, reg, _ in sim.work.regs if reg is not None]
    n = sim.net.n
    rng = random.Random(seed)
    all_observers = sorted(rng.sample(range(n), max(1, int(round(colluders * n)))))
    singles = rng.sample(range(n), n if single_observers is None else min(single_observers, n))
    hops = _observer_hops(n, sim.net.latency, sim.net.processing, sorted(set(all_observers) | set(singles)))
    # The adversary's map of the mesh, for "the neighbours of a relay" (a stem's last hop is next to it)
    src = np.fromiter((u for u, _ in sim.net.latency), dtype=np.int64)
    dst = np.fromiter((v for _, v in sim.net.latency), dtype=np.int64)
    from scipy.sparse import csr_matrix

    adjacency = csr_matrix((np.ones(len(src)), (src, dst)), shape=(n, n))
    offsets = range(STEM_DISTANCE, STEM_DISTANCE + 1 + cfg.stem_hop_noise)  # a flood's first hops (stem.py)

    def candidates(route: str, observers: list[int]) -> np.ndarray | None:
        """Stem off: the homes consistent with every observer's hop count (the flood starts at 0)."""
        obs = {c: h for c, h in seen.get(route, {}).items() if c in set(observers)}
        if not obs:
            return None
        mask = np.ones(n, dtype=bool)
        mask[observers] = False
        for c, h in obs.items():
            mask &= hops[c] == h
        return mask

    def stem_candidates(route: str, observers: list[int]) -> np.ndarray | None:
        """Stem on, an adversary that knows the protocol. A colluder on the stem: the first one's
        predecessor (Dandelion's first-spy estimator, its best single guess). Else the flood: the
        relays where it may have started (the same start offset explains the most observers' hop
        counts), and the home among their neighbours (a stem of one hop is the likeliest length)."""
        obs_set = set(observers)
        on_stem = sorted(x for x in stem_seen.get(route, []) if x[1] in obs_set)
        mask = np.zeros(n, dtype=bool)
        if on_stem:
            mask[on_stem[0][2]] = True
            mask[observers] = False
            return mask if mask.any() else None
        obs = {c: h for c, h in seen.get(route, {}).items() if c in obs_set}
        if not obs:
            return None
        diff = np.stack([h - hops[c] for c, h in obs.items()])  # (observers, relays): implied start offsets
        fits = np.max([(diff == o).sum(axis=0) for o in offsets], axis=0)
        fits[observers] = -1
        starts = (fits == fits.max()).astype(np.float64)
        near: np.ndarray = np.asarray((adjacency @ starts) > 0)
        near[observers] = False
        return near

    find = stem_candidates if stem else candidates

    def home_guess(observers: list[int]) -> tuple[float, float, float, int, float, float]:
        """(P names the home, chance, share pinned exactly, registrations seen, the part of P from
        registrations whose stem an observer was on: Dandelion's first spy, the floor)

        The floor is what no stem hides: an observer that got a registration's stem frame from its home
        (the home's stem successor, or a link-up announcement) names the home by naming its
        predecessor, and any observer can guess at random: P >= share of such registrations + the
        rest x chance. Each registration has one home successor, so for one relay the floor is about
        2x chance whatever the stem does."""
        succ, exact, count, spy, first = [], 0, 0, 0.0, 0
        obs_set = set(observers)
        chance = 1.0 / (n - len(observers))
        for route, home in routes:
            if home in obs_set:
                continue
            mask = find(route, observers)
            if mask is None:
                continue
            count += 1
            k = int(mask.sum())
            hit = bool(mask[home])
            succ.append(1.0 / k if hit and k else 0.0)
            exact += int(hit and k == 1)
            if stem and any(x[1] in obs_set for x in stem_seen.get(route, ())):
                spy += succ[-1]
            first += int(stem and any(x[1] in obs_set and x[2] == home for x in stem_seen.get(route, ())))
        floor = (first + (count - first) * chance) / count if count else 0.0
        return ((float(np.mean(succ)) if succ else 0.0), chance, (exact / count if count else 0.0), count,
                (spy / count if count else 0.0), floor)

    def epoch_link(observers: list[int]) -> tuple[float, float, int]:
        first = [(routes[2 * d][0], routes[2 * d][1]) for d in range(devices)]
        masks = {r: find(r, observers) for r, _ in first}
        succ = []
        for d in range(devices):
            second, home = routes[2 * d + 1]
            if home in observers:
                continue
            m2 = find(second, observers)
            if m2 is None:
                continue
            linked = [r for r, _ in first if masks[r] is not None and bool((masks[r] & m2).any())]
            target = routes[2 * d][0]
            succ.append(1.0 / len(linked) if target in linked else 0.0)
        return (float(np.mean(succ)) if succ else 0.0), 1.0 / devices, len(succ)

    one = [home_guess([c]) for c in singles]
    one_link = [epoch_link([c]) for c in singles[:link_observers]]
    many = home_guess(all_observers)
    many_link = epoch_link(all_observers)
    summary = result.summary
    return {
        "relays": n, "devices": devices, "seed": seed, "stem": stem,
        "single_relay_home_guess": round(float(np.mean([x[0] for x in one])), 5),
        "single_relay_home_exact": round(float(np.mean([x[2] for x in one])), 5),
        # of single_relay_home_guess: the part from a relay on the stem naming its predecessor (Dandelion's
        # first spy: the home's stem successor is right, so this is about chance), and the rest (the flood)
        "single_relay_first_spy": round(float(np.mean([x[4] for x in one])), 5),
        "single_relay_flood_guess": round(float(np.mean([x[0] - x[4] for x in one])), 5),
        # what no stem hides (home_guess): about 2x chance for one relay, so "at most 2x" is the floor
        "single_relay_floor": round(float(np.mean([x[5] for x in one])), 6),
        "single_observers": len(singles),
        "single_relay_epoch_link": round(float(np.mean([x[0] for x in one_link])), 5),
        "single_relay_chance_home": round(1.0 / (n - 1), 6),
        "colluders": len(all_observers),
        "colluders_home_guess": round(many[0], 5),
        "colluders_home_exact": round(many[2], 5),
        "colluders_epoch_link": round(many_link[0], 5),
        "chance_home": round(many[1], 6),
        "chance_epoch_link": round(many_link[1], 6),
        "registrations_observed": many[3],
        "stretch_median": summary["stretch_median"],
        "stretch_p95": summary["stretch_p95"],
        "convergence_p50_s": summary["convergence_p50_s"],
        "delivery_ratio": summary["delivery_ratio"],
    }


ROWS = (  # the side-by-side table: (label, key, chance key or None)
    ("one relay names the home (P)", "single_relay_home_guess", "single_relay_chance_home"),
    ("  of which: first spy (on the stem)", "single_relay_first_spy", "single_relay_chance_home"),
    ("  of which: from the flood", "single_relay_flood_guess", "single_relay_chance_home"),
    ("  floor of any stem", "single_relay_floor", "single_relay_chance_home"),
    ("one relay pins the home exactly", "single_relay_home_exact", None),
    ("one relay links two route ids (P)", "single_relay_epoch_link", "chance_epoch_link"),
    ("colluders name the home (P)", "colluders_home_guess", "chance_home"),
    ("colluders pin the home exactly", "colluders_home_exact", None),
    ("colluders link two route ids (P)", "colluders_epoch_link", "chance_epoch_link"),
    ("stretch median", "stretch_median", None),
    ("stretch p95", "stretch_p95", None),
    ("convergence p50 (s)", "convergence_p50_s", None),
    ("delivery ratio", "delivery_ratio", None),
)


def table(results: dict[str, dict[str, Any]]) -> str:
    """The results of each stem mode side by side, with chance."""
    modes = list(results)
    first = results[modes[0]]
    head = f"{'':36}" + "".join(f"{'stem ' + m:>12}" for m in modes) + f"{'chance':>12}"
    lines = [f"{first['relays']} relays, {first['devices']} devices, {first['colluders']} colluders, "
             f"seed {first['seed']}", head]
    for label, key, chance in ROWS:
        vals = "".join(f"{results[m][key]:>12.4g}" for m in modes)
        lines.append(f"{label:36}{vals}{(f'{first[chance]:>12.4g}' if chance else ''):>12}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="inri-sim privacy", description="Linkability against chance.")
    parser.add_argument("--relays", type=int, default=1000)
    parser.add_argument("--devices", type=int, default=100)
    parser.add_argument("--colluders", type=float, default=0.05, help="share of colluding relays (default 0.05)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--single-observers", type=int, default=None,
                        help="relays measured one at a time (default: every relay)")
    parser.add_argument("--stem", choices=("on", "off", "both"), default="both",
                        help="the stem phase ([engine] stem); both: one run each, side by side (default)")
    args = parser.parse_args(argv)
    if args.relays < 10 or args.devices < 2 or not 0 < args.colluders < 1:
        print("inri-sim privacy: need relays >= 10, devices >= 2, 0 < colluders < 1", file=sys.stderr)
        return 2
    modes = ["off", "on"] if args.stem == "both" else [args.stem]
    if args.single_observers is not None and args.single_observers < 1:
        print("inri-sim privacy: need --single-observers >= 1", file=sys.stderr)
        return 2
    results = {m: measure(args.relays, args.devices, args.colluders, args.seed, single_observers=args.single_observers,
                          stem=m == "on") for m in modes}
    print(table(results))
    # Last line: JSON. One mode: its keys; both: {"stem_off": {...}, "stem_on": {...}}.
    out = results[modes[0]] if len(modes) == 1 else {f"stem_{m}": r for m, r in results.items()}
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
