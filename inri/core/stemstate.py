"""The stem's state (rules G5 with the stem, G7, G8, G10, G10b; the rules are in stem.py): one owner.

Which registrations this relay holds a stem route for, the embargoes waiting for their flood, the route
generations seen here, and the stem successors each route id was passed on to. Every rule group that
needs to know asks StemState through its methods (gossip.py: a flood reaching a stem relay, link-up
announcements; forwarding.py: a stem route is kept through route errors; membership.py: a stem
successor's link went down), as aioquic's connection asks its loss recovery.
"""

from __future__ import annotations

from collections.abc import KeysView

from inri.core.tables import RouteEntry, RouteTable
from inri.protocol.messages import Registration

# A stem relay's feasibility distance (rule G7). The flood starts at hops >= STEM_DISTANCE, so no flood
# copy ever becomes a backup at a stem relay. Not 1: distance 1 means "the home is my neighbour" to
# rule F3 (home unreachable), which a stem relay must neither claim nor reveal.
STEM_DISTANCE = 2

# G8: (route id, epoch) -> (until, registration, predecessor, successor)
Embargo = tuple[float, Registration, str | None, str | None]


class StemState:
    """The stem state of one relay; empty with the stem off (each method then answers at once)."""

    __slots__ = ("_held", "_embargo", "_gen", "_next", "_branches", "_restem_at")

    def __init__(self) -> None:
        # G5 with the stem: registrations this relay holds a stem route for, announced on link up
        self._held: dict[bytes, Registration] = {}
        # G8: stem registrations awaiting their flood
        self._embargo: dict[tuple[bytes, int], Embargo] = {}
        # G10: route generations seen here: route id -> (epoch, generation >= 1, the home's signature);
        # the stem successor this relay (the home or a stem relay) passed a route id on to; at a home with
        # no stem successor (G10b), the neighbours the link-up announcements handed a generation to; at
        # the home: when it last re-stemmed a route id.
        self._gen: dict[bytes, tuple[int, int, bytes]] = {}
        self._next: dict[bytes, str] = {}
        self._branches: dict[bytes, set[str]] = {}
        self._restem_at: dict[bytes, float] = {}

    # Stem routes held (G5, G7).
    def holds_any(self) -> bool:
        """This relay holds some stem route."""
        return bool(self._held)

    def held(self, rid: bytes) -> Registration | None:
        """The registration of rid this relay holds a stem route for."""
        return self._held.get(rid)

    def held_ids(self) -> KeysView[bytes]:
        """The route ids this relay holds a stem route for (announced to a new neighbour, G5)."""
        return self._held.keys()

    def hold(self, rid: bytes, reg: Registration) -> None:
        """This relay became a stem relay of reg."""
        self._held[rid] = reg

    def release(self, rid: bytes) -> None:
        """rid's stem route is gone or superseded."""
        self._held.pop(rid, None)

    def keeps(self, rid: bytes, entry: RouteEntry, peer: str) -> bool:
        """Rule G7: peer is this stem relay's stem next hop (its predecessor) for rid: its only next hop,
        and the only way to the home there is. A `no route` or an unanswered push from it (a frame lost
        on the way, or a break further down the stem) then demotes nothing and drops nothing: dropping
        it left the stem relay, and with it the route's whole flood, with no route until the next
        refresh, for one lost frame (churn-2k: 7 of 35 lost pushes). Loop-free as before: a stem route
        never passes a flood relay."""
        if not self._held:
            return False
        held = self._held.get(rid)
        return (held is not None and held.epoch == RouteTable.epoch(entry)
                and RouteTable.distance(entry) == STEM_DISTANCE and RouteTable.primary(entry) == peer)

    # Embargoes (G8).
    def any_embargo(self) -> bool:
        """Some embargo is armed (the engine's timer looks for overdue ones)."""
        return bool(self._embargo)

    def embargoed(self, key: tuple[bytes, int]) -> bool:
        """(route id, epoch) is waiting for its flood here."""
        return bool(self._embargo) and key in self._embargo

    def waiting(self, key: tuple[bytes, int]) -> Embargo | None:
        """The embargo of (route id, epoch), if armed."""
        return self._embargo.get(key)

    def arm(self, key: tuple[bytes, int], embargo: Embargo) -> None:
        """Arm (or re-arm) the embargo of (route id, epoch)."""
        self._embargo[key] = embargo

    def end_embargo(self, key: tuple[bytes, int]) -> Embargo:
        """The flood of (route id, epoch) came back: its embargo, which must be armed, ends."""
        return self._embargo.pop(key)

    def cancel_embargo(self, key: tuple[bytes, int]) -> None:
        """Drop the embargo of (route id, epoch) if armed."""
        self._embargo.pop(key, None)

    def pop_overdue(self, now: float) -> list[tuple[tuple[bytes, int], Embargo]]:
        """The embargoes expired at now, removed, in the order they were armed."""
        due = [(k, e) for k, e in self._embargo.items() if e[0] <= now]
        for k, _ in due:
            del self._embargo[k]
        return due

    # Route generations (G10).
    def generations(self) -> bool:
        """Some route generation is known here (otherwise frames without one need no G10 check)."""
        return bool(self._gen)

    def generation(self, rid: bytes) -> tuple[int, int, bytes] | None:
        """(epoch, generation, the home's signature) of rid, if a generation of it was seen."""
        return self._gen.get(rid) if self._gen else None

    def generation_of(self, rid: bytes, epoch: int) -> int:
        """rid's generation at epoch (0: none)."""
        g = self._gen.get(rid)
        return g[1] if g is not None and g[0] == epoch else 0

    def set_generation(self, rid: bytes, epoch: int, generation: int, sig: bytes) -> None:
        """rid's route now stands at (epoch, generation), signed by the home."""
        self._gen[rid] = (epoch, generation, sig)

    def drop_generation(self, rid: bytes) -> None:
        """rid's route now stands at no generation."""
        self._gen.pop(rid, None)

    # Stem successors (G10, G10b).
    def repairable(self) -> bool:
        """Some G10 state is held (a route that goes must then forget it)."""
        return bool(self._gen or self._next or self._branches or self._restem_at)

    def has_successors(self) -> bool:
        """Some route id was passed on to a stem successor (or handed to a G10b branch)."""
        return bool(self._next or self._branches)

    def forget(self, rid: bytes) -> None:
        """rid's route is gone: so is its generation, successors and re-stem pace."""
        self._gen.pop(rid, None)
        self._next.pop(rid, None)
        self._branches.pop(rid, None)
        self._restem_at.pop(rid, None)

    def pass_on(self, rid: bytes, succ: str) -> None:
        """rid was passed on its stem to succ: succ's link going down re-stems it."""
        self._next[rid] = succ

    def drop_successor(self, rid: bytes) -> None:
        """rid has no stem successor here (any more)."""
        self._next.pop(rid, None)

    def passed_to(self, peer: str) -> list[bytes]:
        """The route ids passed on to peer, in the order they were."""
        return [r for r, s in self._next.items() if s == peer]

    def is_successor(self, rid: bytes, peer: str) -> bool:
        """peer is rid's stem successor here, or one of its G10b branches."""
        return self._next.get(rid) == peer or peer in self._branches.get(rid, ())

    def start_branches(self, rid: bytes) -> None:
        """G10b: rid has no stem successor yet; the link-up announcements will hand it out."""
        self._branches[rid] = set()

    def end_branches(self, rid: bytes) -> None:
        """rid has a stem successor: no G10b branches."""
        self._branches.pop(rid, None)

    def branching(self, rid: bytes) -> bool:
        """rid's G10b branches are open."""
        return rid in self._branches

    def add_branch(self, rid: bytes, peer: str) -> None:
        """G10b: peer was handed rid's generation by a link-up announcement."""
        self._branches.setdefault(rid, set()).add(peer)

    def branched_to(self, peer: str) -> list[bytes]:
        """G10b: the route ids whose branches include peer, in the order they were opened."""
        return [r for r, s in self._branches.items() if peer in s]

    def drop_branch(self, rid: bytes, peer: str) -> None:
        """peer's link went down: no longer one of rid's G10b branches."""
        self._branches[rid].discard(peer)

    # Re-stem pace (G10, at the home).
    def restemmed_at(self, rid: bytes) -> float | None:
        """When the home last re-stemmed rid."""
        return self._restem_at.get(rid)

    def restemmed(self, rid: bytes, now: float) -> None:
        """The home re-stems rid now."""
        self._restem_at[rid] = now
