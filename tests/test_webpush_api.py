"""Web Push endpoints at the home relay: mint, list, revoke (HTTP + SDK), and Web Push messages in pull/stream."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path

import httpx
import pytest
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from pywebpush import WebPusher

from inri.client import ApiError, DeviceClient, WebPushEndpoint
from inri.common.b64url import b64d, b64e
from inri.node.config import ConfigError, RelayConfig, WebPushSection, load_config
from inri.protocol.codec import decode_registration, encode_registration, make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import ContentEncoding, Urgency, WebPushMeta
from inri.protocol.webpush import EndpointToken, push_tag, vapid_key_hash
from tests.test_node_api import problem, relay
from tests.test_webpush import Sender, Subscriber


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


async def test_public_origins_are_the_urls_the_aud_the_location_and_the_gateway(tmp_path: Path) -> None:
    """Issue 41, item 8: behind a proxy, `[webpush] public_origins` is what senders see: minted URLs carry the
    first, VAPID `aud` may be any of them (never the internal address), `Location` uses the first, and the
    Matrix gateway serves the pushkeys of these origins only."""
    public = "https://push.example.test"
    cfg = RelayConfig(webpush=WebPushSection(public_origins=(public + "/", "https://push.example.test:8443")))
    with trio.fail_after(30):
        async with relay(tmp_path, cfg) as (url, _service):
            dev = DeviceClient(url)
            await dev.register(tokens=1)
            ep = await dev.mint_endpoint()
            assert ep.url.startswith(public + "/wp/v1/")
            assert [e.url for e in await dev.list_endpoints()] == [ep.url]
            direct = url + ep.url[len(public):]  # the proxy forwards the path unchanged
            sender, sub = Sender(), Subscriber()
            body = WebPusher(sub.info(ep.url)).encode(b"hello", "aes128gcm")["body"]
            async with httpx.AsyncClient(timeout=10) as c:
                async def post(aud: str) -> httpx.Response:
                    return await c.post(direct, content=body, headers={
                        "TTL": "60", "Content-Encoding": "aes128gcm", "Authorization": sender.auth(aud)})

                for aud in (public, "https://push.example.test:8443", "https://PUSH.example.test:443"):
                    r = await post(aud)
                    assert r.status_code == 201 and r.headers["location"].startswith(public + "/v1/push/"), r.text
                problem(await post(url), 401, "bad_vapid")  # the internal address is not an origin senders use
                note = {"notification": {"event_id": "$e", "devices": [
                    {"pushkey": ep.url}, {"pushkey": url + ep.url[len(public):]}]}}
                r = await c.post(url + "/_matrix/push/v1/notify", json=note)
                assert r.json() == {"rejected": [url + ep.url[len(public):]]}


async def test_no_endpoint_without_a_receipt_key(tmp_path: Path) -> None:
    """Endpoint tokens are signed with the registration's receipt key: a device registered without one gets
    `409 receipt_key_required` (nothing minted), not an endpoint no relay could check."""
    reg = make_registration(new_signing_key(), 1, int(time.time()) - 60, 3600)
    with trio.fail_after(30):
        async with relay(tmp_path) as (url, _service), httpx.AsyncClient() as c:
            r = await c.post(url + "/v1/devices", json={"registration": b64e(encode_registration(reg)), "tokens": 1})
            assert r.status_code == 201, r.text
            auth = {"authorization": f"Bearer {r.json()['device_secret']}"}
            base = f"{url}/v1/devices/{reg.route_id.hex()}/endpoints"
            problem(await c.post(base, json={}, headers=auth), 409, "receipt_key_required")
            assert (await c.get(base, headers=auth)).json() == {"endpoints": []}


@pytest.mark.parametrize("value", ["push.example.org", "https://push.example.org/wp", "ftp://push.example.org",
                                   "https://push.example.org?x=1", "https://user@push.example.org"])
def test_a_public_origin_that_is_not_an_origin_is_refused_at_startup(tmp_path: Path, value: str) -> None:
    """Without a scheme (or with a path) every VAPID `aud` would be refused and every URL broken, silently."""
    f = tmp_path / "relay.toml"
    f.write_text(f'[webpush]\npublic_origins = ["https://ok.example", "{value}"]\n')
    with pytest.raises(ConfigError, match=r"relay\.toml: webpush\.public_origins: Expected str matching"):
        load_config(f, env={})
    with pytest.raises(ConfigError, match="INRI_WEBPUSH_PUBLIC_ORIGINS"):
        load_config(None, env={"INRI_WEBPUSH_PUBLIC_ORIGINS": value})
    f.write_text('[webpush]\npublic_origins = ["https://push.example.org/", "http://[::1]:8480"]\n')
    assert load_config(f, env={}).webpush.public_origins == ("https://push.example.org/", "http://[::1]:8480")


async def test_a_ttl_0_push_to_an_offline_device_at_its_home_relay_is_expired(tmp_path: Path) -> None:
    """Issue 41, item 7, where the entry relay is the home: 201 (RFC 8030), and `expired` at its Location, never
    `delivered`; the same push while the device's stream is open is `delivered`."""
    with trio.fail_after(30):
        async with relay(tmp_path) as (url, _service), httpx.AsyncClient(timeout=10) as c:
            dev = DeviceClient(url)
            await dev.register(tokens=1)
            ep = await dev.mint_endpoint()
            sub = Subscriber()
            push_url = url + ep.url[len("http://127.0.0.1:8480"):]
            body = WebPusher(sub.info(ep.url)).encode(b"now or never", "aes128gcm")["body"]

            async def status_after_push() -> dict[str, object]:
                r = await c.post(push_url, content=body, headers={"TTL": "0", "Content-Encoding": "aes128gcm"})
                assert r.status_code == 201, r.text
                pid = r.headers["location"].rsplit("/", 1)[1]
                while (s := (await c.get(f"{url}/v1/push/{pid}")).json())["status"] == "pending":
                    await trio.sleep(0.05)
                return dict(s)

            dropped = await status_after_push()
            assert dropped["status"] == "expired" and dropped["hops"] is not None, dropped
            assert await dev.pull() == []
            async with dev.stream(ack=False) as messages:
                while (await c.get(url + "/v1/status")).json()["websockets"] < 1:
                    await trio.sleep(0.02)
                assert (await status_after_push())["status"] == "delivered"
                assert (await messages.receive()).kind == "webpush"
