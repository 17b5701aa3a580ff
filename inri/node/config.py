"""Relay configuration: one TOML file, documented defaults, environment overrides, clear errors.

Precedence (lowest first): built-in defaults, the profile ("default" or "test": short timers for
loopback tests), the TOML file, environment variables `INRI_<SECTION>_<KEY>` (e.g. INRI_RELAY_API,
INRI_TRACE_LEVEL), then command-line flags. Every option is listed in docs/operations.md.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from inri.core.config import EngineConfig
from inri.node.store import StoreSync


class ConfigError(ValueError):
    """A configuration problem, with the file, section and key it concerns."""


@dataclass(frozen=True)
class RelaySection:
    data_dir: str = "./inri-data"  # identity, SQLite store, trace files
    api: str = "127.0.0.1:8480"  # HTTP/WebSocket listen address (put a TLS reverse proxy in front)
    quic: str = "0.0.0.0:4433"  # QUIC listen address for relay-to-relay links (UDP)
    public_addr: str = ""  # QUIC address announced to bootstraps and peers; default: the quic address
    bootstrap: tuple[str, ...] = ()  # bootstrap URLs; empty: bootstrap_nodes/default.toml
    geo: str = ""  # coarse hint "lat,lon" (1 decimal) for proximity ranking; empty: none
    capacity: int = 100  # relative capacity announced to bootstraps (1..65535)
    profile: str = "default"  # "test": short timers for loopback tests (GUIDE.md section 5)
    announce_interval_s: float = 300.0  # re-announce to bootstraps (records expire after 30 min)
    peers_interval_s: float = 60.0  # ask bootstraps for candidates while below the active view size
    log_format: str = "auto"  # auto (pretty on a terminal, JSON otherwise) | json | console
    log_level: str = "info"
    shutdown_grace_s: float = 5.0  # time given to in-flight requests on SIGINT/SIGTERM


@dataclass(frozen=True)
class QuicSection:
    idle_timeout_s: float = 30.0  # aioquic default is 60 s; links also carry engine keepalives
    # Bytes queued for one neighbour and not yet acknowledged by it. A neighbour that withholds QUIC
    # flow-control credit cannot make the relay buffer more: further frames to it are dropped,
    # counted (inri_frames_dropped_congested_total) and lower its score. Must hold one full frame.
    send_queue_max_bytes: int = 4 * 1024 * 1024


@dataclass(frozen=True)
class StoreSection:
    synchronous: str = StoreSync.NORMAL.value  # "normal" | "full" (docs/operations.md, Durability)


@dataclass(frozen=True)
class ApiSection:
    max_body_bytes: int = 16 * 1024  # larger bodies get 413 without being read
    rate_per_s: float = 50.0  # per client address (/64 for IPv6), token bucket
    rate_burst: int = 100
    tokens_default: int = 50  # tokens handed out per registration / refill
    tokens_max: int = 500
    mailbox_max: int = 1000  # stored, unacknowledged messages per device
    device_rate_per_s: float = 10.0  # pushes accepted here per device (route id): one credential cannot flood it
    device_rate_burst: int = 50
    token_rate_per_s: float = 0.1  # pushes accepted here per token: a one-use token re-sent is a retry, not traffic
    token_rate_burst: int = 3
    # A request refused for a rate limit is answered after up to tarpit_s (never later than its
    # Retry-After), so a client hammering the API over a few connections gets about one answer per
    # connection per second instead of thousands of cheap 429s that crowd everyone else out. At most
    # tarpit_max requests wait at once; beyond that, 429 comes at once. tarpit_s = 0 turns it off.
    tarpit_s: float = 1.0
    tarpit_max: int = 1024


@dataclass(frozen=True)
class TraceSection:
    level: str = "off"  # off | summary | full (a trace of route ids and peers is metadata)
    salt: str = ""  # empty: a random per-relay salt (traces do not join across relays)
    max_bytes: int = 64 * 1024 * 1024  # rotate a trace file past this
    keep: int = 3  # rotated files kept


@dataclass(frozen=True)
class RelayConfig:
    relay: RelaySection = field(default_factory=RelaySection)
    quic: QuicSection = field(default_factory=QuicSection)
    api: ApiSection = field(default_factory=ApiSection)
    trace: TraceSection = field(default_factory=TraceSection)
    store: StoreSection = field(default_factory=StoreSection)
    engine: EngineConfig = field(default_factory=EngineConfig)

    @property
    def data_path(self) -> Path:
        return Path(self.relay.data_dir)


_SECTIONS = {"relay": RelaySection, "quic": QuicSection, "api": ApiSection, "trace": TraceSection,
             "store": StoreSection, "engine": EngineConfig}
TEST_PROFILE_QUIC_IDLE_S = 5.0


def _coerce(value: Any, default: Any, where: str) -> Any:
    """Check/convert value to the type of default; ConfigError with `where` otherwise."""
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "0", "false", "no"):
            return value.lower() in ("1", "true", "yes")
    elif isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
    elif isinstance(default, float):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif isinstance(default, str):
        if isinstance(value, str):
            return value
    elif isinstance(default, tuple):
        if isinstance(value, tuple):
            value = list(value)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
    raise ConfigError(f"{where}: expected {type(default).__name__}, got {value!r}")


def _apply(section: Any, values: dict[str, Any], where: str) -> Any:
    known = {f.name: f for f in fields(section)}
    changes = {}
    for key, value in values.items():
        if key not in known:
            hint = ", ".join(sorted(known))
            raise ConfigError(f"{where}: unknown key {key!r} (known: {hint})")
        changes[key] = _coerce(value, getattr(section, key), f"{where}.{key}")
    return replace(section, **changes)


def _validate(cfg: RelayConfig) -> None:
    from inri.node.quic import parse_addr

    r = cfg.relay
    for name in ("api", "quic"):
        try:
            parse_addr(getattr(r, name))
        except ValueError as exc:
            raise ConfigError(f"relay.{name}: {exc}") from None
    if r.public_addr:
        try:
            parse_addr(r.public_addr)
        except ValueError as exc:
            raise ConfigError(f"relay.public_addr: {exc}") from None
    if r.profile not in ("default", "test"):
        raise ConfigError(f"relay.profile: expected 'default' or 'test', got {r.profile!r}")
    if r.log_format not in ("auto", "json", "console"):
        raise ConfigError(f"relay.log_format: expected auto, json or console, got {r.log_format!r}")
    if r.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"relay.log_level: expected debug, info, warning or error, got {r.log_level!r}")
    from inri.protocol.peer_record import parse_geo

    if r.geo and parse_geo(r.geo) is None:
        raise ConfigError(f"relay.geo: {r.geo!r} is not a coarse 'lat,lon' with at most one decimal (e.g. 48.8,2.3)")
    if not 1 <= r.capacity <= 65535:
        raise ConfigError("relay.capacity: must be 1..65535")
    for url in r.bootstrap:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"relay.bootstrap: {url!r} is not an http(s) URL")
    if cfg.store.synchronous not in {s.value for s in StoreSync}:
        raise ConfigError(f"store.synchronous: expected 'normal' or 'full', got {cfg.store.synchronous!r}")
    from inri.protocol.limits import MAX_FRAME_BYTES

    if cfg.quic.send_queue_max_bytes < MAX_FRAME_BYTES + 4:
        raise ConfigError(f"quic.send_queue_max_bytes: must be >= {MAX_FRAME_BYTES + 4} (one whole frame)")
    if cfg.trace.level not in ("off", "summary", "full"):
        raise ConfigError(f"trace.level: expected off, summary or full, got {cfg.trace.level!r}")
    a = cfg.api
    if a.tarpit_s < 0 or a.tarpit_max < 0:
        raise ConfigError("api: tarpit_s >= 0 and tarpit_max >= 0")
    if a.max_body_bytes < 1024 or a.rate_per_s <= 0 or a.rate_burst < 1 or a.mailbox_max < 1:
        raise ConfigError("api: max_body_bytes >= 1024, rate_per_s > 0, rate_burst >= 1, mailbox_max >= 1")
    if min(a.device_rate_per_s, a.token_rate_per_s) <= 0 or min(a.device_rate_burst, a.token_rate_burst) < 1:
        raise ConfigError("api: device/token rates must be > 0 and their bursts >= 1")
    if not 1 <= a.tokens_default <= a.tokens_max:
        raise ConfigError("api: need 1 <= tokens_default <= tokens_max")
    e = cfg.engine
    if not 1 <= e.active_min <= e.active_max:
        raise ConfigError("engine: need 1 <= active_min <= active_max")
    if e.keepalive_interval_s <= 0 or e.keepalive_misses < 1:
        raise ConfigError("engine: keepalive_interval_s > 0 and keepalive_misses >= 1")
    if cfg.quic.idle_timeout_s <= e.keepalive_interval_s:
        raise ConfigError("quic.idle_timeout_s must exceed engine.keepalive_interval_s (keepalives keep links up)")


def read_toml(path: str | Path, error: type[ValueError]) -> dict[str, Any]:
    """A TOML file as a dict; `error` (a ValueError subclass) names the file when it is missing or invalid."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise error(f"{path}: not valid TOML: {str(exc)[:200]}") from None


def load_config(
    path: str | Path | None = None,
    *,
    env: dict[str, str] | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> RelayConfig:
    """Defaults <- profile <- TOML file <- INRI_<SECTION>_<KEY> environment <- overrides; validated."""
    env = dict(os.environ) if env is None else env
    raw: dict[str, dict[str, Any]] = {}
    where = "defaults"
    if path is not None:
        where = str(path)
        data = read_toml(path, ConfigError)
        for section, values in data.items():
            if section not in _SECTIONS:
                raise ConfigError(f"{path}: unknown section [{section}] (known: {', '.join(_SECTIONS)})")
            if not isinstance(values, dict):
                raise ConfigError(f"{path}: {section} must be a table")
            raw.setdefault(section, {}).update(values)
    for key, value in env.items():
        if not key.startswith("INRI_"):
            continue
        parts = key[5:].lower().split("_", 1)
        if len(parts) == 2 and parts[0] in _SECTIONS:
            raw.setdefault(parts[0], {})[parts[1]] = value
    for section, values in (overrides or {}).items():
        raw.setdefault(section, {}).update({k: v for k, v in values.items() if v is not None})
    profile = raw.get("relay", {}).get("profile", "default")
    cfg = RelayConfig()
    if profile == "test":
        cfg = replace(cfg, engine=cfg.engine.test_profile(), quic=QuicSection(idle_timeout_s=TEST_PROFILE_QUIC_IDLE_S))
    parts_out: dict[str, Any] = {}
    for section, values in raw.items():
        parts_out[section] = _apply(getattr(cfg, section), values, f"{where} [{section}]")
    cfg = replace(cfg, **parts_out)
    _validate(cfg)
    return cfg


def describe(cfg: RelayConfig) -> dict[str, dict[str, Any]]:
    """The effective configuration as plain data (for --check-config output and /v1/status)."""
    return {name: dataclasses.asdict(getattr(cfg, name)) for name in _SECTIONS}
