"""Backup copies of a neighbour's pushes in custody (rule C8): one owner, `BackupCopies`, held by the engine
as `_backups`.

A custodian's route-mode attempt (a push frame it sends itself, hop 0) passes through one neighbour first.
That neighbour keeps the frame until the push's receipt passes back through it, or `reverse_ttl_s` after
the last such copy (no receipt can come back through it later: its reverse entry is gone). When its link to
the custodian fails, it adopts the copies it still holds (custody.py, `adopt_from`): a push answered 202 by a
relay whose disk never comes back is then not lost (custody transfer, as in the DTN bundle protocol,
RFC 9171 5.10, made implicit: no extra frame, the copy is the one being forwarded anyway). A custodian
that does come back re-sends too; the home answers the second copy DUPLICATE.

Entries are in expiry order (each copy moves its push to the end), at most `custody_backup_max` (oldest out).
"""

from __future__ import annotations

from inri.core.tables import BoundedMap
from inri.protocol.messages import Push


class BackupCopies:
    """push id -> (the push as its custodian sent it, that custodian, expiry), in expiry order."""

    __slots__ = ("_copies", "_ttl")

    def __init__(self, max_size: int, ttl: float) -> None:
        self._copies: BoundedMap[bytes, tuple[Push, str, float]] = BoundedMap(max_size)
        self._ttl = ttl

    def __len__(self) -> int:
        return len(self._copies)

    def keep(self, custodian: str, push: Push, now: float) -> None:
        """A copy of push came straight from its custodian: keep it until its receipt passes back (or the
        ttl). Expired entries at the front go first (the map is in expiry order)."""
        copies = self._copies
        while copies:
            first = next(iter(copies))
            if copies[first][2] > now:
                break
            del copies[first]
        copies.put_last(push.push_id, (push, custodian, now + self._ttl))

    def answered(self, pid: bytes) -> None:
        """A receipt for push pid passed back through here: its custodian has its answer."""
        self._copies.pop(pid, None)

    def take_from(self, custodian: str, now: float) -> list[Push]:
        """The unexpired copies custodian sent here (its link failed), in the order kept; they leave the map."""
        copies = self._copies
        mine = [pid for pid, (_, peer, expires) in copies.items() if peer == custodian and expires > now]
        return [copies.pop(pid)[0] for pid in mine]
