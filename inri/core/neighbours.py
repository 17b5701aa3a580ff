"""The neighbour set (rules M1-M7; the rules are in membership.py): one owner.

Who this relay is linked to (the active view, in the order the links came up), the candidates it may
dial (the passive view, oldest first), the dials under way, the former neighbours it re-dials (M6), the
neighbours banned for their score (S2), the inbound links held on probation while full (M4), when each
former neighbour's link went down (F3) and when a frame last came from any neighbour (C7). Every rule
group asks `Neighbours` through its methods, as aioquic's connection asks its loss recovery; membership.py
decides whom to dial, admit, evict and re-dial, scoring.py whom to ban.

The per-link record (`state.Neighbour`: liveness, budgets, score, C7 queue) is the engine's to update;
this owner keeps which records exist.
"""

from __future__ import annotations

from collections.abc import Mapping

from inri.core.state import Neighbour

# Rule M6: re-dialling a lost neighbour: 2 s, 4 s, 8 s ... capped at 60 s, given up after 10 failures (~8 min).
RECONNECT_BASE_S = 2.0
RECONNECT_MAX_S = 60.0
RECONNECT_MAX_FAILURES = 10


class Neighbours:
    """One relay's neighbour set; every table starts empty."""

    __slots__ = ("_active", "_passive", "_connecting", "_lost", "_banned", "_probation", "_down_since", "_heard_any")

    def __init__(self) -> None:
        self._active: dict[str, Neighbour] = {}  # node id -> its link's record, in the order links came up
        self._passive: dict[str, str] = {}  # node id -> addr, oldest first (M1)
        self._connecting: dict[str, float] = {}  # node id -> give-up time (M1)
        # Former neighbours whose link was lost: re-dialled with exponential backoff while the active
        # view is below active_max, so a mesh torn by a partition or a crash knits itself back (M6).
        self._lost: dict[str, tuple[str, float, int]] = {}  # node id -> (addr, retry_at, failures)
        self._banned: dict[str, float] = {}  # node id -> until (cut for its score, S2)
        self._probation: dict[str, tuple[float, str]] = {}  # inbound links held while full (M4): -> (until, addr)
        self._down_since: dict[str, float] = {}  # former neighbour -> when its link went down (F3)
        self._heard_any = -float("inf")  # when a frame last came from any neighbour (C7)

    # The active view (M1-M4).
    def active(self) -> Mapping[str, Neighbour]:
        """The linked neighbours, in the order their links came up (the order every flood and ring uses).
        Read-only (the type says so): links come and go through link and unlink. The same mapping, live,
        on every call, so a hot path reads it without a copy."""
        return self._active

    def heard_from(self, peer: str, now: float) -> Neighbour | None:
        """A frame came from peer: its record, heard now (M2's liveness, C7's clock); None: not linked."""
        st = self._active.get(peer)
        if st is not None:
            st.last_heard = now
            self._heard_any = now  # C7: a relay's own stall is not its next hop's silence
        return st

    def sent(self, peer: str, now: float) -> None:
        """A frame leaves for linked neighbour peer now (M2: no keepalive is due on its link meanwhile).
        KeyError: peer is not linked."""
        self._active[peer].last_sent = now

    def heard_any(self) -> float:
        """When a frame last came from any linked neighbour (rule C7)."""
        return self._heard_any

    def admit(self, peer: str) -> bool:
        """peer's link is about to come up: it leaves the passive view, the re-dial list and its probation.
        True when it was a lost neighbour being re-dialled (M6)."""
        self._passive.pop(peer, None)
        back = self._lost.pop(peer, None) is not None
        self._probation.pop(peer, None)
        return back

    def link(self, peer: str, state: Neighbour) -> None:
        """peer's link is up (after admit), with its new record."""
        self._active[peer] = state
        self._down_since.pop(peer, None)

    def unlink(self, peer: str) -> Neighbour | None:
        """peer's link (or dial, or probation) ended: its record, None when it was not linked."""
        state = self._active.pop(peer, None)
        self._connecting.pop(peer, None)
        self._probation.pop(peer, None)
        return state

    def went_down(self, peer: str, now: float, keep: int) -> None:
        """Remember when peer's link went down (F3: a one-hop route through it is reported `home
        unreachable` for a while); at `keep` entries, the older half is forgotten."""
        down = self._down_since
        if len(down) >= keep:
            for p in sorted(down, key=down.__getitem__)[: len(down) // 2]:
                del down[p]
        down[peer] = now

    def down_since(self, peer: str) -> float | None:
        """When the link to former neighbour peer went down (None: not known to be down)."""
        return self._down_since.get(peer)

    def links_and_dials(self) -> int:
        """Links up plus dials under way (what active_max bounds, M1)."""
        return len(self._active) + len(self._connecting)

    def busy(self) -> bool:
        """Something to keep alive, dial, re-dial or time out (the engine's tick stays armed)."""
        return bool(self._active or self._connecting or self._passive or self._lost or self._probation)

    # The passive view (M1).
    def passive(self) -> Mapping[str, str]:
        """The candidates: node id -> addr, oldest first. Read-only: changed through the methods below."""
        return self._passive

    def add_candidate(self, peer: str, addr: str) -> bool:
        """peer (a relay learnt from a bootstrap or peer exchange) becomes the newest candidate, unless it is
        linked or banned (False)."""
        if peer in self._active or (self._banned and peer in self._banned):
            return False
        self._passive.pop(peer, None)
        self._passive[peer] = addr
        return True

    def keep_candidate(self, peer: str, addr: str) -> None:
        """A neighbour evicted to make room stays a candidate (its place kept if it was one already)."""
        self._passive[peer] = addr

    def offer_candidate(self, peer: str, addr: str) -> None:
        """A relay refused as full becomes a candidate, if it is not one already."""
        self._passive.setdefault(peer, addr)

    def forget_candidate(self, peer: str) -> None:
        """peer is no candidate any more (a dial failed)."""
        self._passive.pop(peer, None)

    def trim_candidates(self, most: int) -> None:
        """Keep the newest `most` candidates."""
        passive = self._passive
        while len(passive) > most:
            del passive[next(iter(passive))]

    # Dials (M1).
    def dialling(self, peer: str) -> bool:
        """A dial to peer is under way."""
        return peer in self._connecting

    def dial(self, peer: str, give_up: float) -> None:
        """A dial to peer starts; it has failed if no link comes by give_up."""
        self._connecting[peer] = give_up

    def dial_ended(self, peer: str) -> None:
        """The dial to peer ended (a link came up, or it failed)."""
        self._connecting.pop(peer, None)

    def dials_given_up(self, now: float) -> list[str]:
        """The dials whose give-up time has come, in the order they started."""
        return [p for p, give_up in self._connecting.items() if now >= give_up]

    # Former neighbours re-dialled (M6).
    def lose(self, peer: str, addr: str, retry_at: float) -> None:
        """Re-dial former neighbour peer (at addr) from retry_at on, with no failure yet."""
        self._lost[peer] = (addr, retry_at, 0)

    def is_lost(self, peer: str) -> bool:
        """peer is a former neighbour being re-dialled."""
        return peer in self._lost

    def any_lost(self) -> bool:
        """Some former neighbour is being re-dialled."""
        return bool(self._lost)

    def lost_by_retry(self) -> list[tuple[str, str, float]]:
        """The former neighbours being re-dialled, (node id, addr, retry time), earliest retry first."""
        return sorted(((p, addr, retry_at) for p, (addr, retry_at, _) in self._lost.items()), key=lambda x: x[2])

    def redial_failed(self, peer: str, now: float) -> None:
        """A re-dial of peer failed: back off (RECONNECT_BASE_S doubling, at most RECONNECT_MAX_S), or give
        it up after RECONNECT_MAX_FAILURES. Nothing when peer is not a lost neighbour."""
        lost = self._lost.get(peer)
        if lost is None:
            return
        addr, _, failures = lost
        failures += 1
        if failures >= RECONNECT_MAX_FAILURES:
            del self._lost[peer]
        else:  # its place in the dict (the order of equal retry times) is kept
            self._lost[peer] = (addr, now + min(RECONNECT_MAX_S, RECONNECT_BASE_S * 2 ** failures), failures)

    # Bans (S2).
    def ban(self, peer: str, until: float) -> None:
        """peer was cut for its score: refused until `until`, and no candidate."""
        self._banned[peer] = until
        self._passive.pop(peer, None)

    def is_banned(self, peer: str) -> bool:
        """peer is banned (an ended ban counts until the sweep or its next link lifts it)."""
        return peer in self._banned

    def refused_for_ban(self, peer: str, now: float) -> bool:
        """peer's ban still holds now; an ended one is lifted here."""
        until = self._banned.get(peer)
        if until is None:
            return False
        if until > now:
            return True
        del self._banned[peer]
        return False

    def sweep_bans(self, now: float) -> None:
        """Lift the bans that ended."""
        banned = self._banned
        for peer in [p for p, until in banned.items() if until <= now]:
            del banned[peer]

    # Probation (M4).
    def on_probation(self, peer: str) -> bool:
        """peer's inbound link is held on probation (the relay was full when it came)."""
        return peer in self._probation

    def hold(self, peer: str, until: float, addr: str) -> None:
        """Hold peer's inbound link on probation until `until` (a "low" Hello may get it in)."""
        self._probation[peer] = (until, addr)

    def end_probation(self, peer: str) -> tuple[float, str]:
        """peer's probation ends (its Hello came): (until, addr) it was held with. KeyError: not on probation."""
        return self._probation.pop(peer)

    def probations_ended(self, now: float) -> list[str]:
        """End the probations whose time ran out (no Hello came): their node ids, in the order held."""
        probation = self._probation
        ended = [p for p, (until, _) in probation.items() if now >= until]
        for p in ended:
            del probation[p]
        return ended

    def sizes(self) -> dict[str, int]:
        """Table sizes (Engine.stats)."""
        return {"active": len(self._active), "passive": len(self._passive), "connecting": len(self._connecting),
                "lost": len(self._lost), "banned": len(self._banned)}
