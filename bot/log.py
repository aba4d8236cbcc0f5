"""structlog set-up: JSON (or console) lines with delivery context bound via contextvars."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(fmt: str = "json", level: int = logging.INFO) -> None:
    renderer = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )


def _stderr_logger(*_args: object) -> structlog.PrintLogger:
    # Resolved at each use: test runners and daemons may swap sys.stderr after set-up.
    return structlog.PrintLogger(file=sys.stderr)
