"""structlog setup: pretty, coloured lines on a terminal; one JSON object per line otherwise."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    """fmt: auto | json | console. Logs go to stderr (stdout is for machine-readable output)."""
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper(), logging.INFO)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
