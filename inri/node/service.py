"""The relay service: drives one sans-IO `Engine` with real time, a durable store and a network sink.

Every input (a frame, a link event, an API call, the timer) goes into the engine with `now`, and the
effects come out in order: Send/Connect/Disconnect go to the network sink (QUIC links in the daemon,
memory channels in tests), CustodyTaken is committed to SQLite before the API answers 202 (grouped
per round: Store.run), CustodyReleased records the final status, Delivered wakes the device's live streams.

Calls are synchronous and short (one SQLite transaction at most), so they run on the trio thread
without blocking it for long; `run()` is the only task: it restores custody after a restart,
re-originates the gossip of every device homed here, and sleeps until the engine's next timer.
"""

from __future__ import annotations

import bisect
import functools
import math
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, assert_never

import structlog
import trio

from inri.core.api import (
    Connect,
    CustodyReleased,
    CustodyStatus,
    CustodyTaken,
    Delivered,
    Disconnect,
    DisconnectReason,
    Effect,
    InjectOutcome,
    InjectResult,
    Send,
    Tracer,
    Verifier,
)
from inri.core.config import EngineConfig
from inri.core.engine import Engine
from inri.core.verify import CachingVerifier
from inri.node.config import WakeSection
from inri.node.reachability import Reachability
from inri.node.store import Store
from inri.node.wake import WakeHooks
from inri.protocol.codec import DecodeError, decode, encode, encode_unchecked, push_registration_bytes
from inri.protocol.keys import receipt_public_key
from inri.protocol.messages import (
    ErrorFrame,
    Hello,
    Keepalive,
    MessageType,
    PeerExchange,
    PeerInfo,
    Push,
    Receipt,
    ReceiptBatch,
    RegAnnounce,
    RegGossip,
    RegGraft,
    Registration,
    RouteError,
    RouteSync,
    RouteWithdraw,
    StemRepair,
    WebPushMeta,
)

log = structlog.get_logger("inri.service")

_OUT_NAMES = {cls: "frames_out_" + t.name.lower() for cls, t in (
    (Hello, MessageType.HELLO), (RegGossip, MessageType.REG_GOSSIP), (Push, MessageType.PUSH),
    (Receipt, MessageType.RECEIPT), (ReceiptBatch, MessageType.RECEIPT_BATCH), (RouteError, MessageType.ROUTE_ERROR),
    (Keepalive, MessageType.KEEPALIVE),
    (PeerExchange, MessageType.PEER_EXCHANGE), (ErrorFrame, MessageType.ERROR),
    (RegAnnounce, MessageType.REG_ANNOUNCE), (RegGraft, MessageType.REG_GRAFT),
    (StemRepair, MessageType.STEM_REPAIR), (RouteSync, MessageType.ROUTE_SYNC),
    (RouteWithdraw, MessageType.ROUTE_WITHDRAW))}
_IN_NAMES = {int(t): "frames_in_" + t.name.lower() for t in MessageType}
# The per-push frames the engine builds from frames it decoded (and so validated) or from pushes the
# API verified: encoded without codec.encode's re-decode (issue 16: no re-validation of frames we
# encoded ourselves). Rarer frames (gossip, hello, peer exchange, errors) keep the checked encoder.
_UNCHECKED = frozenset((Push, Receipt, ReceiptBatch, RouteError, Keepalive))
PRUNE_INTERVAL_S = 3600.0
# Frames from a linked peer the engine does not (yet) hold as a neighbour, e.g. an inbound link held
# while this relay is full (rule M4), are kept until it is admitted and then handed to the engine:
# gossip that arrives while a link is being set up is not lost. Bounded per peer and in all.
PENDING_FRAMES_PEER_MAX_BYTES = 256 * 1024
PENDING_FRAMES_MAX_BYTES = 4 * 1024 * 1024
_KEEPALIVE_TYPE = int(MessageType.KEEPALIVE)
PUSH_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
# Backpressure (docs/operations.md, "Overload"): the drain rate is measured over windows of this
# length and smoothed (weight of the newest window); a 429's Retry-After is at most RETRY_AFTER_MAX_S.
DRAIN_WINDOW_S = 1.0
DRAIN_WEIGHT = 0.3
# The current window's drain counts once it has run this long: a burst after an idle spell (the
# smoothed rate decayed to about 0) is not refused for a whole window before its drain is measured.
DRAIN_SAMPLE_MIN_S = 0.2
RETRY_AFTER_MAX_S = 60
OVERLOAD_LOG_INTERVAL_S = 10.0  # one warning per interval while overloaded, with the count refused
# Settled statuses that are not the path draining (custody gave up on the push; unknown_registration:
# at the deadline, after `not home` answers, rule F5c).
_NOT_DRAINED = frozenset((CustodyStatus.EXPIRED, CustodyStatus.UNREACHABLE, CustodyStatus.UNKNOWN_REGISTRATION))


@dataclass(frozen=True, slots=True)
class Backpressure:
    """When the entry relay answers 429 instead of 202 (the [api] custody_* keys, docs/operations.md).

    A push is refused while the pushes this relay holds in custody (accepted, receipt not yet back)
    exceed what the path drains: in total, more than `custody_backlog_s` seconds of the measured
    drain rate (settled pushes per second) but at least `custody_backlog_min`; for one route id (one
    device), more than `custody_route_max`. The total counts the pushes accepted in the last
    `[engine] custody_deadline_s` only: older ones wait (parked, rule C3) for a home that is down, up
    to their TTL (days), and are not the path's backlog; counted, a few hundred of them would refuse
    every push for days. Accepting more would only lengthen the queue until pushes
    expire: a 429 with Retry-After makes the app slow down instead.
    """

    custody_backlog_s: float = 10.0
    custody_backlog_min: int = 200
    custody_route_max: int = 1000


class NetworkSink(Protocol):
    """Where the engine's network effects go (inri.node.links.LinkManager over QUIC)."""

    def send(self, peer: str, frame: bytes, delay: float) -> None: ...

    def connect(self, peer: str, addr: str) -> None: ...

    def disconnect(self, peer: str, reason: str) -> None: ...


def _frame_type(data: bytes) -> int:
    """The message type of a frame (msgpack array [type, ...]) without decoding it; 0 if not one."""
    return data[1] if len(data) > 1 and 0x90 <= data[0] <= 0x9F else 0


class RegistrationError(ValueError):
    """A device registration was refused (code: bad_registration, already_registered, not_newer)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


class RelayService:
    """One relay's protocol state plus its durable side effects (see module docstring)."""

    def __init__(
        self,
        node_id: str,
        engine_config: EngineConfig,
        store: Store,
        network: NetworkSink,
        tracer: Tracer,
        *,
        listen_addr: str = "",
        rng: random.Random | None = None,
        verifier: Verifier | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        mailbox_max: int | None = None,
        backpressure: Backpressure | None = None,
        wake: WakeSection | None = None,
        reachability: Reachability | None = None,
    ) -> None:
        self.node_id = node_id
        self.store = store
        if mailbox_max is not None:
            store.mailbox_max = mailbox_max
        self.network = network
        # A network that sends a push's registration by reference (LinkManager over inri/2 links).
        self._send_push: Callable[[str, bytes, bytes | None, float], None] | None = getattr(network, "send_push", None)
        # Two clocks (issue 13): `clock` is monotonic and is the engine's `now` (budgets, keepalives,
        # bans, custody timers, route lifetimes); `wall_clock` is unix time, for registrations'
        # issued_at/expires_at and for what is stored on disk (custody deadlines, message and status
        # times). The engine learns wall time through Engine.wall_offset, set by `_now()`.
        self.clock = clock
        self.wall_clock = wall_clock
        # Public address and isolation, as /v1/status, /healthz and the metrics tell them (reachability.py).
        self.reachability = reachability or Reachability(300.0, clock())
        self.settle_waiters: dict[bytes, trio.Event] = {}  # push id -> set when its custody ends
        self.verifier = verifier or CachingVerifier()
        self.engine = Engine(node_id, engine_config, verifier=self.verifier, home=store, tracer=tracer,
                             rng=rng or random.Random(), listen_addr=listen_addr)
        # Rule F5b: receipts answered as a home wait for the end of the round (the group commit that makes
        # their pushes durable) and leave batched per neighbour and route, one signature per batch.
        self.engine.hold_receipts()
        self._receipts_armed = False
        self._wake = trio.Event()
        self._armed_at = -math.inf  # when the timer task will next wake (-inf: not sleeping yet)
        self._mail_events: dict[bytes, trio.Event] = {}
        # Called with a route id once a message delivered here is committed (after the group commit):
        # the Mozilla Push connections (inri/node/mozpush_ws.py) wake on it.
        self.delivery_hooks: list[Callable[[bytes], None]] = []
        self._custody: dict[bytes, bytes] = {}  # push id in custody -> its route id
        self._route_custody: dict[bytes, int] = {}  # route id -> pushes in custody for it
        # Push id -> when it was taken into custody (or restored), oldest first: those of the last
        # custody_deadline_s, the backlog backpressure counts (older ones leave at the front).
        self._recent: dict[bytes, float] = {}
        self.backpressure = backpressure or Backpressure()
        self.drain_rate = 0.0  # settled pushes per second, smoothed (DRAIN_WINDOW_S, DRAIN_WEIGHT)
        self._drained = 0
        self._drain_since = clock()
        self.retry_after_s = 1  # Retry-After of the last push refused as overloaded
        self._overload_logged_at = -math.inf
        self._overload_unlogged = 0
        self.started_at = clock()
        self.counters: dict[str, int] = {}
        self.push_latency = [0] * (len(PUSH_LATENCY_BUCKETS) + 1)
        self.push_latency_sum = 0.0
        self._linked: dict[str, str] = {}  # peers with an open link (LinkManager's peer_up) -> addr
        self._active: set[str] = set()  # the engine's active view as last read (refreshed on a miss)
        self._pending_frames: dict[str, list[bytes]] = {}  # see PENDING_FRAMES_PEER_MAX_BYTES
        self._pending_bytes: dict[str, int] = {}
        self._rx: tuple[Any, bytes] | None = None  # the frame being handled, decoded, and its bytes
        # Wake hooks (inri/node/wake.py): devices with no live stream are woken through their app's gateway;
        # its task (wake.run) is started beside run() by the daemon.
        self.wake = WakeHooks(store, wake)

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def _now(self) -> float:
        """The engine's `now` (monotonic), with Engine.wall_offset brought up to date first."""
        now = self.clock()
        self.engine.wall_offset = self.wall_clock() - now
        return now

    # -- effects ----------------------------------------------------------------------------------

    def _apply(self, effects: list[Effect]) -> None:
        now = self.wall_clock()  # the store keeps wall-clock times
        offset = self.engine.wall_offset
        attempts: list[tuple[bytes, int]] = []
        last_msg: object = None
        frame = b""
        reg: bytes | None = None
        send_push = self._send_push
        for e in effects:
            match e:  # every effect type is handled: assert_never makes mypy flag a new one
                case Send():
                    msg = e.msg
                    if msg is not last_msg:  # a ring copy goes to several neighbours: encoded once
                        last_msg = msg
                        rx = self._rx
                        if rx is not None and msg is rx[0]:
                            frame = rx[1]  # passed on unchanged: the frame that came
                        else:  # a forwarded push too: re-encoding (shared packer) is cheaper than patching
                            frame = encode_unchecked(msg) if type(msg) in _UNCHECKED else encode(msg)
                        # A native push frame ends with its registration: the link may send it by reference.
                        reg = (push_registration_bytes(msg.registration) if type(msg) is Push
                               and msg.registration is not None and msg.webpush is None else None)
                    # Frames leave only once what they vouch for is committed (a receipt for a stored
                    # message, a forward of a push in custody): with group commit, after this round's.
                    if reg is not None and send_push is not None:
                        self.store.after_commit(functools.partial(send_push, e.peer, frame, reg, e.delay))
                    else:
                        self.store.after_commit(functools.partial(self.network.send, e.peer, frame, e.delay))
                    self._count(_OUT_NAMES[type(msg)])
                    if isinstance(msg, Push) and msg.attempt and msg.hops == 0 and msg.push_id in self._custody:
                        attempts.append((msg.push_id, msg.attempt))
                case CustodyTaken():
                    # On disk in wall-clock time: a restart starts a new monotonic clock (run() converts back).
                    self.store.save_custody(e.push, e.deadline + offset, now)
                    self._hold(e.push)
                case CustodyReleased():
                    self.store.release_custody(e.push_id, e.status, e.hops, now)
                    self._unhold(e.push_id, e.status)
                    waiter = self.settle_waiters.pop(e.push_id, None)
                    if waiter is not None:  # a Web Push sender waits briefly for the home's answer (committed)
                        self.store.after_commit(waiter.set)
                    self._count("custody_" + e.status)
                case Delivered():
                    self._count("delivered_here")
                    ev = self._mail_events.pop(e.route_id, None)
                    if ev is not None:
                        ev.set()
                    if self.wake.has_hooks():  # a wake-up only for what is committed (the app pulls it)
                        self.store.after_commit(functools.partial(self.wake.message_stored, e.route_id))
                    for hook in self.delivery_hooks:
                        self.store.after_commit(functools.partial(hook, e.route_id))
                case Connect():  # after the frames before it (see Send), in the engine's order
                    self.store.after_commit(functools.partial(self.network.connect, e.peer, e.addr))
                case Disconnect():  # never ahead of a frame queued for this peer before it (a receipt)
                    if e.reason == DisconnectReason.SCORE:  # rule S2: rare, and an operator must see it
                        log.warning("neighbour cut and banned for its score", peer=e.peer,
                                    ban_s=self.engine.config.score_ban_s, neighbours_left=len(self._linked) - 1)
                    self.store.after_commit(functools.partial(self.network.disconnect, e.peer, e.reason))
                    self._link_gone(e.peer)
                case _:
                    assert_never(e)
        if attempts:
            self.store.update_attempts(attempts)
        if not self._receipts_armed and self.engine.receipts_held():
            self._receipts_armed = True
            self.store.before_commit(self._flush_receipts)  # at once when no write is pending
        when = self.engine.get_timer()
        if when is not None and when < self._armed_at:
            self._wake.set()  # the engine's timer moved earlier than the timer task sleeps

    def _flush_receipts(self) -> None:
        """Rule F5b: the receipts of the round, signed and sent (after the commit, as every frame)."""
        self._receipts_armed = False
        try:
            effects = self.engine.flush_receipts(self._now())
        except Exception:  # a bug here must not stop the commit of the round's pushes
            self._count("internal_errors")
            log.exception("flushing receipts failed")
            return
        self._apply(effects)

    def _hold(self, push: Push) -> None:
        if push.push_id not in self._custody:
            self._custody[push.push_id] = push.route_id
            self._route_custody[push.route_id] = self._route_custody.get(push.route_id, 0) + 1
            self._recent[push.push_id] = self.clock()

    def _unhold(self, push_id: bytes, status: CustodyStatus) -> None:
        rid = self._custody.pop(push_id, None)
        if rid is None:
            return  # a late receipt correcting a settled push
        self._recent.pop(push_id, None)
        n = self._route_custody[rid] - 1
        if n:
            self._route_custody[rid] = n
        else:
            del self._route_custody[rid]
        if status not in _NOT_DRAINED:
            self._drained += 1

    # -- backpressure -----------------------------------------------------------------------------

    def custody_allowed(self) -> int:
        """Pushes this relay may hold in custody in all before it answers 429 (see Backpressure)."""
        now = self.clock()
        elapsed = now - self._drain_since
        if elapsed >= DRAIN_WINDOW_S:
            rate = self._drained / elapsed
            self.drain_rate += DRAIN_WEIGHT * (rate - self.drain_rate) if self.drain_rate else rate
            self._drained = 0
            self._drain_since = now
        bp = self.backpressure
        rate = self.drain_rate
        if elapsed >= DRAIN_SAMPLE_MIN_S and self._drained:
            # The window so far: receipts coming back this fast now are what the path drains now.
            rate = max(rate, self._drained / max(elapsed, DRAIN_SAMPLE_MIN_S))
        return max(bp.custody_backlog_min, int(rate * bp.custody_backlog_s))

    def overloaded(self, route_id: bytes) -> int | None:
        """Retry-After seconds when a push for route_id must be refused (429), None to accept it."""
        allowed = self.custody_allowed()
        recent, horizon = self._recent, self.clock() - self.engine.config.custody_deadline_s
        while recent:
            oldest = next(iter(recent))
            if recent[oldest] >= horizon:
                break
            del recent[oldest]
        held = len(recent)
        route_held = self._route_custody.get(route_id, 0)
        route_max = self.backpressure.custody_route_max
        if held < allowed and route_held < route_max:
            return None
        # Time for the path to drain the excess at its measured rate (at least a second).
        excess = max(held - allowed, route_held - route_max) + 1
        retry = max(1, min(RETRY_AFTER_MAX_S, math.ceil(excess / max(self.drain_rate, 1.0))))
        self._overload_unlogged += 1
        now = self.clock()
        if now - self._overload_logged_at >= OVERLOAD_LOG_INTERVAL_S:
            log.warning("overloaded: answering 429 (custody beyond what the path drains)",
                        custody=held, custody_allowed=allowed, route_custody=route_held,
                        route_max=route_max, drain_per_s=round(self.drain_rate, 1), retry_after_s=retry,
                        refused=self._overload_unlogged)
            self._overload_logged_at = now
            self._overload_unlogged = 0
        return retry

    # -- link events (LinkManager) ----------------------------------------------------------------

    def peer_up(self, peer: str, *, outbound: bool, addr: str) -> None:
        self._linked[peer] = addr
        self._apply(self.engine.peer_up(peer, self._now(), outbound=outbound, addr=addr))
        self._admit_pending()
        log.info("link up", peer=peer, addr=addr, outbound=outbound)
        self.reachability.neighbours(len(self.engine.active_peers()), self.clock())

    def peer_down(self, peer: str, reason: DisconnectReason) -> None:
        self._link_gone(peer)
        self._apply(self.engine.peer_down(peer, self._now(), reason))
        log.info("link down", peer=peer, reason=str(reason))
        self.reachability.neighbours(len(self.engine.active_peers()), self.clock())

    def _link_gone(self, peer: str) -> None:
        self._linked.pop(peer, None)
        self._active.discard(peer)
        self._pending_frames.pop(peer, None)
        self._pending_bytes.pop(peer, None)

    def link_congested(self, peer: str) -> None:
        """The link manager dropped a frame for peer: its send queue is full. Counted, and scored by
        the engine (rule S1; it scores at most once per keepalive interval however often we report)."""
        self._count("frames_dropped_congested")
        self._apply(self.engine.link_congested(peer, self._now()))

    def link_unresponsive(self, peer: str) -> None:
        """QUIC got no acknowledgement from peer through two probe timeouts: the engine re-sends what
        it awaits from peer another way and passes peer over until it is heard from (rule C6)."""
        self._apply(self.engine.link_unresponsive(peer, self._now()))

    def connect_failed(self, peer: str) -> None:
        self._apply(self.engine.connect_failed(peer, self._now()))

    def receive_frame(self, peer: str, data: bytes) -> None:
        # Frames are msgpack arrays [type, ...]: peek the type for the per-type counters.
        self._count(_IN_NAMES.get(_frame_type(data), "frames_in_other"))
        if peer not in self._active:
            self._active = set(self.engine.active_peers())
            if peer not in self._active:
                self._receive_pending(peer, data)
                return
        self._handle_frame(peer, data)

    def _handle_frame(self, peer: str, data: bytes) -> None:
        try:
            try:
                msg = decode(data)
            except DecodeError:  # the engine answers and scores a malformed frame
                effects = self.engine.receive_frame(peer, data, self._now())
            else:
                # Decoded once here, so that what the engine passes on unchanged (a receipt, a route
                # error, a receipt batch) leaves as the bytes that came (_apply; issue 16).
                self._rx = (msg, data)
                effects = self.engine.receive_message(peer, msg, self._now())
        except Exception:  # a bug on one frame must not take the relay down
            self._rx = None
            self._count("internal_errors")
            log.exception("frame handling failed", peer=peer, size=len(data))
            return
        try:
            self._apply(effects)
        finally:
            self._rx = None

    def _receive_pending(self, peer: str, data: bytes) -> None:
        """A frame from a linked peer that is not an active neighbour (yet): the engine sees it first
        (a Hello may admit the peer); if the engine ignored it, it is kept until the peer is admitted."""
        strangers = self.engine.counters.get("frames_from_stranger", 0)
        self._handle_frame(peer, data)
        ignored = self.engine.counters.get("frames_from_stranger", 0) > strangers
        if ignored and peer in self._linked and _frame_type(data) != _KEEPALIVE_TYPE:
            held = self._pending_bytes.get(peer, 0)
            if (held + len(data) > PENDING_FRAMES_PEER_MAX_BYTES
                    or sum(self._pending_bytes.values()) + len(data) > PENDING_FRAMES_MAX_BYTES):
                self._count("frames_pending_dropped")
            else:
                self._pending_frames.setdefault(peer, []).append(data)
                self._pending_bytes[peer] = held + len(data)
                self._count("frames_pending_held")
        self._admit_pending()

    def _admit_pending(self) -> None:
        """Hand held frames to the engine for every peer it now holds as a neighbour."""
        if not self._pending_frames:
            return
        self._active = set(self.engine.active_peers())
        for peer in [p for p in self._pending_frames if p in self._active]:
            frames = self._pending_frames.pop(peer)
            self._pending_bytes.pop(peer, None)
            for data in frames:
                self._count("frames_pending_replayed")
                self._handle_frame(peer, data)

    def add_candidates(self, peers: list[PeerInfo], *, near: int = 0) -> None:
        """Candidates into the engine's passive view; the first `near` are proximity-ranked (rule M5)."""
        self._apply(self.engine.add_candidates(peers, self._now(), near=near))

    # -- learned routes across restarts (routesnap.py) ---------------------------------------------

    def restore_routes(self, rows: list[tuple[bytes, int, float, tuple[tuple[str, int], ...]]]) -> int:
        """Routes learned before a restart, back in the engine (before its links come up)."""
        return self.engine.restore_routes(rows, self._now())

    def export_routes(self) -> list[tuple[bytes, int, float, tuple[tuple[str, int], ...]]]:
        """The learned routes to keep across a restart."""
        self._now()  # wall_offset up to date: expiries are written as wall-clock times
        return self.engine.export_routes()

    def export_route_chunks(self) -> Iterator[list[tuple[bytes, int, float, tuple[tuple[str, int], ...]]]]:
        """export_routes in lists of about 20,000 rows (the periodic snapshot yields between them)."""
        self._now()
        return self.engine.export_route_chunks()

    def export_anchors(self) -> list[tuple[str, str]]:
        """The neighbours of the moment (node id, QUIC address), dialled first after a restart."""
        return self.engine.export_anchors()

    def restore_anchors(self, anchors: list[tuple[str, str]]) -> int:
        """Former neighbours into the engine's redial list (before its links come up)."""
        return self.engine.restore_anchors(anchors, self._now())

    # -- the timer task ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Restore custody and homed routes, then run the engine's timers until cancelled."""
        now = self._now()
        restored = 0
        for push, deadline, attempt in self.store.load_custody():
            self._hold(push)
            # attempt + 1: relays' seen-caches may still hold the attempt sent before the crash. The
            # deadline on disk is wall-clock time: the engine wants it on its monotonic clock.
            self._apply(self.engine.restore_custody(push, deadline - self.engine.wall_offset, attempt + 1, now))
            restored += 1
        self._apply(self.engine.start(now))
        for reg in self.store.homed():
            if reg.expires_at > now + self.engine.wall_offset:
                self._apply(self.engine.register(reg, now, restart=True))
        if restored:
            log.info("custody restored", pushes=restored)
        task_status.started()
        next_prune = self.clock()
        while True:
            if self.clock() >= next_prune:  # push statuses are kept a week after settling (store.prune)
                self.store.prune(self.wall_clock())
                next_prune = self.clock() + PRUNE_INTERVAL_S
            when = self.engine.get_timer()
            self._wake = trio.Event()
            self._armed_at = math.inf if when is None else when
            delay = math.inf if when is None else max(0.0, when - self.clock())
            with trio.move_on_after(delay):
                await self._wake.wait()
            now = self._now()
            if when is not None and now >= when:
                self._apply(self.engine.handle_timer(now))

    # -- device API -------------------------------------------------------------------------------

    def register_device(
        self, registration: Registration, n_tokens: int, receipt_secret: bytes | None = None
    ) -> tuple[bytes, list[bytes]]:
        """Home a device: verify its self-signed registration, store it, gossip its route id.

        Returns (device secret, tokens). The secret authenticates the device to this relay only.
        receipt_secret: the private half of the registration's receipt key (this home signs receipts).
        """
        self._check_registration(registration)
        self._check_receipt_secret(registration, receipt_secret)
        secret = os.urandom(32)
        tokens = [os.urandom(16) for _ in range(n_tokens)]
        if not self.store.add_device(registration, secret, tokens, self.wall_clock(), receipt_secret):
            raise RegistrationError("already_registered", "this route key is already registered here")
        self._apply(self.engine.register(registration, self._now()))
        self._count("devices_registered")
        return secret, tokens

    def refresh_registration(self, registration: Registration, receipt_secret: bytes | None = None) -> None:
        """A newer epoch under the same route key: store it and gossip it (routes refresh mesh-wide).

        A registration whose receipt key is not the one this home holds must come with its secret.
        """
        self._check_registration(registration)
        old = self.store.registration(registration.route_id)
        if receipt_secret is not None or (old is not None and old.receipt_key != registration.receipt_key):
            self._check_receipt_secret(registration, receipt_secret)
        if not self.store.refresh_registration(registration, receipt_secret):
            raise RegistrationError("not_newer", "the registration's epoch must be newer than the stored one")
        self._apply(self.engine.register(registration, self._now()))

    @staticmethod
    def _check_receipt_secret(registration: Registration, receipt_secret: bytes | None) -> None:
        """The receipt secret must be the private half of the registration's receipt key (both or neither):
        a home that could not sign its receipts would have every one of them refused."""
        if registration.receipt_key is None and receipt_secret is None:
            return
        if (registration.receipt_key is None or receipt_secret is None
                or receipt_public_key(receipt_secret) != registration.receipt_key):
            raise RegistrationError("bad_receipt_key",
                                    "receipt_secret must be the private half of the registration's receipt_key")

    def _check_registration(self, registration: Registration) -> None:
        now = self.wall_clock()  # issued_at/expires_at are unix times
        if registration.expires_at <= now:
            raise RegistrationError("bad_registration", "registration has expired")
        if registration.issued_at > now + 300:
            raise RegistrationError("bad_registration", "registration is issued in the future")
        if not self.verifier.verify_registration(registration):
            raise RegistrationError("bad_registration", "registration signature does not verify")

    def add_tokens(self, route_id: bytes, n: int) -> list[bytes]:
        """n new one-use tokens for a homed device."""
        tokens = [os.urandom(16) for _ in range(n)]
        self.store.add_tokens(route_id, tokens)
        return tokens

    def install_tokens(self, route_id: bytes, tokens: list[bytes]) -> None:
        """Tokens another home of the device issued, valid here too (a token already known keeps its state:
        one spent here stays spent)."""
        self.store.add_tokens(route_id, tokens)

    def unregister(self, route_id: bytes) -> None:
        """Delete everything about the device here and stop originating its route."""
        self.store.remove_device(route_id)
        self.wake.forget_route(route_id)
        self._apply(self.engine.unregister(route_id, self._now()))
        ev = self._mail_events.pop(route_id, None)
        if ev is not None:
            ev.set()  # live streams notice the device is gone

    def inject_push(
        self, registration: Registration, token: bytes, ciphertext: bytes, *,
        push_id: bytes | None = None, webpush: WebPushMeta | None = None,
    ) -> InjectResult:
        """A home app's push (or a Web Push push, with its meta): verified, committed to custody, sent on.

        OVERLOADED when custody is beyond what the path drains (Backpressure; retry_after_s says when
        to come back) or the engine's custody table is full.
        """
        t0 = time.perf_counter()
        retry = self.overloaded(registration.route_id)
        if retry is not None:
            self.retry_after_s = retry
            self._count("pushes_refused_overloaded")
            return InjectResult(InjectOutcome.OVERLOADED, None, [])
        result = self.engine.inject_push(registration, token, ciphertext, self._now(), push_id=push_id,
                                         webpush=webpush)
        if result.outcome == InjectOutcome.ACCEPTED:
            self._apply(result.effects)
            dt = time.perf_counter() - t0
            self.push_latency_sum += dt
            self.push_latency[bisect.bisect_left(PUSH_LATENCY_BUCKETS, dt)] += 1  # the first bucket >= dt, or +Inf
            self._count("pushes_accepted")
        else:
            if result.outcome == InjectOutcome.OVERLOADED:
                # The route's next hop takes no more pushes this second (its push budget), or the
                # engine's custody table is full.
                self.retry_after_s = 1 if result.reason == "next_hop_busy" else RETRY_AFTER_MAX_S // 12
            self._count("pushes_refused_" + result.outcome.name.lower())
        return result

    def push_status(self, push_id: bytes) -> dict[str, Any] | None:
        return self.store.push_status(push_id)

    def pending(self, route_id: bytes, limit: int = 100) -> list[tuple[bytes, bytes, float]]:
        return self.store.pending(route_id, limit)

    def ack(self, route_id: bytes, push_ids: list[bytes]) -> int:
        n = self.store.ack(route_id, push_ids)
        self._count("messages_acked", n)
        self.wake.acked(route_id)
        return n

    def mail_event(self, route_id: bytes) -> trio.Event:
        """The event the next delivery for route_id (or its unregistering) sets.

        Take it *before* reading the mailbox, then wait on it: a delivery in between sets it, so the
        waiter never sleeps on a message it has not read (no lost wake-up).
        """
        ev = self._mail_events.get(route_id)
        if ev is None:
            ev = self._mail_events[route_id] = trio.Event()
        return ev

    # -- introspection ----------------------------------------------------------------------------

    def active_peers(self) -> list[str]:
        return self.engine.active_peers()

    def listed_peers(self) -> list[str]:
        """Neighbours both ends hold (rule M7): what /v1/status lists and inri_neighbours counts."""
        return self.engine.listed_peers()

    def status(self) -> dict[str, Any]:
        eng = self.engine
        return {
            "node_id": self.node_id,
            "quic_addr": eng.listen_addr,
            "passive": len(eng.passive_peers()),
            # Open links that are not a neighbour both ends hold (rule M7: held while this relay is full,
            # or dialled and not heard from yet): not in "neighbours" (inri_neighbours).
            "pending_neighbours": sorted(set(self._linked) - set(eng.listed_peers())),
            "routes": eng.route_count(),
            "route_table": eng.route_table_kind(),  # [engine] route_table: "compact" by default
            "peer_scores": eng.peer_scores(),  # docs/protocol.md, Peer scoring
            "banned_peers": eng.stats()["banned"],
            "custody": len(self._custody),
            "devices": self.store.device_count(),
            "messages_stored": self.store.mailbox_size(),
            "uptime_s": round(self.clock() - self.started_at, 3),
        }
