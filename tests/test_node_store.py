"""The relay's SQLite store, trace files and configuration, through their real interfaces."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inri.core.home import MemoryHomeStore
from inri.node.config import ConfigError, load_config
from inri.node.identity import NodeIdentity
from inri.node.store import Store
from inri.node.tracefile import TraceFile, read_trace
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import Push
from tests.procs import Proc, relay_cmd, relay_ready, wait_http

REGS = [make_registration(new_signing_key(bytes([i]) * 32), 1, 1000, 10**6) for i in range(1, 4)]
TOKENS = [bytes([i]) * 16 for i in range(6)]
PIDS = [bytes([0x80 + i]) * 16 for i in range(6)]

op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 2), st.lists(st.integers(0, 5), max_size=3)),
    st.tuples(st.just("push"), st.integers(0, 2), st.integers(0, 5), st.integers(0, 5)),
    st.tuples(st.just("remove"), st.integers(0, 2)),
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(st.lists(op, max_size=25))
def test_sqlite_home_store_behaves_exactly_like_the_memory_one(tmp_path_factory, ops) -> None:  # type: ignore[no-untyped-def]
    """Same operations, same answers: tokens spent once, DUPLICATE for the same push id, mailbox cap."""
    db = Store(tmp_path_factory.mktemp("s") / "r.sqlite3", mailbox_max=3)
    mem = MemoryHomeStore(mailbox_max=3)
    try:
        for o in ops:
            if o[0] == "add":
                reg, toks = REGS[o[1]], [TOKENS[t] for t in o[2]]
                if not db.is_home(reg.route_id):
                    db.add_device(reg, b"s" * 32, toks, 1.0)
                else:
                    db.add_tokens(reg.route_id, toks)
                mem.add_registration(reg, toks)
            elif o[0] == "push":
                rid = REGS[o[1]].route_id
                a = db.accept_push(rid, TOKENS[o[2]], PIDS[o[3]], b"c", 2.0)
                b = mem.accept_push(rid, TOKENS[o[2]], PIDS[o[3]], b"c", 2.0)
                assert a == b, o
            else:
                db.remove_device(REGS[o[1]].route_id)
                mem.remove(REGS[o[1]].route_id)
            for reg in REGS:
                assert db.is_home(reg.route_id) == mem.is_home(reg.route_id)
                box = mem.mailboxes.get(reg.route_id, {})
                assert sorted(p for p, _, _ in db.pending(reg.route_id)) == sorted(box)
    finally:
        db.close()


@pytest.mark.integration  # starts a process
def test_store_survives_an_unclean_close_and_unregister_deletes_everything(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    # Write in a child process that is killed with SIGKILL right after its last commit.
    code = f"""
import os, signal
from inri.node.store import Store
from inri.protocol.codec import make_registration
from inri.protocol.keys import new_signing_key
from inri.protocol.messages import Push
s = Store({str(path)!r})
reg = make_registration(new_signing_key(b"\\x01" * 32), 1, 1000, 10**6)
s.add_device(reg, b"s" * 32, [b"t" * 16], 1.0)
s.accept_push(reg.route_id, b"t" * 16, b"p" * 16, b"sealed", 2.0)
s.save_custody(Push(b"q" * 16, reg.route_id, b"u" * 16, b"ct", 24, 0, 0, 0, reg), 99.0, 3.0)
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == -signal.SIGKILL
    s = Store(path)
    rid = REGS[0].route_id
    assert s.is_home(rid) and s.check_secret(rid, b"s" * 32) and not s.check_secret(rid, b"x" * 32)
    assert s.pending(rid) == [(b"p" * 16, b"sealed", 2.0)]
    (push, deadline, attempt), = s.load_custody()
    assert isinstance(push, Push) and push.push_id == b"q" * 16 and deadline == 99.0 and attempt == 0
    assert s.push_status(b"q" * 16)["status"] == "pending"  # type: ignore[index]
    s.release_custody(b"q" * 16, "delivered", 3, 4.0)
    assert s.load_custody() == [] and s.push_status(b"q" * 16)["status"] == "delivered"  # type: ignore[index]
    assert s.prune(4.0 + 6 * 24 * 3600) == 0  # settled statuses are kept a week...
    assert s.prune(4.0 + 8 * 24 * 3600) == 1 and s.push_status(b"q" * 16) is None  # ...then forgotten
    s.remove_device(rid)
    assert not s.is_home(rid) and s.pending(rid) == [] and s.unspent_tokens(rid) == 0
    s.close()


def test_trace_file_salts_ids_and_rotates(tmp_path: Path) -> None:
    t = TraceFile(tmp_path, "r1", level="full", salt="lab", max_bytes=400, keep=2)
    for i in range(40):
        t.emit(float(i), "r1", "push_forwarded", msg=f"{i:032x}", route="ab" * 16, peer="r2", hops=1)
    t.close()
    rows = read_trace(tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["trace.jsonl", "trace.jsonl.1", "trace.jsonl.2"]  # retention: keep=2 rotated files
    assert 0 < len(rows) < 40
    assert all(r["route"] == t.label("ab" * 16) != "ab" * 16 for r in rows)
    assert TraceFile(tmp_path, "r1", salt="other").label("ab" * 16) != t.label("ab" * 16)
    off = TraceFile(tmp_path / "off", "r1")
    off.emit(0.0, "r1", "push_forwarded", msg="x")
    assert not (tmp_path / "off").exists()  # off by default: nothing written


def test_config_precedence_and_clear_errors(tmp_path: Path) -> None:
    f = tmp_path / "relay.toml"
    f.write_text('[relay]\napi = "127.0.0.1:9000"\n[trace]\nlevel = "summary"\n[engine]\nactive_max = 5\n')
    cfg = load_config(f, env={"INRI_RELAY_API": "127.0.0.1:9001", "INRI_ENGINE_KEEPALIVE_MISSES": "4"},
                      overrides={"relay": {"data_dir": "/tmp/x"}})
    assert (cfg.relay.api, cfg.trace.level, cfg.engine.active_max, cfg.engine.keepalive_misses) == (
        "127.0.0.1:9001", "summary", 5, 4)
    assert cfg.relay.data_dir == "/tmp/x"
    for text, where in (('[relay]\napi = "nope"\n', "relay.api"), ("[relay]\ncolour = 1\n", "unknown key 'colour'"),
                        ("[nope]\n", "unknown section"), ('[trace]\nlevel = "loud"\n', "trace.level"),
                        ("[engine]\nactive_min = 'x'\n", "active_min"), ("[relay\n", "not valid TOML"),
                        ('[relay]\ngeo = "48.8566,2.35"\n', "relay.geo")):
        f.write_text(text)
        with pytest.raises(ConfigError, match=where):
            load_config(f, env={})
    test = load_config(None, env={"INRI_RELAY_PROFILE": "test"})
    assert test.engine.keepalive_interval_s == 0.5 and test.quic.idle_timeout_s == 5.0


@pytest.mark.integration  # starts a process
def test_check_config_command_and_identity_file(tmp_path: Path) -> None:
    f = tmp_path / "relay.toml"
    f.write_text('[relay]\nquic = "127.0.0.1:4433"\n')
    ok = subprocess.run([sys.executable, "-m", "inri.cli", "relay", "--config", str(f), "--check-config"],
                        capture_output=True, text=True)
    assert ok.returncode == 0 and json.loads(ok.stdout)["relay"]["quic"] == "127.0.0.1:4433"
    f.write_text('[api]\nrate_per_s = -1\n')
    bad = subprocess.run([sys.executable, "-m", "inri.cli", "relay", "--config", str(f), "--check-config"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "configuration error" in bad.stderr and "rate_per_s" in bad.stderr
    key = tmp_path / "node.key"
    a = NodeIdentity.load_or_create(key)
    assert NodeIdentity.load_or_create(key).node_id == a.node_id and oct(key.stat().st_mode)[-3:] == "600"
    key.write_bytes(b"garbage")
    with pytest.raises(ValueError, match="not an INRI node key"):
        NodeIdentity.load_or_create(key)


@pytest.mark.integration  # starts a process
def test_relay_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    proc = Proc(relay_cmd(tmp_path), tmp_path / "relay.log", {"INRI_RELAY_LOG_FORMAT": "json"})
    try:
        ready = relay_ready(proc, tmp_path)  # ports 0: the relay reports what it bound
        wait_http(ready["api"] + "/healthz", timeout=30, proc=proc)
        assert ready["pid"] == proc.p.pid and ready["quic"].startswith("127.0.0.1:")
        proc.p.send_signal(signal.SIGTERM)
        assert proc.p.wait(15) == 0
        assert '"relay stopped"' in proc.log.read_text()
        assert not (tmp_path / "relay.json").exists()
    finally:
        proc.stop()


@pytest.mark.integration  # starts a process
def test_store_synchronous_setting_reaches_sqlite_and_bad_values_are_refused(tmp_path: Path) -> None:
    """Issue 13 item 12: `[store] synchronous = "normal" | "full"` applied as PRAGMA synchronous."""
    assert load_config(None, env={}).store.synchronous == "normal"
    f = tmp_path / "relay.toml"
    f.write_text('[store]\nsynchronous = "full"\n')
    cfg = load_config(f, env={})
    full = Store(tmp_path / "full.sqlite3", synchronous=cfg.store.synchronous)
    normal = Store(tmp_path / "normal.sqlite3")
    try:
        assert (full.sync_mode(), normal.sync_mode()) == (2, 1)  # SQLite: 1 NORMAL, 2 FULL
    finally:
        full.close()
        normal.close()
    assert load_config(None, env={"INRI_STORE_SYNCHRONOUS": "full"}).store.synchronous == "full"
    f.write_text('[store]\nsynchronous = "off"\n')
    bad = subprocess.run([sys.executable, "-m", "inri.cli", "relay", "--config", str(f), "--check-config"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "store.synchronous" in bad.stderr and "'off'" in bad.stderr, bad.stderr
    f.write_text('[store]\nsync_full = true\n')
    with pytest.raises(ConfigError, match="sync_full"):
        load_config(f, env={})
