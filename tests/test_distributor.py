"""`inri distributor` over a real D-Bus session bus (a private dbus-daemon started here) with a test
UnifiedPush connector on the bus (jeepney, trio), against a fake relay device: the D-Bus protocol side
(Register/Unregister, error replies, call order, ack only after the app's answer). The relay end-to-end
tests are in test_distributor_e2e.py."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from inri.client.device import Message, WebPushEndpoint
from inri.client.errors import ApiError

pytestmark = pytest.mark.integration  # starts a dbus-daemon
jeepney = pytest.importorskip("jeepney", reason="jeepney missing: pip install 'inri[distributor]'")
from jeepney import (  # noqa: E402
    DBusAddress,
    HeaderFields,
    MatchRule,
    MessageType,
    new_error,
    new_method_call,
    new_method_return,
)
from jeepney import Message as DBusMessage  # noqa: E402
from jeepney.bus_messages import message_bus  # noqa: E402
from jeepney.io.trio import DBusRouter, Proxy, open_dbus_router  # noqa: E402

from inri.client.distributor import (  # noqa: E402
    CONNECTOR_PATH,
    DISTRIBUTOR_IFACE,
    DISTRIBUTOR_PATH,
    DISTRIBUTOR_PREFIX,
    Distributor,
    run_distributor,
)

APP = "org.example.InriTestApp"
VAPID = "BNcRdreALRFXTkOOUHK1EtK2wtaz5Ry4YfYCA_0QTpQtUbVlUls0VJXg7A8u-Ts1XbjhazAkj7I99e8QcYP7DkM"
ACK, REFUSE, HOLD = "ack", "refuse", "hold"  # how the test connector answers a Message call


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


class Connector:
    """A UnifiedPush app on the bus, as the specification describes it: owns its service name, serves
    org.unifiedpush.Connector2 at /org/unifiedpush/Connector, and records each call it gets."""

    def __init__(self, router: DBusRouter, name: str = APP) -> None:
        self.router, self.name = router, name
        self.events: trio.MemoryReceiveChannel[tuple[str, dict[str, Any]]]
        self._events, self.events = trio.open_memory_channel[tuple[str, dict[str, Any]]](100)
        self.message_modes: list[str | trio.Event] = []  # per Message call, in order; ACK when empty
        # (what, message id) as the app answers Message, appended just before the answer is sent; a test
        # may share this list with FakeRelay.log to see the order of answers and acks at the relay
        self.log: list[tuple[str, str]] = []
        self.new_endpoint_gate: trio.Event | None = None  # NewEndpoint answered only once this is set

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        send, recv = trio.open_memory_channel[DBusMessage](100)
        # registered for the router's lifetime (see BusServer.serve: jeepney 0.9 cannot remove a filter
        # while the router stops)
        self.router.filter(MatchRule(type="method_call", path=CONNECTOR_PATH), channel=send)
        async with trio.open_nursery() as nursery:
            (code,) = await Proxy(message_bus, self.router).RequestName(self.name, 4)
            assert code == 1
            task_status.started()
            async for msg in recv:
                nursery.start_soon(self._handle, msg)

    async def _handle(self, msg: DBusMessage) -> None:
        member = msg.header.fields[HeaderFields.member]
        args = {k: v[1] for k, v in msg.body[0].items()}
        await self._events.send((member, args))
        if member == "NewEndpoint" and self.new_endpoint_gate is not None:
            await self.new_endpoint_gate.wait()
        if member == "Message":
            mode = self.message_modes.pop(0) if self.message_modes else ACK
            if mode == HOLD:
                return  # never answers: the message is not acked
            if mode == REFUSE:
                self.log.append(("refused", args.get("id", "")))
                await self.router.send(new_error(msg, "org.example.Error.Busy", "s", ("not now",)))
                return
            if isinstance(mode, trio.Event):
                await mode.wait()
            self.log.append(("answered", args.get("id", "")))
            await self.router.send(new_method_return(msg, "a{sv}", ({"id": ("s", args.get("id", ""))},)))
            return
        await self.router.send(new_method_return(msg, "a{sv}", ({},)))

    async def next_event(self, timeout: float = 15.0) -> tuple[str, dict[str, Any]]:
        with trio.fail_after(timeout):
            return await self.events.receive()

    async def call(self, member: str, args: dict[str, Any] | None = None, *, signature: str = "a{sv}",
                   body: tuple[Any, ...] | None = None, name: str = "inri", path: str = DISTRIBUTOR_PATH,
                   interface: str | None = DISTRIBUTOR_IFACE, timeout: float = 20.0) -> DBusMessage:
        """Call the distributor; returns the reply message (a method return or an error)."""
        if body is None:
            body = ({k: ("s", v) for k, v in (args or {}).items()},)
        msg = new_method_call(DBusAddress(path, bus_name=DISTRIBUTOR_PREFIX + name, interface=interface), member,
                              signature, body)
        with trio.fail_after(timeout):
            reply: DBusMessage = await self.router.send_and_get_reply(msg)
        return reply


def answer(reply: DBusMessage) -> dict[str, Any]:
    """A method return's a{sv}, unwrapped (fails on an error reply)."""
    assert reply.header.message_type == MessageType.method_return, (reply.header.fields, reply.body)
    return {k: v[1] for k, v in reply.body[0].items()}


def error_name(reply: DBusMessage) -> str:
    assert reply.header.message_type == MessageType.error, reply.body
    return str(reply.header.fields[HeaderFields.error_name])


@asynccontextmanager
async def open_connector(address: str, name: str = APP) -> AsyncIterator[Connector]:
    async with open_dbus_router(address) as router, trio.open_nursery() as nursery:
        conn = Connector(router, name)
        await nursery.start(conn.serve)
        yield conn
        nursery.cancel_scope.cancel()


async def name_owned(router: DBusRouter, name: str) -> bool:
    (has,) = await Proxy(message_bus, router).NameHasOwner(name)
    return bool(has)


class FakeDevice:
    """A relay device double: records what the distributor asks of the relay."""

    def __init__(self, relay: FakeRelay, path: Path) -> None:
        self.relay, self.path = relay, path
        self.device_id: str | None = None
        self.inbox: trio.MemorySendChannel[Message]
        self._recv: trio.MemoryReceiveChannel[Message]
        self.inbox, self._recv = trio.open_memory_channel[Message](10)

    async def register(self, tokens: int = 50, lifetime_s: int = 0) -> str:
        if self.relay.unreachable:
            raise httpx.ConnectError("relay down")
        self.relay.record("register", str(self.path))
        self.device_id = f"dev{len(self.relay.devices)}"
        return self.device_id

    async def refresh(self, lifetime_s: int = 0) -> int:
        self.relay.record("refresh", str(self.path))
        return 2

    async def unregister(self) -> None:
        self.relay.record("unregister", str(self.path))

    async def mint_endpoint(self, vapid_key: str | None = None) -> WebPushEndpoint:
        n = sum(1 for c in self.relay.calls if c[0] == "mint")
        self.relay.record("mint", vapid_key or "")
        return WebPushEndpoint(f"e{n}", f"https://relay.test/wp/v1/R/E{n}", vapid_key is not None, vapid_key)

    async def revoke_endpoint(self, endpoint_id: str) -> None:
        self.relay.record("revoke", endpoint_id)

    async def ack(self, ids: list[str]) -> int:
        self.relay.acked.extend(ids)
        self.relay.log.extend(("acked", i) for i in ids)
        return len(ids)

    @asynccontextmanager
    async def stream(self, *, ack: bool = True) -> AsyncIterator[trio.MemoryReceiveChannel[Message]]:
        assert not ack, "the distributor must ack only after the app's call returned"
        if self.relay.deleted:  # what DeviceClient.stream raises when the relay refuses the device's secret
            raise ApiError("bad_credentials", 401, "stream refused the device secret")
        yield self._recv

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()  # as DeviceClient.aclose, which awaits its HTTP client's close


class FakeRelay:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.timed: list[tuple[float, str, str]] = []  # the calls, each with trio's time when it was made
        self.acked: list[str] = []
        self.log: list[tuple[str, str]] = []  # ("acked", id) per message acked (see Connector.log)
        self.devices: list[FakeDevice] = []
        self.unreachable = False
        self.deleted = False  # the devices were deleted at the relay (their streams are refused)

    def record(self, kind: str, arg: str) -> None:
        self.calls.append((kind, arg))
        self.timed.append((trio.current_time(), kind, arg))

    def make(self, path: Path) -> FakeDevice:
        d = FakeDevice(self, path)
        self.devices.append(d)
        return d


def webpush(msg_id: str, body: bytes) -> Message:
    return Message(msg_id, b"", 1.0, kind="webpush", body=body, encoding="aes128gcm")


@asynccontextmanager
async def distributor(bus: str, state: Path, relay: FakeRelay, **kw: Any) -> AsyncIterator[None]:
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_distributor(
            "http://unused", state, "inri", bus_address=bus, make_device=relay.make, task_status=task_status, **kw))
        yield
        nursery.cancel_scope.cancel()


async def _wait(pred: Any, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.02)


async def test_register_message_ack_unregister(bus_address: str, tmp_path: Path) -> None:
    relay, state = FakeRelay(), tmp_path / "state"
    async with open_connector(bus_address) as app, distributor(bus_address, state, relay):
        # Register: success, a restricted endpoint minted with the app's VAPID key, NewEndpoint to the app
        reply = await app.call("Register", {"service": APP, "token": "tok-1", "vapid": VAPID,
                                            "description": "test account"})
        assert answer(reply) == {"success": "REGISTRATION_SUCCEEDED"}
        assert await app.next_event() == ("NewEndpoint", {"token": "tok-1", "endpoint": "https://relay.test/wp/v1/R/E0"})
        assert ("mint", VAPID) in relay.calls
        # Register again with the same token: the same endpoint again (NewEndpoint, as the spec says), nothing minted
        assert answer(await app.call("Register", {"service": APP, "token": "tok-1", "vapid": VAPID}))["success"] \
            == "REGISTRATION_SUCCEEDED"
        assert (await app.next_event())[1]["endpoint"] == "https://relay.test/wp/v1/R/E0"
        assert sum(1 for c in relay.calls if c[0] == "mint") == 1
        # A Web Push message: the raw body reaches the app byte for byte, acked only after the app answered
        body = bytes(range(256)) * 3
        release = trio.Event()
        app.message_modes.append(release)
        relay.log = app.log  # one list: the app's answers and the relay's acks, in the order they happen
        await relay.devices[0].inbox.send(webpush("m1", body))
        kind, ev = await app.next_event()
        assert kind == "Message" and ev == {"token": "tok-1", "message": body, "id": "m1"}
        # The distributor (in this process) has run as far as it can: it waits for the app's answer.
        await trio.testing.wait_all_tasks_blocked()
        assert relay.acked == []  # the app has not answered Message yet
        release.set()
        await _wait(lambda: relay.acked == ["m1"])
        assert app.log == [("answered", "m1"), ("acked", "m1")]
        # Unregister: the endpoint is revoked, the device unregistered, the app told
        assert answer(await app.call("Unregister", {"token": "tok-1"})) == {}
        assert ("revoke", "e0") in relay.calls and ("unregister", str(state / relay.devices[0].path.name)) \
            in relay.calls
        assert (await app.next_event()) == ("Unregistered", {"token": "tok-1"})
        # an unknown token: an empty answer, nothing else
        assert answer(await app.call("Unregister", {"token": "never-registered"})) == {}


async def test_register_answers_before_new_endpoint_so_a_one_call_at_a_time_app_never_deadlocks(
        bus_address: str, tmp_path: Path) -> None:
    """The spec: callers of Connector2 methods MUST NOT wait for their answer. An app that answers
    NewEndpoint only after its own Register call returned must get both."""
    relay = FakeRelay()
    async with open_connector(bus_address) as app, distributor(bus_address, tmp_path / "s", relay):
        app.new_endpoint_gate = trio.Event()
        reply = await app.call("Register", {"service": APP, "token": "tok-d"}, timeout=10)
        assert answer(reply) == {"success": "REGISTRATION_SUCCEEDED"}
        app.new_endpoint_gate.set()
        assert (await app.next_event())[0] == "NewEndpoint"


async def test_malformed_calls_get_error_replies_and_the_distributor_stays_up(bus_address: str,
                                                                              tmp_path: Path) -> None:
    relay = FakeRelay()
    invalid = "org.freedesktop.DBus.Error.InvalidArgs"
    async with open_connector(bus_address) as app, distributor(bus_address, tmp_path / "s", relay):
        cases: list[tuple[str, dict[str, Any]]] = [
            ("Register", {"service": APP}),  # no token
            ("Register", {"token": "t"}),  # no service
            ("Register", {"service": APP, "token": ""}),
            ("Register", {"service": APP, "token": "x" * 101}),  # over 100 bytes
            ("Register", {"service": "not a bus name", "token": "t"}),
            ("Register", {"service": APP, "token": "t", "vapid": "short"}),
            ("Register", {"service": APP, "token": "t", "vapid": "B" + "A" * 86}),  # 87 chars, not a P-256 point
            ("Register", {"service": APP, "token": "t", "description": "d" * 101}),
            ("Unregister", {}),
        ]
        for member, args in cases:
            assert error_name(await app.call(member, args)) == invalid, (member, args)
        # wrong argument types and signatures
        assert error_name(await app.call("Register", body=({"service": ("s", APP), "token": ("u", 7)},))) == invalid
        assert error_name(await app.call("Register", signature="s", body=("tok",))) == invalid
        assert error_name(await app.call("Register", signature="", body=())) == invalid
        # unknown members, interfaces and objects
        assert error_name(await app.call("Frobnicate", {})) == "org.freedesktop.DBus.Error.UnknownMethod"
        assert error_name(await app.call("Register", {}, interface="org.example.Nope")) \
            == "org.freedesktop.DBus.Error.UnknownInterface"
        assert error_name(await app.call("Register", {}, path="/nope")) == "org.freedesktop.DBus.Error.UnknownObject"
        # introspection and ping answer
        xml = await app.call("Introspect", interface="org.freedesktop.DBus.Introspectable", signature="", body=())
        assert DISTRIBUTOR_IFACE in xml.body[0]
        assert (await app.call("Ping", interface="org.freedesktop.DBus.Peer", signature="", body=())) \
            .header.message_type == MessageType.method_return
        # nothing reached the relay, and a good call still works
        assert relay.calls == []
        ok = await app.call("Register", {"service": APP, "token": "ok"})
        assert answer(ok)["success"] == "REGISTRATION_SUCCEEDED"
        # the relay unreachable: REGISTRATION_FAILED with reason NETWORK, and the distributor stays up
        relay.unreachable = True
        assert answer(await app.call("Register", {"service": APP, "token": "t2"})) == {
            "success": "REGISTRATION_FAILED", "reason": "NETWORK"}
        kept = json.loads((tmp_path / "s" / "registrations.json").read_text())
        assert [a["token"] for a in kept] == ["ok"]  # nothing half-made is kept
        relay.unreachable = False
        ok = await app.call("Register", {"service": APP, "token": "t2"})
        assert answer(ok)["success"] == "REGISTRATION_SUCCEEDED"


async def test_a_refused_message_is_offered_again_and_acked_only_when_the_app_acks(bus_address: str,
                                                                                   tmp_path: Path) -> None:
    relay = FakeRelay()
    async with open_connector(bus_address) as app, distributor(bus_address, tmp_path / "s", relay):
        await app.call("Register", {"service": APP, "token": "tok-r"})
        assert (await app.next_event())[0] == "NewEndpoint"
        app.message_modes += [REFUSE, ACK]
        relay.log = app.log  # one list: the app's answers and the relay's acks, in the order they happen
        await relay.devices[0].inbox.send(webpush("m7", b"\x01\x02payload"))
        assert await app.next_event() == ("Message", {"token": "tok-r", "message": b"\x01\x02payload", "id": "m7"})
        # What follows the refusal: the message offered again (an ack here would come before that).
        await _wait(lambda: len(app.log) >= 2)
        assert app.log[:2] == [("refused", "m7"), ("answered", "m7")]  # refused: not acked, offered again
        assert await app.next_event() == ("Message", {"token": "tok-r", "message": b"\x01\x02payload", "id": "m7"})
        await _wait(lambda: relay.acked == ["m7"])
        assert app.log == [("refused", "m7"), ("answered", "m7"), ("acked", "m7")]


async def test_state_survives_restart_and_refresh_reissues(bus_address: str, tmp_path: Path) -> None:
    relay, state = FakeRelay(), tmp_path / "state"
    async with open_connector(bus_address) as app:
        async with distributor(bus_address, state, relay, lifetime_s=4):  # re-issue due 3.2 s from now
            await app.call("Register", {"service": APP, "token": "tok-2"})
            assert (await app.next_event())[1]["endpoint"].endswith("E0")
        async with open_dbus_router(bus_address) as probe:
            await _wait_async(lambda: name_owned(probe, DISTRIBUTOR_PREFIX + "inri"), False)
        # restart: the registration is remembered (no new device), and the refresh, due 80% into its
        # lifetime, re-signs it and hands the app a new endpoint; the old one is revoked at its expiry
        async with distributor(bus_address, state, relay, lifetime_s=4):
            kind, ev = await app.next_event()
            assert (kind, ev) == ("NewEndpoint", {"token": "tok-2", "endpoint": "https://relay.test/wp/v1/R/E1"})
            assert ("refresh", str(state / relay.devices[-1].path.name)) in relay.calls
            await _wait(lambda: ("revoke", "e0") in relay.calls)
            assert [c[0] for c in relay.calls].count("register") == 1  # the restart registered nothing new


class MemConnectors:
    """The apps' side without D-Bus: each call the distributor makes, with trio's time when it was made."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str, str, str]] = []

    async def new_endpoint(self, service: str, token: str, endpoint: str) -> None:
        self.calls.append((trio.current_time(), "NewEndpoint", token, endpoint))

    async def message(self, service: str, token: str, body: bytes, msg_id: str) -> None:
        self.calls.append((trio.current_time(), "Message", token, msg_id))

    async def unregistered(self, service: str, token: str) -> None:
        self.calls.append((trio.current_time(), "Unregistered", token, ""))


async def test_reissue_at_80_percent_and_revoke_at_expiry_on_a_mock_clock(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    """The refresh schedule to the second, in virtual time: each registration (lifetime 100 s) is
    re-signed and its endpoint re-issued 80 s into its lifetime; the endpoint it replaced keeps working
    until its own registration expires, and is revoked then, not at the re-issue."""
    relay, apps, wall = FakeRelay(), MemConnectors(), 1_700_000_000.0
    dist = Distributor(tmp_path / "s", relay.make, apps, lifetime_s=100,
                       clock=lambda: wall + trio.current_time())
    async with trio.open_nursery() as n:
        await n.start(dist.run)
        start = trio.current_time()
        assert await dist.register(APP, "tok", VAPID) == "https://relay.test/wp/v1/R/E0"
        dist.announce("tok")
        await trio.sleep(250)
        n.cancel_scope.cancel()
    dev = str(tmp_path / "s" / relay.devices[0].path.name)
    at = [(round(t - start, 6), kind, arg) for t, kind, arg in relay.timed]
    assert at == [(0, "register", dev), (0, "mint", VAPID),
                  (80, "refresh", dev), (80, "mint", VAPID), (100, "revoke", "e0"),
                  (160, "refresh", dev), (160, "mint", VAPID), (180, "revoke", "e1"),
                  (240, "refresh", dev), (240, "mint", VAPID)]
    assert [(round(t - start, 6), kind, ep) for t, kind, _, ep in apps.calls] == [
        (80 * k, "NewEndpoint", f"https://relay.test/wp/v1/R/E{k}") for k in range(4)]


async def test_registration_limit_and_a_device_deleted_at_the_relay(bus_address: str, tmp_path: Path) -> None:
    relay, state = FakeRelay(), tmp_path / "state"
    async with open_connector(bus_address) as app:
        async with distributor(bus_address, state, relay, max_apps=1):
            assert answer(await app.call("Register", {"service": APP, "token": "one"}))["success"] \
                == "REGISTRATION_SUCCEEDED"
            assert (await app.next_event())[0] == "NewEndpoint"
            # the limit reached: ACTION_REQUIRED (the specification's reason for it), nothing made at the relay
            assert answer(await app.call("Register", {"service": APP, "token": "two"})) == {
                "success": "REGISTRATION_FAILED", "reason": "ACTION_REQUIRED"}
            assert [c[0] for c in relay.calls].count("register") == 1
        # the device was deleted at the relay meanwhile: on restart its stream is refused, the app is told
        # it is unregistered, the registration is forgotten, and the distributor goes on serving
        relay.deleted = True
        async with distributor(bus_address, state, relay, max_apps=1):
            assert await app.next_event() == ("Unregistered", {"token": "one"})
            await _wait(lambda: json.loads((state / "registrations.json").read_text()) == [])
            relay.deleted = False
            assert answer(await app.call("Register", {"service": APP, "token": "two"}))["success"] \
                == "REGISTRATION_SUCCEEDED"


async def _wait_async(pred: Any, want: bool, timeout: float = 10.0) -> None:
    with trio.fail_after(timeout):
        while await pred() != want:
            await trio.sleep(0.02)


def test_the_systemd_user_unit_verifies(tmp_path: Path) -> None:
    """deploy/systemd/inri-distributor.service (docs/unifiedpush.md) is a valid user unit that waits for the
    bus name, restarts on failure and keeps its state private."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package)")
    unit = Path(__file__).resolve().parent.parent / "deploy" / "systemd" / "inri-distributor.service"
    text = unit.read_text()
    for option in ("Type=dbus", "BusName=org.unifiedpush.Distributor.inri", "Restart=on-failure",
                   "StateDirectory=inri-distributor", "StateDirectoryMode=0700", "--state-dir %S/inri-distributor"):
        assert option in text
    home, run = tmp_path / "home", tmp_path / "run"
    (home / ".local" / "bin").mkdir(parents=True)
    run.mkdir(mode=0o700)
    (home / ".local" / "bin" / "inri").write_text("#!/bin/sh\n")  # verify checks that ExecStart exists
    (home / ".local" / "bin" / "inri").chmod(0o755)
    proc = subprocess.run(["systemd-analyze", "--user", "verify", str(unit)], capture_output=True, text=True,
                          env={"HOME": str(home), "XDG_RUNTIME_DIR": str(run), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr  # it only warns on a bad directive
