"""Group commit (issue 16 item 3): pushes share SQLite transactions, and no 202 is lost to kill -9."""

from __future__ import annotations

import os
import signal
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from inri import mesh
from inri.client import DeviceClient
from inri.client.credential import seal
from inri.common.b64url import b64e
from inri.node.api import create_app
from inri.node.config import RelayConfig
from inri.node.service import RelayService
from inri.node.store import Store
from inri.node.tracefile import TraceFile
from inri.protocol.codec import encode_registration
from tests.inproc import NullNetwork, serving

WRITES = ("BEGIN", "INSERT", "UPDATE", "DELETE", "REPLACE")


@asynccontextmanager
async def grouping_relay(tmp: Path) -> AsyncIterator[tuple[str, Store]]:
    """A relay as `inri relay` runs it (store.run grouping commits, the HTTP front), no mesh."""
    cfg = RelayConfig()
    store = Store(tmp / "relay.sqlite3")
    service = RelayService("a" * 32, cfg.engine.test_profile(), store, NullNetwork(), TraceFile(tmp / "t", "a" * 32))
    async with trio.open_nursery() as n:
        await n.start(store.run)
        await n.start(service.run)
        try:
            async with serving(create_app(service, config=cfg), cfg.api) as url:
                yield url, store
        finally:
            n.cancel_scope.cancel()
    store.close()


def bodies(dev: DeviceClient, n: int) -> list[dict[str, str]]:
    cred = dev.export_credential(n)
    reg = b64e(encode_registration(cred.registration))
    return [{"registration": reg, "token": b64e(t), "ciphertext": b64e(seal(cred.seal_key, b"m"))} for t in cred.tokens]


async def test_concurrent_pushes_share_transactions_and_each_202_is_committed(tmp_path: Path) -> None:
    """The home relay used to run three write transactions per push (custody taken, message stored,
    custody released); now the pushes of a scheduling round share one, and a 202 comes only after it."""
    n = 40
    with trio.fail_after(60):
        async with grouping_relay(tmp_path) as (url, store):
            dev = DeviceClient(url)
            await dev.register(tokens=n)
            work = bodies(dev, n)
            writes: list[str] = []

            def trace(sql: str) -> None:
                # Called as each statement starts: a write outside a transaction opens one (or is one).
                if not store._db.in_transaction and sql.lstrip().upper().startswith(WRITES):
                    writes.append(sql)

            store._db.set_trace_callback(trace)
            limits = httpx.Limits(max_connections=n)
            async with httpx.AsyncClient(timeout=30, limits=limits) as c:
                async def one(body: dict[str, str]) -> None:
                    r = await c.post(url + "/v1/push", json=body)
                    assert r.status_code == 202, r.text

                async with trio.open_nursery() as nursery:
                    for body in work:
                        nursery.start_soon(one, body)
            store._db.set_trace_callback(None)
            # What another connection sees is what is committed: every message answered 202 is there.
            other = sqlite3.connect(store.path)
            stored = other.execute("SELECT COUNT(*) FROM mailbox").fetchone()[0]
            other.close()
    print(f"{n} pushes: {len(writes)} write transactions")
    assert stored == n
    assert len(writes) <= n, writes[:10]  # one per push at most (three before); under load far fewer


async def _load_then_kill(info: dict[str, Any], n: int, kill_after: int) -> tuple[set[str], int]:
    """Push from 16 connections; kill -9 the relay once kill_after pushes were answered 202."""
    relay = info["relays"][0]
    dev = DeviceClient(relay["api"])
    await dev.register(tokens=500)
    while len(dev.tokens) < n:
        await dev.more_tokens(500)
    work = iter(bodies(dev, n))
    accepted: set[str] = set()
    killed = trio.Event()

    async def worker(c: httpx.AsyncClient) -> None:
        for body in work:
            try:
                r = await c.post(relay["api"] + "/v1/push", json=body)
            except httpx.HTTPError:
                return  # the relay died under this request: not answered, not promised
            if r.status_code == 202:
                accepted.add(r.json()["push_id"])
            if len(accepted) >= kill_after and not killed.is_set():
                killed.set()
                os.killpg(relay["pid"], signal.SIGKILL)

    async with httpx.AsyncClient(timeout=10, limits=httpx.Limits(max_connections=16)) as c:
        async with trio.open_nursery() as nursery:
            for _ in range(16):
                nursery.start_soon(worker, c)
    try:
        os.waitpid(relay["pid"], 0)
    except ChildProcessError:
        pass
    await trio.to_thread.run_sync(mesh.restart_relay, info, relay)
    # Home and entry are one relay: each accepted push is in its mailbox (or in custody, going there).
    got: set[str] = set()
    with trio.fail_after(60):
        while not accepted <= got:
            got = {m.id for m in await dev.pull(limit=1000)}
            await trio.sleep(0.2)
    await dev.ack(sorted(got))
    return accepted - got, len(accepted)


@pytest.mark.integration
async def test_kill9_under_concurrent_load_loses_no_push_answered_202(tmp_path: Path) -> None:
    info = await trio.to_thread.run_sync(lambda: mesh.up(tmp_path, relays=1, bootstraps=1, timeout_s=60,
                                                         trace_level="off"))
    try:
        worst = 0
        for round_no in range(3):  # repeated: the kill lands at a different point of a batch each time
            lost, accepted = await _load_then_kill(info, 600, 150 + 100 * round_no)
            print(f"round {round_no + 1}: {accepted} answered 202 before/while killed, {len(lost)} lost")
            worst = max(worst, len(lost))
        assert worst == 0
    finally:
        await trio.to_thread.run_sync(lambda: mesh.down(tmp_path))


async def test_custody_released_in_a_later_batch_is_written_with_that_batch(tmp_path: Path) -> None:
    """The entry relay's common case: custody taken in one round, released when the receipt comes back
    in a later one. The release is part of that later batch: invisible on disk until it commits (a
    crash before then re-sends the push, the home answers `duplicate`), answered at once by
    push_status, and a late receipt in the same batch corrects it; once committed, the custody row
    is gone and the status row is there for a restarted relay."""
    from inri.core.api import CustodyStatus
    from inri.protocol.codec import make_registration
    from inri.protocol.keys import new_signing_key
    from inri.protocol.messages import Push

    path = tmp_path / "relay.sqlite3"
    store = Store(path)
    reg = make_registration(new_signing_key(b"\x07" * 32), 1, int(os.times().elapsed) + 1_800_000_000, 3600)
    pushes = [Push(bytes([i]) * 16, reg.route_id, bytes([i]) * 16, b"c", 10, 0, 0, 0, reg, None) for i in range(1, 4)]
    disk = sqlite3.connect(path)

    def on_disk() -> tuple[set[bytes], dict[bytes, str]]:
        held = {bytes(p) for (p,) in disk.execute("SELECT push_id FROM custody")}
        return held, {bytes(p): s for p, s in disk.execute("SELECT push_id, status FROM push_status")}

    async with trio.open_nursery() as n:
        await n.start(store.run)
        for p in pushes:
            store.save_custody(p, 2e9, 100.0)
        await store.durable()
        assert on_disk() == ({p.push_id for p in pushes}, {})
        a, b, c = (p.push_id for p in pushes)
        store.release_custody(a, CustodyStatus.DELIVERED, 3, 101.0)
        store.release_custody(b, CustodyStatus.EXPIRED, None, 101.0)
        store.release_custody(b, CustodyStatus.DELIVERED, 4, 102.0)  # a late receipt, same batch
        assert store.uncommitted and on_disk() == ({a, b, c}, {})
        assert store.push_status(a) == {"push_id": a.hex(), "status": "delivered", "hops": 3, "accepted_at": 100.0,
                                        "settled_at": 101.0}
        assert store.push_status(b)["status"] == "delivered" and store.push_status(b)["hops"] == 4  # type: ignore[index]
        assert store.push_status(c)["status"] == "pending"  # type: ignore[index]
        assert store.custody_count() == 1
        await store.durable()
        assert on_disk() == ({c}, {a: "delivered", b: "delivered"})
        store.release_custody(b, CustodyStatus.SPENT, 5, 103.0)  # later still: corrects the committed row
        await store.durable()
        assert on_disk()[1][b] == "spent"
        n.cancel_scope.cancel()
    store.close()
    again = Store(path)  # a restarted relay
    assert [p.push_id for p, _, _ in again.load_custody()] == [c]
    again.release_custody(c, CustodyStatus.DELIVERED, 3, 104.0)
    assert again.push_status(c)["accepted_at"] == 100.0  # type: ignore[index]
    assert again.custody_count() == 0
    again.close()
    disk.close()
