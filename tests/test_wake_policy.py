"""When a home relay wakes a device: the sans-IO rules W1-W5 (inri/node/wakepolicy.py) with explicit times,
then the driver (inri/node/wake.py) on trio's MockClock against an in-process gateway: what it POSTs,
when (coalescing window, Retry-After, backoff), and what a gone token does to the stored hook."""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from inri.common.b64url import b64d
from inri.node.config import WakeSection
from inri.node.store import Store
from inri.node.wake import HookError, WakeHooks, check_hook_url
from inri.node.wakepolicy import Owner, OwnerKind, Phase, WakeLimits, WakePolicy
from inri.protocol.wake import seal_wake_token

A = Owner(OwnerKind.DEVICE, b"a" * 16)
B = Owner(OwnerKind.DEVICE, b"b" * 16)


def policy(**kw: Any) -> WakePolicy:
    return WakePolicy(WakeLimits(**kw), random.Random(7))


# -- the rules, sans IO ---------------------------------------------------------------------------------


def test_w1_one_wake_up_per_window_and_one_more_when_mail_came_during_it() -> None:
    p = policy(coalesce_s=60)
    p.mail(A, 0.0)
    assert p.take_due(0.0) == [A]
    p.sent(A, 0.5)
    for t in (1.0, 10.0, 59.0):
        p.mail(A, t)
        assert p.take_due(t) == []
    assert p.counters["coalesced"] == 1  # one wake-up owed, however many messages
    assert p.get_timer() == 60.5
    assert p.take_due(60.5) == [A]  # the window ended with mail noted in it: one more wake-up
    p.sent(A, 61.0)
    assert p.take_due(121.0) == [] and p.phase(A) == Phase.IDLE  # nothing came in that window: quiet


def test_w2_an_ack_ends_the_window_and_mail_left_after_it_wakes_again() -> None:
    p = policy(coalesce_s=60)
    p.mail(A, 0.0)
    p.take_due(0.0)
    p.sent(A, 0.0)
    p.acked(A, 5.0, still_waiting=False)
    assert p.phase(A) == Phase.IDLE
    p.mail(A, 6.0)
    assert p.take_due(6.0) == [A]  # at once, not at 60
    p.sent(A, 6.0)
    p.acked(A, 7.0, still_waiting=True)  # the app acked what it pulled; a message came after its pull
    assert p.take_due(7.0) == [A]


def test_w2_an_ack_while_the_request_is_in_flight_starts_no_window() -> None:
    p = policy(coalesce_s=60)
    p.mail(A, 0.0)
    p.take_due(0.0)
    p.acked(A, 0.1, still_waiting=False)
    p.sent(A, 0.2)
    assert p.phase(A) == Phase.IDLE
    p.mail(A, 0.3)
    assert p.take_due(0.3) == [A]


def test_w3_the_hook_bucket_defers_never_drops() -> None:
    p = policy(coalesce_s=1, rate_per_s=0.1, rate_burst=2)
    for t in (0.0, 1.0):
        p.mail(A, t)
        assert p.take_due(t) == [A]
        p.sent(A, t)
        p.acked(A, t, still_waiting=False)
    p.mail(A, 2.0)
    assert p.take_due(2.0) == [] and p.counters["rate_limited"] == 1
    when = p.get_timer()
    assert when is not None and when == pytest.approx(2.0 + 10.0 * (1 - 0.2), abs=1e-6)  # 0.2 tokens refilled
    assert p.take_due(when) == [A]
    p.mail(B, 2.0)  # another hook has its own bucket
    assert p.take_due(2.0) == [B]


def test_w4_backoff_doubles_with_jitter_honours_retry_after_and_gives_up() -> None:
    p = policy(retry_min_s=1, retry_max_s=8, retry_attempts=6)
    p.mail(A, 0.0)
    now = 0.0
    delays = []
    for n in range(5):
        assert p.take_due(now) == [A]
        assert p.failed(A, now, 20.0 if n == 4 else None)
        when = p.get_timer()
        assert when is not None
        delays.append(when - now)
        now = when
    for n, d in enumerate(delays[:4]):
        full = min(8.0, 2.0 ** n)
        assert full / 2 <= d <= full, (n, d)
    assert delays[4] == 20.0  # the gateway's Retry-After, longer than the backoff
    assert p.take_due(now) == [A]
    assert not p.failed(A, now) and p.counters["given_up"] == 1 and p.phase(A) == Phase.IDLE


def test_w5_forget_drops_everything_scheduled() -> None:
    p = policy()
    p.mail(A, 0.0)
    p.forget(A)
    assert p.get_timer() is None and p.take_due(100.0) == []


@pytest.mark.parametrize("url, code", [
    ("http://gateway.example/v1/wake", "invalid_field"),
    ("ftp://gateway.example/v1/wake", "invalid_field"),
    ("https://user:pw@gateway.example/v1/wake", "invalid_field"),
    ("https://gateway.example/v1/wake#x", "invalid_field"),
    ("https://gateway.example:99999/", "invalid_field"),
    ("https://gate way.example/", "invalid_field"),
    ("https://" + "a" * 600 + ".example/", "invalid_field"),
    ("https://127.0.0.1:8490/v1/wake", "forbidden_hook"),
    ("https://localhost/v1/wake", "forbidden_hook"),
    ("https://[::1]/v1/wake", "forbidden_hook"),
    ("https://10.1.2.3/v1/wake", "forbidden_hook"),
    ("https://192.168.1.1/v1/wake", "forbidden_hook"),
    ("https://169.254.169.254/latest/meta-data", "forbidden_hook"),
    ("https://[fd00::1]/", "forbidden_hook"),
])
def test_hook_urls_refused(url: str, code: str) -> None:
    with pytest.raises(HookError) as err:
        check_hook_url(url)
    assert err.value.code == code


def test_hook_urls_accepted_and_the_lab_switch() -> None:
    assert check_hook_url("https://gateway.example/v1/wake")
    assert check_hook_url("https://93.184.215.14:8443/v1/wake")
    for url in ("http://127.0.0.1:8490/v1/wake", "https://[::1]/v1/wake", "http://localhost:1/"):
        assert check_hook_url(url, lab_http_loopback=True) == url
    with pytest.raises(HookError):  # the lab switch is about loopback only
        check_hook_url("http://gateway.example/v1/wake", lab_http_loopback=True)
    with pytest.raises(HookError):
        check_hook_url("https://10.0.0.1/", lab_http_loopback=True)


# -- the driver on MockClock --------------------------------------------------------------------------------

GATEWAY_KEY = bytes(32 * [7])


class FakeGateway:
    """A gateway as the relay sees it: records each POST with its (virtual) time; answers from a script."""

    def __init__(self) -> None:
        self.posts: list[tuple[float, dict[str, Any], dict[str, str]]] = []
        self.script: list[tuple[int, dict[str, str]]] = []
        self.arrived = trio.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        self.posts.append((trio.current_time(), json.loads(body),
                           {k.decode(): v.decode() for k, v in scope["headers"]}))
        self.arrived.set()
        self.arrived = trio.Event()
        status, headers = self.script.pop(0) if self.script else (200, {})
        if status == 0:  # a gateway that takes the request and never answers
            await trio.sleep_forever()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(k.encode(), v.encode()) for k, v in headers.items()]})
        await send({"type": "http.response.body", "body": b'{"status":"sent"}'})

    async def wait_for(self, n: int) -> None:
        while len(self.posts) < n:
            await self.arrived.wait()


@asynccontextmanager
async def driver(tmp_path: Path, gateway: FakeGateway, waiting: dict[str, bool], **cfg: Any) -> AsyncIterator[
        tuple[WakeHooks, Store]]:
    store = Store(tmp_path / "relay.sqlite3")
    hooks = WakeHooks(store, WakeSection(**cfg), rng=random.Random(3), transport=httpx.ASGITransport(app=gateway))
    hooks.waiting[OwnerKind.DEVICE] = lambda key: waiting["mail"]
    hooks.live[OwnerKind.DEVICE] = lambda key: waiting.get("stream", False)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(hooks.run)
            yield hooks, store
            nursery.cancel_scope.cancel()
    finally:
        store.close()


def token() -> bytes:
    return seal_wake_token(GATEWAY_KEY, "apns", "ab" * 32)


async def test_driver_posts_only_the_token_and_coalesces_on_the_virtual_clock(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    gw = FakeGateway()
    state = {"mail": True}
    async with driver(tmp_path, gw, state, coalesce_s=60.0) as (hooks, store):
        tok = token()
        hooks.set_hook(A, "https://gw.example/v1/wake", tok, 1.0)  # mail waits already: wakes at once
        await gw.wait_for(1)
        t0, body, headers = gw.posts[0]
        assert body == {"token": body["token"]} and b64d(body["token"]) == tok  # the token, nothing else
        assert "content-length" in headers and not any("push" in k for k in headers)
        for _ in range(5):
            hooks.message_stored(A.key)
            await trio.sleep(5)
        assert len(gw.posts) == 1
        await gw.wait_for(2)  # the window ends with mail noted in it: one more, 60 s after the first
        assert gw.posts[1][0] - t0 == pytest.approx(60.0, abs=0.01)
        hooks.acked(A.key)  # state["mail"] still True: mail left after the ack wakes at once
        await gw.wait_for(3)
        assert gw.posts[2][0] - gw.posts[1][0] == pytest.approx(0.0, abs=0.01)
        state["mail"] = False
        hooks.acked(A.key)
        await trio.sleep(600)
        assert len(gw.posts) == 3


async def test_driver_honours_retry_after_then_backs_off_on_5xx(tmp_path: Path,
                                                                autojump_clock: trio.testing.MockClock) -> None:
    gw = FakeGateway()
    gw.script = [(429, {"retry-after": "30"}), (503, {}), (500, {}), (200, {})]
    async with driver(tmp_path, gw, {"mail": True}, retry_min_s=2.0, retry_max_s=100.0) as (hooks, _):
        hooks.set_hook(A, "https://gw.example/v1/wake", token(), 1.0)
        await gw.wait_for(4)
        times = [t for t, _, _ in gw.posts]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert gaps[0] >= 30.0  # Retry-After honoured (longer than the 1-2 s backoff)
        assert 2.0 <= gaps[1] <= 4.0 and 4.0 <= gaps[2] <= 8.0, gaps  # 2nd and 3rd failures: 4 s, 8 s, half jittered
        assert hooks.stats()["requests_retry"] == 3 and hooks.stats()["requests_sent"] == 1


async def test_driver_drops_the_hook_when_the_gateway_says_gone_and_keeps_it_on_other_4xx(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    gw = FakeGateway()
    gw.script = [(404, {}), (410, {})]
    state = {"mail": True}
    async with driver(tmp_path, gw, state) as (hooks, store):
        hooks.set_hook(A, "https://gw.example/v1/wake", token(), 1.0)
        await gw.wait_for(1)
        await trio.sleep(1)
        assert hooks.hook(A) is not None and len(store.wake_hooks()) == 1  # 404: this wake-up refused, hook kept
        hooks.message_stored(A.key)
        await gw.wait_for(2)
        await trio.sleep(1)
        assert hooks.hook(A) is None and store.wake_hooks() == []  # 410: gone, deleted from the store
        assert hooks.stats()["hooks_gone"] == 1
        hooks.message_stored(A.key)
        await trio.sleep(120)
        assert len(gw.posts) == 2


async def test_driver_skips_a_device_whose_stream_is_open(tmp_path: Path,
                                                          autojump_clock: trio.testing.MockClock) -> None:
    gw = FakeGateway()
    state = {"mail": True, "stream": True}
    async with driver(tmp_path, gw, state) as (hooks, _):
        hooks.set_hook(A, "https://gw.example/v1/wake", token(), 1.0)
        hooks.message_stored(A.key)
        await trio.sleep(120)
        assert gw.posts == []
        state["stream"] = False
        hooks.stream_closed(A.key)  # it left mail unacknowledged
        await gw.wait_for(1)


async def test_hooks_survive_a_restart_and_mail_waiting_then_wakes(tmp_path: Path,
                                                                   autojump_clock: trio.testing.MockClock) -> None:
    store = Store(tmp_path / "relay.sqlite3")
    WakeHooks(store).set_hook(B, "https://gw.example/v1/wake", token(), 1.0)
    store.close()
    gw = FakeGateway()
    async with driver(tmp_path, gw, {"mail": True}) as (hooks, _):
        assert hooks.hook(B) is not None
        await gw.wait_for(1)  # the restarted relay wakes what has mail waiting


async def test_a_gateway_that_never_answers_costs_one_timeout_then_a_retry(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    gw = FakeGateway()
    gw.script = [(0, {})]
    async with driver(tmp_path, gw, {"mail": True}, timeout_s=10.0, retry_min_s=1.0) as (hooks, _):
        hooks.set_hook(A, "https://gw.example/v1/wake", token(), 1.0)
        with trio.fail_after(600):  # virtual seconds: without the deadline the relay would wait forever
            await gw.wait_for(2)
        gap = gw.posts[1][0] - gw.posts[0][0]
        assert 10.5 <= gap <= 11.0  # the request's deadline (10 s), then the first backoff (0.5-1 s)
        assert hooks.stats()["requests_retry"] == 1
