"""Peer scoring, rules S1-S2 (zero trust between relays): what a neighbour's behaviour costs or earns
it, and what a low score takes away (preference, then the link). Score events are listed in
docs/protocol.md ("Peer scoring"); their values are EngineConfig.score_*."""

from __future__ import annotations

from inri.core.api import (
    Disconnect,
    DisconnectReason,
    Effect,
)
from inri.core.state import (
    EngineState,
)


class ScoringRules(EngineState):
    """S1: change a neighbour's score; S2: cut and ban it when the score falls too low."""

    # Rules S1, S2.
    def _score(self, peer: str, delta: float, now: float, reason: str) -> list[Effect]:
        """Change peer's score (rule S1); cut and ban it when the score falls too low (S2)."""
        state = self._active.get(peer)
        if state is None:
            return []
        cfg = self.config
        state.score = min(cfg.score_max, state.score + delta)
        if delta < 0:
            self._count("score_" + reason)
        if state.score > cfg.score_disconnect_below:
            return []
        self._count("peer_cut_score")
        self._banned[peer] = now + cfg.score_ban_s
        self._passive.pop(peer, None)
        self._purge_routes(peer)
        if self._level:
            self._trace(now, "peer_scored", peer=peer, reason=reason, count=int(state.score))
        return [Disconnect(peer, DisconnectReason.SCORE), *self.peer_down(peer, now, DisconnectReason.SCORE)]

    # Rule S1.
    def link_congested(self, peer: str, now: float) -> list[Effect]:
        """The driver's bounded send queue for peer dropped frames: peer does not read (rule S1).

        A modest penalty (score_congested), at most once per keepalive interval however often the
        driver reports, so only a neighbour that stays congested loses preference and then the link.
        """
        state = self._active.get(peer)
        if state is None or now - state.congested_at < self.config.keepalive_interval_s:
            return []
        state.congested_at = now
        return self._score(peer, self.config.score_congested, now, "congested")

    # Rule S2.
    def _purge_routes(self, peer: str) -> None:
        """Forget every route claim of a neighbour cut for its score (O(routes); cuts are rare).

        A liar's claims must not outlive its link: a neighbour that claimed to be the home (distance 1
        here) would otherwise make this relay report the home unreachable once the liar is gone. The
        feasibility distance becomes that of the next hops left (none left: unknown), as in Babel.
        """
        purged = self._routes.purge(peer)
        if purged:
            self._count("routes_purged", purged)
