"""How a handler error is treated by the inbox (DESIGN §1).

Transient errors (the network, timeouts, GitHub's 5xx and rate limits, a busy store) retry
the delivery with backoff. Everything else fails it at once: a 4xx other than a rate limit
(a repository or pull request that no longer exists), a payload that fails validation, and
any bug a retry would only repeat while the repository's queue waits behind it.
"""

from __future__ import annotations

import sqlite3


class RepositoryMoved(Exception):
    """Another replica keeps the event's repository under the name `to` (its new name, or
    the name it was stored under before a rename this event reports): the delivery is
    handed on to that name, whose owner processes it."""

    def __init__(self, to: str) -> None:
        super().__init__(f"another replica keeps the repository as {to}")
        self.to = to


class ReconcileFailed(Exception):
    """A reconcile another replica (or `klaud reconcile`) asked of this one failed on GitHub.
    This replica tries it again with backoff (`Reconciler.retry_failed`), so the request
    fails at once with the reason, for whoever asked, rather than being retried too."""

    transient = False


def is_transient(exc: BaseException) -> bool:
    # Klaud's own errors (the GitHub client's, the store's) say whether a retry can help.
    marked = getattr(exc, "transient", None)
    if isinstance(marked, bool):
        return marked
    return isinstance(exc, (TimeoutError, ConnectionError, sqlite3.OperationalError))


def is_permanent(exc: BaseException) -> bool:
    return not is_transient(exc)


def says_what_happened(exc: BaseException) -> bool:
    """Whether `exc` is one of Klaud's own errors (the GitHub client's, the store's): their
    message says what happened and where, so a log line needs no traceback."""
    return isinstance(getattr(exc, "transient", None), bool)


def retry_after(exc: BaseException) -> float | None:
    """Seconds the error asks to wait before trying again (a rate limit's), if it says."""
    wait = getattr(exc, "retry_after", None)
    return float(wait) if isinstance(wait, int | float) else None
