"""Lost claims, failed dispatches and the dispatch pause (bot/core/dispatching.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from bot.core.dispatching import (
    WaveRuns,
    claim_lost,
    count_finished,
    dispatch_failed,
    pause_reason,
    retry_soon,
    settle,
)
from bot.core.domain import Attempt, Decision, Wave

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
CAND = "d92e15065c55779d-555679de269db36f"


def decision(family: str, kind: str = "selected") -> Decision:
    return Decision(family, CAND, kind, "free")  # type: ignore[arg-type]


def ended(error: str | None, job: str | None = None, step: str | None = None, outcome: str | None = None) -> Attempt:
    return Attempt(
        candidate=CAND, family=None, run_id=1, run_attempt=1, base=None, completed_at=NOW,
        verified=outcome is not None, outcome=outcome, phase=None, pull_request=None,  # type: ignore[arg-type]
        reason_code=None, error=error, failed_job=job, failed_step=step,
    )


def test_a_lost_claim_and_a_failed_dispatch_say_what_happened() -> None:
    assert claim_lost(decision("f")).decision == "claimed"
    failed = dispatch_failed(decision("f"), "502: Bad Gateway")
    assert failed.decision == "dispatch-failed" and "502: Bad Gateway" in failed.reason


def test_settle_replaces_only_the_overridden_decisions() -> None:
    wave = Wave("o/r", NOW, "b" * 40, 1, (decision("a"), decision("b")))
    settled = settle(wave, {"b": claim_lost(decision("b"))})
    assert [d.decision for d in settled.decisions] == ["selected", "claimed"]


def test_a_wave_whose_every_dispatch_failed_is_retried_soon() -> None:
    failed = dispatch_failed(decision("a"), "500")
    assert retry_soon(Wave("o/r", NOW, "", 1, (failed, decision("b", "cap"))))
    assert not retry_soon(Wave("o/r", NOW, "", 1, (failed, decision("b"))))  # one got through
    assert not retry_soon(Wave("o/r", NOW, "", 1, (decision("b", "cap"),)))  # nothing tried


def test_three_runs_failing_in_one_job_pause_dispatch() -> None:
    runs = WaveRuns(dispatched=5)
    for _ in range(2):
        count_finished(runs, ended("run-failed", "get-jobs", "Validate matrix"))
    assert pause_reason(7, runs) is None  # two are not enough
    count_finished(runs, ended("run-failed", "get-jobs"))
    reason = pause_reason(7, runs)
    assert reason is not None
    assert "3 of the 3 finished runs of wave 7" in reason and "job `get-jobs`, step `Validate matrix`" in reason


def test_a_failing_job_must_be_at_least_half_of_the_finished_runs() -> None:
    runs = WaveRuns(dispatched=10)
    for _ in range(3):
        count_finished(runs, ended("run-failed", "get-jobs"))
    for _ in range(4):
        count_finished(runs, ended(None, outcome="validated"))
    assert pause_reason(7, runs) is None  # 3 of 7
    runs_split = WaveRuns(dispatched=6)
    for job in ("a", "a", "b", "b", "c", "c"):
        count_finished(runs_split, ended("run-failed", job))
    assert pause_reason(7, runs_split) is None  # no single job failed three times


def test_a_job_failing_exactly_half_of_the_finished_runs_pauses_dispatch() -> None:
    # DESIGN §4: at least 3 of them *and at least half* of that wave's finished dispatches.
    runs = WaveRuns(dispatched=6)
    for _ in range(3):
        count_finished(runs, ended("run-failed", "get-jobs"))
    for _ in range(3):
        count_finished(runs, ended(None, outcome="validated"))
    reason = pause_reason(7, runs)
    assert reason is not None and "3 of the 6 finished runs of wave 7" in reason


def test_a_job_and_step_named_by_a_workflow_are_code_spans_in_the_pause_reason() -> None:
    # Shown in the Markdown of check runs and the dashboard: a job named after a team would
    # mention it, and stars would italicise.
    runs = WaveRuns(dispatched=3)
    for _ in range(3):
        count_finished(runs, ended("run-failed", "@acme/infra *matrix*", "Run `make`"))
    reason = pause_reason(1, runs)
    assert reason is not None and "job `@acme/infra *matrix*`, step `` Run `make` ``" in reason
