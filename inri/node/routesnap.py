"""Learned routes kept across a restart (`[relay] route_snapshot_s`).

A relay learns its routes from registration gossip, which every device sends once per refresh. A
relay that restarts (an upgrade, a crash, a kill -9) would have none until each device refreshed, and
every push entered there or passing through would search its neighbourhood instead (20 pushes cost 471
frames instead of about 1.6 each, measured with real relays). So the relay writes the routes it
learned to `routes.msgpack` in its data directory every route_snapshot_s seconds and when it stops,
and reads them back at startup, before any link is up: a route's next hops are used again as their
links come back (rules M6, G2). The routes were verified when learned; the data directory is the
relay's own. Stale routes are repaired as any route is (route errors, rule F6; newer epochs win).

The routes are read out of the engine in chunks, the relay serving its other tasks between them
(relay.snapshot_routes); the file is encoded and written to a temporary name, flushed to disk and
renamed (atomic on POSIX) in a worker thread; a torn or unreadable file is logged and ignored (the
relay then learns its routes as before).

The file also keeps the relay's neighbours of the time (node id, QUIC address: "anchors", as Bitcoin
Core's anchors.dat keeps its block-relay peers). A restarted relay dials them first (rule M6's redial
list), so the next hops its restored routes name come back as links; dialled from the bootstrap's list
instead, a relay of a small mesh got other neighbours in 2 of 18 restarts, and every push it entered
searched (6-8 frames per push instead of the path's 1-3). Format 1 files (routes only) are still read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgpack
import structlog
import trio

log = structlog.get_logger("inri.routes")

SNAPSHOT_FILE = "routes.msgpack"
FORMAT_VERSION = 2  # 1: [1, rows]; 2: [2, rows, anchors]

Row = tuple[bytes, int, float, tuple[tuple[str, int], ...]]
Anchor = tuple[str, str]  # (node id, QUIC address) of a neighbour at the time of the snapshot


def encode(rows: list[Row], anchors: Sequence[Anchor] = ()) -> bytes:
    # msgpack packs tuples as arrays: the rows go in as they are (the same bytes as lists of lists; 1M
    # rows in 0.6 s, against 5.8 s when a list was built per row and per next hop first).
    data: bytes = msgpack.packb([FORMAT_VERSION, rows, list(anchors)], use_bin_type=True)
    return data


def decode_rows(data: bytes) -> list[Row]:
    """Rows of a snapshot; ValueError for anything that is not one (never a crash on a bad file)."""
    return decode(data)[0]


def decode(data: bytes) -> tuple[list[Row], list[Anchor]]:
    """Rows and anchors of a snapshot; ValueError for anything that is not one (never a crash)."""
    try:
        obj: Any = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - msgpack raises several types for bad input
        raise ValueError(f"not a route snapshot: {exc}") from None
    if not (isinstance(obj, list) and ((len(obj) == 2 and obj[0] == 1) or (len(obj) == 3 and obj[0] == 2))
            and isinstance(obj[1], list)):
        raise ValueError("not a route snapshot (version or shape)")
    anchors: list[Anchor] = []
    for a in obj[2] if len(obj) == 3 else []:
        if not (isinstance(a, list) and len(a) == 2 and isinstance(a[0], str) and isinstance(a[1], str)):
            raise ValueError("bad anchor")
        anchors.append((a[0], a[1]))
    rows: list[Row] = []
    for item in obj[1]:
        if not (isinstance(item, list) and len(item) == 4):
            raise ValueError("bad route row")
        rid, epoch, exp, hops = item
        if (not isinstance(rid, bytes) or not isinstance(epoch, int) or not isinstance(exp, (int, float))
                or not isinstance(hops, list)):
            raise ValueError("bad route row")
        vec = []
        for h in hops:
            if not (isinstance(h, list) and len(h) == 2 and isinstance(h[0], str) and isinstance(h[1], int)):
                raise ValueError("bad next hop")
            vec.append((h[0], h[1]))
        rows.append((rid, epoch, float(exp), tuple(vec)))
    return rows, anchors


def load(data_dir: str | Path) -> tuple[list[Row], list[Anchor]]:
    """The snapshot's rows and anchors (both empty when there is none, or it cannot be read: logged)."""
    path = Path(data_dir) / SNAPSHOT_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        log.warning("route snapshot unreadable", path=str(path), error=str(exc))
        return [], []
    try:
        return decode(data)
    except ValueError as exc:
        log.warning("route snapshot ignored", path=str(path), error=str(exc))
        return [], []


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


async def save(data_dir: str | Path, rows: list[Row], anchors: Sequence[Anchor]) -> None:
    """Write the snapshot (encoding and the disk work in a worker thread)."""
    path = Path(data_dir) / SNAPSHOT_FILE
    await trio.to_thread.run_sync(lambda: _write(path, encode(rows, anchors)))


def save_now(data_dir: str | Path, rows: list[Row], anchors: Sequence[Anchor]) -> None:
    """Write the snapshot from synchronous code (at shutdown, after the event loop's tasks stopped)."""
    _write(Path(data_dir) / SNAPSHOT_FILE, encode(rows, anchors))
