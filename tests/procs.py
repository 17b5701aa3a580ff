"""Helpers for tests that start real INRI processes on loopback (bounded waits, always cleaned up).

Ports: processes bind port 0 and report what they got (a relay in DATA_DIR/relay.json, a bootstrap
in a `{"bootstrap": URL}` stdout line): `relay_ready` and `bootstrap_url` read them back, so no port
is picked, released and then bound by someone else in between (inri.mesh does the same). Where a
port must be known before the process starts, the test binds the socket and hands it over
(`Proc(..., pass_fds=...)`, `bootstrap_cmd(..., listen_fd=...)`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from inri import mesh

ROOT = Path(__file__).resolve().parent.parent


class Proc:
    """A child process with its log file; stop() is idempotent (SIGTERM, then SIGKILL)."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None,
                 pass_fds: tuple[int, ...] = (), cwd: Path = ROOT) -> None:
        """Start args with env added to ours; pass_fds: our file descriptors the child inherits (same numbers)."""
        self.args = args
        self.log = log
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._logf = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.p = subprocess.Popen(args, stdout=self._logf, stderr=subprocess.STDOUT, env=full_env, cwd=cwd,
                                  start_new_session=True, pass_fds=pass_fds)

    def alive(self) -> bool:
        return self.p.poll() is None

    def kill9(self) -> None:
        if self.alive():
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait(10)

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.alive():
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(10)
        self._logf.close()
        return self.p.returncode

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


def wait_http(url: str, timeout: float = 30.0, proc: Proc | None = None) -> None:
    """Poll url until it answers 200; AssertionError with the process log if it never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise AssertionError(f"process exited early:\n{proc.tail()}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} not up within {timeout} s" + (f"\n{proc.tail()}" if proc else ""))


def bootstrap_cmd(listen: str, data_dir: Path, peers: list[str], listen_fd: int | None = None) -> list[str]:
    """`inri-bootstrap serve` on listen, or on the socket listen_fd handed over (pass it in Proc's pass_fds)."""
    cmd = [sys.executable, "-m", "bootstrap_nodes.cli", "serve", "--listen", listen, "--data-dir", str(data_dir),
           "--allow-private"]
    if listen_fd is not None:
        cmd += ["--listen-fd", str(listen_fd)]
    for p in peers:
        cmd += ["--peer", p]
    return cmd


def relay_ready(proc: Proc, data_dir: Path, timeout: float = 30.0) -> dict[str, Any]:
    """node_id, api URL, quic address and pid of a relay started with port 0 (its relay.json)."""
    try:
        return mesh.relay_ready(data_dir, proc.p, proc.log, time.monotonic() + timeout)
    except mesh.MeshError as exc:
        raise AssertionError(str(exc)) from None


def bootstrap_url(proc: Proc, timeout: float = 30.0) -> str:
    """The URL a bootstrap started with `--listen 127.0.0.1:0` listens on."""
    try:
        return mesh.bootstrap_url(proc.p, proc.log, time.monotonic() + timeout)
    except mesh.MeshError as exc:
        raise AssertionError(str(exc)) from None


def relay_cmd(data_dir: Path, *args: str) -> list[str]:
    """`inri relay` on loopback ports 0 with a dead bootstrap and the test profile, plus args."""
    return [sys.executable, "-m", "inri.cli", "relay", "--data-dir", str(data_dir), "--api", "127.0.0.1:0",
            "--quic", "127.0.0.1:0", "--bootstrap", "http://127.0.0.1:9", "--profile", "test", *args]


def farthest_relay(info: dict[str, Any], home: str) -> str:
    """The name of the relay of a mesh (inri.mesh.up's info) farthest in links from relay `home`, as
    their /v1/status neighbours say (a link listed by either end counts)."""
    names = {r["node_id"]: r["name"] for r in info["relays"]}
    g: dict[str, set[str]] = {r["name"]: set() for r in info["relays"]}
    for r in info["relays"]:
        for nb in mesh.status(r["api"])["neighbours"]:
            if nb["node_id"] in names:
                g[r["name"]].add(names[nb["node_id"]])
                g[names[nb["node_id"]]].add(r["name"])
    dist = {home: 0}
    todo = [home]
    while todo:
        cur = todo.pop(0)
        for nb in sorted(g[cur]):
            if nb not in dist:
                dist[nb] = dist[cur] + 1
                todo.append(nb)
    return max(sorted(dist), key=lambda n: dist[n])
