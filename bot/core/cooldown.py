"""Cooldown: may a candidate be tried again now? (DESIGN §4 "Cooldown", domain §4.2).

Only *verified* outcomes count. An attempt whose artifact could not be read is a distinct
state, never a failure: treating it as one would park a healthy candidate for a day because
an artifact expired or a download timed out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from bot.core.domain import RETRY_NEXT_WAVE_OUTCOMES, Attempt, code_span
from bot.core.outcomes import NO_OUTCOME

# Runs in a row that must end without an outcome (NO_OUTCOME) for the candidate to cool down.
RUN_FAILURES_TO_COOL = 2
# How far back Klaud keeps attempts in memory (and loads them at a restart): cooldowns look
# back at most 168 hours, artifacts live 14 days; older attempts stay in the store only.
ATTEMPT_MEMORY = timedelta(days=14)


@dataclass(frozen=True, slots=True)
class CooldownState:
    eligible: bool
    until: datetime | None  # set only while a cooldown is active
    reason: str
    attempt: Attempt | None  # the attempt that decided, when one did


def began_after(cool: CooldownState, moment: datetime | None) -> bool:
    """Whether the cooldown `cool` describes was decided by an attempt completed after
    `moment` (when someone asked to clear a cooldown: not the one they saw)."""
    return moment is not None and not cool.eligible and cool.attempt is not None and cool.attempt.completed_at > moment


def cooldown(
    attempts: Sequence[Attempt],
    candidate: str,
    now: datetime,
    cooldown_hours: int,
    retry_approved_at: datetime | None,
) -> CooldownState:
    """Classify `candidate` from its attempts on every base SHA; order of `attempts` is free.
    A `/klaud retry` approved at `retry_approved_at` clears the cooldown it saw: one decided
    by an attempt completed by then, not one a later attempt began."""
    window = timedelta(hours=cooldown_hours)
    repeated = _repeated_run_failure(attempts, candidate, now - window, window)
    if repeated is not None:
        until = repeated.completed_at + window
        what = f"the last {RUN_FAILURES_TO_COOL} runs {_no_outcome(repeated)}"
        if _cleared(retry_approved_at, repeated):
            return CooldownState(True, None, f"cooldown cleared by /klaud retry ({what})", repeated)
        return CooldownState(False, until, f"cooling down until {human_time(until)}: {what}", repeated)
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
    if _cleared(retry_approved_at, verified):
        reason = f"cooldown cleared by /klaud retry (last attempt {_describe(verified)})"
        return CooldownState(True, None, reason, verified)
    reason = f"cooling down until {human_time(until)}: last attempt {_describe(verified)}"
    return CooldownState(False, until, reason, verified)


def _cleared(approved_at: datetime | None, deciding: Attempt) -> bool:
    return approved_at is not None and deciding.completed_at <= approved_at


def _repeated_run_failure(
    attempts: Iterable[Attempt], candidate: str, cutoff: datetime, window: timedelta
) -> Attempt | None:
    """The newest attempt, completed after `cutoff`, when it and the one before it both ended
    without an outcome through the run's own doing (NO_OUTCOME: failed before one, finished
    without the artifact, or left one that cannot be read): two in a row, days apart as well
    (capacity may keep a candidate waiting between them), and the cooldown runs `window` from
    the second. Days, not any time: the first must stay in memory (ATTEMPT_MEMORY) until the
    cooldown ends, or a restart, or the trimming of old attempts, would end it early and the
    planner and `/klaud status` would disagree meanwhile.

    One such run may be bad luck (a runner lost), so the candidate stays eligible; the same
    twice in a row is what a broken workflow looks like, wave after wave. An artifact that
    expired or could not be downloaded says nothing of the run and breaks the sequence.
    """
    newest = sorted(
        (a for a in attempts if a.candidate == candidate),
        key=lambda a: (a.completed_at, a.run_id, a.run_attempt),
        reverse=True,
    )[:RUN_FAILURES_TO_COOL]
    if (
        len(newest) == RUN_FAILURES_TO_COOL
        and all(a.error in NO_OUTCOME for a in newest)
        and newest[0].completed_at > cutoff
        and newest[0].completed_at - newest[-1].completed_at <= ATTEMPT_MEMORY - window
    ):
        return newest[0]
    return None


def _no_outcome(attempt: Attempt) -> str:
    """What the newest of runs ending without an outcome did, for a reason people read."""
    if attempt.error == "run-failed":
        return f"failed before an outcome ({_where_failed(attempt)})"
    return f"left no readable outcome ({attempt.error}, run {attempt.run_id})"


def _where_failed(attempt: Attempt) -> str:
    # Names a workflow gives: code spans, for the Markdown of check runs and the dashboard.
    job = f"job {code_span(attempt.failed_job)}" if attempt.failed_job else "an unknown job"
    step = f", step {code_span(attempt.failed_step)}" if attempt.failed_step else ""
    return f"last in {job}{step}, run {attempt.run_id}"


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
    if unverified.error in NO_OUTCOME:
        return f"last run {_no_outcome(unverified)}; once is not a cooldown"
    error = unverified.error or "unreadable"
    return f"last attempt's outcome could not be read ({error}); not treated as a failure"


def _describe(attempt: Attempt) -> str:
    return f"{attempt.outcome} (run {attempt.run_id})"


def _join(*parts: str) -> str:
    return "; ".join(part for part in parts if part)


def human_time(moment: datetime) -> str:
    """Minute-precision UTC time for reasons people read ("2026-11-30 14:05 UTC")."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")
