"""Registration references on relay links (link protocol inri/2, inri/node/regref.py): a push's
registration crosses a link once, then by a 2-byte reference; the receiver gets back the exact frame."""

from __future__ import annotations

import os
import random

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from inri.client.device import DeviceClient
from inri.core.state import new_push
from inri.node.identity import NodeIdentity
from inri.node.quic import Link, LinkClosed, QuicEndpoint
from inri.node.regref import SLOTS, RegRefError, RegRefReceiver, RegRefSender
from inri.protocol.codec import decode, encode_unchecked, push_registration_bytes
from inri.protocol.messages import Push, Registration


def _registrations(n: int) -> list[Registration]:
    return [DeviceClient("http://127.0.0.1:9").keys.registration(3600) for _ in range(n)]


def _push(reg: Registration, rng: random.Random) -> bytes:
    push = new_push(rng.randbytes(16), reg.route_id, rng.randbytes(16), rng.randbytes(rng.randint(0, 300)),
                    rng.randint(1, 127), rng.randint(0, 40), rng.randint(0, 9), rng.randint(0, 3), reg, None)
    return encode_unchecked(push)


REGS = _registrations(40)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, len(REGS) - 1), min_size=1, max_size=300), st.integers(2, 40), st.randoms())
def test_expand_gives_back_every_frame_exactly_whatever_the_eviction(picks: list[int], slots: int,
                                                                     rng: random.Random) -> None:
    """Any sequence of pushes, with fewer slots than registrations (evictions reuse slots): the
    receiver rebuilds each frame byte for byte, and a repeated registration costs its bytes once."""
    import inri.node.regref as regref

    old = regref.SLOTS
    regref.SLOTS = slots
    try:
        tx, rx = RegRefSender(), RegRefReceiver()
        for i in picks:
            reg = REGS[i]
            frame = _push(reg, rng)
            raw = push_registration_bytes(reg)
            assert frame.endswith(raw)
            sent = tx.pack(frame, raw)
            if sent[0] == regref.REF:
                assert len(sent) == len(frame) - len(raw) + 4  # 3 header bytes + the nil
            assert rx.expand(sent) == frame
            assert decode(rx.expand(tx.pack(frame, raw))) == decode(frame)
    finally:
        regref.SLOTS = old


def test_hostile_link_frames_are_refused_with_a_reason() -> None:
    rx = RegRefReceiver()
    for bad, why in ((b"\xe1\x00\x05\xc0", "empty registration slot 5"),
                     (b"\xe1\xff\xff\xc0", "out of range"),
                     (b"\xe1\x00", "too short"),
                     (b"\xe2\x00\x01\x00\x00\xc0", "bad length"),
                     (b"\xe2\x00\x01\x00\x09abc\xc0", "bad length"),
                     (b"\xe3\x00\x01\xc0", "unknown link frame kind"),
                     (b"\xe2\x00\x01\x00\x01a\x93", "must end with nil")):
        with pytest.raises(RegRefError, match=why):
            rx.expand(bad)


async def _pair(nursery: trio.Nursery, regref_a: bool, regref_b: bool
                ) -> tuple[QuicEndpoint, QuicEndpoint, Link, Link]:
    got: list[Link] = []
    arrived = trio.Event()

    async def on_link(link: Link) -> None:
        got.append(link)
        arrived.set()
        await trio.sleep_forever()

    ea = QuicEndpoint(NodeIdentity.generate(), idle_timeout_s=5.0, regref=regref_a)
    eb = QuicEndpoint(NodeIdentity.generate(), idle_timeout_s=5.0, regref=regref_b)
    await ea.bind("127.0.0.2", 0)
    await eb.bind("127.0.0.3", 0)
    await nursery.start(ea.serve, on_link)
    await nursery.start(eb.serve, None)
    out = await eb.connect(ea.listen_addr, expect_node_id=ea.identity.node_id)
    await arrived.wait()
    return ea, eb, out, got[0]


@pytest.mark.parametrize(("regref_a", "regref_b"), [(True, True), (True, False), (False, True)])
async def test_pushes_arrive_byte_identical_and_refs_only_when_both_speak_inri2(regref_a: bool,
                                                                                regref_b: bool) -> None:
    """Over real QUIC: 400 pushes for 4 registrations arrive as the exact frames sent, in order; with
    inri/2 on both ends about half the stream bytes go (each registration crosses once), with an
    inri/1 end every frame goes whole."""
    rng = random.Random(7)
    regs = REGS[:4]
    frames = [(f, push_registration_bytes(r)) for r in regs for f in (_push(r, rng) for _ in range(100))]
    rng.shuffle(frames)
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            ea, eb, out, inbound = await _pair(n, regref_a, regref_b)
            both = regref_a and regref_b
            assert out.regref == inbound.regref == both
            for frame, raw in frames:
                out.send_nowait(frame, raw)
                out.send_nowait(b"\x92\x05\x01")  # any other frame between them goes as it is
            for frame, _ in frames:
                assert await inbound.receive() == frame
                assert await inbound.receive() == b"\x92\x05\x01"
            sent = eb._conns and sum(c.quic._streams[0].sender._buffer_stop for c in eb._conns
                                     if 0 in c.quic._streams)
            whole = sum(len(f) + 4 for f, _ in frames) + 7 * len(frames)
            if both:
                assert sent < 0.65 * whole
            else:
                assert sent >= whole
            n.cancel_scope.cancel()


async def test_a_reference_to_an_empty_slot_closes_the_link_and_the_endpoint_serves_on() -> None:
    """A peer that refers to a registration it never sent breaks the protocol: the receiver closes
    that link with the reason (QUIC error 5) and keeps serving others."""
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            ea, eb, out, inbound = await _pair(n, True, True)
            out._conn.send_frame(b"\xe1\x00\x07" + os.urandom(20) + b"\xc0")
            with pytest.raises(LinkClosed):
                await inbound.receive()
            with pytest.raises(LinkClosed, match="empty registration slot 7"):
                for _ in range(100):
                    out.send_nowait(b"\x92\x05\x01")
                    await trio.sleep(0.05)
            again = await eb.connect(ea.listen_addr, expect_node_id=ea.identity.node_id)
            assert again.regref
            reg = REGS[0]
            frame = _push(reg, random.Random(1))
            again.send_nowait(frame, push_registration_bytes(reg))
            n.cancel_scope.cancel()


def test_push_registration_bytes_is_what_a_push_frame_ends_with() -> None:
    rng = random.Random(3)
    for reg in REGS[:5]:
        frame = _push(reg, rng)
        assert frame.endswith(push_registration_bytes(reg))
        assert isinstance(decode(frame), Push)
    assert SLOTS >= 256


async def test_an_inri1_link_hands_any_frame_to_the_relay_unchanged() -> None:
    """Only inri/2 links read 0xE1/0xE2 as registration references: on an inri/1 link such a frame is
    whatever the peer sent, for the relay to refuse with an error frame (as before inri/2)."""
    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            _, _, out, inbound = await _pair(n, True, False)
            for frame in (b"\xe1\x00\x07\xc0", b"\xe2garbage", b"\xff"):
                out.send_nowait(frame)
                assert await inbound.receive() == frame
            n.cancel_scope.cancel()
