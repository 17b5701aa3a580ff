"""Batched receipts (issue 16, docs/protocol.md rule F5b): a home relay answers the pushes of one route that
reached it from one neighbour in one scheduling round with ONE ReceiptBatch frame under ONE signature;
every relay on the way back checks that signature once per batch, passes the batch on whole, and refuses
(and scores down the sender of) a batch that does not verify, exactly as a forged single receipt.

Driven through RelayService's link interface (receive_frame in, the network sink's send out) with the
store's group commit running as in the daemon, and through the engine for the custodian's side.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import msgpack
import pytest
import trio
from nacl.signing import SigningKey

from inri.core.api import CustodyStatus
from inri.core.config import EngineConfig
from inri.core.testing import MiniNet
from inri.core.trace import ListTracer
from inri.node.service import RelayService
from inri.node.store import Store
from inri.protocol.codec import DecodeError, decode, encode, make_registration
from inri.protocol.keys import new_signing_key, receipt_public_key, receipt_signed_bytes, receipts_signed_bytes
from inri.protocol.messages import Push, Receipt, ReceiptBatch, ReceiptStatus, RegGossip, Registration

UP, DOWN, SIDE = "0" * 32, "2" * 32, "3" * 32
STORED = ReceiptStatus.STORED


class Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def send(self, peer: str, frame: bytes, delay: float) -> None:
        self.sent.append((peer, frame))

    def connect(self, peer: str, addr: str) -> None: ...

    def disconnect(self, peer: str, reason: str) -> None: ...


def _device() -> tuple[Registration, bytes]:
    secret = os.urandom(32)
    return make_registration(new_signing_key(), 1, int(time.time()), 3600, receipt_public_key(secret)), secret


def _batch(secret: bytes, route_id: bytes, items: list[tuple[bytes, ReceiptStatus, int]]) -> ReceiptBatch:
    sig = SigningKey(secret).sign(receipts_signed_bytes(route_id, items)).signature
    return ReceiptBatch(route_id, tuple(items), sig)


# -- the wire -------------------------------------------------------------------------------------


def test_receipt_batch_codec_round_trip_and_strictness() -> None:
    items = [(os.urandom(16), STORED, 3), (os.urandom(16), ReceiptStatus.SPENT, 4)]
    good = ReceiptBatch(b"r" * 16, tuple(items), b"s" * 64)
    frame = encode(good)
    assert decode(frame) == good
    raw = msgpack.unpackb(frame, raw=False)

    def mangled(i: int, value: object) -> bytes:
        bad = list(raw)
        bad[i] = value
        return msgpack.packb(bad, use_bin_type=True)

    for frame_bad in (
        mangled(3, [[items[0][0], 1, 3]]),  # one receipt: a plain Receipt, not a batch
        mangled(3, [[items[0][0], 1, 3], [items[0][0], 2, 3]]),  # a push id twice
        mangled(3, [[os.urandom(16), 1, 3] for _ in range(257)]),  # over MAX_RECEIPTS_PER_BATCH
        mangled(3, [[items[0][0], 1, 3], [items[1][0], 99, 3]]),  # unknown status
        mangled(3, [[items[0][0], 1], [items[1][0], 1, 3]]),  # item shape
        mangled(4, None),  # a batch is always signed
        mangled(4, b"s" * 63),
        mangled(2, b"r" * 15),
    ):
        with pytest.raises(DecodeError):
            decode(frame_bad)
    # The signed bytes cover every (push id, status) in order and differ from a single receipt's.
    assert receipts_signed_bytes(b"r" * 16, items) != receipts_signed_bytes(b"r" * 16, items[::-1])
    assert receipts_signed_bytes(b"r" * 16, items[:1]) != receipt_signed_bytes(items[0][0], b"r" * 16, STORED)


# -- the home relay: one batch per (neighbour, route) per round -------------------------------------


async def test_the_home_answers_a_rounds_pushes_of_a_route_with_one_signed_batch_per_neighbour(
    tmp_path: Path,
) -> None:
    sink = Sink()
    store = Store(tmp_path / "relay.sqlite3")
    svc = RelayService("1" * 32, EngineConfig(), store, sink, ListTracer())
    async with trio.open_nursery() as n:
        await n.start(store.run)  # group commit, as `inri relay` runs it
        for p in (UP, SIDE):
            svc.peer_up(p, outbound=True, addr="127.0.0.1:1")
        reg, secret = _device()
        _, tokens = svc.register_device(reg, 30, secret)
        await trio.sleep(0.05)
        sink.sent.clear()
        pids = [os.urandom(16) for _ in range(30)]
        # One round: 20 pushes from UP, 10 from SIDE (the frames of one datagram read), the last one of
        # them again from UP (a second copy: answered once).
        for i, pid in enumerate(pids):
            frame = encode(Push(pid, reg.route_id, tokens[i], b"c", 120, 2, 0, 0, reg))
            svc.receive_frame(UP if i < 20 else SIDE, frame)
        svc.receive_frame(UP, encode(Push(pids[0], reg.route_id, tokens[0], b"c", 120, 2, 1, 0, reg)))
        assert sink.sent == []  # nothing leaves before the round's commit
        await trio.sleep(0.05)
        n.cancel_scope.cancel()
    frames = {peer: decode(f) for peer, f in sink.sent}
    assert len(sink.sent) == 2 and set(frames) == {UP, SIDE}
    for peer, want in ((UP, pids[:20]), (SIDE, pids[20:])):
        batch = frames[peer]
        assert isinstance(batch, ReceiptBatch) and batch.route_id == reg.route_id
        assert [p for p, _, _ in batch.items] == want
        assert {(s, h) for _, s, h in batch.items} == {(STORED, 3)}
        # The device's receipt key (its public half is in the registration) signed the whole batch.
        assert svc.verifier.verify_receipts(reg.receipt_key, batch)  # type: ignore[arg-type]
    assert svc.engine.counters["receipt_batches_sent"] == 2
    assert svc.engine.counters["receipts_batched"] == 30
    assert len(svc.pending(reg.route_id, 100)) == 30  # stored once each


def test_receipt_batch_max_1_answers_each_push_with_its_own_receipt(tmp_path: Path) -> None:
    """[engine] receipt_batch_max = 1 (a mesh with relays that predate F5b): one Receipt per push."""

    async def main() -> list[tuple[str, bytes]]:
        sink = Sink()
        store = Store(tmp_path / "relay.sqlite3")
        svc = RelayService("1" * 32, EngineConfig(receipt_batch_max=1), store, sink, ListTracer())
        async with trio.open_nursery() as n:
            await n.start(store.run)
            svc.peer_up(UP, outbound=True, addr="127.0.0.1:1")
            reg, secret = _device()
            _, tokens = svc.register_device(reg, 5, secret)
            await trio.sleep(0.05)
            sink.sent.clear()
            for i in range(5):
                svc.receive_frame(UP, encode(Push(os.urandom(16), reg.route_id, tokens[i], b"c", 120, 2, 0, 0, reg)))
            await trio.sleep(0.05)
            n.cancel_scope.cancel()
        return sink.sent

    sent = trio.run(main)
    assert len(sent) == 5 and all(isinstance(decode(f), Receipt) for _, f in sent)


# -- a forwarding relay: one check per batch, passed on whole, forgeries refused ---------------------


def _forwarder(tmp_path: Path) -> tuple[RelayService, Sink, Registration, bytes]:
    sink = Sink()
    svc = RelayService("1" * 32, EngineConfig(), Store(tmp_path / "relay.sqlite3"), sink, ListTracer())
    for p in (UP, DOWN, SIDE):
        svc.peer_up(p, outbound=True, addr="127.0.0.1:1")
    reg, secret = _device()
    svc.receive_frame(DOWN, encode(RegGossip(reg, 20, 1)))
    sink.sent.clear()
    return svc, sink, reg, secret


def test_a_forwarder_checks_a_batch_once_and_passes_it_on_whole(tmp_path: Path) -> None:
    svc, sink, reg, secret = _forwarder(tmp_path)
    pids = [os.urandom(16) for _ in range(12)]
    for i, pid in enumerate(pids):  # 8 pushes came from UP, 4 from SIDE: the batch goes back to both
        svc.receive_frame(UP if i < 8 else SIDE, encode(Push(pid, reg.route_id, b"t" * 16, b"c", 127, 0, 0, 0, reg)))
    assert len(sink.sent) == 12
    sink.sent.clear()
    checks = svc.verifier.checks  # type: ignore[attr-defined]
    frame = encode(_batch(secret, reg.route_id, [(p, STORED, 3) for p in pids]))
    svc.receive_frame(DOWN, frame)
    assert sorted(sink.sent) == sorted([(UP, frame), (SIDE, frame)])  # the bytes received, once per relay
    assert svc.verifier.checks == checks + 1  # type: ignore[attr-defined]  # one signature check for 12
    assert svc.engine.counters.get("receipt_refused", 0) == 0
    assert svc.engine.peer_scores()[DOWN] > 0  # the answers earned what 12 receipts earn
    # Settled: reverse state is gone, the same batch again passes nothing on.
    sink.sent.clear()
    svc.receive_frame(DOWN, frame)
    assert sink.sent == []


@pytest.mark.parametrize("forgery", ["other_key", "altered_status", "item_added", "other_route", "single_key"])
def test_a_forged_batch_is_refused_whole_and_costs_its_sender(tmp_path: Path, forgery: str) -> None:
    svc, sink, reg, secret = _forwarder(tmp_path)
    pids = [os.urandom(16) for _ in range(4)]
    for pid in pids:
        svc.receive_frame(UP, encode(Push(pid, reg.route_id, b"t" * 16, b"c", 127, 0, 0, 0, reg)))
    sink.sent.clear()
    items = [(p, STORED, 3) for p in pids]
    genuine = _batch(secret, reg.route_id, items)
    if forgery == "other_key":
        bad = _batch(os.urandom(32), reg.route_id, items)
    elif forgery == "altered_status":  # the home said `spent` for the first push; stored is claimed
        signed = _batch(secret, reg.route_id, [(pids[0], ReceiptStatus.SPENT, 3), *items[1:]])
        bad = dataclasses.replace(signed, items=tuple(items))
    elif forgery == "item_added":  # a genuine batch for 3 pushes, stretched to cover the 4th
        bad = dataclasses.replace(_batch(secret, reg.route_id, items[:3]), items=tuple(items))
    elif forgery == "other_route":  # the home's genuine batch for another route of its own
        other, other_secret = _device()
        bad = _batch(other_secret, other.route_id, items)
    else:  # a single receipt's signature is not a batch signature
        sig = SigningKey(secret).sign(receipt_signed_bytes(pids[0], reg.route_id, STORED)).signature
        bad = ReceiptBatch(reg.route_id, tuple(items), sig)
    before = svc.engine.peer_scores()[DOWN]
    svc.receive_frame(DOWN, encode(bad))
    assert sink.sent == []
    assert svc.engine.counters["receipt_refused"] == 1
    assert svc.engine.peer_scores()[DOWN] <= before - 4.0
    svc.receive_frame(DOWN, encode(genuine))  # the real answer still gets through
    assert sink.sent == [(UP, encode(genuine))]


# -- the custodian ---------------------------------------------------------------------------------


def test_the_custodian_settles_every_push_of_a_genuine_batch_and_none_of_a_forged_one() -> None:
    net = MiniNet(3, [(0, 1), (1, 2)])
    net.run_until(1.0)
    reg, secret = _device()
    reg = make_registration(new_signing_key(), 1, 0, 3600, reg.receipt_key)  # MiniNet's clock starts at 0
    tokens = [os.urandom(16) for _ in range(5)]
    net.homes[2].add_registration(reg, tokens, secret)
    net.apply("2", net.engines[2].register(reg, net.now))
    net.run_until(2.0)
    eng = net.engines[0]
    pids = []
    for t in tokens:
        res = eng.inject_push(reg, t, b"x", net.now)
        assert res.push_id is not None
        net.apply("0", res.effects)  # in custody; its frames are not delivered (the clock does not move)
        pids.append(res.push_id)
    items = [(p, STORED, 2) for p in pids]
    forged = _batch(os.urandom(32), reg.route_id, items)
    net.apply("0", eng.receive_message("1", forged, net.now))
    assert not any(p in net.custody for p in pids)
    assert eng.counters["receipt_refused"] == 1
    net.apply("0", eng.receive_message("1", _batch(secret, reg.route_id, items), net.now))
    assert all(net.custody[p] == CustodyStatus.DELIVERED for p in pids)


def test_a_genuine_batch_through_another_neighbour_repairs_the_route_and_a_forged_one_does_not(
    tmp_path: Path,
) -> None:
    """Rule F7 for batches: the home answered through SIDE (a search found it there): SIDE becomes the
    route's primary next hop; a forged batch through SIDE teaches nothing."""
    svc, sink, reg, secret = _forwarder(tmp_path)
    pids = [os.urandom(16) for _ in range(3)]
    for pid in pids:
        svc.receive_frame(UP, encode(Push(pid, reg.route_id, b"t" * 16, b"c", 127, 0, 0, 0, reg)))
    assert svc.engine.next_hops(reg.route_id)[0][0] == DOWN
    items = [(p, STORED, 3) for p in pids]
    svc.receive_frame(SIDE, encode(_batch(os.urandom(32), reg.route_id, items)))
    assert svc.engine.next_hops(reg.route_id)[0][0] == DOWN
    svc.receive_frame(SIDE, encode(_batch(secret, reg.route_id, items)))
    assert svc.engine.next_hops(reg.route_id)[0][0] == SIDE
