"""Engine configuration: every limit and timer, with the reason for its default.

Drivers build one from TOML (daemon) or a scenario (simulator); `EngineConfig.test_profile()` gives
short timers for tests on loopback.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from inri.protocol import limits


@dataclass(frozen=True, slots=True)
class EngineConfig:
    # Membership (HyParView-style active + passive views)
    active_min: int = 3  # seed 003: each relay connects to 3-4 neighbours
    active_max: int = 4
    passive_max: int = 30  # enough spares to replace a whole active view twice over
    outbound_min: int = 2  # keep this many links we dialled: inbound sybils cannot take the mesh
    # A relay with fewer neighbours than this asks full relays to make room (HyParView priority join).
    # Not active_min: under churn every rejoining relay would then evict links all over the mesh.
    priority_join_below: int = 2
    # Rule M5: of the links a relay dials, this many go to a random candidate not ranked near (a
    # bootstrap's random half, peer exchange) while near candidates fill the rest: proximity keeps
    # latency low, the far link keeps the mesh a small world. Only with proximity-ranked candidates.
    far_links: int = 1
    keepalive_interval_s: float = 1.0  # AODV HELLO_INTERVAL
    keepalive_misses: int = 3  # AODV ALLOWED_HELLO_LOSS is 2; 3 tolerates a loaded host
    peer_exchange_interval_s: float = 30.0
    connect_timeout_s: float = 5.0

    # Registration gossip
    # The wire maximum: gossip reaches every relay of a connected mesh up to that many hops (limits.py);
    # a relay forwards each (route, epoch) once, so a larger TTL costs nothing on a smaller mesh.
    gossip_ttl: int = limits.MAX_TTL
    route_k: int = 2  # keep the first k arrivals from distinct neighbours
    seen_ttl_s: float = 120.0  # push seen-cache TTL (gossipsub: 120 s): longer than any propagation delay
    route_max: int = 1_000_000  # cached route ids; oldest-expiring evicted past this
    forward_jitter_s: float = 0.0  # random extra delay on forwards (rushing-attack resistance)
    reg_budget_per_origin_per_s: float = 1.0  # one route id may refresh at most this often
    reg_budget_burst: int = 3
    reg_budget_per_peer_per_s: float = 200.0  # AODV RREQ_RATELIMIT is 10/s per node; peers relay many
    reg_budget_peer_burst: int = 400
    # "flood": every relay sends the full registration frame to every neighbour but its sender (rules
    # G2-G3). "tree" (rule G9, inri/core/tree.py): full frames along an eager spanning tree (Plumtree),
    # compact announcements, batched per neighbour, on the other links; they give the same backup next
    # hops and repair the tree (graft) when a full frame does not come within tree_graft_timeout_s.
    gossip_scheme: Literal["flood", "tree"] = "flood"
    # Route table storage (inri/core/tables.py), the same entries either way: "compact" (the relay's
    # default since issue 18: about 71 B per route with its 16-byte id, against about 179 B; push
    # forwards as fast or faster, gossip receptions about 0.8x: benchmarks/bench_engine.py prints both
    # side by side) or "dict" (a dict of tuples: the fastest gossip path). The simulator's scenarios
    # default to "dict" (simulations/scenario.py: its engines share every route id object, so the dict
    # costs less there and the run is about 1.5x faster); scale-100k sets "compact" for memory.
    route_table: Literal["compact", "dict"] = "compact"
    tree_announce_delay_s: float = 0.05  # announcements wait this long to share a frame per neighbour
    tree_graft_timeout_s: float = 0.25  # an announced registration not received by then is grafted
    # A link gets full frames of a direction and distance while at least this share of those it got
    # reached it first (no prune came back); tree_explore: the chance of a full frame on a lazy link anyway.
    tree_eager_share: float = 0.3
    tree_explore: float = 0.05
    # Stem phase (Dandelion++, inri/core/stem.py, docs/protocol.md "What relays learn"): a registration
    # walks a stem of geometric length (fluff probability q per hop, mean 1/q) before its flood, so
    # the flood's hop counts point at the stem's last relay, not the home.
    stem: bool = False
    # q (mean stem length 1/q): the flood walks back down the stem (G8), so pushes enter it near
    # where they come from and a longer stem costs little stretch (privacy, 1,000 relays, seeds 1-3:
    # stretch median 1.13-1.19 at q = 0.4 against 1.09-1.10 at 0.5; colluders link 0.17-0.18 against
    # 0.24-0.26). Before the walk back it was 0.5, and stretch 1.27-1.33.
    stem_fluff_probability: float = 0.4
    stem_epoch_s: float = 3600.0  # successor choices are re-drawn every period (Dandelion++: 10 min)
    stem_embargo_s: float = 10.0  # fail-safe: a stem relay that does not see the flood by then floods itself
    # The flood starts at hops 2 + U{0..noise}: a lone relay's hop count then says about nothing of how
    # far the flood started (privacy, 1,000 relays, every relay measured: the flood's part of "one relay
    # names the home" 1.12-1.19x chance at 12, 1.03-1.06x at 40, and no stem takes it below 1x; issue 19,
    # docs/protocol.md). 40 + a mesh's longest flood path stays under 128 (one-byte hops on the wire).
    stem_hop_noise: int = 40
    # Rule G11 (inri/core/sync.py): a relay that (re)starts asks the neighbours whose links come up in its
    # first minute for the routes they hold, and takes those it lacks as provisional routes through them
    # (false: routes come back only with its snapshot, G5 and gossip, as before).
    route_sync: bool = True
    # Rule G12 (inri/core/withdrawals.py): a relay that loses its last live next hop for a route id (or its
    # link to the route's home) tells its neighbours, which drop it as a next hop; pushes for a home that is
    # down then wait in custody instead of searching, and the route's return wakes them. Off for now: the
    # shipped traces stay as they are until the measurements (docs/results/2026-11-29-route-withdrawal.md)
    # decide the default.
    route_withdrawal: bool = False

    # Pushes
    # The radius of the custodian's last ring (after 1, 3, 5, 7), when the fallback budget allows it.
    # Pushes following a route carry MAX_TTL - hops instead (docs/protocol.md, "TTLs").
    push_ttl: int = 24
    # Ring messages one custodian may cause per push (docs/protocol.md, "Repair and fallback"): a ring of
    # radius r costs at most active_max * sum((active_max - 1)^i, i < r) messages; a ring that would
    # not fit what is left is not sent and the push is re-sent along routes instead; the last ring is as
    # wide as the rest affords (up to push_ttl). 5,000: rings 1 to 7 with 4 neighbours (4,912), rings 1
    # to 7 then 10 with 3 (498 + 3,069), never the full-TTL flood (with 3 neighbours and push_ttl 24:
    # 50 million worst case; 3,290 messages per delivered push measured on a 5k geographic mesh).
    # 1,000 (rings 1 to 5 with 4 neighbours) lost pushes on small partitioned meshes, where the worst
    # case overstates a ring 7 (60 relays: at most 240 messages) twenty times.
    fallback_budget: int = 5000
    # Rule F4b: a ring copy that meets a route follows it and also goes on to its radius. Off by default:
    # on sparse meshes under churn (geo-5k-3n) it rescues pushes that stale routes near the custodian
    # capture (delivery 0.97 -> 0.998), but it makes every ring cost its worst case (churn-2k: 3x messages).
    ring_past_routes: bool = False
    # Rule F4c: the custodian's last ring (wider than 7: the widest the fallback budget affords after
    # rings 1 to 7) goes past routes as F4b does; earlier rings stop at the first route. With 4
    # neighbours the default budget has no last ring, so random meshes keep their cost (docs/protocol.md
    # "Repair and fallback" item 5; figures: docs/metrics.md "Sparse geographic meshes").
    last_ring_past_routes: bool = True
    # Rule F9: a failed local repair steers the push's next copies: relays that passed its `repair failed`
    # back take another live next hop for them, and the searching relay answers `repair failed` at once
    # instead of searching the same neighbourhood again (false: as before F9).
    repair_steer: bool = True
    # Rule F10 (with F9): a relay that hears `repair failed` / `dead end` for a route attempt's copy it sent,
    # and has another live next hop for the route, sends that copy over it at once instead of passing
    # the notice back to the custodian (false: as before F10, for comparisons).
    repair_reroute: bool = True
    # Rule F8c: a local repair's find whose copy comes back as `duplicate` (it led into the push's own path)
    # is refuted, and a search whose finds are all refuted is reported failed at once (false: as before).
    repair_refute: bool = True
    # Rule C3b: a parked push (escalation over) whose home is not known to be down alternates its parked
    # re-sends: along the route, then a search of the custodian's neighbourhood (radius 2, within the
    # fallback budget), and so on. A route that keeps failing (stale routes into a hole nobody on it
    # can repair) is then not the only way tried until the deadline (false: route re-sends only).
    parked_search: bool = True
    reverse_ttl_s: float = 30.0  # reverse-path state (push id -> previous hop) lifetime
    reverse_max: int = 200_000
    custody_max: int = 100_000
    # Rule C8 (backups.py): the first relay a custodian's route attempt passes keeps a copy until the push's
    # receipt passes back, at most reverse_ttl_s, and adopts it when its link to the custodian fails: a
    # push answered 202 by a relay that never comes back is not lost. At most custody_backup_max copies.
    custody_backup: bool = True
    custody_backup_max: int = 10_000
    # Re-send with the same push id when no receipt came back: along a route after its measured round
    # trip (rule C4, inri/core/rtt.py: route distance x per-link srtt + 4 rttvar), at least
    # receipt_timeout_min_s and at most custody_retry_s; ring searches every custody_retry_s.
    custody_retry_s: float = 2.0
    receipt_timeout_min_s: float = 0.25  # floor: a loaded relay's processing jitter is not a lost push
    adaptive_retry: bool = True  # false: fixed custody_retry_s periods, no re-send on link loss (C4, C5)
    # Rule C2b: a custodian's ring whose copies meet no route (none says `repair found` within the ring's
    # round trip, radius + 1 link round trips), or whose every find is refuted (as many errors came back),
    # is followed by the next step at once, not after custody_retry_s (geo-5k-3n-c3l1: a push injected
    # where a withdrawn region had no route waited 2 s per failed ring). Off by default: on black-holes-1k
    # it lost pushes (seeds 1, 2: never delivered 3 -> 5, 3 -> 6; rings spent before scores avoid the holes).
    ring_verdict: bool = False
    custody_max_attempts: int = 7  # route, route via backups, rings 1, 3, 5, 7, then the full TTL
    # Rule C3: custody keeps a push until a receipt settles it or its TTL runs out: a Web Push push's
    # `TTL` header, a native push (it carries none) custody_max_ttl_s; at least custody_deadline_s (the
    # escalation and the short parked re-sends fit in it; a push refused `not home`, rule F5c, settles
    # then) and at most custody_max_ttl_s. Past custody_deadline_s the parked re-sends back off further,
    # waiting as long as the push has been parked beyond it, up to custody_park_max_s: a push kept for
    # custody_max_ttl_s costs at most about log2(custody_park_max_s / 32 s) + custody_max_ttl_s /
    # custody_park_max_s more re-sends (7 + 168 by default: docs/operations.md).
    custody_deadline_s: float = 300.0
    custody_max_ttl_s: float = 7 * 24 * 3600.0
    custody_park_max_s: float = 3600.0
    push_seen_max: int = 200_000
    # Push frames from one neighbour. A relay forwards about 6,000/s on one core and enters about 3,000/s
    # (bench_poc, 0.15 and 0.3 ms of CPU per push); at 2,000/s an entry relay pushed at full rate went
    # over its next hop's budget (relays enter at most 90% of it since: custody.py, rule C1).
    push_budget_per_peer_per_s: float = 4000.0
    push_budget_peer_burst: int = 8000

    # Peer scoring (zero trust between relays): misbehaviour lowers a neighbour's score, receipts
    # raise it; the score decays towards 0 (half-life score_half_life_s) so old faults are forgiven.
    # Below score_prefer_below a neighbour is a next hop only when no better one is alive; at or below
    # score_disconnect_below its link is cut and it is refused and not re-dialled for score_ban_s.
    score_invalid_frame: float = -4.0  # undecodable frame: five in a row cut the link
    score_bad_signature: float = -4.0  # gossip for a route without a valid registration (forged)
    score_budget_drop: float = -1.0  # gossip or push over the neighbour's flood budget
    score_replay: float = -0.5  # a stale epoch or a repeat of gossip it already gave us
    score_no_receipt: float = -1.0  # a push forwarded to it came back with neither receipt nor route error
    score_receipt: float = 1.0  # a receipt or a route error came back through it (it answered)
    # Our bounded send queue for it dropped frames (it withholds flow-control credit): at most once per
    # keepalive interval, so a neighbour that never reads is cut within about a minute and a briefly
    # congested one only loses preference for a while.
    score_congested: float = -0.5
    score_max: float = 10.0
    score_prefer_below: float = -3.0
    score_avoid_below: float = -8.0  # a route whose only next hops score at or below this is treated as broken
    score_disconnect_below: float = -20.0
    score_half_life_s: float = 300.0
    score_ban_s: float = 600.0
    # Receipts must carry the home relay's signature under the registration's receipt key (rule F5);
    # false: any receipt is believed (the protocol before signed receipts; simulator comparisons only).
    receipt_signatures: bool = True
    # Rule F5b: a home relay whose host flushes receipts once per scheduling round (the daemon) answers
    # the pushes of one route from one neighbour in that round with one ReceiptBatch frame under one
    # signature, at most this many each; 1: one Receipt per push (for a mesh with relays that predate
    # F5b: they refuse the frame as malformed).
    receipt_batch_max: int = 64
    receipt_timeout_s: float = 2.0  # a forwarded push with no answer by then counts as a black-holed one

    def test_profile(self) -> EngineConfig:
        """Short timers for loopback tests: keepalive 0.5 s x 6 misses.

        Not 1 s x 2: measured on a 2-core machine running nine Python relays and a JVM, that fired
        falsely (a busy process misses two keepalives without being dead).
        """
        return replace(
            self,
            keepalive_interval_s=0.5,
            keepalive_misses=6,
            peer_exchange_interval_s=2.0,
            custody_retry_s=1.0,
            connect_timeout_s=3.0,
        )
