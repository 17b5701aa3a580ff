"""Bootstrap-to-bootstrap sync over the real HTTP interface of two bootstrap services (in-process)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import trio
from nacl.signing import SigningKey

from bootstrap_nodes.config import BootstrapConfig
from bootstrap_nodes.service import RECORDS_PAGE, Bootstrap, BootstrapApp
from inri.protocol.peer_record import encode_record, make_peer_record
from tests.inproc import serving as served

N_RECORDS = 5000


async def _proven(addr: str, node_id: str) -> bool:
    return True  # the QUIC probe is tested elsewhere (test_bootstrap_service); here: paging only


@asynccontextmanager
async def serving(boot: Bootstrap) -> AsyncIterator[str]:
    """The bootstrap's ASGI app on 127.0.0.1, port 0 (read back); yields its URL."""
    async with served(BootstrapApp(boot)) as url:
        yield url


def _config(tmp: Path, name: str) -> BootstrapConfig:
    return BootstrapConfig(data_dir=str(tmp / name), allow_private=True, per_prefix_max=N_RECORDS,
                           rate_per_s=100.0, rate_burst=100)


async def test_sync_pages_through_5000_records_changed_within_one_interval(tmp_path: Path) -> None:
    t0 = time.time()
    src_now = [t0]
    source = Bootstrap(_config(tmp_path, "a"), _proven, clock=lambda: src_now[0])
    target = Bootstrap(_config(tmp_path, "b"), _proven)
    try:
        # 5,000 relays announce at the source within one sync interval (5 s of its clock).
        for i in range(N_RECORDS):
            src_now[0] = t0 + i * 0.001
            rec = make_peer_record(SigningKey.generate(), [f"10.{i // 200}.{i % 200}.1:4433"], "", 1, int(t0), 1)
            await source.admit(encode_record(rec), source="announce")
        src_now[0] = t0 + 10.0
        assert len(source.store.entries) == N_RECORDS > RECORDS_PAGE
        with trio.fail_after(60):
            async with serving(source) as url, httpx.AsyncClient(timeout=10) as client:
                cursors: dict[str, float] = {}
                await target._sync_from(client, url, cursors)  # one sync interval
                assert len(target.store.entries) == N_RECORDS
                assert set(target.store.entries) == set(source.store.entries)
                assert target.counters.get("sync_admitted") == N_RECORDS
                assert cursors[url] == t0 + 10.0 - 1.0  # after the last page: the peer's now (minus overlap)
                # Nothing changed since: the next interval reads one short page and admits nothing.
                await target._sync_from(client, url, cursors)
                assert target.counters.get("sync_admitted") == N_RECORDS
                # One page of the HTTP interface: at most RECORDS_PAGE records and the cursor of the next.
                page = (await client.get(url + "/v1/records", params={"since": 0})).json()
                assert len(page["records"]) == RECORDS_PAGE and page["next"]["since"] > t0
    finally:
        source.close()
        target.close()
