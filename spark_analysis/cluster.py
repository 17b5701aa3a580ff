"""`inri-analyze cluster up|down`: a Spark standalone master and worker from the pip package.

The pip `pyspark` ships `bin/spark-class` but not the `sbin/start-*.sh` scripts, so the master and the
worker are started the way those scripts start them: `spark-class org.apache.spark.deploy.master.Master`
and `... deploy.worker.Worker`. Ports are chosen by the JVMs (port 0) and read back from their logs, so
two clusters on one machine never collide. The state (master URL, process ids, logs) lives in one
directory; `down` stops exactly the processes that `up` started there.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from spark_analysis.session import find_java_home

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED = "Successfully registered with master"
STATE_FILE = "cluster.json"


class ClusterError(RuntimeError):
    """The cluster did not start (the message names the log to read) or its state is unusable."""


@dataclass
class ClusterState:
    """What `up` started: the master URL and the JVMs' process ids."""

    master_url: str
    master_pid: int
    worker_pid: int
    cores: int


def spark_class() -> Path:
    """The pip package's `bin/spark-class` (or $SPARK_HOME's)."""
    home = os.environ.get("SPARK_HOME")
    if not home:
        import pyspark

        home = str(Path(pyspark.__file__).parent)
    path = Path(home, "bin", "spark-class")
    if not path.exists():
        raise ClusterError(f"no {path}: is pyspark installed (pip install 'inri[analysis]')?")
    return path


def _env(host: str) -> dict[str, str]:
    env = dict(os.environ)
    java = find_java_home()
    if java:
        env["JAVA_HOME"] = java
    env["SPARK_LOCAL_IP"] = host  # every service binds here (loopback by default)
    return env


def _wait_for(log: Path, proc: subprocess.Popen[bytes], pattern: re.Pattern[str] | str, timeout: float) -> str:
    """The first match of pattern in log, waiting until timeout (ClusterError if the JVM exits first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace") if log.exists() else ""
        if isinstance(pattern, str):
            if pattern in text:
                return pattern
        elif (m := pattern.search(text)) is not None:
            return m.group(1)
        if proc.poll() is not None:
            raise ClusterError(f"the JVM exited with status {proc.returncode}: see {log}")
        time.sleep(0.2)
    raise ClusterError(f"not ready within {timeout:.0f} s: see {log}")


def _start(args: list[str], log: Path, host: str) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        # own session: the JVMs outlive this command, and a Ctrl-C in the shell does not reach them
        return subprocess.Popen([str(spark_class()), *args], stdout=out, stderr=subprocess.STDOUT, env=_env(host),
                                start_new_session=True)


def up(state_dir: Path, *, host: str = "127.0.0.1", cores: int | None = None, memory: str = "2g",
       timeout: float = 120.0) -> ClusterState:
    """Start a master and one worker bound to host; returns once the worker has registered."""
    state_dir.mkdir(parents=True, exist_ok=True)
    if (state_dir / STATE_FILE).exists():
        raise ClusterError(f"{state_dir / STATE_FILE} exists: run `inri-analyze cluster down --dir {state_dir}` first")
    cores = cores or os.cpu_count() or 1
    master_log, worker_log = state_dir / "master.log", state_dir / "worker.log"
    master = _start([MASTER_CLASS, "--host", host, "--port", "0", "--webui-port", "0"], master_log, host)
    try:
        url = _wait_for(master_log, master, _MASTER_URL, timeout)
        worker = _start([WORKER_CLASS, url, "--host", host, "--port", "0", "--webui-port", "0", "--cores", str(cores),
                         "--memory", memory, "--work-dir", str(state_dir / "work")], worker_log, host)
    except BaseException:
        _stop(master.pid)
        raise
    state = ClusterState(url, master.pid, worker.pid, cores)
    (state_dir / STATE_FILE).write_text(json.dumps(asdict(state), indent=2) + "\n")
    try:
        _wait_for(worker_log, worker, _REGISTERED, timeout)
    except BaseException:
        down(state_dir)
        raise
    return state


def _stop(pid: int, timeout: float = 20.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            waited, _ = os.waitpid(pid, os.WNOHANG)  # our child when up() ran in this process
        except ChildProcessError:
            waited = 0
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
        if waited == pid:
            return
        time.sleep(0.2)
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except (ProcessLookupError, ChildProcessError):
        pass


def down(state_dir: Path) -> ClusterState:
    """Stop the worker, then the master, that `up` started in state_dir."""
    path = state_dir / STATE_FILE
    if not path.exists():
        raise ClusterError(f"no cluster started in {state_dir} (no {STATE_FILE})")
    state = ClusterState(**json.loads(path.read_text()))
    _stop(state.worker_pid)
    _stop(state.master_pid)
    path.unlink()
    return state
