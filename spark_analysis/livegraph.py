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

    def flush() -> None:
        if not pending:
            return
        edges = [(u, v) for u, peers in up.items() for v in peers if u in up.get(v, ()) and (u, v) in links]
        sources = sorted({s for _, s, _ in pending if s in index})
        if edges and sources:
            w = [links[(u, v)] + processing.get(v, 0.0) for u, v in edges]
            graph = csr_matrix((np.array(w), ([index[u] for u, _ in edges], [index[v] for _, v in edges])),
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
            if kind == "peer_up" and peer is not None:
                up.setdefault(relay, set()).add(peer)
            elif kind == "peer_down" and peer is not None:
                up.get(relay, set()).discard(peer)
            elif kind in ("relay_down", "relay_up"):
                up.pop(relay, None)  # a failed or restarted relay holds no links
    flush()
    return out
