"""`kind = "built"`: a mesh formed the way relays form it, by the shipped code.

Relays (uniform on a unit square, like `geographic`) join one by one over JOIN_WINDOW_S. Each has a
coarse geo hint ("lat,lon", one decimal: the square maps onto 35..60 N, 10 W..30 E) and an IPv4
address whose /24 is shared with the relays of its grid cell (a hosting provider's block, about
PER_PREFIX relays). On joining, a relay announces itself to a bootstrap and asks for PEERS_ASKED
candidates: the answer is `bootstrap_nodes.ranking.rank` (same prefix first, then by geo distance,
ceil(count/2) of them; the rest at random) and goes to the engine's `add_candidates(..., near=...)`
as the relay daemon passes it (inri/node/relay.py). Like the daemon, a relay below `active_max`
asks again after 2 s, 4 s, ... (reset whenever its number of neighbours changed), capped at 60 s.

Everything else is the engine's own membership (inri/core/membership.py, rules M1-M5): the active and
passive views, who to dial, refusals when full, priority joins (M4) and peer exchange, with Hello and
PeerExchange frames delivered after the modelled latency. Keepalives are not modelled (no relay fails
during formation). After SETTLE_S more seconds the mutual active views are the mesh.

The bootstrap's index: ranking 10,000 candidates for each of tens of thousands of requests would take
hours in Python, so `rank` is given the candidates that can rank first (the asker's prefix and its
grid neighbourhood's LOCAL_POOL nearest: a superset of the nearest half) plus a uniform sample of
RANDOM_POOL other announced relays. The nearest half is then exact; the random half is uniform but
for the few local leftovers of the neighbourhood.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field, replace

from inri.common.ranking import Candidate, prefix_of, rank
from inri.core.api import Connect, CustodyReleased, CustodyTaken, Delivered, Disconnect, DisconnectReason, Effect, Send
from inri.core.config import EngineConfig
from inri.core.engine import Engine
from inri.core.home import MemoryHomeStore
from inri.core.trace import NullTracer
from inri.core.verify import CachingVerifier
from inri.protocol.messages import Hello, PeerExchange, PeerInfo

JOIN_WINDOW_S = 60.0
SETTLE_S = 120.0
PEERS_ASKED = 16  # as inri/node/relay.py asks
PEERS_RETRY_S = 2.0
PEERS_INTERVAL_S = 60.0
PER_PREFIX = 8
RANDOM_POOL = 48
LOCAL_POOL = 16  # nearest relays of the grid neighbourhood handed to rank (it picks 8 of them)

_JOIN, _ASK, _UP, _FRAME, _DOWN = range(5)


@dataclass
class BuildReport:
    """What formation did: printed in the run's summary (`topology_built`)."""

    asks: int = 0
    dials: int = 0
    refused: int = 0
    frames: int = 0
    one_sided: int = 0  # links one side counted active and the other not at the end (dropped)
    events: int = 0
    extra: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, int]:
        return {"asks": self.asks, "dials": self.dials, "refused": self.refused, "frames": self.frames,
                "one_sided": self.one_sided, **dict(sorted(self.extra.items()))}


def geo_hint(pos: tuple[float, float]) -> str:
    x, y = pos
    return f"{35.0 + 25.0 * y:.1f},{-10.0 + 40.0 * x:.1f}"


def built_edges(
    n: int,
    positions: list[tuple[float, float]],
    config: EngineConfig,
    rng: random.Random,
    *,
    ranked: bool = True,
) -> tuple[set[tuple[int, int]], BuildReport]:
    """Form the mesh; returns undirected edges (low, high) and a report.

    `ranked=False` hands the bootstrap's answer to the engine without the nearest-first count (the
    membership of before rule M5: a random choice among the candidates).
    """
    # Keepalives are not modelled: a timer every 30 s is enough for refills, probation and exchange.
    cfg = replace(config, keepalive_interval_s=max(config.keepalive_interval_s, 5.0), keepalive_misses=10**6,
                  stem=False)
    cells = max(1, int(math.sqrt(n / PER_PREFIX)))
    grid: dict[tuple[int, int], list[int]] = {}
    cell_of: list[tuple[int, int]] = []
    for i, (x, y) in enumerate(positions):
        c = (min(cells - 1, int(x * cells)), min(cells - 1, int(y * cells)))
        cell_of.append(c)
        grid.setdefault(c, []).append(i)
    addr: list[str] = [""] * n
    for (cx, cy), members in grid.items():
        block = cx * cells + cy
        for k, i in enumerate(members):
            addr[i] = f"10.{block // 256 % 256}.{block % 256}.{k % 254 + 1}:4433"
    names = [f"r{i}" for i in range(n)]
    index = {name: i for i, name in enumerate(names)}
    cands = [Candidate(names[i], addr[i], prefix_of(addr[i].rpartition(":")[0]), geo_hint(positions[i]))
             for i in range(n)]
    verifier = CachingVerifier()
    tracer = NullTracer()
    engines = [Engine(names[i], cfg, verifier=verifier, home=MemoryHomeStore(), tracer=tracer,
                      rng=random.Random(rng.getrandbits(64)), listen_addr=names[i]) for i in range(n)]
    joined = [False] * n
    announced: list[int] = []
    announced_in: dict[tuple[int, int], list[int]] = {}
    links: set[tuple[int, int]] = set()  # directed: u has a transport link to v
    report = BuildReport()
    q: list[tuple[float, int, int, int, int, object]] = []
    seq = 0
    timer_at = [math.inf] * n
    ask_delay = [PEERS_RETRY_S] * n
    last_active = [0] * n

    def push(t: float, kind: int, a: int, b: int, payload: object = None) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(q, (t, seq, kind, a, b, payload))

    def delay(u: int, v: int) -> float:
        (x1, y1), (x2, y2) = positions[u], positions[v]
        return 0.002 + math.hypot(x1 - x2, y1 - y2) * 0.150

    def rearm(i: int) -> None:
        t = engines[i].get_timer()
        if t is not None and t < timer_at[i]:
            timer_at[i] = t
            push(t, -1, i, i)

    def apply(i: int, effects: list[Effect], now: float) -> None:
        for eff in effects:
            if type(eff) is Send:
                if isinstance(eff.msg, (Hello, PeerExchange)):
                    j = index[eff.peer]
                    if (i, j) in links:
                        report.frames += 1
                        push(now + delay(i, j), _FRAME, i, j, eff.msg)
            elif type(eff) is Connect:
                j = index[eff.peer]
                report.dials += 1
                push(now + 2 * delay(i, j), _UP, i, j)
            elif type(eff) is Disconnect:
                j = index[eff.peer]
                if (i, j) in links:
                    links.discard((i, j))
                    links.discard((j, i))
                    push(now + delay(i, j), _DOWN, i, j, eff.reason)
            elif type(eff) in (Delivered, CustodyReleased, CustodyTaken):
                pass
        rearm(i)

    def link_up(a: int, b: int, now: float) -> None:
        nb = names[b]
        effects = engines[a].peer_up(nb, now, outbound=True, addr=nb)
        refused = any(type(e) is Disconnect and e.peer == nb for e in effects)
        links.add((a, b))
        links.add((b, a))
        apply(a, [e for e in effects if not (type(e) is Disconnect and e.peer == nb)], now)
        if refused:
            links.discard((a, b))
            links.discard((b, a))
            report.refused += 1
            return
        apply(b, engines[b].peer_up(names[a], now, outbound=False, addr=names[a]), now)

    def answer(i: int) -> list[PeerInfo]:
        """The bootstrap's answer to relay i: the shipped ranking over its candidates."""
        cx, cy = cell_of[i]
        x, y = positions[i]
        block: list[tuple[float, int]] = []
        for gx in range(cx - 1, cx + 2):
            for gy in range(cy - 1, cy + 2):
                block += ((math.hypot(positions[j][0] - x, positions[j][1] - y), j)
                          for j in announced_in.get((gx, gy), ()))
        block.sort()
        pool = set(announced_in.get((cx, cy), ()))  # the asker's /24: ranked first whatever the distance
        pool.update(j for _, j in block[:LOCAL_POOL])
        if len(announced) > RANDOM_POOL:
            pool.update(rng.sample(announced, RANDOM_POOL))
        else:
            pool.update(announced)
        pool.discard(i)
        c = cands[i]
        chosen = rank([cands[j] for j in sorted(pool)], asker=c.node_id, asker_prefix=c.prefix, asker_geo=c.geo,
                      count=PEERS_ASKED, rng=rng)
        return [PeerInfo(x.node_id, x.node_id) for x in chosen]

    order = list(range(n))
    rng.shuffle(order)
    for k, i in enumerate(order):
        push(JOIN_WINDOW_S * k / n, _JOIN, i, i)
    end = JOIN_WINDOW_S + SETTLE_S
    while q:
        t, _, kind, a, b, payload = heapq.heappop(q)
        if t > end:
            break
        report.events += 1
        if kind == -1:
            if timer_at[a] != t:
                continue
            timer_at[a] = math.inf
            apply(a, engines[a].handle_timer(t), t)
        elif kind == _JOIN:
            joined[a] = True
            announced.append(a)
            announced_in.setdefault(cell_of[a], []).append(a)
            apply(a, engines[a].start(t), t)
            push(t, _ASK, a, a)
        elif kind == _ASK:
            report.asks += 1
            peers = answer(a)
            near = min(len(peers), (PEERS_ASKED + 1) // 2) if ranked else 0
            apply(a, engines[a].add_candidates(peers, t, near=near), t)
            active = len(engines[a].active_peers())
            if active != last_active[a]:
                ask_delay[a] = PEERS_RETRY_S
            last_active[a] = active
            if active < cfg.active_max:
                d = ask_delay[a]
                ask_delay[a] = min(PEERS_INTERVAL_S, d * 2)
                push(t + d * (0.5 + rng.random() / 2), _ASK, a, a)
            else:
                push(t + PEERS_INTERVAL_S, _ASK, a, a)
        elif kind == _UP:
            if joined[b]:
                link_up(a, b, t)
            else:
                apply(a, engines[a].connect_failed(names[b], t), t)
        elif kind == _FRAME:
            if (a, b) in links:
                assert isinstance(payload, (Hello, PeerExchange))
                apply(b, engines[b].receive_message(names[a], payload, t), t)
        elif kind == _DOWN:
            assert isinstance(payload, DisconnectReason)
            apply(b, engines[b].peer_down(names[a], t, payload), t)
    edges: set[tuple[int, int]] = set()
    for i in range(n):
        for p in engines[i].active_peers():
            j = index[p]
            if names[i] in engines[j].active_peers():
                edges.add((min(i, j), max(i, j)))
            else:
                report.one_sided += 1
    for i in range(n):
        for k2, v in engines[i].counters.items():
            if k2.startswith("peer_"):
                report.extra[k2] = report.extra.get(k2, 0) + v
    return edges, report
