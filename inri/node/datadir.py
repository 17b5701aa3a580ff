"""A relay's data directory, opened for one process: lock, identity, store, each refusal one line.

What the directory holds and what to back up: docs/operations.md ("Back up and restore").
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inri.common.identity import NodeIdentity
from inri.common.lock import DataDirBusy, DataDirLock
from inri.node.migrations import SchemaError
from inri.node.store import Store, StoreSync

KEY_FILE = "node.key"
STORE_FILE = "relay.sqlite3"


class DataDirError(Exception):
    """The data directory cannot be used; the message is one line for the operator (exit 1)."""


@dataclass
class OpenDataDir:
    """What a running relay holds of its directory: close() releases them (the lock last)."""

    path: Path
    lock: DataDirLock
    identity: NodeIdentity
    store: Store

    def close(self) -> None:
        """Close the store, then let the directory go."""
        self.store.close()
        self.lock.release()


def make_dir(path: Path) -> None:
    """Create the data directory owner-only (mode 0700) if it is missing; an existing one is left as it is."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise DataDirError(f"cannot create the data directory {path}: {exc.strerror or exc}") from None


def load_identity(path: Path) -> NodeIdentity:
    """The relay's key from `path/node.key` (created, mode 0600, when missing); DataDirError if unreadable."""
    try:
        return NodeIdentity.load_or_create(path / KEY_FILE)
    except ValueError as exc:  # names the file: not a key file, or corrupt
        raise DataDirError(f"{exc}; restore it from your backup (docs/operations.md, \"Back up and restore\")") \
            from None
    except OSError as exc:
        raise DataDirError(f"cannot read {path / KEY_FILE}: {exc.strerror or exc}") from None


def open_data_dir(path: Path, synchronous: StoreSync | str, mailbox_max: int = 1000) -> OpenDataDir:
    """Lock the directory (one relay per data directory), load the identity, open and migrate the store."""
    make_dir(path)
    lock = DataDirLock(path, "relay")
    try:
        lock.acquire()
    except DataDirBusy as exc:
        raise DataDirError(str(exc)) from None
    except OSError as exc:
        raise DataDirError(f"cannot lock the data directory {path}: {exc.strerror or exc}") from None
    try:
        identity = load_identity(path)
        try:
            store = Store(path / STORE_FILE, synchronous=synchronous, mailbox_max=mailbox_max)
        except SchemaError as exc:
            raise DataDirError(str(exc)) from None
        except OSError as exc:
            raise DataDirError(f"cannot open {path / STORE_FILE}: {exc.strerror or exc}") from None
    except BaseException:
        lock.release()
        raise
    return OpenDataDir(path, lock, identity, store)

