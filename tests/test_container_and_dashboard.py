"""The container's command and health check work with the CLI as shipped; the example alerts and the
Grafana dashboard query only metrics a running relay (or bootstrap) exposes.

No container engine runs a daemon on this machine kind (podman builds need a base image from a
registry this sandbox cannot reach), so the image's promises are checked through the CLI they call:
the Containerfile's documented init, its CMD started from what init wrote, and its HEALTHCHECK run
against a relay and a bootstrap whose data directories stand in for the volume.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.procs import ROOT, Proc, bootstrap_url, relay_ready

pytestmark = pytest.mark.integration
CONTAINERFILE = (ROOT / "deploy" / "container" / "Containerfile").read_text()
VOLUME = "/var/lib/inri"


def _instruction(name: str) -> list[str]:
    """The exec-form (JSON array) argument list of a CMD or HEALTHCHECK CMD instruction."""
    text = CONTAINERFILE.replace("\\\n", " ")
    match = re.search(rf"^{name}.*?CMD (\[.*\])\s*$" if name == "HEALTHCHECK" else rf"^{name} (\[.*\])\s*$",
                      text, re.M)
    assert match, name
    return list(json.loads(match[1]))


def _documented(program: str) -> list[str]:
    """The documented `podman run ... inri PROGRAM init ...` line of the Containerfile, as arguments."""
    for line in CONTAINERFILE.replace("\\\n#", " ").splitlines():
        words = line.lstrip("# ").split()
        if "init" in words and words[0] == "podman":
            i = words.index("init")
            start = i - 1 if words[i - 1] == program else i - 2
            if words[start] == program:
                return shlex.split(" ".join(words[start:]))
    raise AssertionError(f"no documented {program} init")


def _local(args: list[str], volume: Path) -> list[str]:
    """A container command run here: the console script through this interpreter, the volume at `volume`."""
    module = {"inri": "inri.cli", "inri-bootstrap": "bootstrap_nodes.cli"}[args[0]]
    return [sys.executable, "-m", module, *(a.replace(VOLUME, str(volume)) for a in args[1:])]


def test_the_image_runs_a_relay_and_a_bootstrap_with_a_health_check_right_for_each(tmp_path: Path) -> None:
    check = _instruction("HEALTHCHECK")
    assert check[:2] == ["inri", "health"]
    boot_vol, relay_vol = tmp_path / "boot", tmp_path / "relay"
    boot_init = _documented("inri-bootstrap")
    boot_init += ["--listen", "127.0.0.1:0", "--allow-private"]
    subprocess.run(_local(boot_init, boot_vol), check=True, capture_output=True, timeout=60)
    serve = ["inri-bootstrap", "serve", "--config", f"{VOLUME}/bootstrap.toml"]
    assert " ".join(serve) in CONTAINERFILE  # the documented bootstrap command
    procs = [Proc(_local(serve, boot_vol), tmp_path / "b.log")]
    try:
        url = bootstrap_url(procs[0])
        assert subprocess.run(_local(check, boot_vol), capture_output=True, timeout=60).returncode == 0
        init = _documented("inri")
        at = init.index("--public-addr")  # here the QUIC port is picked at start (port 0): announced as bound
        init = [url if a.startswith("https://boot.") else "127.0.0.1:0" if a.startswith("0.0.0.0:") else a
                for a in init[:at] + init[at + 2:]]
        subprocess.run(_local([*init, "--quic", "127.0.0.1:0"], relay_vol), check=True, capture_output=True,
                       timeout=60)
        # Before the relay serves, the check fails. Asked before the CMD starts: asked after it, a relay that
        # becomes ready before the check's own interpreter has started makes it pass (seen under load).
        assert subprocess.run(_local(check, relay_vol), capture_output=True, timeout=60).returncode == 1  # not yet
        procs.append(Proc(_local(_instruction("CMD"), relay_vol), tmp_path / "r.log"))
        relay_ready(procs[1], relay_vol / "data")
        done = subprocess.run(_local(check, relay_vol), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and json.loads(done.stdout)["status"] == "ok", done.stderr
    finally:
        for p in procs:
            p.stop()


def _exposed(text: str) -> set[str]:
    """Every series name a scrape can hold: sample names and declared families (with their suffixes)."""
    names = {line.split("{")[0].split()[0] for line in text.splitlines() if line and not line.startswith("#")}
    for family, kind in re.findall(r"^# TYPE (\S+) (\S+)", text, re.M):
        names |= {family, *(family + s for s in {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"],
                                                 "info": ["_info"]}.get(kind, []))}
    return names


def _metrics_in(expr: str) -> set[str]:
    return set(re.findall(r"\b((?:inri|process)_[a-z_]+)\b", expr))


def test_every_dashboard_panel_and_alert_names_a_metric_the_daemons_expose(tmp_path: Path) -> None:
    boot = Proc([sys.executable, "-m", "bootstrap_nodes.cli", "serve", "--listen", "127.0.0.1:0", "--data-dir",
                 str(tmp_path / "b"), "--allow-private"], tmp_path / "b.log")
    relay = Proc([sys.executable, "-m", "inri.cli", "relay", "--data-dir", str(tmp_path / "r"), "--api",
                  "127.0.0.1:0", "--quic", "127.0.0.1:0", "--bootstrap", "http://127.0.0.1:9", "--profile", "test"],
                 tmp_path / "r.log")
    try:
        url = bootstrap_url(boot)
        api = relay_ready(relay, tmp_path / "r")["api"]
        relay_names = _exposed(httpx.get(api + "/metrics").text)
        boot_names = _exposed(httpx.get(url + "/metrics").text)
    finally:
        relay.stop()
        boot.stop()
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "inri-relay.json").read_text())
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used = _metrics_in(target["expr"])
            assert used and used <= relay_names, (panel["title"], used - relay_names)
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "inri-alerts.yml").read_text())
    alerts = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"]}
    for needed in ("InriRelayDown", "InriBootstrapDown", "InriRelayIsolated", "InriCustodyBacklog"):
        assert needed in alerts
    for name, expr in alerts.items():
        assert _metrics_in(expr) <= relay_names | boot_names, (name, _metrics_in(expr) - relay_names - boot_names)
