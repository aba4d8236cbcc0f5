"""What a wave's decisions become when claiming or dispatching a selected candidate fails,
and when a repository's dispatch pauses (DESIGN §4 "A wave", "Failures before an outcome").

The planner decides from local state; the claim ref on GitHub is the lock that settles a
race between waves, and the dispatch can fail. These rules turn what GitHub answered into
the decisions the stored wave document shows, so the document says what really happened.
When the runs of one wave keep failing in the same job before any outcome (a broken
workflow or matrix schema), dispatching more of them only burns runners: the repository
pauses until a push or `/klaud resume` arms a one-candidate canary.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TypedDict

from bot.core.domain import Attempt, Blocked, Decision, Wave, code_span

CLAIM_LOST_REASON = "another wave claimed this family first"
# A pause needs this many runs of one wave failing in the same job …
PAUSE_MIN_FAILED_RUNS = 3
# … and at least this share of that wave's finished dispatches.
PAUSE_MIN_SHARE = 0.5


def claim_lost(decision: Decision) -> Decision:
    """Another wave created the family's claim ref first: the family is `claimed`."""
    return replace(decision, decision="claimed", reason=CLAIM_LOST_REASON)


def dispatch_failed(decision: Decision, error: str) -> Decision:
    """The dispatch failed; its claim was released and the next family takes the slot."""
    reason = f"dispatch failed ({error}); claim released, the next wave tries again"
    return replace(decision, decision="dispatch-failed", reason=reason)


def claim_refused(decision: Decision, error: str) -> Decision:
    """GitHub refused the family's claim ref: nothing was claimed nor dispatched."""
    reason = f"claim refused ({error}); not dispatched, the next wave tries again"
    return replace(decision, decision="dispatch-failed", reason=reason)


def not_tried(decision: Decision, error: str) -> Decision:
    """GitHub refused the wave's claim or dispatch of another family for the whole repository
    (archived, the App's access withdrawn or suspended, a ruleset, the workflow gone): this
    one is not tried in the same wave."""
    reason = f"not tried: GitHub refused this wave for the whole repository ({error}); the next wave tries again"
    return replace(decision, decision="dispatch-failed", reason=reason)


def answer_lost(decision: Decision, error: str) -> Decision:
    """GitHub may have started the run though its answer was lost: still selected, in flight."""
    reason = f"{decision.reason}; the dispatch's answer was lost ({error}): its run is looked up by title"
    return replace(decision, reason=reason)


def dry_run(decision: Decision, workflow: str) -> Decision:
    return replace(decision, reason=f"{decision.reason} (dry run: would claim the family and dispatch {workflow})")


DISABLED_REASON = "disabled by .github/klaud.yml (enabled: false): no wave runs"


def disabled(wave: Wave, blocked: Blocked) -> Wave:
    """The plan of a repository whose policy turns Klaud off (`blocked`, dated when that was
    first seen): no wave runs, so what would be selected is shown paused and the plan says
    why (a preview that selected families would promise dispatches that never come)."""
    decisions = tuple(
        replace(d, decision="paused", reason=DISABLED_REASON) if d.decision == "selected" else d
        for d in wave.decisions
    )
    return replace(wave, decisions=decisions, blocked=blocked)


def disabled_block(now: datetime) -> Blocked:
    """What blocks a repository whose policy turns Klaud off."""
    return Blocked("dispatch-paused", DISABLED_REASON, now)


def settle(wave: Wave, overrides: Mapping[str, Decision]) -> Wave:
    """The wave as it happened, with the decisions GitHub's answers changed."""
    return replace(wave, decisions=tuple(overrides.get(d.family, d) for d in wave.decisions))


def retry_soon(wave: Wave) -> bool:
    """Every dispatch the wave tried failed: GitHub was unwell, try the wave again soon."""
    kinds = {d.decision for d in wave.decisions}
    return "dispatch-failed" in kinds and "selected" not in kinds


# ---------------------------------------------------------------------------------------
# Pausing dispatch after failures before an outcome


@dataclass
class WaveRuns:
    """How the runs a wave dispatched ended so far (kept per wave, for the pause rule)."""

    dispatched: int
    finished: int = 0
    failed_jobs: dict[str, int] = field(default_factory=dict)  # job -> runs that failed in it
    failed_steps: dict[str, str] = field(default_factory=dict)  # job -> a step that failed

    def document(self) -> WaveRunsDocument:
        return {
            "dispatched": self.dispatched,
            "finished": self.finished,
            "failed_jobs": dict(self.failed_jobs),
            "failed_steps": dict(self.failed_steps),
        }


class WaveRunsDocument(TypedDict):
    """`WaveRuns` as the repository's record keeps it (every key required when read)."""

    dispatched: int
    finished: int
    failed_jobs: dict[str, int]
    failed_steps: dict[str, str]


class PauseDocument(TypedDict):
    """A dispatch pause as the repository's record keeps it (both keys required when read)."""

    reason: str
    since: str


def count_finished(runs: WaveRuns, attempt: Attempt) -> None:
    """A dispatched run of the wave ended with `attempt`."""
    runs.finished += 1
    count_failure(runs, attempt)


def count_failure(runs: WaveRuns, attempt: Attempt) -> bool:
    """Count `attempt` among the wave's failed runs when its run failed before an outcome, or
    its outcome is the workflow's fallback for one; whether it did."""
    if attempt.error != "run-failed" and attempt.failed_job is None:
        return False
    job = attempt.failed_job or "an unknown job"
    runs.failed_jobs[job] = runs.failed_jobs.get(job, 0) + 1
    if attempt.failed_step:
        runs.failed_steps.setdefault(job, attempt.failed_step)
    return True


def pause_reason(wave: int, runs: WaveRuns) -> str | None:
    """Why dispatch must pause after wave `wave`'s runs, or None while it may go on."""
    for job, count in sorted(runs.failed_jobs.items(), key=lambda item: (-item[1], item[0])):
        if count >= PAUSE_MIN_FAILED_RUNS and count >= runs.finished * PAUSE_MIN_SHARE:
            step = runs.failed_steps.get(job)
            where = f"job {code_span(job)}" + (f", step {code_span(step)}" if step else "")
            return (
                f"dispatch paused: {count} of the {runs.finished} finished runs of wave {wave} failed "
                f"before an outcome in {where}; fix the workflow and push, or comment /klaud resume"
            )
    return None
