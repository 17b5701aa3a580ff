"""What registration gossip keeps per route id beside the route table (rules G3b and G4; the rules are
in gossip.py and stem.py): one owner.

G4: every refresh of a known route id (a newer epoch, or a new route generation, G10) spends a token of
that route id's own budget, whichever neighbour sent it. G3b: the (route id, epoch)s whose first copy
spent more than half its TTL before it got here, with the fewest hops forwarded so far, so that a later,
shorter copy goes on too. gossip.py and stem.py ask and change both through these methods; the sweep of
expired routes (gossip.py) drops their budgets.
"""

from __future__ import annotations

from inri.core.budget import TokenBucket
from inri.core.tables import BoundedMap

DEEP_MAX = 65536  # G3b entries kept (oldest evicted): only far-travelled (route, epoch)s are entered


class FloodState:
    """G4's per-route-id refresh budgets and G3b's far-travelled first copies."""

    __slots__ = ("_budgets", "_deep")

    def __init__(self) -> None:
        self._budgets: dict[bytes, TokenBucket] = {}  # route id -> refresh budget (G4)
        self._deep: BoundedMap[tuple[bytes, int], int] = BoundedMap(DEEP_MAX)  # (route id, epoch) -> fewest hops

    # -- G4 -----------------------------------------------------------------------------------------

    def refresh_allowed(self, rid: bytes, now: float, rate: float, burst: float) -> bool:
        """Spend one token of rid's refresh budget (made full at its first refresh). False: over budget."""
        bucket = self._budgets.get(rid)
        if bucket is None:
            bucket = self._budgets[rid] = TokenBucket(float(burst), now)
        return bucket.take(now, rate, burst)

    def forget(self, rid: bytes) -> None:
        """rid's route went (expired, unregistered): its budget goes with it."""
        self._budgets.pop(rid, None)

    # -- G3b ----------------------------------------------------------------------------------------

    def went_deep(self, rid: bytes, epoch: int, hops: int) -> None:
        """The first copy of (rid, epoch) spent more TTL than it has left, `hops` forwarded."""
        self._deep.put((rid, epoch), hops)

    def is_deep(self, rid: bytes, epoch: int) -> bool:
        """(rid, epoch)'s first copy came a long way (went_deep)."""
        deep = self._deep
        return bool(deep) and (rid, epoch) in deep

    def shorter(self, rid: bytes, epoch: int, hops: int) -> bool:
        """A copy of a far-travelled (rid, epoch) `hops` away is shorter than any forwarded so far: True,
        and it is the shortest now. False: not far-travelled, or not shorter."""
        key = (rid, epoch)
        best = self._deep.get(key)
        if best is None or hops >= best:
            return False
        self._deep.put(key, hops)
        return True

    def forget_deep(self, rid: bytes, epoch: int) -> None:
        """(rid, epoch)'s route was replaced (a newer route generation, G10)."""
        self._deep.pop((rid, epoch), None)
