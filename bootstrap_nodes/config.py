"""Bootstrap node configuration: TOML `[bootstrap]` table, documented defaults, env overrides.

Environment variables `INRI_BOOTSTRAP_<KEY>` override the file (e.g. INRI_BOOTSTRAP_LISTEN).
Every key is documented in docs/operations.md.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from inri.node.config import read_toml


class ConfigError(ValueError):
    """A configuration problem naming the file and key."""


@dataclass(frozen=True)
class BootstrapConfig:
    listen: str = "0.0.0.0:8470"  # HTTP listen address (put TLS in front, e.g. a reverse proxy)
    data_dir: str = "./bootstrap-data"  # SQLite store of relay records
    allow_private: bool = False  # accept loopback/private/link-local addresses (tests, lab meshes)
    record_ttl_s: float = 1800.0  # a record not refreshed for this long is dropped
    max_skew_s: float = 120.0  # announce timestamps further than this from our clock are stale
    per_prefix_max: int = 16  # listed records per IPv4 /24 or IPv6 /48 (one operator cannot flood the list)
    max_records: int = 100_000  # bounded memory: new relays are refused past this
    max_body_bytes: int = 8192  # announce bodies larger than this get 413 unread
    rate_per_s: float = 2.0  # requests per second per client address (/64 for IPv6)
    rate_burst: int = 20
    peers: tuple[str, ...] = ()  # other bootstrap URLs to exchange records with
    sync_interval_s: float = 60.0
    probe_timeout_s: float = 3.0  # QUIC handshake back to an announced address
    max_peers_answer: int = 32  # most peers one answer lists
    log_format: str = "auto"
    log_level: str = "info"


def _coerce(key: str, value: Any, default: Any, where: str) -> Any:
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                    raise ValueError
                return value.lower() in ("1", "true", "yes")
            if not isinstance(value, bool):
                raise ValueError
            return value
        if isinstance(default, int):
            if isinstance(value, bool):
                raise ValueError
            return int(value)
        if isinstance(default, float):
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if isinstance(default, tuple):
            if isinstance(value, str):
                value = [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError
            return tuple(value)
        if not isinstance(value, str):
            raise ValueError
        return value
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {key}: expected {type(default).__name__}, got {value!r}") from None


def load_bootstrap_config(
    path: str | Path | None = None, *, env: dict[str, str] | None = None, overrides: dict[str, Any] | None = None
) -> BootstrapConfig:
    """Defaults <- file [bootstrap] <- INRI_BOOTSTRAP_* <- overrides (None values ignored)."""
    env = dict(os.environ) if env is None else env
    values: dict[str, Any] = {}
    where = "defaults"
    if path is not None:
        where = str(path)
        data = read_toml(path, ConfigError)
        extra = set(data) - {"bootstrap"}
        if extra:
            raise ConfigError(f"{path}: unknown section(s) {sorted(extra)} (expected [bootstrap])")
        values.update(data.get("bootstrap", {}))
    for k, v in env.items():
        if k.startswith("INRI_BOOTSTRAP_"):
            values[k[len("INRI_BOOTSTRAP_"):].lower()] = v
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    cfg = BootstrapConfig()
    known = {f.name for f in fields(cfg)}
    for k in values:
        if k not in known:
            raise ConfigError(f"{where}: unknown key {k!r} (known: {', '.join(sorted(known))})")
    cfg = replace(cfg, **{k: _coerce(k, v, getattr(cfg, k), where) for k, v in values.items()})
    if cfg.record_ttl_s <= 0 or cfg.max_skew_s <= 0 or cfg.per_prefix_max < 1 or cfg.max_records < 1:
        raise ConfigError(f"{where}: record_ttl_s, max_skew_s > 0; per_prefix_max, max_records >= 1")
    if cfg.rate_per_s <= 0 or cfg.rate_burst < 1 or cfg.max_body_bytes < 1024:
        raise ConfigError(f"{where}: rate_per_s > 0, rate_burst >= 1, max_body_bytes >= 1024")
    for url in cfg.peers:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}: peers: {url!r} is not an http(s) URL")
    return cfg
