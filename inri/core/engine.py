"""The relay engine: the whole INRI relay protocol, sans-IO.

CONTRACT SKELETON - the implementation is being written; signatures below are fixed.
"""

from __future__ import annotations

import random

from inri.core.api import Effect, HomeStore, InjectResult, Tracer, Verifier
from inri.core.config import EngineConfig
from inri.protocol.messages import Message, PeerInfo, Registration


class Engine:
    """One relay's protocol state. Every method takes `now` and returns effects to carry out."""

    def __init__(
        self,
        relay_id: str,
        config: EngineConfig,
        *,
        verifier: Verifier,
        home: HomeStore,
        tracer: Tracer,
        rng: random.Random,
        listen_addr: str = "",
    ) -> None:
        raise NotImplementedError

    # -- membership -------------------------------------------------------------------------
    def add_candidates(self, peers: list[PeerInfo], now: float) -> list[Effect]:
        """Relays learned from a bootstrap list (or a scenario): into the passive view; may Connect."""
        raise NotImplementedError

    def start(self, now: float) -> list[Effect]:
        """Begin: Connect to passive candidates until active_min links are wanted."""
        raise NotImplementedError

    def peer_up(self, peer: str, now: float, *, outbound: bool, addr: str = "") -> list[Effect]:
        """A link to peer is open (we dialled it: outbound=True). May answer Disconnect when full."""
        raise NotImplementedError

    def peer_down(self, peer: str, now: float, reason: str) -> list[Effect]:
        """The link to peer closed or failed. Promotes a passive peer (Connect) to refill the view."""
        raise NotImplementedError

    def connect_failed(self, peer: str, now: float) -> list[Effect]:
        """A Connect effect did not produce a link; try another candidate."""
        raise NotImplementedError

    # -- frames -----------------------------------------------------------------------------
    def receive_frame(self, peer: str, data: bytes, now: float) -> list[Effect]:
        """Decode an encoded frame from peer and handle it; a malformed frame yields an ErrorFrame."""
        raise NotImplementedError

    def receive_message(self, peer: str, msg: Message, now: float) -> list[Effect]:
        """Handle an already-decoded message from a neighbour (the simulator's fast path)."""
        raise NotImplementedError

    # -- local API (devices and home apps at this relay) ------------------------------------
    def register(self, registration: Registration, now: float) -> list[Effect]:
        """A device homed here registered (or refreshed) a route: originate its gossip.

        The driver has already put the registration and its tokens in the HomeStore.
        """
        raise NotImplementedError

    def unregister(self, route_id: bytes, now: float) -> list[Effect]:
        """A device homed here unregistered: forget its routes locally (gossip expires by TTL)."""
        raise NotImplementedError

    def inject_push(
        self,
        registration: Registration,
        token: bytes,
        ciphertext: bytes,
        now: float,
        *,
        push_id: bytes | None = None,
    ) -> InjectResult:
        """A home app pushes at this relay with a push credential's registration and one token.

        Verifies the registration (signature, route id, freshness) before anything is sent.
        push_id: given when the driver restores custody after a restart.
        """
        raise NotImplementedError

    # -- time -------------------------------------------------------------------------------
    def get_timer(self) -> float | None:
        """The earliest time handle_timer wants to run (None: no timer armed)."""
        raise NotImplementedError

    def handle_timer(self, now: float) -> list[Effect]:
        """Keepalives, peer exchange, custody retries, expiry of routes/seen/reverse state."""
        raise NotImplementedError

    # -- introspection (status endpoint, simulator, tests) ----------------------------------
    def route_count(self) -> int:
        raise NotImplementedError

    def active_peers(self) -> list[str]:
        raise NotImplementedError

    def stats(self) -> dict[str, int]:
        """Counters and table sizes (routes, seen, reverse, custody, active, passive, drops...)."""
        raise NotImplementedError
