"""`inri relay backup` and `inri relay restore`: what a relay cannot lose, copied consistently.

What a relay cannot lose is its key (`node.key`: its identity) and its store (`relay.sqlite3`: every
device homed here, their tokens, mailboxes and receipt keys, the Web Push key, pushes in custody).
The store is copied with SQLite's online backup API (sqlite3.Connection.backup) from a read-only
connection: the copy is one consistent snapshot, and the running relay keeps committing meanwhile
(WAL mode: a reader never blocks the writer). Everything else in the data directory is rebuilt by
the relay (routes.msgpack, traces, relay.json).

Restore refuses while a relay holds the directory (its lock), checks the backup first, and moves
what it replaces aside (never deletes it), together with the old store's -wal/-shm files: a stale
WAL beside a restored database would be replayed into it.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

from inri import __version__
from inri.common.identity import NodeIdentity
from inri.common.lock import DataDirBusy, DataDirLock
from inri.node.datadir import KEY_FILE, STORE_FILE
from inri.node.migrations import stored_version

MANIFEST = "backup.json"
STORE_SIDE_FILES = ("-wal", "-shm")


class BackupError(Exception):
    """The backup or restore could not be made; one line for the operator."""


def backup(data_dir: Path, out: Path) -> dict[str, Any]:
    """Copy node.key and a snapshot of relay.sqlite3 from data_dir into the new directory out."""
    key, db = data_dir / KEY_FILE, data_dir / STORE_FILE
    if not key.is_file() or not db.is_file():
        raise BackupError(f"{data_dir} holds no relay ({KEY_FILE} and {STORE_FILE} expected)")
    try:
        out.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        raise BackupError(f"{out} exists: a backup goes into a new directory") from None
    except OSError as exc:
        raise BackupError(f"cannot create {out}: {exc.strerror or exc}") from None
    try:
        identity = NodeIdentity.load_or_create(key)
        _copy_private(key, out / KEY_FILE)
        copy = out / STORE_FILE
        os.close(os.open(copy, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
        src = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        dst = sqlite3.connect(copy)
        try:
            src.backup(dst)  # one consistent snapshot; the relay's writer goes on (WAL)
            schema = stored_version(dst)
            devices = dst.execute("SELECT count(*) FROM devices").fetchone()[0]
        finally:
            dst.close()
            src.close()
    except (OSError, sqlite3.Error, ValueError) as exc:
        raise BackupError(f"backup of {data_dir} failed: {exc}") from None
    manifest = {"node_id": identity.node_id, "schema": schema, "devices": devices, "inri": __version__,
                "taken_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "out": str(out)}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def restore(source: Path, data_dir: Path) -> dict[str, Any]:
    """Put the backup in `source` into data_dir (the relay stopped); what it replaces is moved aside."""
    key, db = source / KEY_FILE, source / STORE_FILE
    try:
        identity = NodeIdentity.load_or_create(key) if key.is_file() else None
        check = sqlite3.connect(f"file:{db}?mode=ro", uri=True) if db.is_file() else None
        if identity is None or check is None:
            raise BackupError(f"{source} is not a backup ({KEY_FILE} and {STORE_FILE} expected)")
        try:
            ok = check.execute("PRAGMA integrity_check").fetchone()[0]
        finally:
            check.close()
        if ok != "ok":
            raise BackupError(f"{db} fails SQLite's integrity check: {ok}")
    except (ValueError, sqlite3.Error) as exc:
        raise BackupError(f"{source}: {exc}") from None
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    lock = DataDirLock(data_dir, "relay")
    try:
        lock.acquire()
    except DataDirBusy as exc:
        raise BackupError(f"{exc}: stop it before restoring") from None
    try:
        aside = data_dir / f"replaced-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        moved = []
        for name in (KEY_FILE, STORE_FILE, *(STORE_FILE + s for s in STORE_SIDE_FILES)):
            if (data_dir / name).exists():
                aside.mkdir(mode=0o700, exist_ok=True)
                os.replace(data_dir / name, aside / name)
                moved.append(name)
        _copy_private(key, data_dir / KEY_FILE)
        _copy_private(db, data_dir / STORE_FILE)
    except OSError as exc:
        raise BackupError(f"restore into {data_dir} failed: {exc.strerror or exc}") from None
    finally:
        lock.release()
    return {"node_id": identity.node_id, "data_dir": str(data_dir),
            "moved_aside": str(aside) if moved else None}


def _copy_private(src: Path, dst: Path) -> None:
    """Copy a file to a new owner-only (0600) file, flushed to disk."""
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
        shutil.copyfileobj(inp, out)
        out.flush()
        os.fsync(out.fileno())
