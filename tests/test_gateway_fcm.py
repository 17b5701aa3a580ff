"""`inri gateway` with FCM HTTP v1: a fake Google (OAuth token endpoint + messages:send over HTTP/2 and TLS,
tests/gateway_fakes.py) verifies the service account's RS256 assertion and that each wake-up is a data-only,
high-priority message; each documented error code maps to what the gateway tells the home relay."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import trio

from inri.common.b64url import b64e
from inri.gateway.config import load_gateway_config, read_service_account
from inri.gateway.fcm import FcmProvider
from inri.node.metrics import parse_metrics
from inri.protocol.wake import seal_wake_token
from tests.gateway_fakes import (
    FakeFcm,
    GatewaySetup,
    Late,
    fcm_device_token,
    make_tls,
    running_gateway,
    serve_app,
    write_gateway,
)


@asynccontextmanager
async def fcm_lab(tmp_path: Path, *, gateway: str = "", fcm: str = "") -> AsyncIterator[
        tuple[FakeFcm, str, GatewaySetup]]:
    tls = make_tls(tmp_path / "tls")
    late = Late()
    with trio.fail_after(60):
        async with serve_app(late, tls) as fcm_url:
            setup = write_gateway(tmp_path / "gw", tls, fcm_url=fcm_url, gateway=gateway, fcm=fcm)
            fake = FakeFcm(setup.account)
            late.app = fake
            async with running_gateway(setup.config) as url:
                yield fake, url, setup


async def wake(url: str, setup: GatewaySetup, device_token: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as c:
        return await c.post(url + "/v1/wake", json={"token": b64e(seal_wake_token(setup.public_key, "fcm",
                                                                                  device_token))})


async def test_a_data_only_high_priority_wake_up_with_a_verified_grant_and_one_token_for_many(tmp_path: Path) -> None:
    async with fcm_lab(tmp_path) as (fake, url, setup):
        tokens = [fcm_device_token() for _ in range(3)]
        for dt in tokens:
            r = await wake(url, setup, dt)
            assert (r.status_code, r.json()) == (200, {"status": "sent"}), r.text
        assert fake.errors == []
        assert len(fake.grants) == 1  # the access token is cached until it expires
        assert [m.message["token"] for m in fake.received] == tokens
        m = fake.received[0]
        assert m.http_version == "2"
        assert m.message["data"] == {"inri": "wake"} and "notification" not in m.message
        assert m.message["android"] == {"priority": "HIGH", "ttl": "3600s", "collapse_key": "inri-wake"}
        assert m.message["apns"]["payload"] == {"aps": {"content-available": 1}}
        async with httpx.AsyncClient() as c:
            metrics = parse_metrics((await c.get(url + "/metrics")).text)
        assert metrics['inri_gateway_wakes_total{outcome="sent",provider="fcm"}'] == 3
        assert metrics['inri_gateway_provider_token_refreshes_total{provider="fcm"}'] == 1


async def test_gone_tokens_answer_410_but_a_bad_message_field_is_the_gateways_fault(tmp_path: Path) -> None:
    async with fcm_lab(tmp_path) as (fake, url, setup):
        fake.script = [(404, "UNREGISTERED", "NOT_FOUND", {}, ""),
                       (400, "INVALID_ARGUMENT", "INVALID_ARGUMENT", {}, ""),
                       (403, "SENDER_ID_MISMATCH", "PERMISSION_DENIED", {}, "")]
        for _ in range(3):
            r = await wake(url, setup, fcm_device_token())
            assert (r.status_code, r.json()["code"]) == (410, "token_gone"), r.text
        fake.script = [(400, "", "INVALID_ARGUMENT", {}, "message.android.ttl")]
        r = await wake(url, setup, fcm_device_token())
        assert (r.status_code, r.json()["code"]) == (502, "provider_error")  # the hook must not be dropped
        fake.script = [(400, "", "INVALID_ARGUMENT", {}, "message.token")]
        r = await wake(url, setup, fcm_device_token())
        assert (r.status_code, r.json()["code"]) == (410, "token_gone")


async def test_quota_exceeded_honours_retry_after_for_that_token_and_unavailable_for_all(tmp_path: Path) -> None:
    async with fcm_lab(tmp_path) as (fake, url, setup):
        fake.script = [(429, "QUOTA_EXCEEDED", "RESOURCE_EXHAUSTED", {"retry-after": "7"}, "")]
        dt = fcm_device_token()
        r = await wake(url, setup, dt)
        assert (r.status_code, r.json()["code"], r.headers["retry-after"]) == (503, "provider_backoff", "7")
        r = await wake(url, setup, dt)
        assert r.status_code == 503 and 1 <= int(r.headers["retry-after"]) <= 7
        assert len(fake.received) == 1  # not asked again for that token before its Retry-After
        assert (await wake(url, setup, fcm_device_token())).status_code == 200
        fake.script = [(503, "UNAVAILABLE", "UNAVAILABLE", {"retry-after": "9"}, "")]
        r = await wake(url, setup, fcm_device_token())
        assert r.status_code == 503 and r.headers["retry-after"] == "9"
        r = await wake(url, setup, fcm_device_token())  # FCM as a whole said when: every token waits
        assert r.status_code == 503 and len(fake.received) == 3


async def test_a_refused_access_token_is_replaced_once(tmp_path: Path) -> None:
    async with fcm_lab(tmp_path) as (fake, url, setup):
        assert (await wake(url, setup, fcm_device_token())).status_code == 200
        fake.issued.clear()  # Google revoked it (or forgot it): 401 UNAUTHENTICATED
        assert (await wake(url, setup, fcm_device_token())).status_code == 200
        assert len(fake.grants) == 2 and len(fake.received) == 2 and fake.errors == []


async def test_a_service_account_google_refuses_is_a_provider_error(tmp_path: Path) -> None:
    async with fcm_lab(tmp_path) as (fake, url, setup):
        from tests.gateway_fakes import write_service_account

        fake.account = write_service_account(tmp_path / "other.json", setup.account["token_uri"])
        fake.__post_init__()  # the fake now checks assertions against another key
        r = await wake(url, setup, fcm_device_token())
        assert (r.status_code, r.json()["code"]) == (502, "provider_error")
        assert fake.errors and "assertion" in fake.errors[0] and fake.received == []


async def test_the_access_token_is_renewed_before_it_expires(tmp_path: Path) -> None:
    """On a clock the test moves: one grant while the token is fresh, a new one within 5 minutes of its end."""
    now = [1_800_000_000.0]

    def clock() -> float:
        return now[0]

    tls = make_tls(tmp_path / "tls")
    late = Late()
    async with serve_app(late, tls) as fcm_url:
        setup = write_gateway(tmp_path / "gw", tls, fcm_url=fcm_url)
        fake = FakeFcm(setup.account, clock=clock, expires_in=3600)
        late.app = fake
        cfg = load_gateway_config(setup.config)
        assert cfg.fcm is not None
        account = read_service_account(cfg.path(cfg.fcm.service_account))
        async with httpx.AsyncClient(http2=True, verify=ssl.create_default_context(cafile=str(tls.ca))) as client:
            provider = FcmProvider(cfg.fcm, account, client, clock=clock)
            for seconds, grants in ((0, 1), (1000, 1), (3299, 1), (3301, 2), (6000, 2), (6901, 3)):
                now[0] = 1_800_000_000.0 + seconds
                result = await provider.send(fcm_device_token())
                assert result.outcome.value == "sent" and len(fake.grants) == grants, (seconds, result)
    assert fake.errors == []
