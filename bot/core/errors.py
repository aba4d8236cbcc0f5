"""How a handler error is treated by the inbox (DESIGN §1).

Transient errors (network, timeouts, 5xx, rate limits) retry the delivery with backoff.
Permanent ones (a 4xx other than a rate limit, such as a 404 for a repository or pull
request that no longer exists, or a payload that fails validation) fail it at once: a
retry would only repeat the same answer.
"""

from __future__ import annotations

from pydantic import ValidationError


class PermanentError(Exception):
    """Raised by handlers for input that can never be processed (bad payload, gone object)."""


def is_permanent(exc: BaseException) -> bool:
    if isinstance(exc, (PermanentError, ValidationError)):
        return True
    # The GitHub client's errors say themselves whether a retry can help.
    transient = getattr(exc, "transient", None)
    return transient is False
