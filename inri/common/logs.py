"""structlog setup: pretty, coloured lines on a terminal; one JSON object per line otherwise.

Every line is in the chosen format, libraries' included: the stdlib loggers (aioquic's `quic`,
hypercorn's, trio's, httpx's) go through the root logger's handler, whose formatter is structlog's
ProcessorFormatter with the same renderer, so a JSON log holds nothing but JSON lines.

The level can change while the daemon runs (`set_level`, on SIGHUP): the bound loggers check one
shared threshold instead of baking it in when they are first used, as structlog's
make_filtering_bound_logger does (a reconfiguration would not reach loggers already cached).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_threshold = [logging.INFO]  # the level in force (set_level); a list so the logger methods read it live


def _level_filter(level: int, method: str) -> Any:
    def log_method(self: structlog.BoundLoggerBase, event: str | None = None, *args: Any, **kw: Any) -> Any:
        if level < _threshold[0]:
            return None
        if args:
            event = event % args if event is not None else event
        return self._proxy_to_logger(method, event, **kw)

    return log_method


class LevelFilteringLogger(structlog.BoundLoggerBase):
    """A bound logger whose debug/info/warning/error calls below the current threshold do nothing."""

    debug = _level_filter(logging.DEBUG, "debug")
    info = _level_filter(logging.INFO, "info")
    warning = _level_filter(logging.WARNING, "warning")
    warn = warning
    error = _level_filter(logging.ERROR, "error")
    critical = _level_filter(logging.CRITICAL, "critical")

    def exception(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        """error() with the current exception's traceback."""
        kw.setdefault("exc_info", True)
        return self.error(event, *args, **kw)

    def log(self, level: int, event: str | None = None, *args: Any, **kw: Any) -> Any:
        """Log at a numeric stdlib level."""
        if level < _threshold[0]:
            return None
        name = logging.getLevelName(level).lower()
        if args:
            event = event % args if event is not None else event
        return self._proxy_to_logger(name if name in LEVELS or name == "critical" else "info", event, **kw)


_QUIET = ("httpx", "httpcore", "hpack")  # libraries whose info lines would leak URLs or headers


def set_level(level: str) -> None:
    """Change the level in force for every logger, structlog's and the stdlib's (debug/info/warning/error)."""
    value = LEVELS.get(level.lower(), logging.INFO)
    _threshold[0] = value
    logging.getLogger().setLevel(value)


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    """fmt: auto | json | console. Logs go to stderr (stdout is for machine-readable output)."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    shared: list[structlog.types.Processor] = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            *shared,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=LevelFilteringLogger,
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # The stdlib's loggers (libraries) through the same renderer: one format for every line.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared, structlog.processors.format_exc_info],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    ))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    # httpx and httpcore log every request's URL at info: URLs carry capabilities (an APNs device token
    # in the path, a Web Push endpoint), which no log line may hold. Their warnings still come through.
    for name in _QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    set_level(level)
