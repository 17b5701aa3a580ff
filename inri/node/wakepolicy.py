"""When a home relay wakes a device through its hook: coalescing, rate limit and backoff, sans IO.

The rules (docs/gateway.md, "When the home relay wakes a device"):

- W1 (mail): a message waits for an owner (a device, or a Mozilla Push user agent) that has a
  hook and no live stream: a wake-up is due at once, unless one is being sent or was sent less than
  `coalesce_s` ago and nothing has been acknowledged since (then the mail is *coalesced*: it is
  noted, and one wake-up goes out when the window ends, if mail still waits then).
- W2 (ack): an acknowledgement ends the window: the next message wakes at once. Mail that still
  waits after the acknowledgement counts as new mail (the app may have pulled before it came).
- W3 (rate): every request to the hook takes a token of the hook's bucket (`rate_per_s`, `burst`);
  an empty bucket defers the wake-up until a token is due, it never drops it.
- W4 (backoff): a failed request (the gateway unreachable, 429, 5xx) is retried after
  retry_min_s * 2^(n-1), capped at retry_max_s, half of it jittered, or after the gateway's
  Retry-After when that is longer; after `retry_attempts` failures the wake-up is given up.
- W5 (gone): the gateway says the token is gone: the owner is forgotten (the driver deletes the hook).

Plain object, no clock, no IO (as the engine in inri/core): every call takes `now`, `get_timer()`
says when `take_due` has work next, and tests drive it with explicit times. The driver is
inri/node/wake.py; the stale heap entries of rescheduled owners are dropped as they surface.
"""

from __future__ import annotations

import enum
import heapq
import random
from dataclasses import dataclass, field

from inri.core.budget import TokenBucket

RETRY_AFTER_MAX_S = 3600.0  # a gateway's Retry-After is honoured up to this (never parks a hook for longer)


class OwnerKind(enum.IntEnum):
    """Whose hook: a device of the device API, or a Mozilla Push user agent (inri/node/agents.py)."""

    DEVICE = 1  # key: the device's route id
    UAID = 2  # key: the user agent's uaid


@dataclass(frozen=True, slots=True)
class Owner:
    """The holder of one wake hook."""

    kind: OwnerKind
    key: bytes


class Phase(enum.Enum):
    """Where an owner's wake-up stands."""

    IDLE = "idle"  # nothing to send
    DUE = "due"  # a wake-up waits for its time (first try, rate limit, or retry)
    SENDING = "sending"  # the driver is sending it
    COOLING = "cooling"  # sent; the coalescing window runs until `at`


@dataclass(slots=True)
class _State:
    bucket: TokenBucket
    phase: Phase = Phase.IDLE
    at: float = 0.0  # DUE: when to send; COOLING: when the window ends
    failures: int = 0  # failed attempts of the wake-up being sent
    dirty: bool = False  # mail came while SENDING or COOLING
    acked: bool = False  # an ack came while SENDING
    seq: int = 0  # the heap entry that is current (older ones are stale)


@dataclass(frozen=True)
class WakeLimits:
    """The [wake] numbers the rules use (inri.node.config.WakeSection)."""

    coalesce_s: float = 60.0
    rate_per_s: float = 0.1
    rate_burst: int = 10
    retry_min_s: float = 1.0
    retry_max_s: float = 300.0
    retry_attempts: int = 12


@dataclass
class WakePolicy:
    """The state of every owner with a hook; see the module docstring for the rules."""

    limits: WakeLimits = field(default_factory=WakeLimits)
    rng: random.Random = field(default_factory=random.Random)
    counters: dict[str, int] = field(default_factory=dict)
    _states: dict[Owner, _State] = field(default_factory=dict)
    _heap: list[tuple[float, int, Owner]] = field(default_factory=list)
    _seq: int = 0

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def _state(self, owner: Owner, now: float) -> _State:
        st = self._states.get(owner)
        if st is None:
            st = self._states[owner] = _State(TokenBucket(float(self.limits.rate_burst), now))
        return st

    def _arm(self, owner: Owner, st: _State, phase: Phase, at: float) -> None:
        st.phase, st.at = phase, at
        self._seq += 1
        st.seq = self._seq
        heapq.heappush(self._heap, (at, self._seq, owner))

    def phase(self, owner: Owner) -> Phase:
        """Where owner's wake-up stands (IDLE for an owner never seen)."""
        st = self._states.get(owner)
        return Phase.IDLE if st is None else st.phase

    # -- inputs -----------------------------------------------------------------------------------

    def mail(self, owner: Owner, now: float) -> None:
        """W1: a message waits for owner (which has a hook and no live stream)."""
        st = self._state(owner, now)
        match st.phase:
            case Phase.IDLE:
                self._arm(owner, st, Phase.DUE, now)
            case Phase.DUE:
                pass  # the wake-up already due carries this message too
            case Phase.SENDING | Phase.COOLING:
                if not st.dirty:
                    self._count("coalesced")
                st.dirty = True

    def acked(self, owner: Owner, now: float, still_waiting: bool) -> None:
        """W2: owner acknowledged messages; still_waiting: mail is left after the acknowledgement."""
        st = self._states.get(owner)
        if st is None:
            return
        match st.phase:
            case Phase.SENDING:
                st.acked = True
                st.dirty = still_waiting
            case Phase.COOLING | Phase.DUE:
                st.failures = 0
                st.dirty = False
                st.phase = Phase.IDLE
                st.seq = 0
                if still_waiting:
                    self.mail(owner, now)
            case Phase.IDLE:
                if still_waiting:
                    self.mail(owner, now)

    def forget(self, owner: Owner) -> None:
        """W5 (or the hook was removed, or the owner unregistered): nothing more for owner."""
        self._states.pop(owner, None)

    # -- the driver's loop ------------------------------------------------------------------------

    def get_timer(self) -> float | None:
        """When take_due next has something to do (None: nothing scheduled)."""
        heap = self._heap
        while heap:
            at, seq, owner = heap[0]
            st = self._states.get(owner)
            if st is not None and st.seq == seq and st.phase in (Phase.DUE, Phase.COOLING):
                return at
            heapq.heappop(heap)  # stale: rescheduled, acked or forgotten since
        return None

    def take_due(self, now: float) -> list[Owner]:
        """Owners whose wake-up is to be sent now (they are SENDING until sent() or failed()).

        Ends the coalescing windows that ran out (W1) and defers wake-ups whose hook has no token
        left (W3)."""
        out: list[Owner] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, seq, owner = heapq.heappop(heap)
            st = self._states.get(owner)
            if st is None or st.seq != seq:
                continue
            if st.phase == Phase.COOLING:
                if st.dirty:
                    st.dirty = False
                    self._arm(owner, st, Phase.DUE, now)
                else:
                    st.phase, st.seq = Phase.IDLE, 0
                continue
            if st.phase != Phase.DUE:
                continue
            if not st.bucket.take(now, self.limits.rate_per_s, float(self.limits.rate_burst)):
                self._count("rate_limited")
                self._arm(owner, st, Phase.DUE, now + st.bucket.wait(self.limits.rate_per_s))
                continue
            st.phase, st.seq, st.acked = Phase.SENDING, 0, False
            out.append(owner)
        return out

    def skipped(self, owner: Owner) -> None:
        """The driver did not send a due wake-up (a live stream now, or nothing waits any more)."""
        st = self._states.get(owner)
        if st is not None and st.phase == Phase.SENDING:
            st.phase, st.failures, st.dirty = Phase.IDLE, 0, False

    def sent(self, owner: Owner, now: float) -> None:
        """The gateway took the wake-up: the coalescing window starts (unless an ack came meanwhile)."""
        st = self._states.get(owner)
        if st is None or st.phase != Phase.SENDING:
            return
        self._count("sent")
        st.failures = 0
        if st.acked:  # W2 during the request: the window is already over
            dirty, st.dirty = st.dirty, False
            st.phase = Phase.IDLE
            if dirty:
                self.mail(owner, now)
            return
        self._arm(owner, st, Phase.COOLING, now + self.limits.coalesce_s)

    def failed(self, owner: Owner, now: float, retry_after: float | None = None) -> bool:
        """W4: the request failed and may be retried; False when the wake-up is given up."""
        st = self._states.get(owner)
        if st is None or st.phase != Phase.SENDING:
            return False
        st.failures += 1
        if st.failures >= self.limits.retry_attempts:
            self._count("given_up")
            st.phase, st.failures, st.dirty = Phase.IDLE, 0, False
            return False
        lim = self.limits
        backoff = min(lim.retry_max_s, lim.retry_min_s * 2.0 ** (st.failures - 1))
        delay = backoff / 2 + self.rng.random() * backoff / 2  # jitter: relays do not retry in step
        if retry_after is not None:
            delay = max(delay, min(retry_after, RETRY_AFTER_MAX_S))
        self._count("retried")
        self._arm(owner, st, Phase.DUE, now + delay)
        return True

    def dropped(self, owner: Owner) -> None:
        """A permanent refusal of this one wake-up (not of the token): back to IDLE, the hook stays."""
        st = self._states.get(owner)
        if st is not None and st.phase == Phase.SENDING:
            self._count("refused")
            st.phase, st.failures, st.dirty = Phase.IDLE, 0, False
