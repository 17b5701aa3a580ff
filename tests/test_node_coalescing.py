"""QUIC coalescing (issue 16, item 4): a forwarding relay's frames made in one trio scheduling round
leave in as few UDP datagrams as QUIC packs them into, not one datagram per forwarded frame.

A line of three endpoints A -> B -> C; B's link manager (inri.node.links) hands each frame from A to a
forwarder that sends it on to C, as a relay forwarding pushes does. Before coalescing, B handled one
received frame per round and its link to C transmitted after each: about one datagram per frame.
"""

from __future__ import annotations

import trio

from inri.common.identity import NodeIdentity
from inri.core.api import DisconnectReason
from inri.node.links import LinkManager
from inri.node.quic import Link, QuicEndpoint

FRAMES = 2000


class Forwarder:
    """Link events of one endpoint: frames from `src` go on to `dst`; frames for nobody are counted."""

    def __init__(self, links: LinkManager) -> None:
        self.links = links
        self.route: dict[str, str] = {}
        self.peers: set[str] = set()
        self.got = 0
        self.done = trio.Event()

    def peer_up(self, peer: str, *, outbound: bool, addr: str) -> None:
        self.peers.add(peer)

    def peer_down(self, peer: str, reason: DisconnectReason) -> None:
        self.peers.discard(peer)

    def connect_failed(self, peer: str) -> None: ...

    def link_congested(self, peer: str) -> None: ...

    def link_unresponsive(self, peer: str) -> None: ...

    def active_peers(self) -> list[str]:
        return sorted(self.peers)

    def receive_frame(self, peer: str, data: bytes) -> None:
        if peer in self.route:
            self.links.send(self.route[peer], data, 0.0)
            return
        self.got += 1
        if self.got == FRAMES:
            self.done.set()


async def test_a_forwarding_relay_sends_frames_of_one_round_in_shared_datagrams() -> None:
    ids = [NodeIdentity.generate() for _ in range(3)]
    eps = [QuicEndpoint(i) for i in ids]
    async with trio.open_nursery() as n:
        hops = []
        for ep in eps:
            await ep.bind("127.0.0.1", 0)
            lm = LinkManager(ep)
            hop = Forwarder(lm)
            lm.events = hop
            await n.start(lm.run)
            hops.append(hop)
        a, b, c = hops
        b.links.connect(ids[0].node_id, eps[0].listen_addr)
        b.links.connect(ids[2].node_id, eps[2].listen_addr)
        with trio.fail_after(20):
            while len(b.peers) < 2 or not a.peers or not c.peers:
                await trio.sleep(0.01)
        b.route = {ids[0].node_id: ids[2].node_id}
        before = eps[1].stats["datagrams_out"]
        for i in range(FRAMES):  # A sends in bursts of 32 frames (a push frame is ~300 bytes)
            a.links.send(ids[1].node_id, b"\x9a\x03" + b"p" * 298, 0.0)
            if i % 32 == 31:
                await trio.sleep(0)
        with trio.fail_after(60):
            await c.done.wait()
        sent = eps[1].stats["datagrams_out"] - before  # B: frames to C, ACKs to A and C
        n.cancel_scope.cancel()
    assert sent < FRAMES * 0.42, f"the forwarder sent {sent} datagrams for {FRAMES} frames"


async def test_an_answer_carries_the_acknowledgement_of_what_it_answers() -> None:
    """A frame answered at once (a receipt back on the link a push came in on) takes the ACK for the
    packet that brought it along: one datagram each way, not a second ACK-only datagram ACK_DELAY_S
    later. The exchanges are spaced wider than ACK_DELAY_S, so no later packet could carry it either."""
    ids = [NodeIdentity.generate() for _ in range(2)]
    server, client = QuicEndpoint(ids[0]), QuicEndpoint(ids[1])

    async def answer(link: Link) -> None:
        link.deliver_to(lambda frame: link.send_nowait(b"re:" + frame))
        await link.receive()  # returns only when the link closes (LinkClosed)

    exchanges = 40
    async with trio.open_nursery() as n:
        for ep in (server, client):
            await ep.bind("127.0.0.1", 0)
        await n.start(server.serve, answer)
        await n.start(client.serve, None)
        with trio.fail_after(30):
            link = await client.connect(server.listen_addr, expect_node_id=ids[0].node_id)
            await trio.sleep(0.1)  # the handshake's last ACKs are out
            before = server.stats["datagrams_out"]
            for i in range(exchanges):
                await link.send(b"%d" % i)
                assert await link.receive() == b"re:%d" % i
                await trio.sleep(0.015)  # > ACK_DELAY_S: the server's ACK is due before the next frame
            sent = server.stats["datagrams_out"] - before
        n.cancel_scope.cancel()
    assert sent <= exchanges * 1.25, f"the server sent {sent} datagrams for {exchanges} answers"
