"""Route sync's state (rule G11, sync.py): one owner, `SyncState`, held by the engine as `_sync`.

The asker's side: until when this relay asks the neighbours whose links come up for their routes, which
neighbours it asked on their current link, and the provisional routes learnt from their answers. The
answering side: the neighbours answered on their current link, the route ids still to send each (a cursor
from the end of a shared list), and that list with when it was read. The rules (what is asked, answered,
taken, used) stay in sync.py; membership.py opens the window at start, asks on link up and forgets a link
that goes down.
"""

from __future__ import annotations

from inri.core.tables import BoundedMap

# A provisional route: (the neighbour it was learnt from, distance, expiry, fallback: the route table held
# a live next hop for it when it came, so it stands in only once the route has no next hop left)
Provisional = tuple[str, int, float, bool]


class SyncState:
    """G11's tables: the asking window and links asked, answers queued, provisional routes."""

    __slots__ = ("_until", "_asked", "_served", "_out", "_keys", "_provisional")

    def __init__(self, route_max: int) -> None:
        self._until = -float("inf")
        self._asked: set[str] = set()
        self._served: set[str] = set()
        self._out: dict[str, tuple[list[bytes], int]] = {}  # neighbour -> (route ids, how many left from the end)
        self._keys: tuple[float, list[bytes]] | None = None  # the route ids read for answers, and when
        self._provisional: BoundedMap[bytes, Provisional] = BoundedMap(route_max)

    # the asker
    def open_window(self, until: float) -> None:
        """Ask the neighbours whose links come up before `until`."""
        self._until = until

    def wanted(self, now: float) -> bool:
        """True while this relay asks new neighbours for their routes."""
        return now < self._until

    def ask(self, peer: str) -> None:
        """peer was asked on its current link: its RouteSync frames are taken."""
        self._asked.add(peer)

    def asked(self, peer: str) -> bool:
        """Whether peer was asked on its current link."""
        return peer in self._asked

    def link_down(self, peer: str) -> None:
        """peer's link went down: a RouteSync on a later link is taken only if asked there, a request on it
        is answered again, and what was still to send it goes."""
        self._asked.discard(peer)
        self._served.discard(peer)
        self._out.pop(peer, None)

    # the neighbour asked
    def serve(self, peer: str) -> bool:
        """peer asks on this link: True the first time (it is answered), False again."""
        if peer in self._served:
            return False
        self._served.add(peer)
        return True

    def keys(self, now: float, max_age: float) -> list[bytes] | None:
        """The route ids read for answers, when read within max_age (None: read them again)."""
        got = self._keys
        return got[1] if got is not None and now - got[0] <= max_age else None

    def keep_keys(self, now: float, keys: list[bytes]) -> None:
        """The route ids just read for answers, shared by the neighbours that ask meanwhile."""
        self._keys = (now, keys)

    def queue(self, peer: str, keys: list[bytes], left: int) -> None:
        """`left` route ids of keys (from the end) are still to send peer; none left: done."""
        if left:
            self._out[peer] = (keys, left)
        else:
            self._out.pop(peer, None)

    def queued(self, peer: str) -> tuple[list[bytes], int] | None:
        """What is still to send peer: (route ids, how many from the end), None: nothing."""
        return self._out.get(peer)

    def answering(self) -> list[str]:
        """The neighbours still owed routes, in the order they asked."""
        return list(self._out)

    # provisional routes
    def any_provisional(self) -> bool:
        """Whether any provisional route is held."""
        return bool(self._provisional)

    def provisional(self, rid: bytes) -> Provisional | None:
        """rid's provisional route (None: none)."""
        return self._provisional.get(rid)

    def take(self, rid: bytes, route: Provisional) -> None:
        """Keep a provisional route for rid (the oldest goes when route_max are held)."""
        self._provisional.put(rid, route)

    def drop(self, rid: bytes, peer: str) -> bool:
        """rid's provisional route through peer goes; False: it had none through peer."""
        got = self._provisional.get(rid)
        if got is None or got[0] != peer:
            return False
        del self._provisional[rid]
        return True

    def purge(self, peer: str) -> None:
        """Every provisional route through peer goes."""
        gone = [rid for rid, (p, _, _, _) in self._provisional.items() if p == peer]
        for rid in gone:
            del self._provisional[rid]

    def sweep(self, now: float) -> None:
        """Expired provisional routes go."""
        if self._provisional:
            self._provisional.sweep(lambda v: v[2] <= now)

    def provisional_size(self) -> int:
        """How many provisional routes are held (stats)."""
        return len(self._provisional)

    def provisional_peers(self) -> list[tuple[bytes, str]]:
        """(route id, neighbour) of every provisional route, oldest first."""
        return [(rid, p) for rid, (p, _, _, _) in self._provisional.items()]
