"""`inri gateway` with APNs: a fake APNs (HTTP/2 over TLS, tests/gateway_fakes.py) verifies every request
(the ES256 provider token against the configured .p8 key, the headers, a body without content), and
each answer Apple documents maps to what the gateway tells the home relay (docs/gateway.md)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio
from cryptography.hazmat.primitives.asymmetric import ec

from inri.common.b64url import b64e
from inri.gateway.apns import ApnsProvider
from inri.gateway.config import load_gateway_config
from inri.node.metrics import parse_metrics
from inri.protocol.wake import seal_wake_token
from tests.gateway_fakes import (
    APNS_KEY_ID,
    APNS_TEAM_ID,
    APNS_TOPIC,
    FakeApns,
    GatewaySetup,
    Late,
    apns_device_token,
    fake_apns,
    fcm_device_token,
    make_tls,
    running_gateway,
    serve_app,
    write_gateway,
)


@asynccontextmanager
async def apns_lab(tmp_path: Path, *, apns: str = "", gateway: str = "",
                   checked_key: ec.EllipticCurvePrivateKey | None = None) -> AsyncIterator[
        tuple[FakeApns, str, GatewaySetup]]:
    """A fake APNs on TLS + HTTP/2 and a gateway (served here, plain HTTP on loopback) pointed at it.
    checked_key: the key the fake verifies against (default: the one the gateway signs with)."""
    tls = make_tls(tmp_path / "tls")
    late = Late()
    with trio.fail_after(60):
        async with serve_app(late, tls) as apns_url:
            setup = write_gateway(tmp_path / "gw", tls, apns_url=apns_url, apns=apns, gateway=gateway)
            fake = fake_apns(setup)
            if checked_key is not None:
                fake = FakeApns(checked_key.public_key(), APNS_KEY_ID, APNS_TEAM_ID, APNS_TOPIC)
            late.app = fake
            async with running_gateway(setup.config) as url:
                yield fake, url, setup


async def wake(url: str, setup: GatewaySetup, device_token: str, provider: str = "apns") -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as c:
        return await c.post(url + "/v1/wake", json={"token": b64e(seal_wake_token(setup.public_key, provider,
                                                                                  device_token))})


async def test_a_wake_up_reaches_apns_over_http2_verified_and_without_content(tmp_path: Path) -> None:
    async with apns_lab(tmp_path) as (fake, url, setup):
        dt = apns_device_token()
        r = await wake(url, setup, dt)
        assert (r.status_code, r.json()) == (200, {"status": "sent"})
        r = await wake(url, setup, dt)
        assert r.status_code == 200
        assert fake.errors == []
        first, second = fake.received
        assert first.http_version == "2" and first.device_token == dt
        h = first.headers
        assert (h["apns-topic"], h["apns-push-type"], h["apns-priority"], h["apns-collapse-id"]) == (
            APNS_TOPIC, "background", "5", "inri-wake")
        assert abs(int(h["apns-expiration"]) - (time.time() + 3600)) < 60
        assert first.body == {"aps": {"content-available": 1}}
        assert first.jwt == second.jwt  # one provider token for every request of its 50 minutes
        async with httpx.AsyncClient() as c:
            assert (await c.get(url + "/v1/key")).json()["public_key"] == b64e(setup.public_key)
            m = parse_metrics((await c.get(url + "/metrics")).text)
        assert m['inri_gateway_wakes_total{outcome="sent",provider="apns"}'] == 2
        assert m['inri_gateway_provider_responses_total{provider="apns",status="200"}'] == 2
        assert m['inri_gateway_provider_token_refreshes_total{provider="apns"}'] == 1


async def test_alert_mode_sends_a_fixed_visible_text_at_priority_10(tmp_path: Path) -> None:
    async with apns_lab(tmp_path, apns='push_type = "alert"\nalert_title = "Chat"\nalert_body = "New message"') as (
            fake, url, setup):
        assert (await wake(url, setup, apns_device_token())).status_code == 200
        assert fake.errors == []
        req = fake.received[0]
        assert (req.headers["apns-push-type"], req.headers["apns-priority"]) == ("alert", "10")
        assert req.body == {"aps": {"alert": {"title": "Chat", "body": "New message"}, "mutable-content": 1}}


async def test_gone_device_tokens_answer_410_token_gone(tmp_path: Path) -> None:
    async with apns_lab(tmp_path) as (fake, url, setup):
        fake.script = [(400, "BadDeviceToken", {}), (410, "Unregistered", {}), (400, "DeviceTokenNotForTopic", {}),
                       (410, "ExpiredToken", {})]
        for _ in range(4):
            r = await wake(url, setup, apns_device_token())
            assert (r.status_code, r.json()["code"]) == (410, "token_gone"), r.text
        assert len(fake.received) == 4 and fake.errors == []


async def test_too_many_requests_backs_off_that_device_token_only(tmp_path: Path) -> None:
    async with apns_lab(tmp_path, gateway="token_backoff_s = 45.0") as (fake, url, setup):
        fake.script = [(429, "TooManyRequests", {})]
        dt = apns_device_token()
        r = await wake(url, setup, dt)
        assert (r.status_code, r.json()["code"], r.headers["retry-after"]) == (503, "provider_backoff", "45")
        r = await wake(url, setup, dt)  # answered here: APNs is not asked again for this token meanwhile
        assert r.status_code == 503 and 1 <= int(r.headers["retry-after"]) <= 45
        assert len(fake.received) == 1
        assert (await wake(url, setup, apns_device_token())).status_code == 200  # other phones go on
        assert len(fake.received) == 2


async def test_an_expired_provider_token_is_replaced_once_and_the_wake_up_retried(tmp_path: Path) -> None:
    async with apns_lab(tmp_path) as (fake, url, setup):
        assert (await wake(url, setup, apns_device_token())).status_code == 200
        fake.script = [(403, "ExpiredProviderToken", {})]
        r = await wake(url, setup, apns_device_token())
        assert r.status_code == 200
        first, expired, retried = fake.received
        assert first.jwt == expired.jwt != retried.jwt  # a new token, then the same request again
        fake.script = [(403, "ExpiredProviderToken", {})]
        r = await wake(url, setup, apns_device_token())  # again within 20 minutes: no new token (Apple's limit)
        assert (r.status_code, r.json()["code"]) == (503, "provider_backoff")
        assert fake.received[-1].jwt == retried.jwt and len(fake.received) == 4
        assert fake.errors == []  # never a new token within 20 minutes of the last unasked


async def test_server_errors_back_off_and_retry_after_blocks_the_provider(tmp_path: Path) -> None:
    async with apns_lab(tmp_path) as (fake, url, setup):
        fake.script = [(500, "InternalServerError", {}), (503, "ServiceUnavailable", {"retry-after": "7"})]
        r = await wake(url, setup, apns_device_token())
        assert (r.status_code, r.json()["code"]) == (503, "provider_backoff") and "retry-after" not in r.headers
        r = await wake(url, setup, apns_device_token())
        assert r.status_code == 503 and r.headers["retry-after"] == "7"
        r = await wake(url, setup, apns_device_token())  # APNs said when: nobody asks it before
        assert r.status_code == 503 and 1 <= int(r.headers["retry-after"]) <= 7
        assert len(fake.received) == 2


async def test_a_key_apple_does_not_accept_is_a_provider_error_not_a_gone_token(tmp_path: Path) -> None:
    async with apns_lab(tmp_path, checked_key=ec.generate_private_key(ec.SECP256R1())) as (fake, url, setup):
        r = await wake(url, setup, apns_device_token())
        assert (r.status_code, r.json()["code"]) == (502, "provider_error")
        assert fake.errors and "provider token" in fake.errors[0]  # the fake really checked the signature


async def test_what_the_gateway_refuses_before_asking_apns(tmp_path: Path) -> None:
    async with apns_lab(tmp_path, gateway="token_burst = 2") as (fake, url, setup):
        async with httpx.AsyncClient() as c:
            other = seal_wake_token(bytes(32 * [9]), "apns", apns_device_token())
            r = await c.post(url + "/v1/wake", json={"token": b64e(other)})
            assert (r.status_code, r.json()["code"]) == (410, "bad_token")
            r = await wake(url, setup, fcm_device_token(), "fcm")  # no [fcm] in this gateway
            assert (r.status_code, r.json()["code"]) == (410, "bad_token")
            r = await c.post(url + "/v1/wake", content=b"{not json")
            assert r.status_code == 400
            r = await c.post(url + "/v1/wake", json={"token": 5})
            assert (r.status_code, r.json()["code"]) == (422, "invalid_field")
            r = await c.post(url + "/v1/wake", content=b"x" * 10_000)
            assert r.status_code == 413
        dt = apns_device_token()
        assert [(await wake(url, setup, dt)).status_code for _ in range(3)] == [200, 200, 429]
        assert len(fake.received) == 2


async def test_provider_tokens_are_refreshed_inside_apples_window(tmp_path: Path) -> None:
    """Never more often than every 20 minutes, never older than 60 (the fake refuses both), on a clock
    the test moves: the provider object against the fake APNs directly."""
    now = [1_800_000_000.0]

    def clock() -> float:
        return now[0]

    tls = make_tls(tmp_path / "tls")
    late = Late()
    async with serve_app(late, tls) as apns_url:
        setup = write_gateway(tmp_path / "gw", tls, apns_url=apns_url)
        fake = fake_apns(setup, clock=clock)
        late.app = fake
        cfg = load_gateway_config(setup.config)
        assert cfg.apns is not None
        import ssl

        async with httpx.AsyncClient(http2=True, verify=ssl.create_default_context(cafile=str(tls.ca))) as client:
            provider = ApnsProvider(cfg.apns, str(cfg.path(cfg.apns.key_file)), client, clock=clock)
            seen: list[tuple[float, Any]] = []
            for minutes in (0, 19, 49, 50, 69, 99, 100, 159, 160):
                now[0] = 1_800_000_000.0 + minutes * 60
                result = await provider.send(apns_device_token())
                assert result.outcome.value == "sent", (minutes, result)
                seen.append((minutes, fake.received[-1].iat))
    assert fake.errors == []
    iats = {iat for _, iat in seen}
    assert len(iats) == 4  # made at 0, 50, 100 and 160 minutes
    assert all((1_800_000_000 + m * 60) - iat < 3600 for m, iat in seen)
