"""The `stale_sender` adversary (`kind = "stale_sender"` in `[[adversaries]]`): a home app, not a relay,
that pushes with credentials their devices have since superseded (docs/protocol.md, rule F5c).

Anyone who ever held a push credential can do this: an app server whose device rotated its receipt key
at a refresh, a relay that saw a push go by, or the owner of a device that signs registrations it never
registers. Before rule F5c, one such push got its home relay's receipt refused as forged on the way back
and the home scored down and cut by an honest neighbour (issue 43). The sender:

- registers `devices` devices of its own at random honest homes (while the honest devices register)
  and refreshes them every `[workload] refresh_interval_s`, each time with a new receipt key;
- sees every honest device's registrations (with `[workload] rotate_receipt_keys` they rotate too);
- pushes `rate_per_s` pushes per second between start_s and end_s, each at a random honest relay, one
  of the kinds in `StaleKind` in turn (drawn at random).

Its pushes are traced `push_excluded` (reason `adversary`): outside every delivery figure. What the run
measures: no honest relay is scored down for them (`cuts_of_honest`, `score_bad_receipt`) and how each
settled (`stale_settled`). It draws only from its own random stream and schedules its events after the
workload's, so the scenario's other events are those of the same run without it (--no-adversaries
keeps it silent: its devices register, it sends nothing).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from enum import StrEnum
from typing import assert_never

from nacl.signing import SigningKey

from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key, receipt_public_key
from inri.protocol.messages import Registration
from simulations.adversary import Adversary

LIFETIME_S = 3600  # its own registrations' lifetime (the simulated runs are shorter)


class StaleKind(StrEnum):
    """What a stale push carries (its registration and token)."""

    SUPERSEDED_OWN = "superseded_own"  # its own device's superseded registration, a token it was issued
    SUPERSEDED_SEEN = "superseded_seen"  # an honest device's superseded registration, a made-up token
    UNREGISTERED = "unregistered"  # a newer epoch of its own device, signed with a key never handed over
    NO_RECEIPT_KEY = "no_receipt_key"  # a newer epoch of its own device without a receipt key
    CURRENT_SEEN = "current_seen"  # an honest device's current registration, a made-up token


@dataclass
class OwnDevice:
    """One of the sender's devices: its home, route key, registrations so far and unspent tokens."""

    home: int
    key: SigningKey
    regs: list[Registration] = field(default_factory=list)
    tokens: list[bytes] = field(default_factory=list)


@dataclass
class StalePush:
    """One push the sender makes: where it enters, with what."""

    relay: int
    registration: Registration
    token: bytes
    kind: StaleKind


class StaleSender:
    """The sender's devices, what it saw, and the pushes it makes (the simulator injects them)."""

    def __init__(self, adversary: Adversary, rng: random.Random, honest: list[int]) -> None:
        self.adversary = adversary
        self.rng = rng
        self.honest = honest
        self.devices = [OwnDevice(honest[rng.randrange(len(honest))], new_signing_key(rng.randbytes(32)))
                        for _ in range(max(1, adversary.devices))]
        self.seen: dict[int, list[Registration]] = {}  # honest registration index -> its registrations so far
        self.pushes: dict[bytes, StaleKind] = {}  # push id -> its kind (every push it got accepted)
        self.settled: dict[bytes, str] = {}  # push id -> its final status at its custodian
        self.refused = 0  # pushes the entry relay refused (an expired registration, overload)

    @staticmethod
    def receipt_secret(key: SigningKey, epoch: int) -> bytes:
        """The receipt key seed its device hands over with epoch `epoch` (a new one every epoch), derived
        from the route key so that making it draws nothing from the random stream."""
        return hashlib.blake2b(bytes(key) + epoch.to_bytes(4, "big"), digest_size=32,
                               person=b"inri-sim-stale").digest()

    def registration(self, d: OwnDevice, t: float) -> tuple[Registration, bytes, list[bytes]]:
        """Device d's next registration (epoch + 1, a new receipt key), the key's seed and new tokens."""
        epoch = len(d.regs) + 1
        secret = self.receipt_secret(d.key, epoch)
        reg = make_registration(d.key, epoch, int(t), LIFETIME_S, receipt_public_key(secret))
        d.regs.append(reg)
        tokens = [self.rng.randbytes(16) for _ in range(8)]
        d.tokens += tokens
        return reg, secret, tokens

    def saw(self, index: int, registration: Registration) -> None:
        """An honest device's registration (the sender is an app server, or a relay, that saw it)."""
        self.seen.setdefault(index, []).append(registration)

    def next_push(self, t: float) -> StalePush | None:
        """The next push (None when nothing of the drawn kind is at hand yet)."""
        rng = self.rng
        kind = list(StaleKind)[rng.randrange(len(StaleKind))]
        relay = self.honest[rng.randrange(len(self.honest))]
        d = self.devices[rng.randrange(len(self.devices))]
        match kind:
            case StaleKind.SUPERSEDED_OWN:
                if len(d.regs) < 2 or not d.tokens:
                    return None
                return StalePush(relay, d.regs[rng.randrange(len(d.regs) - 1)], d.tokens.pop(), kind)
            case StaleKind.SUPERSEDED_SEEN:
                old = [regs[:-1] for regs in self.seen.values() if len(regs) > 1]
                if not old:
                    return None
                regs = old[rng.randrange(len(old))]
                return StalePush(relay, regs[rng.randrange(len(regs))], rng.randbytes(16), kind)
            case StaleKind.UNREGISTERED | StaleKind.NO_RECEIPT_KEY:
                if not d.regs or not d.tokens:
                    return None
                epoch = len(d.regs) + 1 + rng.randrange(3)
                rkey = receipt_public_key(rng.randbytes(32)) if kind is StaleKind.UNREGISTERED else None
                return StalePush(relay, make_registration(d.key, epoch, int(t), LIFETIME_S, rkey), d.tokens.pop(),
                                 kind)
            case StaleKind.CURRENT_SEEN:
                if not self.seen:
                    return None
                regs = list(self.seen.values())[rng.randrange(len(self.seen))]
                return StalePush(relay, regs[-1], rng.randbytes(16), kind)
            case _:
                assert_never(kind)

    def summary(self) -> dict[str, object]:
        """Its pushes by kind and by final status (docs/metrics.md, "Adversarial scenarios")."""
        kinds: dict[str, int] = {}
        for k in self.pushes.values():
            kinds[k] = kinds.get(k, 0) + 1
        settled: dict[str, dict[str, int]] = {}
        for pid, status in self.settled.items():
            by = settled.setdefault(self.pushes[pid], {})
            by[status] = by.get(status, 0) + 1
        return {"stale_pushes": dict(sorted(kinds.items())), "stale_refused_at_entry": self.refused,
                "stale_settled": {k: dict(sorted(v.items())) for k, v in sorted(settled.items())},
                "stale_pending_at_end": len(self.pushes) - len(self.settled)}
