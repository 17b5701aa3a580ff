"""What a running relay does on SIGHUP: re-read its configuration and apply what can change live.

SIGHUP never stops the relay. The hooks run in order; each gets its chance even when one before it
failed, and a failure is logged as one line, the relay keeping what it had. Today the hook the `inri
relay` command installs (`config_reloader`) re-reads the config file and the environment and sets the
log level; with `[api] tls_cert`, `run_relay` adds one that reads the certificate and key again
(`TlsContext.reload`, inri/common/front/tls.py: new connections get the new certificate).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from inri.common.logs import set_level
from inri.node.config import ConfigError, load_config

log = structlog.get_logger("inri.relay")


def run_hooks(hooks: Sequence[Callable[[], None]]) -> None:
    """Run every reload hook; one that fails is logged and the others still run."""
    for hook in hooks:
        try:
            hook()
        except Exception as exc:  # noqa: BLE001 - a reload never takes the relay down; the error is logged
            log.error("reload failed; keeping the running configuration", hook=getattr(hook, "__name__", "?"),
                      error=str(exc))


def config_reloader(path: str | Path | None, overrides: dict[str, dict[str, Any]]) -> Callable[[], None]:
    """A hook that re-reads the configuration as the relay was started with it and applies its log level."""

    def reload_config() -> None:
        try:
            cfg = load_config(path, overrides=overrides)
        except ConfigError as exc:
            raise ConfigError(f"configuration error: {exc}") from None
        set_level(cfg.relay.log_level)
        log.info("configuration reloaded", log_level=cfg.relay.log_level)

    return reload_config
