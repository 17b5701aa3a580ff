"""The issue's D-Bus distributor acceptance tests, end to end: real relay processes (`inri mesh up`, a
bootstrap and 5 relays), `inri distributor` as its own process on a private session bus, and a test
UnifiedPush connector (jeepney, trio) that registers, gets its endpoint, receives a pywebpush push
entered at the relay farthest from home with the exact bytes pywebpush sent, and acks it. Also: the
relay keeps the message until the app answers; a killed distributor redelivers what was not acked and
its app's endpoint still works after the restart; an endpoint is re-issued before its registration
expires."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import http_ece
import pytest
import requests
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from py_vapid import Vapid02
from pywebpush import WebPushException, webpush

from inri import mesh
from inri.client import DeviceClient
from inri.client.credential import b64d
from inri.client.distributor import DISTRIBUTOR_PREFIX
from inri.protocol.codec import decode_registration
from tests.test_distributor import (
    ACK,
    APP,
    HOLD,
    Connector,
    answer,
    bus_address,  # noqa: F401  (a fixture)
    name_owned,
    open_connector,
)
from tests.test_relay_mesh import distances, graph, relay, wait_route

pytestmark = pytest.mark.integration
NAME = "inrie2e"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class Subscriber:
    """What a UnifiedPush connector keeps for RFC 8291: its P-256 key pair and auth secret."""

    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.auth = os.urandom(16)
        self.p256dh = self.key.public_key().public_bytes(serialization.Encoding.X962,
                                                         serialization.PublicFormat.UncompressedPoint)

    def info(self, url: str) -> dict[str, Any]:
        return {"endpoint": url, "keys": {"p256dh": b64(self.p256dh), "auth": b64(self.auth)}}

    def decrypt(self, body: bytes) -> bytes:
        return bytes(http_ece.decrypt(body, private_key=self.key, auth_secret=self.auth, version="aes128gcm"))


class Sender:
    """An application server: its VAPID key (py-vapid), and a requests session that records the exact
    bytes pywebpush POSTs (the raw body the app must get)."""

    def __init__(self) -> None:
        self.vapid = Vapid02()
        self.vapid.generate_keys()
        self.public = b64(self.vapid.public_key.public_bytes(serialization.Encoding.X962,
                                                             serialization.PublicFormat.UncompressedPoint))
        self.sent: list[bytes] = []
        sent = self.sent

        class Recording(requests.Session):
            def post(self, url: Any, data: Any = None, **kw: Any) -> requests.Response:  # type: ignore[override]
                sent.append(bytes(data))
                return super().post(url, data=data, **kw)

        self.session = Recording()

    async def push(self, sub: Subscriber, url: str, plaintext: bytes) -> int:
        """pywebpush's webpush() to url; returns the HTTP status."""
        def go() -> int:
            try:
                r = webpush(sub.info(url), plaintext, vapid_private_key=self.vapid,
                            vapid_claims={"sub": "mailto:ops@example.org"}, ttl=300, requests_session=self.session)
            except WebPushException as exc:
                assert exc.response is not None
                return int(exc.response.status_code)
            return int(r.status_code)
        return await trio.to_thread.run_sync(go)


def origin(url: str) -> str:
    return "/".join(url.split("/")[:3])


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("distmesh")
    info = mesh.up(d, relays=5, bootstraps=1, timeout_s=120, min_neighbours=1)
    try:
        dist = distances(graph(info), "R1")
        far = max(sorted(dist), key=lambda n: dist[n])
        info.update(home=relay(info, "R1")["api"], far=relay(info, far)["api"])
        yield info
    finally:
        mesh.down(d)


class DistributorProcess:
    """`inri distributor` as a user runs it, on the test's bus ($DBUS_SESSION_BUS_ADDRESS)."""

    def __init__(self, bus: str, relay_api: str, state: Path, *extra: str) -> None:
        self.args = [sys.executable, "-m", "inri.cli", "distributor", "--relay", relay_api, "--state-dir",
                     str(state), "--name", NAME, *extra]
        self.env = {**os.environ, "DBUS_SESSION_BUS_ADDRESS": bus}
        self.log = state.parent / f"{state.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    async def start(self, conn: Connector) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.args, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        with trio.fail_after(30):  # ready once it owns its bus name
            while not await name_owned(conn.router, DISTRIBUTOR_PREFIX + NAME):
                assert self.proc.poll() is None, self.log.read_text()
                await trio.sleep(0.05)

    async def kill(self, conn: Connector) -> None:
        """kill -9: no clean shutdown at all."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)
        with trio.fail_after(10):
            while await name_owned(conn.router, DISTRIBUTOR_PREFIX + NAME):
                await trio.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


@asynccontextmanager
async def running(bus: str, lab: dict[str, Any], state: Path, *extra: str) -> AsyncIterator[
        tuple[Connector, DistributorProcess]]:
    async with open_connector(bus) as conn:
        proc = DistributorProcess(bus, lab["home"], state, *extra)
        try:
            await proc.start(conn)
            yield conn, proc
        finally:
            proc.stop()


async def register(conn: Connector, token: str, vapid: str) -> str:
    reply = await conn.call("Register", {"service": APP, "token": token, "vapid": vapid}, name=NAME, timeout=30)
    assert answer(reply) == {"success": "REGISTRATION_SUCCEEDED"}
    kind, ev = await conn.next_event(30)
    assert kind == "NewEndpoint" and ev["token"] == token
    return str(ev["endpoint"])


def at(endpoint: str, api: str) -> str:
    """The same endpoint entered at another relay (every relay answers /wp/...)."""
    return api + endpoint[len(origin(endpoint)):]


async def pending(state: Path) -> list[str]:
    """Ids of what the home relay still holds for the app's device (pull does not ack)."""
    async with DeviceClient.from_state(next(state.glob("device-*.json"))) as dev:
        return [m.id for m in await dev.pull()]


async def test_connector_gets_endpoint_and_the_exact_pywebpush_body_acked_only_once_it_answers(
        lab: dict[str, Any], bus_address: str, tmp_path: Path) -> None:  # noqa: F811
    state, sub, sender = tmp_path / "dist", Subscriber(), Sender()
    async with running(bus_address, lab, state) as (conn, _):
        endpoint = await register(conn, "app-1", sender.public)
        assert origin(endpoint) == lab["home"] and "/wp/v1/" in endpoint
        await wait_route(lab["far"])
        release = trio.Event()
        conn.message_modes.append(release)  # the app takes its time before answering Message
        plaintext = b"\x00UnifiedPush through INRI \xff" * 20
        assert await sender.push(sub, at(endpoint, lab["far"]), plaintext) == 201
        kind, ev = await conn.next_event(30)
        assert kind == "Message" and ev["token"] == "app-1" and ev["id"]
        assert bytes(ev["message"]) == sender.sent[-1]  # the raw body pywebpush POSTed, byte for byte
        assert sub.decrypt(bytes(ev["message"])) == plaintext
        assert await pending(state) == [ev["id"]]  # not acked while the app has not answered
        release.set()
        with trio.fail_after(15):  # the app answered: the distributor acked, the home relay holds nothing
            while await pending(state):
                await trio.sleep(0.1)


async def test_killed_distributor_redelivers_unacked_and_the_endpoint_still_works_after_restart(
        lab: dict[str, Any], bus_address: str, tmp_path: Path) -> None:  # noqa: F811
    state, sub, sender = tmp_path / "dist", Subscriber(), Sender()
    async with running(bus_address, lab, state) as (conn, proc):
        endpoint = await register(conn, "app-2", sender.public)
        await wait_route(lab["far"])
        conn.message_modes.append(HOLD)  # the app never answers this call: not acked
        assert await sender.push(sub, at(endpoint, lab["far"]), b"first") == 201
        kind, first = await conn.next_event(30)
        assert kind == "Message"
        await proc.kill(conn)
        conn.message_modes.append(ACK)
        await proc.start(conn)
        # the restarted distributor resumes the registration from its state dir: the relay re-sends the
        # unacked message, the app gets the same id and bytes again and acks it
        kind, again = await conn.next_event(30)
        assert kind == "Message" and again == first and sub.decrypt(bytes(again["message"])) == b"first"
        with trio.fail_after(15):
            while await pending(state):
                await trio.sleep(0.1)
        # the app's startup Register gets the same endpoint, and it still delivers
        assert await register(conn, "app-2", sender.public) == endpoint
        assert await sender.push(sub, at(endpoint, lab["far"]), b"second") == 201
        kind, ev = await conn.next_event(30)
        assert kind == "Message" and bytes(ev["message"]) == sender.sent[-1]
        assert sub.decrypt(bytes(ev["message"])) == b"second"
        assert len(list(state.glob("device-*.json"))) == 1  # one INRI device for the one registration


def retired(state: Path) -> list[list[Any]]:
    """The distributor's endpoints replaced by a re-issue and not yet revoked ([endpoint_id, revoke_at])."""
    (app,) = json.loads((state / "registrations.json").read_text())
    return list(app["retired"])


async def test_endpoint_reissued_before_its_registration_expires(lab: dict[str, Any], bus_address: str,  # noqa: F811
                                                                 tmp_path: Path) -> None:
    """Against real relays, in real seconds (a 10 s lifetime). The schedule itself (re-issue 80% into the
    lifetime, revocation at the old registration's expiry, to the second) is
    test_distributor.py's test on trio's MockClock; nothing here depends on how fast this machine is."""
    lifetime = 10
    state, sub, sender = tmp_path / "dist", Subscriber(), Sender()
    async with running(bus_address, lab, state, "--lifetime", str(lifetime)) as (conn, _):
        first = await register(conn, "app-3", sender.public)
        await wait_route(lab["far"])
        kind, ev = await conn.next_event(lifetime + 10)  # due 80% into the lifetime: 8 s
        assert kind == "NewEndpoint" and ev["token"] == "app-3"
        second = str(ev["endpoint"])
        assert second != first
        # The old endpoint still delivers until its registration (in its URL) expires, so an app server
        # not yet told of the new one loses nothing: it is revoked then, not at the re-issue. Refused
        # only if this machine was too slow to push before that moment.
        expires_at = decode_registration(b64d(first.rsplit("/", 2)[1])).expires_at
        code = await sender.push(sub, at(first, lab["far"]), b"old, still valid")
        if code == 201:
            kind, ev = await conn.next_event(30)
            assert kind == "Message" and sub.decrypt(bytes(ev["message"])) == b"old, still valid"
        else:
            assert code in (404, 410) and time.time() >= expires_at, (code, expires_at - time.time())
        with trio.fail_after(lifetime + 10):  # revoked by the distributor when its registration expired
            while retired(state):
                await trio.sleep(0.1)
        assert await sender.push(sub, at(second, lab["far"]), b"after expiry") == 201
        kind, ev = await conn.next_event(30)
        assert kind == "Message" and sub.decrypt(bytes(ev["message"])) == b"after expiry"
        assert await sender.push(sub, at(first, lab["far"]), b"old") in (404, 410)  # expired, then revoked
