"""The Mozilla Push protocol suite: a raw WebSocket client (tests/mozpush_client.py, the protocol written by
hand from docs/browsers.md) against a relay's /v1/mozpush, and unmodified pywebpush senders. Every message
type, each error case with its close code (another connection on the same relay unharmed throughout),
two connections for one uaid, reconnects exactly once after ack, a kill -9 of the relay, and 1,000 idle
connections to one relay process with its RSS per connection printed."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import http_ece
import httpx
import pytest
import trio
from pywebpush import WebPushException, webpush

from inri.common.b64url import b64d, b64e
from inri.common.front import HttpServer
from inri.node.api import create_app
from inri.node.config import MozPushSection, RelayConfig, WakeSection, WebPushSection
from inri.node.mozpush import CloseCode
from inri.node.service import RelayService
from inri.node.store import Store
from inri.node.tracefile import TraceFile
from inri.protocol.webpush import EndpointToken, TokenVersion, capability
from tests.inproc import NullNetwork
from tests.mozpush_client import Closed, MPClient
from tests.test_webpush import Sender, Subscriber, unb64


@dataclasses.dataclass
class Relay:
    url: str
    ws: str
    service: RelayService
    app: Any


def listener() -> socket.socket:
    """A listening socket on 127.0.0.1 (port 0): mp_relay serves a copy of it, so relays started one after
    the other on it keep one address (the endpoints they handed out stay valid)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


@asynccontextmanager
async def mp_relay(tmp: Path, *, wake: WakeSection | None = None, sock: socket.socket | None = None,
                   **mozpush: Any) -> AsyncIterator[Relay]:
    """An in-process relay (no mesh) whose Web Push origin is its real address (VAPID aud checks it), with its
    wake hooks' task (wake: their [wake] section). sock: serve on this listener (kept open), else a new one."""
    own = sock or listener()
    url = f"http://127.0.0.1:{own.getsockname()[1]}"
    cfg = RelayConfig(webpush=WebPushSection(public_origins=(url,)), mozpush=MozPushSection(**mozpush),
                      wake=wake or WakeSection())
    tmp.mkdir(parents=True, exist_ok=True)
    store = Store(tmp / "relay.sqlite3")
    service = RelayService("a" * 32, cfg.engine.test_profile(), store, NullNetwork(), TraceFile(tmp / "t", "a" * 32),
                           wake=cfg.wake)
    stop = trio.Event()
    try:
        async with trio.open_nursery() as n:
            await n.start(store.run)
            await n.start(service.run)
            app = create_app(service, config=cfg)
            await n.start(service.wake.run)  # after create_app, as the daemon: every owner kind is wired
            await n.start(app.agents.run)
            await n.start(app.mozpush.run)
            server = HttpServer(app, cfg.api, stats=app.front)
            await n.start(lambda task_status: server.run([own], shutdown_trigger=stop.wait, task_status=task_status))
            try:
                yield Relay(url, url.replace("http", "ws") + "/v1/mozpush", service, app)
            finally:
                stop.set()
                n.cancel_scope.cancel()
    finally:
        if sock is None:  # ours; a caller's listener stays open (the front served a duplicate of it)
            own.close()
        store.close()


def chid() -> str:
    return str(uuid.uuid4())


async def send(sub: Subscriber, endpoint: str, text: str, **kw: Any) -> Any:
    """pywebpush (unmodified) in a thread; its response (also for a refusal, which it raises)."""
    def go() -> Any:
        try:
            return webpush(sub.info(endpoint), text, **kw)
        except WebPushException as exc:
            return exc.response
    return await trio.to_thread.run_sync(go)


def decrypt(sub: Subscriber, note: dict[str, Any]) -> bytes:
    """A notification's data as Firefox's PushCrypto would read it."""
    data = unb64(note["data"])
    h = note["headers"]
    if h["encoding"] == "aesgcm":
        return bytes(http_ece.decrypt(data, salt=unb64(h["encryption"].partition("salt=")[2]),
                                      dh=unb64(h["crypto_key"].partition("dh=")[2]), private_key=sub.key,
                                      auth_secret=sub.auth, version="aesgcm"))
    return bytes(http_ece.decrypt(data, private_key=sub.key, auth_secret=sub.auth, version="aes128gcm"))


async def registered(c: MPClient, key: str | None = None) -> tuple[str, str]:
    """Register a new channel; (channelID, pushEndpoint)."""
    ch = chid()
    msg: dict[str, Any] = {"messageType": "register", "channelID": ch}
    if key is not None:
        msg["key"] = key + "=" * (-len(key) % 4)  # Firefox pads the key
    await c.send(msg)
    got = await c.recv()
    assert isinstance(got, dict) and got["status"] == 200 and got["channelID"] == ch, got
    return ch, str(got["pushEndpoint"])


async def test_every_message_type(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with mp_relay(tmp_path) as relay:
            c = await MPClient.connect(relay.ws)
            assert c.subprotocol == "push-notification"
            hello = await c.hello()
            assert (hello["messageType"], hello["status"], hello["use_webpush"], hello["broadcasts"]) == (
                "hello", 200, True, {})
            assert len(hello["uaid"]) == 32
            sender, sub = Sender(), Subscriber()
            ch, endpoint = await registered(c, sender.public)
            assert endpoint.startswith(relay.url + "/wp/v1/")
            claims = {"sub": "mailto:ops@example.org"}
            r = await send(sub, endpoint, "every type", vapid_private_key=sender.vapid, vapid_claims=dict(claims),
                           ttl=60)
            assert r.status_code == 201
            note = await c.recv()
            assert isinstance(note, dict) and note["messageType"] == "notification" and note["channelID"] == ch
            assert note["headers"] == {"encoding": "aes128gcm"} and decrypt(sub, note) == b"every type"
            await c.send({"messageType": "ack",
                          "updates": [{"channelID": ch, "version": note["version"], "code": 100}]})
            r = await send(sub, endpoint, "old style", vapid_private_key=sender.vapid, vapid_claims=dict(claims),
                           ttl=60, content_encoding="aesgcm")
            note2 = await c.recv()
            assert isinstance(note2, dict) and note2["headers"]["encoding"] == "aesgcm"
            assert decrypt(sub, note2) == b"old style"
            await c.send({"messageType": "nack", "version": note2["version"], "code": 301})
            await c.send({"messageType": "broadcast_subscribe", "broadcasts": {"remote-settings/monitor": "v1"}})
            await c.send({})
            assert await c.recv() == {}  # nothing answered nack nor broadcast_subscribe before the pong
            await c.ping()
            await c.send({"messageType": "unregister", "channelID": ch, "code": 200})
            assert await c.recv() == {"messageType": "unregister", "channelID": ch, "status": 200}
            assert c.pongs == 1  # the front answered the WebSocket ping
            r = await send(sub, endpoint, "after unregister", vapid_private_key=sender.vapid,
                           vapid_claims=dict(claims), ttl=60)
            assert r.status_code == 410
            async with httpx.AsyncClient() as http:
                m = (await http.get(relay.url + "/metrics")).text
            assert 'inri_mozpush_nacks_total{code="301"} 1.0' in m, m
            assert 'inri_mozpush_acks_total{code="100"} 1.0' in m
            await c.aclose()


async def test_ttl_zero_topic_and_stored_messages_in_order_exactly_once(tmp_path: Path) -> None:
    """Offline: TTL 0 dropped, a Topic replaces, TTL > 0 stored; a reconnect with the uaid gets them oldest
    first; what was acked is never sent again, what was not is sent again once."""
    with trio.fail_after(60):
        async with mp_relay(tmp_path) as relay:
            c = await MPClient.connect(relay.ws)
            uaid = (await c.hello())["uaid"]
            sub = Subscriber()
            ch, endpoint = await registered(c)
            await c.aclose()
            topic = {"Topic": "t"}
            for text, kw in (("zero", {"ttl": 0}), ("one", {"ttl": 600}), ("t-old", {"ttl": 600, "headers": topic}),
                             ("two", {"ttl": 600}), ("t-new", {"ttl": 600, "headers": topic})):
                assert (await send(sub, endpoint, text, **kw)).status_code == 201
            c = await MPClient.connect(relay.ws)
            assert (await c.hello(uaid))["uaid"] == uaid
            notes = [await c.recv() for _ in range(3)]
            assert [decrypt(sub, n) for n in notes if isinstance(n, dict)] == [b"one", b"two", b"t-new"]
            first = notes[0]
            assert isinstance(first, dict)
            await c.send({"messageType": "ack",
                          "updates": [{"channelID": ch, "version": first["version"], "code": 100}]})
            await c.send({})
            assert await c.recv() == {}
            await c.aclose()
            c = await MPClient.connect(relay.ws)
            await c.hello(uaid)
            again = [await c.recv() for _ in range(2)]
            assert [decrypt(sub, n) for n in again if isinstance(n, dict)] == [b"two", b"t-new"]
            await c.send({"messageType": "ack", "updates": [{"channelID": ch, "version": n["version"], "code": 100}
                                                            for n in again if isinstance(n, dict)]})
            await c.send({})
            assert await c.recv() == {}
            await c.aclose()
            c = await MPClient.connect(relay.ws)
            await c.hello(uaid)
            await c.send({})
            assert await c.recv() == {}, "acknowledged messages must not come back"
            assert (await send(sub, endpoint, "live zero", ttl=0)).status_code == 201
            live = await c.recv()
            assert isinstance(live, dict) and decrypt(sub, live) == b"live zero"  # TTL 0 while connected
            await c.aclose()


async def test_unknown_or_malformed_uaid_gets_a_new_one(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with mp_relay(tmp_path) as relay:
            for given in (uuid.uuid4().hex, "not-a-uuid", "x" * 200):
                c = await MPClient.connect(relay.ws)
                got = (await c.hello(given))["uaid"]
                assert got != given and len(got) == 32
                await c.aclose()
            c = await MPClient.connect(relay.ws)
            fresh = (await c.hello())["uaid"]
            await c.aclose()
            c = await MPClient.connect(relay.ws)
            assert (await c.hello(fresh))["uaid"] != fresh, "a uaid without channels is not kept"
            await c.aclose()


ERROR_CASES: list[tuple[str, list[Any], int]] = [
    ("not json", ["{nope"], CloseCode.MALFORMED),
    ("not an object", ['["hello"]'], CloseCode.MALFORMED),
    ("unknown messageType", [{"messageType": "hello"}, {"messageType": "teleport"}], CloseCode.UNKNOWN_TYPE),
    ("register before hello", [{"messageType": "register", "channelID": str(uuid.uuid4())}], CloseCode.OUT_OF_ORDER),
    ("hello twice", [{"messageType": "hello"}, {"messageType": "hello"}], CloseCode.OUT_OF_ORDER),
    ("bad channelID", [{"messageType": "hello"}, {"messageType": "register", "channelID": "x"}], CloseCode.MALFORMED),
    ("ack of the wrong shape", [{"messageType": "hello"}, {"messageType": "ack", "updates": 3}], CloseCode.MALFORMED),
    ("oversized", [{"messageType": "hello"}, "{" + " " * 20000 + "}"], CloseCode.TOO_BIG),
    ("binary", [{"messageType": "hello"}, b"\x00\x01"], CloseCode.UNSUPPORTED_DATA),
    ("too many channelIDs", [{"messageType": "hello", "channelIDs": [str(uuid.uuid4()) for _ in range(3)]}],
     CloseCode.TOO_MANY_CHANNELS),
    ("too many channels", [{"messageType": "hello"}] + [{"messageType": "register", "channelID": str(uuid.uuid4())}
                                                        for _ in range(3)], CloseCode.TOO_MANY_CHANNELS),
    ("pings too often", [{"messageType": "hello"}, {}, {"messageType": "ping"}], CloseCode.PING_TOO_OFTEN),
    ("no hello in time", [], CloseCode.TIMEOUT),
]


async def test_each_error_closes_with_its_code_and_disturbs_no_other_connection(tmp_path: Path) -> None:
    with trio.fail_after(90):
        async with mp_relay(tmp_path, channels_max=2, hello_timeout_s=1.0) as relay:
            bystander = await MPClient.connect(relay.ws)
            uaid = (await bystander.hello())["uaid"]
            sub = Subscriber()
            _, endpoint = await registered(bystander)
            for name, messages, code in ERROR_CASES:
                c = await MPClient.connect(relay.ws)
                got: dict[str, Any] | Closed = {}
                for m in messages:
                    if isinstance(m, bytes):
                        await c.send_bytes(m)
                    else:
                        await c.send(m if isinstance(m, str) else json.dumps(m))
                while isinstance(got, dict):  # the replies before the close (hello, register, pong)
                    got = await c.recv()
                assert got.code == code, (name, got)
                await c.aclose()
            # The bystander is still served: a push reaches it, and it is the same agent.
            assert (await send(sub, endpoint, "still here", ttl=60)).status_code == 201
            note = await bystander.recv()
            assert isinstance(note, dict) and decrypt(sub, note) == b"still here"
            assert relay.app.mozpush.by_uaid[bytes.fromhex(uaid)] is not None
            await bystander.aclose()


async def test_bad_key_and_another_key_answer_a_status_and_keep_the_connection(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with mp_relay(tmp_path) as relay:
            c = await MPClient.connect(relay.ws)
            await c.hello()
            ch = chid()
            for key, status in (("AAAA", 400), ("B" + "A" * 86, 400), (Sender().public, 200), (Sender().public, 409)):
                await c.send({"messageType": "register", "channelID": ch, "key": key})
                got = await c.recv()
                assert isinstance(got, dict) and got["status"] == status, (key, got)
            await c.aclose()


async def test_a_newer_connection_for_a_uaid_replaces_the_older(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with mp_relay(tmp_path) as relay:
            old = await MPClient.connect(relay.ws)
            uaid = (await old.hello())["uaid"]
            sub = Subscriber()
            _, endpoint = await registered(old)
            new = await MPClient.connect(relay.ws)
            assert (await new.hello(uaid))["uaid"] == uaid
            closed = await old.recv()
            assert closed == Closed(CloseCode.REPLACED, "") or (isinstance(closed, Closed)
                                                                 and closed.code == CloseCode.REPLACED)
            assert (await send(sub, endpoint, "to the newer", ttl=60)).status_code == 201
            note = await new.recv()
            assert isinstance(note, dict) and decrypt(sub, note) == b"to the newer"
            await new.aclose()


async def test_a_host_only_url_is_served_at_the_root_with_the_subprotocol(tmp_path: Path) -> None:
    """Sunup users may type only the host: `/` with subprotocol push-notification is the same endpoint."""
    with trio.fail_after(30):
        async with mp_relay(tmp_path) as relay:
            c = await MPClient.connect(relay.url.replace("http", "ws") + "/")
            assert (await c.hello())["status"] == 200
            await c.aclose()
            async with httpx.AsyncClient() as http:
                r = await http.get(relay.url + "/v1/mozpush")
            assert r.status_code == 426 and r.json()["code"] == "upgrade_required"


async def test_channels_and_messages_survive_a_restart_of_the_store(tmp_path: Path) -> None:
    """uaid, channels, their registrations and route keys, and unacked messages are on disk: a relay started
    again on the same store serves the agent, the old endpoint works, stored messages come once."""
    sub = Subscriber()
    with trio.fail_after(60):
        async with mp_relay(tmp_path) as relay:
            c = await MPClient.connect(relay.ws)
            uaid = (await c.hello())["uaid"]
            ch, endpoint = await registered(c)
            await c.aclose()
            assert (await send(sub, endpoint, "kept", ttl=600)).status_code == 201
            origin = relay.url
        async with mp_relay(tmp_path) as relay:
            c = await MPClient.connect(relay.ws)
            assert (await c.hello(uaid))["uaid"] == uaid
            note = await c.recv()
            assert isinstance(note, dict) and note["channelID"] == ch and decrypt(sub, note) == b"kept"
            moved = relay.url + endpoint[len(origin):]
            assert (await send(sub, moved, "after restart", ttl=600)).status_code == 201
            note2 = await c.recv()
            assert isinstance(note2, dict) and decrypt(sub, note2) == b"after restart"
            await c.aclose()


@pytest.mark.integration
def test_kill9_keeps_agents_channels_and_unacked_messages(tmp_path: Path) -> None:
    """A relay process killed -9 after the sender's 201s: started again, the agent resumes with the same
    uaid and channel, and every message comes once."""
    proc, api = _start_relay(tmp_path)
    sub = Subscriber()
    try:
        async def first() -> tuple[str, str, str]:
            c = await MPClient.connect(api.replace("http", "ws") + "/v1/mozpush")
            uaid = (await c.hello())["uaid"]
            ch, endpoint = await registered(c)
            await c.aclose()
            for text in ("k1", "k2"):
                assert (await send(sub, endpoint, text, ttl=600)).status_code == 201
            return uaid, ch, endpoint

        uaid, ch, endpoint = trio.run(first)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        proc, api = _start_relay(tmp_path, api.rpartition(":")[2])

        async def second() -> None:
            c = await MPClient.connect(api.replace("http", "ws") + "/v1/mozpush")
            assert (await c.hello(uaid))["uaid"] == uaid
            notes = [await c.recv() for _ in range(2)]
            assert [decrypt(sub, n) for n in notes if isinstance(n, dict)] == [b"k1", b"k2"]
            await c.send({"messageType": "ack", "updates": [{"channelID": ch, "version": n["version"], "code": 100}
                                                            for n in notes if isinstance(n, dict)]})
            await c.send({})
            assert await c.recv() == {}
            assert (await send(sub, endpoint, "k3", ttl=600)).status_code == 201
            n3 = await c.recv()
            assert isinstance(n3, dict) and decrypt(sub, n3) == b"k3"
            await c.aclose()

        trio.run(second)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)


def _start_relay(tmp: Path, port: str = "0") -> tuple[subprocess.Popen[bytes], str]:
    """`inri relay` on loopback with the default profile's limits but lab rates; (process, API URL)."""
    data = tmp / "relay"
    data.mkdir(exist_ok=True)
    cfg = data / "relay.toml"
    cfg.write_text(f'[relay]\ndata_dir = "{data}"\napi = "127.0.0.1:{port}"\nquic = "127.0.0.1:0"\nprofile = "test"\n'
                   'bootstrap = ["http://127.0.0.1:9"]\nlog_format = "json"\n'
                   "[api]\nrate_per_s = 100000.0\nrate_burst = 100000\n")
    (data / "relay.json").unlink(missing_ok=True)
    log = open(tmp / "relay.log", "ab")  # noqa: SIM115 - the child holds it
    proc = subprocess.Popen([sys.executable, "-m", "inri.cli", "relay", "--config", str(cfg)], stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    end = time.monotonic() + 60
    while time.monotonic() < end:
        assert proc.poll() is None, (tmp / "relay.log").read_text()[-3000:]
        if (data / "relay.json").exists():
            api = json.loads((data / "relay.json").read_text())["api"]
            try:
                if httpx.get(api + "/healthz", timeout=2).status_code == 200:
                    return proc, api
            except httpx.HTTPError:
                pass
        time.sleep(0.1)
    raise AssertionError("relay did not start: " + (tmp / "relay.log").read_text()[-3000:])


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.mark.integration
def test_a_thousand_idle_connections_to_one_relay(tmp_path: Path) -> None:
    """1,000 connections, each past its hello, held idle; the relay's RSS per connection is printed, and
    every one is still served afterwards (a ping answered on each)."""
    proc, api = _start_relay(tmp_path)
    n = 1000
    try:
        async def go() -> None:
            with trio.fail_after(240):
                await held()

        async def held() -> None:
            ws = api.replace("http", "ws") + "/v1/mozpush"
            warm = await MPClient.connect(ws)
            await warm.hello()
            await warm.aclose()
            await trio.sleep(0.5)
            before = _rss_kib(proc.pid)
            clients: list[MPClient] = []

            async def one() -> None:
                c = await MPClient.connect(ws)
                assert (await c.hello())["status"] == 200
                clients.append(c)

            for start in range(0, n, 100):
                async with trio.open_nursery() as nursery:
                    for _ in range(min(100, n - start)):
                        nursery.start_soon(one)
            await trio.sleep(1.0)
            after = _rss_kib(proc.pid)
            status = httpx.get(api + "/v1/status").json()["mozpush"]
            print(f"\n{n} idle Mozilla Push connections: relay RSS {before} KiB -> {after} KiB, "
                  f"{(after - before) * 1024 / n / 1024:.1f} KiB per connection")
            assert status["connections"] == n
            for c in clients:
                await c.send({})
            for c in clients:
                assert await c.recv() == {}
                await c.aclose()

        trio.run(go)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)


async def _asgi_post(app: Any, path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
    """One HTTP request through the relay's ASGI app (what the front calls), without a socket."""
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": headers, "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 8480), "scheme": "http"}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send_(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send_)
    return int(sent[0]["status"]), b"".join(m.get("body", b"") for m in sent[1:])


async def test_an_endpoint_outlives_its_registration_while_the_relay_refreshes_it(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    """Endpoint lifetime (docs/browsers.md): with 10-minute registrations, three lifetimes pass on a mock
    clock; the relay re-signed the channel's registration as each fell due, so the endpoint URL handed out at
    the start (its registration long expired) still gets 201 and the message is stored. A channel the relay
    stopped refreshing answers 404 once its registration expired, decided at the entry (no custody taken)."""
    base = 1.9e9
    store = Store(tmp_path / "relay.sqlite3")
    cfg = RelayConfig(mozpush=MozPushSection(registration_lifetime_s=600))
    service = RelayService("a" * 32, cfg.engine.test_profile(), store, NullNetwork(),
                           TraceFile(tmp_path / "t", "a" * 32), clock=trio.current_time,
                           wall_clock=lambda: base + trio.current_time())
    app = create_app(service, config=cfg)
    async with trio.open_nursery() as n:
        await n.start(store.run)
        await n.start(service.run)
        await n.start(app.agents.run)
        agents = app.agents
        kept_url, kept_rid = agents.register(uuid.uuid4().bytes, uuid.uuid4().bytes, None, "c")
        dropped_url, dropped_rid = agents.register(uuid.uuid4().bytes, uuid.uuid4().bytes, None, "c")
        agents.agents.set_refresh(dropped_rid, float("inf"))  # this one is never re-signed
        first_epoch = store.registration(kept_rid).epoch  # type: ignore[union-attr]
        await trio.sleep(3 * 660)
        assert store.registration(kept_rid).epoch >= first_epoch + 4  # type: ignore[union-attr]
        assert service.engine.route_epoch(kept_rid) == store.registration(kept_rid).epoch  # type: ignore[union-attr]
        custody = len(service._custody)
        status, body = await _asgi_post(app, "/wp" + kept_url.split("/wp", 1)[1], [(b"ttl", b"60")])
        assert status == 201, body
        assert status == 201 and len(agents.pending(agents.agents.agent_of(kept_rid) or b"", 10)) == 1
        status, body = await _asgi_post(app, "/wp" + dropped_url.split("/wp", 1)[1], [(b"ttl", b"60")])
        assert status == 404 and json.loads(body)["code"] == "not_found"
        assert len(service._custody) == custody  # refused at the entry: nothing taken into custody
        # The same endpoint as an unsigned version 1 token (what relays minted before signatures): its
        # bytes can be altered, so it dies with its registration; C1b's longer life is for signed tokens.
        r_text, e_text = kept_url.rsplit("/", 2)[-2:]
        tok = EndpointToken.decode(b64d(e_text, "e"))
        legacy = dataclasses.replace(tok, signature=None, version=TokenVersion.V1,
                                     cap=capability(store.home_key, kept_rid, tok.endpoint_id, TokenVersion.V1))
        status, body = await _asgi_post(app, f"/wp/v1/{r_text}/{b64e(legacy.encode())}", [(b"ttl", b"60")])
        assert status == 404 and json.loads(body)["code"] == "not_found", body
        assert len(service._custody) == custody
        n.cancel_scope.cancel()
    store.close()
