"""The bootstrap node's record store: SQLite (survives restarts) mirrored in a dict for ranking.

Only records whose addresses were proven by a QUIC handshake are stored, so everything here is
listable until it expires. Memory is bounded by `max_records`.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from inri.protocol.codec import DecodeError
from inri.protocol.peer_record import PeerRecord, decode_record, encode_record

_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    node_id TEXT PRIMARY KEY, record BLOB NOT NULL, seq INTEGER NOT NULL, prefix TEXT,
    expires_at REAL NOT NULL, updated_at REAL NOT NULL, source TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS records_updated ON records (updated_at);
"""


@dataclass(slots=True)
class Entry:
    record: PeerRecord
    raw: bytes
    prefix: str | None
    expires_at: float
    updated_at: float
    source: str  # "announce" or the URL of the bootstrap it was synced from


class RecordStore:
    """node id -> newest proven record."""

    def __init__(self, path: str | Path) -> None:
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self.entries: dict[str, Entry] = {}
        for node_id, raw, prefix, expires_at, updated_at, source in self._db.execute(
            "SELECT node_id, record, prefix, expires_at, updated_at, source FROM records"
        ):
            try:
                rec = decode_record(bytes(raw))
            except DecodeError:
                continue  # a row we cannot read is skipped, never fatal
            self.entries[node_id] = Entry(rec, bytes(raw), prefix, expires_at, updated_at, source)

    def close(self) -> None:
        self._db.close()

    def get(self, node_id: str) -> Entry | None:
        return self.entries.get(node_id)

    def put(self, record: PeerRecord, prefix: str | None, expires_at: float, now: float, source: str) -> None:
        raw = encode_record(record)
        self._db.execute(
            "INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?, ?, ?, ?)",
            (record.node_id, raw, record.seq, prefix, expires_at, now, source),
        )
        self.entries[record.node_id] = Entry(record, raw, prefix, expires_at, now, source)

    def count_prefix(self, prefix: str | None, exclude: str) -> int:
        if prefix is None:
            return 0
        return sum(1 for nid, e in self.entries.items() if e.prefix == prefix and nid != exclude
                   and e.record.capacity > 0)  # a withdrawn identity (capacity 0) holds no place

    def expire(self, now: float) -> int:
        """Drop records past their expiry; returns how many."""
        dead = [nid for nid, e in self.entries.items() if e.expires_at <= now]
        for nid in dead:
            del self.entries[nid]
        if dead:
            self._db.execute("DELETE FROM records WHERE expires_at <= ?", (now,))
        return len(dead)

    def since(self, t: float, after: str, limit: int, now: float) -> list[Entry]:
        """Up to `limit` live entries after the cursor (t, after), in (updated_at, node id) order.

        The node id breaks ties, so a page may end in the middle of records updated at the same time
        and the next page (cursor = the last entry's updated_at and node id) starts right after it.
        """
        out = sorted((e for e in self.entries.values()
                      if e.expires_at > now and (e.updated_at, e.record.node_id) > (t, after)),
                     key=lambda e: (e.updated_at, e.record.node_id))
        return out[:limit]
