"""Time sources.

Every rule that depends on time (cooldown, idle PRs, claim TTL, schedules, token expiry,
rate-limit resets) reads a `Clock` instead of the system time, so tests and the sandbox
move time without sleeping.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta


def retry_due(retry_at: datetime, now: datetime, longest_wait: timedelta) -> bool:
    """Whether a retry set for `retry_at` is due at `now`: its time has come, or it is further
    off than any wait it was given (set while the clock ran ahead, a year say, and set back
    since: waited for, the work would not run again for as long)."""
    return retry_at <= now or retry_at - now > longest_wait


class Clock:
    """Wall-clock time; `sleep` really waits."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def timestamp(self) -> float:
        return self.now().timestamp()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class ManualClock(Clock):
    """A clock that only moves when told to.

    The sandbox GitHub owns one (its scenario's `now` plus every `advance_clock`), and in
    `serve --sandbox` mode the bot shares it. `sleep` advances the clock instead of
    waiting, so retry and backoff paths run instantly in tests; `slept` records each wait.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._now = (start or datetime.now(UTC)).astimezone(UTC)
        self.slept: list[float] = []

    def now(self) -> datetime:
        return self._now

    def set(self, when: datetime) -> None:
        self._now = when.astimezone(UTC)

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)

    async def sleep(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.slept.append(seconds)
        self.advance(seconds)
        await asyncio.sleep(0)
