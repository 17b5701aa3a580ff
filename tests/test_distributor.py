"""`inri distributor` over a real D-Bus session bus (a private dbus-daemon started here) with a test
UnifiedPush connector on the bus, against a fake relay device (the relay end-to-end test is in
test_distributor_e2e.py)."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import shutil
import subprocess
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from inri.client.device import Message, WebPushEndpoint
from inri.client.distributor import (
    CONNECTOR_PATH,
    DISTRIBUTOR_IFACE,
    DISTRIBUTOR_PATH,
    DISTRIBUTOR_PREFIX,
    run_distributor,
)

pytestmark = pytest.mark.integration  # starts a dbus-daemon
dbus_fast = pytest.importorskip("dbus_fast")
from dbus_fast import Message as DMessage  # noqa: E402
from dbus_fast import MessageType, Variant  # noqa: E402
from dbus_fast.aio import MessageBus  # noqa: E402
from dbus_fast.service import ServiceInterface, method  # noqa: E402

APP = "org.example.InriTestApp"
VAPID = "BNcRdreALRFXTkOOUHK1EtK2wtaz5Ry4YfYCA_0QTpQtUbVlUls0VJXg7A8u-Ts1XbjhazAkj7I99e8QcYP7DkM"


@pytest.fixture
def bus_address(tmp_path: Path) -> Iterator[str]:
    """A private session bus: dbus-daemon prints its address, and is stopped after the test."""
    daemon = shutil.which("dbus-daemon")
    if daemon is None:
        pytest.skip("dbus-daemon missing (Debian package dbus; .ci/run installs it)")
    conf = tmp_path / "session.conf"
    conf.write_text(f"""<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><type>session</type><listen>unix:dir={tmp_path}</listen>
<policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/>
<allow own="*"/></policy></busconfig>""")
    proc = subprocess.Popen([daemon, f"--config-file={conf}", "--print-address=1", "--nofork"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()  # blocks until the bus listens (or the daemon exits)
        assert address, "dbus-daemon did not start"
        yield address
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class FakeDevice:
    """A relay device double: records what the distributor asks of the relay."""

    def __init__(self, relay: FakeRelay, path: Path) -> None:
        self.relay, self.path = relay, path
        self.device_id: str | None = None
        self.inbox: trio.MemorySendChannel[Message]
        self._recv: trio.MemoryReceiveChannel[Message]
        self.inbox, self._recv = trio.open_memory_channel[Message](10)

    async def register(self, tokens: int = 50, lifetime_s: int = 0) -> str:
        self.relay.calls.append(("register", str(self.path)))
        self.device_id = f"dev{len(self.relay.devices)}"
        return self.device_id

    async def refresh(self, lifetime_s: int = 0) -> int:
        self.relay.calls.append(("refresh", str(self.path)))
        return 2

    async def unregister(self) -> None:
        self.relay.calls.append(("unregister", str(self.path)))

    async def mint_endpoint(self, vapid_key: str | None = None) -> WebPushEndpoint:
        n = sum(1 for c in self.relay.calls if c[0] == "mint")
        self.relay.calls.append(("mint", vapid_key or ""))
        return WebPushEndpoint(f"e{n}", f"https://relay.test/wp/v1/R/E{n}", vapid_key is not None, vapid_key)

    async def revoke_endpoint(self, endpoint_id: str) -> None:
        self.relay.calls.append(("revoke", endpoint_id))

    async def ack(self, ids: list[str]) -> int:
        self.relay.acked.extend(ids)
        return len(ids)

    @asynccontextmanager
    async def stream(self, *, ack: bool = True) -> AsyncIterator[trio.MemoryReceiveChannel[Message]]:
        assert not ack, "the distributor must ack only after the app's call returned"
        yield self._recv

    async def aclose(self) -> None:
        pass


class FakeRelay:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.acked: list[str] = []
        self.devices: list[FakeDevice] = []

    def make(self, path: Path) -> FakeDevice:
        d = FakeDevice(self, path)
        self.devices.append(d)
        return d


class AppConnector:
    """A UnifiedPush app on the bus: its own asyncio loop and bus connection, in a thread."""

    def __init__(self, address: str, *, message_delay: float = 0.0) -> None:
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.message_delay = message_delay
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.bus: MessageBus = self.run(self._connect(address))

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=20)

    async def _connect(self, address: str) -> MessageBus:
        connector = self

        class Iface(ServiceInterface):
            def __init__(self) -> None:
                super().__init__("org.unifiedpush.Connector2")

            @method()
            def NewEndpoint(self, args: "a{sv}") -> "a{sv}":  # type: ignore[valid-type]  # noqa: F722
                connector.events.put(("NewEndpoint", {k: v.value for k, v in args.items()}))
                return {}

            @method()
            async def Message(self, args: "a{sv}") -> "a{sv}":  # type: ignore[valid-type]  # noqa: F722
                await asyncio.sleep(connector.message_delay)  # the app is still handling it: no ack yet
                connector.events.put(("Message", {k: v.value for k, v in args.items()}))
                return {}

            @method()
            def Unregistered(self, args: "a{sv}") -> "a{sv}":  # type: ignore[valid-type]  # noqa: F722
                connector.events.put(("Unregistered", {k: v.value for k, v in args.items()}))
                return {}

        bus = await MessageBus(bus_address=address).connect()
        bus.export(CONNECTOR_PATH, Iface())
        await bus.request_name(APP)
        return bus

    def call(self, member: str, args: dict[str, Any], name: str = "inri") -> dict[str, Any]:
        async def go() -> dict[str, Any]:
            reply = await self.bus.call(DMessage(destination=DISTRIBUTOR_PREFIX + name, path=DISTRIBUTOR_PATH,
                                                 interface=DISTRIBUTOR_IFACE, member=member, signature="a{sv}",
                                                 body=[{k: Variant("s", v) for k, v in args.items()}]))
            assert reply is not None and reply.message_type == MessageType.METHOD_RETURN, reply
            return {k: v.value for k, v in reply.body[0].items()}
        result: dict[str, Any] = self.run(go())
        return result

    async def next_event(self, timeout: float = 15.0) -> tuple[str, dict[str, Any]]:
        return await trio.to_thread.run_sync(lambda: self.events.get(timeout=timeout))

    def close(self) -> None:
        async def bye() -> None:
            self.bus.disconnect()
            with contextlib.suppress(Exception):  # EOF on our own disconnect is expected
                await self.bus.wait_for_disconnect()  # type: ignore[no-untyped-call]
        self.run(bye())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


async def _wait(pred: Any, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.02)


async def test_register_message_ack_unregister(bus_address: str, tmp_path: Path) -> None:
    relay = FakeRelay()
    state = tmp_path / "state"
    app = AppConnector(bus_address, message_delay=0.5)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: run_distributor(
                "http://unused", state, "inri", bus_address=bus_address, make_device=relay.make,
                task_status=task_status))
            # Register: success, a restricted endpoint minted with the app's VAPID key, NewEndpoint to the app
            ans = await trio.to_thread.run_sync(app.call, "Register",
                                                {"service": APP, "token": "tok-1", "vapid": VAPID})
            assert ans == {"success": "REGISTRATION_SUCCEEDED"}
            kind, ev = await app.next_event()
            assert (kind, ev) == ("NewEndpoint", {"token": "tok-1", "endpoint": "https://relay.test/wp/v1/R/E0"})
            assert ("mint", VAPID) in relay.calls
            # Register again with the same token: same endpoint, nothing minted
            await trio.to_thread.run_sync(app.call, "Register", {"service": APP, "token": "tok-1", "vapid": VAPID})
            assert (await app.next_event())[1]["endpoint"] == "https://relay.test/wp/v1/R/E0"
            assert sum(1 for c in relay.calls if c[0] == "mint") == 1
            # A Web Push message: the raw body reaches the app byte for byte, acked only after the app returned
            body = bytes(range(256)) * 3
            await relay.devices[0].inbox.send(Message("m1", b"", 1.0, kind="webpush", body=body,
                                                      encoding="aes128gcm"))
            await trio.sleep(0.25)
            assert relay.acked == []  # the app is still inside Message
            kind, ev = await app.next_event()
            assert kind == "Message" and ev["token"] == "tok-1" and ev["message"] == body and ev["id"] == "m1"
            await _wait(lambda: relay.acked == ["m1"])
            # Unregister: the endpoint is revoked, the device unregistered, the app told
            await trio.to_thread.run_sync(app.call, "Unregister", {"token": "tok-1"})
            assert ("revoke", "e0") in relay.calls and ("unregister", str(state / relay.devices[0].path.name)) \
                in relay.calls
            assert (await app.next_event()) == ("Unregistered", {"token": "tok-1"})
            nursery.cancel_scope.cancel()
    finally:
        app.close()


async def test_state_survives_restart_and_refresh_reissues(bus_address: str, tmp_path: Path) -> None:
    relay = FakeRelay()
    state = tmp_path / "state"
    app = AppConnector(bus_address)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: run_distributor(
                "http://unused", state, "inri", bus_address=bus_address, make_device=relay.make,
                task_status=task_status))
            await trio.to_thread.run_sync(app.call, "Register", {"service": APP, "token": "tok-2"})
            assert (await app.next_event())[1]["endpoint"].endswith("E0")
            nursery.cancel_scope.cancel()
        # restart: the registration is remembered (no new mint); a short lifetime makes refresh due at once
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: run_distributor(
                "http://unused", state, "inri", bus_address=bus_address, make_device=relay.make,
                lifetime_s=1, task_status=task_status))
            await trio.to_thread.run_sync(app.call, "Register", {"service": APP, "token": "tok-2"})
            kinds = [await app.next_event(), await app.next_event()]
            endpoints = sorted(ev["endpoint"] for _, ev in kinds)
            # the restored registration answers E0 unless the refresh (due at once) re-issued E1 first
            assert "https://relay.test/wp/v1/R/E1" in endpoints and set(endpoints) <= {
                "https://relay.test/wp/v1/R/E0", "https://relay.test/wp/v1/R/E1"}
            await _wait(lambda: ("revoke", "e0") in relay.calls)  # refresh re-issued: old endpoint revoked
            assert ("refresh", str(state / relay.devices[-1].path.name)) in relay.calls
            assert [c[0] for c in relay.calls].count("register") == 1  # the restart registered nothing new
            nursery.cancel_scope.cancel()
    finally:
        app.close()
