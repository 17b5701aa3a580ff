"""A small in-memory network of engines with a virtual clock: a public, first-class testing helper
(like trio.testing), used by the tests and by `inri demo`; its interface stays stable as the engine
changes (docs/architecture.md).

Frames are moved as objects (or encoded and decoded, with `wire=True`) over fixed links with a
latency each; `run_until` advances the virtual clock through frame arrivals and engine timers.
The simulator (simulations/) is the large-scale, modelled version of the same idea.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Mapping
from typing import assert_never

from inri.core.api import (
    Connect,
    CustodyReleased,
    CustodyStatus,
    CustodyTaken,
    Delivered,
    Disconnect,
    DisconnectReason,
    Effect,
    Send,
)
from inri.core.config import EngineConfig
from inri.core.engine import Engine
from inri.core.home import MemoryHomeStore
from inri.core.trace import ListTracer
from inri.core.verify import CachingVerifier
from inri.protocol.codec import encode
from inri.protocol.messages import Message, PeerInfo, Registration

# transport_acks: QUIC's probe timeout on a link is its RTT + max(4 x rttvar, 1 ms) + max_ack_delay (25 ms);
# the transport reports a peer unresponsive after the second one in a row (PTO + 2 x PTO).
PTO_EXTRA_S = 0.026
UNACKED_PTOS = 3.0


class MiniNet:
    """N engines named "0".."N-1", linked by `edges` with a latency per direction."""

    def __init__(
        self,
        n: int,
        edges: Iterable[tuple[int, int]],
        *,
        config: EngineConfig | None = None,
        seed: int = 1,
        latency: dict[tuple[int, int], float] | None = None,
        wire: bool = False,
        open_dial: bool = False,
        transport_acks: bool = False,
        kinds: Mapping[int, type[Engine]] | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.rng = random.Random(seed)
        self.tracer = ListTracer()
        self.verifier = CachingVerifier()
        self.homes = [MemoryHomeStore() for _ in range(n)]
        # kinds: relays built from a subclass of Engine (a hostile one overrides HOOKS), by index.
        self.kinds = dict(kinds or {})
        self.engines = [
            self.kinds.get(i, Engine)(str(i), self.config, verifier=self.verifier, home=self.homes[i],
                                      tracer=self.tracer, rng=random.Random(seed * 1000 + i), listen_addr=f"addr-{i}")
            for i in range(n)
        ]
        self.wire = wire
        self.open_dial = open_dial  # a Connect to any live relay succeeds (new links, 10 ms each way)
        # A frame sent to a relay that is down makes the sender's transport report it unresponsive
        # (Engine.link_unresponsive, rule C6) UNACKED_PTOS probe timeouts of the link later, as the
        # daemon's QUIC does (simulations/linkmodel.py models the same).
        self.transport_acks = transport_acks
        self._unacked: set[tuple[str, str]] = set()
        self.now = 0.0
        self.links: dict[tuple[str, str], float] = {}
        self.alive = [True] * n
        self._q: list[tuple[float, int, str, str, Message | bytes | None]] = []
        self._seq = 0
        self.delivered: list[tuple[str, bytes]] = []  # (relay, push id) Delivered effects
        self.custody: dict[bytes, CustodyStatus] = {}  # push id -> final status (CustodyReleased)
        self.sent: list[tuple[str, str, Message]] = []  # every frame sent (from, to, message)
        for a, b in edges:
            lat = (latency or {}).get((a, b), 0.01)
            self.links[(str(a), str(b))] = lat
            self.links[(str(b), str(a))] = (latency or {}).get((b, a), lat)
        for (sa, sb) in sorted(self.links):
            if int(sa) < int(sb):
                self.engines[int(sa)].add_candidates([PeerInfo(sb, f"addr-{sb}")], 0.0)
                self.engines[int(sb)].add_candidates([PeerInfo(sa, f"addr-{sa}")], 0.0)
                self.link_up(sa, sb)
        for i, e in enumerate(self.engines):
            self.apply(str(i), e.start(0.0, sync_routes=False))  # the whole mesh starts now: no routes to sync

    def apply(self, src: str, effects: list[Effect]) -> None:
        """Carry out effects of engine `src`."""
        for eff in effects:
            match eff:  # every effect type is handled: assert_never makes mypy flag a new one
                case Send():
                    lat = self.links.get((src, eff.peer))
                    self.sent.append((src, eff.peer, eff.msg))
                    if lat is None or not self.alive[int(eff.peer)]:
                        if lat is not None and self.transport_acks and (src, eff.peer) not in self._unacked:
                            self._unacked.add((src, eff.peer))
                            pto = lat + self.links.get((eff.peer, src), lat) + PTO_EXTRA_S
                            self._push(self.now + eff.delay + UNACKED_PTOS * pto, "unacked", src, eff.peer, None)
                        continue
                    payload: Message | bytes = encode(eff.msg) if self.wire else eff.msg
                    self._push(self.now + lat + eff.delay, "frame", src, eff.peer, payload)
                case Delivered():
                    self.delivered.append((src, eff.push_id))
                case CustodyReleased():
                    self.custody[eff.push_id] = eff.status
                case Connect():
                    if self.open_dial and (src, eff.peer) not in self.links and self.alive[int(eff.peer)]:
                        self.links[(src, eff.peer)] = self.links[(eff.peer, src)] = 0.01
                    if (src, eff.peer) in self.links and self.alive[int(eff.peer)]:
                        self._push(self.now + 0.01, "up", src, eff.peer, None)
                    else:
                        self._push(self.now + 0.01, "fail", src, eff.peer, None)
                case Disconnect():
                    other = self.engines[int(eff.peer)]
                    if self.alive[int(eff.peer)]:
                        self.apply(eff.peer, other.peer_down(src, self.now, eff.reason))
                case CustodyTaken():
                    pass  # nothing to persist in memory: custody lives in the engine
                case _:
                    assert_never(eff)

    def inject(self, i: int, registration: Registration, token: bytes, ciphertext: bytes = b"x") -> bytes:
        """A home app pushes at relay i (Engine.inject_push): its push id; the push must be accepted."""
        res = self.engines[i].inject_push(registration, token, ciphertext, self.now)
        assert res.push_id is not None, res.reason
        self.apply(str(i), res.effects)
        return res.push_id

    def link_up(self, a: str, b: str) -> None:
        """a dialled b: both engines learn of the link, unless a refuses it (then b never sees it)."""
        effects = self.engines[int(a)].peer_up(b, self.now, outbound=True, addr=f"addr-{b}")
        refused = any(isinstance(e, Disconnect) and e.peer == b for e in effects)
        self.apply(a, [e for e in effects if not (isinstance(e, Disconnect) and e.peer == b)])
        if not refused:
            self.apply(b, self.engines[int(b)].peer_up(a, self.now, outbound=False, addr=f"addr-{a}"))

    def _push(self, t: float, kind: str, a: str, b: str, payload: Message | bytes | None) -> None:
        self._seq += 1
        heapq.heappush(self._q, (t, self._seq, kind, a + "|" + b, payload))

    def kill(self, i: int, *, silent: bool = False) -> None:
        """Relay i fails: its neighbours see their links drop (silent: they do not, as after a kill -9
        of a relay whose QUIC links then just stop answering; their keepalives find out)."""
        self.alive[i] = False
        if silent:
            return
        for (a, b) in list(self.links):
            if a == str(i) and self.alive[int(b)]:
                self.apply(b, self.engines[int(b)].peer_down(a, self.now, DisconnectReason.LINK_LOST))

    def restart(self, i: int) -> None:
        """Relay i comes back after a crash: a fresh engine (memory lost) over the same home store, linked
        to whoever `links` names for it now (change `links` first to bring it back with other neighbours)."""
        self.alive[i] = True
        eng = self.kinds.get(i, Engine)(str(i), self.config, verifier=self.verifier, home=self.homes[i],
                                        tracer=self.tracer, rng=random.Random(self.rng.random()),
                                        listen_addr=f"addr-{i}")
        self.engines[i] = eng
        peers = sorted({b for (a, b) in self.links if a == str(i)}, key=int)
        self.apply(str(i), eng.add_candidates([PeerInfo(p, f"addr-{p}") for p in peers], self.now))
        self.apply(str(i), eng.start(self.now))
        for reg in self.homes[i].homed():  # as the daemon does at startup, before any link is up
            self.apply(str(i), eng.register(reg, self.now, restart=True))

    def run_until(self, t_end: float) -> None:
        """Advance the clock to t_end, delivering frames and firing timers in time order."""
        while True:
            next_frame = self._q[0][0] if self._q else float("inf")
            timers = [(e.get_timer(), i) for i, e in enumerate(self.engines) if self.alive[i]]
            next_timer, who = min(((t, i) for t, i in timers if t is not None), default=(float("inf"), -1))
            t = min(next_frame, next_timer)
            if t > t_end:
                self.now = t_end
                return
            self.now = t
            if next_timer <= next_frame:
                self.apply(str(who), self.engines[who].handle_timer(t))
                continue
            _, _, kind, pair, payload = heapq.heappop(self._q)
            a, b = pair.split("|")
            if kind == "unacked":  # a's transport gives up on b (transport_acks)
                self._unacked.discard((a, b))
                if self.alive[int(a)]:
                    self.apply(a, self.engines[int(a)].link_unresponsive(b, t))
                continue
            if not self.alive[int(b)]:
                continue
            eng = self.engines[int(b)]
            if kind == "frame":
                if isinstance(payload, bytes):  # wire=True: frames travel encoded
                    self.apply(b, eng.receive_frame(a, payload, t))
                elif payload is not None:
                    self.apply(b, eng.receive_message(a, payload, t))
            elif kind == "up":
                self.link_up(a, b)
            elif kind == "fail":
                self.apply(a, self.engines[int(a)].connect_failed(b, t))
