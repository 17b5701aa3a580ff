"""The registrations homed here and their link-up announcements (rule G5; the rule is in gossip.py): one
owner.

A home relay keeps the newest registration of every device homed here and, for each neighbour whose
link came up, the route ids still to announce to it (paced within its budget: gossip.py sends a few at
link-up, the engine's tick the rest). gossip.py changes the registrations (register, unregister) and
sends the announcements, membership.py queues them on link up and drops them on link down, stem.py asks
for a registration to re-stem (G10), as aioquic's connection asks its loss recovery.
"""

from __future__ import annotations

from collections.abc import Iterable

from inri.protocol.messages import Registration


class HomedRoutes:
    """Registrations homed here (route id -> newest) and the announcements queued per neighbour (G5)."""

    __slots__ = ("_regs", "_queued")

    def __init__(self) -> None:
        self._regs: dict[bytes, Registration] = {}
        # neighbour -> route ids still to announce to it, the next one last (sent from the end)
        self._queued: dict[str, list[bytes]] = {}

    # -- the registrations --------------------------------------------------------------------------

    def keep(self, reg: Registration) -> None:
        """A device homed here registered: keep its registration unless one of a newer epoch is kept."""
        known = self._regs.get(reg.route_id)
        if known is None or reg.epoch >= known.epoch:
            self._regs[reg.route_id] = reg

    def forget(self, rid: bytes) -> None:
        """The device unregistered (or was never homed here)."""
        self._regs.pop(rid, None)

    def get(self, rid: bytes) -> Registration | None:
        """The registration homed here for rid (None: not homed here)."""
        return self._regs.get(rid)

    def any(self) -> bool:
        """Some registration is homed here."""
        return bool(self._regs)

    # -- the announcements (G5) ---------------------------------------------------------------------

    def queue(self, peer: str, also: Iterable[bytes]) -> None:
        """Announce every registration homed here, then the route ids `also` (the stem routes held), to
        peer, whose link came up: sent from the end, the last of `also` first."""
        self._queued[peer] = [*self._regs, *also]

    def queued(self, peer: str) -> bool:
        """Announcements are queued for peer (possibly none left)."""
        return peer in self._queued

    def next_for(self, peer: str) -> bytes | None:
        """The next route id to announce to peer, taken off its queue; a queue left empty goes (None: none
        left, or none queued)."""
        queue = self._queued.get(peer)
        if not queue:
            self._queued.pop(peer, None)
            return None
        rid = queue.pop()
        if not queue:
            del self._queued[peer]
        return rid

    def drop_peer(self, peer: str) -> None:
        """peer's link went down (or it is not a neighbour): nothing more is announced to it."""
        self._queued.pop(peer, None)

    def waiting(self) -> list[str]:
        """The neighbours with announcements queued, in the order their links came up."""
        return list(self._queued)
