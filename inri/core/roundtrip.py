"""The round-trip estimate of rule C4 (docs/protocol.md; rtt.py holds the rules that use it): one owner,
`RttEstimator`, held by the engine as `_rtt`, as aioquic's connection holds its loss recovery."""

from __future__ import annotations

from inri.core.config import EngineConfig
from inri.core.tables import BoundedMap

RTT_ALPHA = 0.125  # RFC 6298 section 2: srtt gain
RTT_BETA = 0.25  # RFC 6298 section 2: rttvar gain
RTT_VAR_FACTOR = 4.0  # RFC 6298: RTO = SRTT + K x RTTVAR, K = 4
# d x (srtt + 4 rttvar) is RFC 6298's RTO for a path of d links. Measured (quic loss model): on
# loss-1k it re-sends 5% of the pushes while their receipt is on its way (+4% push messages); twice
# that re-sends 0.6%, but puts most routes of churn-2k at the 2 s cap (latency p95 2.2 s, not 1.4 s).
PATH_FACTOR = 1.0
# C4b: route ids whose last receipt's hop count a custodian remembers (stem on), oldest first out.
ROUTE_LEN_MAX = 4096
# A per-link sample larger than this is not a link's round trip (the longest terrestrial ones are
# ~0.3 s) but a stall on the path (a host paused, a QUIC backoff, a relay that died): it would inflate
# rttvar and keep every retry at the cap for a long while. Such pushes are S1's business.
MAX_LINK_SAMPLE_S = 0.5


class RttEstimator:
    """Rule C4's per-link round-trip estimate (srtt, rttvar), the retry periods it gives, and C4b's route
    lengths: the engine holds one (`Engine._rtt`), fed by keepalive answers and receipts, asked by
    custody (retry periods) and forwarding (F8's repair wait)."""

    __slots__ = ("_srtt", "_rttvar", "_from_paths", "_route_len", "_adaptive", "_cap", "_floor", "_stem")

    def __init__(self, config: EngineConfig) -> None:
        self._srtt = 0.0  # per-link round-trip estimate (0: no sample yet)
        self._rttvar = 0.0  # and its variation
        self._from_paths = False  # a receipt sample came: keepalive samples are ignored from then on
        self._route_len: BoundedMap[bytes, int] = BoundedMap(ROUTE_LEN_MAX)  # C4b: links of the last receipt
        self._adaptive = config.adaptive_retry
        self._cap = config.custody_retry_s
        self._floor = config.receipt_timeout_min_s
        self._stem = config.stem

    def sample(self, per_link: float, path: bool) -> None:
        """Feed one per-link round-trip sample (seconds) into srtt / rttvar; path: from a receipt."""
        if not 0.0 < per_link <= MAX_LINK_SAMPLE_S:
            return
        if path and not self._from_paths:
            self._from_paths = True
            self._srtt = 0.0  # the keepalive prior goes
        elif not path and self._from_paths:
            return
        if self._srtt <= 0.0:
            self._srtt = per_link
            self._rttvar = per_link / 2
        else:
            self._rttvar += RTT_BETA * (abs(self._srtt - per_link) - self._rttvar)
            self._srtt += RTT_ALPHA * (per_link - self._srtt)

    def srtt(self) -> float:
        """The per-link round-trip estimate (0.0: no sample yet)."""
        return self._srtt

    def link_wait(self, k: float) -> float:
        """srtt + k x rttvar: one link's round trip with k variations of margin."""
        return self._srtt + k * self._rttvar

    def active(self) -> bool:
        """True when retries follow the estimate: adaptive_retry on and a sample came."""
        return self._adaptive and self._srtt > 0.0

    def route_links(self, rid: bytes, distance: int) -> int:
        """C4b: the links a push to rid takes, for a route at `distance` (with the stem on, the hops of
        the route's last receipt when smaller)."""
        if self._stem:
            known = self._route_len.get(rid)
            if known is not None and known < distance:
                return known
        return distance

    def route_measured(self, rid: bytes, hops: int) -> None:
        """C4b: a receipt for rid came back over `hops` links (remembered with the stem on only)."""
        if self._stem and hops > 0:
            self._route_len.put(rid, hops)

    def path_period(self, links: int) -> float:
        """C4's retry period for a route `links` links long (custody_retry_s without an estimate)."""
        cap = self._cap
        if links <= 0 or not self._adaptive or self._srtt <= 0.0:
            return cap
        expected = PATH_FACTOR * links * (self._srtt + RTT_VAR_FACTOR * self._rttvar)
        return min(cap, max(self._floor, expected))
