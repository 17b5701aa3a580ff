"""Whether the rest of the mesh can reach this relay, told straight (/v1/status, /healthz, metrics, log).

Two facts an operator needs and cannot see from the inside:
- the bootstrap's verdict on the relay's public address: an announcement is proven by a QUIC
  handshake back to every announced address; a 422 `unreachable` names the address that did not
  answer, and the relay logs `unreachable from the bootstrap: open UDP PORT` (the announce request
  waits longer than the bootstrap's probe, ANNOUNCE_TIMEOUT_S, so that answer arrives);
- how long the relay has had no neighbour: past `[relay] isolated_degraded_s`, /healthz answers 503
  `degraded` (an isolated relay still serves its own devices, but pushes from elsewhere cannot reach them).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from inri.common.addr import parse_addr

# The relay's announce request waits this long: more than a bootstrap's probes of the record's
# addresses take (`probe_timeout_s`, 3 s each by default, up to four addresses in turn would be 12 s;
# two, the IPv4 + IPv6 case, 6 s), so the bootstrap's "unreachable" answer arrives instead of a timeout.
ANNOUNCE_TIMEOUT_S = 15.0


class AnnounceOutcome(enum.StrEnum):
    """The last announcement's result, as /v1/status and the metric label say it."""

    NONE = "none"  # not announced yet
    LISTED = "listed"  # a bootstrap listed the relay (its addresses answered the probe)
    UNREACHABLE = "unreachable"  # the bootstrap could not reach an announced address (422)
    DUPLICATE = "duplicate_identity"  # another relay answers with this relay's key elsewhere (409)
    REFUSED = "refused"  # any other refusal (its code in `detail`)
    NO_BOOTSTRAP = "no_bootstrap"  # no bootstrap answered at all


@dataclass
class Reachability:
    """The relay's view of its own reachability (the bootstrap loop and the link events feed it)."""

    isolated_degraded_s: float
    started_at: float
    outcome: AnnounceOutcome = AnnounceOutcome.NONE
    detail: str = ""
    unreachable_addr: str = ""
    failures: dict[str, int] = field(default_factory=dict)  # outcome -> failed announcements
    isolated_since: float | None = None  # no neighbour since (monotonic); None while linked

    def __post_init__(self) -> None:
        self.isolated_since = self.started_at  # a relay starts with no neighbour

    def announced(self, outcome: AnnounceOutcome, detail: str = "") -> None:
        """Record an announcement's outcome (a failure is counted by its outcome)."""
        self.outcome, self.detail = outcome, detail
        self.unreachable_addr = unreachable_addr(detail) if outcome is AnnounceOutcome.UNREACHABLE else ""
        if outcome is not AnnounceOutcome.LISTED:
            self.failures[outcome.value] = self.failures.get(outcome.value, 0) + 1

    def neighbours(self, count: int, now: float) -> None:
        """The relay has `count` neighbours at `now` (monotonic)."""
        if count > 0:
            self.isolated_since = None
        elif self.isolated_since is None:
            self.isolated_since = now

    def isolated_for(self, now: float) -> float:
        """Seconds without a neighbour (0 while linked)."""
        return 0.0 if self.isolated_since is None else max(0.0, now - self.isolated_since)

    def degraded_reasons(self, now: float) -> list[str]:
        """Why /healthz says degraded (empty: ok)."""
        reasons = []
        if self.isolated_since is not None and now - self.isolated_since > self.isolated_degraded_s:
            reasons.append(f"no neighbour for {now - self.isolated_since:.0f} s (over {self.isolated_degraded_s:g} s)")
        if self.outcome is AnnounceOutcome.UNREACHABLE:
            reasons.append(f"unreachable from the bootstrap: open UDP {self.port_hint()}")
        if self.outcome is AnnounceOutcome.DUPLICATE:
            reasons.append("another relay uses this relay's identity: " + self.detail)
        return reasons

    def port_hint(self) -> str:
        """The UDP port the bootstrap could not reach (from its answer), as the log line names it."""
        try:
            return str(parse_addr(self.unreachable_addr)[1])
        except ValueError:
            return "(the QUIC port)"

    def status(self, now: float) -> dict[str, Any]:
        """The `reachability` object of /v1/status."""
        return {"announce": self.outcome.value, "detail": self.detail,
                "unreachable_addr": self.unreachable_addr or None,
                "isolated_s": round(self.isolated_for(now), 1), "isolated_degraded_s": self.isolated_degraded_s,
                "announce_failures": dict(sorted(self.failures.items()))}


def unreachable_addr(detail: str) -> str:
    """The address in a bootstrap's `unreachable` detail ("no QUIC handshake with this node key at ADDR")."""
    return detail.rsplit(" at ", 1)[1].strip() if " at " in detail else ""
