"""Signed receipts (issue 15 item 1, docs/protocol.md rule F5): a relay on the path cannot answer a push
with a forged `stored` receipt, neither in the engine, nor in the simulator, nor over QUIC at a real relay."""

from __future__ import annotations

import base64
import dataclasses
import os
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from inri import mesh
from inri.core.api import CustodyStatus
from inri.core.testing import MiniNet
from inri.node.identity import NodeIdentity
from inri.node.metrics import parse_metrics
from inri.node.quic import QuicEndpoint
from inri.protocol.codec import DecodeError, decode, encode, encode_registration, make_registration
from inri.protocol.keys import new_signing_key, receipt_public_key, receipt_signed_bytes
from inri.protocol.messages import Push, Receipt, ReceiptStatus, RegGossip, Registration
from simulations.scenario import load
from simulations.sim import run_scenario


def _device(epoch: int = 1, issued_at: int = 0) -> tuple[Registration, bytes]:
    """A registration with a receipt key, and the receipt key's private seed (what the home gets)."""
    secret = os.urandom(32)
    reg = make_registration(new_signing_key(), epoch, issued_at, 3600, receipt_public_key(secret))
    return reg, secret


def _sign(secret: bytes, pid: bytes, route_id: bytes, status: ReceiptStatus) -> bytes:
    from nacl.signing import SigningKey

    return SigningKey(secret).sign(receipt_signed_bytes(pid, route_id, status)).signature


def test_the_registration_signature_covers_the_receipt_key() -> None:
    reg, _ = _device()
    swapped = dataclasses.replace(reg, receipt_key=receipt_public_key(os.urandom(32)))
    stripped = dataclasses.replace(reg, receipt_key=None)
    net = MiniNet(1, [])
    assert net.verifier.verify_registration(reg)
    assert not net.verifier.verify_registration(swapped)
    assert not net.verifier.verify_registration(stripped)


def test_receipt_codec_is_strict_about_the_signature() -> None:
    good = Receipt(b"p" * 16, ReceiptStatus.STORED, 3, b"s" * 64)
    assert decode(encode(good)) == good
    frame = encode(good)
    for bad in (b"s" * 63, b"s" * 65, "s" * 64):
        import msgpack

        raw = msgpack.unpackb(frame, raw=False)
        raw[5] = bad
        with pytest.raises(DecodeError):
            decode(msgpack.packb(raw, use_bin_type=True))


def _line_with_custody() -> tuple[MiniNet, Registration, bytes, bytes]:
    """0 - 1 - 2 - 3, a device homed at 3 with a receipt key, a push injected at 0 and in custody there."""
    net = MiniNet(4, [(0, 1), (1, 2), (2, 3)])
    net.run_until(1.0)
    reg, secret = _device(issued_at=0)
    net.homes[3].add_registration(reg, [b"t" * 16], secret)
    net.apply("3", net.engines[3].register(reg, net.now))
    net.run_until(2.0)
    res = net.engines[0].inject_push(reg, b"t" * 16, b"hello", net.now)
    assert res.push_id is not None
    net.apply("0", res.effects)  # on its way (its frames arrive when the clock moves on)
    return net, reg, secret, res.push_id


def test_a_forged_stored_receipt_is_refused_by_the_custodian_and_scores_its_sender_down() -> None:
    net, reg, secret, pid = _line_with_custody()
    eng = net.engines[0]
    before = eng.peer_scores()["1"]
    # Forged: a made-up signature; replayed: a valid home signature, but for another push id.
    forged = Receipt(pid, ReceiptStatus.STORED, 3, b"\x00" * 64)
    replayed = Receipt(pid, ReceiptStatus.STORED, 3, _sign(secret, b"x" * 16, reg.route_id, ReceiptStatus.STORED))
    unsigned = Receipt(pid, ReceiptStatus.STORED, 3)
    for r in (forged, replayed, unsigned):
        net.apply("0", eng.receive_message("1", r, net.now))
    assert pid not in net.custody  # still in custody: the forgeries settled nothing
    assert eng.counters["receipt_refused"] == 3
    assert eng.counters["score_bad_receipt"] == 3
    assert eng.peer_scores()["1"] < before - 10
    # The push itself goes on and is delivered, settled by the home's genuine (signed) receipt.
    net.run_until(net.now + 3.0)
    assert net.custody[pid] == CustodyStatus.DELIVERED
    assert ("3", pid) in net.delivered


def test_unsigned_mode_believes_the_forgery() -> None:
    """The comparison: with receipt_signatures off (the protocol before), the same forgery settles."""
    net = MiniNet(2, [(0, 1)], config=dataclasses.replace(MiniNet(1, []).config, receipt_signatures=False))
    net.run_until(1.0)
    reg, _ = _device()
    pid = net.engines[0].inject_push(reg, b"t" * 16, b"x", net.now).push_id
    assert pid is not None
    net.apply("0", net.engines[0].receive_message("1", Receipt(pid, ReceiptStatus.STORED, 1, b"\x00" * 64), net.now))
    assert net.custody[pid] == CustodyStatus.DELIVERED


def test_receipt_forgers_in_the_simulator_signed_and_unsigned() -> None:
    """A small receipt-forgers mesh: signed receipts deliver and refuse every forgery; unsigned lose pushes."""
    base = load("receipt-forgers-1k")
    sc = dataclasses.replace(base, topology=dataclasses.replace(base.topology, relays=200),
                             workload=dataclasses.replace(base.workload, registrations=40, pushes=300),
                             duration_s=100.0)
    signed: dict[str, Any] = run_scenario(sc).summary
    unsigned: dict[str, Any] = run_scenario(
        dataclasses.replace(sc, engine=dataclasses.replace(sc.engine, receipt_signatures=False))).summary
    assert signed["receipts_forged"] > 0
    assert signed["settled_not_delivered"] == 0 and signed["cuts_of_honest"] == 0
    assert signed["delivery_ratio"] >= 0.99
    assert unsigned["settled_not_delivered"] > 0
    assert unsigned["delivery_ratio"] < signed["delivery_ratio"]


# -- through a real relay, over QUIC ----------------------------------------------------------------


@pytest.fixture(scope="module")
def one_relay(tmp_path_factory: pytest.TempPathFactory) -> Any:
    d = tmp_path_factory.mktemp("receipts")
    info = mesh.up(d, relays=1, bootstraps=1, timeout_s=60, min_neighbours=0)
    try:
        yield info
    finally:
        mesh.down(d)


def _b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


@pytest.mark.integration
def test_a_forged_receipt_over_quic_is_refused_by_a_real_relay(one_relay: dict[str, Any]) -> None:
    """A hostile neighbour claims a device's route (gossip, hops 0), takes the push the relay forwards and
    answers with a forged `stored` receipt, then a genuine receipt replayed for another push: the relay
    keeps the push pending, counts both refusals and scores the sender down. A receipt signed with the
    device's receipt key (what its real home would send) settles it."""
    target = one_relay["relays"][0]
    api = target["api"]
    import time

    reg, secret = _device(issued_at=int(time.time()))

    async def main() -> None:
        hostile = NodeIdentity.generate()
        ep = QuicEndpoint(hostile, idle_timeout_s=10)
        await ep.bind("127.0.0.1", 0)
        async with trio.open_nursery() as n, httpx.AsyncClient(timeout=5) as c:
            await n.start(ep.serve, None)
            link = await ep.connect(target["quic"], expect_node_id=target["node_id"])
            await link.send(encode(RegGossip(reg, 8, 0)))
            with trio.fail_after(20):
                while (await c.get(api + "/v1/status")).json()["routes"] < 1:
                    await trio.sleep(0.05)
            r = await c.post(api + "/v1/push", json={"registration": _b64(encode_registration(reg)),
                                                     "token": _b64(secrets.token_bytes(16)),
                                                     "ciphertext": _b64(b"sealed")})
            assert r.status_code == 202, r.text
            pid = bytes.fromhex(r.json()["push_id"])
            with trio.fail_after(20):
                while True:
                    msg = decode(await link.receive())
                    if isinstance(msg, Push) and msg.push_id == pid:
                        break
            await link.send(encode(Receipt(pid, ReceiptStatus.STORED, 1, os.urandom(64))))
            await link.send(encode(Receipt(pid, ReceiptStatus.STORED, 1,
                                           _sign(secret, os.urandom(16), reg.route_id, ReceiptStatus.STORED))))
            with trio.fail_after(20):
                while True:
                    m = parse_metrics((await c.get(api + "/metrics")).text)
                    if m.get('inri_engine_events_total{event="receipt_refused"}', 0) >= 2:
                        break
                    await trio.sleep(0.05)
            assert m['inri_peer_penalties_total{reason="bad_receipt"}'] >= 2
            st = (await c.get(api + f"/v1/push/{pid.hex()}")).json()
            assert st["status"] == "pending", st
            score = (await c.get(api + "/v1/status")).json()["peer_scores"][hostile.node_id]
            assert score <= -7.0
            # The home's genuine signature settles the push.
            await link.send(encode(Receipt(pid, ReceiptStatus.STORED, 1,
                                           _sign(secret, pid, reg.route_id, ReceiptStatus.STORED))))
            with trio.fail_after(20):
                while (await c.get(api + f"/v1/push/{pid.hex()}")).json()["status"] != "delivered":
                    await trio.sleep(0.05)
            n.cancel_scope.cancel()

    trio.run(main)


def test_the_daemon_store_keeps_the_receipt_key_across_a_restart(tmp_path: Path) -> None:
    from nacl.signing import VerifyKey

    from inri.node.store import Store

    reg, secret = _device()
    store = Store(tmp_path / "s.sqlite3")
    assert store.add_device(reg, b"d" * 32, [b"t" * 16], 0.0, secret)
    store.close()
    store = Store(tmp_path / "s.sqlite3")
    msg = receipt_signed_bytes(b"p" * 16, reg.route_id, ReceiptStatus.STORED)
    sig = store.sign_receipt(reg.route_id, msg, reg.receipt_key)
    assert sig is not None and reg.receipt_key is not None
    VerifyKey(reg.receipt_key).verify(msg, sig)
    store.close()


async def test_registration_api_takes_the_receipt_secret_and_refuses_a_wrong_one(tmp_path: Path) -> None:
    from tests.inproc import relay_api

    reg, secret = _device(issued_at=int(__import__("time").time()))
    async with relay_api(tmp_path) as url, httpx.AsyncClient(timeout=5) as c:
        body = {"registration": _b64(encode_registration(reg)), "tokens": 2}
        for bad in ({}, {"receipt_secret": _b64(os.urandom(32))}, {"receipt_secret": _b64(b"x" * 31)}):
            r = await c.post(url + "/v1/devices", json=body | bad)
            assert r.status_code in (400, 422), r.text
            assert r.json()["code"] in ("bad_receipt_key", "invalid_field")
        r = await c.post(url + "/v1/devices", json=body | {"receipt_secret": _b64(secret)})
        assert r.status_code == 201, r.text


def test_the_scenario_file_is_packaged() -> None:
    assert (Path(__file__).parent.parent / "simulations" / "scenarios" / "receipt-forgers-1k.toml").is_file()
    assert load("receipt-forgers-1k").adversaries[0].kind == "receipt_forger"


def test_an_unregistered_devices_web_push_gone_receipts_are_still_signed(tmp_path: Path) -> None:
    """After unregister, its Web Push endpoints answer GONE: that receipt must verify too (else every
    relay on the way back refuses it and the sender never hears 410)."""
    from nacl.signing import VerifyKey

    from inri.core.home import MemoryHomeStore
    from inri.node.store import Store

    reg, secret = _device()
    assert reg.receipt_key is not None
    msg = receipt_signed_bytes(b"p" * 16, reg.route_id, ReceiptStatus.GONE)
    mem = MemoryHomeStore()
    mem.add_registration(reg, [], secret)
    mem.mint_endpoint(reg.route_id, None)
    mem.remove(reg.route_id)
    sig = mem.sign_receipt(reg.route_id, msg, reg.receipt_key)
    assert sig is not None
    VerifyKey(reg.receipt_key).verify(msg, sig)
    store = Store(tmp_path / "s.sqlite3")
    assert store.add_device(reg, b"d" * 32, [], 0.0, secret)
    store.mint_endpoint(reg.route_id, None, 0.0)
    store.remove_device(reg.route_id)
    store.close()
    store = Store(tmp_path / "s.sqlite3")  # and after a restart
    sig = store.sign_receipt(reg.route_id, msg, reg.receipt_key)
    assert sig is not None
    VerifyKey(reg.receipt_key).verify(msg, sig)
    store.close()
