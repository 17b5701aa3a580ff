"""Bootstrap node configuration: TOML `[bootstrap]` table, documented defaults, env overrides.

Environment variables `INRI_BOOTSTRAP_<KEY>` override the file (e.g. INRI_BOOTSTRAP_LISTEN).
Every key is documented in docs/operations.md; values are checked by the validator shared with the
relay and the simulator (inri.common.config): an error names the file and key or the variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from msgspec import Meta

from inri.common.addr import parse_addr
from inri.common.config import ConfigError, Setting, apply, read_toml
from inri.common.front import FrontSettings, check_front_settings

__all__ = ["BootstrapConfig", "ConfigError", "load_bootstrap_config"]

Positive = Meta(gt=0)
AtLeastOne = Meta(ge=1)


@dataclass(frozen=True)
class BootstrapConfig(FrontSettings):
    """[bootstrap]: the HTTP front's deadlines, caps and trusted proxies (the relay's [api] keys of the same
    names, inri/common/front), then the bootstrap's own keys."""

    listen: str = "0.0.0.0:8470"  # HTTP listen address (put TLS in front, e.g. a reverse proxy: trusted_proxies)
    data_dir: str = "./bootstrap-data"  # SQLite store of relay records
    allow_private: bool = False  # accept loopback/private/link-local addresses (tests, lab meshes)
    record_ttl_s: Annotated[float, Positive] = 1800.0  # a record not refreshed for this long is dropped
    max_skew_s: Annotated[float, Positive] = 120.0  # announce timestamps further than this from our clock are stale
    # listed records per IPv4 /24 or IPv6 /48 (one operator cannot flood the list)
    per_prefix_max: Annotated[int, AtLeastOne] = 16
    max_records: Annotated[int, AtLeastOne] = 100_000  # bounded memory: new relays are refused past this
    max_body_bytes: Annotated[int, Meta(ge=1024)] = 8192  # announce bodies larger than this get 413 unread
    rate_per_s: Annotated[float, Positive] = 2.0  # requests per second per client address (/64 for IPv6)
    rate_burst: Annotated[int, AtLeastOne] = 20
    peers: tuple[str, ...] = ()  # other bootstrap URLs to exchange records with
    sync_interval_s: Annotated[float, Positive] = 60.0
    probe_timeout_s: Annotated[float, Positive] = 3.0  # QUIC handshake back to an announced address
    max_peers_answer: Annotated[int, AtLeastOne] = 32  # most peers one answer lists
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: str = "info"


def load_bootstrap_config(
    path: str | Path | None = None, *, env: dict[str, str] | None = None, overrides: dict[str, Any] | None = None
) -> BootstrapConfig:
    """Defaults <- file [bootstrap] <- INRI_BOOTSTRAP_* <- overrides (None values ignored); validated."""
    env = dict(os.environ) if env is None else env
    settings: dict[str, Setting] = {}
    if path is not None:
        data = read_toml(path, ConfigError)
        extra = set(data) - {"bootstrap"}
        if extra:
            raise ConfigError(f"{path}: unknown section(s) {sorted(extra)} (expected [bootstrap])")
        table = data.get("bootstrap", {})
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: bootstrap must be a table")
        settings.update({k: Setting(v, f"{path}: bootstrap.{k}", source=str(path)) for k, v in table.items()})
    prefix = "INRI_BOOTSTRAP_"
    settings.update({k[len(prefix):].lower(): Setting(v, k, text=True) for k, v in env.items() if k.startswith(prefix)})
    settings.update({k: Setting(v, f"bootstrap.{k} (command line)") for k, v in (overrides or {}).items()
                     if v is not None})
    cfg = apply(BootstrapConfig(), settings, where="[bootstrap]")

    def at(key: str) -> str:
        s = settings.get(key)
        return s.origin if s is not None else f"bootstrap.{key}"

    try:
        parse_addr(cfg.listen)
    except ValueError as exc:
        raise ConfigError(f"{at('listen')}: {exc}") from None
    check_front_settings(cfg, at)
    if cfg.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"{at('log_level')}: expected debug, info, warning or error, got {cfg.log_level!r}")
    for url in cfg.peers:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{at('peers')}: {url!r} is not an http(s) URL")
    return cfg
