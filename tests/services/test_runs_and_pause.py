"""Runs and their outcomes: another run of a candidate, re-runs, and what pauses dispatch."""

from __future__ import annotations

from datetime import timedelta

import yaml

from bot.core.domain import claim_ref
from bot.core.events import Artifact, Job, Step, WorkflowRunEvent
from bot.github.errors import Unavailable
from tests import scenarios as sc
from tests.conftest import ROOT
from tests.services.conftest import REPO, Kit
from tests.services.fakes import artifact_zip
from tests.services.test_catalog_sync import push

H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"
CAND = sc.candidate(H200)
DEFERRED = {"outcome": "capacity-deferred", "phase": "targeted", "pull-request": None, "run-ids": [], "repairs-used": 0}
FAILED = {"outcome": "failed", "phase": "targeted", "pull-request": 9, "run-ids": [5], "repairs-used": 5}


def event(run_id: int, *, attempt: int = 1, title: str = "", conclusion: str = "success", at=None, started=None) -> WorkflowRunEvent:
    at = at or "2026-11-30T08:30:00Z"
    return WorkflowRunEvent.model_validate({
        "action": "completed",
        "workflow_run": {
            "id": run_id, "path": ".github/workflows/klaud-candidate.yml", "head_sha": "a" * 40,
            "run_attempt": attempt, "display_title": title, "event": "workflow_dispatch",
            "status": "completed", "conclusion": conclusion,
            "created_at": "2026-11-30T08:01:00Z", "updated_at": at,
            "run_started_at": started or "2026-11-30T08:01:00Z",
        },
        "repository": {"full_name": REPO}, "installation": {"id": 1},
    })


async def one_dispatch(kit: Kit) -> int:
    kit.repo.put_files({".github/klaud.yml": "max_candidates_per_wave: 1\n"})
    await kit.reconciler.reconcile(REPO, 1)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and wave.selected == (CAND,), wave.selected
    run_id = kit.state.dispatches[H200].run_id
    assert run_id is not None
    return run_id


async def test_another_runs_outcome_does_not_end_the_dispatch_linked_to_our_still_queued_run(kit: Kit) -> None:
    ours = await one_dispatch(kit)  # linked at once by the dispatch's answer; still queued
    # A run of the same candidate that Klaud did not dispatch (a person's manual dispatch,
    # another planner's) completes first, saying capacity-deferred.
    kit.repo.artifacts_of[555] = [Artifact(id=55, name=f"klaud-candidate-{CAND}", expired=False, archive_download_url="x")]
    kit.repo.archives[55] = artifact_zip(DEFERRED)
    await kit.outcomes.on_workflow_run(kit.state, event(555, title=f"Klaud Cold candidate {CAND}"))
    assert [a.run_id for a in kit.state.ledger.for_candidate(CAND)] == [555]
    # Our run is still queued: its dispatch and claim must stay, and no wave dispatches it again.
    assert kit.repo.runs[ours].status == "queued"
    assert H200 in kit.state.dispatches, "our in-flight dispatch was ended by another run's outcome"
    assert claim_ref(H200) in kit.repo.branches_at
    kit.clock.advance(2 * 3600)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and CAND not in wave.selected, "a queued candidate was dispatched again"


async def test_a_rerun_does_not_record_the_first_attempts_artifact_again_as_its_own(kit: Kit) -> None:
    ours = await one_dispatch(kit)
    # Attempt 1 finishes with a verified "failed": a 24 h cooldown from 08:30.
    kit.repo.artifacts_of[ours] = [Artifact(id=61, name=f"klaud-candidate-{CAND}", expired=False, archive_download_url="x",
                                            created_at=kit.clock.now() + timedelta(minutes=29))]
    kit.repo.archives[61] = artifact_zip(FAILED)
    await kit.outcomes.on_workflow_run(kit.state, event(ours))
    first = kit.state.cooldown_of(CAND, kit.clock.now() + timedelta(hours=1))
    assert not first.eligible
    # 20 hours later a person re-runs it; attempt 2 fails at checkout and uploads nothing.
    # GitHub still lists attempt 1's artifact on the run.
    kit.clock.advance(20 * 3600)
    await kit.outcomes.on_workflow_run(
        kit.state, event(ours, attempt=2, conclusion="failure", at="2026-12-01T04:40:00Z", started="2026-12-01T04:30:00Z")
    )
    attempts = {(a.run_attempt, a.outcome) for a in kit.state.ledger.for_candidate(CAND)}
    assert (2, "failed") not in attempts, f"attempt 1's outcome was read again as attempt 2's: {attempts}"
    # The cooldown still ends 24 h after attempt 1, not 24 h after the re-run.
    later = kit.state.cooldown_of(CAND, first.until + timedelta(minutes=1))
    assert later.eligible, later.reason



FALLBACK = {"outcome": "unexpected-error", "phase": "unknown", "pull-request": None, "run-ids": [], "repairs-used": None}


async def five_dispatched(kit: Kit) -> list[int]:
    await kit.reconciler.reconcile(REPO, 1)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and len(wave.selected) == 5
    return [d.run_id for d in kit.state.dispatches.values() if d.run_id is not None]


async def test_a_session_that_fails_at_once_for_every_candidate_pauses_dispatch(kit: Kit) -> None:
    # deploy/klaud-candidate.yml: when the session step fails without writing diagnostics
    # (a missing secret, a broken install), "Record an outcome when the session left none"
    # uploads the fallback unexpected-error/unknown. Every candidate of the wave fails the
    # same way in the same step: the 65-family pattern.
    runs = await five_dispatched(kit)
    for n, run_id in enumerate(runs[:3]):
        kit.repo.jobs_of[run_id] = [Job(name="Klaud Cold", conclusion="failure",
                                        steps=(Step(name="Run the candidate session", conclusion="failure"),))]
        cand = next(d.candidate for d in kit.state.dispatches.values() if d.run_id == run_id)
        kit.repo.artifacts_of[run_id] = [Artifact(id=800 + n, name=f"klaud-candidate-{cand}", expired=False, archive_download_url="x")]
        kit.repo.archives[800 + n] = artifact_zip(FALLBACK)
        await kit.outcomes.on_workflow_run(kit.state, event(run_id, conclusion="failure"))
    blocked = kit.state.blocked()
    assert blocked is not None and blocked.code == "dispatch-paused", "3 of 3 finished runs failed in the session step"


async def test_a_late_run_of_the_wave_that_paused_dispatch_does_not_pause_it_again_after_the_canary(kit: Kit) -> None:
    runs = await five_dispatched(kit)
    for run_id in runs[:3]:
        kit.repo.jobs_of[run_id] = [Job(name="get-jobs", conclusion="failure")]
        await kit.outcomes.on_workflow_run(kit.state, event(run_id, conclusion="failure"))
    assert kit.state.blocked() is not None
    # The workflow is fixed by a push, which arms the canary; the canary's outcome resumes.
    kit.clock.advance(3 * 3600)
    cand, canary_run, _ = await canary_after_a_push(kit)
    kit.repo.artifacts_of[canary_run] = [Artifact(id=901, name=f"klaud-candidate-{cand}", expired=False, archive_download_url="x")]
    kit.repo.archives[901] = artifact_zip(DEFERRED)
    await kit.outcomes.on_workflow_run(kit.state, event(canary_run))
    assert kit.state.blocked() is None  # resumed
    # A long session of wave 1, dispatched before the breakage was fixed, now ends well.
    late = runs[3]
    late_cand = next(d.candidate for d in kit.state.dispatches.values() if d.run_id == late)
    kit.repo.artifacts_of[late] = [Artifact(id=902, name=f"klaud-candidate-{late_cand}", expired=False, archive_download_url="x")]
    kit.repo.archives[902] = artifact_zip(FAILED)
    await kit.outcomes.on_workflow_run(kit.state, event(late))
    assert kit.state.blocked() is None, f"paused again by wave 1's old failures: {kit.state.blocked()}"


def test_the_reference_workflow_lets_a_re_run_replace_its_outcome_artifact() -> None:
    # upload-artifact v4 refuses a second artifact of one name in one run (409 Conflict) unless
    # `overwrite: true`: a re-run's outcome is never uploaded, and attempt 1's is read for it.
    [job] = yaml.safe_load((ROOT / "deploy" / "klaud-candidate.yml").read_text())["jobs"].values()
    [upload] = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert upload["with"].get("overwrite") is True


async def test_a_canary_whose_session_failed_at_once_does_not_resume_dispatch(kit: Kit) -> None:
    # Its fallback outcome is "verified", but says the session never ran: the fix did not work.
    canary_run = await paused_with_a_running_canary(kit)
    session_failed(kit, canary_run, 899)
    await kit.outcomes.on_workflow_run(kit.state, event(canary_run, conclusion="failure"))
    blocked = kit.state.blocked()
    assert blocked is not None and blocked.code == "dispatch-paused"


async def paused_with_a_running_canary(kit: Kit) -> int:
    """Three runs of wave 1 fail in their session (fallback outcomes, cooling down): paused.
    One more ends, deferred; a push arms the canary, whose wave dispatches it: its run."""
    runs = await five_dispatched(kit)
    for n, run_id in enumerate(runs[:3]):
        session_failed(kit, run_id, 800 + n)
        await kit.outcomes.on_workflow_run(kit.state, event(run_id, conclusion="failure"))
    assert kit.state.blocked() is not None
    late = runs[3]
    late_cand = next(d.candidate for d in kit.state.dispatches.values() if d.run_id == late)
    kit.repo.artifacts_of[late] = [Artifact(id=898, name=f"klaud-candidate-{late_cand}", expired=False,
                                            archive_download_url="x")]
    kit.repo.archives[898] = artifact_zip(DEFERRED)
    await kit.outcomes.on_workflow_run(kit.state, event(late))
    kit.clock.advance(3 * 3600)
    _, run_id, _ = await canary_after_a_push(kit)
    return run_id


async def canary_after_a_push(kit: Kit) -> tuple[str, int, str]:
    """A push to the default branch of a paused repository, then the wave of its canary:
    the canary's candidate, its run, and the pushed head."""
    head = "e" * 40
    kit.repo.files[head] = dict(kit.repo.files[kit.repo.head])
    await kit.catalog.on_push(kit.state, push("refs/heads/main", kit.repo.head, head))
    canary = await kit.waves.run(REPO, trigger="test")
    assert canary is not None and len(canary.selected) == 1
    [cand] = canary.selected
    run_id = next(d.run_id for d in kit.state.dispatches.values() if d.candidate == cand)
    assert run_id is not None
    return cand, run_id, head


def session_failed(kit: Kit, run_id: int, artifact_id: int) -> None:
    """The run failed in its session step and uploaded the workflow's fallback outcome."""
    kit.repo.jobs_of[run_id] = [Job(name="Klaud Cold", conclusion="failure",
                                    steps=(Step(name="Run the candidate session", conclusion="failure"),))]
    cand = next(d.candidate for d in kit.state.dispatches.values() if d.run_id == run_id)
    kit.repo.artifacts_of[run_id] = [Artifact(id=artifact_id, name=f"klaud-candidate-{cand}", expired=False,
                                              archive_download_url="x")]
    kit.repo.archives[artifact_id] = artifact_zip(FALLBACK)


async def test_a_canarys_fallback_read_on_a_retry_does_not_resume_dispatch(kit: Kit) -> None:
    # The canary's session failed at once again (the push did not fix it); its fallback
    # artifact's first download fails with a 502 and is read an hour later.
    canary_run = await paused_with_a_running_canary(kit)
    session_failed(kit, canary_run, 899)
    kit.repo.fail("download", Unavailable(502, "Bad Gateway"))
    await kit.outcomes.on_workflow_run(kit.state, event(canary_run, conclusion="failure"))
    assert kit.state.pending_artifacts
    kit.clock.advance(3600)
    assert await kit.outcomes.retry_artifacts_of(kit.state) == 1
    blocked = kit.state.blocked()
    assert blocked is not None and blocked.code == "dispatch-paused", "a fallback canary resumed dispatch"


async def three_sessions_failed_while_downloads_failed(kit: Kit) -> list[int]:
    """Five dispatched runs, three of which failed in their session step, each fallback's
    first download answered 502: the run ids."""
    runs = await five_dispatched(kit)
    for n, run_id in enumerate(runs[:3]):
        session_failed(kit, run_id, 800 + n)
        kit.repo.fail("download", Unavailable(502, "Bad Gateway"))
        await kit.outcomes.on_workflow_run(kit.state, event(run_id, conclusion="failure"))
    return runs


async def test_a_wave_whose_failed_sessions_are_read_on_a_retry_still_pauses_dispatch(kit: Kit) -> None:
    # As the session test above, but blob storage has a bad minute: each fallback's first
    # download gets a 502 (the dispatch ends with download-failed, which says nothing of the
    # run), and the reads an hour later find the three fallbacks, failed in one job.
    runs = await three_sessions_failed_while_downloads_failed(kit)
    assert kit.state.blocked() is None and len(kit.state.pending_artifacts) == 3
    kit.clock.advance(3600)
    assert await kit.outcomes.retry_artifacts_of(kit.state) == 3
    attempts = [a for a in kit.state.ledger.all() if a.run_id in runs[:3]]
    assert len(attempts) == 3 and all(a.verified and a.failed_job == "Klaud Cold" for a in attempts), attempts
    blocked = kit.state.blocked()
    assert blocked is not None and blocked.code == "dispatch-paused", kit.state.meta.wave_runs
    assert kit.state.meta.wave_runs["1"]["finished"] == 3, "a late read counts its run finished once"


async def test_a_failed_runs_broken_archive_read_on_a_retry_says_where_the_run_failed(kit: Kit) -> None:
    # Read at once, a failed run's broken archive is run-failed with its job (what the pause
    # counts and people need); read on a retry it must be the same.
    runs = await five_dispatched(kit)
    for n, run_id in enumerate(runs[:3]):
        session_failed(kit, run_id, 800 + n)
        kit.repo.archives[800 + n] = b"not a zip"
        kit.repo.fail("download", Unavailable(503, "Service Unavailable"))
        await kit.outcomes.on_workflow_run(kit.state, event(run_id, conclusion="failure"))
    kit.clock.advance(3600)
    await kit.outcomes.retry_artifacts_of(kit.state)
    attempts = [a for a in kit.state.ledger.all() if a.run_id in runs[:3]]
    assert {(a.error, a.failed_job, a.failed_step) for a in attempts} == {
        ("run-failed", "Klaud Cold", "Run the candidate session")}
    blocked = kit.state.blocked()
    assert blocked is not None and blocked.code == "dispatch-paused"


async def test_a_successful_runs_late_read_does_not_count_toward_the_pause(kit: Kit) -> None:
    runs = await five_dispatched(kit)
    for n, run_id in enumerate(runs[:3]):
        session_failed(kit, run_id, 800 + n)  # its fallback outcome, though the run succeeded
        kit.repo.fail("download", Unavailable(502, "Bad Gateway"))
        await kit.outcomes.on_workflow_run(kit.state, event(run_id, conclusion="success"))
    kit.clock.advance(3600)
    assert await kit.outcomes.retry_artifacts_of(kit.state) == 3
    assert kit.state.blocked() is None
    assert kit.state.meta.wave_runs["1"]["failed_jobs"] == {}


async def test_late_failures_of_a_wave_before_the_canarys_do_not_pause_dispatch_again(kit: Kit) -> None:
    # README (320ee56): "the waves before the canary's no longer count towards a pause".
    from bot.core.domain import Attempt, Dispatch

    await kit.reconciler.reconcile(REPO, 1)
    state = kit.state
    now = kit.clock.now()
    families = [f for f in state.catalog][:5]

    def failed(family, run_id: int, wave: int = 2) -> tuple[Dispatch, Attempt]:
        dispatch = Dispatch(family.id, family.candidate, wave, "a" * 40, now, run_id=run_id)
        attempt = Attempt(family.candidate, family.id, run_id, 1, "a" * 40, now, False, None, None, None, None,
                          "run-failed", "run", "get-jobs", None)
        return dispatch, attempt

    # Wave 1 paused dispatch; wave 2 had dispatched 5 runs before the fix (waves overlap).
    state.note_dispatched(1, 3)
    state.note_dispatched(2, 5)
    for n in range(3):
        state.note_finished(*failed(families[n], 100 + n, wave=1), now)
    assert state.meta.pause is not None
    state.meta.canary = {"armed": False, "candidate": families[4].candidate, "wave": 3}
    state.note_dispatched(3, 1)
    ok = Attempt(families[4].candidate, families[4].id, 300, 1, "a" * 40, now, True, "capacity-deferred",
                 "targeted", None, None, None)
    assert state.note_finished(Dispatch(families[4].id, families[4].candidate, 3, "a" * 40, now, run_id=300), ok, now) == "resumed"
    # Three of wave 2's runs, dispatched before the fix, now end failing in the same job.
    turns = []
    for n in range(3):
        dispatch, attempt = failed(families[n], 200 + n)
        turns.append(state.note_finished(dispatch, attempt, now))
    assert state.meta.pause is None, f"paused again by a wave before the canary's: {turns}"


async def test_the_disabled_block_keeps_its_date_when_memory_is_read_back_from_the_store(kit: Kit) -> None:
    # 97f74da: "the block is dated when Klaud first saw the file turn dispatch off". Stamped
    # only in memory by a read (blocked_now), a read-back (after an error, a restart) dates it anew,
    # and every check run and the dashboard change and are sent again.
    await kit.reconciler.reconcile(REPO, 1)
    before, after = kit.repo.head, "d" * 40
    kit.repo.files[after] = {**kit.repo.files[before], ".github/klaud.yml": "enabled: false\n"}
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    first = kit.state.blocked_now(kit.clock.now())
    assert first is not None
    kit.clock.advance(600)
    await kit.live.load_repo(REPO)  # a restart (or a replica taking over) reads the store
    again = kit.state.blocked_now(kit.clock.now())
    assert again is not None and again.since == first.since, (first.since, again.since)


async def test_plan_and_state_document_date_a_disabled_repository_alike(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    before, after = kit.repo.head, "d" * 40
    kit.repo.files[after] = {**kit.repo.files[before], ".github/klaud.yml": "enabled: false\n"}
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    kit.clock.advance(7200)
    document = kit.state.state_document(kit.clock.now())
    plan = await kit.waves.preview(REPO)
    assert plan is not None and plan.blocked is not None
    assert plan.document()["blocked"] == document["blocked"], (plan.document()["blocked"], document["blocked"])


async def test_another_runs_unreadable_outcome_does_not_end_the_canary_whose_run_is_still_queued(kit: Kit) -> None:
    # 320ee56 keeps the dispatch of our queued run when another run of its candidate ends;
    # the canary still ended on that other run's attempt, and our canary's outcome then
    # resumed nothing: dispatch stayed paused until a person pushed or commented.
    canary_run = await paused_with_a_running_canary(kit)
    cand = next(d.candidate for d in kit.state.dispatches.values() if d.run_id == canary_run)
    kit.repo.artifacts_of[556] = [Artifact(id=56, name=f"klaud-candidate-{cand}", expired=False, archive_download_url="x")]
    kit.repo.archives[56] = b"not a zip"
    await kit.outcomes.on_workflow_run(kit.state, event(556, title=f"Klaud Cold candidate {cand}"))
    assert any(d.run_id == canary_run for d in kit.state.dispatches.values())  # ours still in flight
    kit.repo.artifacts_of[canary_run] = [Artifact(id=57, name=f"klaud-candidate-{cand}", expired=False,
                                                  archive_download_url="x")]
    kit.repo.archives[57] = artifact_zip(DEFERRED)
    await kit.outcomes.on_workflow_run(kit.state, event(canary_run))
    assert kit.state.blocked() is None, f"the canary's own outcome did not resume dispatch: {kit.state.blocked()}"


async def test_another_runs_failure_does_not_end_the_canary_whose_read_is_retried(kit: Kit) -> None:
    canary_run = await paused_with_a_running_canary(kit)
    cand = next(d.candidate for d in kit.state.dispatches.values() if d.run_id == canary_run)
    kit.repo.artifacts_of[canary_run] = [Artifact(id=57, name=f"klaud-candidate-{cand}", expired=False,
                                                  archive_download_url="x")]
    kit.repo.archives[57] = artifact_zip(DEFERRED)
    kit.repo.fail("download", Unavailable(502, "Bad Gateway"))
    await kit.outcomes.on_workflow_run(kit.state, event(canary_run))  # its read waits for a retry
    assert kit.state.pending_artifacts
    # A person's run of the same candidate ends with an unreadable artifact meanwhile.
    kit.repo.artifacts_of[556] = [Artifact(id=56, name=f"klaud-candidate-{cand}", expired=False,
                                           archive_download_url="x")]
    kit.repo.archives[56] = b"not a zip"
    await kit.outcomes.on_workflow_run(kit.state, event(556, title=f"Klaud Cold candidate {cand}"))
    kit.clock.advance(3600)
    assert await kit.outcomes.retry_artifacts_of(kit.state) == 1
    assert kit.state.blocked() is None, f"the canary's own outcome resumed nothing: {kit.state.meta.canary}"


async def test_a_persons_pending_read_does_not_keep_a_canary_whose_own_run_gave_no_outcome(kit: Kit) -> None:
    # f9b9e7d keeps the canary while a read of *any* run of its candidate waits: a person's
    # run's read waited, the canary's own run ended without an outcome (the repository stays
    # paused, per note_canary_attempt), and the person's run's late outcome resumed dispatch.
    canary_run = await paused_with_a_running_canary(kit)
    cand = next(d.candidate for d in kit.state.dispatches.values() if d.run_id == canary_run)
    kit.repo.artifacts_of[556] = [Artifact(id=56, name=f"klaud-candidate-{cand}", expired=False, archive_download_url="x")]
    kit.repo.archives[56] = artifact_zip(DEFERRED)
    kit.repo.fail("download", Unavailable(502, "Bad Gateway"))
    await kit.outcomes.on_workflow_run(kit.state, event(556, title=f"Klaud Cold candidate {cand}"))
    assert kit.state.artifact_read_pending(cand, 556)
    await kit.outcomes.on_workflow_run(kit.state, event(canary_run))  # no artifact: no outcome
    assert not any(d.run_id == canary_run for d in kit.state.dispatches.values())
    kit.clock.advance(3600)
    assert await kit.outcomes.retry_artifacts_of(kit.state) == 1
    assert kit.state.blocked() is not None, "a person's run resumed dispatch after the canary's own run gave no outcome"


async def test_a_failure_counted_on_a_late_read_is_stored(kit: Kit) -> None:
    # Counted in memory only (stored when it paused), a restart or a takeover between two late
    # reads lost it, and three failures in one job never paused dispatch.
    await three_sessions_failed_while_downloads_failed(kit)
    kit.clock.advance(3600)
    entries = sorted(kit.state.pending_artifacts.items())
    for key, entry in entries[:2]:
        await kit.outcomes._retry_artifact(kit.state, key, entry)
    kit.live.drop(REPO)  # a restart, or another replica taking the repository over
    state = await kit.live.load_repo(REPO)
    assert state is not None and state.meta.wave_runs["1"]["failed_jobs"] == {"Klaud Cold": 2}
    await kit.outcomes.retry_artifacts_of(state)
    blocked = state.blocked()
    assert blocked is not None and blocked.code == "dispatch-paused", state.meta.wave_runs
