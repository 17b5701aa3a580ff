"""The live graph at each push's injection (docs/metrics.md, path_stretch and overlay_penalty).

The rows that change the graph (peer_up, peer_down, relay_down, relay_up) and the pushes are few next to
a trace's route_set rows, so Spark selects them, the driver walks them in file order, and one Dijkstra
per distinct injecting relay runs on each version of the graph that pushes were injected on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import dijkstra

LIVE_KINDS = ("peer_up", "peer_down", "relay_down", "relay_up", "reg_originated", "push_injected")


def live_distances(rows: Iterable[Sequence[str | None]], links: dict[tuple[str, str], float],
                   processing: dict[str, float]) -> dict[str, float]:
    """rows: (kind, relay, peer, msg, route) of LIVE_KINDS in file order. Returns, per push injected at a
    relay other than its home (the relay that originated its route), the latency-shortest path over the
    links both ends held up at its injection (weight latency(u,v) + processing(v)); inf when none."""
    index = {name: i for i, name in enumerate(sorted({u for u, _ in links} | {v for _, v in links}))}
    up: dict[str, set[str]] = {}
    home: dict[str, str] = {}
    seen: set[str] = set()
    pending: list[tuple[str, str, str]] = []
    out: dict[str, float] = {}
    # One slot per directed link ever live: weight while both ends hold it up, inf after. A change costs
    # O(1); a Dijkstra costs one array conversion (a 10k-relay churn trace changes the graph ~10^4 times).
    slot: dict[tuple[str, str], int] = {}
    src: list[int] = []
    dst: list[int] = []
    weight: list[float] = []

    def set_pair(a: str, b: str, live: bool) -> None:
        for u, v in ((a, b), (b, a)):
            if (u, v) not in links:
                continue
            w = links[(u, v)] + processing.get(v, 0.0) if live else math.inf
            if (u, v) in slot:
                weight[slot[(u, v)]] = w
            elif live:
                slot[(u, v)] = len(weight)
                src.append(index[u])
                dst.append(index[v])
                weight.append(w)

    def flush() -> None:
        if not pending:
            return
        w = np.array(weight, dtype=np.float64)
        keep = np.isfinite(w)
        sources = sorted({s for _, s, _ in pending if s in index})
        if sources and keep.any():
            graph = csr_matrix((w[keep], (np.array(src)[keep], np.array(dst)[keep])),
                               shape=(len(index), len(index)))
            dist = dijkstra(graph, directed=True, indices=[index[s] for s in sources])
            row = {s: i for i, s in enumerate(sources)}
            for p, s, t in pending:
                out[p] = float(dist[row[s], index[t]]) if s in row and t in index else math.inf
        else:
            out.update((p, math.inf) for p, _, _ in pending)
        pending.clear()

    for kind, relay, peer, msg, route in rows:
        assert relay is not None
        if kind == "reg_originated":
            if route is not None:
                home[route] = relay
        elif kind == "push_injected":
            if msg is None or msg in seen:
                continue
            seen.add(msg)
            h = home.get(route) if route is not None else None
            if h is not None and h != relay:
                pending.append((msg, relay, h))
        else:
            flush()  # pushes injected so far saw the graph as it was before this change
            mine = up.setdefault(relay, set())
            if kind == "peer_up" and peer is not None and peer not in mine:
                mine.add(peer)
                if relay in up.get(peer, ()):
                    set_pair(relay, peer, True)
            elif kind == "peer_down" and peer is not None and peer in mine:
                mine.discard(peer)
                if relay in up.get(peer, ()):
                    set_pair(relay, peer, False)
            elif kind in ("relay_down", "relay_up"):  # a failed or restarted relay holds no links
                for other in up.pop(relay):
                    if relay in up.get(other, ()):
                        set_pair(relay, other, False)
    flush()
    return out
