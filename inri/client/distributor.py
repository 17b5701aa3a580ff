"""`inri distributor`: a UnifiedPush distributor for Linux on the D-Bus session bus.

The distributor owns `org.unifiedpush.Distributor.<name>` and serves `org.unifiedpush.Distributor2`
at `/org/unifiedpush/Distributor`. Each app registration (connector token) gets its own INRI device
at the home relay (one route key per app subscription, so two apps' endpoints cannot be linked) and
one Web Push endpoint, restricted to the app's VAPID key when it gives one. Web Push messages arrive
over the device's stream; their raw body goes to the app's `org.unifiedpush.Connector2.Message` and
the message is acknowledged at the relay only once that call has returned (the app's ack), so a
crash of the app or of the distributor loses nothing: the relay re-sends what was not acknowledged.

dbus-fast is asyncio-only while INRI's client is trio: the bus runs on an asyncio loop in its own
thread and the two sides talk through `trio.from_thread` / `asyncio.run_coroutine_threadsafe`
(the standard thread bridges of both libraries) instead of mixing the two event loops in one thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import structlog
import trio

from inri.client.credential import _write_private
from inri.client.device import DeviceClient, Message, WebPushEndpoint

log = structlog.get_logger("inri.distributor")

DISTRIBUTOR_PATH = "/org/unifiedpush/Distributor"
DISTRIBUTOR_IFACE = "org.unifiedpush.Distributor2"
DISTRIBUTOR_PREFIX = "org.unifiedpush.Distributor."
CONNECTOR_PATH = "/org/unifiedpush/Connector"
CONNECTOR_IFACE = "org.unifiedpush.Connector2"
KIND_WEBPUSH = "webpush"


class RegisterResult(StrEnum):
    """Values of the `success` key of Register's answer (UnifiedPush D-Bus specification)."""

    SUCCEEDED = "REGISTRATION_SUCCEEDED"
    FAILED = "REGISTRATION_FAILED"


class FailReason(StrEnum):
    """Values of the `reason` key when a registration fails."""

    INTERNAL_ERROR = "INTERNAL_ERROR"
    NETWORK = "NETWORK"
    VAPID_REQUIRED = "VAPID_REQUIRED"


class RelayDevice(Protocol):
    """What the distributor needs from a `DeviceClient` (a fake one is injected in tests)."""

    device_id: str | None

    async def register(self, tokens: int = ..., lifetime_s: int = ...) -> str: ...
    async def refresh(self, lifetime_s: int = ...) -> int: ...
    async def unregister(self) -> None: ...
    async def mint_endpoint(self, vapid_key: str | None = None) -> WebPushEndpoint: ...
    async def revoke_endpoint(self, endpoint_id: str) -> None: ...
    async def ack(self, ids: list[str]) -> int: ...
    def stream(self, *, ack: bool = True) -> AbstractAsyncContextManager[trio.MemoryReceiveChannel[Message]]: ...
    async def aclose(self) -> None: ...


DeviceFactory = Callable[[Path], RelayDevice]


@dataclass
class AppRegistration:
    """One connector registration, as kept in the distributor's state file."""

    token: str
    service: str
    vapid: str | None
    endpoint_id: str
    endpoint: str
    registered_at: float  # when the device's registration was last signed (register or refresh)
    device_state: str  # file name under the state dir


class Connectors(Protocol):
    """How the distributor calls the apps' connectors (the D-Bus side, or a test double)."""

    async def new_endpoint(self, service: str, token: str, endpoint: str) -> None: ...
    async def message(self, service: str, token: str, body: bytes, msg_id: str) -> None: ...
    async def unregistered(self, service: str, token: str) -> None: ...


class Distributor:
    """The distributor's logic (trio): app registrations, their INRI devices, messages, refresh."""

    def __init__(self, state_dir: Path, make_device: DeviceFactory, connectors: Connectors, *,
                 lifetime_s: int = 7 * 24 * 3600, refresh_fraction: float = 0.8) -> None:
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.make_device = make_device
        self.connectors = connectors
        self.lifetime_s = lifetime_s
        self.refresh_fraction = refresh_fraction  # re-issue the endpoint this far into the lifetime
        self.apps: dict[str, AppRegistration] = {}
        self.devices: dict[str, RelayDevice] = {}
        self._scopes: dict[str, trio.CancelScope] = {}
        self._lock = trio.Lock()  # registrations change one at a time (Register twice -> one endpoint)
        self._nursery: trio.Nursery | None = None
        self._load()

    @property
    def _index(self) -> Path:
        return self.state_dir / "registrations.json"

    def _load(self) -> None:
        if self._index.exists():
            for d in json.loads(self._index.read_text(encoding="utf-8")):
                self.apps[d["token"]] = AppRegistration(**d)

    def _save(self) -> None:
        _write_private(self._index, json.dumps([asdict(a) for a in self.apps.values()]))

    def _device(self, app_token: str, file_name: str) -> RelayDevice:
        if app_token not in self.devices:
            self.devices[app_token] = self.make_device(self.state_dir / file_name)
        return self.devices[app_token]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve the loaded registrations (stream + refresh each) until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for app in list(self.apps.values()):
                self._start(app)
            task_status.started()
            await trio.sleep_forever()

    def _start(self, app: AppRegistration) -> None:
        assert self._nursery is not None
        scope = trio.CancelScope()
        self._scopes[app.token] = scope
        self._nursery.start_soon(self._serve, app.token, scope)

    async def register(self, service: str, token: str, vapid: str | None = None) -> str:
        """Register (or re-register) an app connection; returns its endpoint and tells the app."""
        async with self._lock:
            app = self.apps.get(token)
            if app is not None and app.service == service and app.vapid == vapid:
                endpoint = app.endpoint  # a valid endpoint exists: the spec says not to mint another
            else:
                if app is not None:  # same token, another app or key: start over
                    await self._drop(app, revoke=True)
                name = "device-" + hashlib.sha256(token.encode()).hexdigest()[:24] + ".json"
                dev = self._device(token, name)
                await dev.register(tokens=1, lifetime_s=self.lifetime_s)
                ep = await dev.mint_endpoint(vapid)
                app = AppRegistration(token, service, vapid, ep.endpoint_id, ep.url, time.time(), name)
                self.apps[token] = app
                self._save()
                self._start(app)
                endpoint = ep.url
        await self.connectors.new_endpoint(service, token, endpoint)
        return endpoint

    async def unregister(self, token: str) -> bool:
        """Revoke the app's endpoint, delete its device at the relay, and tell the app."""
        async with self._lock:
            app = self.apps.get(token)
            if app is None:
                return False
            await self._drop(app, revoke=True)
        await self.connectors.unregistered(app.service, token)
        return True

    async def _drop(self, app: AppRegistration, *, revoke: bool) -> None:
        scope = self._scopes.pop(app.token, None)
        if scope is not None:
            scope.cancel()
        dev = self._device(app.token, app.device_state)
        if revoke:
            await dev.revoke_endpoint(app.endpoint_id)  # senders get 410 at once
            await dev.unregister()
        await dev.aclose()
        self.devices.pop(app.token, None)
        self.apps.pop(app.token, None)
        self._save()
        (self.state_dir / app.device_state).unlink(missing_ok=True)

    async def _serve(self, token: str, scope: trio.CancelScope) -> None:
        with scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._refresh_loop, token)
                await self._forward(token)

    async def _forward(self, token: str) -> None:
        app = self.apps[token]
        dev = self._device(token, app.device_state)
        async with dev.stream(ack=False) as messages:
            async for m in messages:
                if m.kind != KIND_WEBPUSH:  # nothing but Web Push is addressed to an app's device
                    await dev.ack([m.id])
                    continue
                try:
                    await self.connectors.message(app.service, token, m.body, m.id)
                except Exception as exc:  # noqa: BLE001 - app gone or refused: leave it unacked, the relay re-sends it
                    log.warning("connector_message_failed", service=app.service, error=repr(exc))
                    continue
                await dev.ack([m.id])  # the app's call returned: that is its ack

    async def _refresh_loop(self, token: str) -> None:
        while True:
            app = self.apps[token]
            due = app.registered_at + self.lifetime_s * self.refresh_fraction
            await trio.sleep(max(0.0, due - time.time()))
            await self._reissue(token)

    async def _reissue(self, token: str) -> None:
        """Re-sign the registration and hand the app a fresh endpoint (the URL embeds the registration,
        so an endpoint minted under the old one dies with it), then revoke the old endpoint."""
        async with self._lock:
            app = self.apps[token]
            dev = self._device(token, app.device_state)
            await dev.refresh(lifetime_s=self.lifetime_s)
            ep = await dev.mint_endpoint(app.vapid)
            old = app.endpoint_id
            app.endpoint_id, app.endpoint, app.registered_at = ep.endpoint_id, ep.url, time.time()
            self._save()
        await self.connectors.new_endpoint(app.service, token, ep.url)
        await dev.revoke_endpoint(old)


# -- D-Bus side (asyncio, its own thread) ------------------------------------------------------------


def _s(args: dict[str, Any], key: str) -> str | None:
    v = args.get(key)
    return None if v is None else str(v.value)


def serve_dbus(dist: Distributor, name: str, trio_token: trio.lowlevel.TrioToken, ready: threading.Event,
               stop: threading.Event, bus_address: str | None = None) -> None:
    """Run the D-Bus side until `stop` is set (call in a thread): own the name, serve Distributor2."""
    from dbus_fast import BusType, MessageType, Variant
    from dbus_fast import Message as DMessage
    from dbus_fast.aio import MessageBus
    from dbus_fast.service import ServiceInterface, method

    async def in_trio(fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: trio.from_thread.run(fn, *args, trio_token=trio_token))

    class DistributorIface(ServiceInterface):
        def __init__(self) -> None:
            super().__init__(DISTRIBUTOR_IFACE)

        @method()
        async def Register(self, args: "a{sv}") -> "a{sv}":  # type: ignore[valid-type]  # noqa: F722
            service, token = _s(args, "service"), _s(args, "token")
            if not service or not token:
                return {"success": Variant("s", RegisterResult.FAILED.value),
                        "reason": Variant("s", FailReason.INTERNAL_ERROR.value)}
            try:
                await in_trio(dist.register, service, token, _s(args, "vapid"))
            except Exception as exc:  # noqa: BLE001 - relay unreachable or refusing: the app may retry later
                log.warning("register_failed", service=service, error=repr(exc))
                return {"success": Variant("s", RegisterResult.FAILED.value),
                        "reason": Variant("s", FailReason.NETWORK.value)}
            return {"success": Variant("s", RegisterResult.SUCCEEDED.value)}

        @method()
        async def Unregister(self, args: "a{sv}") -> "a{sv}":  # type: ignore[valid-type]  # noqa: F722
            token = _s(args, "token")
            if token:
                await in_trio(dist.unregister, token)
            return {}

    async def main() -> None:
        bus = await MessageBus(bus_address=bus_address, bus_type=BusType.SESSION).connect()

        async def call(service: str, member: str, body: dict[str, Any]) -> None:
            reply = await bus.call(DMessage(destination=service, path=CONNECTOR_PATH, interface=CONNECTOR_IFACE,
                                            member=member, signature="a{sv}", body=[body]))
            if reply is None or reply.message_type == MessageType.ERROR:
                raise RuntimeError(f"{service} {member}: {reply.error_name if reply else 'no reply'}")

        class DBusConnectors:
            def _run(self, service: str, member: str, body: dict[str, Any]) -> Any:
                # called from trio's thread: run on the bus loop and wait for the app's reply there
                fut = asyncio.run_coroutine_threadsafe(call(service, member, body), loop)
                return trio.to_thread.run_sync(fut.result, abandon_on_cancel=True)

            async def new_endpoint(self, service: str, token: str, endpoint: str) -> None:
                await self._run(service, "NewEndpoint", {"token": Variant("s", token),
                                                         "endpoint": Variant("s", endpoint)})

            async def message(self, service: str, token: str, body: bytes, msg_id: str) -> None:
                await self._run(service, "Message", {"token": Variant("s", token), "message": Variant("ay", body),
                                                     "id": Variant("s", msg_id)})

            async def unregistered(self, service: str, token: str) -> None:
                await self._run(service, "Unregistered", {"token": Variant("s", token)})

        loop = asyncio.get_running_loop()
        dist.connectors = DBusConnectors()
        bus.export(DISTRIBUTOR_PATH, DistributorIface())
        await bus.request_name(DISTRIBUTOR_PREFIX + name)
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        bus.disconnect()
        with contextlib.suppress(Exception):  # the reader's EOF on our own disconnect is expected
            await bus.wait_for_disconnect()  # type: ignore[no-untyped-call]

    asyncio.run(main())


async def run_distributor(relay: str, state_dir: Path, name: str = "inri", *, bus_address: str | None = None,
                          make_device: DeviceFactory | None = None, lifetime_s: int = 7 * 24 * 3600,
                          task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """`inri distributor`: serve until cancelled."""
    factory: DeviceFactory = make_device or (lambda p: DeviceClient(relay, state_path=p))
    dist = Distributor(state_dir, factory, _NoConnectors(), lifetime_s=lifetime_s)
    ready, stop = threading.Event(), threading.Event()
    token = trio.lowlevel.current_trio_token()
    async with trio.open_nursery() as nursery:
        bus_thread = threading.Thread(target=serve_dbus, args=(dist, name, token, ready, stop, bus_address),
                                      daemon=True, name="inri-dbus")
        bus_thread.start()
        try:
            while not ready.is_set():
                if not bus_thread.is_alive():
                    raise RuntimeError("the D-Bus side did not start (no session bus?)")
                await trio.sleep(0.02)
            await nursery.start(dist.run)
            task_status.started()
            await trio.sleep_forever()
        finally:
            stop.set()
            nursery.cancel_scope.cancel()


class _NoConnectors:
    """Placeholder until the bus is up (the D-Bus side replaces it before taking calls)."""

    async def new_endpoint(self, service: str, token: str, endpoint: str) -> None:
        raise RuntimeError("bus not ready")

    async def message(self, service: str, token: str, body: bytes, msg_id: str) -> None:
        raise RuntimeError("bus not ready")

    async def unregistered(self, service: str, token: str) -> None:
        raise RuntimeError("bus not ready")
