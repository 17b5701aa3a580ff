"""Issue 39's acceptance: a new operator's path from the built wheel, outside the checkout.

The wheel is built from this tree (or taken from INRI_WHEEL), installed into a fresh venv in a
temporary directory, and everything after runs from an empty directory with that venv's commands
only: `--version`, `inri-bootstrap init`, `inri relay init` x3, the four daemons started from the
configs `init` wrote, a device registered at one relay and a push sent at another arriving. The
checkout's code is never on the path (PYTHONPATH cleared, cwd outside it).

Cost (measured on the 2-core machine, pip cache warm): building the wheel ~10 s, the venv and its
install ~10 s, the mesh and the push ~10 s.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import inri
from tests.procs import ROOT, Proc, bootstrap_url, relay_ready

pytestmark = pytest.mark.integration


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}: {proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """(the venv's bin directory, an environment without the checkout) with the wheel installed."""
    base = tmp_path_factory.mktemp("install")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    wheel = os.environ.get("INRI_WHEEL")
    if not wheel:
        _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(base / "dist"), str(ROOT)], base, env)
        wheel = str(next((base / "dist").glob("inri-*.whl")))
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], base, env)
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", wheel], base, env)
    return venv / "bin", env


def test_version_and_docs_come_with_the_wheel(installed: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    bindir, env = installed
    for prog, args in (("inri", ["--version"]), ("inri-bootstrap", ["--version"]), ("inri", ["gateway", "--version"])):
        out = _run([str(bindir / prog), *args], tmp_path, env)
        assert out.strip().endswith(inri.__version__), out
    # A narrow terminal: argparse wraps epilogs at its width, and a path must still come out whole.
    helptext = _run([str(bindir / "inri"), "relay", "--help"], tmp_path, {**env, "COLUMNS": "40"})
    doc = Path(re.search(r"Docs: (\S+)", helptext)[1])  # type: ignore[index]
    assert doc.is_file() and doc.is_relative_to(bindir.parent), doc  # the installed copy, not the checkout's
    assert "## " in doc.read_text()


def test_an_operator_runs_a_mesh_from_the_init_configs(installed: tuple[Path, dict[str, str]],
                                                       tmp_path: Path) -> None:
    bindir, env = installed
    work = tmp_path / "empty"
    work.mkdir()
    inri_, boot = str(bindir / "inri"), str(bindir / "inri-bootstrap")
    out = _run([boot, "init", "b1", "--listen", "127.0.0.1:0", "--allow-private"], work, env)
    next_boot = re.search(r"^next: (.+)$", out, re.M)[1].split()  # type: ignore[index]
    procs: list[Proc] = []
    try:
        procs.append(Proc([str(bindir / next_boot[0]), *next_boot[1:]], tmp_path / "b1.log", env, cwd=work))
        url = bootstrap_url(procs[0])
        relays = []
        for i in range(3):
            out = _run([inri_, "relay", "init", f"r{i}", "--api", "127.0.0.1:0", "--quic", "127.0.0.1:0",
                        "--bootstrap", url], work, env)
            assert re.search(r"^open: UDP \d+", out, re.M), out
            assert oct((work / f"r{i}" / "data" / "node.key").stat().st_mode & 0o777) == "0o600"
            cmd = re.search(r"^next: (.+)$", out, re.M)[1].split()  # type: ignore[index]
            log = tmp_path / f"r{i}.log"
            procs.append(Proc([str(bindir / cmd[0]), *cmd[1:]], log, {**env, "INRI_RELAY_LOG_FORMAT": "json"},
                              cwd=work))
            relays.append(relay_ready(procs[-1], work / f"r{i}" / "data", timeout=60))
        assert oct((work / "r0" / "data" / "relay.sqlite3").stat().st_mode & 0o777) == "0o600"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # each relay has a neighbour: the mesh formed from the bootstrap
            if all(httpx.get(r["api"] + "/v1/status", timeout=2).json()["neighbours"] for r in relays):
                break
            time.sleep(0.3)
        else:
            raise AssertionError([p.tail() for p in procs])
        state, cred = work / "dev.json", work / "cred.json"
        _run([inri_, "device", "register", "--relay", relays[0]["api"], "--state", str(state)], work, env)
        _run([inri_, "device", "credential", "--state", str(state), "--out", str(cred)], work, env)
        deadline = time.monotonic() + 60
        while True:  # the push enters at r2 and must find r0 through the mesh (its route gossiped meanwhile)
            pushed = json.loads(_run([inri_, "app", "push", "--relay", relays[2]["api"], "--credential", str(cred),
                                      "--message", "hello operator"], work, env))
            got = _run([inri_, "device", "pull", "--state", str(state)], work, env)
            if "hello operator" in got or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert "hello operator" in got, (pushed, [p.tail() for p in procs])
        for i in range(3):  # every line of a JSON log is JSON (libraries' lines included)
            for line in (tmp_path / f"r{i}.log").read_text().splitlines():
                json.loads(line)
    finally:
        for p in procs:
            p.stop()
