"""Helpers for tests that start real INRI processes on loopback (bounded waits, always cleaned up)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port(host: str = "127.0.0.1", kind: int = socket.SOCK_STREAM) -> int:
    """A port free right now on host (TCP by default, UDP with kind=SOCK_DGRAM)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Proc:
    """A child process with its log file; stop() is idempotent (SIGTERM, then SIGKILL)."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.log = log
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._logf = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.p = subprocess.Popen(args, stdout=self._logf, stderr=subprocess.STDOUT, env=full_env, cwd=ROOT,
                                  start_new_session=True)

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


def bootstrap_cmd(listen: str, data_dir: Path, peers: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "bootstrap_nodes.cli", "serve", "--listen", listen, "--data-dir", str(data_dir),
           "--allow-private"]
    for p in peers:
        cmd += ["--peer", p]
    return cmd
