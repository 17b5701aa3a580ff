"""A phone that cannot hold a socket, end to end over real processes (issue 40's acceptance).

A bootstrap and 5 relays (`inri mesh up`), an `inri gateway` process, and a fake APNs in this process
(HTTP/2 over TLS, verifying every request: tests/gateway_fakes.py). The device registers at R1 with a
wake hook and opens no stream. An unmodified pywebpush sends from the relay farthest from R1; the fake
APNs receives exactly one wake-up (the time it took is printed, not asserted: `make test` runs on a
shared 2-core machine); the "app" pulls and acks; pushes within the coalescing window wake no one; after
the ack a new push wakes again. The same for a Mozilla Push user agent at R1 with a hook set over its
WebSocket. Last, a privacy scan: neither the home relay's store and log nor the gateway's log hold the
APNs device token in clear."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from pywebpush import webpush

from inri import mesh
from inri.client import DeviceClient, seal_wake_token
from inri.common.b64url import b64e
from inri.node.metrics import parse_metrics
from tests.gateway_fakes import FakeApns, Late, apns_device_token, fake_apns, make_tls, serve_app, write_gateway
from tests.mozpush_client import MPClient
from tests.procs import Proc
from tests.test_mozpush import registered
from tests.test_relay_mesh import distances, graph, relay, wait_route
from tests.test_webpush import Sender, Subscriber, at

pytestmark = pytest.mark.integration
N = 5
COALESCE_S = 120  # the window: long enough that it cannot end while the test runs


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("wakemesh")
    with pytest.MonkeyPatch.context() as env:  # the relays' [wake] section, as INRI_WAKE_* variables
        env.setenv("INRI_WAKE_LAB_HTTP_LOOPBACK", "true")  # the gateway listens on plain HTTP on loopback
        env.setenv("INRI_WAKE_COALESCE_S", str(COALESCE_S))
        info = mesh.up(d, relays=N, bootstraps=1, timeout_s=90, min_neighbours=2)
    try:
        dist = distances(graph(info), "R1")
        assert len(dist) == N, f"mesh not connected: {dist}"
        far = max(sorted(dist), key=lambda n: dist[n])
        info.update(far=relay(info, far)["api"], far_name=far, hops=dist[far], home=relay(info, "R1")["api"])
        yield info
    finally:
        mesh.down(d)


def gateway_url(proc: Proc, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.alive(), proc.tail()
        for line in proc.log.read_text(errors="replace").splitlines():
            if line.startswith('{"gateway": '):
                return str(json.loads(line)["gateway"])
        time.sleep(0.05)
    raise AssertionError(f"the gateway reported no URL\n{proc.tail()}")


async def home_metrics(api: str) -> dict[str, float]:
    async with httpx.AsyncClient(timeout=10) as c:
        return parse_metrics((await c.get(api + "/metrics")).text)


async def until_home(api: str, check: Any, timeout: float = 30.0) -> dict[str, float]:
    with trio.fail_after(timeout):
        while True:
            m = await home_metrics(api)
            if check(m):
                return m
            await trio.sleep(0.05)


@asynccontextmanager
async def gateway_process(tmp_path: Path) -> AsyncIterator[tuple[FakeApns, str, bytes]]:
    """A fake APNs in this process and an `inri gateway` process in front of it (its log:
    tmp_path / "gateway.log"); (the fake, the gateway's URL, the gateway's public key)."""
    tls = make_tls(tmp_path / "tls")
    late = Late()
    async with serve_app(late, tls) as apns_url:
        setup = write_gateway(tmp_path / "gw", tls, apns_url=apns_url)
        late.app = apns = fake_apns(setup)
        gw = Proc([sys.executable, "-m", "inri.cli", "gateway", "--config", str(setup.config)],
                  tmp_path / "gateway.log")
        try:
            yield apns, await trio.to_thread.run_sync(gateway_url, gw), setup.public_key
        finally:
            gw.stop()


async def test_a_sleeping_phone_is_woken_through_apns_from_the_farthest_relay(lab: dict[str, Any],
                                                                              tmp_path: Path) -> None:
    async with gateway_process(tmp_path) as (apns, url, key):
        await run_scenario(lab, tmp_path, apns, url, key)
    privacy_scan(lab, tmp_path / "gateway.log")


async def test_a_sleeping_mozilla_push_agent_is_woken_through_apns_from_the_farthest_relay(
        lab: dict[str, Any], tmp_path: Path) -> None:
    """The same for a Mozilla Push user agent (a phone's distributor): its hook set over its WebSocket at R1
    (docs/browsers.md, "Waking a phone"), then gone; pywebpush at the farthest relay wakes it once, a second
    push in the window does not; the privacy scan covers its device token too."""
    home = lab["home"]
    async with gateway_process(tmp_path) as (apns, gateway, key):
        async with httpx.AsyncClient(timeout=10) as c:
            routes = (await c.get(lab["far"] + "/v1/status")).json()["routes"]
        client = await MPClient.connect(home.replace("http", "ws") + "/v1/mozpush")
        await client.hello()
        _, endpoint = await registered(client)
        device_token = apns_device_token()
        DEVICE_TOKENS.append(device_token)
        await client.send({"messageType": "wake_hook", "url": gateway + "/v1/wake",
                           "token": b64e(seal_wake_token(key, "apns", device_token))})
        assert (await client.recv()) == {"messageType": "wake_hook", "status": 200, "url": gateway + "/v1/wake",
                                         "created": pytest.approx(time.time(), abs=60)}
        await client.aclose()
        await until_home(home, lambda m: m["inri_mozpush_connections_open"] == 0)
        await wait_route(lab["far"], routes + 1)  # the channel's route id reached the far relay
        before = await home_metrics(home)
        sub = Subscriber()
        far_endpoint = lab["far"] + endpoint[len(home):]

        def send(text: str) -> int:
            return int(webpush(sub.info(far_endpoint), text, ttl=300).status_code)

        assert await trio.to_thread.run_sync(send, "one") == 201
        with trio.fail_after(30):
            await apns.wait_for(1)
        assert apns.received[0].device_token == device_token and apns.errors == []
        sent = 'inri_wake_requests_total{outcome="sent"}'
        await until_home(home, lambda m: m[sent] == before.get(sent, 0) + 1)
        assert await trio.to_thread.run_sync(send, "two") == 201
        coalesced = 'inri_wake_suppressed_total{reason="coalesced"}'
        m = await until_home(home, lambda m: m[coalesced] == before.get(coalesced, 0) + 1)
        assert m[sent] == before.get(sent, 0) + 1 and len(apns.received) == 1
    privacy_scan(lab, tmp_path / "gateway.log")


DEVICE_TOKENS: list[str] = []


async def run_scenario(lab: dict[str, Any], tmp_path: Path, apns: Any, gateway: str, gateway_key: bytes) -> None:
    home = lab["home"]
    dev = DeviceClient(home, state_path=tmp_path / "dev.json")
    await dev.register(tokens=1)
    device_token = apns_device_token()
    DEVICE_TOKENS.append(device_token)
    await dev.set_wake_hook(gateway + "/v1/wake", seal_wake_token(gateway_key, "apns", device_token))
    await wait_route(lab["far"])
    ep = await dev.mint_endpoint()
    sub, sender = Subscriber(), Sender()
    info = sub.info(at(ep, lab["far"]))

    def send(text: str) -> int:
        r = webpush(info, text, vapid_private_key=sender.vapid, vapid_claims={"sub": "mailto:ops@example.org"},
                    ttl=300)
        return int(r.status_code)

    # 1. One push from the farthest relay: exactly one wake-up at APNs, for this device token.
    t0 = trio.current_time()
    assert await trio.to_thread.run_sync(send, "one") == 201
    with trio.fail_after(30):
        await apns.wait_for(1)
    took = apns.received[0].at - t0
    print(f"\nwake-up at the fake APNs {took:.3f} s after pywebpush began sending at {lab['far_name']} "
          f"({lab['hops']} hops from the home relay)")
    assert apns.received[0].device_token == device_token and apns.errors == []
    await until_home(home, lambda m: m['inri_wake_requests_total{outcome="sent"}'] == 1)

    # 2. More pushes within the coalescing window, nothing acked: stored at home, no second wake-up.
    for text in ("two", "three"):
        assert await trio.to_thread.run_sync(send, text) == 201
    m = await until_home(home, lambda m: m["inri_mailbox_messages"] == 3)
    assert m['inri_wake_suppressed_total{reason="coalesced"}'] == 1
    assert m['inri_wake_requests_total{outcome="sent"}'] == 1 and len(apns.received) == 1

    # 3. Woken, the app pulls from its home relay and acks.
    msgs = await dev.pull()
    assert sorted(sub.decrypt(x) for x in msgs) == [b"one", b"three", b"two"]
    assert await dev.ack([x.id for x in msgs]) == 3

    # 4. After the ack a new push wakes the phone again.
    assert await trio.to_thread.run_sync(send, "four") == 201
    with trio.fail_after(30):
        await apns.wait_for(2)
    await until_home(home, lambda m: m['inri_wake_requests_total{outcome="sent"}'] == 2)
    assert len(apns.received) == 2 and apns.errors == []
    assert [sub.decrypt(x) for x in await dev.pull()] == [b"four"]


def privacy_scan(lab: dict[str, Any], gateway_log: Path) -> None:
    """The device token (hex as iOS hands it out, either case, and as bytes) is nowhere at the home relay,
    on disk (the SQLite store with its WAL, traces, route snapshot) or in its log, nor in the gateway's log."""
    assert DEVICE_TOKENS
    home = relay(lab, "R1")
    files = [p for p in Path(home["data_dir"]).rglob("*") if p.is_file()] + [Path(home["log"]), gateway_log]
    assert any(p.name.startswith("relay.sqlite3") for p in files)
    scanned = 0
    for f in files:
        data = f.read_bytes()
        scanned += len(data)
        for token in DEVICE_TOKENS:
            for needle in (token.encode(), token.upper().encode(), bytes.fromhex(token), token[:16].encode()):
                assert needle not in data, (str(f), needle[:8])
    assert scanned > 10_000
