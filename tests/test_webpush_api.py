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
