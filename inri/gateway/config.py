"""`inri gateway` configuration: one TOML file with `[gateway]`, `[apns]` and/or `[fcm]` (docs/gateway.md).

Values are checked by the validator shared with the relay and the bootstrap (inri.common.config): an
error names the file and the key. File paths in the file (the sealing key, the .p8 key, the service
account, CA bundles, TLS files) are relative to the file's directory. Environment variables
`INRI_GATEWAY_<KEY>` override `[gateway]` keys (e.g. INRI_GATEWAY_LISTEN); the providers' keys come
from the file only, beside the credentials they point at.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from msgspec import Meta

from inri.common.addr import parse_addr
from inri.common.config import ConfigError, Setting, apply, build, read_toml

__all__ = ["ApnsSection", "ConfigError", "FcmSection", "GatewayConfig", "GatewaySection", "ServiceAccount",
           "load_gateway_config"]

Positive = Meta(gt=0)
AtLeastOne = Meta(ge=1)
_APPLE_ID = re.compile(r"[A-Z0-9]{10}")  # Apple key ids and team ids: 10 characters
APNS_COLLAPSE_ID_MAX_BYTES = 64  # Apple: apns-collapse-id must not exceed 64 bytes
FCM_TTL_MAX_S = 2_419_200  # 4 weeks (FCM v1 ErrorCode INVALID_ARGUMENT, "Invalid TTL")
# Apple: refresh the provider token no more than once every 20 minutes and no less than once every 60.
APNS_REFRESH_MIN_S = 20 * 60
APNS_REFRESH_MAX_S = 55 * 60  # 5 minutes short of Apple's hour: clocks differ


@dataclass(frozen=True)
class GatewaySection:
    """The gateway's own service."""

    listen: str = "127.0.0.1:8490"  # HTTP listen address (POST /v1/wake); port 0: any free port, printed
    key_file: str = "gateway.key"  # the sealing key (`inri gateway keygen`); its public half goes into the app
    tls_cert: str = ""  # PEM; both or neither; empty: plain HTTP behind a TLS proxy (relays require https)
    tls_key: str = ""
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: str = "info"
    rate_per_s: Annotated[float, Positive] = 50.0  # wake requests per client address (/64 for IPv6)
    rate_burst: Annotated[int, AtLeastOne] = 200
    # wake-ups per device token: whoever holds a sealed token (its home relay) cannot buzz a phone at will
    token_rate_per_s: Annotated[float, Positive] = 0.05
    token_burst: Annotated[int, AtLeastOne] = 5
    # a device token the provider throttled (APNs TooManyRequests, FCM QUOTA_EXCEEDED) without a Retry-After
    # waits this long: its wake-ups are answered 503 with Retry-After meanwhile, the provider is not asked
    token_backoff_s: Annotated[float, Positive] = 30.0
    provider_timeout_s: Annotated[float, Positive] = 10.0  # one request to APNs/FCM, connection included
    shutdown_grace_s: Annotated[float, Meta(ge=0)] = 5.0


@dataclass(frozen=True)
class ApnsSection:
    """Apple Push Notification service, token-based (an auth key of the app's team)."""

    key_file: str  # the .p8 auth key
    key_id: str  # its 10-character key id
    team_id: str  # the 10-character team id
    topic: str  # the app's bundle id
    push_type: Literal["background", "alert"] = "background"  # alert: a visible notification (alert_*)
    alert_title: str = ""
    alert_body: str = "New message"
    expiration_s: Annotated[int, Meta(ge=0, le=30 * 24 * 3600)] = 3600  # APNs keeps the wake-up this long
    collapse_id: str = "inri-wake"  # wake-ups not yet shown replace each other on the device; "": none
    base_url: str = "https://api.push.apple.com"  # sandbox: https://api.sandbox.push.apple.com
    token_refresh_s: Annotated[float, Meta(ge=APNS_REFRESH_MIN_S, le=APNS_REFRESH_MAX_S)] = 3000.0  # 50 minutes
    ca_file: str = ""  # PEM certificates trusted for base_url instead of the system's (tests, proxies)


@dataclass(frozen=True)
class FcmSection:
    """Firebase Cloud Messaging HTTP v1 (a service account of the app's Firebase project)."""

    service_account: str  # the service account JSON file
    project_id: str = ""  # default: the service account's project_id
    base_url: str = "https://fcm.googleapis.com"
    ttl_s: Annotated[int, Meta(ge=0, le=FCM_TTL_MAX_S)] = 3600  # android.ttl
    collapse_key: str = "inri-wake"  # android.collapse_key (and apns-collapse-id for iOS apps on FCM)
    ca_file: str = ""  # PEM certificates trusted for base_url and the token URL instead of the system's


@dataclass(frozen=True)
class ServiceAccount:
    """What the gateway reads of a Google service account JSON file."""

    project_id: str
    private_key_id: str
    private_key: str
    client_email: str
    token_uri: str


@dataclass(frozen=True)
class GatewayConfig:
    """The whole configuration; at least one provider."""

    gateway: GatewaySection = field(default_factory=GatewaySection)
    apns: ApnsSection | None = None
    fcm: FcmSection | None = None
    base_dir: Path = Path(".")  # the config file's directory (relative paths resolve against it)

    def path(self, name: str) -> Path:
        """A configured file path, resolved against the config file's directory."""
        return self.base_dir / name


def read_service_account(path: Path) -> ServiceAccount:
    """A service account JSON file; ConfigError naming the file and the field otherwise."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    except (ValueError, UnicodeDecodeError):
        raise ConfigError(f"{path}: not JSON (expected a Google service account key file)") from None
    if not isinstance(data, dict) or data.get("type") != "service_account":
        raise ConfigError(f'{path}: not a service account key file (expected "type": "service_account")')
    values: dict[str, str] = {}
    for name in ("project_id", "private_key_id", "private_key", "client_email", "token_uri"):
        value = data.get(name)
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{path}: {name} missing or not a string")
        values[name] = value
    if not values["token_uri"].startswith("https://"):
        raise ConfigError(f"{path}: token_uri must be an https URL")
    return ServiceAccount(**values)


def _https(url: str, origin: str) -> None:
    parts = urlsplit(url)
    if parts.scheme != "https" or not parts.netloc or parts.query or parts.fragment:
        raise ConfigError(f"{origin}: {url!r} is not an https base URL (https://host[:port][/path])")


def load_gateway_config(path: str | Path, *, env: dict[str, str] | None = None,
                        overrides: dict[str, Any] | None = None) -> GatewayConfig:
    """The file, INRI_GATEWAY_* variables for [gateway], then overrides (None values ignored); validated."""
    env = dict(os.environ) if env is None else env
    data = read_toml(path, ConfigError)
    extra = set(data) - {"gateway", "apns", "fcm"}
    if extra:
        raise ConfigError(f"{path}: unknown section(s) {sorted(extra)} (expected [gateway], [apns], [fcm])")
    table = data.get("gateway", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: gateway must be a table")
    settings = {k: Setting(v, f"{path}: gateway.{k}", source=str(path)) for k, v in table.items()}
    prefix = "INRI_GATEWAY_"
    settings.update({k[len(prefix):].lower(): Setting(v, k, text=True) for k, v in env.items() if k.startswith(prefix)})
    settings.update({k: Setting(v, f"gateway.{k} (command line)") for k, v in (overrides or {}).items()
                     if v is not None})
    gw = apply(GatewaySection(), settings, where=f"{path} [gateway]")
    apns = build(ApnsSection, data["apns"], where=f"{path} [apns]") if "apns" in data else None
    fcm = build(FcmSection, data["fcm"], where=f"{path} [fcm]") if "fcm" in data else None
    cfg = GatewayConfig(gw, apns, fcm, Path(path).resolve().parent)

    def at(section: str, key: str) -> str:
        s = settings.get(key) if section == "gateway" else None
        return s.origin if s is not None else f"{path}: {section}.{key}"

    try:
        parse_addr(gw.listen)
    except ValueError as exc:
        raise ConfigError(f"{at('gateway', 'listen')}: {exc}") from None
    if gw.log_level.lower() not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"{at('gateway', 'log_level')}: expected debug, info, warning or error")
    if bool(gw.tls_cert) != bool(gw.tls_key):
        raise ConfigError(f"{at('gateway', 'tls_cert')}: tls_cert and tls_key go together")
    if apns is None and fcm is None:
        raise ConfigError(f"{path}: configure at least one provider: [apns] and/or [fcm]")
    files: list[tuple[str, str, str]] = [("gateway", k, getattr(gw, k)) for k in ("tls_cert", "tls_key")
                                         if getattr(gw, k)]
    if apns is not None:
        for key in ("key_id", "team_id"):
            if not _APPLE_ID.fullmatch(getattr(apns, key)):
                raise ConfigError(f"{at('apns', key)}: expected Apple's 10-character id, got {getattr(apns, key)!r}")
        if not apns.topic:
            raise ConfigError(f"{at('apns', 'topic')}: the app's bundle id is required")
        if len(apns.collapse_id.encode()) > APNS_COLLAPSE_ID_MAX_BYTES:
            raise ConfigError(f"{at('apns', 'collapse_id')}: at most {APNS_COLLAPSE_ID_MAX_BYTES} bytes")
        if apns.push_type == "alert" and not (apns.alert_title or apns.alert_body):
            raise ConfigError(f"{at('apns', 'alert_body')}: a visible alert needs alert_title or alert_body")
        _https(apns.base_url, at("apns", "base_url"))
        files += [("apns", "key_file", apns.key_file)] + ([("apns", "ca_file", apns.ca_file)] if apns.ca_file else [])
    if fcm is not None:
        _https(fcm.base_url, at("fcm", "base_url"))
        if not fcm.collapse_key:
            raise ConfigError(f"{at('fcm', 'collapse_key')}: must not be empty")
        files += [("fcm", "service_account", fcm.service_account)] + (
            [("fcm", "ca_file", fcm.ca_file)] if fcm.ca_file else [])
    for section, key, name in files:
        if not cfg.path(name).is_file():
            raise ConfigError(f"{at(section, key)}: no such file {str(cfg.path(name))!r}")
    if fcm is not None:
        account = read_service_account(cfg.path(fcm.service_account))
        if not fcm.project_id:
            cfg = replace(cfg, fcm=replace(fcm, project_id=account.project_id))
    return cfg
