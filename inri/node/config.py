"""Relay configuration: one TOML file, documented defaults, environment overrides, clear errors.

Precedence (lowest first): built-in defaults, the profile ("default" or "test": short timers for
loopback tests), the TOML file, environment variables `INRI_<SECTION>_<KEY>` (e.g. INRI_RELAY_API,
INRI_TRACE_LEVEL), then command-line flags. Every option is listed in docs/operations.md.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from msgspec import Meta

from inri.common.addr import format_addr, parse_addr
from inri.common.config import ConfigError, Setting, apply, engine_config, read_toml
from inri.common.front import FrontSettings, check_front_settings
from inri.core.config import EngineConfig
from inri.protocol.limits import MAX_FRAME_BYTES
from inri.protocol.peer_record import parse_geo

__all__ = ["ApiSection", "ConfigError", "MetricsSection", "MozPushSection", "QuicSection", "RelayConfig",
           "RelaySection", "TraceSection", "WakeSection", "describe", "load_config", "public_addrs", "read_toml"]

# An origin as RFC 6454 writes it (no path, query or fragment; a trailing "/" tolerated): Web Push
# compares VAPID `aud` with it, so "push.example.org" (no scheme) would refuse every signed push.
ORIGIN_PATTERN = r"^https?://[^/?#@\s]+/?$"
# Ranges of the fields below (msgspec checks them; inri.common.config).
Positive = Meta(gt=0)
NonNegative = Meta(ge=0)
AtLeastOne = Meta(ge=1)


@dataclass(frozen=True)
class RelaySection:
    data_dir: str = "./inri-data"  # identity, SQLite store, trace files
    api: str = "127.0.0.1:8480"  # HTTP/WebSocket listen address (TLS: [api] tls_cert, or a reverse proxy)
    quic: str = "0.0.0.0:4433"  # QUIC listen address for relay-to-relay links (UDP)
    public_addr: str = ""  # QUIC address announced to bootstraps and peers; default: the quic address
    bootstrap: tuple[str, ...] = ()  # bootstrap URLs; empty: bootstrap_nodes/default.toml
    geo: str = ""  # coarse hint "lat,lon" (1 decimal) for proximity ranking; empty: none
    capacity: Annotated[int, Meta(ge=1, le=65535)] = 100  # relative capacity announced to bootstraps (1..65535)
    # "test": short timers for loopback tests (EngineConfig.test_profile)
    profile: Literal["default", "test"] = "default"
    announce_interval_s: Annotated[float, Positive] = 300.0  # re-announce to bootstraps (records expire after 30 min)
    # ask bootstraps for candidates while below the active view size
    peers_interval_s: Annotated[float, Positive] = 60.0
    log_format: Literal["auto", "json", "console"] = "auto"  # auto: pretty on a terminal, JSON otherwise
    log_level: str = "info"
    shutdown_grace_s: Annotated[float, NonNegative] = 5.0  # time given to in-flight requests on SIGINT/SIGTERM
    # Learned routes are written to routes.msgpack in data_dir this often and on shutdown, and read back
    # at startup, so a restarted relay routes again as its links come up (routesnap.py); 0: off.
    route_snapshot_s: Annotated[float, NonNegative] = 30.0
    # /healthz answers 503 "degraded" once the relay has had no neighbour for this long
    # (inri.node.reachability); a relay starts with none, so this also bounds how long joining may take.
    isolated_degraded_s: Annotated[float, Positive] = 300.0


@dataclass(frozen=True)
class QuicSection:
    idle_timeout_s: Annotated[float, Positive] = 30.0  # aioquic default is 60 s; links also carry engine keepalives
    # Bytes queued for one neighbour and not yet acknowledged by it. A neighbour that withholds QUIC
    # flow-control credit cannot make the relay buffer more: further frames to it are dropped,
    # counted (inri_frames_dropped_congested_total) and lower its score. At least one whole frame.
    send_queue_max_bytes: Annotated[int, Meta(ge=MAX_FRAME_BYTES + 4)] = 4 * 1024 * 1024
    # Push frames sent per second on one link (0: unlimited). Pushes past the rate wait, in order, in
    # the link's queue (bounded by send_queue_max_bytes): a relay on a thin uplink forwards no more
    # than it can carry, and its upstream sees slow receipts (never a black hole) and backpressure.
    link_push_rate_per_s: Annotated[float, NonNegative] = 0.0
    # Link protocol inri/2 (docs/protocol.md, "Registration references"): a push's registration crosses
    # a link once, later pushes for it refer to it (about half a push frame's bytes). Offered to every
    # neighbour; one that speaks only inri/1 gets whole frames. false: offer inri/1 only.
    registration_refs: bool = True
    # Lab only (inri.node.quic.LinkImpairment, `inri mesh up --link-delay-ms ...`): every datagram this
    # relay sends waits link_delay_ms +- link_jitter_ms (uniform) and a share link_loss of them is
    # dropped, so a loopback mesh has impaired links without kernel netem. 0 (off) in production.
    link_delay_ms: Annotated[float, NonNegative] = 0.0
    link_jitter_ms: Annotated[float, NonNegative] = 0.0
    link_loss: Annotated[float, Meta(ge=0, lt=1)] = 0.0


@dataclass(frozen=True)
class ApiSection(FrontSettings):
    """[api]: the HTTP front's deadlines, caps and trusted proxies (FrontSettings, inri/common/front), then
    what the API itself limits."""

    max_body_bytes: Annotated[int, Meta(ge=1024)] = 16 * 1024  # larger bodies get 413 without being read
    rate_per_s: Annotated[float, Positive] = 50.0  # per client address (/64 for IPv6), token bucket
    rate_burst: Annotated[int, AtLeastOne] = 100
    tokens_default: Annotated[int, AtLeastOne] = 50  # tokens handed out per registration / refill
    tokens_max: Annotated[int, AtLeastOne] = 500
    mailbox_max: Annotated[int, AtLeastOne] = 1000  # stored, unacknowledged messages per device
    # pushes accepted here per device (route id): one credential cannot flood it
    device_rate_per_s: Annotated[float, Positive] = 10.0
    device_rate_burst: Annotated[int, AtLeastOne] = 50
    # pushes accepted here per token: a one-use token re-sent is a retry, not traffic
    token_rate_per_s: Annotated[float, Positive] = 0.1
    token_rate_burst: Annotated[int, AtLeastOne] = 3
    # A request refused for a rate limit is answered after up to tarpit_s (never later than its
    # Retry-After), so a client hammering the API over a few connections gets about one answer per
    # connection per second instead of thousands of cheap 429s that crowd everyone else out. At most
    # tarpit_max requests wait at once; beyond that, 429 comes at once. tarpit_s = 0 turns it off.
    tarpit_s: Annotated[float, NonNegative] = 1.0
    tarpit_max: Annotated[int, NonNegative] = 1024
    # Backpressure (inri.node.service.Backpressure): a push is answered 429 "overloaded" with
    # Retry-After instead of 202 while the pushes held in custody here exceed custody_backlog_s
    # seconds of what the path drains (measured: pushes settled per second), at least
    # custody_backlog_min, or custody_route_max for one device (route id).
    custody_backlog_s: Annotated[float, Positive] = 10.0
    custody_backlog_min: Annotated[int, AtLeastOne] = 200
    custody_route_max: Annotated[int, AtLeastOne] = 1000
    # HTTPS on relay.api (PEM files; both or neither), served by the same front (trio.SSLStream): Web Push
    # senders such as node's web-push speak only https. Empty: plain HTTP (a TLS reverse proxy in front).
    tls_cert: str = ""
    tls_key: str = ""


@dataclass(frozen=True)
class TraceSection:
    level: Literal["off", "summary", "full"] = "off"  # a trace of route ids and peers is metadata
    salt: str = ""  # empty: a random per-relay salt (traces do not join across relays)
    max_bytes: Annotated[int, AtLeastOne] = 64 * 1024 * 1024  # rotate a trace file past this
    keep: Annotated[int, NonNegative] = 3  # rotated files kept


@dataclass(frozen=True)
class StoreSection:
    # PRAGMA synchronous of the SQLite store (inri.node.store.StoreSync; docs/operations.md, [store]):
    # normal survives a crash or kill -9, full also a power loss (an fsync per commit).
    synchronous: Literal["normal", "full"] = "normal"


@dataclass(frozen=True)
class WebPushSection:
    """Web Push endpoints (docs/api.md "Web Push")."""

    # Origins ("scheme://host[:port]") this relay answers Web Push on: VAPID `aud` must be one of
    # them; minted endpoint URLs, Location headers and the Matrix gateway's pushkeys use them (URLs
    # the first). Empty: "http://" + the API listen address. Behind a TLS proxy: the proxy's origin.
    public_origins: tuple[Annotated[str, Meta(pattern=ORIGIN_PATTERN)], ...] = ()
    ttl_max_s: Annotated[int, Meta(ge=0, le=30 * 24 * 3600)] = 28 * 24 * 3600  # larger TTLs are clamped
    endpoint_rate_per_s: Annotated[float, Positive] = 1.0  # per endpoint, at the home relay
    endpoint_burst: Annotated[int, AtLeastOne] = 20
    vapid_rate_per_s: Annotated[float, Positive] = 50.0  # per VAPID key (signed pushes), at the entry relay
    vapid_burst: Annotated[int, AtLeastOne] = 200
    endpoints_max: Annotated[int, AtLeastOne] = 100  # live endpoints per device


@dataclass(frozen=True)
class WakeSection:
    """Wake hooks: content-free wake-ups of devices with no live stream (docs/gateway.md, inri/node/wake.py)."""

    # At most one wake-up per device per coalesce_s while it acknowledges nothing; an ack ends the window.
    coalesce_s: Annotated[float, Positive] = 60.0
    # Wake-up requests per hook (token bucket, retries included): a device cannot make its home flood a gateway.
    rate_per_s: Annotated[float, Positive] = 0.1
    rate_burst: Annotated[int, AtLeastOne] = 10
    # A failed wake-up (gateway unreachable, 429, 5xx) is retried after retry_min_s, doubling up to
    # retry_max_s (or the gateway's Retry-After when longer), and given up after retry_attempts attempts.
    retry_min_s: Annotated[float, Positive] = 1.0
    retry_max_s: Annotated[float, Positive] = 300.0
    retry_attempts: Annotated[int, AtLeastOne] = 12
    timeout_s: Annotated[float, Positive] = 10.0  # one wake-up request, connection included
    concurrency: Annotated[int, AtLeastOne] = 32  # wake-up requests in flight at once
    ca_file: str = ""  # PEM certificates trusted for https hooks instead of the system's (private gateways)
    # Lab only: also accept http:// hooks, and hooks on loopback addresses (127.0.0.0/8, ::1, localhost).
    # Hooks are https to public addresses otherwise.
    lab_http_loopback: bool = False


@dataclass(frozen=True)
class MozPushSection:
    """The Mozilla Push WebSocket endpoint for Firefox and Sunup (docs/browsers.md)."""

    enabled: bool = True  # serve /v1/mozpush (and `/` with the push-notification subprotocol)
    hello_timeout_s: Annotated[float, Positive] = 10.0  # a connection's first message must come this soon
    # A connection silent this long is closed (Firefox pings every 30 minutes; a dead one is found sooner
    # by the HTTP front's WebSocket pings)
    idle_timeout_s: Annotated[float, Positive] = 3900.0
    ping_min_interval_s: Annotated[float, NonNegative] = 45.0  # application pings more often close the connection
    channels_max: Annotated[int, Meta(ge=1, le=10_000)] = 100  # subscriptions per user agent
    inflight_max: Annotated[int, Meta(ge=1, le=1000)] = 32  # notifications sent and not acknowledged, per connection
    # Lifetime of the registrations the relay signs for its channels (re-signed at two thirds of it);
    # at most 30 days less a minute (the protocol's bound on a registration's lifetime).
    registration_lifetime_s: Annotated[int, Meta(ge=60, le=30 * 24 * 3600 - 60)] = 30 * 24 * 3600 - 60
    # A user agent not seen this long loses its channels (senders then get 410), as autopush drops one
    agent_idle_max_s: Annotated[float, Positive] = 60 * 24 * 3600.0


@dataclass(frozen=True)
class MetricsSection:
    # Prometheus metrics on a listener of their own ("127.0.0.1:9480"), served by the same HTTP front as the
    # API; the API's port then answers /metrics 404. Empty: GET /metrics on the API's port.
    listen: str = ""


@dataclass(frozen=True)
class RelayConfig:
    relay: RelaySection = field(default_factory=RelaySection)
    quic: QuicSection = field(default_factory=QuicSection)
    api: ApiSection = field(default_factory=ApiSection)
    trace: TraceSection = field(default_factory=TraceSection)
    store: StoreSection = field(default_factory=StoreSection)
    engine: EngineConfig = field(default_factory=EngineConfig)
    webpush: WebPushSection = field(default_factory=WebPushSection)
    wake: WakeSection = field(default_factory=WakeSection)
    mozpush: MozPushSection = field(default_factory=MozPushSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)

    @property
    def data_path(self) -> Path:
        return Path(self.relay.data_dir)


_SECTIONS = {"relay": RelaySection, "quic": QuicSection, "api": ApiSection, "trace": TraceSection,
             "store": StoreSection, "engine": EngineConfig, "webpush": WebPushSection, "wake": WakeSection,
             "mozpush": MozPushSection, "metrics": MetricsSection}
TEST_PROFILE_QUIC_IDLE_S = 5.0


def _env_settings(env: dict[str, str]) -> dict[str, dict[str, Setting]]:
    """INRI_<SECTION>_<KEY> variables of a known section; an error names the variable."""
    out: dict[str, dict[str, Setting]] = {}
    for name, value in env.items():
        if not name.startswith("INRI_"):
            continue
        parts = name[5:].lower().split("_", 1)
        if len(parts) == 2 and parts[0] in _SECTIONS:
            out.setdefault(parts[0], {})[parts[1]] = Setting(value, name, text=True)
    return out


def _validate(cfg: RelayConfig, origin: dict[tuple[str, str], str]) -> None:
    """Rules over values of several keys, or beyond a type and a range; errors name the value's origin."""

    def at(section: str, key: str) -> str:
        return origin.get((section, key), f"{section}.{key}")

    r = cfg.relay
    for name in ("api", "quic"):
        try:
            parse_addr(getattr(r, name))
        except ValueError as exc:
            raise ConfigError(f"{at('relay', name)}: {exc}") from None
    if cfg.metrics.listen:
        try:
            parse_addr(cfg.metrics.listen)
        except ValueError as exc:
            raise ConfigError(f"{at('metrics', 'listen')}: {exc}") from None
    try:
        public_addrs(r.public_addr)
    except ValueError as exc:
        raise ConfigError(f"{at('relay', 'public_addr')}: {exc}") from None
    if r.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"{at('relay', 'log_level')}: expected debug, info, warning or error, got {r.log_level!r}")
    if r.geo and parse_geo(r.geo) is None:
        raise ConfigError(f"{at('relay', 'geo')}: {r.geo!r} is not a coarse 'lat,lon' with at most one decimal "
                          "(e.g. 48.8,2.3)")
    for url in r.bootstrap:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{at('relay', 'bootstrap')}: {url!r} is not an http(s) URL")
    check_front_settings(cfg.api, lambda key: at("api", key))
    if bool(cfg.api.tls_cert) != bool(cfg.api.tls_key):
        raise ConfigError(f"{at('api', 'tls_cert')}: tls_cert and tls_key go together (PEM certificate chain and key)")
    for name in ("tls_cert", "tls_key"):
        tls_file = getattr(cfg.api, name)
        if tls_file and not Path(tls_file).is_file():
            raise ConfigError(f"{at('api', name)}: no such file {tls_file!r}")
    if cfg.wake.ca_file and not Path(cfg.wake.ca_file).is_file():
        raise ConfigError(f"{at('wake', 'ca_file')}: no such file {cfg.wake.ca_file!r}")
    if cfg.wake.retry_min_s > cfg.wake.retry_max_s:
        raise ConfigError(f"{at('wake', 'retry_min_s')}: must be <= wake.retry_max_s ({cfg.wake.retry_max_s})")
    if cfg.api.tokens_default > cfg.api.tokens_max:
        raise ConfigError(f"{at('api', 'tokens_default')}: must be <= api.tokens_max ({cfg.api.tokens_max})")
    if cfg.quic.idle_timeout_s <= cfg.engine.keepalive_interval_s:
        raise ConfigError(f"{at('quic', 'idle_timeout_s')}: must exceed engine.keepalive_interval_s "
                          f"({cfg.engine.keepalive_interval_s}): keepalives keep links up")


def public_addrs(value: str) -> list[str]:
    """`[relay] public_addr` -> the QUIC addresses to announce, IPv4 first ([] when empty).

    One address, or two (an IPv4 and an [IPv6] one) separated by a comma, each `IP:PORT` with an IP
    literal (bootstraps list IP literals only and never resolve names), a port above 0, and neither
    an unspecified nor a multicast address. ValueError with one clear line otherwise.
    """
    if not value.strip():
        return []
    out: list[str] = []
    for part in (p.strip() for p in value.split(",")):
        host, port = parse_addr(part)
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"{part!r}: {host!r} is not an IP address (bootstraps list IP literals only: give "
                             "this host's public IPv4 and/or [IPv6] address)") from None
        if ip.is_unspecified or ip.is_multicast:
            raise ValueError(f"{part!r}: {host} cannot be announced (give the address peers reach this host at)")
        if port == 0:
            raise ValueError(f"{part!r}: port 0 cannot be announced")
        out.append(format_addr(str(ip), port))
    if len(out) > 2 or len({ipaddress.ip_address(parse_addr(a)[0]).version for a in out}) != len(out):
        raise ValueError(f"{value!r}: at most one IPv4 and one IPv6 address, separated by a comma")
    return sorted(out, key=lambda a: ":" in parse_addr(a)[0])  # IPv4 first: relays dial the first address


def load_config(
    path: str | Path | None = None,
    *,
    env: dict[str, str] | None = None,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> RelayConfig:
    """Defaults <- profile <- TOML file <- INRI_<SECTION>_<KEY> environment <- overrides; validated.

    Every error names where the faulty value came from: `<file>: <section>.<key>`, the environment
    variable, or `<section>.<key> (command line)`.
    """
    env = dict(os.environ) if env is None else env
    settings: dict[str, dict[str, Setting]] = {}
    if path is not None:
        data = read_toml(path, ConfigError)
        for section, values in data.items():
            if section not in _SECTIONS:
                raise ConfigError(f"{path}: unknown section [{section}] (known: {', '.join(_SECTIONS)})")
            if not isinstance(values, dict):
                raise ConfigError(f"{path}: {section} must be a table")
            settings.setdefault(section, {}).update(
                {k: Setting(v, f"{path}: {section}.{k}", source=str(path)) for k, v in values.items()})
    for section, values in _env_settings(env).items():
        settings.setdefault(section, {}).update(values)
    for section, values in (overrides or {}).items():
        settings.setdefault(section, {}).update(
            {k: Setting(v, f"{section}.{k} (command line)") for k, v in values.items() if v is not None})
    # The profile picks the base the other settings apply to, so it is checked first.
    profile = apply(RelaySection(), {k: s for k, s in settings.get("relay", {}).items() if k == "profile"},
                    where="[relay]").profile
    cfg = RelayConfig()
    if profile == "test":
        cfg = replace(cfg, engine=cfg.engine.test_profile(), quic=QuicSection(idle_timeout_s=TEST_PROFILE_QUIC_IDLE_S))
    parts: dict[str, Any] = {}
    for section, values in settings.items():
        if section == "engine":
            parts[section] = engine_config(cfg.engine, values, where="[engine]")
        else:
            parts[section] = apply(getattr(cfg, section), values, where=f"[{section}]")
    cfg = replace(cfg, **parts)
    _validate(cfg, {(sec, k): s.origin for sec, values in settings.items() for k, s in values.items()})
    return cfg


def describe(cfg: RelayConfig) -> dict[str, dict[str, Any]]:
    """The effective configuration as plain data (for --check-config output and /v1/status)."""
    return {name: dataclasses.asdict(getattr(cfg, name)) for name in _SECTIONS}
