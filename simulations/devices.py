"""The devices registered at several homes (issue 42, item 3), as their streams see the run.

A multi-home device streams from each of its homes: every home that stores a push wakes it (the
engine's `Delivered` effect), so a push stored at two homes reaches it twice. Like the SDK's device, it
keeps the push ids it has seen and drops a second copy by push id. Single-home devices are not
modelled here (their home stores each push once: the home deduplicates by push id, rule F5).
"""

from __future__ import annotations

from simulations.workload import Workload


class Devices:
    """The multi-home devices of a run: per device the push ids seen, per home the pushes it stored."""

    __slots__ = ("_device", "_home_rank", "_seen", "stored_per_home", "duplicates_dropped")

    def __init__(self, work: Workload) -> None:
        self._device: dict[bytes, int] = {}  # route id -> registration index (filled as devices register)
        self._home_rank = {r: {h: i for i, h in enumerate(homes)} for r, homes in work.homes.items()}
        self._seen: set[bytes] = set()  # push ids a multi-home device received (push ids are unique per run)
        self.stored_per_home = [0] * max((len(h) for h in work.homes.values()), default=0)
        self.duplicates_dropped = 0

    def registered(self, r: int, route_id: bytes) -> None:
        """Registration r (its route id) was made: a multi-home device's pushes are followed from now on."""
        if r in self._home_rank:
            self._device[route_id] = r

    def stored(self, relay: int, route_id: bytes, push_id: bytes) -> None:
        """Home `relay` stored push_id for route_id and woke its device's stream."""
        r = self._device.get(route_id)
        if r is None:
            return  # a single-home device
        rank = self._home_rank[r].get(relay)
        if rank is not None:
            self.stored_per_home[rank] += 1
        if push_id in self._seen:
            self.duplicates_dropped += 1  # the device drops it: the first copy was handed to the app
        else:
            self._seen.add(push_id)

    def summary(self) -> dict[str, object]:
        """multi_home_stored_per_home (pushes stored at each device's first, second, third home) and
        multi_home_duplicates_dropped (copies a device received again and dropped by push id)."""
        return {"multi_home_stored_per_home": list(self.stored_per_home),
                "multi_home_duplicates_dropped": self.duplicates_dropped}
