"""When a device with several homes registers again after losing one (docs/api.md, "Homes in two places").

A route id registered at two homes is anycast, but the mesh learns one route per (route id, epoch): each
relay routes to the home whose flood reached it first, so the mesh is split in two cells. When one home
fails, the relays of its cell hold routes only into the dead home. The device sees its stream to that home
drop; registering again at its next epoch at the homes still live makes them originate the newer epoch,
whose flood replaces every relay's route (rule G1) and wakes the pushes custodians parked (rule C3c)
(docs/results/2026-11-29-multi-home-sim.md: multi-home delivery 0.91 -> 1.000 on multihome-5k).

This module holds only the decision, sans-IO (every call takes `now`), so that its bounds are tested
with a virtual clock:

- a home counts as failed when its stream drops abnormally or cannot be opened (not on a stream end the
  device caused); the device registers again once a home has stayed failed for `delay_s` (a home back
  within the delay costs nothing: a restart or a flap shorter than it floods nothing);
- at most once per failure of a home (one re-registration covers every home failed at that moment);
- never while no other home is live (the new epoch would reach no relay, and the device could not
  know which epoch its homes hold);
- re-registrations are spaced by a gap that starts at `GAP_MIN_S` and doubles up to `GAP_MAX_S` while
  homes keep failing, and falls back to `GAP_MIN_S` after `GAP_MAX_S` without one: a home that flaps
  costs one flood per gap (about ten in its first hour, then one an hour), not one per flap (a flood
  costs about one message per mesh link).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# The default wait after a home fails before registering again: the simulator found 0.5, 3 and 10 s
# alike (docs/results/2026-11-29-multi-home-sim.md); 3 s lets a relay restart or a short network blip
# pass without a flood.
REREGISTER_AFTER_S = 3.0
# The spacing of re-registrations while homes keep failing (see the module docstring).
GAP_MIN_S = 30.0
GAP_MAX_S = 3600.0


@dataclass
class _HomeState:
    up: bool = False
    down_since: float | None = None  # when the failure going on began (None: up, or not yet seen)
    handled: bool = False  # this failure already led to a re-registration


class Failover:
    """The re-registration policy of one multi-home device (see the module docstring).

    Homes are numbered 0..n-1 as the device lists them. `delay_s` 0 disables re-registration.
    """

    def __init__(self, n_homes: int, delay_s: float = REREGISTER_AFTER_S) -> None:
        if not (math.isfinite(delay_s) and delay_s >= 0):
            raise ValueError(f"reregister_after must be a finite number of seconds >= 0, not {delay_s}")
        self.delay_s = delay_s
        self._homes = [_HomeState() for _ in range(n_homes)]
        self._gap = GAP_MIN_S
        self._last = -math.inf  # the last re-registration
        self._not_before = -math.inf  # no re-registration before this (the gap after the last one)
        self.reregistrations = 0

    def is_up(self, home: int) -> bool:
        """Whether the home's stream (or its last call) is live."""
        return self._homes[home].up

    def up(self, home: int) -> None:
        """The home answered (its stream opened, or a call went through): a failure of it is over."""
        h = self._homes[home]
        h.up, h.down_since, h.handled = True, None, False

    def lost(self, home: int, now: float) -> None:
        """The home's stream dropped abnormally, or the home could not be reached (again)."""
        h = self._homes[home]
        if h.down_since is None:  # a new failure (a home already failed stays failed since then)
            h.up, h.down_since, h.handled = False, now, False

    def known_down(self, home: int, now: float) -> None:
        """A home that failed before and whose failure was handled (the device registered again without it,
        then restarted): not a new failure."""
        h = self._homes[home]
        h.up, h.down_since, h.handled = False, now, True

    def _waiting(self) -> list[_HomeState]:
        return [h for h in self._homes if h.down_since is not None and not h.handled]

    def deadline(self) -> float:
        """When `due()` turns true unless an event comes first (inf: not without an event)."""
        waiting = self._waiting()
        if self.delay_s == 0 or not waiting or not any(h.up for h in self._homes):
            return math.inf
        first = min(h.down_since for h in waiting if h.down_since is not None)
        return max(first + self.delay_s, self._not_before)

    def due(self, now: float) -> bool:
        """Whether the device should register again now."""
        return now >= self.deadline()

    def done(self, now: float) -> None:
        """The device registered again (or tried to: a failure is not retried, the next one may be)."""
        for h in self._waiting():
            h.handled = True
        if now - self._last > GAP_MAX_S:  # the homes were quiet for a long while: a new episode
            self._gap = GAP_MIN_S
        self.reregistrations += 1
        self._last = now
        self._not_before = now + self._gap
        self._gap = min(self._gap * 2, GAP_MAX_S)
