"""Outcomes from runs, artifacts and receipts, against an in-memory repository."""

from __future__ import annotations

from datetime import timedelta

from bot.core.domain import claim_ref
from bot.core.events import Account, Artifact, Comment, Job, Step, WorkflowRunEvent
from bot.github.errors import BadRequest, Unavailable
from tests import scenarios as sc
from tests.services.conftest import NOW, REPO, Kit
from tests.services.fakes import artifact_zip

H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"
CAND = sc.candidate(H200)
OUTCOME = {"outcome": "readiness-blocked", "phase": "targeted", "pull-request": None, "run-ids": [], "repairs-used": 0}


def completed(run_id: int) -> WorkflowRunEvent:
    return WorkflowRunEvent.model_validate(
        {
            "action": "completed",
            "workflow_run": {
                "id": run_id, "path": ".github/workflows/klaud-plan.yml", "head_sha": "a" * 40,
                "status": "completed", "conclusion": "success",
                "created_at": "2026-11-30T07:00:00Z", "updated_at": "2026-11-30T07:30:00Z",
            },
            "repository": {"full_name": REPO},
            "installation": {"id": 1},
        }
    )


def with_artifact(kit: Kit, run_id: int, artifact_id: int = 77) -> None:
    kit.repo.artifacts_of[run_id] = [
        Artifact(id=artifact_id, name=f"klaud-candidate-{CAND}", expired=False, archive_download_url="x")
    ]
    kit.repo.archives[artifact_id] = artifact_zip(OUTCOME)


async def test_a_run_with_an_artifact_records_a_verified_attempt_and_releases_the_claim(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and CAND in wave.selected
    with_artifact(kit, 301)
    await kit.outcomes.on_workflow_run(kit.state, completed(301))
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert (attempt.verified, attempt.outcome, attempt.run_id) == (True, "readiness-blocked", 301)
    assert H200 not in kit.state.claims and H200 not in kit.state.dispatches
    assert claim_ref(H200) not in kit.repo.branches_at


async def test_a_transient_download_error_is_retried_later(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    with_artifact(kit, 302)
    kit.repo.fail("download", Unavailable(502, "Bad Gateway"))
    await kit.outcomes.on_workflow_run(kit.state, completed(302))
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert (attempt.verified, attempt.error) == (False, "download-failed")
    assert len(kit.state.pending_artifacts) == 1
    kit.clock.advance(timedelta(hours=1).total_seconds())
    assert await kit.outcomes.retry_artifacts() == 1
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert attempt.verified and kit.state.pending_artifacts == {}


# What blob storage answers for a signed URL it will not honour: a 4xx that retrying
# cannot fix, so the client raises a permanent error.
REFUSED = BadRequest(403, "AuthenticationFailed")


async def test_a_refused_download_records_an_unverified_attempt_and_releases_the_claim(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    await kit.waves.run(REPO, trigger="test")
    with_artifact(kit, 303)
    kit.repo.fail("download", REFUSED)
    # Raised, it failed the delivery, and from the claim TTL on every scheduler tick.
    await kit.outcomes.on_workflow_run(kit.state, completed(303))
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert (attempt.verified, attempt.error) == (False, "download-refused")
    assert kit.state.pending_artifacts == {}  # the same request would be refused again
    assert H200 not in kit.state.dispatches and claim_ref(H200) not in kit.repo.branches_at


async def test_a_retried_artifact_that_is_then_refused_is_recorded_and_dropped(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    with_artifact(kit, 304)
    kit.repo.fail("download", Unavailable(502, "Bad Gateway"))
    await kit.outcomes.on_workflow_run(kit.state, completed(304))
    kit.clock.advance(timedelta(hours=1).total_seconds())
    kit.repo.fail("artifact", REFUSED)
    assert await kit.outcomes.retry_artifacts() == 1  # did not raise out of the scheduler's tick
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert (attempt.verified, attempt.error) == (False, "download-refused")
    assert kit.state.pending_artifacts == {}
    assert await kit.outcomes.retry_artifacts() == 0


async def test_receipts_count_only_from_bot_accounts(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    body = (
        f"<!-- klaud-outcome:777:{CAND}\n"
        '{"head": "' + "b" * 40 + '", "outcome": {"outcome": "incompatible", "phase": "targeted", '
        '"pull-request": 9, "run-ids": [], "repairs-used": 1}, "validation": null}\n-->\n'
    )
    person = Comment(id=1, body=body, user=Account(login="Klaud-Cold", type="User"), created_at=NOW)
    assert not await kit.outcomes.on_receipt(kit.state, person)
    bot = Comment(id=2, body=body, user=Account(login="klaud-cold[bot]", type="Bot"), created_at=NOW)
    assert await kit.outcomes.on_receipt(kit.state, bot)
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert (attempt.outcome, attempt.run_id) == ("incompatible", 777)


def failed_run(run_id: int, conclusion: str = "failure") -> WorkflowRunEvent:
    event = completed(run_id)
    run = event.workflow_run.model_copy(
        update={"path": ".github/workflows/klaud-candidate.yml", "conclusion": conclusion}
    )
    return event.model_copy(update={"workflow_run": run})


async def test_a_dispatched_run_failing_before_an_outcome_names_its_job_and_step(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and CAND in wave.selected
    run_id = kit.state.dispatches[H200].run_id
    assert run_id is not None
    kit.repo.jobs_of[run_id] = [
        Job(name="prepare", conclusion="success", steps=(Step(name="checkout", conclusion="success"),)),
        Job(name="get-jobs", conclusion="failure", steps=(Step(name="Validate matrix", conclusion="failure"),)),
    ]
    await kit.outcomes.on_workflow_run(kit.state, failed_run(run_id))
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert (attempt.error, attempt.failed_job, attempt.failed_step) == ("run-failed", "get-jobs", "Validate matrix")
    assert H200 not in kit.state.dispatches and H200 not in kit.state.claims


async def test_runs_failing_in_one_job_pause_dispatch_and_a_canary_resumes_it(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and len(wave.selected) == 5
    for dispatch in list(kit.state.dispatches.values())[:3]:
        assert dispatch.run_id is not None
        kit.repo.jobs_of[dispatch.run_id] = [Job(name="get-jobs", conclusion="failure")]
        await kit.outcomes.on_workflow_run(kit.state, failed_run(dispatch.run_id))
    blocked = kit.state.blocked()
    assert blocked is not None and blocked.code == "dispatch-paused"
    assert "3 of the 3 finished runs of wave 1 failed before an outcome in job get-jobs" in blocked.reason
    kit.clock.advance(3 * 3600)
    paused = await kit.waves.run(REPO, trigger="test")
    assert paused is not None and paused.selected == ()
    assert "paused" in {d.decision for d in paused.decisions}
    # A push arms the canary: one candidate, whose verified outcome resumes dispatch.
    from tests.services.test_catalog_sync import push

    head = "e" * 40
    kit.repo.files[head] = dict(kit.repo.files[kit.repo.head])
    await kit.catalog.on_push(kit.state, push("refs/heads/main", kit.repo.head, head))
    canary = await kit.waves.run(REPO, trigger="test")
    assert canary is not None and len(canary.selected) == 1
    [cand] = canary.selected
    family = next(d.family for d in canary.decisions if d.candidate == cand)
    run_id = kit.state.dispatches[family].run_id
    assert run_id is not None
    # Another push (or /klaud resume) while the canary runs leaves it alone: re-armed, its
    # outcome was no longer recognised and a second canary went out.
    again = "f" * 40
    kit.repo.files[again] = dict(kit.repo.files[head])
    await kit.catalog.on_push(kit.state, push("refs/heads/main", head, again))
    assert kit.state.canary_running() == cand and not kit.state.canary_armed
    kit.repo.artifacts_of[run_id] = [Artifact(id=99, name=f"klaud-candidate-{cand}", expired=False, archive_download_url="x")]
    kit.repo.archives[99] = artifact_zip(OUTCOME)
    await kit.outcomes.on_workflow_run(kit.state, failed_run(run_id, "success"))
    assert kit.state.blocked() is None


async def test_a_rerun_whose_artifact_read_fails_is_retried_for_its_own_attempt(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    with_artifact(kit, 305, artifact_id=71)
    kit.repo.fail("download", Unavailable(502, "Bad Gateway"))
    await kit.outcomes.on_workflow_run(kit.state, completed(305))
    # A person re-runs it: attempt 2 has an artifact of its own, whose read fails too.
    with_artifact(kit, 305, artifact_id=72)
    kit.repo.artifacts_of[305].append(Artifact(id=71, name=f"klaud-candidate-{CAND}", expired=False, archive_download_url="x"))
    kit.repo.fail("download", Unavailable(502, "Bad Gateway"))
    rerun = completed(305)
    rerun = rerun.model_copy(update={"workflow_run": rerun.workflow_run.model_copy(update={"run_attempt": 2})})
    await kit.outcomes.on_workflow_run(kit.state, rerun)
    assert len(kit.state.pending_artifacts) == 2  # one slot each: attempt 2's took attempt 1's
    kit.clock.advance(timedelta(hours=1).total_seconds())
    assert await kit.outcomes.retry_artifacts() == 2
    assert {(a.run_attempt, a.verified) for a in kit.state.ledger.for_candidate(CAND)} == {(1, True), (2, True)}
