"""The link manager: carries the engine's Send/Connect/Disconnect effects over QUIC links.

It implements the `NetworkSink` the relay service drives (inri.node.service) and feeds link events
back into it: `peer_up` when a link is authenticated, `receive_frame` for every frame, `peer_down`
when a link dies, `connect_failed` when a dial does not produce a link. Membership decisions (whom to
dial, whom to drop) stay in the engine; this module only owns sockets.

Each link's send queue is bounded in bytes (`[quic] send_queue_max_bytes`): a neighbour that
withholds QUIC flow-control credit (it never reads, yet keeps its link alive with keepalives) would
otherwise make us buffer every frame of every gossip flood for it. Frames past the bound are dropped,
counted, and reported to the relay service (`link_congested`), which scores the neighbour.

At most one link per neighbour: when two relays dial each other at once, the link dialled by the
smaller node id wins on both sides, so neither ends up with two half-used connections.

An operator may cap the push frames sent on each link (`[quic] link_push_rate_per_s`, e.g. to bound
what a relay on a thin uplink forwards): push frames past the rate wait in the link's paced queue, in
order, and count toward the same send queue bound; other frames (receipts, gossip, keepalives) are
never paced.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import structlog
import trio

from inri.core.api import DisconnectReason
from inri.node.quic import ConnectError, Link, LinkClosed, QuicEndpoint
from inri.protocol.messages import MessageType

log = structlog.get_logger("inri.links")


class LinkEvents(Protocol):
    """What the link manager reports (RelayService implements it)."""

    def peer_up(self, peer: str, *, outbound: bool, addr: str) -> None: ...

    def peer_down(self, peer: str, reason: DisconnectReason) -> None: ...

    def connect_failed(self, peer: str) -> None: ...

    def receive_frame(self, peer: str, data: bytes) -> None: ...

    def link_congested(self, peer: str) -> None: ...

    def link_unresponsive(self, peer: str) -> None: ...

    def active_peers(self) -> list[str]: ...

    def listed_peers(self) -> list[str]: ...


DEFAULT_SEND_QUEUE_MAX_BYTES = 4 * 1024 * 1024  # RelayConfig.quic.send_queue_max_bytes
_PUSH_TYPE = int(MessageType.PUSH)


def _is_push(frame: bytes) -> bool:
    """A push frame (msgpack array [type, ...]) without decoding it."""
    return len(frame) > 1 and 0x90 <= frame[0] <= 0x9F and frame[1] == _PUSH_TYPE


class LinkManager:
    """Owns the QUIC endpoint's links; one per neighbour node id."""

    def __init__(self, endpoint: QuicEndpoint, *, connect_timeout_s: float = 5.0,
                 send_queue_max_bytes: int = DEFAULT_SEND_QUEUE_MAX_BYTES, push_rate_per_s: float = 0.0) -> None:
        self.endpoint = endpoint
        self.connect_timeout_s = connect_timeout_s
        self.send_queue_max_bytes = send_queue_max_bytes
        self.push_rate_per_s = push_rate_per_s  # 0: push frames are not paced
        # Push frames (with their registration's bytes, Link.send_nowait) waiting for their turn, per link.
        self._paced: dict[Link, deque[tuple[bytes, bytes | None]]] = {}
        self._paced_bytes: dict[Link, int] = {}
        self.events: LinkEvents | None = None
        self._links: dict[str, Link] = {}
        self._dropped_by_us: set[Link] = set()
        self._dialling: set[str] = set()
        self._nursery: trio.Nursery | None = None
        self.stats = {"frames_out": 0, "frames_in": 0, "frames_unroutable": 0, "links_opened": 0,
                      "links_closed": 0, "dial_failures": 0, "duplicate_links": 0, "links_replaced": 0,
                      "frames_dropped_congested": 0, "links_unresponsive": 0}

    # -- NetworkSink ------------------------------------------------------------------------------

    def send(self, peer: str, frame: bytes, delay: float) -> None:
        """Queue frame to peer (after delay seconds); a frame for a peer with no link is dropped."""
        self.send_push(peer, frame, None, delay)

    def send_push(self, peer: str, frame: bytes, reg: bytes | None, delay: float) -> None:
        """send() for a push frame that ends with its registration's bytes reg (None: any frame), which
        an inri/2 link sends by reference once the peer has them (node/regref.py)."""
        link = self._links.get(peer)
        if link is None:
            self.stats["frames_unroutable"] += 1
            return
        if delay > 0 and self._nursery is not None:
            self._nursery.start_soon(self._send_later, link, frame, reg, delay)
            return
        if self.push_rate_per_s > 0 and self._nursery is not None and _is_push(frame):
            self._send_paced(link, frame, reg)
            return
        self._send_now(link, frame, reg)

    def _congested(self, link: Link) -> None:
        self.stats["frames_dropped_congested"] += 1
        if self.events is not None and not link.closed:
            self.events.link_congested(link.peer_node_id)

    def _send_paced(self, link: Link, frame: bytes, reg: bytes | None) -> None:
        queued = self._paced_bytes.get(link, 0)
        if link.send_backlog + queued + len(frame) + 4 > self.send_queue_max_bytes:
            self._congested(link)
            return
        q = self._paced.get(link)
        if q is None:
            assert self._nursery is not None
            q = self._paced[link] = deque()
            self._nursery.start_soon(self._pace, link, q)
        q.append((frame, reg))
        self._paced_bytes[link] = queued + len(frame) + 4

    async def _pace(self, link: Link, q: deque[tuple[bytes, bytes | None]]) -> None:
        """Send link's queued push frames at push_rate_per_s until the queue is empty."""
        interval = 1.0 / self.push_rate_per_s
        next_at = trio.current_time()
        try:
            while q and not link.closed:
                await trio.sleep_until(next_at)
                frame, reg = q.popleft()
                self._paced_bytes[link] -= len(frame) + 4
                self._send_now(link, frame, reg, paced=True)
                next_at = max(next_at + interval, trio.current_time() - interval)
        finally:
            self._paced.pop(link, None)
            self._paced_bytes.pop(link, None)

    def _send_now(self, link: Link, frame: bytes, reg: bytes | None = None, *, paced: bool = False) -> None:
        if link in self._paced and not paced and _is_push(frame):
            self._send_paced(link, frame, reg)  # keep push order behind frames already waiting
            return
        if link.send_backlog + len(frame) + 4 > self.send_queue_max_bytes:  # 4: the length prefix
            self._congested(link)
            return
        try:
            link.send_nowait(frame, reg)
            self.stats["frames_out"] += 1
        except LinkClosed:
            self.stats["frames_unroutable"] += 1

    async def _send_later(self, link: Link, frame: bytes, reg: bytes | None, delay: float) -> None:
        await trio.sleep(delay)
        self._send_now(link, frame, reg)

    def connect(self, peer: str, addr: str) -> None:
        """Dial peer at addr in the background; reports peer_up or connect_failed."""
        if peer in self._links or peer in self._dialling or self._nursery is None:
            if peer in self._links and self.events is not None:
                # Already linked (it dialled us first): tell the engine the link it wants exists.
                link = self._links[peer]
                self.events.peer_up(peer, outbound=link.outbound, addr=link.listen_addr or addr)
            return
        self._dialling.add(peer)
        self._nursery.start_soon(self._dial, peer, addr)

    def disconnect(self, peer: str, reason: str) -> None:
        """Close the link to peer; the engine already forgot it, so no peer_down follows."""
        link = self._links.pop(peer, None)
        if link is None:
            return
        self._dropped_by_us.add(link)
        self._nursery_close(link, reason)

    # -- running ----------------------------------------------------------------------------------

    def _nursery_close(self, link: Link, reason: str) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(link.aclose, reason)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve inbound links on the endpoint until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.endpoint.serve, self._inbound)
            task_status.started()
            await trio.sleep_forever()

    def neighbours(self) -> list[dict[str, object]]:
        """Links to neighbours both ends hold (rule M7: for /v1/status; what inri_neighbours counts)."""
        listed = set(self.events.listed_peers()) if self.events is not None else set()
        return [self._describe(p, link) for p, link in sorted(self._links.items()) if p in listed]

    def pending(self) -> list[dict[str, object]]:
        """Links that are open but not (yet) a neighbour both ends hold: e.g. held while this relay is full,
        or dialled and not yet heard from (rule M7)."""
        listed = set(self.events.listed_peers()) if self.events is not None else set()
        return [self._describe(p, link) for p, link in sorted(self._links.items()) if p not in listed]

    @staticmethod
    def _describe(peer: str, link: Link) -> dict[str, object]:
        return {"node_id": peer, "addr": link.listen_addr or link.remote_addr, "outbound": link.outbound,
                "send_backlog_bytes": link.send_backlog, "rtt_ms": link.rtt}

    async def _dial(self, peer: str, addr: str) -> None:
        try:
            link = await self.endpoint.connect(addr, expect_node_id=peer, timeout_s=self.connect_timeout_s)
        except (ConnectError, OSError) as exc:
            self._dialling.discard(peer)
            self.stats["dial_failures"] += 1
            log.debug("dial failed", peer=peer, addr=addr, error=str(exc))
            if peer not in self._links and self.events is not None:
                self.events.connect_failed(peer)
            return
        self._dialling.discard(peer)
        await self._serve_link(link, addr)

    async def _inbound(self, link: Link) -> None:
        await self._serve_link(link, link.listen_addr)

    async def _serve_link(self, link: Link, addr: str) -> None:
        peer = link.peer_node_id
        existing = self._links.get(peer)
        me = self.endpoint.identity.node_id
        if (existing is not None and not existing.closed and not link.outbound
                and (not existing.outbound or peer < me
                     or link.opened_at - existing.opened_at > self.connect_timeout_s)):
            # The peer dialled us while we hold an older link with it: a relay never dials a peer it
            # holds a link with (connect), so its end of that link is gone: it restarted (kill -9,
            # an upgrade) or the close never reached us. The new link replaces the old one at once,
            # as a new link: the engine sees the old one go down and the new one come up (its
            # announcements, receipts awaited over the old link re-routed). Before, the rule below
            # refused the new link as a duplicate whenever the peer's node id was the larger one,
            # and the restarted relay stayed cut off from us until our keepalives timed out.
            # A simultaneous dial (next rule) has an outbound link of ours as the older one, opened
            # within a connect timeout: a restart that soon after the link came up looks the same, so
            # when the node id rule keeps the new link, it is a new link to the engine too. Before,
            # it swapped links silently: the engine kept the old link's state, refused the restarted
            # relay's route sync as a repeat and never announced its homed routes to it (rules G11,
            # G5); that relay lacked a route for a minute and more (issue 43).
            self.stats["links_replaced"] += 1
            self._links[peer] = link
            self._dropped_by_us.add(existing)
            self._nursery_close(existing, "replaced by a new link")
            log.info("link replaced", peer=peer, addr=addr)
            if self.events is not None:
                self.events.peer_down(peer, DisconnectReason.LINK_LOST)
                self.events.peer_up(peer, outbound=False, addr=addr)
        elif existing is not None and not existing.closed:
            # Simultaneous dials: keep the link whose dialler has the smaller node id. Left to this rule:
            # our dial completing while we hold the peer's link (it came during our dial: the same run
            # of the peer, so a swap the engine need not see), and the peer's link, its node id the
            # larger, coming while ours is younger than a connect timeout (refused: a peer that did
            # restart dials again, and gets in once our old link timed out, keepalives, rule M2).
            keep_new = (link.outbound and me < peer) or (not link.outbound and peer < me)
            self.stats["duplicate_links"] += 1
            if not keep_new:
                await link.aclose("duplicate link")
                return
            self._links[peer] = link
            self._dropped_by_us.add(existing)
            await existing.aclose("duplicate link")
        else:
            self._links[peer] = link
            self.stats["links_opened"] += 1
            if self.events is not None:
                self.events.peer_up(peer, outbound=link.outbound, addr=addr)
        reason = "closed"

        def on_frame(frame: bytes) -> None:
            self.stats["frames_in"] += 1
            if self.events is not None:
                self.events.receive_frame(peer, frame)

        def on_unresponsive() -> None:  # rule C6: QUIC's probe timeout fired twice in a row
            self.stats["links_unresponsive"] += 1
            if self._links.get(peer) is link and self.events is not None:
                self.events.link_unresponsive(peer)

        link.on_unresponsive(on_unresponsive)
        try:
            # Frames are handled as the endpoint's receive loop parses them, every datagram waiting
            # in one go: the frames they make us send are flushed together (quic.py, coalescing).
            link.deliver_to(on_frame)
            while True:  # nothing is queued any more: this waits for the link to close
                on_frame(await link.receive())
        except LinkClosed as exc:
            reason = str(exc) or "closed"
        finally:
            self.stats["links_closed"] += 1
            ours = link in self._dropped_by_us
            self._dropped_by_us.discard(link)
            if self._links.get(peer) is link:
                del self._links[peer]
                if not ours and self.events is not None:
                    self.events.peer_down(peer, DisconnectReason.from_remote(reason))
            await link.aclose(reason)
