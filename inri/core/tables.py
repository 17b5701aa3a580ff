"""The engine's tables: a bounded expiring map (seen-cache, reverse paths, awaited answers).

A relay's tables must stay bounded whatever its neighbours send, and entries must leave when they
expire. `BoundedMap` is a dict (lookups stay C-speed) with a size bound that evicts the oldest
insertion, and a sweep that drops what a predicate calls expired.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


class BoundedMap(dict[K, V]):
    """A dict of at most `max_size` entries, in insertion order; a new key in a full map evicts the
    oldest entry (FIFO: the oldest is also the first to expire when every entry lives equally long)."""

    __slots__ = ("max_size",)

    def __init__(self, max_size: int) -> None:
        super().__init__()
        self.max_size = max_size

    def put(self, key: K, value: V) -> bool:
        """Insert or overwrite key (an overwritten key keeps its place). True: the oldest entry was
        evicted to make room."""
        if key not in self and len(self) >= self.max_size:
            del self[next(iter(self))]
            self[key] = value
            return True
        self[key] = value
        return False

    def put_last(self, key: K, value: V) -> bool:
        """Insert key as the newest entry (moved to the end if present), so that a map whose values
        carry a constant-timeout deadline stays in deadline order. True: the oldest was evicted."""
        evicted = False
        if key in self:
            del self[key]
        elif len(self) >= self.max_size:
            del self[next(iter(self))]
            evicted = True
        self[key] = value
        return evicted

    def sweep(self, expired: Callable[[V], bool]) -> int:
        """Drop every entry whose value `expired` accepts; returns how many went."""
        gone = [key for key, value in self.items() if expired(value)]
        for key in gone:
            del self[key]
        return len(gone)
