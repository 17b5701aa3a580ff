"""Wake hooks of Mozilla Push user agents (docs/browsers.md "Waking a phone", docs/gateway.md): the protocol
suite's raw WebSocket client (tests/mozpush_client.py) sets its uaid's hook with INRI's `wake_hook` message,
goes away, and unmodified pywebpush senders push to its channels; an `inri gateway` in this process and a
fake APNs (HTTP/2 over TLS, verifying every request: tests/gateway_fakes.py) receive the wake-ups.

Covered: set / read / remove and each refusal answered with a status on a connection that stays; one
wake-up per coalescing window while nothing is acked, and again after an ack; no wake-up while connected,
one when a connection leaves mail unacknowledged; the hook kept across a restart, and mail waiting then
waking the agent; a gone token deleting it; the hook deleted with an idle agent; no device token in clear
in the relay's files; and the coalescing timing on trio's MockClock through the relay's own ASGI app (no
socket)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from inri.client import seal_wake_token
from inri.common.b64url import b64e
from inri.node.api import create_app
from inri.node.config import RelayConfig, WakeSection
from inri.node.ratelimit import RateLimiter
from inri.node.service import RelayService
from inri.node.store import Store
from inri.node.tracefile import TraceFile
from inri.node.wake import WakeHooks
from inri.node.wakepolicy import Owner, OwnerKind, Phase
from tests.gateway_fakes import ApnsGateway, apns_device_token, apns_gateway
from tests.inproc import NullNetwork
from tests.mozpush_client import Closed, MPClient
from tests.test_mozpush import Relay, _asgi_post, decrypt, listener, mp_relay, registered, send
from tests.test_wake_hooks import until
from tests.test_wake_policy import FakeGateway
from tests.test_webpush import Subscriber

COALESCE_S = 120.0  # long enough that a window cannot end while a test runs on the real clock
LAB = WakeSection(lab_http_loopback=True, coalesce_s=COALESCE_S, retry_min_s=0.05, retry_max_s=0.2)
NO_HOOK = {"messageType": "wake_hook", "status": 200, "url": None, "created": None}


async def ask(c: MPClient, msg: dict[str, Any]) -> dict[str, Any]:
    """Send msg and return the next message (a reply: nothing else is pending on these connections)."""
    await c.send(msg)
    got = await c.recv()
    assert isinstance(got, dict), got
    return got


async def set_hook(c: MPClient, url: object, token: object) -> dict[str, Any]:
    return await ask(c, {"messageType": "wake_hook", "url": url, "token": token})


def owner(uaid: str) -> Owner:
    return Owner(OwnerKind.UAID, bytes.fromhex(uaid))


async def gone(relay: Relay) -> None:
    """Wait until the relay has seen every Mozilla Push connection end (the client closed its socket)."""
    await until(lambda: not relay.app.mozpush.by_uaid)


@asynccontextmanager
async def lab(tmp: Path, sock: Any = None) -> AsyncIterator[tuple[Relay, ApnsGateway]]:
    async with apns_gateway(tmp / "gateway") as gw, mp_relay(tmp / "relay", wake=LAB, sock=sock) as relay:
        yield relay, gw


async def sleeping_agent(relay: Relay, gw: ApnsGateway) -> tuple[str, str, str, str]:
    """A user agent with one channel and a hook to the lab's gateway, disconnected:
    (uaid, channelID, endpoint, APNs device token)."""
    c = await MPClient.connect(relay.ws)
    uaid = (await c.hello())["uaid"]
    ch, endpoint = await registered(c)
    device_token = apns_device_token()
    token = b64e(seal_wake_token(gw.setup.public_key, "apns", device_token))
    got = await set_hook(c, gw.url + "/v1/wake", token)
    assert got["status"] == 200 and got["url"] == gw.url + "/v1/wake", got
    await c.aclose()
    await gone(relay)
    return uaid, ch, endpoint, device_token


async def test_a_uaid_sets_reads_and_removes_its_hook_and_each_refusal_is_a_status(tmp_path: Path) -> None:
    token = b64e(seal_wake_token(bytes(32 * [3]), "apns", apns_device_token()))
    url = "https://gateway.example/v1/wake"
    with trio.fail_after(60):
        async with mp_relay(tmp_path) as relay:  # no lab switch: https to public hosts only
            wake, store = relay.service.wake, relay.service.store
            c = await MPClient.connect(relay.ws)
            uaid = (await c.hello())["uaid"]
            assert await ask(c, {"messageType": "wake_hook"}) == NO_HOOK
            for bad_url, bad_token, code in (
                    ("http://gateway.example/v1/wake", token, "invalid_field"),
                    ("https://127.0.0.1:8490/v1/wake", token, "forbidden_hook"),  # loopback: the lab switch is off
                    ("https://10.0.0.7/v1/wake", token, "forbidden_hook"),
                    (42, token, "invalid_field"),
                    (url, token[:-4], "invalid_field"),  # not a sealed wake token's size
                    (url, "not base64url!", "invalid_field"),
                    (url, None, "invalid_field")):
                got = await set_hook(c, bad_url, bad_token)
                assert (got["messageType"], got["status"], got["code"]) == ("wake_hook", 422, code), got
                assert "url" not in got and got["error"]
            assert store.wake_hooks() == [] and not wake.has_hooks()
            hook = await set_hook(c, url, token)
            assert hook["status"] == 200 and hook["url"] == url and isinstance(hook["created"], float)
            assert await ask(c, {"messageType": "wake_hook"}) == hook
            await c.aclose()
            await gone(relay)
            # The uaid is kept with its hook, though it has no channel: the same agent next time.
            c = await MPClient.connect(relay.ws)
            assert (await c.hello(uaid))["uaid"] == uaid
            assert await ask(c, {"messageType": "wake_hook"}) == hook
            assert await ask(c, {"messageType": "wake_hook", "url": None}) == NO_HOOK
            assert await ask(c, {"messageType": "wake_hook", "url": None}) == NO_HOOK  # idempotent
            assert await ask(c, {"messageType": "wake_hook"}) == NO_HOOK
            assert store.wake_hooks() == [] and not wake.has_hooks()
            # Writes are limited per client address ([api] rate_per_s), as the device API's.
            relay.app.agents.register_rate = RateLimiter(0.001, 1)
            assert (await set_hook(c, url, token))["status"] == 200
            got = await set_hook(c, url, token)
            assert (got["status"], got["code"]) == (429, "rate_limited"), got
            assert await ask(c, {}) == {}  # the connection stays
            await c.aclose()
            await gone(relay)
            # An agent not seen for agent_idle_max_s goes, and its hook with it.
            relay.app.agents.idle_max_s = -1.0
            assert relay.app.agents.drop_idle() == 1
            assert store.wake_hooks() == [] and wake.hook(owner(uaid)) is None and not wake.has_hooks()


async def test_wake_hook_before_hello_closes_and_other_types_still_close_as_documented(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with mp_relay(tmp_path) as relay:
            for first in ({"messageType": "wake_hook"}, {"messageType": "wake_hooks"}):
                c = await MPClient.connect(relay.ws)
                if first["messageType"] == "wake_hooks":
                    await c.hello()
                await c.send(first)
                closed = await c.recv()
                want = 4405 if first["messageType"] == "wake_hook" else 4404
                assert isinstance(closed, Closed) and closed.code == want, closed
                await c.aclose()


async def test_a_sleeping_uaid_is_woken_once_per_window_and_again_after_it_acks(tmp_path: Path) -> None:
    with trio.fail_after(90):
        async with lab(tmp_path) as (relay, gw):
            wake, sub = relay.service.wake, Subscriber()
            uaid, ch, endpoint, device_token = await sleeping_agent(relay, gw)
            assert (await send(sub, endpoint, "one", ttl=600)).status_code == 201
            await gw.apns.wait_for(1)
            assert gw.apns.received[0].device_token == device_token and gw.apns.errors == []
            await until(lambda: wake.stats().get("requests_sent", 0) == 1)
            assert (await send(sub, endpoint, "two", ttl=600)).status_code == 201  # in the window, nothing acked
            await until(lambda: wake.stats().get("coalesced", 0) == 1)
            assert len(gw.apns.received) == 1 and wake.policy.phase(owner(uaid)) == Phase.COOLING
            # Woken, the phone connects, takes both messages and acks them: the window ends.
            c = await MPClient.connect(relay.ws)
            assert (await c.hello(uaid))["uaid"] == uaid
            notes = [await c.recv() for _ in range(2)]
            assert [decrypt(sub, n) for n in notes if isinstance(n, dict)] == [b"one", b"two"]
            await c.send({"messageType": "ack", "updates": [{"channelID": ch, "version": n["version"], "code": 100}
                                                            for n in notes if isinstance(n, dict)]})
            assert await ask(c, {}) == {}  # the acks were handled before the pong
            assert wake.policy.phase(owner(uaid)) == Phase.IDLE
            await c.aclose()
            await gone(relay)
            assert (await send(sub, endpoint, "three", ttl=600)).status_code == 201
            await gw.apns.wait_for(2)
            await until(lambda: wake.stats().get("requests_sent", 0) == 2)
            assert len(gw.apns.received) == 2 and gw.apns.received[1].device_token == device_token
            assert gw.apns.errors == []
        # Privacy: the relay holds the sealed token only; the device token is nowhere in its files.
        files = [p for p in (tmp_path / "relay").rglob("*") if p.is_file()]
        assert any(p.name.startswith("relay.sqlite3") for p in files)
        for f in files:
            data = f.read_bytes()
            for needle in (device_token.encode(), device_token.upper().encode(), bytes.fromhex(device_token)):
                assert needle not in data, f


async def test_a_connected_uaid_is_not_woken_until_it_leaves_mail_unacknowledged(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with lab(tmp_path) as (relay, gw):
            wake, sub = relay.service.wake, Subscriber()
            c = await MPClient.connect(relay.ws)
            uaid = (await c.hello())["uaid"]
            _, endpoint = await registered(c)
            token = b64e(seal_wake_token(gw.setup.public_key, "apns", apns_device_token()))
            assert (await set_hook(c, gw.url + "/v1/wake", token))["status"] == 200
            assert (await send(sub, endpoint, "live", ttl=600)).status_code == 201
            note = await c.recv()
            assert isinstance(note, dict) and decrypt(sub, note) == b"live"
            # The wake-up check ran with the delivery (before the notification was written): nothing due.
            assert wake.policy.phase(owner(uaid)) == Phase.IDLE and "requests_sent" not in wake.stats()
            await c.aclose()  # without acking "live": the phone is woken for it
            await gw.apns.wait_for(1)
            await until(lambda: wake.stats().get("requests_sent", 0) == 1)


async def test_a_uaid_hook_survives_a_restart_and_mail_waiting_then_wakes_it(tmp_path: Path) -> None:
    """Woken once, a second message owed at the window's end: the relay restarts (the window is not kept);
    the restarted relay has the hook and wakes the agent for the mail waiting, without a new push."""
    sock = listener()
    sub = Subscriber()
    orphan = Owner(OwnerKind.UAID, uuid.uuid4().bytes)
    with trio.fail_after(90):
        async with apns_gateway(tmp_path / "gateway") as gw:
            async with mp_relay(tmp_path / "relay", wake=LAB, sock=sock) as relay:
                wake = relay.service.wake
                uaid, ch, endpoint, device_token = await sleeping_agent(relay, gw)
                assert (await send(sub, endpoint, "one", ttl=600)).status_code == 201
                await gw.apns.wait_for(1)
                await until(lambda: wake.stats().get("requests_sent", 0) == 1)
                assert (await send(sub, endpoint, "two", ttl=600)).status_code == 201
                await until(lambda: wake.stats().get("coalesced", 0) == 1)
                assert len(gw.apns.received) == 1 and wake.policy.phase(owner(uaid)) == Phase.COOLING
                before = wake.hook(owner(uaid))
                # What a crash between a hook's write and its agent's leaves: a hook of an unsaved uaid.
                assert before is not None
                wake.set_hook(orphan, before.url, before.token, before.created)
            async with mp_relay(tmp_path / "relay", wake=LAB, sock=sock) as relay:
                assert relay.service.wake.hook(owner(uaid)) == before
                assert relay.service.wake.hook(orphan) is None  # removed at start
                await gw.apns.wait_for(2)
                assert gw.apns.received[1].device_token == device_token and gw.apns.errors == []
                c = await MPClient.connect(relay.ws)
                assert (await c.hello(uaid))["uaid"] == uaid
                notes = [await c.recv() for _ in range(2)]
                assert [decrypt(sub, n) for n in notes if isinstance(n, dict)] == [b"one", b"two"]
                assert all(isinstance(n, dict) and n["channelID"] == ch for n in notes)
                assert (await ask(c, {"messageType": "wake_hook"}))["url"] == gw.url + "/v1/wake"
                await c.aclose()
    sock.close()


async def test_a_gone_token_removes_the_uaid_hook(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with lab(tmp_path) as (relay, gw):
            gw.apns.script = [(410, "Unregistered", {})]
            wake, sub = relay.service.wake, Subscriber()
            uaid, _, endpoint, _ = await sleeping_agent(relay, gw)
            assert (await send(sub, endpoint, "to an uninstalled app", ttl=600)).status_code == 201
            await until(lambda: wake.stats().get("hooks_gone", 0) == 1)
            assert relay.service.store.wake_hooks() == [] and wake.hook(owner(uaid)) is None
            assert (await send(sub, endpoint, "again", ttl=600)).status_code == 201
            c = await MPClient.connect(relay.ws)
            await c.hello(uaid)
            notes = [await c.recv() for _ in range(2)]  # the messages are kept
            assert [decrypt(sub, n) for n in notes if isinstance(n, dict)] == [b"to an uninstalled app", b"again"]
            assert await ask(c, {"messageType": "wake_hook"}) == NO_HOOK
            assert len(gw.apns.received) == 1
            await c.aclose()


# -- the coalescing timing on MockClock, through the relay's ASGI app (no socket) ---------------------------


class MemoryWebSocket:
    """One WebSocket connection to an ASGI app over trio memory channels."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.to_app, self._app_inbox = trio.open_memory_channel[dict[str, Any]](64)
        self._app_outbox, self.from_app = trio.open_memory_channel[dict[str, Any]](64)

    async def open(self, nursery: trio.Nursery) -> None:
        scope = {"type": "websocket", "path": "/v1/mozpush", "raw_path": b"/v1/mozpush", "query_string": b"",
                 "headers": [], "subprotocols": ["push-notification"], "client": ("127.0.0.1", 1),
                 "server": ("127.0.0.1", 8480), "scheme": "ws"}
        nursery.start_soon(self.app, scope, self._app_inbox.receive, self._app_outbox.send)
        await self.to_app.send({"type": "websocket.connect"})
        assert (await self.from_app.receive())["type"] == "websocket.accept"

    async def recv(self) -> dict[str, Any]:
        msg = await self.from_app.receive()
        assert msg["type"] == "websocket.send", msg
        got: dict[str, Any] = json.loads(msg["text"])
        return got

    async def ask(self, message: dict[str, Any]) -> dict[str, Any]:
        await self.to_app.send({"type": "websocket.receive", "text": json.dumps(message)})
        return await self.recv()

    async def close(self) -> None:
        await self.to_app.send({"type": "websocket.disconnect", "code": 1000})


async def test_uaid_wake_ups_coalesce_on_the_virtual_clock(tmp_path: Path,
                                                           autojump_clock: trio.testing.MockClock) -> None:
    """A 60 s window: the first push wakes at once, a second inside the window is owed and sent when the window
    ends (mail still waits), an ack on the WebSocket ends the window, a push while connected wakes no one,
    and a connection that goes with a notification unacknowledged wakes at once."""
    store = Store(tmp_path / "relay.sqlite3")
    cfg = RelayConfig(wake=WakeSection(coalesce_s=60.0))
    service = RelayService("a" * 32, cfg.engine.test_profile(), store, NullNetwork(),
                           TraceFile(tmp_path / "t", "a" * 32), clock=trio.current_time)
    gw = FakeGateway()
    service.wake = WakeHooks(store, cfg.wake, transport=httpx.ASGITransport(app=gw))
    app = create_app(service, config=cfg)
    token = seal_wake_token(bytes(32 * [7]), "apns", apns_device_token())

    async def push(url: str) -> None:
        status, body = await _asgi_post(app, "/wp" + url.split("/wp", 1)[1], [(b"ttl", b"600")])
        assert status == 201, body

    async with trio.open_nursery() as n:
        await n.start(store.run)
        await n.start(service.run)
        await n.start(service.wake.run)
        await n.start(app.agents.run)
        await n.start(app.mozpush.run)
        ws = MemoryWebSocket(app)
        await ws.open(n)
        uaid = (await ws.ask({"messageType": "hello", "use_webpush": True}))["uaid"]
        ch = str(uuid.uuid4())
        url = (await ws.ask({"messageType": "register", "channelID": ch}))["pushEndpoint"]
        assert (await ws.ask({"messageType": "wake_hook", "url": "https://gw.example/v1/wake",
                              "token": b64e(token)}))["status"] == 200
        await ws.close()
        await trio.sleep(1)
        assert gw.posts == []  # no mail: no wake-up
        t0 = trio.current_time()
        await push(url)
        await gw.wait_for(1)
        assert gw.posts[0][0] == pytest.approx(t0, abs=0.01) and gw.posts[0][1] == {"token": b64e(token)}
        await trio.sleep(5)
        await push(url)  # inside the window: owed, not sent
        await trio.sleep(30)
        assert len(gw.posts) == 1
        await gw.wait_for(2)
        assert gw.posts[1][0] - gw.posts[0][0] == pytest.approx(60.0, abs=0.01)  # when the window ended
        # The phone connects, takes both and acks: the window (running since the second wake-up) ends.
        ws = MemoryWebSocket(app)
        await ws.open(n)
        assert (await ws.ask({"messageType": "hello", "uaid": uaid, "use_webpush": True}))["uaid"] == uaid
        notes = [await ws.recv() for _ in range(2)]
        await ws.to_app.send({"type": "websocket.receive", "text": json.dumps({"messageType": "ack", "updates": [
            {"channelID": ch, "version": x["version"], "code": 100} for x in notes]})})
        await push(url)  # connected: delivered on the WebSocket, no wake-up
        live = await ws.recv()
        await trio.sleep(600)
        assert len(gw.posts) == 2 and service.wake.policy.phase(owner(uaid)) == Phase.IDLE
        t1 = trio.current_time()
        await ws.close()  # "live" unacknowledged: wakes at once (the window ended with the ack)
        await gw.wait_for(3)
        assert gw.posts[2][0] == pytest.approx(t1, abs=0.01) and live["channelID"] == ch
        n.cancel_scope.cancel()
    store.close()
