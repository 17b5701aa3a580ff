"""The relay's durable store: SQLite in WAL mode, one connection, every write committed before it counts.

It holds the home relay's devices (registration, hashed device secret), their one-use tokens and
mailboxes, the pushes this relay holds in custody, and the final status of pushes it accepted. The
Mozilla Push user agents and their channels are kept in the same database by inri/node/agentstore.py
(its own tables, through `transaction()` and `query()`).
It implements the engine's `HomeStore` contract with exactly MemoryHomeStore's semantics.

Durability (config `[store] synchronous`, `StoreSync`): WAL with synchronous=NORMAL (the default)
survives a crash or kill -9 of the process (a committed transaction is in the WAL file); a power loss
may lose the last transactions, which synchronous=FULL prevents at the cost of an fsync per commit
(benchmarks/bench_store_sync.py measures the pushes/s it costs).

Group commit (issue 16 item 3). Standalone (tests, tools), every method commits before it returns.
A relay runs `Store.run()`: then the hot-path writes of a push (custody taken and released, a
message stored at its home, attempt numbers) go into one open transaction shared by every push of
the scheduling round, and `run()` commits it once per round: three commits per push at the home
became one per round, whatever the rate. Nothing that says "this push is safe" leaves before that
commit: the API awaits `durable()` before its 202, and the service queues frames (receipts, forwards)
with `after_commit()`. Under the configured `synchronous` mode a commit is exactly as durable as
before. SQLite statements inside the open transaction touch only its page cache (microseconds); the
calls that wait on the disk are off the event loop: WAL checkpoints (an fsync each) run in a worker
thread on a second connection (automatic checkpoints on the main connection are off), so a push
never waits behind one. Any other write (devices, tokens, endpoints) still commits at once, taking
the open batch with it.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import hmac
import os
import sqlite3
import time
from collections.abc import Callable, Container, Iterator
from pathlib import Path
from typing import Any

import trio

from inri.core.budget import KeyedBuckets
from inri.core.home import (
    ENDPOINT_BURST,
    ENDPOINT_RATE_PER_S,
    TTL0_GRACE_S,
    WHILE_REGISTERED,
    ReceiptKeyring,
    tag_ok,
)
from inri.node.migrations import SchemaError, migrate
from inri.protocol.codec import DecodeError, decode, decode_registration, encode_registration, encode_unchecked
from inri.protocol.messages import ContentEncoding, Push, ReceiptStatus, Registration, Urgency
from inri.protocol.webpush import EndpointToken

# 2: registrations in protocol v2 wire form (with a receipt key) and the devices' receipt key seeds.
# A change to an existing table bumps this with a step in migrations.py (its docstring says how); a new
# table needs none (created when missing): superseded_receipt_keys (rule F5c).
SCHEMA_VERSION = 2
STATUS_RETENTION_S = 7 * 24 * 3600  # push status answers kept a week after settling
# A Web Push message that left the mailbox (acknowledged, replaced by its topic, expired) is remembered
# (wp_acked) until it could no longer arrive again: its TTL's end, and at least this long. A custodian
# re-sends a push until its receipt comes back (a lost receipt, a backup copy adopted after a link
# failure: rule C8) for up to max(its TTL, [engine] custody_deadline_s = 300 s) after accepting it; a Web
# Push message has no token whose spend would answer `duplicate` (a native push does), so without this
# record a copy arriving after the ack is stored and delivered again.
WP_DEDUP_MIN_S = 900.0
CHECKPOINT_INTERVAL_S = 1.0  # a grouping store checkpoints the WAL this often (in a thread) when it was written

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS devices (
    route_id BLOB PRIMARY KEY, registration BLOB NOT NULL, epoch INTEGER NOT NULL,
    secret_hash BLOB NOT NULL, created REAL NOT NULL, receipt_secret BLOB);
CREATE TABLE IF NOT EXISTS tokens (
    token BLOB NOT NULL, route_id BLOB NOT NULL, spent_by BLOB,
    PRIMARY KEY (route_id, token)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS mailbox (
    push_id BLOB NOT NULL, route_id BLOB NOT NULL, ciphertext BLOB NOT NULL, received_at REAL NOT NULL,
    PRIMARY KEY (route_id, push_id));
CREATE INDEX IF NOT EXISTS mailbox_order ON mailbox (route_id, received_at);
CREATE TABLE IF NOT EXISTS custody (
    push_id BLOB PRIMARY KEY, frame BLOB NOT NULL, deadline REAL NOT NULL, attempt INTEGER NOT NULL,
    accepted_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS push_status (
    push_id BLOB PRIMARY KEY, status TEXT NOT NULL, hops INTEGER, accepted_at REAL NOT NULL, settled_at REAL);
CREATE TABLE IF NOT EXISTS wp_endpoints (
    route_id BLOB NOT NULL, endpoint_id BLOB NOT NULL, vapid_key BLOB, revoked INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL, seal_key BLOB, PRIMARY KEY (route_id, endpoint_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS wp_gone (route_id BLOB PRIMARY KEY, receipt_secret BLOB) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS superseded_receipt_keys (
    route_id BLOB NOT NULL, receipt_secret BLOB NOT NULL, until REAL NOT NULL,
    PRIMARY KEY (route_id, receipt_secret));
CREATE TABLE IF NOT EXISTS wp_messages (
    push_id BLOB NOT NULL, route_id BLOB NOT NULL, endpoint_id BLOB NOT NULL, topic TEXT,
    urgency INTEGER NOT NULL, encoding INTEGER NOT NULL, expires_at REAL NOT NULL,
    PRIMARY KEY (route_id, push_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS wp_acked (
    route_id BLOB NOT NULL, push_id BLOB NOT NULL, until REAL NOT NULL,
    PRIMARY KEY (route_id, push_id)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS wp_acked_until ON wp_acked (until);
"""

# Wake hooks (inri/node/wake.py): one per owner (a device's route id, or a Mozilla Push uaid), the
# gateway URL and the token sealed to the gateway (opaque here). Deleted with the device.
_WAKE_SCHEMA = """
CREATE TABLE IF NOT EXISTS wake_hooks (
    kind INTEGER NOT NULL, owner BLOB NOT NULL, url TEXT NOT NULL, token BLOB NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (kind, owner)) WITHOUT ROWID;
"""


class StoreSync(enum.StrEnum):
    """`[store] synchronous`: SQLite's PRAGMA synchronous for the relay's WAL database."""

    NORMAL = "normal"  # survives a crash or kill -9 of the process; a power loss may lose the last commits
    FULL = "full"  # survives a power loss too, at the cost of an fsync per committed push


def secret_hash(secret: bytes) -> bytes:
    """What the store keeps of a device secret (a leaked database does not let anyone act as the device)."""
    return hashlib.blake2b(secret, digest_size=32, person=b"inri-dev-secret").digest()


class Store:
    """SQLite-backed home store, custody table and push status (see module docstring)."""

    def __init__(self, path: str | Path, *, mailbox_max: int = 1000,
                 synchronous: StoreSync | str = StoreSync.NORMAL) -> None:
        self.path = str(path)
        self.mailbox_max = mailbox_max
        self.synchronous = StoreSync(synchronous)  # ValueError for anything but "normal" / "full"
        # Device registrations, receipt keys and the Web Push key: owner-only, whatever the umask
        # (SQLite gives its -wal and -shm files the database file's mode).
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={self.synchronous.value.upper()}")
            self._db.execute("PRAGMA foreign_keys=ON")
            migrate(self._db, self.path, SCHEMA_VERSION)  # before the schema script: steps see the old tables
            self._db.executescript(_SCHEMA)
            self._db.executescript(_WAKE_SCHEMA)
        except sqlite3.DatabaseError as exc:  # not a database, or a damaged one: one line, not a traceback
            self._db.close()
            raise SchemaError(f"{self.path}: cannot open the store: {exc}") from None
        except SchemaError:
            self._db.close()
            raise
        row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is None:
            self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        self._home: dict[bytes, Registration] = {}
        self._box_counts: dict[bytes, int] = {}  # route id -> stored messages (see _box_count)
        # The receipt keys the devices handed over, current and superseded (rule F5c): they sign this
        # home's receipts and never leave this relay (docs/security.md "Receipt signatures").
        self._receipt_keys = ReceiptKeyring()
        self._gone: set[bytes] = set()  # unregistered devices whose Web Push endpoints answer GONE
        wall = time.time()
        for rid, blob, rsecret in self._db.execute("SELECT route_id, registration, receipt_secret FROM devices"):
            self._home[bytes(rid)] = decode_registration(bytes(blob))
            if rsecret is not None:
                self._receipt_keys.install(bytes(rid), bytes(rsecret), None, wall)
        for rid, rsecret in self._db.execute("SELECT route_id, receipt_secret FROM wp_gone"):
            self._gone.add(bytes(rid))
            if rsecret is not None and bytes(rid) not in self._home:  # its Web Push endpoints answer GONE, signed
                self._receipt_keys.install(bytes(rid), bytes(rsecret), None, wall)
        # In rowid order: the order they were superseded (the keyring drops the earliest first, rule F5c).
        for rid, rsecret, until in self._db.execute("SELECT route_id, receipt_secret, until FROM "
                                                    "superseded_receipt_keys ORDER BY rowid"):
            self._receipt_keys.keep(bytes(rid), bytes(rsecret), float(until), wall)
        # Web Push: the key endpoint capabilities derive from (random, made once, kept with the store).
        row = self._db.execute("SELECT value FROM meta WHERE key='wp_home_key'").fetchone()
        if row is None:
            row = (os.urandom(32).hex(),)
            self._db.execute("INSERT INTO meta VALUES ('wp_home_key', ?)", row)
        self.home_key = bytes.fromhex(row[0])
        # Whether a device's stream is open (the service sets this): a TTL 0 push is stored only then.
        self.stream_open: Callable[[bytes], bool] = lambda route_id: False
        self.endpoint_limits = KeyedBuckets(ENDPOINT_RATE_PER_S, ENDPOINT_BURST)
        # Group commit (module docstring): on only while run() commits the batches.
        self._grouping = False
        self._dirty = trio.Event()  # set when a batch is opened: run() commits it
        self._committed = trio.Event()  # set (and replaced) when the open batch commits
        self._after_commit: list[Callable[[], None]] = []
        self._before_commit: list[Callable[[], None]] = []
        self._commits = 0  # batches committed (checkpoints run when this moved)
        # Custody taken in the open batch: push id -> (push, deadline, attempt, accepted_at), written
        # just before the batch commits. A push whose custody also ends in the batch (its home is this
        # relay) never touches the custody table: one status row instead of insert, select, delete.
        self._custody_new: dict[bytes, tuple[Push, float, int, float]] = {}
        # push id -> accepted_at of every push whose custody row is in the table (committed, or in
        # the open batch and not in _custody_new): releasing it needs no read.
        self._held: dict[bytes, float] = {}
        # Custody released in the open batch, written just before it commits (executemany): rows to
        # delete from the custody table, and push id -> its status row (status, hops, accepted, settled).
        self._unheld: list[tuple[bytes]] = []
        self._released: dict[bytes, tuple[str, int | None, float, float]] = {}

    @contextlib.contextmanager
    def _tx(self) -> Iterator[None]:
        """One transaction committed before the block's caller goes on, rolled back on any exception.

        With a batch open (grouping), the block joins it and the whole batch commits at its end."""
        db = self._db
        if db.in_transaction:
            with self._savepoint():
                yield
            self._commit()
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A transaction over tables another module keeps in this database (inri/node/agentstore.py),
        committed before the block's caller goes on, rolled back on an exception (as every write here)."""
        with self._tx():
            yield self._db

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        """The rows of one read (tables kept by other modules, joined with these)."""
        return self._db.execute(sql, params).fetchall()

    @contextlib.contextmanager
    def _write(self) -> Iterator[None]:
        """A hot-path write: into the open batch while grouping (committed by run()), else its own transaction."""
        if not self._grouping:
            with self._tx():
                yield
            return
        self._open_batch()
        with self._savepoint():
            yield

    def _open_batch(self) -> None:
        if not self._db.in_transaction:
            self._db.execute("BEGIN IMMEDIATE")
            self._dirty.set()

    @contextlib.contextmanager
    def _savepoint(self) -> Iterator[None]:
        """Part of the open transaction, all or nothing (an exception undoes only this part)."""
        db = self._db
        db.execute("SAVEPOINT part")
        try:
            yield
        except BaseException:
            db.execute("ROLLBACK TO part")
            db.execute("RELEASE part")
            raise
        db.execute("RELEASE part")

    def _commit(self) -> None:
        """Commit the open batch, then wake what waited on it and run its after-commit actions, in order."""
        if self._db.in_transaction:
            hooks, self._before_commit = self._before_commit, []
            for hook in hooks:  # e.g. the round's receipts (rule F5b): their frames join the after-commit actions
                hook()
            self._flush_released()  # first: a push id released and then taken again stays held
            if self._custody_new:
                # encode_unchecked: the engine built these pushes from ones the API or the decoder
                # validated (the frames sent for them are encoded the same way: service._UNCHECKED).
                self._db.executemany("INSERT OR REPLACE INTO custody VALUES (?, ?, ?, ?, ?)",
                                     [(pid, encode_unchecked(push), deadline, attempt, now)
                                      for pid, (push, deadline, attempt, now) in self._custody_new.items()])
                self._held.update((pid, new[3]) for pid, new in self._custody_new.items())
                self._custody_new.clear()
            self._db.execute("COMMIT")
            self._commits += 1
        done, self._committed = self._committed, trio.Event()
        done.set()
        actions, self._after_commit = self._after_commit, []
        for action in actions:
            action()

    def _flush_released(self) -> None:
        """Write the custody released in the open batch: two statements, however many pushes."""
        if self._unheld:
            self._db.executemany("DELETE FROM custody WHERE push_id=?", self._unheld)
            self._unheld = []
        if self._released:
            self._db.executemany("INSERT OR REPLACE INTO push_status VALUES (?, ?, ?, ?, ?)",
                                 [(pid, *row) for pid, row in self._released.items()])
            self._released = {}

    @property
    def uncommitted(self) -> bool:
        """True while a batch holds writes not yet committed."""
        return self._db.in_transaction

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run action once what is written now is committed (at once when nothing is pending)."""
        if self._db.in_transaction:
            self._after_commit.append(action)
        else:
            action()

    def before_commit(self, action: Callable[[], None]) -> None:
        """Run action just before the open batch commits (at once when nothing is pending); what it writes
        or defers with after_commit joins that batch."""
        if self._db.in_transaction:
            self._before_commit.append(action)
        else:
            action()

    async def durable(self) -> None:
        """Return once every write made so far is committed (at once when nothing is pending)."""
        if self._db.in_transaction:
            await self._committed.wait()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Group commit until cancelled: one commit per scheduling round, checkpoints in a worker thread."""
        self._grouping = True
        self._db.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints are _checkpoints' (off the event loop)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._checkpoints)
                task_status.started()
                while True:
                    await self._dirty.wait()
                    self._dirty = trio.Event()
                    # One turn for every task ready now (requests of this round add their pushes), then commit.
                    await trio.lowlevel.cancel_shielded_checkpoint()
                    self._commit()
        finally:
            self._grouping = False
            self._commit()
            self._db.execute("PRAGMA wal_autocheckpoint=1000")  # SQLite's default again

    async def _checkpoints(self) -> None:
        seen = self._commits
        conn: sqlite3.Connection | None = None
        try:
            while True:
                await trio.sleep(CHECKPOINT_INTERVAL_S)
                if self._commits == seen:
                    continue
                seen = self._commits
                if conn is None:
                    conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                # PASSIVE: never waits for (nor blocks) the writer; the fsyncs it does happen in the thread.
                await trio.to_thread.run_sync(_checkpoint, conn, abandon_on_cancel=False)
        finally:
            if conn is not None:
                conn.close()

    def close(self) -> None:
        """Commit what is pending, then close the connection."""
        self._commit()
        self._db.close()

    # -- devices ----------------------------------------------------------------------------------

    def add_device(self, registration: Registration, secret: bytes, tokens: list[bytes], now: float,
                   receipt_secret: bytes | None = None) -> bool:
        """Home a new device; False when its route id is already homed here (nothing changes).

        receipt_secret: the 32-byte seed of the device's receipt key (its public half is the
        registration's receipt_key; the caller checked that they match).
        """
        rid = registration.route_id
        with self._tx():
            try:
                self._db.execute(
                    "INSERT INTO devices (route_id, registration, epoch, secret_hash, created, receipt_secret)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (rid, encode_registration(registration), registration.epoch, secret_hash(secret), now,
                     receipt_secret),
                )
            except sqlite3.IntegrityError:
                return False
            self._db.executemany("INSERT OR IGNORE INTO tokens VALUES (?, ?, NULL)", [(t, rid) for t in tokens])
            self._db.execute("DELETE FROM superseded_receipt_keys WHERE route_id=?", (rid,))
        self._home[rid] = registration
        self._receipt_keys.forget(rid)  # an unregistered device's keys (its GONE answers) end here
        if receipt_secret is not None:
            self._receipt_keys.install(rid, receipt_secret, None, registration.issued_at)
        return True

    def check_secret(self, route_id: bytes, secret: bytes) -> bool:
        """True when secret is this device's secret (constant-time compare)."""
        row = self._db.execute("SELECT secret_hash FROM devices WHERE route_id=?", (route_id,)).fetchone()
        return row is not None and hmac.compare_digest(bytes(row[0]), secret_hash(secret))

    def refresh_registration(self, registration: Registration, receipt_secret: bytes | None = None) -> bool:
        """Store a newer epoch of a homed device's registration; False if not newer or not homed here.

        receipt_secret: the registration's receipt key seed, when the device hands over a new one. The key
        it replaces is kept until the registration that carried it expires, or while the device stays
        registered when it has Web Push endpoints (rule F5c: pushes made with credentials, and to endpoint
        URLs, from before the rotation are answered under their own key).
        """
        rid = registration.route_id
        old = self._home.get(rid)
        if old is None or registration.epoch <= old.epoch:
            return False
        keys = self._receipt_keys
        if receipt_secret is not None:
            endpoints = self._db.execute("SELECT 1 FROM wp_endpoints WHERE route_id=? AND revoked=0 LIMIT 1",
                                         (rid,)).fetchone()
            keys.install(rid, receipt_secret, old.expires_at if endpoints is None else WHILE_REGISTERED,
                         registration.issued_at)
        with self._tx():
            self._db.execute("UPDATE devices SET registration=?, epoch=? WHERE route_id=?",
                             (encode_registration(registration), registration.epoch, rid))
            if receipt_secret is not None:
                self._db.execute("UPDATE devices SET receipt_secret=? WHERE route_id=?", (receipt_secret, rid))
                self._db.execute("DELETE FROM superseded_receipt_keys WHERE route_id=?", (rid,))
                self._db.executemany("INSERT INTO superseded_receipt_keys VALUES (?, ?, ?)",
                                     [(rid, seed, until) for seed, until in keys.superseded(rid)])
        self._home[rid] = registration
        return True

    def add_tokens(self, route_id: bytes, tokens: list[bytes]) -> None:
        """More one-use tokens for a homed device."""
        with self._tx():
            self._db.executemany("INSERT OR IGNORE INTO tokens VALUES (?, ?, NULL)", [(t, route_id) for t in tokens])

    def unspent_tokens(self, route_id: bytes) -> int:
        """How many tokens of route_id are still unspent."""
        row = self._db.execute("SELECT COUNT(*) FROM tokens WHERE route_id=? AND spent_by IS NULL",
                               (route_id,)).fetchone()
        return int(row[0])

    def remove_device(self, route_id: bytes) -> None:
        """Unregister: delete the device, its tokens and its mailbox (nothing about it remains but, when it
        had Web Push endpoints, its route id and receipt keys: they answer GONE, signed)."""
        row = self._db.execute("SELECT receipt_secret FROM devices WHERE route_id=?", (route_id,)).fetchone()
        key = None if row is None or row[0] is None else bytes(row[0])
        with self._tx():
            had = self._db.execute("SELECT 1 FROM wp_endpoints WHERE route_id=? LIMIT 1", (route_id,)).fetchone()
            for table in ("devices", "tokens", "mailbox", "wp_endpoints", "wp_messages", "wp_acked"):
                self._db.execute(f"DELETE FROM {table} WHERE route_id=?", (route_id,))  # noqa: S608 - fixed names
            if had:  # its Web Push endpoints answer 410 from now on (senders then forget them)
                # The receipt keys stay with it: its GONE receipts must verify (rules F5, F5c).
                self._db.execute("INSERT OR IGNORE INTO wp_gone VALUES (?, ?)", (route_id, key))
            else:
                self._db.execute("DELETE FROM superseded_receipt_keys WHERE route_id=?", (route_id,))
        self._home.pop(route_id, None)
        self._box_counts.pop(route_id, None)
        if had:
            self._gone.add(route_id)
        else:
            self._receipt_keys.forget(route_id)

    def homed(self) -> list[Registration]:
        """Every registration homed here (re-gossiped after a restart)."""
        return list(self._home.values())

    # -- HomeStore --------------------------------------------------------------------------------

    def is_home(self, route_id: bytes) -> bool:
        return route_id in self._home

    def registration(self, route_id: bytes) -> Registration | None:
        return self._home.get(route_id)

    def receipt_keys(self, route_id: bytes) -> Container[bytes] | None:
        """See `inri.core.api.HomeStore.receipt_keys` (same semantics as MemoryHomeStore's)."""
        if route_id in self._home or route_id in self._gone:
            return self._receipt_keys.held(route_id)
        return None

    def sign_receipt(self, route_id: bytes, message: bytes, receipt_key: bytes | None) -> bytes | None:
        """See `inri.core.api.HomeStore.sign_receipt`."""
        return self._receipt_keys.sign(route_id, message, receipt_key)

    def accept_push(
        self, route_id: bytes, token: bytes, push_id: bytes, ciphertext: bytes, now: float
    ) -> ReceiptStatus:
        """Spend token for push_id and store the message, in one transaction (see HomeStore)."""
        if route_id not in self._home:
            return ReceiptStatus.UNKNOWN_TOKEN
        db = self._db
        with self._write():
            n = self._box_count(route_id)
            # The common case in one statement: an unspent token, spent now, and room in the mailbox.
            # Anything else (no such token, spent already, mailbox full) is told apart by the SELECT.
            if n >= self.mailbox_max or not db.execute(
                    "UPDATE tokens SET spent_by=? WHERE route_id=? AND token=? AND spent_by IS NULL",
                    (push_id, route_id, token)).rowcount:
                row = db.execute("SELECT spent_by FROM tokens WHERE route_id=? AND token=?",
                                 (route_id, token)).fetchone()
                if row is None:
                    return ReceiptStatus.UNKNOWN_TOKEN
                if row[0] is not None:
                    return ReceiptStatus.DUPLICATE if bytes(row[0]) == push_id else ReceiptStatus.SPENT
                return ReceiptStatus.MAILBOX_FULL
            # A push id reused with another token replaces its message (as MemoryHomeStore does).
            cur = db.execute("INSERT OR IGNORE INTO mailbox VALUES (?, ?, ?, ?)", (push_id, route_id, ciphertext, now))
            if cur.rowcount:
                self._box_counts[route_id] = n + 1
            else:
                db.execute("UPDATE mailbox SET ciphertext=?, received_at=? WHERE route_id=? AND push_id=?",
                           (ciphertext, now, route_id, push_id))
        return ReceiptStatus.STORED

    # -- Web Push endpoints -----------------------------------------------------------------------

    def mint_endpoint(self, route_id: bytes, vapid_key: bytes | None, now: float,
                      seal_key: bytes | None = None) -> EndpointToken:
        """A new Web Push endpoint of a device homed here (restricted to vapid_key when given; seal_key,
        the device's public X25519 key, goes into the URL for Matrix gateways)."""
        eid = os.urandom(16)
        with self._tx():
            self._db.execute("INSERT INTO wp_endpoints (route_id, endpoint_id, vapid_key, revoked, created, seal_key) "
                             "VALUES (?, ?, ?, 0, ?, ?)", (route_id, eid, vapid_key, now, seal_key))
        return EndpointToken.mint(self.home_key, route_id, eid, vapid_key, seal_key)

    def endpoints(self, route_id: bytes) -> list[tuple[EndpointToken, bytes | None]]:
        """The device's live endpoints, oldest first: (token for its URL, restricting VAPID key)."""
        rows = self._db.execute("SELECT endpoint_id, vapid_key, seal_key FROM wp_endpoints WHERE route_id=? "
                                "AND revoked=0 ORDER BY created", (route_id,))
        out = []
        for eid, key, seal in rows:
            vk = None if key is None else bytes(key)
            sk = None if seal is None else bytes(seal)
            out.append((EndpointToken.mint(self.home_key, route_id, bytes(eid), vk, sk), vk))
        return out

    def endpoint_count(self) -> int:
        """Live Web Push endpoints of every device homed here."""
        return int(self._db.execute("SELECT COUNT(*) FROM wp_endpoints WHERE revoked=0").fetchone()[0])

    def revoke_endpoint(self, route_id: bytes, endpoint_id: bytes) -> bool:
        """Revoke an endpoint (pushes to it then get 410); False when the device has no such live one."""
        with self._tx():
            cur = self._db.execute("UPDATE wp_endpoints SET revoked=1 WHERE route_id=? AND endpoint_id=? AND revoked=0",
                                   (route_id, endpoint_id))
            self._db.execute("DELETE FROM wp_messages WHERE route_id=? AND endpoint_id=?", (route_id, endpoint_id))
        return cur.rowcount > 0

    def accept_webpush(self, push: Push, now: float) -> ReceiptStatus | None:
        """See `inri.core.api.HomeStore.accept_webpush` (same semantics as MemoryHomeStore's)."""
        meta = push.webpush
        rid = push.route_id
        assert meta is not None
        db = self._db
        if rid not in self._home:
            gone = db.execute("SELECT 1 FROM wp_gone WHERE route_id=?", (rid,)).fetchone()
            return ReceiptStatus.GONE if gone else None
        if db.execute("SELECT 1 FROM mailbox WHERE route_id=? AND push_id=?", (rid, push.push_id)).fetchone() \
                or db.execute("SELECT 1 FROM wp_acked WHERE route_id=? AND push_id=?", (rid, push.push_id)).fetchone():
            return ReceiptStatus.DUPLICATE  # stored, or stored and gone (acknowledged, replaced, expired)
        row = db.execute("SELECT vapid_key, revoked FROM wp_endpoints WHERE route_id=? AND endpoint_id=?",
                         (rid, meta.endpoint_id)).fetchone()
        if row is None or not tag_ok(self.home_key, push, meta, None if row[0] is None else bytes(row[0])):
            return ReceiptStatus.UNKNOWN_ENDPOINT  # a forged tag says nothing about the endpoint
        if row[1]:
            return ReceiptStatus.GONE
        if self.endpoint_limits.take((rid + meta.endpoint_id).hex()):
            return ReceiptStatus.RATE_LIMITED
        remaining = max(0, meta.ttl_s - meta.age_s)  # TTL runs from the entry relay's acceptance
        if remaining == 0 and not self.stream_open(rid):
            return ReceiptStatus.EXPIRED  # RFC 8030: accepted, and dropped (nobody to hand it to now)
        with self._write():
            if meta.topic is not None:  # RFC 8030 5.4: replaces the unacknowledged one with this topic
                old = [(rid, bytes(p)) for (p,) in db.execute(
                    "SELECT push_id FROM wp_messages WHERE route_id=? AND endpoint_id=? AND topic=?",
                    (rid, meta.endpoint_id, meta.topic))]
                self._remember_gone(old, now)  # a late copy of a replaced one must not replace this one
                db.executemany("DELETE FROM mailbox WHERE route_id=? AND push_id=?", old)
                db.executemany("DELETE FROM wp_messages WHERE route_id=? AND push_id=?", old)
                if old:
                    self._box_counts.pop(rid, None)
            n = self._box_count(rid)
            if n >= self.mailbox_max:
                return ReceiptStatus.MAILBOX_FULL
            db.execute("INSERT INTO mailbox VALUES (?, ?, ?, ?)", (push.push_id, rid, push.ciphertext, now))
            db.execute("INSERT INTO wp_messages VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (push.push_id, rid, meta.endpoint_id, meta.topic, int(meta.urgency), int(meta.encoding),
                        now + max(remaining, TTL0_GRACE_S)))
            self._box_counts[rid] = n + 1
        return ReceiptStatus.STORED

    def webpush_meta(self, route_id: bytes) -> dict[bytes, tuple[bytes, str | None, Urgency, ContentEncoding, float]]:
        """push id -> (endpoint id, topic, urgency, encoding, expires_at) of the device's pending Web Push messages."""
        rows = self._db.execute("SELECT push_id, endpoint_id, topic, urgency, encoding, expires_at FROM wp_messages "
                                "WHERE route_id=?", (route_id,))
        return {bytes(p): (bytes(e), t, Urgency(u), ContentEncoding(c), float(x)) for p, e, t, u, c, x in rows}

    def expire_webpush(self, now: float) -> int:
        """Delete Web Push messages whose TTL ran out (their TTL is their mailbox expiry)."""
        with self._tx():
            old = [(bytes(r), bytes(p)) for r, p in self._db.execute(
                "SELECT route_id, push_id FROM wp_messages WHERE expires_at < ?", (now,))]
            self._remember_gone(old, now)
            self._db.executemany("DELETE FROM mailbox WHERE route_id=? AND push_id=?", old)
            self._db.executemany("DELETE FROM wp_messages WHERE route_id=? AND push_id=?", old)
        for rid, _ in old:
            self._box_counts.pop(rid, None)
        return len(old)

    # -- mailboxes --------------------------------------------------------------------------------

    def pending(self, route_id: bytes, limit: int = 100) -> list[tuple[bytes, bytes, float]]:
        """Unacknowledged messages, oldest first: (push id, ciphertext, received_at); expired Web Push ones left out."""
        rows = self._db.execute(
            "SELECT m.push_id, m.ciphertext, m.received_at FROM mailbox m LEFT JOIN wp_messages w "
            "ON w.route_id = m.route_id AND w.push_id = m.push_id WHERE m.route_id=? "
            "AND (w.expires_at IS NULL OR w.expires_at >= ?) "
            "ORDER BY m.received_at, m.push_id LIMIT ?", (route_id, time.time(), limit))
        return [(bytes(p), bytes(c), float(t)) for p, c, t in rows]

    def _box_count(self, route_id: bytes) -> int:
        # Mailbox sizes are cached: a COUNT(*) per push scans up to mailbox_max index entries. One
        # connection in one process writes this database, so the cache cannot go stale.
        n = self._box_counts.get(route_id)
        if n is None:
            n = int(self._db.execute("SELECT COUNT(*) FROM mailbox WHERE route_id=?", (route_id,)).fetchone()[0])
            self._box_counts[route_id] = n
        return n

    def mailbox_size(self, route_id: bytes | None = None) -> int:
        """Stored messages of one device, or of all devices."""
        if route_id is None:
            return int(self._db.execute("SELECT COUNT(*) FROM mailbox").fetchone()[0])
        return self._box_count(route_id)

    def _remember_gone(self, keys: list[tuple[bytes, bytes]], now: float) -> None:
        """Record Web Push messages (route id, push id) leaving the mailbox, so that a copy arriving later
        is answered `duplicate` (WP_DEDUP_MIN_S); native ones need no record (their token stays spent)."""
        if keys:
            self._db.executemany(
                "INSERT OR REPLACE INTO wp_acked SELECT route_id, push_id, MAX(expires_at, ?) FROM wp_messages "
                "WHERE route_id=? AND push_id=?", [(now + WP_DEDUP_MIN_S, r, p) for r, p in keys])

    def ack(self, route_id: bytes, push_ids: list[bytes]) -> int:
        """Delete acknowledged messages of route_id; returns how many were deleted."""
        with self._tx():
            self._remember_gone([(route_id, p) for p in push_ids], time.time())
            cur = self._db.executemany("DELETE FROM mailbox WHERE route_id=? AND push_id=?",
                                       [(route_id, p) for p in push_ids])
            deleted = cur.rowcount
            self._db.executemany("DELETE FROM wp_messages WHERE route_id=? AND push_id=?",
                                 [(route_id, p) for p in push_ids])
        self._box_counts.pop(route_id, None)  # recounted on the next push
        return deleted

    # -- custody and push status ------------------------------------------------------------------

    def save_custody(self, push: Push, deadline: float, now: float) -> None:
        """Persist a push this relay accepted, before the 202 goes out."""
        # The hot path of every push. Its status row is written when custody ends; until then the
        # custody row itself answers "pending". Grouping: written when the batch commits (_custody_new).
        if self._grouping:
            self._open_batch()
            self._custody_new[push.push_id] = (push, deadline, push.attempt, now)
            return
        with self._write():
            self._db.execute("INSERT OR REPLACE INTO custody VALUES (?, ?, ?, ?, ?)",
                             (push.push_id, encode_unchecked(push), deadline, push.attempt, now))
        self._held[push.push_id] = now

    def update_attempts(self, attempts: list[tuple[bytes, int]]) -> None:
        """Record custody attempt numbers (a restarted relay continues from them)."""
        for pid, attempt in attempts:
            new = self._custody_new.get(pid)
            if new is not None:
                self._custody_new[pid] = (new[0], new[1], attempt, new[3])
        with self._write():
            self._db.executemany("UPDATE custody SET attempt=? WHERE push_id=?", [(a, p) for p, a in attempts])

    def release_custody(self, push_id: bytes, status: str, hops: int | None, now: float) -> None:
        """Custody ended: drop the push from disk and record its final status."""
        new = self._custody_new.pop(push_id, None)
        accepted = new[3] if new is not None else self._held.pop(push_id, None)
        if self._grouping and (accepted is not None or push_id in self._released):
            # Into the open batch, written as it commits (_flush_released): a push taken in this very
            # batch never touches the custody table; one held longer is deleted from it then.
            self._open_batch()
            if accepted is None:  # a late receipt correcting a push released in this batch
                accepted = self._released[push_id][2]
            elif new is None:
                self._unheld.append((push_id,))
            self._released[push_id] = (status, hops, accepted, now)
            return
        with self._write():
            # fetchall: the statement runs to its end (no write statement left open in the batch).
            rows = self._db.execute("DELETE FROM custody WHERE push_id=? RETURNING accepted_at", (push_id,)).fetchall()
            if accepted is None and rows:
                accepted = rows[0][0]
            if accepted is not None:
                self._db.execute("INSERT OR REPLACE INTO push_status VALUES (?, ?, ?, ?, ?)",
                                 (push_id, status, hops, accepted, now))
            else:  # a late receipt correcting a settled push (or a push this relay never held)
                self._db.execute("UPDATE push_status SET status=?, hops=?, settled_at=? WHERE push_id=?",
                                 (status, hops, now, push_id))

    def load_custody(self) -> list[tuple[Push, float, int]]:
        """Every push still in custody: (push, deadline, attempt). A corrupt row is skipped, not fatal."""
        out = []
        rows = self._db.execute("SELECT push_id, frame, deadline, attempt, accepted_at FROM custody ORDER BY deadline")
        for pid, frame, deadline, attempt, accepted in rows:
            self._held[bytes(pid)] = float(accepted)
            try:
                msg = decode(bytes(frame))
            except DecodeError:
                continue
            if isinstance(msg, Push):
                out.append((msg, float(deadline), int(attempt)))
        return out

    def custody_count(self) -> int:
        return (int(self._db.execute("SELECT COUNT(*) FROM custody").fetchone()[0]) + len(self._custody_new)
                - len(self._unheld))

    def push_status(self, push_id: bytes) -> dict[str, object] | None:
        """The status row of a push this relay accepted, or None."""
        released = self._released.get(push_id)
        row = (released if released is not None else
               self._db.execute("SELECT status, hops, accepted_at, settled_at FROM push_status WHERE push_id=?",
                                (push_id,)).fetchone())
        if row is None:
            new = self._custody_new.get(push_id)
            held = (new[3],) if new is not None else self._db.execute(
                "SELECT accepted_at FROM custody WHERE push_id=?", (push_id,)).fetchone()
            if held is None:
                return None
            row = ("pending", None, held[0], None)
        return {"push_id": push_id.hex(), "status": row[0], "hops": row[1], "accepted_at": row[2],
                "settled_at": row[3]}

    def prune(self, now: float | None = None) -> int:
        """Forget settled push statuses older than the retention, and superseded receipt keys held past their
        time (rule F5c); returns the status rows deleted."""
        now = time.time() if now is None else now
        with self._tx():
            cur = self._db.execute("DELETE FROM push_status WHERE settled_at IS NOT NULL AND settled_at < ?",
                                   (now - STATUS_RETENTION_S,))
            self._db.execute("DELETE FROM superseded_receipt_keys WHERE until < ?", (now,))  # rule F5c
            self._db.execute("DELETE FROM wp_acked WHERE until < ?", (now,))
        self.expire_webpush(now)  # expired messages leave the mailbox (they count against mailbox_max)
        self._receipt_keys.prune(now)
        return cur.rowcount

    def sync_mode(self) -> int:
        """SQLite's PRAGMA synchronous as the connection runs it (1 = NORMAL, 2 = FULL)."""
        return int(self._db.execute("PRAGMA synchronous").fetchone()[0])

    def device_count(self) -> int:
        return len(self._home)

    # -- wake hooks -------------------------------------------------------------------------------

    def set_wake_hook(self, kind: int, owner: bytes, url: str, token: bytes, now: float) -> None:
        """Store (or replace) the wake hook of owner."""
        with self._tx():
            self._db.execute("INSERT OR REPLACE INTO wake_hooks VALUES (?, ?, ?, ?, ?)", (kind, owner, url, token, now))

    def wake_hooks(self) -> list[tuple[int, bytes, str, bytes, float]]:
        """Every wake hook: (kind, owner, url, token, created)."""
        rows = self._db.execute("SELECT kind, owner, url, token, created FROM wake_hooks")
        return [(int(k), bytes(o), str(u), bytes(t), float(c)) for k, o, u, t, c in rows]

    def delete_wake_hook(self, kind: int, owner: bytes, token: bytes | None = None) -> bool:
        """Delete owner's wake hook (only if it still has this token, when one is given)."""
        with self._tx():
            if token is None:
                cur = self._db.execute("DELETE FROM wake_hooks WHERE kind=? AND owner=?", (kind, owner))
            else:
                cur = self._db.execute("DELETE FROM wake_hooks WHERE kind=? AND owner=? AND token=?",
                                       (kind, owner, token))
        return cur.rowcount > 0


def _checkpoint(conn: sqlite3.Connection) -> Any:
    """One passive WAL checkpoint (run in a worker thread)."""
    return conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
