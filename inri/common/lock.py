"""One daemon per data directory: an exclusive, non-blocking lock on `DIR/lock`.

A second relay (or bootstrap) started on the same directory, or on a copy still mounted at the same
path, is refused with one line naming the process that holds it; two relays sharing a directory
would write one SQLite store and one `relay.json` (the second deleted the first's on exit).

fcntl.flock: the kernel drops the lock when the holder exits, however it exits (kill -9 included),
so a stale lock file never blocks a restart; the file only carries the holder's pid for the message.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

LOCK_FILE = "lock"


class DataDirBusy(Exception):
    """Another process holds the data directory; the message is one line for the operator."""


class DataDirLock:
    """Held from `acquire()` until `release()` (or the process ends)."""

    def __init__(self, data_dir: Path, what: str) -> None:
        self.path = Path(data_dir) / LOCK_FILE
        self.what = what  # "relay" or "bootstrap": named in the refusal
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise DataDirBusy (never waits)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise DataDirBusy(f"data directory {self.path.parent} is in use by another {self.what} (pid {holder}): "
                              f"one {self.what} per data directory (and per identity)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd

    def release(self) -> None:
        """Let the directory go (closing the descriptor drops the lock)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
