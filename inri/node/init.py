"""`inri relay init DIR`: a new relay's directory, ready to start.

Writes `DIR/relay.toml` (every key, at its default unless given here, commented from the docs:
inri.common.template) and `DIR/data/node.key` (mode 0600), then prints the relay's node id, the
ports to open and the command that starts it. Nothing that exists is overwritten: a directory that
already holds a config or a key is refused (one line), since replacing a key replaces the relay.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inri.common.addr import parse_addr
from inri.common.template import doc_rows, render
from inri.node.config import ConfigError, RelayConfig, load_config
from inri.node.datadir import DataDirError, load_identity, make_dir

CONFIG_FILE = "relay.toml"
DATA_SUBDIR = "data"
HEADER = """INRI relay configuration, written by `inri relay init`.
Every key is listed with its default; a line `# key = value` is the default, in force until you
uncomment it. Precedence: defaults < this file < INRI_<SECTION>_<KEY> environment < command-line flags.
Check the file with `inri relay --config THIS_FILE --check-config`. Reference: docs/operations.md."""


class InitError(Exception):
    """The directory cannot be initialised; one line for the operator."""


@dataclass(frozen=True)
class Initialised:
    """What `init` made: printed for the operator."""

    config: Path
    node_id: str
    quic_port: int
    api: str
    public_addr: str


def init_relay(directory: Path, relay: dict[str, Any]) -> Initialised:
    """Write the config and the key under `directory`; `relay` holds the [relay] keys given on the command line."""
    directory = directory.resolve()
    config = directory / CONFIG_FILE
    data = directory / DATA_SUBDIR
    if config.exists() or (data / "node.key").exists():
        raise InitError(f"{directory} already holds a relay ({config.name} or {DATA_SUBDIR}/node.key): "
                        "init never replaces one (a new key is a new relay)")
    settings = {"data_dir": str(data), **{k: v for k, v in relay.items() if v not in (None, (), [])}}
    defaults = RelayConfig()
    sections = {f.name: getattr(defaults, f.name) for f in dataclasses.fields(defaults)}
    text = render(HEADER, sections, {"relay": settings}, doc_rows(["operations.md", "api.md", "gateway.md"]))
    try:
        make_dir(directory)
        tmp = config.with_name(config.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        cfg = load_config(tmp, env={})  # what init writes must load, with the values given
        tmp.replace(config)
        make_dir(data)
        identity = load_identity(data)
    except ConfigError as exc:
        tmp.unlink(missing_ok=True)
        raise InitError(str(exc).replace(str(tmp), "init")) from None
    except (DataDirError, OSError) as exc:
        raise InitError(str(exc)) from None
    announced = cfg.relay.public_addr or cfg.relay.quic
    return Initialised(config, identity.node_id, parse_addr(announced)[1], cfg.relay.api, cfg.relay.public_addr)


def _is_loopback(addr: str) -> bool:
    host = parse_addr(addr)[0]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def report(made: Initialised) -> str:
    """The lines printed after init: node id, ports to open, what is missing, the next command."""
    lines = [f"relay initialised: {made.config}", f"node id: {made.node_id}",
             f"key: {made.config.parent / DATA_SUBDIR / 'node.key'} (mode 0600; back it up with the store: "
             "inri relay backup)",
             f"open: UDP {made.quic_port} from anywhere (QUIC links with other relays and the bootstraps' probes)"]
    if _is_loopback(made.api):
        lines.append(f"open: TCP 443 on your TLS reverse proxy, forwarding to the API on {made.api} "
                     "(devices and app servers)")
    else:
        lines.append(f"open: TCP {parse_addr(made.api)[1]} (the HTTP API on {made.api}; put TLS in front)")
    if not made.public_addr:
        lines.append("set: [relay] public_addr to this host's public IP and UDP port (IPv4 and/or [IPv6]), or "
                     "bootstraps cannot list the relay")
    lines.append(f"next: inri relay --config {made.config}")
    return "\n".join(lines)
