"""The layering rule of docs/architecture.md, enforced: protocol <- core <- node / simulations / client, the
shared layer inri.common below node, bootstrap and simulations, and no module importing another package's
private names. Read from the source with ast (nothing is imported)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Layer of a module -> the layers it may import from (besides itself and the standard library / PyPI).
ALLOWED: dict[str, set[str]] = {
    "inri.protocol": set(),
    "inri.common": {"inri.protocol", "inri.core"},
    "inri.core": {"inri.protocol"},
    "inri.client": {"inri.protocol", "inri.common"},
    "inri.node": {"inri.protocol", "inri.core", "inri.common"},
    # The wake-up gateway (`inri gateway`), run by app developers, not relay operators: no relay code.
    "inri.gateway": {"inri.protocol", "inri.core", "inri.common"},
    # The bootstrap proves a relay's key with the relay's own QUIC handshake (inri.node.quic.probe).
    "bootstrap_nodes": {"inri.protocol", "inri.core", "inri.common", "inri.node.quic"},
    "simulations": {"inri.protocol", "inri.core", "inri.common"},
    "spark_analysis": {"inri.core.trace"},  # the trace schema, nothing else
    # Applications on top: the CLI, demos and the local mesh lab may use every layer.
    # The fuzz campaign (beside the package, as h11 keeps fuzz/) attacks every layer's public API.
    "fuzz": {"inri.protocol", "inri.core", "inri.common", "inri.client", "inri.node", "bootstrap_nodes",
             "simulations"},
    "inri.app": {"inri.protocol", "inri.core", "inri.common", "inri.client", "inri.node", "bootstrap_nodes",
                 "simulations", "inri.gateway"},
}
APP_MODULES = {"inri.cli", "inri.demo", "inri.live_demo", "inri.mesh", "inri"}
PACKAGES = ("inri", "bootstrap_nodes", "simulations", "spark_analysis", "fuzz")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _layer(module: str) -> str | None:
    if module in APP_MODULES:
        return "inri.app"
    for layer in sorted(ALLOWED, key=len, reverse=True):
        if module == layer or module.startswith(layer + "."):
            return layer
    return None


def _internal(target: str) -> bool:
    return target.split(".")[0] in PACKAGES


def _imports(tree: ast.AST, module: str) -> list[tuple[int, str, list[str]]]:
    out: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((node.lineno, a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: -node.level] if node.level else []
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            out.append((node.lineno, target, [a.name for a in node.names]))
    return out


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def test_every_package_module_has_a_layer() -> None:
    orphans = [str(p.relative_to(ROOT)) for p in _sources() if _layer(_module_name(p)) is None]
    assert not orphans, f"modules outside every layer (add them to ALLOWED or APP_MODULES): {orphans}"


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_layers(path: Path) -> None:
    module = _module_name(path)
    layer = _layer(module)
    assert layer is not None
    tree = ast.parse(path.read_text(), str(path))
    bad = []
    for lineno, target, names in _imports(tree, module):
        if not _internal(target) or (target == "inri" and names == ["__version__"]):
            continue  # outside the project, or the package's version string
        tlayer = _layer(target) or target
        if tlayer == layer:
            ok = True
        else:
            ok = any(target == a or target.startswith(a + ".") for a in ALLOWED[layer])
        if not ok:
            bad.append(f"{path.name}:{lineno} imports {target} (layer {layer} may use {sorted(ALLOWED[layer])})")
        # No private names of another package: a leading underscore in the imported names or in the path.
        if tlayer != layer:
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            private += [p for p in target.split(".") if p.startswith("_") and not p.startswith("__")]
            if private:
                bad.append(f"{path.name}:{lineno} imports private {private} from {target}")
    assert not bad, "\n".join(bad)


def test_the_rule_catches_a_wrong_import(tmp_path: Path) -> None:
    """The checker itself: a core module importing the daemon, and a private name, are both found."""
    src = "from inri.node.service import RelayService\nfrom inri.protocol.codec import _private\n"
    tree = ast.parse(src)
    found = [(t, n) for _, t, n in _imports(tree, "inri.core.engine")]
    assert ("inri.node.service", ["RelayService"]) in found
    assert _layer("inri.node.service") == "inri.node" and "inri.node" not in ALLOWED["inri.core"]
