"""A late outcome of an earlier run does not end the candidate's newer run.

A candidate's run R1 ends; its artifact download fails transiently, so the attempt is
recorded unverified (not a failure: the candidate stays eligible) and the read is retried
later. The next wave dispatches the candidate again: run R2, in flight. The retried read of
R1 (or a person's re-run of R1) must leave R2's dispatch and claim alone: matched by
candidate id only, it ended them, the family was dispatched again while R2 ran, and R2's own
failure before an outcome was never recorded. (Found by a randomized long-run simulation.)
"""

from __future__ import annotations

from datetime import timedelta

from bot.core.domain import claim_ref
from bot.core.events import Artifact, WorkflowRunEvent
from bot.github.errors import Unavailable
from tests import scenarios as sc
from tests.services.conftest import REPO, Kit
from tests.services.fakes import artifact_zip

H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"
CAND = sc.candidate(H200)
DEFERRED = {"outcome": "capacity-deferred", "phase": "targeted", "pull-request": None, "run-ids": [], "repairs-used": 0}


def run_of(kit: Kit, candidate: str) -> int:
    return [d["run_id"] for d in kit.repo.dispatched if d["inputs"]["candidate"] == candidate][-1]


async def complete_with_artifact(kit: Kit, run_id: int, artifact_id: int, *, download_fails: bool) -> None:
    now = kit.clock.now()
    run = kit.repo.runs[run_id]
    kit.repo.runs[run_id] = run.model_copy(update={
        "status": "completed", "conclusion": "success", "created_at": now - timedelta(hours=1), "updated_at": now,
    })
    kit.repo.artifacts_of[run_id] = [Artifact(id=artifact_id, name=f"klaud-candidate-{CAND}", expired=False,
                                              archive_download_url="x")]
    kit.repo.archives[artifact_id] = artifact_zip(DEFERRED)
    if download_fails:
        kit.repo.fail("download", Unavailable(502, "Bad Gateway"))
    event = WorkflowRunEvent.model_validate({
        "action": "completed", "workflow_run": kit.repo.runs[run_id].model_dump(mode="json"),
        "repository": {"full_name": REPO}, "installation": {"id": 1},
    })
    await kit.outcomes.on_workflow_run(kit.state, event)


async def first_run_read_late_second_run_in_flight(kit: Kit) -> int:
    await kit.reconciler.reconcile(REPO, 1)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and CAND in wave.selected
    first = run_of(kit, CAND)
    kit.clock.advance(3600)
    await complete_with_artifact(kit, first, 501, download_fails=True)
    [unread] = kit.state.ledger.for_candidate(CAND)
    assert (unread.verified, unread.error) == (False, "download-failed")  # not a failure: eligible
    kit.clock.advance(3600)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and CAND in wave.selected  # dispatched again: run R2
    second = run_of(kit, CAND)
    assert second != first and kit.repo.runs[second].status == "queued"
    # The retried read of R1's artifact succeeds now (R2 still queued).
    kit.clock.advance(6 * 3600)
    assert await kit.outcomes.retry_artifacts_of(kit.state) == 1
    assert any(a.run_id == first and a.verified for a in kit.state.ledger.for_candidate(CAND))
    return second


async def test_late_outcome_of_an_earlier_run_keeps_the_newer_run_in_flight(kit: Kit) -> None:
    second = await first_run_read_late_second_run_in_flight(kit)
    dispatch = kit.state.dispatches.get(H200)
    assert dispatch is not None and dispatch.run_id == second, (
        f"run {second} is still queued on GitHub, but its dispatch was ended by the earlier run's late outcome"
    )
    assert claim_ref(H200) in kit.repo.branches_at, "the claim ref of the run in flight was deleted"


async def test_the_family_is_not_dispatched_twice_while_its_run_is_in_flight(kit: Kit) -> None:
    second = await first_run_read_late_second_run_in_flight(kit)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None
    decision = next(d for d in wave.decisions if d.family == H200)
    in_flight = [r for r, run in kit.repo.runs.items() if run.status != "completed"
                 and "Klaud Cold candidate " + CAND in (run.display_title or "")]
    assert decision.decision != "selected" and in_flight == [second], (
        f"{H200} decided {decision.decision} while run {second} is in flight; runs in flight: {in_flight}"
    )


async def test_the_newer_runs_failure_before_an_outcome_is_still_recorded(kit: Kit) -> None:
    """R2 then fails before producing an artifact: with its dispatch gone, nothing matches the
    run, so no `run-failed` attempt is recorded (the two-failures cooldown and the pause rule
    never see it)."""
    from bot.core.events import Job, Step

    second = await first_run_read_late_second_run_in_flight(kit)
    now = kit.clock.now()
    kit.repo.runs[second] = kit.repo.runs[second].model_copy(update={
        "status": "completed", "conclusion": "failure", "created_at": now - timedelta(hours=1), "updated_at": now,
    })
    kit.repo.jobs_of[second] = [Job(name="benchmark", conclusion="failure", steps=(Step(name="run", conclusion="failure"),))]
    event = WorkflowRunEvent.model_validate({
        "action": "completed", "workflow_run": kit.repo.runs[second].model_dump(mode="json"),
        "repository": {"full_name": REPO}, "installation": {"id": 1},
    })
    await kit.outcomes.on_workflow_run(kit.state, event)
    recorded = [(a.run_id, a.error) for a in kit.state.ledger.for_candidate(CAND)]
    assert (second, "run-failed") in recorded, f"run {second} failed before an outcome; ledger: {recorded}"


async def test_a_rerun_of_an_earlier_run_does_not_end_the_newer_dispatch(kit: Kit) -> None:
    """Variant: a person re-runs R1 on GitHub (run_attempt 2) while R2 is in flight; R1's
    new outcome ends R2's dispatch and deletes its claim ref the same way."""
    await kit.reconciler.reconcile(REPO, 1)
    await kit.waves.run(REPO, trigger="test")
    first = run_of(kit, CAND)
    kit.clock.advance(3600)
    await complete_with_artifact(kit, first, 601, download_fails=False)  # capacity-deferred: eligible
    kit.clock.advance(3600)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and CAND in wave.selected
    second = run_of(kit, CAND)
    kit.clock.advance(3600)
    now = kit.clock.now()
    kit.repo.runs[first] = kit.repo.runs[first].model_copy(update={"run_attempt": 2, "updated_at": now})
    await kit.outcomes.on_workflow_run(kit.state, WorkflowRunEvent.model_validate({
        "action": "completed", "workflow_run": kit.repo.runs[first].model_dump(mode="json"),
        "repository": {"full_name": REPO}, "installation": {"id": 1}}))
    dispatch = kit.state.dispatches.get(H200)
    assert dispatch is not None and dispatch.run_id == second, (
        f"run {second} is still queued, but the re-run of run {first} ended its dispatch"
    )
    assert claim_ref(H200) in kit.repo.branches_at
