"""Cooldown classification (DESIGN §4 "Cooldown", domain §4.2)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from bot.core.cooldown import cooldown
from bot.core.domain import Attempt

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
CANDIDATE = "d92e15065c55779d-555679de269db36f"
OTHER = "0a1b2c3d4e5f6071-8899aabbccddeeff"


def attempt(
    outcome: str | None,
    hours_ago: float,
    *,
    run_id: int = 101,
    candidate: str = CANDIDATE,
    base: str = "a" * 40,
    error: str | None = None,
) -> Attempt:
    return Attempt(
        candidate=candidate,
        family="configs/nvidia-master.yaml:dsr1-fp4-b200-sglang",
        run_id=run_id,
        run_attempt=1,
        base=base,
        completed_at=NOW - timedelta(hours=hours_ago),
        verified=outcome is not None,
        outcome=outcome,  # type: ignore[arg-type]
        phase="targeted" if outcome else None,
        pull_request=None,
        reason_code=None,
        error=error,
    )


def check(attempts: list[Attempt], *, retry: bool = False, hours: int = 24):
    """The candidate's cooldown now; `retry`: approved now, after every attempt."""
    return cooldown(attempts, CANDIDATE, NOW, hours, NOW if retry else None)


def test_no_attempt_is_eligible() -> None:
    state = check([])
    assert state.eligible and state.until is None and state.attempt is None
    assert state.reason == "no attempt in the last 24 h"


def test_readiness_blocked_cools_down_for_the_window_with_a_readable_reason() -> None:
    # completed at 14:05 the day before
    blocked = attempt("readiness-blocked", hours_ago=17 + 55 / 60)
    state = check([blocked])
    assert not state.eligible
    assert state.until == datetime(2026, 11, 30, 14, 5, tzinfo=UTC)
    assert state.reason == (
        "cooling down until 2026-11-30 14:05 UTC: last attempt readiness-blocked (run 101)"
    )
    assert state.attempt is blocked


def test_cooldown_spans_every_base_sha() -> None:
    # The previous planner only looked at runs on the current base; a new commit on main
    # must not reset the cooldown.
    old_base = attempt("readiness-blocked", hours_ago=3, base="1" * 40)
    assert not check([old_base]).eligible


def test_unexpected_error_is_a_verified_outcome_and_cools_down() -> None:
    state = check([attempt("unexpected-error", hours_ago=1)])
    assert not state.eligible
    assert state.until == NOW + timedelta(hours=23)


def test_capacity_deferred_retries_next_wave() -> None:
    state = check([attempt("capacity-deferred", hours_ago=2)])
    assert state.eligible and state.until is None
    assert "capacity-deferred (run 101)" in state.reason


def test_only_the_latest_verified_attempt_counts_whatever_the_order() -> None:
    failed = attempt("failed", hours_ago=10, run_id=1)
    deferred = attempt("capacity-deferred", hours_ago=2, run_id=2)
    for order in ([failed, deferred], [deferred, failed]):
        state = check(order)
        assert state.eligible and state.attempt is deferred
    newer_failure = attempt("failed", hours_ago=1, run_id=3)
    for order in ([deferred, newer_failure], [newer_failure, deferred]):
        assert check(order).attempt is newer_failure


def test_attempts_completed_at_the_same_instant_break_ties_by_run() -> None:
    first = attempt("failed", hours_ago=1, run_id=7)
    second = attempt("capacity-deferred", hours_ago=1, run_id=8)
    assert check([first, second]).attempt is second
    assert check([second, first]).attempt is second


def test_window_ends_exactly_cooldown_hours_after_completion() -> None:
    assert check([attempt("failed", hours_ago=24)]).eligible
    assert not check([attempt("failed", hours_ago=23.99)]).eligible
    assert check([attempt("failed", hours_ago=5)], hours=4).eligible


def test_unverified_attempt_never_blocks_and_is_noted() -> None:
    unread = attempt(None, hours_ago=1, error="artifact-expired")
    state = check([unread])
    assert state.eligible and state.until is None
    assert state.reason == (
        "last attempt's outcome could not be read (artifact-expired); not treated as a failure"
    )
    assert state.attempt is unread


def test_unverified_attempt_does_not_hide_an_earlier_verified_failure() -> None:
    failed = attempt("failed", hours_ago=5, run_id=1)
    unread = attempt(None, hours_ago=1, run_id=2, error="network-error")
    state = check([unread, failed])
    assert not state.eligible and state.attempt is failed


def test_newer_unverified_attempt_is_noted_beside_a_capacity_deferral() -> None:
    deferred = attempt("capacity-deferred", hours_ago=5, run_id=1)
    unread = attempt(None, hours_ago=1, run_id=2, error="invalid-json")
    state = check([deferred, unread])
    assert state.eligible
    assert "last run left no readable outcome (invalid-json, run 2); once is not a cooldown" in state.reason


def test_retry_approval_clears_an_active_cooldown() -> None:
    failed = attempt("failed", hours_ago=1)
    state = check([failed], retry=True)
    assert state.eligible and state.until is None
    assert state.reason.startswith("cooldown cleared by /klaud retry")
    assert state.attempt is failed


def test_a_retry_approved_before_the_attempt_that_decides_does_not_clear_its_cooldown() -> None:
    # What this catches (a chaos soak): an approval stored for one cooldown (a box ticked
    # late) cleared the next one, begun by a run that failed after it: the family was
    # dispatched again through a cooldown after a real failure.
    failed = attempt("failed", hours_ago=1)
    before = cooldown([failed], CANDIDATE, NOW, 24, NOW - timedelta(hours=2))
    assert not before.eligible and before.reason.startswith("cooling down")
    assert cooldown([failed], CANDIDATE, NOW, 24, NOW - timedelta(hours=1)).eligible  # approved as it completed
    repeated = [run_failed(3, 301), run_failed(1, 302)]
    assert not cooldown(repeated, CANDIDATE, NOW, 24, NOW - timedelta(hours=2)).eligible


def test_attempts_of_other_candidates_are_ignored() -> None:
    assert check([attempt("failed", hours_ago=1, candidate=OTHER)]).eligible


@pytest.mark.parametrize("outcome", ["validated", "incompatible", "uncertain", "handoff"])
def test_every_other_verified_outcome_cools_down(outcome: str) -> None:
    assert not check([attempt(outcome, hours_ago=1)]).eligible


# --- failures before an outcome -------------------------------------------------------


def run_failed(hours_ago: float, run_id: int) -> Attempt:
    return replace(
        attempt(None, hours_ago, run_id=run_id, error="run-failed"),
        failed_job="get-jobs",
        failed_step="Validate matrix",
    )


def test_one_run_failing_before_an_outcome_leaves_the_candidate_eligible() -> None:
    state = check([run_failed(1, 301)])
    assert state.eligible
    assert "failed before an outcome" in state.reason and "job `get-jobs`, step `Validate matrix`" in state.reason


def test_two_runs_in_a_row_failing_before_an_outcome_cool_down_naming_job_and_step() -> None:
    state = check([run_failed(3, 301), run_failed(1, 302)])
    assert not state.eligible
    assert state.until == NOW - timedelta(hours=1) + timedelta(hours=24)
    assert "the last 2 runs failed before an outcome" in state.reason
    assert "job `get-jobs`, step `Validate matrix`, run 302" in state.reason


def test_an_outcome_between_two_run_failures_breaks_the_row() -> None:
    state = check([run_failed(5, 301), attempt("capacity-deferred", 3, run_id=302), run_failed(1, 303)])
    assert state.eligible


@pytest.mark.parametrize("error", ["artifact-missing", "invalid-json", "outcome-invalid", "not-a-zip"])
def test_two_runs_in_a_row_leaving_no_readable_outcome_cool_down(error: str) -> None:
    # What this catches (a review on the real configs): a run that finished without its
    # artifact, or left one that cannot be read, left the candidate eligible, so a broken
    # diagnostics step had it dispatched again every wave.
    first, second = attempt(None, 3, run_id=301, error=error), attempt(None, 1, run_id=302, error=error)
    assert check([first]).eligible
    state = check([first, second])
    assert not state.eligible and state.until == NOW - timedelta(hours=1) + timedelta(hours=24)
    assert f"the last 2 runs left no readable outcome ({error}, run 302)" in state.reason
    assert not check([run_failed(3, 301), second]).eligible  # any two of them in a row


@pytest.mark.parametrize("error", ["artifact-expired", "download-failed", "download-refused", "artifact-not-found"])
def test_a_download_that_failed_says_nothing_of_the_run_and_breaks_the_row(error: str) -> None:
    unread = attempt(None, 2, run_id=302, error=error)
    assert check([run_failed(3, 301), unread, attempt(None, 1, run_id=303, error="invalid-json")]).eligible
    assert check([attempt(None, 3, run_id=301, error=error), unread]).eligible


def test_retry_clears_a_run_failure_cooldown() -> None:
    state = check([run_failed(3, 301), run_failed(1, 302)], retry=True)
    assert state.eligible and "cleared by /klaud retry" in state.reason


def test_the_latest_verified_attempt_is_the_last_completed_not_the_highest_run_id() -> None:
    # DESIGN §4 "Cooldown": the latest verified attempt *that completed* decides. A run that
    # started first (lower id) can finish last, e.g. a long targeted phase.
    slow_failure = attempt("failed", hours_ago=1, run_id=100)
    quick_deferral = attempt("capacity-deferred", hours_ago=3, run_id=101)
    for order in ([slow_failure, quick_deferral], [quick_deferral, slow_failure]):
        state = check(order)
        assert not state.eligible and state.attempt is slow_failure
    # and the same order decides whether an unread attempt is newer than the verified one
    unread = attempt(None, hours_ago=2, run_id=99, error="download-failed")
    deferred = attempt("capacity-deferred", hours_ago=3, run_id=101)
    assert "could not be read (download-failed)" in check([deferred, unread]).reason


def test_two_run_failures_in_a_row_cool_down_even_when_the_first_left_the_window() -> None:
    # DESIGN §4 "Failures before an outcome": two in a row put the candidate in cooldown
    # for cooldown_hours (from the second); the first may be older than the window.
    first, second = run_failed(25, 301), run_failed(2, 302)
    state = check([first, second])
    assert not state.eligible
    assert state.until == NOW - timedelta(hours=2) + timedelta(hours=24)


def test_two_run_failures_in_a_row_cool_down_days_apart_while_memory_keeps_the_first() -> None:
    # Capacity kept the candidate waiting for days after the first: still two in a row, as
    # long as the first stays remembered until the cooldown ends (13 days apart at most here).
    state = check([run_failed(24 * 5, 301), run_failed(2, 302)])
    assert not state.eligible and state.until == NOW - timedelta(hours=2) + timedelta(hours=24)
    assert not check([run_failed(2 + 24 * 13, 301), run_failed(2, 302)]).eligible
    assert check([run_failed(2.01 + 24 * 13, 301), run_failed(2, 302)]).eligible


def test_a_run_failure_cooldown_ends_exactly_cooldown_hours_after_the_second_failure() -> None:
    # Same boundary as a verified outcome's cooldown (test_window_ends_exactly_…).
    assert check([run_failed(30, 301), run_failed(24, 302)]).eligible
    assert not check([run_failed(30, 301), run_failed(23.99, 302)]).eligible
