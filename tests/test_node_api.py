"""The relay HTTP/WebSocket API, served by hypercorn's trio worker on loopback, driven by httpx and the SDK."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio_websocket import open_websocket_url

from inri.client import ApiError, DeviceClient, HomeAppClient
from inri.client.credential import b64e
from inri.node.api import create_app
from inri.node.config import RelayConfig
from inri.node.metrics import parse_metrics
from inri.node.service import RelayService
from inri.node.store import Store
from inri.node.tracefile import TraceFile
from tests.procs import free_port


class NullNetwork:
    """A relay with no neighbours: frames it would send are only counted."""

    def __init__(self) -> None:
        self.sent = 0

    def send(self, peer: str, frame: bytes, delay: float) -> None:
        self.sent += 1

    def connect(self, peer: str, addr: str) -> None:
        pass

    def disconnect(self, peer: str, reason: str) -> None:
        pass


@asynccontextmanager
async def relay(tmp: Path, cfg: RelayConfig | None = None) -> AsyncIterator[tuple[str, RelayService]]:
    cfg = cfg or RelayConfig()
    store = Store(tmp / "relay.sqlite3")
    service = RelayService("a" * 32, cfg.engine.test_profile(), store, NullNetwork(),
                           TraceFile(tmp / "traces", "a" * 32))
    port = free_port()
    hc = HyperConfig()
    hc.bind = [f"127.0.0.1:{port}"]
    hc.accesslog = None
    stop = trio.Event()
    async with trio.open_nursery() as n:
        await n.start(service.run)
        await n.start(lambda task_status: serve(create_app(service, config=cfg), hc, shutdown_trigger=stop.wait,
                                                task_status=task_status))
        try:
            yield f"http://127.0.0.1:{port}", service
        finally:
            stop.set()
            n.cancel_scope.cancel()
            store.close()


def problem(r: httpx.Response, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["code"] == code and body["status"] == status and body["type"].endswith(code)


async def test_register_push_stream_pull_ack_status(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with relay(tmp_path) as (url, service):
            dev = DeviceClient(url, state_path=tmp_path / "dev.json")
            device_id = await dev.register(tokens=5)
            cred = dev.export_credential(5)
            app = HomeAppClient([url])
            async with dev.stream(ack=False) as messages:
                first = await app.push(cred, b"one")
                got = await messages.receive()
            assert (got.id, got.plaintext) == (first.push_id, b"one")
            assert (await app.status(first.push_id, url))["status"] == "delivered"
            second = await app.push(cred, b"two")
            pulled = await dev.pull()
            assert [m.plaintext for m in pulled] == [b"one", b"two"]
            assert await dev.ack([first.push_id, second.push_id]) == 2
            assert await dev.pull() == []
            # Acknowledged messages are never sent again: a new stream starts empty, then gets new ones.
            async with dev.stream() as messages:
                third = await app.push(cred, b"three")
                got = await messages.receive()
                assert got.id == third.push_id
            # The same token again (a replay by someone who saw it): accepted, then settled as spent.
            token = b64e(bytes(16))
            async with httpx.AsyncClient() as c:
                st_ = await c.get(f"{url}/v1/devices/{device_id}/messages", headers={"authorization": "Bearer x"})
                problem(st_, 401, "bad_credentials")
                body = {"registration": b64e(_reg_bytes(cred)), "token": token, "ciphertext": b64e(b"x" * 48)}
                r = await c.post(url + "/v1/push", json=body)
                assert r.status_code == 202
                assert (await c.get(f"{url}/v1/push/{r.json()['push_id']}")).json()["status"] == "unknown_token"
                status = (await c.get(url + "/v1/status")).json()
                assert status["devices"] == 1 and status["node_id"] == "a" * 32
                metrics = parse_metrics((await c.get(url + "/metrics")).text)
                assert metrics["inri_pushes_accepted_total"] == 4
                assert metrics["inri_pushes_delivered_total"] == 3
                assert metrics['inri_custody_settled_total{status="unknown_token"}'] == 1
                doc = (await c.get(url + "/openapi.json")).json()
                assert doc["openapi"].startswith("3.1") and "/v1/push" in doc["paths"]
                assert (await c.get(url + "/healthz")).json()["status"] == "ok"
            await dev.unregister()
            assert service.store.mailbox_size() == 0 and not service.store.is_home(bytes.fromhex(device_id))


def _reg_bytes(cred) -> bytes:  # type: ignore[no-untyped-def]
    from inri.protocol.codec import encode_registration

    return encode_registration(cred.registration)


async def test_bad_input_gets_documented_errors_and_the_relay_stays_up(tmp_path: Path) -> None:
    cfg = RelayConfig()
    with trio.fail_after(30):
        async with relay(tmp_path, cfg) as (url, _):
            async with httpx.AsyncClient() as c:
                problem(await c.post(url + "/v1/push", content=b"{not json"), 400, "malformed_json")
                problem(await c.post(url + "/v1/push", json=[1, 2]), 422, "invalid_field")
                problem(await c.post(url + "/v1/push", json={"registration": 5}), 422, "invalid_field")
                problem(await c.post(url + "/v1/push", json={"registration": "!!"}), 422, "invalid_field")
                problem(await c.post(url + "/v1/push", json={"registration": b64e(b"\x93\x01\x02\x03")}), 400,
                        "bad_registration")
                problem(await c.post(url + "/v1/push", content=b"x" * (1024 * 1024)), 413, "too_large")
                problem(await c.post(url + "/v1/devices", json={"registration": b64e(b"\xc1")}), 400,
                        "bad_registration")
                problem(await c.get(url + "/v1/push/zz"), 404, "not_found")
                problem(await c.get(url + "/v1/push/" + "00" * 16), 404, "not_found")
                problem(await c.get(url + "/v1/devices/" + "00" * 16 + "/messages"), 404, "unknown_device")
                problem(await c.put(url + "/v1/push"), 405, "method_not_allowed")
                problem(await c.get(url + "/nope"), 404, "not_found")
                dev = DeviceClient(url)
                await dev.register(tokens=2)
                with pytest.raises(ApiError) as e:
                    await DeviceClient(url)._call("POST", "/v1/devices", json={
                        "registration": b64e(_reg_bytes(dev.export_credential(1))), "tokens": 999})
                assert e.value.code == "invalid_field"
                bad = await c.get(f"{url}/v1/devices/{dev.device_id}/messages?limit=0",
                                  headers={"authorization": f"Bearer {dev.secret}"})
                problem(bad, 422, "invalid_field")
                async with open_websocket_url(url.replace("http", "ws") + f"/v1/devices/{dev.device_id}/stream") as ws:
                    await ws.send_message(json.dumps({"auth": b64e(bytes(32))}))
                    with pytest.raises(Exception) as closed:
                        await ws.get_message()
                    assert getattr(closed.value, "reason", None) is not None and closed.value.reason.code == 4401
                assert (await c.get(url + "/healthz")).status_code == 200


async def test_rate_limit_answers_429_with_retry_after(tmp_path: Path) -> None:
    cfg = RelayConfig()
    cfg = replace(cfg, api=replace(cfg.api, rate_per_s=0.01, rate_burst=5, tarpit_s=0.3))
    with trio.fail_after(30):
        async with relay(tmp_path, cfg) as (url, _):
            async with httpx.AsyncClient() as c:
                codes = [(await c.get(url + "/v1/status")).status_code for _ in range(8)]
                assert codes[:5] == [200] * 5 and codes[5:] == [429] * 3
                t0 = trio.current_time()
                r = await c.get(url + "/v1/status")
                problem(r, 429, "rate_limited")
                assert trio.current_time() - t0 >= 0.3  # tarpitted: a hammering client slows down
                assert int(r.headers["retry-after"]) >= 1
                assert (await c.get(url + "/healthz")).status_code == 200  # health is never limited
                assert parse_metrics((await c.get(url + "/metrics")).text)['inri_rate_limited_total{key="client"}'] >= 4


async def test_per_device_and_per_token_push_limits(tmp_path: Path) -> None:
    """One credential cannot flood a device at a relay, nor re-send one token without end; others unaffected."""
    cfg = RelayConfig()
    cfg = replace(cfg, api=replace(cfg.api, device_rate_per_s=0.01, device_rate_burst=4, token_rate_burst=2))
    with trio.fail_after(30):
        async with relay(tmp_path, cfg) as (url, service):
            flooded, other = DeviceClient(url), DeviceClient(url)
            await flooded.register(tokens=10)
            await other.register(tokens=2)
            cred, cred2 = flooded.export_credential(10), other.export_credential(2)
            async with HomeAppClient([url]) as app, httpx.AsyncClient() as c:
                for _ in range(4):
                    await app.push(cred, b"ok")
                with pytest.raises(ApiError) as e:
                    await app.push(cred, b"one too many")
                assert e.value.code == "rate_limited" and e.value.status == 429 and e.value.retry_after
                assert len(cred.tokens) == 6  # the refused push did not spend a token
                assert (await app.push(cred2, b"another device")).status == "pending"
                body = {"registration": b64e(_reg_bytes(cred2)), "token": b64e(cred2.tokens[0]),
                        "ciphertext": b64e(b"x" * 48)}
                codes = [(await c.post(url + "/v1/push", json=body)).status_code for _ in range(3)]
                assert codes == [202, 202, 429]  # the same token re-sent: a retry or two, then refused
                r = await c.post(url + "/v1/push", json=body)
                problem(r, 429, "rate_limited")
                assert "token" in r.json()["detail"] and int(r.headers["retry-after"]) >= 1
                metrics = parse_metrics((await c.get(url + "/metrics")).text)
            assert metrics['inri_rate_limited_total{key="device"}'] == 1
            assert metrics['inri_rate_limited_total{key="token"}'] == 2
            assert service.store.mailbox_size(bytes.fromhex(flooded.device_id or "")) == 4


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(["registration", "token", "ciphertext", "tokens", "ids", "count"]),
                       st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=40),
                                 st.binary(max_size=40).map(b64e), st.lists(st.text(max_size=5), max_size=3)),
                       max_size=4),
       st.sampled_from(["/v1/push", "/v1/devices"]))
def test_fuzzed_bodies_never_crash_the_api(tmp_path_factory: pytest.TempPathFactory, body: dict, path: str) -> None:
    tmp = tmp_path_factory.mktemp("fuzz")

    async def main() -> None:
        async with relay(tmp) as (url, service):
            async with httpx.AsyncClient() as c:
                r = await c.post(url + path, json=body)
                assert r.status_code in (400, 409, 413, 422), r.text
                assert r.json()["code"] in ("malformed_json", "invalid_field", "bad_registration", "too_large")
                assert (await c.get(url + "/healthz")).status_code == 200
            assert service.store.device_count() == 0 and service.store.custody_count() == 0

    trio.run(main)
