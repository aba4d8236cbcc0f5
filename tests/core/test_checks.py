"""The `Klaud Cold` check run: rendering (bot/core/checks.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import get_args

import pytest

from bot.core.checks import (
    CHECK_NAME,
    SUMMARY_LIMIT,
    CheckView,
    render_check,
)
from bot.core.commands import VERBS, help_text
from bot.core.cooldown import cooldown
from bot.core.domain import NEUTRAL_OUTCOMES, Attempt, Family, Hold, Outcome, Overlap

FAMILY_ID = "configs/nvidia-master.yaml:dsr1-fp4-b200-sglang"
AT = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
FAMILY = Family(
    id=FAMILY_ID,
    path="configs/nvidia-master.yaml",
    key="dsr1-fp4-b200-sglang",
    image="lmsysorg/sglang:v0.5.5",
    runner="b200",
    clusters=("b200-nscale",),
    model_prefix="dsr1",
    precision="fp4",
    framework="sglang",
    line_start=1,
    line_end=20,
)


def attempt(run_id: int, outcome: str | None, minutes_ago: int = 0, **changes: object) -> Attempt:
    values: dict[str, object] = {
        "candidate": FAMILY.candidate,
        "family": FAMILY_ID,
        "run_id": run_id,
        "run_attempt": 2,
        "base": "b" * 40,
        "completed_at": AT - timedelta(minutes=minutes_ago),
        "verified": outcome is not None,
        "outcome": outcome,
        "phase": "targeted",
        "pull_request": None,
        "reason_code": None,
        "error": None if outcome is not None else "artifact-expired",
    }
    values.update(changes)
    return Attempt(**values)  # type: ignore[arg-type]


def view(**changes: object) -> CheckView:
    values: dict[str, object] = {
        "repo": "acme/bench",
        "family": FAMILY,
        "candidate": FAMILY.candidate,
        "image": FAMILY.image,
        "attempts": [],
        "cooldown_reason": "eligible: no verified attempt",
        "cooldown_until": None,
        "overlaps": [],
        "hold": None,
        "in_flight": False,
        "policy_error": None,
    }
    values.update(changes)
    return CheckView(**values)  # type: ignore[arg-type]


# ------------------------------------------------------------------------- rendering


@pytest.mark.parametrize("outcome", get_args(Outcome))
def test_conclusion_follows_latest_verified_outcome(outcome: str) -> None:
    out = render_check(view(attempts=[attempt(1, outcome)]))
    if outcome == "validated":
        expected = "success"
    elif outcome in NEUTRAL_OUTCOMES:
        expected = "neutral"
    else:
        expected = "failure"
    assert (out.status, out.conclusion) == ("completed", expected)
    assert out.title == f"Latest attempt: {outcome}"


def test_newest_verified_attempt_decides_even_if_given_out_of_order() -> None:
    attempts = [attempt(1, "failed", minutes_ago=60), attempt(2, "validated", minutes_ago=5)]
    assert render_check(view(attempts=attempts)).conclusion == "success"


def test_unverified_newer_attempt_does_not_override_verified_one() -> None:
    attempts = [attempt(3, None, minutes_ago=1), attempt(2, "failed", minutes_ago=60)]
    assert render_check(view(attempts=attempts)).conclusion == "failure"


def run_failed(run_id: int, minutes_ago: int) -> Attempt:
    return attempt(run_id, None, minutes_ago, error="run-failed", source="run", failed_job="get-jobs", failed_step="matrix")


def test_runs_failed_after_an_outcome_are_the_latest_attempt_and_their_cooldown_decides() -> None:
    # What this catches (review H): the title named the latest *verified* attempt. A
    # candidate deferred for capacity whose next two runs failed before an outcome cools
    # down for those runs, and its check said "Latest attempt: capacity-deferred", neutral.
    deferred = attempt(1, "capacity-deferred", minutes_ago=600)
    attempts = [run_failed(3, 120), run_failed(2, 360), deferred]
    cool = cooldown(attempts, FAMILY.candidate, AT, 24, None)
    assert not cool.eligible and cool.attempt == attempts[0]
    out = render_check(view(attempts=attempts, cooldown_reason=cool.reason, cooldown_until=cool.until, cooled_by=cool.attempt))
    assert (out.status, out.conclusion) == ("completed", "failure")
    assert out.title == "Latest attempt: unverified (run-failed) · cooling down"


def test_one_run_failed_after_an_outcome_is_the_latest_attempt_and_the_outcome_still_decides() -> None:
    # Once is not a cooldown: the capacity deferral before it still says what the candidate is.
    attempts = [run_failed(2, 120), attempt(1, "capacity-deferred", minutes_ago=600)]
    out = render_check(view(attempts=attempts))
    assert (out.conclusion, out.title) == ("neutral", "Latest attempt: unverified (run-failed)")


def test_in_flight_is_in_progress_without_conclusion() -> None:
    out = render_check(view(in_flight=True, attempts=[attempt(1, "failed")]))
    assert (out.status, out.conclusion) == ("in_progress", None)
    assert "conclusion" not in out.payload()


def test_no_attempts_and_not_in_flight_is_neutral_waiting() -> None:
    out = render_check(view())
    assert (out.status, out.conclusion, out.title) == ("completed", "neutral", "Waiting for a wave")
    assert "No attempts yet." in out.summary


def test_only_unverified_attempts_is_neutral_with_the_error() -> None:
    out = render_check(view(attempts=[attempt(1, None)]))
    assert (out.status, out.conclusion) == ("completed", "neutral")
    assert "artifact-expired" in out.title


def test_payload_shape() -> None:
    out = render_check(view(attempts=[attempt(1, "validated")]))
    body = out.payload("c" * 40)
    assert body == {
        "name": CHECK_NAME,
        "head_sha": "c" * 40,
        "status": "completed",
        "conclusion": "success",
        "output": {"title": out.title, "summary": out.summary},
    }
    assert "head_sha" not in out.payload()


def test_summary_content() -> None:
    out = render_check(
        view(
            attempts=[
                attempt(77, "readiness-blocked", pull_request=4012, reason_code="baseline-other")
            ],
            cooldown_reason="cooling down: last attempt readiness-blocked",
            cooldown_until=AT + timedelta(hours=24),
            overlaps=[Overlap(4013, "image", "PR #4013 changes this family's image line")],
        ),
        web_url="https://ghe.example.com/",
    )
    summary = out.summary
    assert f"`{FAMILY_ID}`" in summary
    assert f"`{FAMILY.candidate}`" in summary
    assert f"`{FAMILY.image}`" in summary
    run_url = "https://ghe.example.com/acme/bench/actions/runs/77/attempts/2"
    assert f"[77 / attempt 2]({run_url})" in summary
    assert "[#4012](https://ghe.example.com/acme/bench/pull/4012)" in summary
    assert "baseline-other" in summary
    assert "(until 2026-12-01 08:00 UTC)" in summary
    assert "- [#4013](https://ghe.example.com/acme/bench/pull/4013) (image): PR #4013" in summary
    for verb in VERBS.values():
        assert verb.usage in summary
    assert "Invalid" not in summary


def test_hold_shown_in_title_and_summary() -> None:
    out = render_check(view(hold=Hold(FAMILY_ID, "alice", "new weights", AT)))
    assert out.title.endswith("· held")
    assert "**alice**" in out.summary and "`new weights`" in out.summary


def test_vanished_family_is_explained() -> None:
    out = render_check(view(family=None, image=None))
    assert "no longer matches a family" in out.summary
    assert "| Image | unknown |" in out.summary and "| Image changed | unknown |" in out.summary


def test_the_image_age_shows_as_when_the_image_last_changed() -> None:
    changed = replace(FAMILY, image_changed_at=AT - timedelta(days=40))
    out = render_check(view(family=changed))
    assert "| Image changed | 2026-10-21 08:00 UTC |" in out.summary


def test_policy_error_is_a_visible_warning() -> None:
    error = ".github/klaud.yml: cooldown_hours: Input should be greater than or equal to 1"
    out = render_check(view(policy_error=error))
    assert out.summary.startswith("### ⚠️ Invalid `.github/klaud.yml`")
    assert error in out.summary
    assert "invalid .github/klaud.yml" in out.title


def test_configuration_errors_are_a_visible_warning_with_the_first_ten_listed() -> None:
    # A push that breaks a config re-renders every check run; nothing on it showed why.
    runners = "\n".join(f"runner b200-cw_{n:02d} (label b200) resolves to no declared cluster" for n in range(12))
    out = render_check(view(config_errors={"configs/runners.yaml": runners}))
    assert out.summary.startswith("### ⚠️ Configuration errors")
    assert "- `configs/runners.yaml`: runner b200-cw_00 (label b200) resolves to no declared cluster" in out.summary
    assert "b200-cw_09" in out.summary and "b200-cw_10" not in out.summary
    assert "- … and 2 more on the status page" in out.summary
    assert "Configuration errors" not in render_check(view()).summary


def test_many_attempts_are_truncated_newest_first_under_the_limit() -> None:
    attempts = [attempt(n, "failed", minutes_ago=n) for n in range(1, 2001)]
    out = render_check(view(attempts=attempts))
    assert len(out.summary.encode("utf-8")) <= SUMMARY_LIMIT
    assert "/runs/1/attempts/2" in out.summary  # the newest row survives
    assert "/runs/2000/attempts/2" not in out.summary
    assert "older attempts not shown (summary size limit)" in out.summary
    assert len(out.summary.encode("utf-8")) > SUMMARY_LIMIT - 500  # only what had to go went
    assert out.summary.endswith(help_text())  # the commands section is kept


def test_few_attempts_are_not_truncated() -> None:
    attempts = [attempt(n, "failed", minutes_ago=n) for n in range(1, 6)]
    out = render_check(view(attempts=attempts))
    assert out.summary.count("| **failed** |") == 5
    assert "not shown" not in out.summary


def test_oversized_parts_are_clipped_safely() -> None:
    overlaps = [Overlap(n, "flags", "é" * 100) for n in range(1, 1000)]
    out = render_check(view(overlaps=overlaps))
    assert len(out.summary.encode("utf-8")) <= SUMMARY_LIMIT
    assert out.summary.endswith("(summary truncated)")


def test_a_candidate_for_an_earlier_image_does_not_show_the_familys_new_image_as_its_own() -> None:
    # The family's image moved on since the PR's branch was made for its candidate.
    earlier = dataclasses.replace(FAMILY, image="lmsysorg/sglang:v0.5.1").candidate
    out = render_check(view(candidate=earlier))
    assert f"| Image | `{FAMILY.image}` on the default branch now; this candidate is for an earlier image |" in out.summary
    assert f"| Image | `{FAMILY.image}` |" in render_check(view()).summary
