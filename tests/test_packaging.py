"""Packaging and layering promises that a build or an import would not catch by itself."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_license_file_matches_pyproject() -> None:
    project = PYPROJECT["project"]
    assert project["license"] == "AGPL-3.0-or-later"  # an SPDX expression (PEP 639), not a free-text table
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.split("\n", 2)[:2] == ["                    GNU AFFERO GENERAL PUBLIC LICENSE",
                                       "                       Version 3, 19 November 2007"]
    assert "13. Remote Network Interaction; Use with the GNU General Public License." in text
    assert len(text.splitlines()) > 600  # the full text, not a pointer to it


def test_the_sdk_ships_py_typed() -> None:
    assert (ROOT / "inri" / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["inri"]


def test_dependencies_whose_private_behaviour_we_use_have_upper_bounds() -> None:
    reqs = {Requirement(r).name.lower(): Requirement(r) for r in PYPROJECT["project"]["dependencies"]}
    for name in ("aioquic", "hypercorn"):
        assert any(spec.operator == "<" for spec in reqs[name].specifier), f"{name} needs an upper bound"


def _imports(package: str) -> list[tuple[Path, str, list[str]]]:
    """(file, module imported, names imported from it) for every import in a package's source."""
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out.append((path, node.module, [a.name for a in node.names]))
            elif isinstance(node, ast.Import):
                out += [(path, a.name, []) for a in node.names]
    return out


def test_the_fuzz_campaign_lives_beside_the_package_not_in_it() -> None:
    assert not (ROOT / "inri" / "fuzzing.py").exists() and (ROOT / "fuzz" / "campaign.py").is_file()
    assert not [m for _, m, _ in _imports("inri") if m == "fuzz" or m.startswith("fuzz.")]
    private = [(p.name, m, n) for p, m, names in _imports("fuzz") for n in names if n.startswith("_")]
    assert not private, private


def test_the_bootstrap_reaches_the_relay_daemon_only_where_listed() -> None:
    """The shared layer (inri.common) holds addresses, identity, logging, base64url and config; what the
    bootstrap still takes from inri.node is listed here, each for its reason."""
    allowed = {
        ("inri.node.quic", "probe"),  # the QUIC handshake that proves a relay's key is the relay's own protocol
    }
    used = {(m, n) for _, m, names in _imports("bootstrap_nodes") if m.startswith("inri.node") for n in names}
    assert used <= allowed, used - allowed
    private = [(p.name, m, n) for p, m, names in _imports("bootstrap_nodes") if m.startswith("inri")
               for n in names if n.startswith("_")]
    assert not private, private


def test_the_shared_layer_sits_below_node_bootstrap_and_simulations() -> None:
    """inri.common may use the protocol and the core, never what it serves (node, bootstrap, simulations,
    client) nor a private name of another package."""
    below = ("inri.common", "inri.protocol", "inri.core")
    ours = [(p.name, m) for p, m, _ in _imports("inri/common") if m.startswith(("inri", "bootstrap_nodes",
                                                                               "simulations", "fuzz"))]
    assert all(m == "inri" or m.startswith(below) for _, m in ours), ours
    private = [(p.name, m, n) for p, m, names in _imports("inri/common") if not m.startswith("inri.common")
               for n in names if n.startswith("_") and n != "__version__"]
    assert not private, private
