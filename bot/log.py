"""structlog set-up: JSON (or console) lines with delivery context bound via contextvars.

Libraries log through the standard `logging` module (aiohttp's "Error handling request",
asyncio's "Task exception was never retrieved"); those records go through the same
renderer, so an exception anywhere becomes one JSON line carrying its traceback, never a
bare traceback in the middle of the JSON stream.
"""

from __future__ import annotations

import logging
import sys

import msgspec
import structlog
from structlog.types import Processor

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(fmt: str = "json", level: int | str = logging.INFO) -> None:
    """`level` is a `logging` level or one of LEVELS' names (KLAUD_LOG_LEVEL)."""
    number = LEVELS[level] if isinstance(level, str) else level
    renderer: Processor = (
        structlog.processors.JSONRenderer(serializer=_json_text)
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
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )
    _route_standard_logging(renderer, number)


# msgspec is the one JSON library of the hot path; a log line is written per delivery.
# Whatever it cannot write (an exception object, a path) is written as its str().
_LINE = msgspec.json.Encoder(enc_hook=str)


def _json_text(event: object, **_options: object) -> str:
    return _LINE.encode(event).decode()


def _stderr_logger(*_args: object) -> structlog.PrintLogger:
    # Resolved at each use: test runners and daemons may swap sys.stderr after set-up.
    return structlog.PrintLogger(file=sys.stderr)


class _StderrHandler(logging.Handler):
    """Writes to whatever sys.stderr is at the time of the record (see _stderr_logger)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except (OSError, ValueError):  # stderr closed or gone: nowhere left to report it
            self.handleError(record)


def _route_standard_logging(renderer: Processor, level: int) -> None:
    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.contextvars.merge_contextvars,
                structlog.stdlib.add_logger_name,
                structlog.processors.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    # Replaces an earlier set-up's handler; others (a test runner's capture) stay.
    root.handlers = [h for h in root.handlers if not isinstance(h, _StderrHandler)] + [handler]
    root.setLevel(level)
