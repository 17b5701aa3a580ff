"""Modelled networks: who links to whom, with a latency per direction and a processing delay per relay."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from inri.core.config import EngineConfig
from simulations.scenario import Topology


@dataclass
class Network:
    """Directed latencies lat[(u, v)] for every link (both directions present) and processing[v]."""

    n: int
    latency: dict[tuple[int, int], float]
    processing: list[float]
    positions: list[tuple[float, float]] | None = None
    formation: dict[str, int] | None = None  # kind "built": what the membership did (simulations/built.py)

    def degrees(self) -> dict[int, int]:
        """How many relays have each degree, as built (before any run-time link)."""
        deg = [0] * self.n
        for u, _ in self.latency:
            deg[u] += 1
        hist: dict[int, int] = {}
        for d in deg:
            hist[d] = hist.get(d, 0) + 1
        return dict(sorted(hist.items()))

    def neighbours(self) -> list[list[int]]:
        """Adjacency lists, sorted (deterministic)."""
        adj: list[list[int]] = [[] for _ in range(self.n)]
        for u, v in self.latency:
            adj[u].append(v)
        for a in adj:
            a.sort()
        return adj

    def undirected_edges(self) -> list[tuple[int, int]]:
        """Each link once, (low, high), sorted."""
        return sorted((u, v) for u, v in self.latency if u < v)

    def link_latency(self, u: int, v: int, rng: random.Random, topo: Topology) -> tuple[float, float]:
        """Latencies (u->v, v->u) for a link made at run time (membership replacement)."""
        base = self._base(u, v, rng, topo)
        return _asym(base, rng, topo.asymmetry), _asym(base, rng, topo.asymmetry)

    def _base(self, u: int, v: int, rng: random.Random, topo: Topology) -> float:
        if self.positions is not None:
            (x1, y1), (x2, y2) = self.positions[u], self.positions[v]
            return topo.geo_base_s + math.hypot(x1 - x2, y1 - y2) * topo.geo_per_unit_s
        return rng.uniform(topo.latency_min_s, topo.latency_max_s)


def _asym(base: float, rng: random.Random, asymmetry: float) -> float:
    return base * (1.0 + rng.uniform(-asymmetry, asymmetry))


def _connected(n: int, edges: set[tuple[int, int]]) -> bool:
    adj: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges:
        adj[u].append(v)
        adj[v].append(u)
    seen = [False] * n
    stack = [0]
    seen[0] = True
    count = 1
    while stack:
        u = stack.pop()
        for v in adj[u]:
            if not seen[v]:
                seen[v] = True
                count += 1
                stack.append(v)
    return count == n


def _random_edges(n: int, topo: Topology, rng: random.Random) -> set[tuple[int, int]]:
    """Each relay gets min..max degree: a random pairing of degree stubs, repaired to be connected."""
    target = [rng.randint(topo.min_degree, topo.max_degree) for _ in range(n)]
    edges: set[tuple[int, int]] = set()
    deg = [0] * n
    # A random ring first guarantees connectivity; then random stubs fill the remaining degree.
    order = list(range(n))
    rng.shuffle(order)
    for i in range(n):
        u, v = order[i], order[(i + 1) % n]
        e = (min(u, v), max(u, v))
        if e not in edges:
            edges.add(e)
            deg[u] += 1
            deg[v] += 1
    stubs = [u for u in range(n) for _ in range(max(0, target[u] - deg[u]))]
    rng.shuffle(stubs)
    for _ in range(3):  # a few passes pair what collided
        left = []
        for i in range(0, len(stubs) - 1, 2):
            u, v = stubs[i], stubs[i + 1]
            e = (min(u, v), max(u, v))
            if u == v or e in edges or deg[u] >= topo.max_degree or deg[v] >= topo.max_degree:
                left += [u, v]
                continue
            edges.add(e)
            deg[u] += 1
            deg[v] += 1
        if len(stubs) % 2:
            left.append(stubs[-1])
        stubs = left
        rng.shuffle(stubs)
    return edges


def _geo_edges(n: int, topo: Topology, rng: random.Random, pos: list[tuple[float, float]]) -> set[tuple[int, int]]:
    """Link each relay to its nearest relays (grid buckets keep it O(n)) plus one random far relay."""
    cells = max(1, int(math.sqrt(n / 4)))
    grid: dict[tuple[int, int], list[int]] = {}
    for i, (x, y) in enumerate(pos):
        grid.setdefault((min(cells - 1, int(x * cells)), min(cells - 1, int(y * cells))), []).append(i)
    deg = [0] * n
    edges: set[tuple[int, int]] = set()
    for u in range(n):
        x, y = pos[u]
        cx, cy = min(cells - 1, int(x * cells)), min(cells - 1, int(y * cells))
        near: list[tuple[float, int]] = []
        radius = 1
        while len(near) < topo.max_degree * 3 and radius <= cells:
            near = []
            for gx in range(cx - radius, cx + radius + 1):
                for gy in range(cy - radius, cy + radius + 1):
                    for v in grid.get((gx, gy), ()):
                        if v != u:
                            near.append((math.hypot(pos[v][0] - x, pos[v][1] - y), v))
            radius += 1
        near.sort()
        # All but one link go to the nearest relays; the last one is left for a random far relay,
        # as a bootstrap node suggests "nearest first, then random others" so the mesh stays a
        # small world rather than a grid with a diameter in the dozens of hops.
        want = rng.randint(topo.min_degree, topo.max_degree) - 1
        for _, v in near:
            if deg[u] >= want:
                break
            e = (min(u, v), max(u, v))
            if e in edges or deg[v] >= topo.max_degree:
                continue
            edges.add(e)
            deg[u] += 1
            deg[v] += 1
    for u in range(n):
        for _ in range(8):
            v = rng.randrange(n)
            e = (min(u, v), max(u, v))
            if v != u and e not in edges and deg[u] < topo.max_degree and deg[v] < topo.max_degree:
                edges.add(e)
                deg[u] += 1
                deg[v] += 1
                break
    _repair_degrees(n, topo, rng, edges, deg)
    _join_islands(n, edges, pos)
    return edges


def _join_islands(n: int, edges: set[tuple[int, int]], pos: list[tuple[float, float]]) -> int:
    """Connect each component to its nearest relay in the giant one; returns how many links that took."""
    joined = 0
    while not _connected(n, edges):
        comp = _components(n, edges)
        main = max(set(comp), key=comp.count)
        outside = [u for u in range(n) if comp[u] != main]
        u = outside[0]
        v = min((w for w in range(n) if comp[w] == main),
                key=lambda w: math.hypot(pos[w][0] - pos[u][0], pos[w][1] - pos[u][1]))
        edges.add((min(u, v), max(u, v)))
        joined += 1
    return joined


def shape(n: int, edges: set[tuple[int, int]] | list[tuple[int, int]], *, sources: int = 0,
          rng: random.Random | None = None) -> dict[str, float]:
    """Mean shortest path (hops) and eccentricity of a mesh by BFS: from every relay, or from `sources`
    relays drawn at random (then the eccentricity is the largest seen: a lower bound of the diameter).
    Unreachable pairs are left out (`reachable` is the share of pairs that are connected)."""
    adj: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges:
        adj[u].append(v)
        adj[v].append(u)
    starts = list(range(n)) if not sources or sources >= n else (rng or random.Random(0)).sample(range(n), sources)
    total = 0
    pairs = 0
    ecc_max = 0
    ecc_sum = 0
    for s in starts:
        dist = [-1] * n
        dist[s] = 0
        frontier = [s]
        d = 0
        while frontier:
            d += 1
            nxt = []
            for u in frontier:
                for v in adj[u]:
                    if dist[v] < 0:
                        dist[v] = d
                        nxt.append(v)
            if nxt:
                total += d * len(nxt)
                pairs += len(nxt)
            frontier = nxt
        ecc = d - 1
        ecc_max = max(ecc_max, ecc)
        ecc_sum += ecc
    degs = [len(a) for a in adj]
    return {
        "mean_path": round(total / pairs, 3) if pairs else 0.0,
        "eccentricity_max": ecc_max,
        "eccentricity_mean": round(ecc_sum / len(starts), 2),
        "reachable": round(pairs / (len(starts) * (n - 1)), 4),
        "degree_mean": round(sum(degs) / n, 3),
        "degree_min": min(degs),
        "degree_max": max(degs),
    }


def _repair_degrees(n: int, topo: Topology, rng: random.Random, edges: set[tuple[int, int]], deg: list[int]) -> None:
    """Bring every relay up to min_degree: pair short relays at random (long links: the mesh stays a
    small world), then link a short one to a relay with room, and as a last resort splice it into a
    random link (x-y becomes x-u-y: x and y keep their degree). What cannot be honoured (min_degree ==
    max_degree with an odd total) is left short and shows in the summary's `topology_degrees`."""
    short = [u for u in range(n) if deg[u] < topo.min_degree]
    if not short:
        return
    rng.shuffle(short)

    elist = sorted(edges)  # for drawing a random link (entries removed from `edges` are skipped)

    def link(u: int, v: int) -> None:
        e = (min(u, v), max(u, v))
        edges.add(e)
        elist.append(e)
        deg[u] += 1
        deg[v] += 1

    def adjacent(u: int, v: int) -> bool:
        return (min(u, v), max(u, v)) in edges

    for _ in range(4):
        pending = [u for u in short if deg[u] < topo.min_degree]
        rng.shuffle(pending)
        for i in range(0, len(pending) - 1, 2):
            u, v = pending[i], pending[i + 1]
            if u != v and not adjacent(u, v) and deg[u] < topo.min_degree and deg[v] < topo.min_degree:
                link(u, v)
    room = [v for v in range(n) if deg[v] < topo.max_degree]
    for u in short:
        tries = 0
        while deg[u] < topo.min_degree and tries < 64:
            tries += 1
            if room and deg[u] + 1 == topo.min_degree:  # one short: any relay with room
                v = room[rng.randrange(len(room))]
                if v != u and deg[v] < topo.max_degree and not adjacent(u, v):
                    link(u, v)
                    continue
            if deg[u] + 2 > topo.max_degree:
                break
            x, y = elist[rng.randrange(len(elist))]
            if (x, y) not in edges or u in (x, y) or adjacent(u, x) or adjacent(u, y):
                continue
            edges.discard((x, y))
            deg[x] -= 1
            deg[y] -= 1
            link(u, x)
            link(u, y)


def _components(n: int, edges: set[tuple[int, int]]) -> list[int]:
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for u, v in edges:
        parent[find(u)] = find(v)
    return [find(u) for u in range(n)]


def _positions(n: int, topo: Topology, rng: random.Random) -> list[tuple[float, float]]:
    """Where relays sit on the unit square: uniformly, or (`clusters` > 0) around that many metro centres
    (drawn uniformly inside the square's middle 80%), the k-th of them (from 0) with weight 1 / (k + 1)
    (a few big hosting regions and many small ones, as community servers gather), each relay a Gaussian
    `cluster_spread` away from its centre, clamped to the square."""
    if not topo.clusters:
        return [(rng.random(), rng.random()) for _ in range(n)]
    centres = [(0.1 + 0.8 * rng.random(), 0.1 + 0.8 * rng.random()) for _ in range(topo.clusters)]
    weights = [1.0 / (k + 1) for k in range(topo.clusters)]
    out = []
    for cx, cy in rng.choices(centres, weights, k=n):
        out.append((min(1.0, max(0.0, rng.gauss(cx, topo.cluster_spread))),
                    min(1.0, max(0.0, rng.gauss(cy, topo.cluster_spread)))))
    return out


def build(topo: Topology, rng: random.Random, engine: EngineConfig | None = None) -> Network:
    """Build the scenario's network: connected, min..max degree, directed latencies, processing delays.

    kind "built": the shipped bootstrap ranking and membership form it (simulations/built.py) with the
    scenario's `engine` settings; its degrees are the membership's (see `Network.degrees`)."""
    n = topo.relays
    positions = None
    formation = None
    if topo.kind == "geographic":
        positions = _positions(n, topo, rng)
        edges = _geo_edges(n, topo, rng, positions)
    elif topo.kind == "built":
        from simulations.built import built_edges

        positions = _positions(n, topo, rng)
        edges, rep = built_edges(n, positions, engine or EngineConfig(), random.Random(rng.getrandbits(64)))
        formation = rep.as_dict()
        if not _connected(n, edges):  # as the geographic builder: join islands to their nearest relay
            formation["islands_joined"] = _join_islands(n, edges, positions)
    else:
        edges = _random_edges(n, topo, rng)
    net = Network(n, {}, [rng.uniform(topo.processing_min_s, topo.processing_max_s) for _ in range(n)], positions,
                  formation)
    for u, v in sorted(edges):
        a, b = net.link_latency(u, v, rng, topo)
        net.latency[(u, v)] = a
        net.latency[(v, u)] = b
    return net
