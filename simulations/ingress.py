"""One relay's HTTP API under a push spammer (`kind = "push_spammer"` in `[[adversaries]]`).

A server of fixed capacity taking connections in turn. Each HTTP/1.1 connection carries one request
at a time; the server serves the connections with a request waiting in turn (round robin), as an
event loop does. The spammer has `connections` of them: a spam request that finds all of them busy
is never sent (the offered load beyond that is what a closed-loop load generator cannot get in).
Each honest home app has one connection (its requests queue on it). Every request passes the relay's
own rate limits (per client address, per device, per token: the core's token buckets, as in the
daemon's limiter, with the daemon's documented defaults) and costs 1/capacity_per_s when accepted,
reject_cost of that when refused.

The model only queues and admits; the simulator turns an accepted request into an engine push.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from inri.core.budget import KeyedBuckets
from inri.protocol.messages import Registration
from simulations.adversary import Adversary
from simulations.metrics import nearest_rank


@dataclass(frozen=True)
class Limit:
    """A token bucket's rate and burst."""

    rate_per_s: float
    burst: int


# The relay daemon's documented [api] defaults (docs/operations.md): rate_per_s / rate_burst per
# client address, device_rate_per_s / device_rate_burst per device, token_rate_per_s /
# token_rate_burst per token. Copied, not imported: simulations sit beside the daemon, not on it
# (tests/test_sim.py checks they still match inri.node.config.ApiSection).
CLIENT_LIMIT = Limit(50.0, 100)
DEVICE_LIMIT = Limit(10.0, 50)
TOKEN_LIMIT = Limit(0.1, 3)


class Source(StrEnum):
    """Who sent a request."""

    SPAM = "spam"
    HONEST = "honest"


Request = tuple[Source, int]
"""(source, push plan index; -1 for spam)."""


class Ingress:
    """The spammed API: connections, their queues, the request in service and the counts."""

    SPAMMER = "spammer"  # the spammer's client address (its connections are "spammer#i")

    def __init__(self, adversary: Adversary, spam_reg: Registration, clock: Callable[[], float],
                 rng: random.Random) -> None:
        self.a = adversary
        self.spam_reg = spam_reg  # the spammer's own registered device: every spam push carries it
        self.rng = rng  # the adversaries' stream (spam arrivals, spam tokens)
        self.service = 1.0 / adversary.capacity_per_s
        self.queues: dict[str, deque[Request]] = {}
        self.order: deque[str] = deque()  # connections with waiting requests, in turn
        self.busy = False
        self.in_service: tuple[str, Request, bool] | None = None  # (connection, request, admitted)
        # The daemon's limiter is built on the same core buckets (inri.core.budget), LRU-bounded alike.
        self.limit_client = KeyedBuckets(CLIENT_LIMIT.rate_per_s, CLIENT_LIMIT.burst, clock=clock)
        self.limit_device = KeyedBuckets(DEVICE_LIMIT.rate_per_s, DEVICE_LIMIT.burst, clock=clock)
        self.limit_token = KeyedBuckets(TOKEN_LIMIT.rate_per_s, TOKEN_LIMIT.burst, clock=clock)
        self.offered = {Source.SPAM: 0, Source.HONEST: 0}
        self.accepted = {Source.SPAM: 0, Source.HONEST: 0}
        self.refused = {Source.SPAM: 0, Source.HONEST: 0}
        self.unsent = 0  # spam the spammer could not send: every connection busy
        self.honest_plans: list[int] = []  # the honest pushes sent through this API
        self._spam_conns = [f"{self.SPAMMER}#{i}" for i in range(adversary.connections)]

    def spam_arrives(self, now: float, until: float) -> float | None:
        """A spam request (a Poisson stream at rate_x times the API's capacity); returns when the next
        one comes, or None when the stream ends before `until`."""
        a = self.a
        self._arrive(Source.SPAM, "", -1)
        nxt = now + self.rng.expovariate(a.rate_x * a.capacity_per_s)
        return nxt if nxt < min(a.end_s, until) else None

    def honest_arrives(self, b: int, client: str) -> bool:
        """Honest push plan b arrives on its app's connection; False when it was not sent."""
        self.honest_plans.append(b)
        return self._arrive(Source.HONEST, client, b)

    def _arrive(self, source: Source, conn: str, b: int) -> bool:
        self.offered[source] += 1
        if source is Source.SPAM:
            conn = next((c for c in self._spam_conns if not self.queues.get(c)), "")
            if not conn:
                self.unsent += 1
                return False
        q = self.queues.get(conn)
        if q is None:
            q = self.queues[conn] = deque()
        if not q:
            self.order.append(conn)
        q.append((source, b))
        return True

    def serve_next(self, now: float, credentials: Callable[[int], tuple[bytes, bytes]]) -> float | None:
        """Start serving the next waiting request (round robin over connections) and admit or refuse
        it; returns when it is done, or None when nothing waits. `credentials(b)`: the (device,
        token) of honest push plan b; spam carries the spammer's device and a fresh random token."""
        if not self.order:
            self.in_service = None
            self.busy = False
            return None
        conn = self.order.popleft()
        q = self.queues[conn]
        source, b = req = q.popleft()
        if q:
            self.order.append(conn)
        self.busy = True
        if source is Source.SPAM:
            device, token = self.spam_reg.route_id, self.rng.randbytes(16)
        else:
            device, token = credentials(b)
        ok = self._admit(source, conn, device, token)
        self.in_service = (conn, req, ok)
        return now + self.service * (1.0 if ok else self.a.reject_cost)

    def _admit(self, source: Source, conn: str, device: bytes, token: bytes) -> bool:
        """The daemon's three limits, in its order; False: refused (429)."""
        client = self.SPAMMER if source is Source.SPAM else conn  # rate limits key on the client address
        ok = (self.limit_client.take(client) == 0.0 and self.limit_device.take(device.hex()) == 0.0
              and self.limit_token.take(token.hex()) == 0.0)
        (self.accepted if ok else self.refused)[source] += 1
        return ok

    def summary(self, sent_at: Callable[[int], float], delivered_at: Callable[[int], float | None],
                deadline_s: float) -> dict[str, object]:
        """The push spammer's figures (docs/metrics.md, "Adversarial scenarios")."""
        lat: list[float] = []
        lost = 0
        for b in self.honest_plans:
            got = delivered_at(b)
            if got is None or got - sent_at(b) > deadline_s:
                lost += 1
            else:
                lat.append(got - sent_at(b))
        lat.sort()
        return {
            "victim_honest_pushes": len(self.honest_plans),
            "victim_honest_lost": lost,
            "victim_latency_p50_s": nearest_rank(lat, 0.5),
            "victim_latency_p99_s": nearest_rank(lat, 0.99),
            "spam_offered": self.offered[Source.SPAM],
            "spam_accepted": self.accepted[Source.SPAM],
            "spam_refused": self.refused[Source.SPAM],
            "spam_unsent": self.unsent,
            "honest_refused": self.refused[Source.HONEST],
        }
