"""Schema migrations of the relay's SQLite store, run on start, before anything else reads it.

`STEPS` maps a schema version to the step that takes a database from it to the next version, in
order; the store's SCHEMA_VERSION is the version the last step produces. A database of any version
from RELEASED_FROM up is carried forward one step at a time in one transaction (all steps or none),
after a copy of it is kept beside it (`relay.sqlite3.pre-v<N>`, by SQLite's online backup), and the
`meta.schema` row moves with it. A database of a version this relay does not know (newer: written
by a later INRI; older than any step) is refused with one line that says what to do, never a
traceback and never a guess.

How to change the schema (docs/operations.md, "Upgrade"): a new table with `CREATE TABLE IF NOT
EXISTS` in store.py needs no step (every start runs the schema script after the steps). A change to
an existing table or its data adds one step here keyed by the current SCHEMA_VERSION, bumps
SCHEMA_VERSION, and adds a fixture database of the released version to tests/fixtures/ (written by
that release: `tests/test_migrations.py` opens every fixture with today's store).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

Step = Callable[[sqlite3.Connection], None]

RELEASED_FROM = 2  # the oldest schema a released INRI wrote (0.1.0)


@dataclass(frozen=True)
class Migration:
    """One step: from `version` to `version + 1`."""

    version: int
    what: str  # one line for the log
    step: Step


# version -> the step from it to version + 1. Empty: schema 2 is both the released one and today's.
STEPS: Mapping[int, Migration] = {}


class SchemaError(Exception):
    """The database cannot be used by this relay; the message is one line for the operator."""


def stored_version(db: sqlite3.Connection) -> int | None:
    """The schema version a database says it has; None for a new (empty) database."""
    has_meta = db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'").fetchone()
    if has_meta is None:
        return None
    row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
    if row is None:
        return None
    try:
        return int(row[0])
    except ValueError:
        raise SchemaError(f"schema version {row[0]!r} in the meta table is not a number") from None


def migrate(db: sqlite3.Connection, path: str, target: int, *, steps: Mapping[int, Migration] = STEPS,
            released_from: int = RELEASED_FROM, log: Callable[[str], None] = lambda line: None) -> list[int]:
    """Bring the database at `path` (open as `db`, autocommit) to schema `target`; returns the versions
    it went through (empty when nothing was to do). SchemaError for a version it cannot bring forward."""
    version = stored_version(db)
    if version is None or version == target:
        return []
    if version > target:
        raise SchemaError(f"{path}: database schema {version} is newer than this relay's ({target}): it was "
                          "written by a later INRI; run that version again, or restore the backup taken before "
                          "the upgrade (docs/operations.md, \"Upgrade\")")
    missing = [v for v in range(version, target) if v not in steps]
    if version < released_from or missing:
        raise SchemaError(f"{path}: database schema {version} cannot be migrated by this relay (it migrates "
                          f"schemas {released_from}..{target}); restore a backup or start from an empty data "
                          "directory")
    keep = f"{path}.pre-v{target}"
    if not Path(keep).exists():  # a failed or interrupted migration left the copy of the original: keep that
        with sqlite3.connect(keep) as copy:
            db.backup(copy)
        copy.close()
    went: list[int] = []
    db.execute("BEGIN IMMEDIATE")
    try:
        for v in range(version, target):
            log(f"schema {v} -> {v + 1}: {steps[v].what}")
            steps[v].step(db)
            went.append(v)
        db.execute("UPDATE meta SET value=? WHERE key='schema'", (str(target),))
    except BaseException as exc:
        db.execute("ROLLBACK")
        if isinstance(exc, sqlite3.Error):
            raise SchemaError(f"{path}: migration from schema {v} failed ({exc}); nothing was changed, "
                              f"the copy {keep} is the original") from None
        raise
    db.execute("COMMIT")
    return [*went, target]
