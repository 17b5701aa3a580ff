"""Hostile relays and clients for adversarial scenarios (`[[adversaries]]` in a scenario file).

Every hostile relay is the shipped engine with one behaviour changed, so the honest relays around it
run exactly the code a real relay runs, scoring included:

- black_hole: takes part in gossip like an honest relay (routes go through it), drops every push.
- rushing: a black hole that forwards gossip at once (no processing delay) claiming to be the home
  (hops 0), so it wins first arrival and the lowest distance wherever it can (Hu, Perrig, Johnson:
  rushing attacks).
- forger: a hijacker that also forges registrations (random route ids, bad signatures) and replays
  gossip it has seen, rate_per_s of each to every neighbour; drops pushes.
- reg_spammer: originates rate_per_s fresh, validly signed registrations per second (new keys:
  per-origin budgets cannot stop it, only the per-neighbour flood budget and scores can).
- receipt_forger: a black hole that answers every push with a forged `stored` receipt (it has no
  receipt key: its signature is made up), so that a custodian believing receipts stops retrying and
  the push is gone. Signed receipts (docs/protocol.md, rule F5) get it refused and scored down.
- push_spammer (a client, not a relay): a home app pushing at rate_x times the capacity of one
  relay's API, through that relay. See `simulations.ingress.Ingress`.
- stale_sender (a client, not a relay): a home app pushing rate_per_s pushes a second with credentials
  whose devices have since rotated their receipt keys, and with registrations its own `devices` signed
  but never registered (rule F5c). See `simulations.stale.StaleSender`.

Extension point: a hostile relay subclasses `Engine` and overrides only methods named in
`inri.core.engine.HOOKS`, each marked `@override`, so the type checker (and
tests/test_adversarial.py at run time) fails when the engine renames a hooked method instead of the
attack silently turning off.

Honest devices are homed only at honest relays and honest apps inject only there: a device or an app
picks its relays; what is measured is whether hostile relays in the mesh cost honest pushes.
"""

from __future__ import annotations

import hashlib
import random
from collections import deque
from dataclasses import dataclass
from typing import Any

from nacl.signing import SigningKey
from typing_extensions import override

from inri.core.api import Effect, Send
from inri.core.engine import Engine
from inri.core.state import Neighbour
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import Push, Receipt, ReceiptStatus, RegGossip, Registration

RELAY_KINDS = ("black_hole", "rushing", "forger", "reg_spammer", "receipt_forger")
CLIENT_KINDS = ("push_spammer", "stale_sender")  # home apps, not relays: they take no relay's role
KINDS = (*RELAY_KINDS, *CLIENT_KINDS)


@dataclass(frozen=True)
class Adversary:
    """One `[[adversaries]]` table."""

    kind: str
    fraction: float = 0.0  # share of relays with this behaviour (relay kinds)
    count: int = 0  # or an exact number of relays (relay kinds; push_spammer: 1)
    # forger, reg_spammer: frames per second to each neighbour; stale_sender: pushes per second
    rate_per_s: float = 100.0
    start_s: float = 0.0  # spam starts (reg_spammer, forger, push_spammer, stale_sender)
    end_s: float = 1e18
    # push_spammer: the victim relay's API serves capacity_per_s pushes/s; the spammer offers rate_x
    # times that. Honest pushes: honest_share of all pushes are injected at the victim.
    rate_x: float = 10.0
    capacity_per_s: float = 1000.0
    reject_cost: float = 0.25  # a refused request costs this share of an accepted one
    connections: int = 64  # the spammer's HTTP connections, one request in flight on each
    honest_share: float = 0.25
    devices: int = 4  # stale_sender: devices of its own, registered at honest homes


class BlackHole(Engine):
    """Routes like an honest relay, drops every push it receives."""

    @override
    def _on_push(self, peer: str, msg: Push, now: float) -> list[Effect]:
        self._count("adversary_pushes_dropped")
        return []


class ReceiptForger(BlackHole):
    """Swallows every push and answers it with a forged `stored` receipt."""

    @override
    def _on_push(self, peer: str, msg: Push, now: float) -> list[Effect]:
        self._count("adversary_receipts_forged")
        # A made-up signature (derived from the push id: no draw from the engine's random stream).
        forged = hashlib.blake2b(msg.push_id, digest_size=64, person=b"forged-receipt").digest()
        return [Send(peer, Receipt(msg.push_id, ReceiptStatus.STORED, msg.hops + 1, forged))]


def receipt_seed(route_key: SigningKey, epoch: int | None = None) -> bytes:
    """A simulated device's receipt key seed, derived from its route key (one-way: the home that holds
    it learns nothing of the route key) so that making it draws nothing from the run's random streams.
    epoch: a new key for every epoch (`[workload] rotate_receipt_keys`); None: one key for all."""
    salt = b"" if epoch is None else epoch.to_bytes(4, "big")
    return hashlib.blake2b(bytes(route_key) + salt, digest_size=32, person=b"inri-sim-receipt").digest()


class Rushing(BlackHole):
    """Forwards gossip claiming hops 0 (the simulator gives it no processing delay)."""

    @override
    def _on_gossip(self, peer: str, state: Neighbour, msg: RegGossip, now: float) -> list[Effect]:
        out = super()._on_gossip(peer, state, msg, now)
        return [Send(e.peer, RegGossip(e.msg.registration, e.msg.ttl, 0))
                if type(e) is Send and type(e.msg) is RegGossip else e for e in out]


class _Spammer(Engine):
    """Base of relays that send extra frames on every tick between start_s and end_s."""

    adversary: Adversary
    spam_rng: random.Random
    spam_sent = 0

    @override
    def _tick(self, now: float) -> list[Effect]:
        out = super()._tick(now)
        a = self.adversary
        if a.start_s <= now < a.end_s and self._neighbours.active():
            n = int(a.rate_per_s * self.config.keepalive_interval_s)
            for msg in self._spam(n, now):
                for p in self._neighbours.active():
                    out.append(Send(p, msg))
                    self.spam_sent += 1
        return out

    def _spam(self, n: int, now: float) -> list[RegGossip]:
        raise NotImplementedError


class RegSpammer(_Spammer):
    """Originates n fresh, validly signed registrations per tick."""

    spam_routes: set[bytes]

    def _spam(self, n: int, now: float) -> list[RegGossip]:
        msgs: list[RegGossip] = []
        for _ in range(n):
            reg = make_registration(new_signing_key(self.spam_rng.randbytes(32)), 1, int(now), 3600)
            self.spam_routes.add(reg.route_id)
            msgs.append(RegGossip(reg, self.config.gossip_ttl, 0))
        return msgs


class Forger(_Spammer, Rushing):
    """Hijacks (claims hops 0, drops pushes), forges registrations and replays gossip it has seen."""

    seen: deque[Registration]

    @override
    def _on_gossip(self, peer: str, state: Neighbour, msg: RegGossip, now: float) -> list[Effect]:
        self.seen.append(msg.registration)
        return super()._on_gossip(peer, state, msg, now)

    def _spam(self, n: int, now: float) -> list[RegGossip]:
        msgs: list[RegGossip] = []
        for _ in range(n):
            key = self.spam_rng.randbytes(32)
            msgs.append(RegGossip(Registration(key, 1, int(now), 3600, bytes(64)), self.config.gossip_ttl, 0))
        for reg in list(self.seen)[-n:]:
            msgs.append(RegGossip(reg, self.config.gossip_ttl, 0))
        return msgs


def make_engine(kind: str, adversary: Adversary, seed: int, **kwargs: Any) -> Engine:
    """The engine of a relay with the given hostile behaviour."""
    cls = {"black_hole": BlackHole, "rushing": Rushing, "forger": Forger, "reg_spammer": RegSpammer,
           "receipt_forger": ReceiptForger}[kind]
    eng = cls(**kwargs)
    if isinstance(eng, _Spammer):
        eng.adversary = adversary
        eng.spam_rng = random.Random(seed)
        eng.spam_sent = 0
        if isinstance(eng, RegSpammer):
            eng.spam_routes = set()
        if isinstance(eng, Forger):
            eng.seen = deque(maxlen=1000)
    return eng
