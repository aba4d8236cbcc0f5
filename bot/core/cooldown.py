"""Cooldown: may a candidate be tried again now? (DESIGN §4 "Cooldown", domain §4.2).

Only *verified* outcomes count. An attempt whose artifact could not be read is a distinct
state, never a failure: treating it as one would park a healthy candidate for a day because
an artifact expired or a download timed out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from bot.core.domain import RETRY_NEXT_WAVE_OUTCOMES, Attempt


@dataclass(frozen=True, slots=True)
class CooldownState:
    eligible: bool
    until: datetime | None  # set only while a cooldown is active
    reason: str
    attempt: Attempt | None  # the attempt that decided, when one did


def cooldown(
    attempts: Sequence[Attempt],
    candidate: str,
    now: datetime,
    cooldown_hours: int,
    retry_approved: bool,
) -> CooldownState:
    """Classify `candidate` from its attempts on every base SHA; order of `attempts` is free."""
    window = timedelta(hours=cooldown_hours)
    verified, unverified = _latest_in_window(attempts, candidate, now - window)
    note = _unread_note(unverified, newer_than=verified)
    if verified is None:
        if note:
            return CooldownState(True, None, note, unverified)
        return CooldownState(True, None, f"no attempt in the last {cooldown_hours} h", None)
    if verified.outcome in RETRY_NEXT_WAVE_OUTCOMES:
        reason = f"last attempt {_describe(verified)}: no cooldown after a capacity deferral"
        return CooldownState(True, None, _join(reason, note), verified)
    until = verified.completed_at + window
    if retry_approved:
        reason = f"cooldown cleared by /klaud retry (last attempt {_describe(verified)})"
        return CooldownState(True, None, reason, verified)
    reason = f"cooling down until {human_time(until)}: last attempt {_describe(verified)}"
    return CooldownState(False, until, reason, verified)


def _latest_in_window(
    attempts: Iterable[Attempt], candidate: str, cutoff: datetime
) -> tuple[Attempt | None, Attempt | None]:
    """The latest verified and the latest unverified attempt that completed after `cutoff`.

    The planner asks this for every family of a wave and most stored attempts are older
    than the window, so the cheapest test runs first, over all of them, in a comprehension.
    """
    verified: Attempt | None = None
    unverified: Attempt | None = None
    for attempt in [attempt for attempt in attempts if attempt.completed_at > cutoff]:
        if attempt.verified:
            if _replaces(attempt, verified, candidate):
                verified = attempt
        elif _replaces(attempt, unverified, candidate):
            unverified = attempt
    return verified, unverified


def _replaces(attempt: Attempt, best: Attempt | None, candidate: str) -> bool:
    # The candidate is checked last: only an attempt that would win needs the comparison.
    return (best is None or _later(attempt, best)) and attempt.candidate == candidate


def _later(attempt: Attempt, than: Attempt) -> bool:
    # Run id and attempt break ties so the same attempts always give the same answer.
    if attempt.completed_at != than.completed_at:
        return attempt.completed_at > than.completed_at
    return (attempt.run_id, attempt.run_attempt) > (than.run_id, than.run_attempt)


def _unread_note(unverified: Attempt | None, *, newer_than: Attempt | None) -> str:
    if unverified is None or (newer_than is not None and not _later(unverified, newer_than)):
        return ""
    error = unverified.error or "unreadable"
    return f"last attempt's outcome could not be read ({error}); not treated as a failure"


def _describe(attempt: Attempt) -> str:
    return f"{attempt.outcome} (run {attempt.run_id})"


def _join(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def human_time(moment: datetime) -> str:
    """Minute-precision UTC time for reasons people read ("2026-11-30 14:05 UTC")."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
