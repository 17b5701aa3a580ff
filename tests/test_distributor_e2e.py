"""The issue's D-Bus distributor acceptance test, end to end: real relay processes (`inri mesh up`), the
distributor on a private session bus with its real DeviceClient, a test UnifiedPush connector that
registers, gets its endpoint, receives a pywebpush push entered at the relay farthest from home with the
exact body, and acks it (the relay then holds nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from pywebpush import webpush

from inri import mesh
from inri.client import DeviceClient, Message
from inri.client.distributor import run_distributor
from tests.test_distributor import APP, AppConnector, bus_address  # noqa: F401  (bus_address: fixture)
from tests.test_relay_mesh import distances, graph, relay, wait_route
from tests.test_webpush import Sender, Subscriber, origin

pytestmark = pytest.mark.integration


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[dict[str, Any]]:
    d = tmp_path / "mesh"
    d.mkdir()
    info = mesh.up(d, relays=3, bootstraps=1, timeout_s=90, min_neighbours=1)
    try:
        dist = distances(graph(info), "R1")
        far = max(sorted(dist), key=lambda n: dist[n])
        info.update(home=relay(info, "R1")["api"], far=relay(info, far)["api"])
        yield info
    finally:
        mesh.down(d)


async def test_connector_gets_endpoint_and_pywebpush_message_over_the_session_bus(
        lab: dict[str, Any], bus_address: str, tmp_path: Path) -> None:  # noqa: F811
    state = tmp_path / "dist"
    sub, sender = Subscriber(), Sender()
    app = AppConnector(bus_address)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: run_distributor(
                lab["home"], state, "inri", bus_address=bus_address, task_status=task_status))
            ans = await trio.to_thread.run_sync(app.call, "Register",
                                                {"service": APP, "token": "app-1", "vapid": sender.public})
            assert ans == {"success": "REGISTRATION_SUCCEEDED"}
            kind, ev = await app.next_event(30)
            assert kind == "NewEndpoint" and ev["token"] == "app-1"
            endpoint = ev["endpoint"]
            assert origin(endpoint) == lab["home"] and "/wp/v1/" in endpoint
            await wait_route(lab["far"])
            body = b"\x00UnifiedPush through INRI \xff" * 20
            far_url = lab["far"] + endpoint[len(origin(endpoint)):]
            r = await trio.to_thread.run_sync(lambda: webpush(
                sub.info(far_url), body, vapid_private_key=sender.vapid,
                vapid_claims={"sub": "mailto:ops@example.org"}, ttl=300))
            assert r.status_code == 201, r.text
            kind, ev = await app.next_event(30)
            assert kind == "Message" and ev["token"] == "app-1"
            got = Message(ev["id"], b"", 0.0, kind="webpush", body=bytes(ev["message"]), encoding="aes128gcm")
            assert sub.decrypt(got) == body
            # the app returned from Message: the distributor acked, so the home relay holds nothing
            dev = DeviceClient.from_state(next(state.glob("device-*.json")))
            async with dev:
                with trio.fail_after(15):
                    while await dev.pull():
                        await trio.sleep(0.1)
            nursery.cancel_scope.cancel()
    finally:
        app.close()
