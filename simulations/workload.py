"""What happens to the mesh, planned up front from the seed: hostile roles, registrations and pushes,
relay failures and rejoins, partitions.

Every plan draws from its own random stream and is written onto the event queue before the run
starts, in a fixed order (roles, workload, churn, partitions), so a run is a function of its seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from nacl.signing import SigningKey

from inri.protocol.keys import new_signing_key
from inri.protocol.messages import Registration
from simulations.adversary import CLIENT_KINDS, Adversary
from simulations.events import EventKind, EventQueue
from simulations.scenario import Scenario


@dataclass
class Streams:
    """One random stream per purpose, so adding randomness to one does not shift another."""

    topo: random.Random
    work: random.Random
    loss: random.Random
    churn: random.Random
    engine_seed: int
    links: random.Random
    adv: random.Random

    @classmethod
    def from_seed(cls, seed: int) -> Streams:
        """The streams of a run (drawn from the root in this order: changing it changes every run)."""
        root = random.Random(seed)
        topo = random.Random(root.getrandbits(64))
        work = random.Random(root.getrandbits(64))
        loss = random.Random(root.getrandbits(64))
        churn = random.Random(root.getrandbits(64))
        engine_seed = root.getrandbits(64)
        links = random.Random(root.getrandbits(64))
        adv = random.Random(root.getrandbits(64))
        return cls(topo, work, loss, churn, engine_seed, links, adv)


@dataclass
class Roles:
    """Which relays are hostile (and how), and which relay a push spammer targets."""

    role: list[Adversary | None]  # per relay: its hostile behaviour, None when honest
    honest: list[int]  # the honest relays, in index order
    spam_adv: Adversary | None = None  # the push spammer (a client, not a relay)
    victim: int = -1  # the relay whose API the push spammer floods

    @classmethod
    def plan(cls, sc: Scenario, n: int, rng: random.Random) -> Roles:
        """Fixed by the seed whether or not adversaries are switched on, so that a run without them is
        the exact comparison."""
        role: list[Adversary | None] = [None] * n
        spam_adv: Adversary | None = None
        free = list(range(n))
        rng.shuffle(free)
        for a in sc.adversaries:
            if a.kind == "push_spammer":
                spam_adv = a
                continue
            if a.kind in CLIENT_KINDS:  # a home app (stale_sender: simulations/stale.py), no relay
                continue
            for i in free[: a.count or int(round(a.fraction * n))]:
                role[i] = a
            free = free[a.count or int(round(a.fraction * n)):]
        honest = [i for i in range(n) if role[i] is None]
        return cls(role, honest, spam_adv, free[0] if spam_adv is not None else -1)


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
class Workload:
    """The registrations and pushes of a run. `regs[r]` gets its registration when it is made."""

    regs: list[tuple[int, Registration | None, SigningKey]] = field(default_factory=list)  # (home, reg, key)
    reg_tokens: list[list[bytes]] = field(default_factory=list)
    pushes: list[PushPlan] = field(default_factory=list)
    # Homes in two places (issue 42, item 3): registration -> every home of its device (the first is
    # regs[r][0]), for the devices registered at several homes only.
    homes: dict[int, tuple[int, ...]] = field(default_factory=dict)

    def plan(self, sc: Scenario, n: int, roles: Roles, q: EventQueue, rng: random.Random,
             rng_adv: random.Random) -> None:
        """Draw every registration (and its refreshes) and push, and schedule them. Devices are homed
        and apps inject only at honest relays; with a push spammer, honest_share of the pushes go
        through its victim's API."""
        w = sc.workload
        honest = roles.honest
        everyone = len(honest) == n
        spam = roles.spam_adv
        for r in range(w.registrations):
            t = rng.uniform(w.registration_start_s, w.registration_end_s)
            home = rng.randrange(n) if everyone else honest[rng.randrange(len(honest))]
            if w.rotate and r % 2:
                home = self.regs[r - 1][0]
            key = new_signing_key(rng.randbytes(32))
            tokens = [rng.randbytes(16) for _ in range(w.tokens_per_registration)]
            q.schedule(t, EventKind.REGISTER, home, r, (1, tokens))
            self.regs.append((home, None, key))
            self.reg_tokens.append(tokens)
            if w.refresh_interval_s > 0:
                k = 1
                while t + k * w.refresh_interval_s < sc.duration_s:
                    q.schedule(t + k * w.refresh_interval_s, EventKind.REGISTER, home, r, (k + 1, []))
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
            if spam is not None and rng_adv.random() < spam.honest_share:
                plan.inject = roles.victim  # through the relay under spam: queued at its API first
                q.schedule(t, EventKind.ARRIVE, roles.victim, len(self.pushes) - 1, None)
            else:
                q.schedule(t, EventKind.PUSH, plan.inject, len(self.pushes) - 1, None)

    def plan_homes(self, sc: Scenario, roles: Roles, rng: random.Random) -> None:
        """Draw which devices register at several homes ([workload] multi_home_share) and their other
        homes, uniform over the honest relays like the first, never the same relay twice. From its own
        stream (rng), after the workload: a run without multi-home devices draws nothing here."""
        w = sc.workload
        if w.multi_home_share <= 0:
            return
        honest = roles.honest
        for r, (home, _, _) in enumerate(self.regs):
            if rng.random() >= w.multi_home_share:
                continue
            homes = [home]
            while len(homes) < w.homes_per_device:
                h = honest[rng.randrange(len(honest))]
                if h not in homes:
                    homes.append(h)
            self.homes[r] = tuple(homes)

    def homed_at(self, relay: int) -> list[int]:
        """The multi-home registrations with a home at relay."""
        return [r for r, homes in self.homes.items() if relay in homes]

    def homes_of(self, r: int) -> tuple[int, ...]:
        """Every home of registration r's device (one for most)."""
        return self.homes.get(r) or (self.regs[r][0],)

    def push_id(self, seed: int, b: int) -> bytes:
        """The id of push plan b (fixed by the seed, so reruns and traces match)."""
        return random.Random(seed * 1_000_003 + b).randbytes(16)


def plan_multi_home_failures(sc: Scenario, work: Workload, rng: random.Random) -> tuple[list[int], set[int]]:
    """[churn] multi_home_failures: for each multi-home device in turn, that many of its homes to fail,
    never one another device keeps as its last home up. Returns (the relays to fail, in draw order; the
    homes that must stay up: the rest of fail_fraction's failures are drawn among the other relays)."""
    c = sc.churn
    fail: list[int] = []
    keep: set[int] = set()
    if c.multi_home_failures <= 0:
        return fail, keep
    for r in sorted(work.homes):
        homes = list(work.homes[r])
        rng.shuffle(homes)
        down = [h for h in homes if h in fail]
        for h in homes:
            if len(down) >= c.multi_home_failures:
                break
            if h not in keep and h not in down:
                down.append(h)
        keep.update(h for h in homes if h not in down)
        fail += [h for h in down if h not in fail]
    return fail, keep


def plan_churn(sc: Scenario, n: int, q: EventQueue, rng: random.Random, work: Workload | None = None) -> None:
    """Schedule the relay failures (and the rejoins of a share of them) of `[churn]`: first the homes of
    multi-home devices that fail (multi_home_failures), then the rest of fail_fraction's share among
    the relays that are no multi-home device's last home up."""
    c = sc.churn
    homes_down, keep = plan_multi_home_failures(sc, work, rng) if work is not None else ([], set())
    count = max(int(round(c.fail_fraction * n)), len(homes_down))
    if count <= 0:
        return
    if homes_down:
        chosen = set(homes_down)
        others = [i for i in range(n) if i not in chosen and i not in keep]
        victims = homes_down + rng.sample(others, min(len(others), count - len(homes_down)))
        rng.shuffle(victims)  # which of them rejoin: drawn over all failures alike
    else:
        victims = rng.sample(range(n), count)
    rejoin = set(victims[: int(round(c.rejoin_fraction * count))])
    for v in victims:
        t = rng.uniform(c.start_s, c.end_s)
        q.schedule(t, EventKind.FAIL, v, 0, None)
        if v in rejoin and t + c.downtime_s < sc.duration_s:
            q.schedule(t + c.downtime_s, EventKind.REJOIN, v, 0, None)


def plan_partitions(sc: Scenario, q: EventQueue) -> None:
    """Schedule the cut and the heal of every `[[partitions]]` table."""
    for p in sc.partitions:
        q.schedule(p.start_s, EventKind.PARTITION, 1, 0, p)
        q.schedule(p.end_s, EventKind.PARTITION, 0, 0, p)
