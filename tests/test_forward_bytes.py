"""Decode once, forward without re-encoding (issue 16, item 4): a forwarding relay's service passes a
receipt on as the bytes it received and a push as those bytes with its hop fields written anew, and
still checks every receipt's signature before passing it on (rule F5).

Driven through RelayService's link interface (receive_frame in, the network sink's send out) on relay
1 of a line 0 - 1 - 2, the device's home behind 2.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgpack
from nacl.signing import SigningKey

from inri.core.config import EngineConfig
from inri.core.trace import ListTracer
from inri.node.service import RelayService
from inri.node.store import Store
from inri.protocol.codec import decode, encode, make_registration
from inri.protocol.keys import new_signing_key, receipt_public_key, receipt_signed_bytes
from inri.protocol.messages import Push, Receipt, ReceiptStatus, RegGossip, Registration

UP, DOWN = "0" * 32, "2" * 32


class Sink:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []

    def send(self, peer: str, frame: bytes, delay: float) -> None:
        self.sent.append((peer, frame))

    def connect(self, peer: str, addr: str) -> None: ...

    def disconnect(self, peer: str, reason: str) -> None: ...


def forwarder(tmp_path: Path) -> tuple[RelayService, Sink, Registration, bytes]:
    sink = Sink()
    svc = RelayService("1" * 32, EngineConfig(), Store(tmp_path / "relay.sqlite3"), sink, ListTracer())
    svc.peer_up(UP, outbound=True, addr="127.0.0.1:1")
    svc.peer_up(DOWN, outbound=True, addr="127.0.0.1:2")
    secret = os.urandom(32)
    reg = make_registration(new_signing_key(), 1, int(time.time()), 3600, receipt_public_key(secret))
    svc.receive_frame(DOWN, encode(RegGossip(reg, 20, 1)))
    assert svc.engine.route_count() == 1
    sink.sent.clear()
    return svc, sink, reg, secret


def test_a_forwarder_passes_receipts_on_as_received_and_pushes_as_their_onward_copy(
    tmp_path: Path,
) -> None:
    svc, sink, reg, secret = forwarder(tmp_path)
    key = SigningKey(secret)
    for i in range(20):
        pid = os.urandom(16)
        # A valid push frame msgpack would write otherwise (bin 16 for its short byte strings, as
        # another implementation may): what leaves is the onward copy (hop fields new, the rest the same).
        raw = msgpack.unpackb(encode(Push(pid, reg.route_id, b"t" * 16, b"c" * (50 + i), 127, i, 0, 0, reg)),
                              raw=False)
        head = bytes([0x90 | len(raw)]) + bytes(raw[:2]) + b"".join(
            b"\xc5" + len(v).to_bytes(2, "big") + v for v in raw[2:6])
        tail = msgpack.packb(raw[10], use_bin_type=True)
        svc.receive_frame(UP, head + bytes(raw[6:10]) + tail)
        (peer, out), = sink.sent
        sink.sent.clear()
        onward = decode(out)
        assert peer == DOWN and isinstance(onward, Push)
        assert (onward.ttl, onward.hops, onward.attempt, onward.ring) == (126 - i, i + 1, 0, 0)
        assert out == encode(Push(pid, reg.route_id, b"t" * 16, b"c" * (50 + i), 126 - i, i + 1, 0, 0, reg))
        sig = key.sign(receipt_signed_bytes(pid, reg.route_id, ReceiptStatus.STORED)).signature
        receipt = encode(Receipt(pid, ReceiptStatus.STORED, 3 + i, sig))
        svc.receive_frame(DOWN, receipt)
        assert sink.sent == [(UP, receipt)]
        sink.sent.clear()
    assert svc.counters["frames_out_push"] == 20 and svc.counters["frames_out_receipt"] == 20


def test_a_forged_receipt_is_not_passed_on_and_costs_its_sender(tmp_path: Path) -> None:
    svc, sink, reg, secret = forwarder(tmp_path)
    pid = os.urandom(16)
    svc.receive_frame(UP, encode(Push(pid, reg.route_id, b"t" * 16, b"c" * 50, 127, 0, 0, 0, reg)))
    sink.sent.clear()
    before = svc.engine.peer_scores()[DOWN]
    other = SigningKey(os.urandom(32)).sign(receipt_signed_bytes(pid, reg.route_id, ReceiptStatus.STORED))
    svc.receive_frame(DOWN, encode(Receipt(pid, ReceiptStatus.STORED, 3, other.signature)))
    assert sink.sent == []
    assert svc.engine.counters["receipt_refused"] == 1
    assert svc.engine.peer_scores()[DOWN] < before
    genuine = SigningKey(secret).sign(receipt_signed_bytes(pid, reg.route_id, ReceiptStatus.STORED)).signature
    receipt = encode(Receipt(pid, ReceiptStatus.STORED, 3, genuine))
    svc.receive_frame(DOWN, receipt)
    assert sink.sent == [(UP, receipt)]
