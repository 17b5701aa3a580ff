"""QUIC coalescing (issue 16, item 4): a forwarding relay's frames made in one trio scheduling round
leave in as few UDP datagrams as QUIC packs them into, not one datagram per forwarded frame.

A line of three endpoints A -> B -> C; B's link manager (inri.node.links) hands each frame from A to a
forwarder that sends it on to C, as a relay forwarding pushes does. Before coalescing, B handled one
received frame per round and its link to C transmitted after each: about one datagram per frame.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

import pytest
import trio

from inri.common.identity import NodeIdentity
from inri.core.api import DisconnectReason
from inri.node.links import LinkManager
from inri.node.quic import Link, QuicEndpoint

FRAMES = 2000
SO_NO_CHECK = 11  # Linux's socket option (Python's socket module has no name for it)


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

    def listed_peers(self) -> list[str]:
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


async def _pair(n: trio.Nursery, on_link: Any) -> tuple[QuicEndpoint, QuicEndpoint, Link]:
    ids = [NodeIdentity.generate() for _ in range(2)]
    server, client = QuicEndpoint(ids[0]), QuicEndpoint(ids[1])
    for ep in (server, client):
        await ep.bind("127.0.0.1", 0)
    await n.start(server.serve, on_link)
    await n.start(client.serve, None)
    link = await client.connect(server.listen_addr, expect_node_id=ids[0].node_id)
    return server, client, link


class _Receiver:
    """The server's side: takes every frame as it arrives (Link.deliver_to)."""

    def __init__(self) -> None:
        self.got: list[bytes] = []
        self.want = 0
        self.done = trio.Event()

    async def on_link(self, link: Link) -> None:
        def take(frame: bytes) -> None:
            self.got.append(frame)
            if len(self.got) == self.want:
                self.done.set()
        link.deliver_to(take)
        await link.receive()

    async def round(self, client: QuicEndpoint, link: Link, frames: list[bytes]) -> tuple[int, int]:
        """Queue frames in one scheduling round; once all arrived (in order, once each), the datagrams
        and the send system calls the client took."""
        self.got, self.want, self.done = [], len(frames), trio.Event()
        await trio.sleep(0.05)  # acknowledgements of anything before are out
        datagrams, calls = client.stats["datagrams_out"], client.stats["send_calls"]
        for f in frames:
            link.send_nowait(f)
        with trio.fail_after(20):
            await self.done.wait()
        assert self.got == frames
        return client.stats["datagrams_out"] - datagrams, client.stats["send_calls"] - calls


@pytest.mark.skipif(sys.platform != "linux", reason="UDP GSO is Linux's")
async def test_the_datagrams_of_one_round_leave_in_few_system_calls() -> None:
    """UDP GSO: a round's frames to one peer (about 25 datagrams) leave in a few sendmsg calls, each
    cut by the kernel into the datagrams QUIC built (as many as its pacing lets go at once)."""
    frames = [b"%04d" % i + b"p" * 396 for i in range(72)]
    rx = _Receiver()
    async with trio.open_nursery() as n:
        _, client, link = await _pair(n, rx.on_link)
        for _ in range(5):  # the congestion window opens (aioquic paces a quarter of it per burst)
            await rx.round(client, link, frames)
        sent, calls = await rx.round(client, link, frames)
        n.cancel_scope.cancel()
    assert client.gso and sent >= 20
    assert calls <= sent // 4, f"{sent} datagrams in {calls} system calls"


@pytest.mark.skipif(sys.platform != "linux", reason="UDP GSO is Linux's")
async def test_a_kernel_that_refuses_gso_turns_it_off_and_loses_nothing() -> None:
    """A socket the kernel will not segment for (here: UDP checksums turned off, SO_NO_CHECK, which
    GSO needs) refuses the first batch; it is sent again one datagram at a time, nothing is lost,
    and GSO stays off for the endpoint."""
    frames = [b"%04d" % i + b"q" * 996 for i in range(40)]
    rx = _Receiver()
    async with trio.open_nursery() as n:
        _, client, link = await _pair(n, rx.on_link)
        assert client._raw is not None
        client._raw.setsockopt(socket.SOL_SOCKET, SO_NO_CHECK, 1)
        sent, calls = await rx.round(client, link, frames)
        assert not client.gso
        sent2, calls2 = await rx.round(client, link, frames)
        n.cancel_scope.cancel()
    assert calls == sent and calls2 == sent2 >= 30  # one by one
