"""`inri-bootstrap init DIR`: a new bootstrap node's directory, ready to start.

Writes `DIR/bootstrap.toml` (every key, at its default unless given here, commented from the docs:
inri.common.template) and `DIR/data/`, then prints the ports to open and the command that starts it.
A bootstrap has no long-lived key (its probes use a throwaway one), so there is nothing else to make.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bootstrap_nodes.config import BootstrapConfig, ConfigError, load_bootstrap_config
from inri.common.addr import parse_addr
from inri.common.template import doc_rows, render

CONFIG_FILE = "bootstrap.toml"
DATA_SUBDIR = "data"
HEADER = """INRI bootstrap node configuration, written by `inri-bootstrap init`.
Every key is listed with its default; a line `# key = value` is the default, in force until you
uncomment it. Precedence: defaults < this file < INRI_BOOTSTRAP_<KEY> environment < command-line flags.
Check the file with `inri-bootstrap check-config --config THIS_FILE`. Reference: docs/operations.md."""


class InitError(Exception):
    """The directory cannot be initialised; one line for the operator."""


def init_bootstrap(directory: Path, settings: dict[str, Any]) -> tuple[Path, BootstrapConfig]:
    """Write DIR/bootstrap.toml and DIR/data; `settings` are the [bootstrap] keys given on the command line."""
    directory = directory.resolve()
    config = directory / CONFIG_FILE
    if config.exists():
        raise InitError(f"{config} exists: init never replaces a configuration")
    data = directory / DATA_SUBDIR
    chosen = {"data_dir": str(data), **{k: v for k, v in settings.items() if v not in (None, (), [], False)}}
    text = render(HEADER, {"bootstrap": BootstrapConfig()}, {"bootstrap": chosen}, doc_rows(["operations.md"]))
    tmp = config.with_name(config.name + ".tmp")
    try:
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp.write_text(text, encoding="utf-8")
        cfg = load_bootstrap_config(tmp, env={})
        tmp.replace(config)
    except ConfigError as exc:
        tmp.unlink(missing_ok=True)
        raise InitError(str(exc).replace(str(tmp), "init")) from None
    except OSError as exc:
        raise InitError(f"cannot write {config}: {exc.strerror or exc}") from None
    return config, cfg


def report(config: Path, cfg: BootstrapConfig) -> str:
    """The lines printed after init: ports to open and the next command."""
    port = parse_addr(cfg.listen)[1]
    return "\n".join([
        f"bootstrap initialised: {config}",
        f"open: TCP {port} (or 443 on your TLS reverse proxy forwarding to {cfg.listen}): relays announce and ask "
        "for peers",
        "allow: outbound UDP to relays' QUIC ports (each announcement is proven by a QUIC handshake back)",
        f"next: inri-bootstrap serve --config {config}",
    ])
