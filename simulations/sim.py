"""The discrete-event simulator: N shipped `inri.core.Engine`s over a modelled network.

The simulator never decides anything about routing: every decision is the engine's. It models only
the network (directed link latency, per-relay processing delay, loss, relay failures and rejoins,
partitions), the workload (registrations, pushes) and the clock.

This module is the run loop and the effect interpreter; the rest lives by concern:

- events.py: the event queue (a calendar of 0.2 ms buckets popped in (time, seq) order) and the
  event kinds;
- workload.py: the random streams, hostile roles, registrations, pushes, churn and partitions,
  planned up front from the seed;
- ingress.py: the HTTP API of a relay under a push spammer;
- components.py: the live mesh's components, kept across churn, and the pushes they exclude;
- tracing.py, summary.py, progress.py: the engines' tracer, the run's summary, the progress bar.

Engine timers are kept with one queue entry per engine and lazy invalidation (an entry is stale when
the engine's timer moved). Frames are passed as message objects (no encoding on the hot path); gossip
sizes come from the engine's trace rows.

Failure model: a failed relay stops handling anything; its neighbours learn of it only through the
engine's own keepalives (no oracle). A relay that rejoins starts with an empty engine (routes and views
are lost, as after a crash) but keeps what the daemon keeps on disk: its home store (tokens and
mailboxes) and, with `[churn] durable_custody` (the default), the pushes it held in custody, which it
re-adopts as the daemon does at startup; it reconnects to its original topology neighbours through the
engine's membership.
"""

from __future__ import annotations

import bisect
import gc
import heapq
import math
import random
import time
from pathlib import Path
from typing import assert_never

from inri.core.api import Connect, CustodyReleased, CustodyTaken, Delivered, Disconnect, Effect, Send, TraceLevel
from inri.core.engine import Engine
from inri.core.home import MemoryHomeStore
from inri.core.verify import CachingVerifier
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key, receipt_public_key
from inri.protocol.messages import PeerInfo, Push
from simulations.adversary import make_engine, receipt_seed
from simulations.components import ComponentTracker, ExclusionWindow
from simulations.devices import Devices
from simulations.events import EventKind, EventQueue
from simulations.ingress import Ingress, Source
from simulations.linkmodel import UNACKED_PTOS, probe_timeout, retransmit_delay
from simulations.metrics import Collector
from simulations.progress import Progress
from simulations.scenario import Partition, Scenario
from simulations.stale import StaleSender
from simulations.summary import (
    Result,
    adversary_summary,
    cut_reasons,
    delivered_at,
    delivery_summary,
    fallback_summary,
    route_k2_share,
    scope_reach,
    score_penalties,
    summary_line,
)
from simulations.topology import Network, build
from simulations.tracewriter import TraceWriter
from simulations.tracing import SimTracer
from simulations.workload import PushPlan, Roles, Streams, Workload, plan_churn, plan_partitions

__all__ = ["Result", "Simulator", "run_scenario", "summary_line"]

# The hot event kinds as plain ints in module globals: the run loop compares one on every event.
_FRAME, _TIMER = EventKind.FRAME.value, EventKind.TIMER.value


class Simulator:
    """Runs one scenario with one seed: wires the engines to the modelled network and runs the loop."""

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
        network: Network | None = None,
    ) -> None:
        """network: run on this network instead of building the scenario's topology (simulations/lab.py:
        the twin of a lab mesh of real relays)."""
        self.sc = scenario
        self.hostile_on = adversaries
        self.seed = scenario.seed if seed is None else seed
        self.level = scenario.trace_level if trace_level is None else trace_level
        self.progress = progress
        self.rng = Streams.from_seed(self.seed)
        self.net: Network = (network if network is not None
                             else build(scenario.topology, self.rng.topo, scenario.engine))
        n = self.net.n
        self.roles = Roles.plan(scenario, n, self.rng.adv)
        if self.hostile_on:
            for i, a in enumerate(self.roles.role):
                if a is not None and a.kind in ("rushing", "forger"):
                    self.net.processing[i] = 0.0  # rushing: forwards at once
        self.names = [str(i) for i in range(n)]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.collector = Collector(n, scenario.deadline_s, scenario.coverage_after_s)
        self.trace_dir = trace_dir
        self.writer = TraceWriter(trace_dir, trace_format) if trace_dir is not None else None
        self.tracer = SimTracer(self.collector, self.writer, self.level)
        self.verifier = CachingVerifier(max_entries=1_000_000, identity_max=1_000_000)
        self.homes = [MemoryHomeStore() for _ in range(n)]
        # relay -> the custody it held when it failed ([churn] durable_custody): given back at its rejoin.
        self.custody_disk: dict[int, list[tuple[Push, float, int]]] = {}
        # The live network: relays up, links up (latency per direction; starts as the topology), cut links.
        self.alive = [True] * n
        self.lat: list[dict[int, float]] = [{} for _ in range(n)]
        for (u, v), lat in self.net.latency.items():
            self.lat[u][v] = lat
        self.adjacent = [sorted(self.lat[u]) for u in range(n)]  # the topology's own links
        self.cut: set[tuple[int, int]] = set()
        self.components = ComponentTracker(n, self.lat, self.alive, self.cut)
        self.q = EventQueue()
        self.engines: list[Engine] = [self._new_engine(i) for i in range(n)]
        self.timer_at = [math.inf] * n
        self.events = 0
        self.lost = 0
        # loss_model quic (linkmodel.py): per sender, link -> when its stream's last delayed frame arrives
        self.quic = scenario.loss_model == "quic" and scenario.loss > 0
        self.hol: list[dict[int, float]] = [{} for _ in range(n)]
        self.retransmitted = 0
        # The host's share of a QUIC RTT sample (mean, mean deviation): 0 in scenarios; the lab twin sets
        # them from the relays' own QUIC estimates (simulations/lab.py, linkmodel.py).
        self.host_rtt_s = 0.0
        self.host_rttvar_s = 0.0
        # Rule C6 (linkmodel.py): (sender, receiver) -> when the last frame the receiver never acknowledged
        # left (it was down, or the link cut, or a double loss under quic); the sender's transport reports
        # the receiver unresponsive UNACKED_PTOS probe timeouts after it.
        self.unacked: dict[tuple[int, int], float] = {}
        self.unresponsive = 0
        self.now = 0.0
        self.work = Workload()
        self.window = ExclusionWindow(scenario.deadline_s, self.components, self._home_of, self._exclude)
        self.ingress: Ingress | None = None  # with a push spammer: its victim's API
        self.stale: StaleSender | None = None  # with a stale sender (stale.py)
        self.devices = Devices(self.work)  # the multi-home devices' streams (devices.py)

    # -- setup ----------------------------------------------------------------------------------
    def _new_engine(self, i: int) -> Engine:
        a = self.roles.role[i]
        name = self.names[i]
        rng = random.Random(self.rng.engine_seed + i * 7919 + self.q.seq)
        if a is not None and self.hostile_on:
            return make_engine(a.kind, a, self.rng.engine_seed ^ (i * 104729 + self.q.seq), relay_id=name,
                               config=self.sc.engine, verifier=self.verifier, home=self.homes[i], tracer=self.tracer,
                               rng=rng, listen_addr=name)
        return Engine(relay_id=name, config=self.sc.engine, verifier=self.verifier, home=self.homes[i],
                      tracer=self.tracer, rng=rng, listen_addr=name)

    def _start_links(self) -> None:
        for i, eng in enumerate(self.engines):
            eng.add_candidates([PeerInfo(self.names[v], self.names[v]) for v in sorted(self.lat[i])], 0.0)
        for u, v in self.net.undirected_edges():
            self._link_up(u, v, 0.0)
        for i, eng in enumerate(self.engines):
            self._apply(i, eng.start(0.0, sync_routes=False))  # the whole mesh starts now: no routes to sync (G11)

    def _start_spam(self) -> None:
        """The push spammer: a home app with its own registered device, pushing through the victim."""
        a = self.roles.spam_adv
        if a is None:
            return
        rng = self.rng.adv
        honest = self.roles.honest
        home = honest[rng.randrange(len(honest))]
        spam_reg = make_registration(new_signing_key(rng.randbytes(32)), 1, 0, int(self.sc.duration_s * 4) + 3600)
        self.ingress = Ingress(a, spam_reg, clock=lambda: self.now, rng=rng)
        self.homes[home].add_registration(spam_reg, [])
        self._apply(home, self.engines[home].register(spam_reg, 0.0))
        if self.hostile_on and a.rate_x > 0:
            self.q.schedule(max(a.start_s, 0.0), EventKind.ARRIVE, self.roles.victim, -1, None)

    def _start_stale(self) -> None:
        """The stale sender (stale.py): its devices' registrations and refreshes, and its pushes, scheduled
        after everything else from its own random stream (the other events are those of a run without it)."""
        a = next((a for a in self.sc.adversaries if a.kind == "stale_sender"), None)
        if a is None:
            return
        rng = random.Random(self.seed * 1_000_033 + 43)
        self.stale = sender = StaleSender(a, rng, self.roles.honest)
        w = self.sc.workload
        end = self.sc.duration_s
        for d in range(len(sender.devices)):
            t = rng.uniform(w.registration_start_s, w.registration_end_s)
            while t < end:
                self.q.schedule(t, EventKind.STALE, 0, d, None)
                t += w.refresh_interval_s
        if self.hostile_on and a.rate_per_s > 0:
            t = max(a.start_s, 0.0)
            while t < min(a.end_s, end):
                self.q.schedule(t, EventKind.STALE, 0, -1, None)
                t += 1.0 / a.rate_per_s

    def _stale(self, d: int, t: float) -> None:
        """The stale sender's device d (re-)registers at its home with a new receipt key, or (d = -1) it pushes."""
        sender = self.stale
        assert sender is not None
        if d >= 0:
            dev = sender.devices[d]
            reg, secret, tokens = sender.registration(dev, t)
            self.homes[dev.home].add_registration(reg, tokens, secret)
            if self.alive[dev.home]:
                self._apply(dev.home, self.engines[dev.home].register(reg, t))
                self._rearm(dev.home)
            return
        push = sender.next_push(t)
        if push is None or not self.alive[push.relay]:
            return
        a = push.relay
        res = self.engines[a].inject_push(push.registration, push.token, b"stale", t)
        if res.push_id is None:
            sender.refused += 1
        else:  # not an honest push: outside every delivery figure
            sender.pushes[res.push_id] = push.kind
            self.tracer.emit(t, self.names[a], "push_excluded", msg=res.push_id.hex(), reason="adversary")
        self._apply(a, res.effects)
        self._rearm(a)

    def _link_up(self, a: int, b: int, t: float) -> None:
        """a dialled b: both engines learn of the link unless a refuses it (then b never sees it)."""
        nb = self.names[b]
        effects = self.engines[a].peer_up(nb, t, outbound=True, addr=nb)
        refused = any(type(e) is Disconnect and e.peer == nb for e in effects)
        self._apply(a, [e for e in effects if not (type(e) is Disconnect and e.peer == nb)])
        if not refused:
            self._apply(b, self.engines[b].peer_up(self.names[a], t, outbound=False, addr=self.names[a]))

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

    def _prepare(self) -> None:
        """Plan the workload, churn and partitions, bring the links up and arm every engine's timer."""
        n = self.net.n
        self.work.plan(self.sc, n, self.roles, self.q, self.rng.work, self.rng.adv)
        # Multi-home devices from their own stream (a run without them draws nothing: its events stay)
        self.work.plan_homes(self.sc, self.roles, random.Random(self.seed * 1_000_037 + 47))
        self.devices = Devices(self.work)
        plan_churn(self.sc, n, self.q, self.rng.churn, self.work)
        plan_partitions(self.sc, self.q)
        self._start_links()
        self._start_spam()
        self._start_stale()
        for i in range(n):
            self._rearm(i)

    def _run(self) -> Result:
        """The run loop. Its hot paths are EventQueue.pop and push, _apply's sends and _rearm, inlined:
        tests/test_sim_fastpath.py runs the same scenarios through those methods instead and checks that
        the summaries are the same."""
        wall0 = time.perf_counter()
        self._prepare()
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
        rand = self.rng.loss.random
        quic = self.quic
        heappush, heappop = heapq.heappush, heapq.heappop
        events = 0
        bar = Progress(end, self.progress)
        # The bucket being read, its key and the next event's index in it, as locals: `cur` is always the
        # list cal.cur (insort adds to it in place), and cal.pos is stored as it moves (EventQueue.push
        # and schedule, called from _apply, read it).
        cur = cal.cur
        pos = cal.pos
        cur_key = cal.cur_key
        while True:
            # EventQueue.pop, inlined
            if pos < len(cur):
                ev = cur[pos]
                pos += 1
                cal.pos = pos
            elif keys:
                k = cur_key = cal.cur_key = heappop(keys)
                cur = cal.cur = buckets.pop(k)
                cur.sort()
                ev = cur[0]
                pos = cal.pos = 1
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
                    self._unacked(a, dst, t - processing[dst] - lat[a].get(dst, 0.0))
                    continue
                eng = engines[dst]
                effects = eng.receive_message(names[a], ev[5], t)  # type: ignore[arg-type]
            elif kind == _TIMER:
                if not alive[a] or timer_at[a] != t:
                    continue
                timer_at[a] = math.inf
                dst = a
                eng = engines[a]
                effects = eng.handle_timer(t)
            else:
                self._control(kind, a, ev[4], ev[5], t)
                if events & 0xFFFF == 0:
                    bar.update(t, events)
                continue
            # A frame's or a timer's effects: what _apply does, with the sends inline (nearly every
            # effect is one); the rest through _apply, in order. Then _rearm, inline.
            if effects:
                lat_dst = lat[dst]
                for eff in effects:
                    if type(eff) is Send:
                        to = index[eff.peer]
                        la = lat_dst.get(to)
                        if la is None or (cut and (dst, to) in cut):
                            self.lost += 1
                            if la is not None:
                                self._unacked(dst, to, t + eff.delay)
                            continue
                        if quic:  # loss_model quic (linkmodel.py): retransmitted, in order
                            at = self._quic_arrival(dst, to, t + eff.delay + la, la)
                        elif loss and rand() < loss:
                            self.lost += 1
                            continue
                        else:
                            at = t + eff.delay + la
                        seq = cal.seq = cal.seq + 1
                        # EventQueue.push, inlined (a frame is rarely due in the bucket being read)
                        fe = (at + processing[to], seq, _FRAME, dst, to, eff.msg)
                        k = int(fe[0] * inv)
                        b = buckets.get(k)
                        if b is not None:
                            b.append(fe)
                        elif k == cur_key:
                            insort(cur, fe, lo=pos)
                        else:
                            buckets[k] = [fe]
                            heappush(keys, k)
                    else:
                        self._apply(dst, [eff])
            nt = eng.get_timer()
            if nt is not None and nt < timer_at[dst]:
                timer_at[dst] = nt
                cal.schedule(nt, _TIMER, dst, 0, None)
            if events & 0xFFFF == 0:
                bar.update(t, events)
        bar.close()
        self.events = events
        wall = time.perf_counter() - wall0
        return self._finish(wall)

    def _control(self, kind: int, a: int, b: int, payload: object, t: float) -> None:
        """Every event but frames and timers."""
        eng = self.engines[a]
        if kind == EventKind.LINK_UP:
            if self.alive[a] and self.alive[b] and (a, b) not in self.cut:
                self._link_up(a, b, t)
                self._rearm(b)
            elif self.alive[a]:
                self._apply(a, eng.connect_failed(self.names[b], t))
            self._rearm(a)
        elif kind == EventKind.CONNECT_FAIL:
            if self.alive[a]:
                self._apply(a, eng.connect_failed(str(payload), t))
                self._rearm(a)
        elif kind == EventKind.REGISTER:
            assert isinstance(payload, tuple)
            epoch, tokens = payload
            home, current, key = self.work.regs[b]
            if not epoch:  # a multi-home device registering again after a home failed: its next epoch
                if current is None:
                    return
                epoch = current.epoch + 1
            # The device's receipt key pair: derived from its route key (no draw from the random streams,
            # so runs keep their events); the private half goes to its home only. A new one at every
            # refresh with rotate_receipt_keys (rule F5c).
            receipt_secret = receipt_seed(key, epoch if self.sc.workload.rotate_receipt_keys else None)
            reg = make_registration(key, epoch, int(t), int(self.sc.duration_s * 4) + 3600,
                                    receipt_public_key(receipt_secret))
            self.work.regs[b] = (home, reg, key)
            if self.stale is not None:
                self.stale.saw(b, reg)
            self.devices.registered(b, reg.route_id)
            for h in self.work.homes_of(b):  # a multi-home device registers at each of its homes
                self.homes[h].add_registration(reg, tokens, receipt_secret)
                if self.alive[h]:
                    self._apply(h, self.engines[h].register(reg, t))
                    self._rearm(h)
        elif kind == EventKind.PUSH:
            self._push(a, b, t)
        elif kind == EventKind.FAIL:
            if not self.alive[a]:
                return
            self.alive[a] = False
            self.tracer.emit(t, self.names[a], "relay_down", reason="churn")
            if self.sc.churn.durable_custody:  # on disk, as the daemon commits it before its 202
                self.custody_disk[a] = self.engines[a].held_custody()
            self.components.failed(a)
            self.window.topology_changed(t)
            again = self.sc.workload.multi_home_reregister_s
            if again > 0:  # its multi-home devices see their stream to it drop, and register again
                for r in self.work.homed_at(a):
                    self.q.schedule(t + again, EventKind.REGISTER, a, r, (0, []))
        elif kind == EventKind.REJOIN:
            self.alive[a] = True
            self.tracer.emit(t, self.names[a], "relay_up", reason="churn")
            self.engines[a] = fresh = self._new_engine(a)
            self.timer_at[a] = math.inf
            original = self.adjacent[a]
            self._apply(a, fresh.add_candidates([PeerInfo(self.names[v], self.names[v]) for v in original], t))
            # As the daemon does at startup (service.run), before the engine starts: the pushes it held in
            # custody come back from disk, one attempt on (relays' seen caches may hold the last one).
            for push, deadline, attempt in self.custody_disk.pop(a, ()):
                self._apply(a, fresh.restore_custody(push, deadline, attempt + 1, t))
            self._apply(a, fresh.start(t))
            # As the daemon does at startup (service.run): the registrations its home store kept are
            # registered again (with the stem on at a new route generation, G10), so the relay is their
            # home again. It was not: a rejoined home took its own registration as a stem relay from its
            # successor's link-up announcement (G5) and no broken stem of its could be re-stemmed.
            wall = t + fresh.wall_offset
            for reg in self.homes[a].homed():
                if reg.expires_at > wall:
                    self._apply(a, fresh.register(reg, t, restart=True))
            self._rearm(a)
            self.components.rejoined(a)
        elif kind == EventKind.ARRIVE:
            self._arrive(b, t)
        elif kind == EventKind.SERVED:
            self._served(t)
        elif kind == EventKind.UNRESPONSIVE:
            self._unresponsive(a, b, t)
        elif kind == EventKind.STALE:
            self._stale(b, t)
        elif kind == EventKind.PARTITION:
            assert isinstance(payload, Partition)
            n = self.net.n
            side = int(payload.fraction * n)
            edges = {(u, v) for u in range(n) for v in self.lat[u] if (u < side) != (v < side)}
            self.components.invalidate()
            if a:
                self.cut |= edges
                self.window.topology_changed(t)
            else:
                self.cut -= edges

    def _push(self, a: int, b: int, t: float) -> None:
        """Push plan b's app injects its push at relay a."""
        plan = self.work.pushes[b]
        home, reg, _ = self.work.regs[plan.reg_index]
        if reg is None:
            return  # not registered yet: the home app has no credential to push with
        if not self.alive[a]:
            # The home app's relay is down: like a real app it tries the next relay on its list.
            n = self.net.n
            nxt = next((i % n for i in range(a + 1, a + 1 + n) if self.alive[i % n]), None)
            if nxt is None:
                return
            a = plan.inject = nxt
        result = self.engines[a].inject_push(reg, plan.token, b"sealed-payload", t,
                                             push_id=self.work.push_id(self.seed, b))
        if result.push_id is not None:
            plan.push_id = result.push_id.hex()
            self.window.injected(plan)
        self._apply(a, result.effects)
        self._rearm(a)

    # -- the spammed API ------------------------------------------------------------------------
    def _arrive(self, b: int, t: float) -> None:
        ing = self.ingress
        assert ing is not None
        if b < 0:
            nxt = ing.spam_arrives(t, self.sc.duration_s)
            if nxt is not None:
                self.q.schedule(nxt, EventKind.ARRIVE, self.roles.victim, -1, None)
        elif not ing.honest_arrives(b, self.work.pushes[b].client):
            self.work.pushes[b].push_id = None
        if not ing.busy:
            self._serve(t)

    def _serve(self, t: float) -> None:
        """Start serving the next waiting request at the victim's API."""
        ing = self.ingress
        assert ing is not None
        done = ing.serve_next(t, self._credentials)
        if done is not None:
            self.q.schedule(done, EventKind.SERVED, self.roles.victim, 0, None)

    def _credentials(self, b: int) -> tuple[bytes, bytes]:
        """(device, token) of push plan b, as its request to the API carries them."""
        plan = self.work.pushes[b]
        reg = self.work.regs[plan.reg_index][1]
        return (reg.route_id if reg is not None else b""), plan.token

    def _served(self, t: float) -> None:
        """The request in service is done: an accepted push enters the relay's engine now."""
        ing = self.ingress
        assert ing is not None
        done = ing.in_service
        victim = self.roles.victim
        if done is not None:
            _, (source, b), ok = done
            if ok and self.alive[victim]:
                if source is Source.SPAM:
                    res = self.engines[victim].inject_push(ing.spam_reg, self.rng.adv.randbytes(16), b"spam", t)
                    if res.push_id is not None:  # not an honest push: outside every delivery figure
                        self.tracer.emit(t, self.names[victim], "push_excluded", msg=res.push_id.hex(),
                                         reason="adversary")
                    self._apply(victim, res.effects)
                else:
                    self._push(victim, b, t)
                self._rearm(victim)
        self._serve(t)

    # -- effects --------------------------------------------------------------------------------
    def _apply(self, src: int, effects: list[Effect]) -> None:
        """Carry out relay src's effects, in order. Every Effect type has its case: mypy flags a new one
        (the match ends in assert_never)."""
        for eff in effects:
            # Sends first, outside the match: nearly every effect is one, and on Python 3.11 a class
            # pattern costs about three times an isinstance (measured). mypy narrows `eff` to the
            # other effect types below, so the match stays exhaustive.
            if isinstance(eff, Send):
                dst = self.index[eff.peer]
                lat = self.lat[src].get(dst)
                if lat is None or (src, dst) in self.cut:
                    self.lost += 1
                    if lat is not None:
                        self._unacked(src, dst, self.now + eff.delay)
                    continue
                if self.quic:
                    at = self._quic_arrival(src, dst, self.now + eff.delay + lat, lat)
                elif self.sc.loss and self.rng.loss.random() < self.sc.loss:
                    self.lost += 1
                    continue
                else:
                    at = self.now + eff.delay + lat
                self.q.schedule(at + self.net.processing[dst], _FRAME, src, dst, eff.msg)
                continue
            match eff:
                case Connect():
                    to = self.index.get(eff.peer)
                    if to is None or not self.alive[to] or to == src or (src, to) in self.cut:
                        self.q.schedule(self.now + self.sc.engine.connect_timeout_s, EventKind.CONNECT_FAIL, src,
                                        to or 0, eff.peer)
                        continue
                    if to not in self.lat[src]:
                        there, back = self.net.link_latency(src, to, self.rng.links, self.sc.topology)
                        self.lat[src][to] = there
                        self.lat[to][src] = back
                        self.components.linked(src, to)
                    self.q.schedule(self.now + self.lat[src][to] * 2, EventKind.LINK_UP, src, to, None)
                case Disconnect():
                    to = self.index.get(eff.peer)
                    if to is not None and self.alive[to]:
                        # The remote learns the reason (a QUIC close carries it): "full" and "score" are
                        # not re-dialled, a lost link is.
                        self._apply(to, self.engines[to].peer_down(self.names[src], self.now, eff.reason))
                        self._rearm(to)
                case CustodyReleased():
                    if self.stale is not None and eff.push_id in self.stale.pushes:
                        self.stale.settled[eff.push_id] = eff.status  # a late receipt corrects it
                case Delivered():
                    self.devices.stored(src, eff.route_id, eff.push_id)  # a multi-home device's stream
                case CustodyTaken():
                    pass  # for a driver with storage; the engine's trace rows already say it
                case _:
                    assert_never(eff)

    # -- the transport's loss detection (rule C6) --------------------------------------------------
    def _unacked_after(self, src: int, dst: int) -> float:
        """How long src's transport waits for an acknowledgement from dst before it reports dst
        unresponsive: UNACKED_PTOS probe timeouts of the link (linkmodel.py)."""
        there = self.lat[src].get(dst, 0.0)
        return UNACKED_PTOS * probe_timeout(there + self.lat[dst].get(src, there) + self.host_rtt_s, self.host_rttvar_s)

    def _unacked(self, src: int, dst: int, sent: float) -> None:
        """A frame src sent at `sent` will never be acknowledged by dst: src's transport reports dst
        unresponsive UNACKED_PTOS probe timeouts after the last such frame (a later send restarts
        QUIC's probe timer, as in aioquic), once per run of unacknowledged frames."""
        key = (src, dst)
        last = self.unacked.get(key)
        if last is None:
            self.q.schedule(sent + self._unacked_after(src, dst), EventKind.UNRESPONSIVE, src, dst, None)
        elif last >= sent:
            return
        self.unacked[key] = sent

    def _unresponsive(self, a: int, b: int, t: float) -> None:
        last = self.unacked.get((a, b))
        if last is None:
            return
        due = last + self._unacked_after(a, b)
        if due > t + 1e-9:  # frames sent since: the probe timer started again
            self.q.schedule(due, EventKind.UNRESPONSIVE, a, b, None)
            return
        del self.unacked[(a, b)]
        if self.alive[a]:
            self.unresponsive += 1
            self._apply(a, self.engines[a].link_unresponsive(self.names[b], t))
            self._rearm(a)

    def _quic_arrival(self, src: int, dst: int, at: float, lat: float) -> float:
        """loss_model quic: when a frame sent on the live link src -> dst, due at `at` without loss,
        arrives. A lost packet costs a retransmission (linkmodel.py); later frames on the link's stream
        wait for it (in-order delivery). Nothing is lost here: a frame to a relay that is down by
        then is dropped on arrival, like every frame."""
        hol = self.hol[src]
        if self.rng.loss.random() < self.sc.loss:
            self.retransmitted += 1
            rtt = lat + self.lat[dst].get(src, lat) + self.host_rtt_s
            extra = retransmit_delay(rtt, self.sc.loss, self.rng.loss.random, self.host_rttvar_s)
            if extra >= UNACKED_PTOS * probe_timeout(rtt, self.host_rttvar_s) - 1e-12:
                # The retransmission was lost too: the transport's loss detection reports dst before
                # the frame gets through (rule C6), as a live but lossy link does.
                self._unacked(src, dst, at - lat)
            at += extra
            held = hol.get(dst)
            if held is not None and held > at:
                at = held
            hol[dst] = at
            return at
        if hol:
            held = hol.get(dst)
            if held is not None:
                if held > at:
                    return held  # behind a retransmission on the same stream
                del hol[dst]
        return at

    def _rearm(self, i: int) -> None:
        t = self.engines[i].get_timer()
        if t is not None and t < self.timer_at[i]:
            self.timer_at[i] = t
            self.q.schedule(t, _TIMER, i, 0, None)

    # -- pushes the topology excludes -------------------------------------------------------------
    def _home_of(self, p: PushPlan) -> tuple[int, ...]:
        return self.work.homes_of(p.reg_index)

    def _exclude(self, p: PushPlan, reason: str) -> None:
        self.tracer.emit(self.now, self.names[p.inject], "push_excluded", msg=p.push_id, reason=reason)

    # -- summary --------------------------------------------------------------------------------
    def _finish(self, wall: float) -> Result:
        summary = delivery_summary(self.collector, self.net, self.names, self.work, self.lat, self.sc.topology)
        if self.sc.adversaries:
            summary.update(adversary_summary(self.sc.adversaries, self.roles, self.hostile_on, self.engines,
                                             self.alive, self.names, self.work, self.tracer.scored,
                                             self.collector.settled_delivered, self.collector.delivered))
        if not self.sc.adversaries or not self.hostile_on:
            # Every relay behaves honestly (no adversary, or --no-adversaries): every scoring cut is the
            # cut of an honest link, and there should be none (loss and churn are not black holes).
            summary["cuts_of_honest"] = len(self.tracer.scored)
        summary["cuts_by_reason"] = cut_reasons(self.tracer.scored)
        if self.stale is not None:
            summary.update(self.stale.summary())
            summary["score_penalties"] = score_penalties(self.engines)
        summary.update(fallback_summary(self.engines, self.collector))
        if self.sc.workload.multi_home_share > 0:
            summary.update(self.collector.multi_home_summary())
            summary.update(self.devices.summary())
        summary.update(scope_reach(self.collector, self.net, self.names, self.sc.engine.gossip_ttl))
        if self.ingress is not None:
            pushes = self.work.pushes
            summary.update(self.ingress.summary(lambda b: pushes[b].t,
                                                lambda b: delivered_at(self.collector, pushes[b]),
                                                self.sc.deadline_s))
        degrees = self.net.degrees()
        summary["topology_degrees"] = {str(d): c for d, c in degrees.items()}
        summary["topology_below_min_degree"] = sum(c for d, c in degrees.items() if d < self.sc.topology.min_degree)
        if self.net.formation is not None:
            summary["topology_formation"] = self.net.formation
        summary["route_k2_share"] = route_k2_share(self.engines, self.alive, self.work)
        summary["gossip_scheme"] = self.sc.engine.gossip_scheme
        summary.update(
            {
                "events": self.events,
                "events_per_s": round(self.events / wall, 1) if wall > 0 else None,
                "wall_s": round(wall, 3),
                "frames_lost": self.lost,
                "frames_retransmitted": self.retransmitted,
                "links_unresponsive": self.unresponsive,
                "loss_model": self.sc.loss_model,
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
                "relays": self.net.n,
                "deadline_s": self.sc.deadline_s,
                "coverage_after_s": self.sc.coverage_after_s,
                "seed": self.seed,
                "scenario": self.sc.name,
                "summary": summary,
            }
            self.writer.close(meta, self.net, self.lat, self.sc)
        return Result(summary, self.trace_dir)


def run_scenario(scenario: Scenario, **kwargs: object) -> Result:
    """Convenience: build a Simulator and run it."""
    return Simulator(scenario, **kwargs).run()  # type: ignore[arg-type]
