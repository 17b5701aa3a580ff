"""Web Push endpoints at the home relay: mint, list, revoke (HTTP + SDK), and Web Push messages in pull/stream."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import httpx
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from inri.client import ApiError, DeviceClient, WebPushEndpoint
from inri.common.b64url import b64d
from inri.protocol.codec import decode_registration
from inri.protocol.messages import ContentEncoding, Urgency, WebPushMeta
from inri.protocol.webpush import EndpointToken, push_tag, vapid_key_hash
from tests.test_node_api import problem, relay


def _vapid_key() -> str:
    pub = ec.generate_private_key(ec.SECP256R1()).public_key()
    raw = pub.public_bytes(serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _inject(service, ep: WebPushEndpoint, body: bytes, vapid: bytes | None = None) -> bytes:  # type: ignore[no-untyped-def]
    """What the entry relay's /wp route does after its checks: tag the push and take custody."""
    r, e = ep.url.rsplit("/", 2)[-2:]
    reg, tok = decode_registration(b64d(r, "r")), EndpointToken.decode(b64d(e, "e"))
    pid = os.urandom(16)
    tag = push_tag(tok.cap, pid, body, 60, Urgency.HIGH, ContentEncoding.AES128GCM, "t1", vapid_key_hash(vapid))
    meta = WebPushMeta(tok.endpoint_id, tag, 60, Urgency.HIGH, ContentEncoding.AES128GCM, "t1")
    service.inject_push(reg, bytes(16), body, push_id=pid, webpush=meta)
    return pid


async def test_mint_list_revoke_and_receive(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with relay(tmp_path) as (url, service):
            dev = DeviceClient(url, state_path=tmp_path / "dev.json")
            await dev.register(tokens=1)
            plain = await dev.mint_endpoint()
            key = _vapid_key()
            bound = await dev.mint_endpoint(key)
            assert not plain.restricted and bound.restricted and bound.vapid_key == key
            assert plain.url.startswith("http://127.0.0.1:8480/wp/v1/")  # the default origin: the API address
            assert len(plain.url) < 1000  # UnifiedPush: an endpoint of at most 1,000 bytes
            assert [e.endpoint_id for e in await dev.list_endpoints()] == [plain.endpoint_id, bound.endpoint_id]
            # A Web Push message reaches pull and the stream with its raw body and headers.
            async with dev.stream(ack=False) as messages:
                pid = _inject(service, plain, b"\x01raw-body")
                got = await messages.receive()
            assert (got.id, got.kind, got.body, got.encoding, got.urgency, got.topic, got.endpoint_id) == (
                pid.hex(), "webpush", b"\x01raw-body", "aes128gcm", "high", "t1", plain.endpoint_id)
            pulled = await dev.pull()
            assert [m.body for m in pulled] == [b"\x01raw-body"]
            assert await dev.ack([pid.hex()]) == 1
            await dev.revoke_endpoint(plain.endpoint_id)
            assert [e.endpoint_id for e in await dev.list_endpoints()] == [bound.endpoint_id]
            await dev.revoke_endpoint(plain.endpoint_id)  # idempotent
            try:
                await dev.revoke_endpoint("zz")
            except ApiError as exc:
                assert exc.status == 422
            else:
                raise AssertionError("a malformed endpoint id must be 422")
            async with httpx.AsyncClient() as c:
                base = f"{url}/v1/devices/{dev.device_id}/endpoints"
                problem(await c.post(base, json={}), 401, "bad_credentials")
                auth = {"authorization": f"Bearer {dev.secret}"}
                problem(await c.post(base, json={"vapid_key": "AAAA"}, headers=auth), 422, "invalid_field")
                bad_point = base64.urlsafe_b64encode(b"\x04" + b"\x01" * 64).rstrip(b"=").decode()
                problem(await c.post(base, json={"vapid_key": bad_point}, headers=auth), 422, "invalid_field")


async def test_one_multiplexed_stream_serves_two_route_ids(tmp_path: Path) -> None:
    """`/v1/stream`: two devices (route ids) on one WebSocket, labelled messages and acks; a wrong secret
    is refused without ending the stream; the SDK's stream_many does the same."""
    import json

    from trio_websocket import open_websocket_url

    from inri.client import stream_many

    with trio.fail_after(30):
        async with relay(tmp_path) as (url, service):
            a, b = DeviceClient(url), DeviceClient(url)
            await a.register(tokens=1)
            await b.register(tokens=1)
            ea, eb = await a.mint_endpoint(), await b.mint_endpoint()
            assert a.device_id != b.device_id
            async with open_websocket_url(url.replace("http://", "ws://") + "/v1/stream") as ws:
                async def frame() -> dict[str, object]:
                    data: dict[str, object] = json.loads(await ws.get_message())
                    return data

                await ws.send_message(json.dumps({"type": "subscribe", "devices": [
                    {"device_id": a.device_id, "auth": a.secret}, {"device_id": b.device_id, "auth": b.secret},
                    {"device_id": b.device_id[:-1] + "0", "auth": a.secret}]}))
                got = [await frame() for _ in range(3)]
                assert sorted((f["type"], f["device_id"]) for f in got) == sorted([
                    ("subscribed", a.device_id), ("subscribed", b.device_id),
                    ("refused", b.device_id[:-1] + "0")])
                async with httpx.AsyncClient() as c:
                    assert (await c.get(url + "/v1/status")).json()["websockets"] == 1  # one connection
                pa, pb = _inject(service, ea, b"to a"), _inject(service, eb, b"to b")
                msgs = [await frame() for _ in range(2)]
                assert sorted((m["type"], m["device_id"], m["id"]) for m in msgs) == sorted([
                    ("message", a.device_id, pa.hex()), ("message", b.device_id, pb.hex())])
                await ws.send_message(json.dumps({"type": "ack", "device_id": a.device_id, "ids": [pa.hex()]}))
                assert await frame() == {"type": "acked", "device_id": a.device_id, "deleted": 1}
                await ws.send_message(json.dumps({"type": "ack", "device_id": "00" * 16, "ids": [pb.hex()]}))
                assert (await frame())["type"] == "error"  # not subscribed here: b's message stays
            assert [m.id for m in await a.pull()] == [] and [m.id for m in await b.pull()] == [pb.hex()]
            async with stream_many([a, b]) as messages:
                first = await messages.receive()  # b's unacknowledged message comes again
                assert (first[0], first[1].id, first[1].body) == (b, pb.hex(), b"to b")
                pa2 = _inject(service, ea, b"again to a")
                second = await messages.receive()
                assert (second[0], second[1].body) == (a, b"again to a")
            # Acked by the SDK once handed over (the last one's ack may not leave before the stream closes).
            with trio.fail_after(5):
                while await b.pull():
                    await trio.sleep(0.05)
            assert [m.id for m in await a.pull()] in ([], [pa2.hex()])
