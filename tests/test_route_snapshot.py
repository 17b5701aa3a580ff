"""A restarted relay routes again as its links come up (issue 15 item 2): learned routes are kept in
routes.msgpack (inri.node.routesnap) and read back at startup. Before, a relay that restarted had no
route until each device refreshed, and every push it entered searched its neighbourhood."""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgpack
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from inri import mesh
from inri.client import DeviceClient, HomeAppClient
from inri.core.api import Connect
from inri.core.engine import Engine
from inri.core.testing import MiniNet
from inri.node import routesnap
from inri.node.metrics import parse_metrics
from inri.node.relay import snapshot_routes
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import PeerInfo


def _learned(n: int = 4) -> tuple[MiniNet, bytes]:
    net = MiniNet(n, [(i, i + 1) for i in range(n - 1)])
    net.run_until(1.0)
    reg = make_registration(new_signing_key(), 1, 0, 3600)
    net.homes[n - 1].add_registration(reg, [os.urandom(16)])
    net.apply(str(n - 1), net.engines[n - 1].register(reg, net.now))
    net.run_until(3.0)
    return net, reg.route_id


def test_exported_routes_come_back_in_a_fresh_engine_and_through_the_file(tmp_path: Path) -> None:
    net, rid = _learned()
    rows = net.engines[0].export_routes()
    assert [(r[0], r[3]) for r in rows] == [(rid, (("1", 3),))]
    assert net.engines[3].export_routes() == []  # the home keeps its registrations in its store
    anchors = net.engines[1].export_anchors()
    assert anchors == [("0", "addr-0"), ("2", "addr-2")]
    routesnap.save_now(tmp_path, rows, anchors)
    fresh = Engine("0", net.config, verifier=net.verifier, home=net.homes[0], tracer=net.tracer,
                   rng=random.Random(1), listen_addr="addr-0")
    got_rows, got_anchors = routesnap.load(tmp_path)
    assert fresh.restore_routes(got_rows, 5.0) == 1
    assert fresh.next_hops(rid) == [("1", 3)]
    # Former neighbours are dialled first, before the passive view's candidates (rule M6), and this
    # relay itself is skipped.
    assert got_anchors == anchors
    assert fresh.restore_anchors(got_anchors, 5.0) == 1
    effects = fresh.add_candidates([PeerInfo("9", "addr-9")], 5.0) + fresh.start(5.0)
    assert [(e.peer, e.addr) for e in effects if isinstance(e, Connect)][0] == ("2", "addr-2")
    # Expired routes stay out (the expiry is wall-clock time: 3600 s after the registration's issue).
    late = Engine("0", net.config, verifier=net.verifier, home=net.homes[0], tracer=net.tracer,
                  rng=random.Random(1), listen_addr="addr-0")
    assert late.restore_routes(rows, 4000.0) == 0


class _SnapshotService:
    """What the relay's periodic snapshot reads of its RelayService, over a real engine, in chunks of 40."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def export_route_chunks(self) -> Iterator[list[routesnap.Row]]:
        return self.engine.export_route_chunks(40)

    def export_anchors(self) -> list[tuple[str, str]]:
        return self.engine.export_anchors()


async def test_a_route_snapshot_serves_the_relays_other_tasks_while_it_reads_the_routes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """1M routes take seconds to read out of a table: the periodic snapshot (relay.snapshot_routes)
    reads them in chunks and lets the relay's other tasks run between chunks, then writes them all."""
    net = MiniNet(3, [(0, 1), (1, 2)])
    net.run_until(1.0)
    for _ in range(400):
        reg = make_registration(new_signing_key(), 1, 0, 3600)
        net.homes[2].add_registration(reg, [os.urandom(16)])
        net.apply("2", net.engines[2].register(reg, net.now))
    net.run_until(3.0)
    want = net.engines[0].export_routes()
    assert len(want) == 400
    # The compact table chunks whole hash buckets (about 40 rows each), so how many chunks 400 random
    # route ids make varies from run to run: count them, and expect a turn of the ticker between each two.
    chunks = len(list(net.engines[0].export_route_chunks(40)))
    assert chunks >= 5
    ticks = 0
    done = False
    at_save: list[int] = []
    real_save = routesnap.save

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await trio.sleep(0)

    async def save(data: Path, rows: list[routesnap.Row], anchors: list[tuple[str, str]]) -> None:
        at_save.append(ticks)  # the ticker's turns while the routes were read, before the write's thread
        await real_save(data, rows, anchors)

    monkeypatch.setattr(routesnap, "save", save)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await trio.sleep(0)
        start = ticks
        written = await snapshot_routes(_SnapshotService(net.engines[0]), tmp_path)  # type: ignore[arg-type]
        done = True
    assert written == 400
    assert at_save[0] - start >= chunks - 1  # the other task ran between the chunks
    rows, anchors = routesnap.load(tmp_path)
    assert sorted(rows) == sorted(want) and anchors == net.engines[0].export_anchors()


@given(st.binary(max_size=300))
def test_a_damaged_snapshot_is_refused_with_value_error_never_a_crash(data: bytes) -> None:
    try:
        rows, anchors = routesnap.decode(data)
    except ValueError:
        return
    assert isinstance(rows, list) and isinstance(anchors, list)


def test_a_format_1_snapshot_still_loads_its_routes() -> None:
    rid = os.urandom(16)
    old = msgpack.packb([1, [[rid, 3, 1e10, [["n1", 2]]]]], use_bin_type=True)
    assert routesnap.decode(old) == ([(rid, 3, 1e10, (("n1", 2),))], [])


def test_an_unreadable_snapshot_is_ignored(tmp_path: Path) -> None:
    (tmp_path / routesnap.SNAPSHOT_FILE).write_bytes(b"\x92\x01\x91\x94garbage")
    assert routesnap.load(tmp_path) == ([], [])
    assert routesnap.load(tmp_path / "nowhere") == ([], [])


def _pushes_out(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("inri_pushes_out"))


async def _mesh_pushes_out(c: httpx.AsyncClient, relays: list[dict[str, Any]]) -> float:
    return sum([_pushes_out(parse_metrics((await c.get(r["api"] + "/metrics")).text)) for r in relays])


@pytest.mark.integration
async def test_a_restarted_relay_routes_its_pushes_without_a_device_refresh(tmp_path: Path) -> None:
    """6 real relays; a device homed at R1; the relay farthest from it is stopped and started again on its
    data directory; 20 pushes entered there follow the route (push frames per push about the path length)
    with no device refresh and no search."""
    # The home keeps at most 3 of the 5 others as neighbours, so some relay is not one.
    info = await trio.to_thread.run_sync(lambda: mesh.up(tmp_path, relays=6, bootstraps=1, timeout_s=120,
                                                         min_neighbours=2, trace_level="off",
                                                         engine={"R1": {"active_max": 3}}))
    try:
        by_name = {r["name"]: r for r in info["relays"]}
        home = by_name["R1"]
        dev = DeviceClient(home["api"])
        await dev.register(tokens=20)
        cred = dev.export_credential(20)
        async with httpx.AsyncClient(timeout=5) as c:
            # Every relay has the route, and one of them is not the home's neighbour (in the views of
            # both ends: the home keeps at most 3 of the 5 others).
            status: dict[str, Any] = {}
            far: dict[str, Any] | None = None
            with trio.fail_after(60):
                while far is None:
                    status = {r["name"]: (await c.get(r["api"] + "/v1/status")).json() for r in info["relays"]}
                    linked = {n["node_id"] for n in status["R1"]["neighbours"]}
                    if all(s["routes"] >= 1 for name, s in status.items() if name != "R1"):
                        far = next((r for r in info["relays"] if r is not home and r["node_id"] not in linked
                                    and home["node_id"] not in
                                    {n["node_id"] for n in status[r["name"]]["neighbours"]}), None)
                    await trio.sleep(0.1)
            os.kill(far["pid"], signal.SIGTERM)  # an upgrade: stopped, started again on its data directory
            with trio.fail_after(30):
                await trio.to_thread.run_sync(os.waitpid, far["pid"], 0)  # our child: reaped here
            rows, anchors = routesnap.load(far["data_dir"])  # what it wrote when it stopped
            next_hops = {p for row in rows for p, _ in row[3]}
            assert next_hops & {a[0] for a in anchors}  # its neighbours then, one of them a next hop
            await trio.to_thread.run_sync(lambda: mesh.restart_relay(info, far))
            # Up again: the route is known before any device refresh, and before a link to the home
            # (if it gets one) could announce it (rule G5).
            far_status = (await c.get(far["api"] + "/v1/status")).json()
            assert far_status["routes"] >= 1
            assert far_status["route_table"] == "compact"  # the relay's default (issue 18): about 60 B a route
            # Its former neighbours are dialled first (routes.msgpack keeps them): a next hop of its
            # route, or the home itself, comes back as a neighbour, in the views of both ends.
            with trio.fail_after(30):
                while True:
                    linked = {n["node_id"] for n in (await c.get(far["api"] + "/v1/status")).json()["neighbours"]}
                    both = {r["node_id"] for r in info["relays"] if r["node_id"] in linked and far["node_id"] in
                            {n["node_id"] for n in (await c.get(r["api"] + "/v1/status")).json()["neighbours"]}}
                    if both & (next_hops | {home["node_id"]}):
                        break
                    await trio.sleep(0.1)
            before = await _mesh_pushes_out(c, info["relays"])
            app = HomeAppClient([far["api"]])
            pids = [(await app.push(cred, f"p{k}".encode())).push_id for k in range(20)]
            with trio.fail_after(60):
                for pid in pids:
                    while (await app.status(pid, far["api"]))["status"] == "pending":
                        await trio.sleep(0.1)
            statuses = [(await app.status(pid, far["api"]))["status"] for pid in pids]
            after = await _mesh_pushes_out(c, info["relays"])
            await app.aclose()
        got = {m.id for m in await dev.pull(limit=100)}
        await dev.aclose()
        per_push = (after - before) / len(pids)
        print(f"push frames per push after the restart: {per_push:.2f}")
        assert statuses == ["delivered"] * len(pids) and set(pids) <= got
        assert per_push <= 6, per_push  # a search costs tens of frames per push; a route its length
    finally:
        await trio.to_thread.run_sync(lambda: mesh.down(tmp_path))
