"""structlog set-up: JSON (or console) lines with delivery context bound via contextvars.

Libraries log through the standard `logging` module (aiohttp's "Error handling request",
asyncio's "Task exception was never retrieved"); those records go through the same
renderer, so an exception anywhere becomes one JSON line carrying its traceback, never a
bare traceback in the middle of the JSON stream. A request aiohttp cannot parse is the
client's error, not one of the server: one info line without a traceback.
"""

from __future__ import annotations

import logging
import sys

import msgspec
import structlog
from aiohttp.http_exceptions import HttpProcessingError
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
    logging.getLogger("aiohttp.server").addFilter(_CLIENT_ERRORS)  # once: the same filter object


# How much of a client's malformed request a log line repeats (a request line may be 8 KB).
CLIENT_ERROR_CHARS = 200


class _ClientErrorsAsInfo(logging.Filter):
    """aiohttp's server logs a request it cannot parse (`GET * HTTP/1.1`, a Content-Length
    that is not a number) as an ERROR with a traceback, after answering it 400: anyone on
    the internet could fill the error log and trip error-rate alerts. Its parser's errors
    (HttpProcessingError and subclasses) are the client's: one info line, no traceback.
    Any other exception on that logger stays an error with its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            # The parser's message spans lines (a caret under the bad byte): one line here.
            said = " ".join(f"{type(exc).__name__}: {exc.code} {exc.message}".split())[:CLIENT_ERROR_CHARS]
            record.msg, record.args = f"{record.getMessage()}: {said}", ()
            # Never raised: aiohttp logs non-HTTP traffic on a connection's first request at debug.
            record.levelno = min(record.levelno, logging.INFO)
            record.levelname = logging.getLevelName(record.levelno)
            record.exc_info = record.exc_text = None
            # The logger let it through at its first level: at the new one it is kept only
            # where KLAUD_LOG_LEVEL (the root's level) shows such lines.
            return record.levelno >= logging.getLogger().getEffectiveLevel()
        return True


_CLIENT_ERRORS = _ClientErrorsAsInfo()
