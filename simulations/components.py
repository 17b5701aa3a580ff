"""The true topology's connected components, kept across churn, and the pushes they exclude.

A push whose home relay is down, or cut off from the relay it was injected at, cannot be delivered
by any protocol: it is traced as `push_excluded` and left out of every delivery figure
(docs/metrics.md). Deciding that needs the components of the live mesh after every failure, rejoin,
new link and partition. Relabelling 10,000 relays each time would dominate a churn run, so the labels
are kept: a failure runs a few small searches from the failed relay's neighbours (`split_by_loss`),
a rejoin takes its neighbours' label, and only what may merge or split components drops the labels
for a full relabel at the next question.
"""

from __future__ import annotations

from collections.abc import Callable

from simulations.workload import PushPlan


class ComponentTracker:
    """Component labels of the live mesh (-1: a failed relay), computed lazily and kept across churn.

    It shares the simulator's live state: `lat` (live links and their latency, per relay), `alive`
    and `cut` (directed links a partition cuts) are the simulator's own objects, changed in place.
    """

    __slots__ = ("n", "lat", "alive", "cut", "_labels")

    def __init__(self, n: int, lat: list[dict[int, float]], alive: list[bool], cut: set[tuple[int, int]]) -> None:
        self.n = n
        self.lat = lat
        self.alive = alive
        self.cut = cut
        self._labels: list[int] | None = None

    @property
    def kept(self) -> list[int] | None:
        """The labels as kept now, or None when the next `labels()` relabels every relay."""
        return self._labels

    def invalidate(self) -> None:
        """Components may have merged or split: relabel at the next question."""
        self._labels = None

    def labels(self) -> list[int]:
        """The component label of every relay (-1 when failed): equal labels, same component."""
        if self._labels is None:
            lat, alive, cut = self.lat, self.alive, self.cut
            label = [-1] * self.n
            for s in range(self.n):
                if label[s] != -1 or not alive[s]:
                    continue
                label[s] = s
                stack = [s]
                while stack:
                    u = stack.pop()
                    for v in lat[u]:
                        if label[v] == -1 and alive[v] and (u, v) not in cut:
                            label[v] = s
                            stack.append(v)
            self._labels = label
        return self._labels

    def failed(self, x: int) -> None:
        """Relay x has just failed (already marked not alive)."""
        if self._labels is not None and not self.split_by_loss(x):
            self._labels[x] = -1
        else:
            self._labels = None

    def rejoined(self, x: int) -> None:
        """Relay x is back: it joins its live neighbours' component, or merges several (relabel)."""
        labels = self._labels
        if labels is None:
            return
        cut = self.cut
        near = {labels[v] for v in self.lat[x] if self.alive[v] and not (cut and (x, v) in cut)}
        if len(near) <= 1:
            labels[x] = near.pop() if near else self.n + x  # a label no search gives
        else:
            self._labels = None

    def linked(self, u: int, v: int) -> None:
        """A new link u-v: it may join two components."""
        if self._labels is not None and self._labels[u] != self._labels[v]:
            self._labels = None

    def split_by_loss(self, x: int) -> bool:
        """Relay x just failed: may that have split its component? False once a search from each of
        its live neighbours (avoiding x) has met every other one, which in a mesh takes a few hundred
        steps instead of labelling all relays again; True (relabel) when one search runs dry or the
        searches grow past a budget."""
        lat, alive, cut = self.lat, self.alive, self.cut
        nbrs = [v for v in lat[x] if alive[v] and not (cut and (x, v) in cut)]
        if len(nbrs) <= 1:
            return False
        owner = {v: i for i, v in enumerate(nbrs)}  # relay -> the search that reached it first
        parent = list(range(len(nbrs)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        frontier: dict[int, list[int]] = {i: [v] for i, v in enumerate(nbrs)}
        budget = max(2000, self.n // 20)
        while len(frontier) > 1:
            r = min(frontier, key=lambda k: len(frontier[k]))
            if not frontier[r] or len(owner) > budget:
                return True
            nxt: list[int] = []
            for u in frontier[r]:
                for v in lat[u]:
                    if v == x or not alive[v] or (cut and (u, v) in cut):
                        continue
                    o = owner.get(v)
                    if o is None:
                        owner[v] = r
                        nxt.append(v)
                        continue
                    o = find(o)
                    if o != r and o in frontier:
                        parent[o] = r
                        nxt += frontier.pop(o)
            frontier[r] = nxt
        return False


Exclude = Callable[[PushPlan, str], None]
"""Called once per excluded push with its reason ("home_down" or "partitioned")."""


class ExclusionWindow:
    """The injected pushes whose life (deadline_s) is not over, checked after every topology change."""

    __slots__ = ("deadline", "components", "home_of", "exclude", "_window")

    def __init__(self, deadline_s: float, components: ComponentTracker, home_of: Callable[[PushPlan], tuple[int, ...]],
                 exclude: Exclude) -> None:
        self.deadline = deadline_s
        self.components = components
        self.home_of = home_of
        self.exclude = exclude
        self._window: list[PushPlan] = []

    def injected(self, p: PushPlan) -> None:
        """p was just injected (push_id set): exclude it now if it cannot be delivered, else watch it."""
        self._window.append(p)
        self._check(p, self.components.labels())

    def topology_changed(self, now: float) -> None:
        """After a failure or a cut: exclude live-window pushes whose home is down or cut off."""
        deadline = self.deadline
        self._window = [p for p in self._window if p.t + deadline >= now and p.push_id is not None]
        if not self._window:
            return
        labels = self.components.labels()
        for p in self._window:
            self._check(p, labels)

    def _check(self, p: PushPlan, labels: list[int]) -> None:
        # A device with several homes (issue 42, item 3) is reachable while one of them is up and in the
        # injecting relay's component.
        reason = None
        alive = self.components.alive
        homes = [h for h in self.home_of(p) if alive[h]]
        if not homes:
            reason = "home_down"
        elif labels[p.inject] == -1 or all(labels[p.inject] != labels[h] for h in homes):
            reason = "partitioned"
        if reason is not None and p.push_id is not None:
            self.exclude(p, reason)
            p.push_id = None  # excluded once; dropped from the window at the next check
