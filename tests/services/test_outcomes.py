"""Outcomes from runs, artifacts and receipts, against an in-memory repository."""

from __future__ import annotations

from datetime import timedelta

from bot.core.domain import claim_ref
from bot.core.events import Account, Artifact, Comment, Job, Step, WorkflowRunEvent
from bot.github.errors import BadRequest, NotFound, Unavailable
from tests import scenarios as sc
from tests.services.conftest import NOW, REPO, Kit
from tests.services.fakes import artifact_zip

H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"
CAND = sc.candidate(H200)
OUTCOME = {"outcome": "readiness-blocked", "phase": "targeted", "pull-request": None, "run-ids": [], "repairs-used": 0}


def completed(run_id: int, workflow: str = "klaud-plan.yml") -> WorkflowRunEvent:
    return WorkflowRunEvent.model_validate(
        {
            "action": "completed",
            "workflow_run": {
                "id": run_id, "path": f".github/workflows/{workflow}", "head_sha": "a" * 40,
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
    ours = await dispatched_run(kit)
    with_artifact(kit, ours)
    await kit.outcomes.on_workflow_run(kit.state, completed(ours, "klaud-candidate.yml"))
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert (attempt.verified, attempt.outcome, attempt.run_id) == (True, "readiness-blocked", ours)
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
    assert await kit.outcomes.retry_artifacts_of(kit.state) == 1
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert attempt.verified and kit.state.pending_artifacts == {}


# What blob storage answers for a signed URL it will not honour: a 4xx that retrying
# cannot fix, so the client raises a permanent error.
REFUSED = BadRequest(403, "AuthenticationFailed")


async def test_a_refused_download_records_an_unverified_attempt_and_releases_the_claim(kit: Kit) -> None:
    ours = await dispatched_run(kit)
    with_artifact(kit, ours)
    kit.repo.fail("download", REFUSED)
    # Raised, it failed the delivery, and from the claim TTL on every scheduler tick.
    await kit.outcomes.on_workflow_run(kit.state, completed(ours, "klaud-candidate.yml"))
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
    assert await kit.outcomes.retry_artifacts_of(kit.state) == 1  # did not raise out of the scheduler's tick
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert (attempt.verified, attempt.error) == (False, "download-refused")
    assert kit.state.pending_artifacts == {}
    assert await kit.outcomes.retry_artifacts_of(kit.state) == 0


def receipt(run_id: int) -> str:
    """A receipt comment's body: CAND's outcome of run `run_id` (domain §6.3)."""
    return (
        f"<!-- klaud-outcome:{run_id}:{CAND}\n"
        '{"head": "' + "b" * 40 + '", "outcome": {"outcome": "incompatible", "phase": "targeted", '
        '"pull-request": 9, "run-ids": [], "repairs-used": 1}, "validation": null}\n-->\n'
    )


async def test_receipts_count_only_from_bot_accounts(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    body = receipt(777)
    person = Comment(id=1, body=body, user=Account(login="Klaud-Cold", type="User"), created_at=NOW)
    assert not await kit.outcomes.on_receipt(kit.state, person)
    bot = Comment(id=2, body=body, user=Account(login="klaud-cold[bot]", type="Bot"), created_at=NOW)
    assert await kit.outcomes.on_receipt(kit.state, bot)
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert (attempt.outcome, attempt.run_id) == ("incompatible", 777)


async def dispatched_run(kit: Kit) -> int:
    """Reconcile, run a wave that dispatches CAND; the id of its run."""
    await kit.reconciler.reconcile(REPO, 1)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and CAND in wave.selected
    run_id = kit.state.dispatches[H200].run_id
    assert run_id is not None
    return run_id


def failed_run(run_id: int, conclusion: str = "failure") -> WorkflowRunEvent:
    event = completed(run_id)
    run = event.workflow_run.model_copy(
        update={"path": ".github/workflows/klaud-candidate.yml", "conclusion": conclusion}
    )
    return event.model_copy(update={"workflow_run": run})


async def test_a_dispatched_run_failing_before_an_outcome_names_its_job_and_step(kit: Kit) -> None:
    run_id = await dispatched_run(kit)
    kit.repo.jobs_of[run_id] = [
        Job(name="prepare", conclusion="success", steps=(Step(name="checkout", conclusion="success"),)),
        Job(name="get-jobs", conclusion="failure", steps=(Step(name="Validate matrix", conclusion="failure"),)),
    ]
    await kit.outcomes.on_workflow_run(kit.state, failed_run(run_id))
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert (attempt.error, attempt.failed_job, attempt.failed_step) == ("run-failed", "get-jobs", "Validate matrix")
    assert H200 not in kit.state.dispatches and H200 not in kit.state.claims


async def test_a_dispatched_run_failing_with_a_broken_artifact_failed_before_an_outcome(kit: Kit) -> None:
    # What this catches (a review on the real configs): a diagnostics step that crashed
    # half-way, its upload still run, left truncated JSON; the run was recorded `invalid-json`
    # (eligible, not counted by the pause rule) and the candidate was dispatched every wave.
    run_id = await dispatched_run(kit)
    with_artifact(kit, run_id)
    kit.repo.archives[77] = b"not a zip"
    kit.repo.jobs_of[run_id] = [Job(name="Klaud Cold", conclusion="failure", steps=(Step(name="Diagnostics", conclusion="failure"),))]
    await kit.outcomes.on_workflow_run(kit.state, failed_run(run_id))
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert (attempt.error, attempt.failed_job, attempt.failed_step) == ("run-failed", "Klaud Cold", "Diagnostics")
    assert H200 not in kit.state.dispatches and H200 not in kit.state.claims


async def test_a_dispatched_run_whose_artifact_could_not_be_downloaded_is_not_a_run_failure(kit: Kit) -> None:
    # A download GitHub refuses says nothing of the run: its artifact may hold an outcome.
    run_id = await dispatched_run(kit)
    with_artifact(kit, run_id)
    kit.repo.fail("download", BadRequest(403, "Forbidden"))
    kit.repo.jobs_of[run_id] = [Job(name="cleanup", conclusion="failure")]
    await kit.outcomes.on_workflow_run(kit.state, failed_run(run_id))
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert attempt.error == "download-refused"
    assert ("run_jobs", run_id) not in kit.repo.calls


async def test_a_dispatched_run_that_succeeded_without_its_artifact_is_artifact_missing(kit: Kit) -> None:
    run_id = await dispatched_run(kit)
    await kit.outcomes.on_workflow_run(kit.state, failed_run(run_id, "success"))
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert attempt.error == "artifact-missing"
    assert ("run_jobs", run_id) not in kit.repo.calls


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
    assert "3 of the 3 finished runs of wave 1 failed before an outcome in job `get-jobs`" in blocked.reason
    kit.clock.advance(3 * 3600)
    paused = await kit.waves.run(REPO, trigger="test")
    assert paused is not None and paused.selected == ()
    assert "paused" in {d.decision for d in paused.decisions}
    # A push arms the canary: one candidate, whose verified outcome resumes dispatch.
    from tests.services.test_catalog_sync import push
    from tests.services.test_runs_and_pause import canary_after_a_push

    cand, run_id, head = await canary_after_a_push(kit)
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


async def running_canary(kit: Kit) -> int:
    """Wave 1's runs fail in one job, dispatch pauses, a push arms the canary, it runs."""
    from tests.services.test_catalog_sync import push

    await kit.reconciler.reconcile(REPO, 1)
    await kit.waves.run(REPO, trigger="test")
    for dispatch in list(kit.state.dispatches.values())[:3]:
        assert dispatch.run_id is not None
        kit.repo.jobs_of[dispatch.run_id] = [Job(name="get-jobs", conclusion="failure")]
        await kit.outcomes.on_workflow_run(kit.state, failed_run(dispatch.run_id))
    kit.clock.advance(3 * 3600)
    head = "e" * 40
    kit.repo.files[head] = dict(kit.repo.files[kit.repo.head])
    await kit.catalog.on_push(kit.state, push("refs/heads/main", kit.repo.head, head))
    canary = await kit.waves.run(REPO, trigger="test")
    assert canary is not None
    [cand] = canary.selected
    run_id = kit.state.dispatches[next(d.family for d in canary.decisions if d.candidate == cand)].run_id
    assert run_id is not None
    kit.repo.artifacts_of[run_id] = [Artifact(id=99, name=f"klaud-candidate-{cand}", expired=False, archive_download_url="x")]
    kit.repo.archives[99] = artifact_zip(OUTCOME)
    return run_id


async def test_a_canarys_outcome_read_only_on_a_retry_still_resumes_dispatch(kit: Kit) -> None:
    # What this catches: the canary's artifact read failing once (a 502), recorded as "no
    # outcome", so its outcome read an hour later found the canary gone and the repository
    # stayed paused until a person pushed or commented /klaud resume.
    run_id = await running_canary(kit)
    kit.repo.fail("download", Unavailable(502, "Bad Gateway"))
    await kit.outcomes.on_workflow_run(kit.state, failed_run(run_id, "success"))
    assert kit.state.blocked() is not None and kit.state.pending_artifacts
    kit.clock.advance(timedelta(hours=1).total_seconds())
    assert await kit.outcomes.retry_artifacts_of(kit.state) == 1
    assert kit.state.blocked() is None and kit.state.meta.canary is None


async def test_a_canary_whose_artifact_cannot_be_read_at_all_leaves_dispatch_paused(kit: Kit) -> None:
    run_id = await running_canary(kit)
    kit.repo.fail("download", BadRequest(403, "Forbidden"))  # refused: not retried
    await kit.outcomes.on_workflow_run(kit.state, failed_run(run_id, "success"))
    blocked = kit.state.blocked()
    assert blocked is not None and blocked.code == "dispatch-paused"
    assert kit.state.meta.canary is None and not kit.state.pending_artifacts


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
    assert await kit.outcomes.retry_artifacts_of(kit.state) == 2
    assert {(a.run_attempt, a.verified) for a in kit.state.ledger.for_candidate(CAND)} == {(1, True), (2, True)}


async def test_a_transient_read_that_keeps_failing_is_given_up_after_the_retry_window(kit: Kit) -> None:
    # DESIGN §4 Outcomes: transient errors are retried with backoff *while the artifact can
    # still exist*, not forever; the window runs from the first failure.
    await kit.reconciler.reconcile(REPO, 1)
    with_artifact(kit, 306)
    kit.repo.fail("download", Unavailable(502, "Bad Gateway"))
    await kit.outcomes.on_workflow_run(kit.state, completed(306))
    assert len(kit.state.pending_artifacts) == 1
    kit.repo.fail("artifact", Unavailable(502, "Bad Gateway"), times=1000)
    tries = 0
    for _ in range(15 * 4):  # fifteen days (a candidate artifact is kept 14), every six hours
        kit.clock.advance(timedelta(hours=6).total_seconds())
        tries += await kit.outcomes.retry_artifacts_of(kit.state)
    assert tries > 1  # it was retried meanwhile
    assert kit.state.pending_artifacts == {}, "the retry was never given up"
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert (attempt.verified, attempt.error) == (False, "download-failed")


def started(run_id: int, action: str = "in_progress") -> WorkflowRunEvent:
    event = completed(run_id)
    run = event.workflow_run.model_copy(
        update={"path": ".github/workflows/klaud-candidate.yml", "status": action, "conclusion": None}
    )
    return event.model_copy(update={"action": action, "workflow_run": run})


async def test_a_run_that_only_started_records_nothing_and_keeps_its_dispatch_and_claim(kit: Kit) -> None:
    # DESIGN §4 "Claims and runs never get stuck": a run still queued or running keeps its
    # claim and is never dispatched again meanwhile. Only `completed` carries an outcome.
    run_id = await dispatched_run(kit)
    for action in ("requested", "in_progress"):
        await kit.outcomes.on_workflow_run(kit.state, started(run_id, action))
    assert kit.state.ledger.for_candidate(CAND) == []
    assert kit.state.dispatches[H200].run_id == run_id
    assert claim_ref(H200) in kit.repo.branches_at


# -- which runs and comments count ------------------------------------------------------


async def test_a_run_of_another_workflow_is_not_read_even_with_a_candidate_artifact(kit: Kit) -> None:
    # DESIGN §4 Outcomes: only runs of an `outcome_workflows` workflow are read; any other
    # workflow (a person's CI) must not be able to record an outcome or end a dispatch.
    await kit.reconciler.reconcile(REPO, 1)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and CAND in wave.selected
    with_artifact(kit, 310)
    event = completed(310)
    other = event.model_copy(update={"workflow_run": event.workflow_run.model_copy(update={"path": ".github/workflows/ci.yml"})})
    await kit.outcomes.on_workflow_run(kit.state, other)
    assert kit.state.ledger.for_candidate(CAND) == []
    assert H200 in kit.state.dispatches and claim_ref(H200) in kit.repo.branches_at


async def test_a_bot_comment_that_is_not_a_receipt_is_ignored(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    reply = Comment(id=3, body="<!-- klaud-command:12 -->\nHeld.", user=Account(login="klaud-cold[bot]", type="Bot"),
                    created_at=kit.clock.now())
    assert not await kit.outcomes.on_receipt(kit.state, reply)
    assert kit.state.ledger.for_candidate(CAND) == []


async def test_a_receipt_completes_when_it_was_posted_not_when_it_was_read(kit: Kit) -> None:
    # The attempt's completed time starts the cooldown (DESIGN §4 Cooldown).
    await kit.reconciler.reconcile(REPO, 1)
    body = receipt(778)
    posted = kit.clock.now() - timedelta(hours=2)
    bot = Comment(id=4, body=body, user=Account(login="klaud-cold[bot]", type="Bot"), created_at=posted)
    assert await kit.outcomes.on_receipt(kit.state, bot)
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert attempt.completed_at == posted


# -- permanent read errors are recorded once, transient ones retried when due ------------


async def test_an_expired_artifact_is_not_downloaded_and_not_retried(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    with_artifact(kit, 311)
    kit.repo.artifacts_of[311] = [Artifact(id=77, name=f"klaud-candidate-{CAND}", expired=True, archive_download_url="x")]
    await kit.outcomes.on_workflow_run(kit.state, completed(311))
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert (attempt.verified, attempt.error) == (False, "artifact-expired")
    assert ("download", 77) not in kit.repo.calls and kit.state.pending_artifacts == {}


async def test_an_invalid_archive_is_recorded_unverified_and_not_retried(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    with_artifact(kit, 312)
    kit.repo.archives[77] = b"not a zip"
    await kit.outcomes.on_workflow_run(kit.state, completed(312))
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert not attempt.verified and attempt.error
    assert kit.state.pending_artifacts == {}  # the same bytes would fail again


async def test_an_artifact_not_found_is_recorded_as_such_and_not_retried(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    with_artifact(kit, 313)
    kit.repo.fail("download", NotFound(404, "Not Found"))
    await kit.outcomes.on_workflow_run(kit.state, completed(313))
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert (attempt.verified, attempt.error) == (False, "artifact-not-found")
    assert kit.state.pending_artifacts == {}


async def test_a_retried_artifact_that_is_gone_is_recorded_and_dropped(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    with_artifact(kit, 314)
    kit.repo.fail("download", Unavailable(502, "Bad Gateway"))
    await kit.outcomes.on_workflow_run(kit.state, completed(314))
    kit.repo.artifacts_of[314] = []  # deleted meanwhile: the lookup answers None
    kit.clock.advance(timedelta(hours=1).total_seconds())
    assert await kit.outcomes.retry_artifacts_of(kit.state) == 1
    assert [a.error for a in kit.state.ledger.for_candidate(CAND)] == ["artifact-not-found"]
    assert kit.state.pending_artifacts == {}


async def test_a_failed_read_is_not_retried_before_it_is_due(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    with_artifact(kit, 315)
    kit.repo.fail("download", Unavailable(502, "Bad Gateway"))
    await kit.outcomes.on_workflow_run(kit.state, completed(315))
    assert await kit.outcomes.retry_artifacts_of(kit.state) == 0  # backoff: not at once
    assert len(kit.state.pending_artifacts) == 1


# -- a pause shows on every check run ---------------------------------------------------


async def test_the_outcome_that_pauses_dispatch_re_renders_every_family(kit: Kit) -> None:
    # DESIGN §4: a pause shows on every Klaud check run, which re-render at once.
    await kit.reconciler.reconcile(REPO, 1)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and len(wave.selected) >= 3
    told: list[set[str]] = []

    async def listener(state, families, pulls):  # type: ignore[no-untyped-def]
        told.append(set(families))

    kit.live.listeners.append(listener)
    for dispatch in list(kit.state.dispatches.values())[:3]:
        assert dispatch.run_id is not None
        kit.repo.jobs_of[dispatch.run_id] = [Job(name="get-jobs", conclusion="failure")]
        await kit.outcomes.on_workflow_run(kit.state, failed_run(dispatch.run_id))
    assert kit.state.blocked() is not None
    assert told[-1] == {f.id for f in kit.state.catalog}


# -- unlinked dispatches (a 204 answer) are matched by their own candidate only ----------


def run_event(kit: Kit, run_id: int, action: str, **changes: object) -> WorkflowRunEvent:
    """The `action` delivery of run `run_id`, its fields as the run has them (or `changes`)."""
    return WorkflowRunEvent.model_validate({
        "action": action, "workflow_run": {**kit.repo.runs[run_id].model_dump(mode="json"), **changes},
        "repository": {"full_name": REPO}, "installation": {"id": 1},
    })


async def unlinked_wave(kit: Kit) -> list[tuple[str, int]]:
    """A wave of several dispatches that no answer linked: (candidate, run id) of each."""
    kit.repo.answer_run_ids = False  # an older GitHub answers 204 (DESIGN §4 A wave)
    await kit.reconciler.reconcile(REPO, 1)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and len(wave.selected) >= 2
    assert all(d.run_id is None for d in kit.state.dispatches.values())
    for d in kit.repo.dispatched:
        kit.repo.runs[d["run_id"]] = kit.repo.runs[d["run_id"]].model_copy(update={"created_at": kit.clock.now()})
    return [(d["inputs"]["candidate"], d["run_id"]) for d in kit.repo.dispatched]


async def test_a_started_run_links_only_the_dispatch_of_its_own_candidate(kit: Kit) -> None:
    runs = await unlinked_wave(kit)
    cand, run_id = runs[-1]
    kit.repo.runs[run_id] = kit.repo.runs[run_id].model_copy(update={"status": "in_progress"})
    await kit.outcomes.on_workflow_run(kit.state, run_event(kit, run_id, "in_progress"))
    linked = {d.candidate: d.run_id for d in kit.state.dispatches.values() if d.run_id is not None}
    assert linked == {cand: run_id}


async def test_an_unlinked_run_failing_without_an_artifact_is_recorded_for_its_own_candidate(kit: Kit) -> None:
    runs = await unlinked_wave(kit)
    cand, run_id = runs[-1]
    kit.repo.runs[run_id] = kit.repo.runs[run_id].model_copy(
        update={"status": "completed", "conclusion": "failure", "updated_at": kit.clock.now()}
    )
    kit.repo.jobs_of[run_id] = [Job(name="get-jobs", conclusion="failure")]
    await kit.outcomes.on_workflow_run(kit.state, run_event(kit, run_id, "completed"))
    recorded = {(a.candidate, a.error) for c, _ in runs for a in kit.state.ledger.for_candidate(c)}
    assert recorded == {(cand, "run-failed")}
    assert {d.candidate for d in kit.state.dispatches.values()} == {c for c, _ in runs[:-1]}


# -- a full reconcile reads the completed runs of the last days -----------------------------


async def test_a_full_reconcile_records_the_outcome_of_a_run_whose_event_was_lost(kit: Kit) -> None:
    # reconcile.py: a full reconcile reads "the completed runs of the last days"; the artifact
    # comes from the repository's artifact list (one request, not one per run).
    run_id = await dispatched_run(kit)
    kit.clock.advance(3600)
    now = kit.clock.now()
    kit.repo.runs[run_id] = kit.repo.runs[run_id].model_copy(update={
        "status": "completed", "conclusion": "success", "created_at": now - timedelta(minutes=50), "updated_at": now,
    })
    kit.repo.artifacts_of[run_id] = [Artifact(id=88, name=f"klaud-candidate-{CAND}", expired=False,
                                              archive_download_url="x", created_at=now)]
    kit.repo.archives[88] = artifact_zip(OUTCOME)
    await kit.reconciler.reconcile(REPO, 1)  # every workflow_run delivery of it was lost
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert (attempt.verified, attempt.outcome, attempt.run_id) == (True, "readiness-blocked", run_id)
    assert H200 not in kit.state.dispatches and claim_ref(H200) not in kit.repo.branches_at
    assert ("run_artifacts", run_id) not in kit.repo.calls


async def test_a_pull_requests_run_of_an_outcome_workflow_is_no_outcome(kit: Kit) -> None:
    # What this catches (a hostile-input review): a contributor's fork may rewrite the
    # candidate workflow to run on its own pull request (GitHub runs the head's version) and
    # upload klaud-candidate-<id> saying "failed": the family cooled down for a day.
    await kit.reconciler.reconcile(REPO, 1)
    now = kit.clock.now()
    forged = completed(401).workflow_run.model_copy(update={
        "path": ".github/workflows/klaud-candidate.yml", "event": "pull_request",
        "created_at": now - timedelta(minutes=5), "updated_at": now,
    })
    with_artifact(kit, 401)
    await kit.outcomes.on_workflow_run(kit.state, completed(401).model_copy(update={"workflow_run": forged}))
    kit.repo.runs[401] = forged
    await kit.reconciler.reconcile(REPO, 1)  # nor from the listing of the last days' runs
    assert kit.state.ledger.for_candidate(CAND) == [] and ("download", 77) not in kit.repo.calls
    dispatched = forged.model_copy(update={"event": "workflow_dispatch"})
    await kit.outcomes.on_workflow_run(kit.state, completed(401).model_copy(update={"workflow_run": dispatched}))
    assert [a.outcome for a in kit.state.ledger.for_candidate(CAND)] == ["readiness-blocked"]
