"""The discrete-event simulator: N shipped `inri.core.Engine`s over a modelled network.

The simulator never decides anything about routing: every decision is the engine's. It models only
the network (directed link latency, per-relay processing delay, loss, relay failures and rejoins,
partitions), the workload (registrations, pushes) and the clock.

Event loop: one queue of (time, seq, kind, a, b, payload), popped in (time, seq) order (EventQueue: a
calendar of 0.2 ms buckets, each sorted when reached). Engine timers are kept with one queue entry
per engine and lazy invalidation (an entry is stale when the engine's timer moved). Frames are passed
as message objects (no encoding on the hot path); gossip sizes come from the engine's trace rows.

Failure model: a failed relay stops handling anything; its neighbours learn of it only through the
engine's own keepalives (no oracle). A relay that rejoins starts with an empty engine (routes, views
and custody are lost, as after a crash without disk) but keeps its home store (tokens and mailboxes
are on disk); it reconnects to its original topology neighbours through the engine's membership.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import json
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from inri.core.api import Connect, CustodyReleased, Disconnect, Send, TraceLevel
from inri.core.engine import Engine
from inri.core.home import MemoryHomeStore
from inri.core.verify import CachingVerifier
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import PeerInfo, Registration
from simulations.adversary import Adversary, Ingress, RegSpammer, make_engine
from simulations.metrics import Collector, nearest_rank, shortest_latencies
from simulations.scenario import Scenario
from simulations.topology import Network, build
from simulations.tracewriter import TraceWriter

# event kinds (small ints: compared on every event)
_FRAME, _TIMER, _LINK_UP, _CONNECT_FAIL, _REGISTER, _PUSH, _FAIL, _REJOIN, _PARTITION, _ARRIVE, _SERVED = range(11)

SUMMARY_KINDS = frozenset(
    {
        "reg_originated", "route_set", "reg_dropped", "push_injected", "push_refused", "push_forwarded",
        "push_fallback", "push_delivered", "push_duplicate", "push_dropped", "push_retry", "push_settled",
        "receipt_forwarded", "route_error", "peer_up", "peer_down", "relay_down", "relay_up", "push_excluded",
        "peer_scored",
    }
)


class SimTracer:
    """The engines' tracer: feeds the metrics collector and, at its level, the trace writer.

    Engines always run at least at summary level so the summary can be computed even when nothing
    is written (trace level off).
    """

    def __init__(self, collector: Collector, writer: TraceWriter | None, level: TraceLevel) -> None:
        self.level = TraceLevel.FULL if level == TraceLevel.FULL else TraceLevel.SUMMARY
        self._collector = collector
        self._writer = writer if level != TraceLevel.OFF else None
        self._full = level == TraceLevel.FULL
        self.scored: list[tuple[str, str, str]] = []  # (relay, cut peer, reason): peer_scored rows

    def emit(self, t: float, relay: str, kind: str, *, msg: str | None = None, route: str | None = None,
             peer: str | None = None, hops: int | None = None, ttl: int | None = None,
             epoch: int | None = None, count: int | None = None, nbytes: int | None = None,
             reason: str | None = None) -> None:
        """Record one event."""
        self.emit_row((t, relay, kind, msg, route, peer, hops, ttl, epoch, count, nbytes, reason))

    def emit_row(self, row: tuple) -> None:
        """Record one row given in trace column order."""
        if row[2] == "route_set":  # the hottest row (one per relay per registration): the short way
            self._collector.add_route_set(row)
            if self._writer is not None:
                self._writer.add(row)
            return
        summary = row[2] in SUMMARY_KINDS
        if summary:
            self._collector.add(row)
            if row[2] == "peer_scored":
                self.scored.append((row[1], row[5], row[11]))
        if self._writer is not None and (summary or self._full):
            self._writer.add(row)


class EventQueue:
    """The event queue: a calendar of buckets BUCKET_S wide, each sorted when the clock reaches it.

    Pops events in exactly the order of a heap of (time, seq, ...) tuples (a bucket is sorted by the
    same tuples; an event for the bucket being read is inserted in order), so runs and traces are
    the same as with `heapq`, at about half the cost per event: appending to a bucket and one C sort
    per bucket instead of a sift through a heap of ~100,000 entries. The run loop inlines `push` and
    `pop` (the hottest lines of the simulator); these methods are the reference for them.
    """

    BUCKET_S = 0.0002

    __slots__ = ("inv", "buckets", "keys", "cur", "pos", "cur_key")

    def __init__(self) -> None:
        self.inv = 1.0 / self.BUCKET_S
        self.buckets: dict[int, list[tuple]] = {}
        self.keys: list[int] = []  # heap of the keys of non-empty buckets not yet read
        self.cur: list[tuple] = []  # the bucket being read, sorted
        self.pos = 0  # next event of cur
        self.cur_key = -1

    def push(self, ev: tuple) -> None:
        """Add an event (ev[0] is its time; never earlier than the last event popped)."""
        k = int(ev[0] * self.inv)
        if k == self.cur_key:
            bisect.insort(self.cur, ev, lo=self.pos)
            return
        b = self.buckets.get(k)
        if b is None:
            self.buckets[k] = [ev]
            heapq.heappush(self.keys, k)
        else:
            b.append(ev)

    def pop(self) -> tuple | None:
        """The earliest event, or None when the queue is empty."""
        if self.pos < len(self.cur):
            self.pos += 1
            return self.cur[self.pos - 1]
        if not self.keys:
            return None
        self.cur_key = heapq.heappop(self.keys)
        self.cur = self.buckets.pop(self.cur_key)
        self.cur.sort()
        self.pos = 1
        return self.cur[0]

    def __len__(self) -> int:
        return len(self.cur) - self.pos + sum(len(b) for b in self.buckets.values())


@dataclass
class PushPlan:
    """One scheduled push."""

    t: float
    reg_index: int
    inject: int
    token: bytes
    push_id: str | None = None  # hex, once injected
    client: str = ""  # the home app (its rate-limit key at a relay's API)


@dataclass
class Result:
    """The run's summary (the CLI's last line) and where the trace went."""

    summary: dict[str, object]
    trace_dir: Path | None = None
    extra: dict[str, object] = field(default_factory=dict)


class Simulator:
    """Runs one scenario with one seed."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        seed: int | None = None,
        trace_dir: Path | None = None,
        trace_level: TraceLevel | None = None,
        trace_format: str = "parquet",
        progress: bool = False,
        adversaries: bool = True,
    ) -> None:
        self.sc = scenario
        self.hostile_on = adversaries
        self.seed = scenario.seed if seed is None else seed
        self.level = scenario.trace_level if trace_level is None else trace_level
        self.progress = progress
        root = random.Random(self.seed)
        # One generator per purpose, so adding randomness to one does not shift another.
        self.rng_topo = random.Random(root.getrandbits(64))
        self.rng_work = random.Random(root.getrandbits(64))
        self.rng_loss = random.Random(root.getrandbits(64))
        self.rng_churn = random.Random(root.getrandbits(64))
        self.rng_engine_seed = root.getrandbits(64)
        self.rng_links = random.Random(root.getrandbits(64))
        self.rng_adv = random.Random(root.getrandbits(64))
        self.net: Network = build(scenario.topology, self.rng_topo)
        n = self.net.n
        self._plan_roles()
        self.names = [str(i) for i in range(n)]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.collector = Collector(n, scenario.deadline_s, scenario.coverage_after_s)
        self.trace_dir = trace_dir
        self.writer = TraceWriter(trace_dir, trace_format) if trace_dir is not None else None
        self.tracer = SimTracer(self.collector, self.writer, self.level)
        self.verifier = CachingVerifier(max_entries=1_000_000)
        self.homes = [MemoryHomeStore() for _ in range(n)]
        self.alive = [True] * n
        # live links (either direction): latency per direction; starts as the topology
        self.lat: list[dict[int, float]] = [{} for _ in range(n)]
        for (u, v), lat in self.net.latency.items():
            self.lat[u][v] = lat
        self.adjacent = [sorted(self.lat[u]) for u in range(n)]  # the topology's own links
        self.cut: set[tuple[int, int]] = set()
        self.q = EventQueue()
        self.seq = 0
        self.engines: list[Engine] = [self._new_engine(i) for i in range(n)]
        self.timer_at = [math.inf] * n
        self.events = 0
        self.lost = 0
        self.now = 0.0
        self.regs: list[tuple[int, Registration | None, object]] = []  # (home, registration, key)
        self.reg_tokens: list[list[bytes]] = []
        self.pushes: list[PushPlan] = []
        self.custody_final: dict[bytes, str] = {}
        self._window: list[PushPlan] = []  # injected pushes whose life is not over (exclusion checks)
        self._components: list[int] | None = None

    # -- setup ----------------------------------------------------------------------------------
    def _plan_roles(self) -> None:
        """Which relays are hostile (and how), which relay a push spammer targets. Fixed by the seed
        whether or not adversaries are switched on, so a run without them is the exact comparison."""
        n = self.net.n
        self.role: list[Adversary | None] = [None] * n
        self.spam_adv: Adversary | None = None
        self.victim = -1
        rng = self.rng_adv
        free = list(range(n))
        rng.shuffle(free)
        for a in self.sc.adversaries:
            if a.kind == "push_spammer":
                self.spam_adv = a
                continue
            for i in free[: a.count or int(round(a.fraction * n))]:
                self.role[i] = a
            free = free[a.count or int(round(a.fraction * n)):]
        self.honest = [i for i in range(n) if self.role[i] is None]
        if self.spam_adv is not None:
            self.victim = free[0]
        if self.hostile_on:
            for i in range(n):
                a = self.role[i]
                if a is not None and a.kind in ("rushing", "forger"):
                    self.net.processing[i] = 0.0  # rushing: forwards at once

    def _new_engine(self, i: int) -> Engine:
        a = self.role[i]
        kwargs = {"relay_id": self.names[i], "config": self.sc.engine, "verifier": self.verifier,
                  "home": self.homes[i], "tracer": self.tracer,
                  "rng": random.Random(self.rng_engine_seed + i * 7919 + self.seq), "listen_addr": self.names[i]}
        if a is not None and self.hostile_on:
            return make_engine(a.kind, a, self.rng_engine_seed ^ (i * 104729 + self.seq), **kwargs)
        return Engine(**kwargs)  # type: ignore[arg-type]

    def _schedule(self, t: float, kind: int, a: int, b: int, payload: object) -> None:
        self.seq += 1
        self.q.push((t, self.seq, kind, a, b, payload))

    def _plan_workload(self) -> None:
        w = self.sc.workload
        rng = self.rng_work
        n = self.net.n
        honest = self.honest
        everyone = len(honest) == n
        for r in range(w.registrations):
            t = rng.uniform(w.registration_start_s, w.registration_end_s)
            home = rng.randrange(n) if everyone else honest[rng.randrange(len(honest))]
            if w.rotate and r % 2:
                home = self.regs[r - 1][0]
            key = new_signing_key(rng.randbytes(32))
            tokens = [rng.randbytes(16) for _ in range(w.tokens_per_registration)]
            self._schedule(t, _REGISTER, home, r, (1, tokens))
            self.regs.append((home, None, key))
            self.reg_tokens.append(tokens)
            if w.refresh_interval_s > 0:
                k = 1
                while t + k * w.refresh_interval_s < self.sc.duration_s:
                    self._schedule(t + k * w.refresh_interval_s, _REGISTER, home, r, (k + 1, []))
                    k += 1
        tokens_used = [0] * w.registrations
        for _ in range(w.pushes):
            t = rng.uniform(w.push_start_s, w.push_end_s)
            reg = rng.randrange(w.registrations)
            while tokens_used[reg] >= w.tokens_per_registration:
                reg = (reg + 1) % w.registrations
            token = self.reg_tokens[reg][tokens_used[reg]]
            tokens_used[reg] += 1
            plan = PushPlan(t, reg, rng.randrange(n) if everyone else honest[rng.randrange(len(honest))], token,
                            client=f"app{reg}")
            self.pushes.append(plan)
            if self.spam_adv is not None and self.rng_adv.random() < self.spam_adv.honest_share:
                plan.inject = self.victim  # through the relay under spam: queued at its API first
                self._schedule(t, _ARRIVE, self.victim, len(self.pushes) - 1, None)
            else:
                self._schedule(t, _PUSH, plan.inject, len(self.pushes) - 1, None)

    def _plan_churn(self) -> None:
        c = self.sc.churn
        n = self.net.n
        count = int(round(c.fail_fraction * n))
        if count <= 0:
            return
        victims = self.rng_churn.sample(range(n), count)
        rejoin = set(victims[: int(round(c.rejoin_fraction * count))])
        for v in victims:
            t = self.rng_churn.uniform(c.start_s, c.end_s)
            self._schedule(t, _FAIL, v, 0, None)
            if v in rejoin and t + c.downtime_s < self.sc.duration_s:
                self._schedule(t + c.downtime_s, _REJOIN, v, 0, None)

    def _plan_partitions(self) -> None:
        for p in self.sc.partitions:
            self._schedule(p.start_s, _PARTITION, 1, 0, p)
            self._schedule(p.end_s, _PARTITION, 0, 0, p)

    def _start_spam(self) -> None:
        """The push spammer: a home app with its own registered device, pushing through the victim."""
        a = self.spam_adv
        if a is None:
            return
        cfg = self._api_limits()
        self.ingress = Ingress(a, *cfg, clock=lambda: self.now)
        self.victim_plans: list[int] = []
        self._in_service: tuple[str, tuple] | None = None
        home = self.honest[self.rng_adv.randrange(len(self.honest))]
        self.spam_reg = make_registration(new_signing_key(self.rng_adv.randbytes(32)), 1, 0,
                                          int(self.sc.duration_s * 4) + 3600)
        self.homes[home].add_registration(self.spam_reg, [])
        self._apply(home, self.engines[home].register(self.spam_reg, 0.0))
        if self.hostile_on and a.rate_x > 0:
            self._schedule(max(a.start_s, 0.0), _ARRIVE, self.victim, -1, None)

    @staticmethod
    def _api_limits() -> tuple[tuple[float, int], tuple[float, int], tuple[float, int]]:
        from inri.node.config import ApiSection  # the daemon's documented defaults

        api = ApiSection()
        return ((api.rate_per_s, api.rate_burst), (api.device_rate_per_s, api.device_rate_burst),
                (api.token_rate_per_s, api.token_rate_burst))

    def _arrive(self, b: int, t: float) -> None:
        ing = self.ingress
        if b < 0:  # spam: a Poisson stream at rate_x times the API's capacity
            a = self.spam_adv
            assert a is not None
            ing.arrive("spammer", ("spam", b))
            nxt = t + self.rng_adv.expovariate(a.rate_x * a.capacity_per_s)
            if nxt < min(a.end_s, self.sc.duration_s):
                self._schedule(nxt, _ARRIVE, self.victim, -1, None)
        else:
            self.victim_plans.append(b)
            if not ing.arrive(self.pushes[b].client, ("honest", b)):
                self.pushes[b].push_id = None
        if not ing.busy:
            self._serve(t)

    def _serve(self, t: float) -> None:
        """Start serving the next waiting request at the victim's API (round robin over clients)."""
        ing = self.ingress
        nxt = ing.next_request()
        self._in_service = nxt
        if nxt is None:
            ing.busy = False
            return
        ing.busy = True
        client, (kind, b) = nxt
        if kind == "spam":
            ok = ing.admit(client, self.spam_reg.route_id, self.rng_adv.randbytes(16))
        else:
            plan = self.pushes[b]
            ok = ing.admit(client, self.regs[plan.reg_index][1].route_id if self.regs[plan.reg_index][1] else b"",
                           plan.token)
        self._in_service = (client, (kind, b, ok))  # type: ignore[assignment]
        self._schedule(t + ing.service * (1.0 if ok else ing.a.reject_cost), _SERVED, self.victim, 0, None)

    def _served(self, t: float) -> None:
        """The request in service is done: an accepted push enters the relay's engine now."""
        done = self._in_service
        if done is not None:
            client, (kind, b, ok) = done  # type: ignore[misc]
            if ok and self.alive[self.victim]:
                eng = self.engines[self.victim]
                if kind == "spam":
                    res = eng.inject_push(self.spam_reg, self.rng_adv.randbytes(16), b"spam", t)
                    if res.push_id is not None:  # not an honest push: outside every delivery figure
                        self.tracer.emit(t, self.names[self.victim], "push_excluded", msg=res.push_id.hex(),
                                         reason="adversary")
                    self._apply(self.victim, res.effects)
                else:
                    self._control(_PUSH, self.victim, b, None, t)
                self._rearm(self.victim)
        self._serve(t)

    def _start_links(self) -> None:
        for i, eng in enumerate(self.engines):
            eng.add_candidates([PeerInfo(self.names[v], self.names[v]) for v in sorted(self.lat[i])], 0.0)
        for u, v in self.net.undirected_edges():
            self._link_up(u, v, 0.0)
        for i, eng in enumerate(self.engines):
            self._apply(i, eng.start(0.0))

    def _link_up(self, a: int, b: int, t: float) -> None:
        """a dialled b: both engines learn of the link unless a refuses it (then b never sees it)."""
        nb = self.names[b]
        effects = self.engines[a].peer_up(nb, t, outbound=True, addr=nb)
        refused = any(type(e) is Disconnect and e.peer == nb for e in effects)
        self._apply(a, [e for e in effects if not (type(e) is Disconnect and e.peer == nb)])
        if not refused:
            self._apply(b, self.engines[b].peer_up(self.names[a], t, outbound=False, addr=self.names[a]))

    # -- effects --------------------------------------------------------------------------------
    def _apply(self, src: int, effects: list) -> None:
        for eff in effects:
            t = type(eff)
            if t is Send:
                dst = self.index[eff.peer]
                lat = self.lat[src].get(dst)
                if lat is None or (src, dst) in self.cut:
                    self.lost += 1
                    continue
                if self.sc.loss and self.rng_loss.random() < self.sc.loss:
                    self.lost += 1
                    continue
                self.seq += 1
                self.q.push((self.now + eff.delay + lat + self.net.processing[dst], self.seq, _FRAME, src, dst,
                             eff.msg))
            elif t is Connect:
                dst = self.index.get(eff.peer)
                if dst is None or not self.alive[dst] or dst == src or (src, dst) in self.cut:
                    self._schedule(self.now + self.sc.engine.connect_timeout_s, _CONNECT_FAIL, src, dst or 0, eff.peer)
                    continue
                if dst not in self.lat[src]:
                    a, b = self.net.link_latency(src, dst, self.rng_links, self.sc.topology)
                    self.lat[src][dst] = a
                    self.lat[dst][src] = b
                    if self._components is not None and self._components[src] != self._components[dst]:
                        self._components = None  # a new link may join two components
                self._schedule(self.now + self.lat[src][dst] * 2, _LINK_UP, src, dst, None)
            elif t is Disconnect:
                dst = self.index.get(eff.peer)
                if dst is not None and self.alive[dst]:
                    # The remote learns the reason (a QUIC close carries it): "full" and "score" are
                    # not re-dialled, a lost link is.
                    self._apply(dst, self.engines[dst].peer_down(self.names[src], self.now, eff.reason))
                    self._rearm(dst)
            elif t is CustodyReleased:
                self.custody_final[eff.push_id] = eff.status

    def _rearm(self, i: int) -> None:
        t = self.engines[i].get_timer()
        if t is not None and t < self.timer_at[i]:
            self.timer_at[i] = t
            self.seq += 1
            self.q.push((t, self.seq, _TIMER, i, 0, None))

    # -- exclusion (true topology) ----------------------------------------------------------------
    def _component_labels(self) -> list[int]:
        if self._components is None:
            n = self.net.n
            label = [-1] * n
            for s in range(n):
                if label[s] != -1 or not self.alive[s]:
                    continue
                label[s] = s
                stack = [s]
                while stack:
                    u = stack.pop()
                    for v in self.lat[u]:
                        if label[v] == -1 and self.alive[v] and (u, v) not in self.cut:
                            label[v] = s
                            stack.append(v)
            self._components = label
        return self._components

    def _split_by_loss(self, x: int) -> bool:
        """Relay x just failed: may that have split its component? False once a search from each of
        its live neighbours (avoiding x) has met every other one, which in a mesh takes a few hundred
        steps instead of labelling all relays again; True (relabel) when one search runs dry or the
        searches grow past a budget."""
        lat, alive, cut = self.lat, self.alive, self.cut
        nbrs = [v for v in lat[x] if alive[v] and not (cut and (x, v) in cut)]
        if len(nbrs) <= 1:
            return False
        owner = {v: i for i, v in enumerate(nbrs)}  # relay -> the search that reached it first
        parent = list(range(len(nbrs)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        frontier: dict[int, list[int]] = {i: [v] for i, v in enumerate(nbrs)}
        budget = max(2000, self.net.n // 20)
        while len(frontier) > 1:
            r = min(frontier, key=lambda k: len(frontier[k]))
            if not frontier[r] or len(owner) > budget:
                return True
            nxt: list[int] = []
            for u in frontier[r]:
                for v in lat[u]:
                    if v == x or not alive[v] or (cut and (u, v) in cut):
                        continue
                    o = owner.get(v)
                    if o is None:
                        owner[v] = r
                        nxt.append(v)
                        continue
                    o = find(o)
                    if o != r and o in frontier:
                        parent[o] = r
                        nxt += frontier.pop(o)
            frontier[r] = nxt
        return False

    def _check_window(self) -> None:
        """After a topology change: exclude live-window pushes whose home is down or cut off."""
        deadline = self.sc.deadline_s
        self._window = [p for p in self._window if p.t + deadline >= self.now and p.push_id is not None]
        if not self._window:
            return
        labels = self._component_labels()
        for p in self._window:
            self._maybe_exclude(p, labels)

    def _maybe_exclude(self, p: PushPlan, labels: list[int]) -> None:
        home = self.regs[p.reg_index][0]
        reason = None
        if not self.alive[home]:
            reason = "home_down"
        elif labels[p.inject] == -1 or labels[p.inject] != labels[home]:
            reason = "partitioned"
        if reason is not None and p.push_id is not None:
            self.tracer.emit(self.now, self.names[p.inject], "push_excluded", msg=p.push_id, reason=reason)
            p.push_id = None  # excluded once; dropped from the window at the next check

    # -- run ------------------------------------------------------------------------------------
    def run(self) -> Result:
        """Run the scenario to its end; returns the summary.

        Python's cyclic garbage collector is paused for the run: the loop allocates tens of millions of
        short-lived, acyclic objects (frames, effects, rows) while the engines hold millions of long-
        lived ones, and every full collection would walk all of them (measured: the run slows down as
        the route tables grow). Reference counting still frees everything the loop drops.
        """
        gc_was_enabled = gc.isenabled()
        gc.collect()
        gc.freeze()
        gc.disable()
        try:
            return self._run()
        finally:
            gc.unfreeze()
            if gc_was_enabled:
                gc.enable()

    def _run(self) -> Result:
        wall0 = time.perf_counter()
        self._plan_workload()
        self._plan_churn()
        self._plan_partitions()
        self._start_links()
        self._start_spam()
        for i in range(self.net.n):
            self._rearm(i)
        end = self.sc.duration_s
        cal = self.q
        inv = cal.inv
        buckets = cal.buckets
        keys = cal.keys
        insort = bisect.insort
        engines = self.engines
        names = self.names
        alive = self.alive
        timer_at = self.timer_at
        processing = self.net.processing
        lat = self.lat
        index = self.index
        cut = self.cut
        loss = self.sc.loss
        rand = self.rng_loss.random
        heappush, heappop = heapq.heappush, heapq.heappop
        events = 0
        bar = _Progress(end, self.progress)
        while True:
            # EventQueue.pop, inlined
            if cal.pos < len(cal.cur):
                ev = cal.cur[cal.pos]
                cal.pos += 1
            elif keys:
                k = cal.cur_key = heappop(keys)
                cur = cal.cur = buckets.pop(k)
                cur.sort()
                ev = cur[0]
                cal.pos = 1
            else:
                break
            t = ev[0]
            if t > end:
                break
            self.now = t
            kind = ev[2]
            a = ev[3]
            events += 1
            if kind == _FRAME:
                dst = ev[4]
                if not alive[dst]:
                    continue
                eng = engines[dst]
                effects = eng.receive_message(names[a], ev[5], t)
                if effects:
                    # inline fast path for the common case: only Sends
                    for eff in effects:
                        if type(eff) is Send:
                            to = index[eff.peer]
                            la = lat[dst].get(to)
                            if la is None or (cut and (dst, to) in cut) or (loss and rand() < loss):
                                self.lost += 1
                                continue
                            self.seq += 1
                            # EventQueue.push, inlined (a frame is rarely due in the bucket being read)
                            fe = (t + eff.delay + la + processing[to], self.seq, _FRAME, dst, to, eff.msg)
                            k = int(fe[0] * inv)
                            b = buckets.get(k)
                            if b is not None:
                                b.append(fe)
                            elif k == cal.cur_key:
                                insort(cal.cur, fe, lo=cal.pos)
                            else:
                                buckets[k] = [fe]
                                heappush(keys, k)
                        else:
                            self._apply(dst, [eff])
                nt = eng.get_timer()
                if nt is not None and nt < timer_at[dst]:
                    timer_at[dst] = nt
                    self.seq += 1
                    cal.push((nt, self.seq, _TIMER, dst, 0, None))
            elif kind == _TIMER:
                if not alive[a] or timer_at[a] != t:
                    continue
                timer_at[a] = math.inf
                self._apply(a, engines[a].handle_timer(t))
                self._rearm(a)
            else:
                self._control(kind, a, ev[4], ev[5], t)
            if events & 0xFFFF == 0:
                bar.update(t, events)
        bar.close()
        self.events = events
        wall = time.perf_counter() - wall0
        return self._finish(wall)

    def _control(self, kind: int, a: int, b: int, payload: object, t: float) -> None:
        eng = self.engines[a]
        if kind == _LINK_UP:
            if self.alive[a] and self.alive[b] and (a, b) not in self.cut:
                self._link_up(a, b, t)
                self._rearm(b)
            elif self.alive[a]:
                self._apply(a, eng.connect_failed(self.names[b], t))
            self._rearm(a)
        elif kind == _CONNECT_FAIL:
            if self.alive[a]:
                self._apply(a, eng.connect_failed(str(payload), t))
                self._rearm(a)
        elif kind == _REGISTER:
            epoch, tokens = payload  # type: ignore[misc]
            home, _, key = self.regs[b]
            reg = make_registration(key, epoch, int(t), int(self.sc.duration_s * 4) + 3600)
            self.regs[b] = (home, reg, key)
            self.homes[home].add_registration(reg, tokens)
            if self.alive[home]:
                self._apply(home, eng.register(reg, t))
                self._rearm(home)
        elif kind == _PUSH:
            plan = self.pushes[b]
            home, reg, _ = self.regs[plan.reg_index]
            if reg is None:
                return  # not registered yet: the home app has no credential to push with
            if not self.alive[a]:
                # The home app's relay is down: like a real app it tries the next relay on its list.
                n = self.net.n
                nxt = next((i % n for i in range(a + 1, a + 1 + n) if self.alive[i % n]), None)
                if nxt is None:
                    return
                a = plan.inject = nxt
                eng = self.engines[a]
            result = eng.inject_push(reg, plan.token, b"sealed-payload", t, push_id=self._push_id(b))
            if result.push_id is not None:
                plan.push_id = result.push_id.hex()
                self._window.append(plan)
                self._maybe_exclude(plan, self._component_labels())
            self._apply(a, result.effects)
            self._rearm(a)
        elif kind == _FAIL:
            if not self.alive[a]:
                return
            self.alive[a] = False
            self.tracer.emit(t, self.names[a], "relay_down", reason="churn")
            if self._components is not None and not self._split_by_loss(a):
                self._components[a] = -1
            else:
                self._components = None
            self._check_window()
        elif kind == _REJOIN:
            self.alive[a] = True
            self.tracer.emit(t, self.names[a], "relay_up", reason="churn")
            self.engines[a] = fresh = self._new_engine(a)
            self.timer_at[a] = math.inf
            original = self.adjacent[a]
            self._apply(a, fresh.add_candidates([PeerInfo(self.names[v], self.names[v]) for v in original], t))
            self._apply(a, fresh.start(t))
            self._rearm(a)
            labels = self._components
            if labels is not None:  # a relay coming back joins its neighbours' component (or merges several)
                near = {labels[v] for v in self.lat[a] if self.alive[v] and not (self.cut and (a, v) in self.cut)}
                if len(near) <= 1:
                    labels[a] = near.pop() if near else self.net.n + a  # a label no search gives
                else:
                    self._components = None
        elif kind == _ARRIVE:
            self._arrive(b, t)
        elif kind == _SERVED:
            self._served(t)
        elif kind == _PARTITION:
            p = payload
            side = int(p.fraction * self.net.n)  # type: ignore[attr-defined]
            edges = {(u, v) for u in range(self.net.n) for v in self.lat[u] if (u < side) != (v < side)}
            if a:
                self.cut |= edges
                self._components = None
                self._check_window()
            else:
                self.cut -= edges
                self._components = None

    def _adversary_summary(self) -> dict[str, object]:
        """Figures of an adversarial scenario (docs/metrics.md, "Adversarial scenarios")."""
        out: dict[str, object] = {"adversaries_on": self.hostile_on}
        kinds: dict[str, int] = {}
        for a in self.role:
            if a is not None:
                kinds[a.kind] = kinds.get(a.kind, 0) + 1
        out["hostile_relays"] = kinds
        hostile = {self.names[i] for i in range(self.net.n) if self.role[i] is not None}
        honest_cuts = [(r, p) for r, p, _ in self.tracer.scored if r not in hostile]
        out["cuts_of_hostile"] = sum(1 for _, p in honest_cuts if p in hostile)
        out["cuts_of_honest"] = sum(1 for _, p in honest_cuts if p not in hostile)
        honest_names = {self.names[i] for i in self.honest}
        out["hostile_isolated"] = sum(
            1 for h in hostile if not honest_names & set(self.engines[self.index[h]].active_peers()))
        # Route vectors whose primary next hop is hostile, over honest live relays and honest routes.
        routes = [reg.route_id for _, reg, _ in self.regs if reg is not None]
        primary = hostile_primary = 0
        for i in self.honest:
            if not self.alive[i]:
                continue
            eng = self.engines[i]
            for rid in routes:
                hops = eng.next_hops(rid)
                if hops:
                    primary += 1
                    hostile_primary += hops[0][0] in hostile
        out["primary_via_hostile"] = hostile_primary / primary if primary else None
        spam_routes: set[bytes] = set()
        for i in range(self.net.n):
            eng = self.engines[i]
            if isinstance(eng, RegSpammer):
                spam_routes |= eng.spam_routes
        if any(a.kind in ("reg_spammer", "forger") for a in self.sc.adversaries):
            out["spam_frames_sent"] = sum(getattr(self.engines[i], "spam_sent", 0) for i in range(self.net.n))
        if spam_routes:
            cached = [sum(1 for r in spam_routes if self.engines[i].route_epoch(r) is not None)
                      for i in self.honest if self.alive[i]]
            out["spam_registrations"] = len(spam_routes)
            out["spam_routes_cached_max"] = max(cached) if cached else 0
            out["spam_routes_cached_mean"] = round(sum(cached) / len(cached), 1) if cached else 0
        if self.spam_adv is not None:
            ing = self.ingress
            lat: list[float] = []
            lost = 0
            for b in self.victim_plans:
                plan = self.pushes[b]
                got = self.collector.delivered.get(plan.push_id) if plan.push_id else None
                if got is None or got[0] - plan.t > self.sc.deadline_s:
                    lost += 1
                else:
                    lat.append(got[0] - plan.t)
            lat.sort()
            out.update({
                "victim_honest_pushes": len(self.victim_plans),
                "victim_honest_lost": lost,
                "victim_latency_p50_s": nearest_rank(lat, 0.5),
                "victim_latency_p99_s": nearest_rank(lat, 0.99),
                "spam_offered": ing.offered["spam"],
                "spam_accepted": ing.accepted["spam"],
                "spam_refused": ing.refused["spam"],
                "spam_unsent": ing.unsent,
                "honest_refused": ing.refused["honest"],
            })
        return out

    def _push_id(self, b: int) -> bytes:
        return random.Random(self.seed * 1_000_003 + b).randbytes(16)

    def _finish(self, wall: float) -> Result:
        n = self.net.n
        pairs = {(p.inject, self.regs[p.reg_index][0]) for p in self.pushes}
        dist_idx = shortest_latencies(n, self.net.latency, self.net.processing, pairs)
        distance = {(self.names[u], self.names[v]): d for (u, v), d in dist_idx.items()}
        summary = self.collector.summary(distance)
        if self.sc.adversaries:
            summary.update(self._adversary_summary())
        summary.update(
            {
                "events": self.events,
                "events_per_s": round(self.events / wall, 1) if wall > 0 else None,
                "wall_s": round(wall, 3),
                "frames_lost": self.lost,
                "signature_checks": self.verifier.checks,
                "seed": self.seed,
                "scenario": self.sc.name,
                "trace_level": self.level.name.lower(),
            }
        )
        if self.writer is not None:
            meta = {
                "schema": 1,
                "source": "sim",
                "relays": n,
                "deadline_s": self.sc.deadline_s,
                "coverage_after_s": self.sc.coverage_after_s,
                "seed": self.seed,
                "scenario": self.sc.name,
                "summary": summary,
            }
            self.writer.close(meta, self.net)
        return Result(summary, self.trace_dir)


class _Progress:
    """A tqdm bar over virtual time on stderr (only when asked and stderr is a terminal or forced)."""

    def __init__(self, total: float, enabled: bool) -> None:
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=round(total, 1), unit="sim-s", file=sys.stderr, mininterval=1.0,
                             bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} sim-s [{elapsed}<{remaining}] {postfix}")
        self._last = 0.0

    def update(self, t: float, events: int) -> None:
        if self._bar is not None and t > self._last:
            self._bar.update(round(t - self._last, 3))
            self._bar.set_postfix_str(f"{events:,} events", refresh=False)
            self._last = t

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def run_scenario(scenario: Scenario, **kwargs: object) -> Result:
    """Convenience: build a Simulator and run it."""
    return Simulator(scenario, **kwargs).run()  # type: ignore[arg-type]


def summary_line(result: Result) -> str:
    """The CLI's last line: the summary as one JSON object."""
    return json.dumps(result.summary, sort_keys=True)


ProgressHook = Callable[[float, int], None]
