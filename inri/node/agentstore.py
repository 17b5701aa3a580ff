"""The Mozilla Push user agents homed at this relay and their channels, in the relay's SQLite store.

Two tables beside the store's own (created if missing, so an existing store gains them; no schema
version change): `mp_agents` (uaid, when made, when last seen) and `mp_channels` (uaid, channelID ->
the INRI route id made for it, the route key's 32-byte seed that signs its registrations, the Web Push
endpoint id minted for it, when its registration is next re-signed). Everything else about a channel
lives where it lives for any device homed here: its registration and receipt key (`devices`), its
endpoint (`wp_endpoints`), its messages (`mailbox`, `wp_messages`). So a kill -9 loses nothing the
relay answered for: every write here commits before the answer that depends on it leaves.
"""

from __future__ import annotations

from dataclasses import dataclass

from inri.node.store import Store

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS mp_agents (uaid BLOB PRIMARY KEY, created REAL NOT NULL, last_seen REAL NOT NULL)"
    " WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS mp_channels (uaid BLOB NOT NULL, channel_id BLOB NOT NULL, route_id BLOB NOT NULL,"
    " route_key BLOB NOT NULL, endpoint_id BLOB, created REAL NOT NULL, refresh_at REAL NOT NULL,"
    " PRIMARY KEY (uaid, channel_id)) WITHOUT ROWID",
    "CREATE UNIQUE INDEX IF NOT EXISTS mp_channels_route ON mp_channels (route_id)",
    "CREATE INDEX IF NOT EXISTS mp_channels_refresh ON mp_channels (refresh_at)",
)


@dataclass(frozen=True, slots=True)
class Channel:
    """One channel's row."""

    uaid: bytes
    channel_id: bytes
    route_id: bytes
    route_key: bytes  # Ed25519 seed (inri.protocol.keys.new_signing_key)
    endpoint_id: bytes | None  # None until its endpoint is minted (register finishes it)


class AgentStore:
    """Reads and writes of the two tables (see the module docstring)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        with store.transaction() as db:
            for statement in _SCHEMA:
                db.execute(statement)

    def known(self, uaid: bytes, now: float) -> bool:
        """True for an agent saved here; it is marked seen now."""
        with self.store.transaction() as db:
            return db.execute("UPDATE mp_agents SET last_seen=? WHERE uaid=?", (now, uaid)).rowcount > 0

    def exists(self, uaid: bytes) -> bool:
        """True for an agent saved here (read only, unlike `known`)."""
        return bool(self.store.query("SELECT 1 FROM mp_agents WHERE uaid=?", (uaid,)))

    def add_agent(self, uaid: bytes, now: float) -> None:
        """Save an agent that has no channel yet (it set a wake hook); nothing when it is saved already."""
        with self.store.transaction() as db:
            db.execute("INSERT OR IGNORE INTO mp_agents VALUES (?, ?, ?)", (uaid, now, now))

    def seen(self, uaid: bytes, now: float) -> None:
        """The agent was connected until now (its idle time starts again)."""
        with self.store.transaction() as db:
            db.execute("UPDATE mp_agents SET last_seen=? WHERE uaid=?", (now, uaid))

    def route_ids(self, uaid: bytes) -> list[bytes]:
        """The route ids of an agent's channels."""
        return [bytes(r) for (r,) in self.store.query("SELECT route_id FROM mp_channels WHERE uaid=?", (uaid,))]

    def channel(self, uaid: bytes, channel_id: bytes) -> Channel | None:
        rows = self.store.query("SELECT route_id, route_key, endpoint_id FROM mp_channels WHERE uaid=? AND "
                                "channel_id=?", (uaid, channel_id))
        if not rows:
            return None
        rid, key, eid = rows[0]
        return Channel(uaid, channel_id, bytes(rid), bytes(key), None if eid is None else bytes(eid))

    def channel_count(self, uaid: bytes) -> int:
        return int(self.store.query("SELECT COUNT(*) FROM mp_channels WHERE uaid=?", (uaid,))[0][0])

    def add_channel(self, ch: Channel, now: float, refresh_at: float) -> None:
        """Save a new channel (and its agent, when this is the agent's first)."""
        with self.store.transaction() as db:
            db.execute("INSERT OR IGNORE INTO mp_agents VALUES (?, ?, ?)", (ch.uaid, now, now))
            db.execute("INSERT INTO mp_channels VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (ch.uaid, ch.channel_id, ch.route_id, ch.route_key, ch.endpoint_id, now, refresh_at))

    def set_endpoint(self, route_id: bytes, endpoint_id: bytes) -> None:
        with self.store.transaction() as db:
            db.execute("UPDATE mp_channels SET endpoint_id=? WHERE route_id=?", (endpoint_id, route_id))

    def remove_channel(self, route_id: bytes) -> None:
        with self.store.transaction() as db:
            db.execute("DELETE FROM mp_channels WHERE route_id=?", (route_id,))

    def remove_agent(self, uaid: bytes) -> None:
        with self.store.transaction() as db:
            db.execute("DELETE FROM mp_channels WHERE uaid=?", (uaid,))
            db.execute("DELETE FROM mp_agents WHERE uaid=?", (uaid,))

    def due(self, now: float, limit: int) -> list[Channel]:
        """Channels whose registration is due to be re-signed, earliest first."""
        rows = self.store.query("SELECT uaid, channel_id, route_id, route_key, endpoint_id FROM mp_channels "
                                "WHERE refresh_at <= ? ORDER BY refresh_at LIMIT ?", (now, limit))
        return [Channel(bytes(u), bytes(c), bytes(r), bytes(k), None if e is None else bytes(e))
                for u, c, r, k, e in rows]

    def next_due(self) -> float | None:
        row = self.store.query("SELECT MIN(refresh_at) FROM mp_channels")[0]
        return None if row[0] is None else float(row[0])

    def set_refresh(self, route_id: bytes, refresh_at: float) -> None:
        with self.store.transaction() as db:
            db.execute("UPDATE mp_channels SET refresh_at=? WHERE route_id=?", (refresh_at, route_id))

    def idle(self, before: float) -> list[bytes]:
        """Agents last seen before `before`."""
        return [bytes(u) for (u,) in self.store.query("SELECT uaid FROM mp_agents WHERE last_seen < ?", (before,))]

    def agent_of(self, route_id: bytes) -> bytes | None:
        """The agent a route id is a channel of (None: not a channel)."""
        rows = self.store.query("SELECT uaid FROM mp_channels WHERE route_id=?", (route_id,))
        return bytes(rows[0][0]) if rows else None

    def route_of(self, uaid: bytes, channel_id: bytes) -> bytes | None:
        rows = self.store.query("SELECT route_id FROM mp_channels WHERE uaid=? AND channel_id=?", (uaid, channel_id))
        return bytes(rows[0][0]) if rows else None

    def pending(self, uaid: bytes, now: float, limit: int) -> list[tuple[bytes, bytes, bytes, int]]:
        """(channel id, push id, body, encoding) of the agent's stored, unexpired messages, oldest first."""
        rows = self.store.query(
            "SELECT c.channel_id, m.push_id, m.ciphertext, w.encoding FROM mp_channels c "
            "JOIN mailbox m ON m.route_id = c.route_id "
            "JOIN wp_messages w ON w.route_id = m.route_id AND w.push_id = m.push_id "
            "WHERE c.uaid = ? AND w.expires_at >= ? ORDER BY m.received_at, m.push_id LIMIT ?", (uaid, now, limit))
        return [(bytes(c), bytes(p), bytes(b), int(e)) for c, p, b, e in rows]

    def has_mail(self, uaid: bytes, now: float) -> bool:
        """True when the agent has a stored, unexpired message (what `pending` would return)."""
        return bool(self.store.query(
            "SELECT 1 FROM mp_channels c JOIN mailbox m ON m.route_id = c.route_id "
            "JOIN wp_messages w ON w.route_id = m.route_id AND w.push_id = m.push_id "
            "WHERE c.uaid = ? AND w.expires_at >= ? LIMIT 1", (uaid, now)))

    def orphans(self) -> list[bytes]:
        """Route ids of channels whose device is gone (a crash between the steps of register or unregister)."""
        rows = self.store.query("SELECT c.route_id FROM mp_channels c LEFT JOIN devices d ON d.route_id = c.route_id "
                                "WHERE d.route_id IS NULL")
        return [bytes(r) for (r,) in rows]

    def counts(self) -> tuple[int, int]:
        """(agents, channels) saved here."""
        a = self.store.query("SELECT COUNT(*) FROM mp_agents")[0][0]
        c = self.store.query("SELECT COUNT(*) FROM mp_channels")[0][0]
        return int(a), int(c)
