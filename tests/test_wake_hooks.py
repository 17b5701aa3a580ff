"""Wake hooks at a home relay, through the real pieces: the relay's device API (in this process), an
`inri gateway` (in this process, real HTTP) and a fake APNs (HTTP/2 over TLS, tests/gateway_fakes.py).

A push stored for a device with a hook and no stream makes the relay POST to the gateway, which wakes the
phone at APNs; the error paths end where docs/gateway.md says: a gone token drops the hook at the home
relay, 429 and 5xx are retried after the backoff, an expired provider token costs nothing visible."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import trio

from inri.client import ApiError, DeviceClient, HomeAppClient, seal_wake_token
from inri.common.b64url import b64e
from inri.node.config import RelayConfig, WakeSection
from inri.node.metrics import parse_metrics
from inri.node.service import RelayService
from tests.gateway_fakes import FakeApns, GatewaySetup, Tls, apns_device_token, apns_gateway, make_tls
from tests.inproc import relay_service

LAB = WakeSection(lab_http_loopback=True, retry_min_s=0.05, retry_max_s=0.2)


@dataclass
class Lab:
    relay: str
    service: RelayService
    gateway: str
    setup: GatewaySetup
    apns: FakeApns
    tls: Tls


@asynccontextmanager
async def lab(tmp_path: Path, wake: WakeSection = LAB, *, gateway: str = "") -> AsyncIterator[Lab]:
    with trio.fail_after(60):
        async with apns_gateway(tmp_path, gateway=gateway) as gw, \
                relay_service(tmp_path / "relay", RelayConfig(wake=wake), group_commit=True) as (relay, service):
            yield Lab(relay, service, gw.url, gw.setup, gw.apns, gw.tls)


async def phone(lab: Lab, tmp_path: Path) -> tuple[DeviceClient, HomeAppClient, str]:
    """A registered device with a hook to the lab's gateway (its APNs token sealed to the gateway), and a
    home app holding its credential."""
    dev = DeviceClient(lab.relay, state_path=tmp_path / "dev.json")
    await dev.register(tokens=20)
    device_token = apns_device_token()
    await dev.set_wake_hook(lab.gateway + "/v1/wake", seal_wake_token(lab.setup.public_key, "apns", device_token))
    cred = dev.export_credential(20)
    cred.save(tmp_path / "cred.json")
    return dev, HomeAppClient([lab.relay]), device_token


async def until(predicate: object, timeout: float = 20.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():  # type: ignore[operator]
            await trio.sleep(0.01)


async def push(app: HomeAppClient, tmp_path: Path, text: bytes) -> None:
    from inri.client import PushCredential

    cred = PushCredential.load(tmp_path / "cred.json")
    await app.push(cred, text)
    cred.save(tmp_path / "cred.json")


async def test_the_hook_api_refuses_what_it_must(tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "tls")
    token = seal_wake_token(bytes(32 * [3]), "apns", apns_device_token())
    async with relay_service(tmp_path / "relay", RelayConfig()) as (relay, service):
        dev = DeviceClient(relay, state_path=tmp_path / "dev.json")
        await dev.register(tokens=1)
        assert await dev.wake_hook() is None
        for url, code in (("http://gateway.example/v1/wake", "invalid_field"),
                          ("https://127.0.0.1:8490/v1/wake", "forbidden_hook"),  # the lab switch is off
                          ("https://10.0.0.7/v1/wake", "forbidden_hook")):
            with pytest.raises(ApiError) as err:
                await dev.set_wake_hook(url, token)
            assert (err.value.status, err.value.code) == (422, code)
        for bad in (token[:-1], token + b"x", b"\x00" * 100):
            with pytest.raises(ApiError) as err:
                await dev.set_wake_hook("https://gateway.example/v1/wake", bad)
            assert err.value.code == "invalid_field"
        hook = await dev.set_wake_hook("https://gateway.example/v1/wake", token)
        assert hook.url == "https://gateway.example/v1/wake" and await dev.wake_hook() == hook
        async with httpx.AsyncClient() as c:
            r = await c.put(f"{relay}/v1/devices/{dev.device_id}/wake", json={"url": hook.url, "token": b64e(token)})
            assert r.status_code == 401  # no device secret
            r = await c.get(f"{relay}/v1/devices/{'0' * 32}/wake", headers={"authorization": f"Bearer {dev.secret}"})
            assert r.status_code == 401  # another device's id: the same answer as a wrong secret
        await dev.remove_wake_hook()
        await dev.remove_wake_hook()  # idempotent
        assert await dev.wake_hook() is None
        await dev.set_wake_hook("https://gateway.example/v1/wake", token)
        assert len(service.store.wake_hooks()) == 1
        await dev.unregister()
        assert service.store.wake_hooks() == [] and not service.wake.has_hooks()  # gone with the device
    assert tls.ca.exists()


async def test_a_push_wakes_the_phone_which_pulls_acks_and_is_woken_again(tmp_path: Path) -> None:
    async with lab(tmp_path) as L:
        dev, app, device_token = await phone(L, tmp_path)
        await push(app, tmp_path, b"first")
        await L.apns.wait_for(1)
        assert L.apns.received[0].device_token == device_token and L.apns.errors == []
        await push(app, tmp_path, b"second")  # within the window, nothing acked: coalesced
        await until(lambda: L.service.wake.stats().get("coalesced", 0) == 1)
        msgs = await dev.pull()
        assert [m.plaintext for m in msgs] == [b"first", b"second"]
        await dev.ack([m.id for m in msgs])
        await push(app, tmp_path, b"third")
        await L.apns.wait_for(2)
        await until(lambda: L.service.wake.stats().get("requests_sent", 0) == 2)  # the gateway's answer is back
        assert len(L.apns.received) == 2
        async with httpx.AsyncClient() as c:
            m = parse_metrics((await c.get(L.relay + "/metrics")).text)
        assert m['inri_wake_requests_total{outcome="sent"}'] == 2 and m["inri_wake_hooks"] == 1
        assert m['inri_wake_suppressed_total{reason="coalesced"}'] == 1


async def test_a_gone_token_drops_the_hook_at_the_home_relay(tmp_path: Path) -> None:
    async with lab(tmp_path) as L:
        L.apns.script = [(410, "Unregistered", {})]
        dev, app, _ = await phone(L, tmp_path)
        await push(app, tmp_path, b"to a phone that uninstalled the app")
        await until(lambda: L.service.wake.stats().get("hooks_gone", 0) == 1)
        assert await dev.wake_hook() is None and L.service.store.wake_hooks() == []
        assert [m.plaintext for m in await dev.pull()] == [b"to a phone that uninstalled the app"]  # kept
        await push(app, tmp_path, b"again")
        await until(lambda: L.service.store.mailbox_size() == 2)
        assert len(L.apns.received) == 1


@pytest.mark.parametrize("answer", [(500, "InternalServerError", {}), (503, "ServiceUnavailable", {}),
                                    (429, "TooManyRequests", {})])
async def test_429_and_5xx_are_retried_after_the_backoff(tmp_path: Path, answer: tuple[int, str, dict[str, str]]
                                                         ) -> None:
    async with lab(tmp_path, gateway="token_backoff_s = 1.0") as L:
        L.apns.script = [answer]
        _, app, _ = await phone(L, tmp_path)
        await push(app, tmp_path, b"hello")
        await L.apns.wait_for(2)
        await until(lambda: L.service.wake.stats().get("requests_sent", 0) == 1)
        assert L.service.wake.stats()["requests_retry"] == 1
        first, second = L.apns.received
        print(f"\n{answer[1]}: retried {second.at - first.at:.2f} s after the first attempt")
        assert L.apns.errors == []


async def test_an_expired_provider_token_is_handled_inside_the_gateway(tmp_path: Path) -> None:
    async with lab(tmp_path) as L:
        L.apns.script = [(403, "ExpiredProviderToken", {})]
        _, app, _ = await phone(L, tmp_path)
        await push(app, tmp_path, b"hello")
        await L.apns.wait_for(2)
        await until(lambda: L.service.wake.stats().get("requests_sent", 0) == 1)
        assert L.service.wake.stats().get("requests_retry", 0) == 0  # one request from the relay's side
        assert L.apns.received[0].jwt != L.apns.received[1].jwt


async def test_an_https_hook_is_verified_against_the_configured_ca(tmp_path: Path) -> None:
    tls = make_tls(tmp_path / "gwtls")
    serving = f'tls_cert = "{tls.cert}"\ntls_key = "{tls.key}"'
    async with lab(tmp_path / "untrusted", LAB, gateway=serving) as L:  # the relay does not trust the CA
        assert L.gateway.startswith("https://")
        _, app, _ = await phone(L, tmp_path / "untrusted")
        await push(app, tmp_path / "untrusted", b"hello")
        await until(lambda: L.service.wake.stats().get("requests_retry", 0) >= 1)
        assert L.apns.received == []
    trusted = WakeSection(lab_http_loopback=True, retry_min_s=0.05, retry_max_s=0.2, ca_file=str(tls.ca))
    async with lab(tmp_path / "trusted", trusted, gateway=serving) as L:
        _, app, _ = await phone(L, tmp_path / "trusted")
        await push(app, tmp_path / "trusted", b"hello")
        await L.apns.wait_for(1)
