"""`inri distributor`: a UnifiedPush distributor for Linux on the D-Bus session bus (trio, jeepney).

The distributor owns `org.unifiedpush.Distributor.<name>` and serves `org.unifiedpush.Distributor2`
at `/org/unifiedpush/Distributor` (UnifiedPush D-Bus specification DBUS_0.3). Each app registration
(connector token) gets its own INRI device at the home relay (one route key per app subscription, so
two apps' endpoints cannot be linked) and one Web Push endpoint, restricted to the app's VAPID key when
it gives one. Web Push messages arrive over the device's stream; their raw body goes to the app's
`org.unifiedpush.Connector2.Message` and the message is acknowledged at the relay only once that call
has returned (the app's ack). A message the app refused or did not answer is offered again with backoff
while the distributor runs, and the relay re-sends whatever was not acknowledged when the distributor
restarts, so a crash of the app or of the distributor loses nothing.

jeepney's trio layer (`jeepney.io.trio`) is used natively, no thread or second event loop: a
`DBusRouter` matches replies to our calls (NewEndpoint, Message, Unregistered), and one filter on
`type='method_call'` receives every call addressed to us; a dispatcher task answers each in its own task
with `new_method_return` / `new_error`. jeepney's router drops a filtered message when that filter's
channel is full (`send_nowait`), so the dispatcher never blocks on that channel: it hands each call to a
task at once, and past `MAX_CALLS_IN_FLIGHT` answers `LimitsExceeded` itself.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import re
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol

import httpx
import structlog
import trio
from cryptography.hazmat.primitives.asymmetric import ec
from jeepney import (
    DBusAddress,
    HeaderFields,
    MatchRule,
    MessageFlag,
    MessageType,
    new_error,
    new_method_call,
    new_method_return,
)
from jeepney import Message as DBusMessage
from jeepney.bus_messages import message_bus
from jeepney.io.trio import DBusRouter, Proxy, open_dbus_router

from inri.client.credential import _write_private
from inri.client.device import DeviceClient, Message, WebPushEndpoint
from inri.client.errors import ApiError

log = structlog.get_logger("inri.distributor")

DISTRIBUTOR_PATH = "/org/unifiedpush/Distributor"
DISTRIBUTOR_IFACE = "org.unifiedpush.Distributor2"
DISTRIBUTOR_PREFIX = "org.unifiedpush.Distributor."
CONNECTOR_PATH = "/org/unifiedpush/Connector"
CONNECTOR_IFACE = "org.unifiedpush.Connector2"
INTROSPECTABLE_IFACE = "org.freedesktop.DBus.Introspectable"
PEER_IFACE = "org.freedesktop.DBus.Peer"
KIND_WEBPUSH = "webpush"

DEFAULT_LIFETIME_S = 7 * 24 * 3600
TOKEN_MAX_BYTES = 100  # specification: "a string of maximum 100 bytes"
DESCRIPTION_MAX_BYTES = 100
VAPID_KEY_CHARS = 87  # base64url of a 65-byte uncompressed P-256 point
BUS_NAME_MAX = 255
MAX_APPS = 256  # each registration is a device at the home relay: a runaway app must not make thousands
MAX_CALLS_IN_FLIGHT = 64
CALL_QUEUE = 256  # jeepney drops calls past this many waiting for the dispatcher (it never blocks long)
CONNECTOR_TIMEOUT_S = 30.0  # an app that does not answer Message in this time has not acked it
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 60.0  # re-offering a message the app refused, and retrying the relay
# A well-known bus name (D-Bus specification, "Bus names"): two or more elements, none starting with a digit.
_BUS_NAME = re.compile(r"[A-Za-z_-][A-Za-z0-9_-]*(\.[A-Za-z_-][A-Za-z0-9_-]*)+")


class RegisterResult(StrEnum):
    """Values of the `success` key of Register's answer (UnifiedPush D-Bus specification)."""

    SUCCEEDED = "REGISTRATION_SUCCEEDED"
    FAILED = "REGISTRATION_FAILED"


class FailReason(StrEnum):
    """Values of the `reason` key when a registration fails."""

    INTERNAL_ERROR = "INTERNAL_ERROR"  # the relay refused: try again later
    NETWORK = "NETWORK"  # the relay is unreachable: try again when the network is back
    ACTION_REQUIRED = "ACTION_REQUIRED"  # the distributor's registration limit is reached


class DBusError(StrEnum):
    """Error names this distributor answers with (the standard org.freedesktop.DBus ones)."""

    INVALID_ARGS = "org.freedesktop.DBus.Error.InvalidArgs"
    UNKNOWN_METHOD = "org.freedesktop.DBus.Error.UnknownMethod"
    UNKNOWN_INTERFACE = "org.freedesktop.DBus.Error.UnknownInterface"
    UNKNOWN_OBJECT = "org.freedesktop.DBus.Error.UnknownObject"
    LIMITS_EXCEEDED = "org.freedesktop.DBus.Error.LimitsExceeded"
    FAILED = "org.freedesktop.DBus.Error.Failed"


class BadArgs(ValueError):
    """A call's arguments do not follow the specification (answered with InvalidArgs)."""


class ConnectorError(RuntimeError):
    """The app's connector answered a call with an error (or is not on the bus)."""


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
# Failures of a call to the relay that mean "unreachable" (NETWORK), as opposed to a refusal (ApiError).
RELAY_UNREACHABLE = (httpx.HTTPError, OSError, trio.TooSlowError)


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
    expires_at: float = 0.0  # when that registration (and so the endpoint, whose URL embeds it) expires
    description: str | None = None
    # Endpoints replaced by a re-issue, revoked when their registration expires (an app server that has
    # not yet heard of the new endpoint keeps delivering until then): [endpoint_id, revoke_at].
    retired: list[list[Any]] = field(default_factory=list)


class Connectors(Protocol):
    """How the distributor calls the apps' connectors (the D-Bus side, or a test double)."""

    async def new_endpoint(self, service: str, token: str, endpoint: str) -> None: ...
    async def message(self, service: str, token: str, body: bytes, msg_id: str) -> None: ...
    async def unregistered(self, service: str, token: str) -> None: ...


class Distributor:
    """The distributor's logic (trio): app registrations, their INRI devices, messages, refresh."""

    def __init__(self, state_dir: Path, make_device: DeviceFactory, connectors: Connectors, *,
                 lifetime_s: int = DEFAULT_LIFETIME_S, refresh_fraction: float = 0.8,
                 max_apps: int = MAX_APPS, clock: Callable[[], float] = time.time) -> None:
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.make_device = make_device
        self.connectors = connectors
        self.lifetime_s = lifetime_s
        self.refresh_fraction = refresh_fraction  # re-issue the endpoint this far into the lifetime
        self.max_apps = max_apps
        # Unix time: registrations are signed and expire in it, and it is kept in the state file across
        # restarts. Injectable so tests can run the refresh schedule on trio's MockClock.
        self.clock = clock
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
                app = AppRegistration(**d)
                if not app.expires_at:  # a state file written before expires_at was kept
                    app.expires_at = app.registered_at + self.lifetime_s
                self.apps[app.token] = app

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

    def _background(self, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    # -- Register / Unregister ---------------------------------------------------------------------

    async def register(self, service: str, token: str, vapid: str | None = None,
                       description: str | None = None) -> str:
        """Register (or re-register) an app connection at the relay; returns its endpoint.

        The caller answers Register first and then calls `announce(token)`: the specification says
        the distributor must not wait on the connector, and a connector that handles one call at a time
        would otherwise deadlock (it answers NewEndpoint only after its Register returned)."""
        async with self._lock:
            app = self.apps.get(token)
            if app is not None and app.service == service and app.vapid == vapid:
                return app.endpoint  # a valid endpoint exists: the specification says not to mint another
            if app is None and len(self.apps) >= self.max_apps:
                raise RegistrationLimit(f"{self.max_apps} registrations already")
            if app is not None:  # same token, another app or key: start over
                await self._drop(app, revoke=True)
            name = "device-" + hashlib.sha256(token.encode()).hexdigest()[:24] + ".json"
            dev = self._device(token, name)
            try:
                await dev.register(tokens=1, lifetime_s=self.lifetime_s)
                ep = await dev.mint_endpoint(vapid)
            except BaseException as exc:
                # Nothing half-made stays behind (the next Register retries): a device registered at the
                # relay whose endpoint could not be minted is deleted there (best effort) and here.
                if isinstance(exc, Exception) and dev.device_id is not None:
                    with contextlib.suppress(ApiError, *RELAY_UNREACHABLE):
                        await dev.unregister()
                self.devices.pop(token, None)
                (self.state_dir / name).unlink(missing_ok=True)
                raise
            now = self.clock()
            app = AppRegistration(token, service, vapid, ep.endpoint_id, ep.url, now, name,
                                  now + self.lifetime_s, description)
            self.apps[token] = app
            self._save()
            self._start(app)
            log.info("registered", service=service)
            return ep.url

    def announce(self, token: str) -> None:
        """Tell the app its endpoint (NewEndpoint), in the background."""
        app = self.apps.get(token)
        if app is not None:
            self._background(self._notify, "NewEndpoint", self.connectors.new_endpoint, app.service, token,
                             app.endpoint)

    async def unregister(self, token: str) -> AppRegistration | None:
        """Revoke the app's endpoint and delete its device at the relay; returns what was dropped.

        A relay failure raises and keeps the registration (the app may call Unregister again)."""
        async with self._lock:
            app = self.apps.get(token)
            if app is None:
                return None
            await self._drop(app, revoke=True)
            log.info("unregistered", service=app.service)
            return app

    def confirm_unregistered(self, app: AppRegistration) -> None:
        """Tell the app it is unregistered (Unregistered), in the background."""
        self._background(self._notify, "Unregistered", self.connectors.unregistered, app.service, app.token)

    async def _notify(self, what: str, fn: Callable[..., Awaitable[None]], *args: Any) -> None:
        try:
            with trio.fail_after(CONNECTOR_TIMEOUT_S):
                await fn(*args)
        except (ConnectorError, trio.TooSlowError) as exc:  # the app is gone: it re-registers at startup
            log.warning("connector_call_failed", call=what, service=args[0], error=str(exc))

    async def _drop(self, app: AppRegistration, *, revoke: bool) -> None:
        dev = self._device(app.token, app.device_state)
        if revoke:
            for endpoint_id in [app.endpoint_id] + [r[0] for r in app.retired]:
                await dev.revoke_endpoint(endpoint_id)  # senders get 410 at once
            await dev.unregister()
        self.devices.pop(app.token, None)
        self.apps.pop(app.token, None)
        self._save()
        (self.state_dir / app.device_state).unlink(missing_ok=True)
        with trio.CancelScope(shield=True):  # _forward drops its own app: finish before its scope ends
            await dev.aclose()
        scope = self._scopes.pop(app.token, None)
        if scope is not None:
            scope.cancel()  # last: this may be the calling task's own scope

    # -- messages and refresh ----------------------------------------------------------------------

    async def _serve(self, token: str, scope: trio.CancelScope) -> None:
        with scope:
            while token in self.apps:
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._refresh_loop, token)
                        await self._forward(token)
                        nursery.cancel_scope.cancel()  # the device is gone: stop refreshing it too
                except Exception:  # logged (BLE: log.exception): one app's failure must not end the others'
                    log.exception("app_service_failed", token_hash=hashlib.sha256(token.encode()).hexdigest()[:12])
                    await trio.sleep(RETRY_MAX_S)

    async def _forward(self, token: str) -> None:
        app = self.apps[token]
        dev = self._device(token, app.device_state)
        try:
            async with dev.stream(ack=False) as messages:
                async for m in messages:
                    await self._deliver(app, dev, m)
        except ApiError as exc:  # the relay refuses this device's secret: it was deleted there
            log.warning("device_gone", service=app.service, error=str(exc))
            self.confirm_unregistered(app)  # the app must register again (it gets a new endpoint then)
            async with self._lock:
                if self.apps.get(token) is app:
                    await self._drop(app, revoke=False)

    async def _deliver(self, app: AppRegistration, dev: RelayDevice, m: Message) -> None:
        """Offer one message to the app until it acks (Message returns), then ack it at the relay."""
        if m.kind != KIND_WEBPUSH or m.undecryptable or not m.body:
            # Nothing but Web Push is addressed to an app's device, and the specification's push message
            # is 1..4096 bytes: anything else can never be handed over, so it is deleted, not kept.
            log.warning("message_dropped", service=app.service, kind=m.kind, undecryptable=m.undecryptable)
        else:
            delay = RETRY_FIRST_S
            while True:
                try:
                    with trio.fail_after(CONNECTOR_TIMEOUT_S):
                        await self.connectors.message(app.service, app.token, m.body, m.id)
                    break
                except (ConnectorError, trio.TooSlowError) as exc:  # not acked: offer it again later
                    log.warning("connector_message_failed", service=app.service, error=str(exc) or "timeout",
                                retry_in=delay)
                    await trio.sleep(delay)
                    delay = min(RETRY_MAX_S, delay * 2)
        try:
            await dev.ack([m.id])  # the app's call returned: that is its ack
        except (ApiError, *RELAY_UNREACHABLE) as exc:  # the relay re-sends it on reconnect (a repeat)
            log.warning("relay_ack_failed", service=app.service, error=repr(exc))

    def _refresh_due(self, app: AppRegistration) -> float:
        return app.registered_at + (app.expires_at - app.registered_at) * self.refresh_fraction

    async def _refresh_loop(self, token: str) -> None:
        delay = RETRY_FIRST_S
        while True:
            app = self.apps[token]
            due = min([self._refresh_due(app)] + [float(r[1]) for r in app.retired])
            await trio.sleep(max(0.0, due - self.clock()))
            try:
                if self.clock() >= self._refresh_due(app):
                    await self._reissue(token)
                await self._revoke_retired(token)
                delay = RETRY_FIRST_S
            except (ApiError, *RELAY_UNREACHABLE) as exc:  # try again; the endpoint lives until it expires
                log.warning("refresh_failed", service=app.service, error=repr(exc), retry_in=delay)
                await trio.sleep(delay)
                delay = min(RETRY_MAX_S, delay * 2)

    async def _reissue(self, token: str) -> None:
        """Re-sign the registration and hand the app a fresh endpoint (the URL embeds the registration,
        so an endpoint minted under the old one dies with it); the old endpoint is revoked when its
        registration expires, not at once, so app servers not yet told of the new one lose nothing."""
        async with self._lock:
            app = self.apps[token]
            dev = self._device(token, app.device_state)
            await dev.refresh(lifetime_s=self.lifetime_s)
            now = self.clock()
            ep = await dev.mint_endpoint(app.vapid)
            app.retired.append([app.endpoint_id, app.expires_at])
            app.endpoint_id, app.endpoint = ep.endpoint_id, ep.url
            app.registered_at, app.expires_at = now, now + self.lifetime_s
            self._save()
            log.info("endpoint_reissued", service=app.service)
        await self._notify("NewEndpoint", self.connectors.new_endpoint, app.service, token, ep.url)

    async def _revoke_retired(self, token: str) -> None:
        async with self._lock:
            app = self.apps[token]
            dev = self._device(token, app.device_state)
            for r in [r for r in app.retired if float(r[1]) <= self.clock()]:
                await dev.revoke_endpoint(str(r[0]))
                app.retired.remove(r)
                self._save()


class RegistrationLimit(RuntimeError):
    """The distributor already holds `max_apps` registrations (Register answers ACTION_REQUIRED)."""


# -- D-Bus side (jeepney on trio) --------------------------------------------------------------------


def _args(msg: DBusMessage) -> dict[str, tuple[str, Any]]:
    """The one `a{sv}` argument of a Distributor2 call."""
    sig = msg.header.fields.get(HeaderFields.signature, "")
    if sig != "a{sv}":
        raise BadArgs(f"expected one a{{sv}} argument, got signature {sig!r}")
    args: dict[str, tuple[str, Any]] = msg.body[0]
    return args


def _str(args: dict[str, tuple[str, Any]], key: str, *, required: bool, max_bytes: int) -> str | None:
    v = args.get(key)
    if v is None:
        if required:
            raise BadArgs(f"{key!r} is missing")
        return None
    sig, value = v
    if sig != "s":
        raise BadArgs(f"{key!r} must be a string (s), got {sig!r}")
    if len(value.encode()) > max_bytes:
        raise BadArgs(f"{key!r} is longer than {max_bytes} bytes")
    return str(value)


def _check_vapid(key: str) -> None:
    """The specification's VAPID key: 87 base64url characters of an uncompressed P-256 point."""
    try:
        raw = base64.urlsafe_b64decode(key + "=")
        if len(key) != VAPID_KEY_CHARS or not re.fullmatch(r"[A-Za-z0-9_-]+", key):
            raise ValueError("length or alphabet")
        ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), raw)
    except (ValueError, binascii.Error):
        raise BadArgs("'vapid' is not a base64url uncompressed P-256 public key (87 characters)") from None


def _dict(**items: tuple[str, Any]) -> tuple[dict[str, tuple[str, Any]]]:
    return (dict(items),)


def _introspection(path: str) -> str | None:
    """Introspection XML for our object and its ancestors (None: no such object here)."""
    head = ('<!DOCTYPE node PUBLIC "-//freedesktop//DTD D-BUS Object Introspection 1.0//EN" '
            '"http://www.freedesktop.org/standards/dbus/1.0/introspect.dtd">\n')
    if path == DISTRIBUTOR_PATH:
        methods = "".join(f'<method name="{m}"><arg name="args" type="a{{sv}}" direction="in"/>'
                          f'<arg name="res" type="a{{sv}}" direction="out"/></method>'
                          for m in ("Register", "Unregister"))
        return (head + f'<node><interface name="{DISTRIBUTOR_IFACE}">{methods}</interface>'
                f'<interface name="{INTROSPECTABLE_IFACE}"><method name="Introspect">'
                '<arg name="xml" type="s" direction="out"/></method></interface>'
                f'<interface name="{PEER_IFACE}"><method name="Ping"/></interface></node>')
    prefix = path.rstrip("/") + "/"
    if DISTRIBUTOR_PATH.startswith(prefix):
        child = DISTRIBUTOR_PATH[len(prefix):].split("/")[0]
        return head + f'<node><node name="{child}"/></node>'
    return None


class BusServer:
    """The distributor on the bus: serves Distributor2 and calls the apps' Connector2 (`Connectors`)."""

    def __init__(self, router: DBusRouter, name: str) -> None:
        self.router = router
        self.name = DISTRIBUTOR_PREFIX + name
        self.dist: Distributor | None = None
        self._in_flight = 0

    # Connectors: calls to the app. Each waits for the app's answer (its ack), in the caller's task.
    async def _call(self, service: str, member: str, args: dict[str, tuple[str, Any]]) -> None:
        msg = new_method_call(DBusAddress(CONNECTOR_PATH, bus_name=service, interface=CONNECTOR_IFACE), member,
                              "a{sv}", (args,))
        reply = await self.router.send_and_get_reply(msg)
        if reply.header.message_type == MessageType.error:
            name = reply.header.fields.get(HeaderFields.error_name, "?")
            raise ConnectorError(f"{service} {member}: {name}: {reply.body[0] if reply.body else ''}")

    async def new_endpoint(self, service: str, token: str, endpoint: str) -> None:
        await self._call(service, "NewEndpoint", {"token": ("s", token), "endpoint": ("s", endpoint)})

    async def message(self, service: str, token: str, body: bytes, msg_id: str) -> None:
        await self._call(service, "Message", {"token": ("s", token), "message": ("ay", body), "id": ("s", msg_id)})

    async def unregistered(self, service: str, token: str) -> None:
        await self._call(service, "Unregistered", {"token": ("s", token)})

    # Serving calls to us.
    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the bus name and answer every method call addressed to us until cancelled."""
        send, recv = trio.open_memory_channel[DBusMessage](CALL_QUEUE)
        # The filter is in place before the name is ours: no call can arrive unseen. It stays registered
        # for the router's lifetime (the router closes `send` when it stops, which ends the loop below):
        # jeepney 0.9's trio router iterates its filters across a checkpoint while stopping, so removing
        # one as both are cancelled together raises "dictionary changed size during iteration" there.
        self.router.filter(MatchRule(type="method_call"), channel=send)
        async with trio.open_nursery() as nursery:
            # DO_NOT_QUEUE (4): fail now if another process owns the name, rather than wait in line.
            (code,) = await Proxy(message_bus, self.router).RequestName(self.name, 4)
            if code != 1:  # 1 = primary owner
                raise RuntimeError(f"{self.name} is owned by another process on this bus")
            log.info("bus_name_owned", name=self.name)
            task_status.started()
            async for msg in recv:
                if self._in_flight >= MAX_CALLS_IN_FLIGHT:
                    await self._send(msg, new_error(msg, DBusError.LIMITS_EXCEEDED.value, "s",
                                                    ("too many calls in progress; try again",)))
                    continue
                self._in_flight += 1
                nursery.start_soon(self._handle, msg)
        raise RuntimeError("the session bus connection closed")

    async def _send(self, call: DBusMessage, reply: DBusMessage) -> None:
        if call.header.flags & MessageFlag.no_reply_expected:
            return
        try:
            await self.router.send(reply)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:  # the bus is gone: the router ends us
            log.warning("reply_failed", error=repr(exc))

    async def _handle(self, msg: DBusMessage) -> None:
        after: Callable[[], None] | None = None
        try:
            reply, after = await self._dispatch(msg)
        except BadArgs as exc:
            reply = new_error(msg, DBusError.INVALID_ARGS.value, "s", (str(exc),))
        except Exception as exc:  # logged: one failing call must never end the daemon
            log.exception("call_failed", member=msg.header.fields.get(HeaderFields.member))
            reply = new_error(msg, DBusError.FAILED.value, "s", (f"internal error: {type(exc).__name__}",))
        finally:
            self._in_flight -= 1
        await self._send(msg, reply)
        if after is not None:
            after()  # after the reply: NewEndpoint / Unregistered reach the app once its call returned

    async def _dispatch(self, msg: DBusMessage) -> tuple[DBusMessage, Callable[[], None] | None]:
        f = msg.header.fields
        path, iface, member = f.get(HeaderFields.path), f.get(HeaderFields.interface), f.get(HeaderFields.member)
        xml = _introspection(str(path))
        if xml is None:
            return new_error(msg, DBusError.UNKNOWN_OBJECT.value, "s", (f"no object at {path}",)), None
        if iface in (INTROSPECTABLE_IFACE, None) and member == "Introspect":
            return new_method_return(msg, "s", (xml,)), None
        if iface in (PEER_IFACE, None) and member == "Ping":
            return new_method_return(msg), None
        if path == DISTRIBUTOR_PATH and iface in (DISTRIBUTOR_IFACE, None):
            if member == "Register":
                return await self._register(msg)
            if member == "Unregister":
                return await self._unregister(msg)
            return new_error(msg, DBusError.UNKNOWN_METHOD.value, "s", (f"no method {member} in {iface}",)), None
        if iface not in (DISTRIBUTOR_IFACE, INTROSPECTABLE_IFACE, PEER_IFACE):
            return new_error(msg, DBusError.UNKNOWN_INTERFACE.value, "s", (f"no interface {iface} at {path}",)), None
        return new_error(msg, DBusError.UNKNOWN_METHOD.value, "s", (f"no method {member} in {iface}",)), None

    async def _register(self, msg: DBusMessage) -> tuple[DBusMessage, Callable[[], None] | None]:
        assert self.dist is not None
        args = _args(msg)
        token = _str(args, "token", required=True, max_bytes=TOKEN_MAX_BYTES)
        service = _str(args, "service", required=True, max_bytes=BUS_NAME_MAX)
        description = _str(args, "description", required=False, max_bytes=DESCRIPTION_MAX_BYTES)
        vapid = _str(args, "vapid", required=False, max_bytes=VAPID_KEY_CHARS * 4) or None  # "" = none given
        assert token is not None and service is not None
        if not token:
            raise BadArgs("'token' is empty")
        if not _BUS_NAME.fullmatch(service):
            raise BadArgs(f"'service' is not a well-known bus name: {service!r}")
        if vapid is not None:
            _check_vapid(vapid)
        try:
            await self.dist.register(service, token, vapid, description)
        except RegistrationLimit as exc:
            log.warning("register_refused", service=service, error=str(exc))
            return self._failed(msg, FailReason.ACTION_REQUIRED), None
        except ApiError as exc:  # the relay refused (overloaded, limits): the app may retry later
            log.warning("register_failed", service=service, error=str(exc))
            return self._failed(msg, FailReason.INTERNAL_ERROR), None
        except RELAY_UNREACHABLE as exc:
            log.warning("register_failed", service=service, error=repr(exc))
            return self._failed(msg, FailReason.NETWORK), None
        dist = self.dist
        return (new_method_return(msg, "a{sv}", _dict(success=("s", RegisterResult.SUCCEEDED.value))),
                lambda: dist.announce(token))

    @staticmethod
    def _failed(msg: DBusMessage, reason: FailReason) -> DBusMessage:
        return new_method_return(msg, "a{sv}", _dict(success=("s", RegisterResult.FAILED.value),
                                                     reason=("s", reason.value)))

    async def _unregister(self, msg: DBusMessage) -> tuple[DBusMessage, Callable[[], None] | None]:
        assert self.dist is not None
        token = _str(_args(msg), "token", required=True, max_bytes=TOKEN_MAX_BYTES)
        assert token is not None
        try:
            app = await self.dist.unregister(token)
        except (ApiError, *RELAY_UNREACHABLE) as exc:  # kept: deleting it locally would strand the endpoint
            log.warning("unregister_failed", error=repr(exc))
            return new_error(msg, DBusError.FAILED.value, "s",
                             (f"the home relay did not delete the registration ({type(exc).__name__}); "
                              "it is kept: call Unregister again later",)), None
        dist = self.dist
        return new_method_return(msg, "a{sv}", ({},)), (None if app is None else lambda: dist.confirm_unregistered(app))


async def run_distributor(relay: str, state_dir: Path, name: str = "inri", *, bus_address: str | None = None,
                          make_device: DeviceFactory | None = None, lifetime_s: int = DEFAULT_LIFETIME_S,
                          max_apps: int = MAX_APPS,
                          task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """`inri distributor`: serve until cancelled (or until the bus connection ends, which raises).

    `bus_address` defaults to the session bus ($DBUS_SESSION_BUS_ADDRESS)."""
    factory: DeviceFactory = make_device or (lambda p: DeviceClient(relay, state_path=p))
    async with open_dbus_router(bus_address or "SESSION") as router:
        server = BusServer(router, name)
        dist = Distributor(state_dir, factory, server, lifetime_s=lifetime_s, max_apps=max_apps)
        server.dist = dist
        async with trio.open_nursery() as nursery:
            await nursery.start(dist.run)  # resumes the stored registrations (unacked messages come again)
            await nursery.start(server.serve)
            task_status.started()
