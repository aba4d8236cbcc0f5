"""The errors of Klaud's GitHub client: a small set that says whether a retry can help.

Services catch these (never aiohttp's or gidgethub's), and the inbox reads `transient` to
decide between retrying a delivery and failing it at once.
"""

from __future__ import annotations


class GitHubError(Exception):
    """A GitHub call failed; `status` is None when no HTTP answer came back."""

    transient = False

    def __init__(self, status: int | None, message: str) -> None:
        super().__init__(f"{status if status is not None else 'no answer'}: {message}")
        self.status = status
        self.message = message


class NotFound(GitHubError):
    """404 or 410: the thing is gone (or the App cannot see it)."""


class Conflict(GitHubError):
    """409 or 422, e.g. "Reference already exists"."""


class RefClash(Conflict):
    """422 "Reference update failed" for a branch another branch leaves no room for: git
    keeps branches as paths, so while `klaud` exists no `klaud/claim-…` can be made."""


class BadRequest(GitHubError):
    """Any other 4xx: retrying the same request will not help."""


class Unauthorized(GitHubError):
    """401 even after minting fresh credentials.

    Transient: tokens are minted per installation and GitHub's token service has bad
    minutes; a delivery (a /klaud hold, say) must not be lost to them.
    """

    transient = True


class TooLarge(GitHubError):
    """A download exceeded its byte cap."""


class RateLimited(GitHubError):
    """Still rate limited after the allowed attempts."""

    transient = True

    def __init__(self, status: int | None, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(status, message)
        self.retry_after = retry_after


class NotSent(Exception):
    """What must happen before a write failed (committing the state that led to it):
    nothing was sent, so there is no answer to be lost. Transient: the delivery retries."""

    transient = True


class Unavailable(GitHubError):
    """Network error, timeout or 5xx after the allowed attempts.

    `maybe_applied` marks a write that may have taken effect although no answer said so;
    such a write is only repeated after reading whether it happened.
    """

    transient = True

    def __init__(self, status: int | None, message: str, *, maybe_applied: bool = False) -> None:
        super().__init__(status, message)
        self.maybe_applied = maybe_applied
