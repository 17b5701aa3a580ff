"""The systemd units verify with systemd-analyze and keep their sandboxing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parent.parent / "deploy" / "systemd"


@pytest.mark.parametrize("unit", ["inri-relay.service", "inri-bootstrap.service", "inri-gateway.service"])
@pytest.mark.integration
def test_unit_verifies_and_is_sandboxed(unit: str, tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed (Debian's systemd package)")
    text = (UNITS / unit).read_text()
    stateful = unit != "inri-gateway.service"  # the gateway keeps no state: its keys are configuration
    for option in ("NoNewPrivileges=yes", "ProtectSystem=strict", "User=inri", "Restart=on-failure",
                   *(["StateDirectory="] if stateful else [])):
        assert option in text
    # systemd-analyze checks that ExecStart exists: point it at stand-ins under tmp_path.
    bindir = tmp_path / "opt" / "inri" / "bin"
    bindir.mkdir(parents=True)
    for name in ("inri", "inri-bootstrap"):
        (bindir / name).write_text("#!/bin/sh\n")
        (bindir / name).chmod(0o755)
    copy = tmp_path / unit
    copy.write_text(text.replace("/opt/inri", str(tmp_path / "opt" / "inri")))
    proc = subprocess.run(["systemd-analyze", "verify", str(copy)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    exposure = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(copy)],
                              capture_output=True, text=True)
    score = float(exposure.stdout.strip().splitlines()[-1].split("level for")[1].split(":")[1].split()[0])
    assert score <= 2.0, exposure.stdout[-500:]


def test_every_config_key_is_documented_with_its_default() -> None:
    """docs/operations.md lists every relay and bootstrap option with the default the code uses."""
    import re
    from dataclasses import MISSING, fields
    from pathlib import Path

    from bootstrap_nodes.config import BootstrapConfig
    from inri.core.config import EngineConfig
    from inri.gateway.config import ApnsSection, FcmSection, GatewaySection
    from inri.node.config import ApiSection, QuicSection, RelaySection, TraceSection, WakeSection

    docs = Path(__file__).resolve().parent.parent / "docs"
    rows: dict[str, set[str]] = {}
    for key, value in re.findall(r"^\| `([a-z_]+)` \| `?([^`|]*)`? \|", (docs / "operations.md").read_text()
                                 + (docs / "gateway.md").read_text(), re.M):
        rows.setdefault(key, set()).add(value.strip())  # a key both daemons have is documented once per daemon
    for cls in (RelaySection, QuicSection, ApiSection, TraceSection, WakeSection, EngineConfig, BootstrapConfig,
                GatewaySection, ApnsSection, FcmSection):
        for f in fields(cls):
            if f.default is MISSING and f.default_factory is MISSING:  # a provider's credentials
                assert "required" in rows.get(f.name, set()), f"{cls.__name__}.{f.name}: not documented as required"
                continue
            default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
            assert f.name in rows, f"{cls.__name__}.{f.name} is not documented"
            if isinstance(default, bool):
                want = str(default).lower()
            elif isinstance(default, tuple):
                want = "[]"
            elif isinstance(default, str):
                want = default or '""'
            else:
                want = str(default)
            assert want in rows[f.name], f"{cls.__name__}.{f.name}: docs say {rows[f.name]}, code says {want}"


ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


@pytest.mark.integration
def test_containerfile_passes_hadolint() -> None:
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    proc = subprocess.run([hadolint, str(ROOT / "deploy" / "container" / "Containerfile")], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.integration
def test_compose_mesh_parses_and_every_command_is_a_valid_configuration() -> None:
    """The compose file is valid YAML, and each service's command + environment passes --check-config."""
    import os
    import subprocess
    import sys

    import yaml

    doc = yaml.safe_load((ROOT / "deploy" / "compose" / "compose.yaml").read_text())
    services = doc["services"]
    relays = [name for name in services if name.startswith("r")]
    assert "bootstrap" in services and len(relays) == 6
    ips = {s["networks"]["mesh"]["ipv4_address"] for s in services.values()}
    assert len(ips) == 7  # every service has its own static address (bootstraps list IP literals only)
    for name, svc in services.items():
        cmd = svc["command"]
        env = {**os.environ, **{k: str(v) for k, v in svc.get("environment", {}).items()}}
        if cmd[0] == "inri":
            args = [sys.executable, "-m", "inri.cli", *cmd[1:], "--check-config"]
        else:
            args = [sys.executable, "-m", "bootstrap_nodes.cli", "check-config", *cmd[2:]]
        proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=ROOT)
        assert proc.returncode == 0, (name, proc.stderr)
        if cmd[0] == "inri":
            cfg = __import__("json").loads(proc.stdout)
            assert cfg["relay"]["bootstrap"] == ["http://172.28.0.10:8470"]
            assert cfg["relay"]["public_addr"] == svc["networks"]["mesh"]["ipv4_address"] + ":4433"


def test_prometheus_example_scrapes_the_metrics_endpoints() -> None:
    import yaml

    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert jobs["inri-relay"]["metrics_path"] == "/metrics" and jobs["inri-bootstrap"]["metrics_path"] == "/metrics"
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / prom["rule_files"][0]).read_text())
    exprs = " ".join(r["expr"] for g in rules["groups"] for r in g["rules"])
    ops = (ROOT / "docs" / "operations.md").read_text()
    for metric in ("inri_neighbours", "inri_custody_pushes", "inri_internal_errors_total"):
        assert metric in exprs and metric in ops  # alerts only use metrics the relay documents
