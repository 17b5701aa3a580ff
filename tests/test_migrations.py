"""Schema migrations on start (inri/node/migrations.py): every released schema opens, an unknown one
is refused in one line, a failed step changes nothing."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from inri.node import migrations
from inri.node.migrations import Migration, SchemaError, migrate
from inri.node.store import SCHEMA_VERSION, Store
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NOW = 1_790_000_000.0  # tests/fixtures/make_store_fixture.py


def _fixture(version: int, tmp_path: Path) -> Path:
    path = tmp_path / "relay.sqlite3"
    shutil.copy(FIXTURES / f"store-v{version}.sqlite3", path)
    return path


@pytest.mark.parametrize("version", range(migrations.RELEASED_FROM, SCHEMA_VERSION + 1))
def test_every_released_schema_opens_with_every_device_kept(version: int, tmp_path: Path) -> None:
    path = _fixture(version, tmp_path)
    store = Store(path)
    regs = [make_registration(new_signing_key(bytes([i]) * 32), 1, int(NOW), 10**6) for i in range(1, 4)]
    assert sorted(r.route_id for r in store.homed()) == sorted(r.route_id for r in regs)
    assert all(store.check_secret(r.route_id, bytes([i]) * 32) for i, r in enumerate(regs, 1))
    assert [store.unspent_tokens(r.route_id) for r in regs] == [5, 4, 5]
    assert store.sign_receipt(regs[0].route_id, b"m", None) is not None  # device 1's receipt key survived
    assert [m[1] for m in store.pending(regs[1].route_id)] == [b"sealed message"]
    assert len(store.endpoints(regs[2].route_id)) == 1
    store.set_wake_hook(1, regs[0].route_id, "https://gw.example/wake", b"t", NOW)  # a table added since 0.1.0
    store.close()
    assert migrations.stored_version(sqlite3.connect(path)) == SCHEMA_VERSION


def test_a_newer_schema_is_refused_in_one_line_by_the_relay(tmp_path: Path) -> None:
    path = _fixture(2, tmp_path)
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value=? WHERE key='schema'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(SchemaError, match=f"schema {SCHEMA_VERSION + 1} is newer than this relay's"):
        Store(path)


@pytest.mark.integration
def test_the_relay_process_refuses_an_unknown_schema_and_a_damaged_store_in_one_line(tmp_path: Path) -> None:
    for name, damage in (("newer", "schema"), ("garbage", "bytes")):
        data = tmp_path / name
        data.mkdir()
        path = data / "relay.sqlite3"
        if damage == "schema":
            shutil.copy(FIXTURES / "store-v2.sqlite3", path)
            with sqlite3.connect(path) as db:
                db.execute("UPDATE meta SET value='99' WHERE key='schema'")
        else:
            path.write_bytes(b"this is not a database" * 100)
        proc = subprocess.run([sys.executable, "-m", "inri.cli", "relay", "--data-dir", str(data), "--api",
                               "127.0.0.1:0", "--quic", "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert "Traceback" not in proc.stderr and str(path) in proc.stderr


def _steps() -> dict[int, Migration]:
    def add_column(db: sqlite3.Connection) -> None:
        db.execute("ALTER TABLE devices ADD COLUMN note TEXT")
        db.execute("UPDATE devices SET note='migrated'")

    def fail(db: sqlite3.Connection) -> None:
        db.execute("INSERT INTO no_such_table VALUES (1)")

    return {2: Migration(2, "a note per device", add_column), 3: Migration(3, "broken", fail)}


def test_steps_run_in_order_in_one_transaction_and_a_copy_is_kept(tmp_path: Path) -> None:
    path = _fixture(2, tmp_path)
    db = sqlite3.connect(path, isolation_level=None)
    assert migrate(db, str(path), 3, steps=_steps()) == [2, 3]
    assert db.execute("SELECT DISTINCT note FROM devices").fetchall() == [("migrated",)]
    assert migrations.stored_version(db) == 3
    kept = sqlite3.connect(f"{path}.pre-v3")
    assert migrations.stored_version(kept) == 2 and kept.execute("SELECT count(*) FROM devices").fetchone() == (3,)
    assert migrate(db, str(path), 3, steps=_steps()) == []  # nothing to do the second time


def test_a_failing_step_leaves_the_database_as_it_was(tmp_path: Path) -> None:
    path = _fixture(2, tmp_path)
    db = sqlite3.connect(path, isolation_level=None)
    with pytest.raises(SchemaError, match="migration from schema 3 failed"):
        migrate(db, str(path), 4, steps=_steps())
    assert migrations.stored_version(db) == 2
    assert "note" not in [r[1] for r in db.execute("PRAGMA table_info(devices)")]  # step 2's change undone


def test_a_schema_without_a_step_is_refused(tmp_path: Path) -> None:
    path = _fixture(2, tmp_path)
    db = sqlite3.connect(path, isolation_level=None)
    with pytest.raises(SchemaError, match="cannot be migrated"):
        migrate(db, str(path), 3, steps={})
    with pytest.raises(SchemaError, match="cannot be migrated"):
        migrate(db, str(path), 3, steps=_steps(), released_from=3)


def test_the_step_table_reaches_todays_schema() -> None:
    assert all(m.version == v for v, m in migrations.STEPS.items())
    assert set(migrations.STEPS) == set(range(migrations.RELEASED_FROM, SCHEMA_VERSION))
