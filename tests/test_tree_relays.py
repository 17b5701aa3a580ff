"""Tree gossip between real relay processes over QUIC (loopback): RegAnnounce frames cross real links,
every relay still gets every registration, and a push still reaches its device."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio

from inri import mesh
from inri.client import DeviceClient, HomeAppClient
from inri.node.metrics import parse_metrics

pytestmark = pytest.mark.integration

N = 4
DEVICES = 8


def test_tree_gossip_over_quic_announces_routes_everywhere_and_delivers(tmp_path: Path) -> None:
    # tree_eager_share 1.0: a link turns lazy for a direction after its first prune (once measured), so a
    # handful of registrations on 4 relays already sends announcements instead of full frames.
    engine = {"gossip_scheme": "tree", "tree_eager_share": 1.0, "tree_explore": 0.0}
    info = mesh.up(tmp_path / "mesh", relays=N, bootstraps=1, timeout_s=90, min_neighbours=2,
                   engine={f"R{i}": engine for i in range(1, N + 1)})
    try:
        trio.run(_run, info)
    finally:
        mesh.down(tmp_path / "mesh")


async def _run(info: dict[str, object]) -> None:
    relays = info["relays"]
    assert isinstance(relays, list)
    apis = [r["api"] for r in relays]
    devices = []
    for i in range(DEVICES):
        dev = DeviceClient(apis[i % 2])  # homes at R1 and R2
        await dev.register(tokens=5)
        devices.append(dev)
        await trio.sleep(0.2)
    async with httpx.AsyncClient(timeout=5) as c:
        with trio.fail_after(30):
            # routes with a next hop: a home counts the other home's devices only
            want = [DEVICES // 2, DEVICES // 2] + [DEVICES] * (N - 2)
            while [(await c.get(api + "/v1/status")).json()["routes"] for api in apis] != want:
                await trio.sleep(0.1)
        metrics = [parse_metrics((await c.get(api + "/metrics")).text) for api in apis]
    announced = sum(m.get('inri_frames_in_total{type="reg_announce"}', 0.0) for m in metrics)
    assert announced > 0, sorted(k for k in metrics[0] if "frames_in" in k)
    assert sum(m.get("inri_frames_invalid_total", 0.0) for m in metrics) == 0
    dev = devices[-1]
    cred = dev.export_credential(5)
    app = HomeAppClient([apis[-1]])
    with trio.fail_after(30):
        async with dev.stream() as messages:
            receipt = await app.push(cred, b"along the tree")
            msg = await messages.receive()
    assert (msg.id, msg.plaintext) == (receipt.push_id, b"along the tree")
