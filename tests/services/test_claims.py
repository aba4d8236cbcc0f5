"""Claims and runs never get stuck, against an in-memory repository (DESIGN §4)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest
import yaml

from bot.core.domain import Claim, claim_ref, stamp
from bot.core.events import (
    Artifact,
    Job,
    PushEvent,
    Step,
    WorkflowRun,
    WorkflowRunEvent,
)
from bot.github.errors import Conflict, Unavailable
from bot.services.claims import UNLINKED_CHECK_AFTER
from tests import scenarios as sc
from tests.services.conftest import REPO, Kit
from tests.services.crash import CrashKit
from tests.services.fakes import artifact_zip
from tests.services.test_outcomes import run_event
from tests.services.test_waves import paused_with_a_canary_armed

H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"
TTL = timedelta(hours=12)
OUTCOME = {"outcome": "incompatible", "phase": "targeted", "pull-request": None, "run-ids": [], "repairs-used": 0}


async def dispatched(kit: Kit, policy: str = "max_candidates_per_wave: 1\n") -> tuple[str, str, int]:
    """Reconcile with `policy`, run one wave; (family, candidate, run id) of its dispatch."""
    kit.repo.put_files({".github/klaud.yml": policy})
    await kit.reconciler.reconcile(REPO, 1)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None
    [cand] = wave.selected
    family = next(d.family for d in wave.decisions if d.candidate == cand)
    return family, cand, kit.state.dispatches[family].run_id or 0


def set_run(kit: Kit, run_id: int, **changes: object) -> None:
    kit.repo.runs[run_id] = kit.repo.runs[run_id].model_copy(update=changes)


async def test_nothing_due_costs_no_github_call(kit: Kit) -> None:
    await dispatched(kit)
    kit.repo.calls.clear()
    kit.clock.advance((TTL - timedelta(minutes=1)).total_seconds())
    await kit.claims.check_due(kit.state)
    assert kit.repo.calls == []


async def test_a_run_still_queued_at_the_ttl_keeps_its_claim_and_is_not_dispatched_again(kit: Kit) -> None:
    family, cand, run_id = await dispatched(kit)
    kit.clock.advance(TTL.total_seconds())
    kit.repo.calls.clear()
    await kit.claims.check_due(kit.state)
    assert kit.repo.calls == [("run", run_id)]
    assert kit.state.dispatches[family].run_status == "queued"
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and cand not in wave.selected
    assert next(d for d in wave.decisions if d.family == family).decision == "in-flight"
    assert [d["inputs"]["candidate"] for d in kit.repo.dispatched].count(cand) == 1
    kit.repo.calls.clear()
    await kit.claims.check_due(kit.state)  # read once per TTL, not every tick
    assert kit.repo.calls == []


async def test_a_run_that_completed_unseen_is_recorded_at_the_ttl(kit: Kit) -> None:
    family, cand, run_id = await dispatched(kit)
    set_run(kit, run_id, status="completed", conclusion="success", updated_at=kit.clock.now())
    kit.repo.artifacts_of[run_id] = [Artifact(id=5, name=f"klaud-candidate-{cand}", expired=False, archive_download_url="x")]
    kit.repo.archives[5] = artifact_zip(OUTCOME)
    kit.clock.advance(TTL.total_seconds())
    await kit.claims.check_due(kit.state)
    [attempt] = kit.state.ledger.for_candidate(cand)
    assert (attempt.outcome, attempt.run_id) == ("incompatible", run_id)
    assert family not in kit.state.dispatches and family not in kit.state.claims
    assert claim_ref(family) not in kit.repo.branches_at


async def test_a_run_github_no_longer_knows_releases_its_claim(kit: Kit) -> None:
    family, cand, run_id = await dispatched(kit)
    del kit.repo.runs[run_id]
    kit.clock.advance(TTL.total_seconds())
    await kit.claims.check_due(kit.state)
    assert family not in kit.state.claims and claim_ref(family) not in kit.repo.branches_at
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and cand in wave.selected


async def test_the_light_reconcile_recovers_a_lost_completed_delivery_before_the_ttl(kit: Kit) -> None:
    family, _, run_id = await dispatched(kit)
    set_run(kit, run_id, status="completed", conclusion="success", updated_at=kit.clock.now())
    kit.clock.advance(timedelta(hours=1).total_seconds())
    await kit.reconciler.reconcile(REPO, 1, light=True)
    [attempt] = [a for a in kit.state.ledger.all() if a.run_id == run_id]
    assert attempt.error == "artifact-missing"
    assert family not in kit.state.dispatches and family not in kit.state.claims


RULESET = Conflict(422, "Repository rule violations found\n\nCannot delete this branch")


async def test_a_claim_ref_github_will_not_delete_loses_no_outcome_and_fails_no_reconcile(kit: Kit) -> None:
    # What this catches: a ruleset forbidding branch deletions (422) failed the outcome's
    # delivery, so the outcome was lost, and failed every light reconcile of the repository,
    # hour after hour: the family stayed in flight and missed events were never caught up.
    family, cand, run_id = await dispatched(kit)
    set_run(kit, run_id, status="completed", conclusion="success", updated_at=kit.clock.now())
    kit.repo.artifacts_of[run_id] = [Artifact(id=5, name=f"klaud-candidate-{cand}", expired=False, archive_download_url="x")]
    kit.repo.archives[5] = artifact_zip(OUTCOME)
    kit.repo.fail("delete_branch", RULESET, times=1000)
    kit.clock.advance(timedelta(hours=1).total_seconds())
    await kit.reconciler.reconcile(REPO, 1, light=True)  # the run's own delivery was lost
    assert [a.outcome for a in kit.state.ledger.all() if a.run_id == run_id] == ["incompatible"]
    assert family not in kit.state.dispatches and family not in kit.state.claims
    assert kit.state.meta.reconciled_at == stamp(kit.clock.now())
    assert claim_ref(family) in kit.repo.branches_at  # left on GitHub, for the sweep to retry
    kit.repo.clear_failures("delete_branch")  # the ruleset is lifted
    for _ in range(2):  # listed as an orphan, then deleted once older than a wave
        kit.clock.advance(timedelta(hours=3).total_seconds())
        await kit.reconciler.reconcile(REPO, 1, light=True)
    assert claim_ref(family) not in kit.repo.branches_at


async def test_an_orphan_claim_ref_is_deleted_after_a_wave_without_runs(kit: Kit) -> None:
    # A crash between claim and dispatch: the ref exists on GitHub, nothing local knows it.
    kit.repo.put_files({".github/klaud.yml": "max_candidates_per_wave: 1\n"})
    await kit.reconciler.reconcile(REPO, 1)
    preview = await kit.waves.preview(REPO)
    assert preview is not None
    first = preview.decisions[0]
    kit.repo.branches_at[claim_ref(first.family)] = kit.repo.head
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and next(d for d in wave.decisions if d.family == first.family).decision == "claimed"
    await kit.reconciler.reconcile(REPO, 1, light=True)
    assert claim_ref(first.family) in kit.repo.branches_at  # younger than one wave: kept
    kit.clock.advance(timedelta(minutes=121).total_seconds())
    await kit.reconciler.reconcile(REPO, 1, light=True)
    assert claim_ref(first.family) not in kit.repo.branches_at
    again = await kit.waves.run(REPO, trigger="test")
    assert again is not None and first.candidate in again.selected
    dispatched_candidates = [d["inputs"]["candidate"] for d in kit.repo.dispatched]
    assert len(dispatched_candidates) == len(set(dispatched_candidates))  # nothing twice


@pytest.mark.parametrize("run_age", [timedelta(0), timedelta(days=3)])
async def test_an_orphan_claim_whose_run_is_in_flight_is_adopted(kit: Kit, run_age: timedelta) -> None:
    # The run exists and names its candidate: a crash after the dispatch, before it was
    # stored; or a claim found on GitHub (another planner's, or after the store was lost),
    # as new as its listing while its run started days before. Deleting the claim would
    # dispatch the family again beside that run.
    await kit.reconciler.reconcile(REPO, 1)
    cand = sc.candidate(H200)
    kit.repo.branches_at[claim_ref(H200)] = kit.repo.head
    kit.repo.runs[77] = WorkflowRun(
        id=77, path=".github/workflows/klaud-candidate.yml", head_sha=kit.repo.head, status="in_progress",
        display_title=f"Klaud Cold candidate {cand}", created_at=kit.clock.now() - run_age,
    )
    await kit.reconciler.reconcile(REPO, 1, light=True)
    kit.clock.advance(timedelta(minutes=121).total_seconds())
    await kit.claims.check_due(kit.state)
    assert kit.state.dispatches[H200].run_id == 77
    assert claim_ref(H200) in kit.repo.branches_at


async def test_without_a_run_id_in_the_answer_the_run_is_found_by_its_title(kit: Kit) -> None:
    kit.repo.answer_run_ids = False  # an older GitHub answers 204
    family, _, _ = await dispatched(kit)
    assert kit.state.dispatches[family].run_id is None
    kit.clock.advance((UNLINKED_CHECK_AFTER - timedelta(seconds=1)).total_seconds())
    await kit.claims.check_due(kit.state)
    assert kit.state.dispatches[family].run_id is None  # its workflow_run event may still link it
    kit.clock.advance(1)
    await kit.claims.check_due(kit.state)  # it did not: looked up, not left until the TTL
    dispatch = kit.state.dispatches[family]
    assert dispatch.run_id is not None and dispatch.run_status == "queued"


async def test_an_unlinked_dispatch_whose_run_completed_unseen_gets_its_outcome(kit: Kit) -> None:
    kit.repo.answer_run_ids = False
    family, cand, _ = await dispatched(kit)
    [run_id] = [d["run_id"] for d in kit.repo.dispatched]
    set_run(kit, run_id, status="completed", conclusion="success", updated_at=kit.clock.now())
    kit.repo.artifacts_of[run_id] = [Artifact(id=5, name=f"klaud-candidate-{cand}", expired=False, archive_download_url="x")]
    kit.repo.archives[5] = artifact_zip(OUTCOME)
    kit.clock.advance(UNLINKED_CHECK_AFTER.total_seconds())
    await kit.claims.check_due(kit.state)  # every workflow_run delivery of it was lost
    [attempt] = kit.state.ledger.for_candidate(cand)
    assert (attempt.verified, attempt.outcome, attempt.run_id) == (True, "incompatible", run_id)
    assert family not in kit.state.dispatches and claim_ref(family) not in kit.repo.branches_at


async def test_an_unlinked_dispatch_without_a_run_is_kept_a_while_then_released(kit: Kit) -> None:
    kit.repo.answer_run_ids = False
    family, _, _ = await dispatched(kit)
    kit.repo.runs.clear()  # the dispatch never started a run
    await kit.reconciler.reconcile(REPO, 1, light=True)  # seconds later: GitHub may not list it yet
    assert family in kit.state.dispatches and claim_ref(family) in kit.repo.branches_at
    kit.clock.advance(UNLINKED_CHECK_AFTER.total_seconds())
    await kit.claims.check_due(kit.state)
    assert family not in kit.state.dispatches and claim_ref(family) not in kit.repo.branches_at


async def test_a_late_event_of_an_earlier_run_of_the_candidate_is_not_taken_for_the_new_dispatch(kit: Kit) -> None:
    kit.repo.answer_run_ids = False  # nothing links the dispatch but a run titled with its candidate
    family, cand, _ = await dispatched(kit)
    dispatch = kit.state.dispatches[family]

    def started(run_id: int, created: datetime) -> WorkflowRunEvent:
        return WorkflowRunEvent.model_validate({
            "action": "in_progress",
            "workflow_run": {"id": run_id, "path": ".github/workflows/klaud-candidate.yml", "head_sha": "a" * 40,
                             "status": "in_progress", "display_title": f"Klaud Cold candidate {cand}",
                             "created_at": created.isoformat(), "updated_at": created.isoformat()},
            "repository": {"full_name": REPO}, "installation": {"id": 1},
        })

    # Yesterday's run of the same candidate, its event delivered only now: linked, its
    # outcome would have stood for this dispatch's.
    await kit.outcomes.on_workflow_run(kit.state, started(501, dispatch.at - timedelta(days=1)))
    assert kit.state.dispatches[family].run_id is None
    await kit.outcomes.on_workflow_run(kit.state, started(502, dispatch.at + timedelta(seconds=5)))
    assert kit.state.dispatches[family].run_id == 502


def run_requested(kit: Kit, run_id: int) -> WorkflowRunEvent:
    """The "requested" delivery of run `run_id`, as GitHub sent it when the run was queued."""
    return run_event(kit, run_id, "requested", status="queued", conclusion=None)


async def waiting_for_the_lock(kit: Kit, task: asyncio.Task[None]) -> None:
    """Until `task` waits for the repository's lock, which another section holds."""
    for _ in range(100):
        if kit.live._locks._locks.get(REPO.lower(), (None, 0))[1] == 2:  # its holder and `task`
            return
        await asyncio.sleep(0)
    raise AssertionError(f"the task never waited for the lock (done: {task.done()})")


async def test_a_late_requested_event_of_a_run_the_keeper_just_settled_does_nothing(kit: Kit) -> None:
    # The keeper settles an unlinked dispatch whose run failed (holding the lock while it reads
    # the run's jobs); the run's "requested" delivery, processed meanwhile beside it, linked
    # the dispatch the keeper had dropped: a KeyError, and the delivery failed for good.
    kit.repo.answer_run_ids = False  # an older GitHub answers 204: the dispatch is unlinked
    family, cand, _ = await dispatched(kit)
    [run_id] = [d["run_id"] for d in kit.repo.dispatched]
    created = kit.state.dispatches[family].at + timedelta(seconds=3)
    set_run(kit, run_id, status="completed", conclusion="failure", created_at=created,
            updated_at=created + timedelta(seconds=20))
    kit.repo.jobs_of[run_id] = [Job(name="get-jobs", conclusion="failure", steps=(Step(name="Validate", conclusion="failure"),))]
    kit.clock.advance(UNLINKED_CHECK_AFTER.total_seconds())
    reading_jobs, go_on = asyncio.Event(), asyncio.Event()
    real_run_jobs = kit.repo.run_jobs

    async def slow_run_jobs(rid: int) -> list[Job]:
        reading_jobs.set()
        await go_on.wait()
        return await real_run_jobs(rid)

    kit.repo.run_jobs = slow_run_jobs  # type: ignore[method-assign]
    keeper = asyncio.create_task(kit.claims.check_due(kit.state))
    await reading_jobs.wait()
    delivery = asyncio.create_task(kit.outcomes.on_workflow_run(kit.state, run_requested(kit, run_id)))
    await waiting_for_the_lock(kit, delivery)
    go_on.set()
    await keeper
    await delivery

    assert family not in kit.state.dispatches and family not in kit.state.claims
    assert [a.error for a in kit.state.ledger.for_candidate(cand)] == ["run-failed"]


async def test_a_late_requested_event_does_not_relink_a_dispatch_linked_while_it_waited(kit: Kit) -> None:
    kit.repo.answer_run_ids = False
    family, _, _ = await dispatched(kit)
    [run_id] = [d["run_id"] for d in kit.repo.dispatched]
    # A second run titled with the candidate (a person dispatched it too), after ours.
    kit.repo.runs[run_id + 1] = kit.repo.runs[run_id].model_copy(
        update={"id": run_id + 1, "created_at": kit.state.dispatches[family].at + timedelta(seconds=9)}
    )
    async with kit.live.lock(REPO):
        delivery = asyncio.create_task(kit.outcomes.on_workflow_run(kit.state, run_requested(kit, run_id + 1)))
        await waiting_for_the_lock(kit, delivery)
        # Whoever held the lock (the claim keeper) found the dispatch's own run meanwhile.
        await kit.live.persist(kit.state.link_run(family, run_id))
    await delivery

    assert kit.state.dispatches[family].run_id == run_id


async def test_a_started_run_no_dispatch_waits_for_does_not_wait_for_the_repositorys_lock(kit: Kit) -> None:
    # Most runs are no unlinked dispatch's: their event must not queue behind a wave that
    # holds the lock through its GitHub calls.
    family, _, run_id = await dispatched(kit)  # linked by the dispatch's answer
    async with kit.live.lock(REPO):
        await asyncio.wait_for(kit.outcomes.on_workflow_run(kit.state, run_requested(kit, run_id)), 5)
    assert kit.state.dispatches[family].run_id == run_id


# Found by an audit of time: with our clock two minutes ahead of GitHub's, the failure was lost.


def completed_event(run) -> WorkflowRunEvent:  # type: ignore[no-untyped-def]
    return WorkflowRunEvent.model_validate({
        "action": "completed",
        "workflow_run": run.model_dump(mode="json"),
        "repository": {"full_name": REPO}, "installation": {"id": 1},
    })


async def broken_run_of_unlinked_dispatch(kit: Kit, github_offset: timedelta) -> tuple[str, str]:
    """An older GitHub answers 204 (no run id); the run it starts fails at start-up.
    `github_offset`: GitHub's clock minus ours."""
    kit.repo.answer_run_ids = False
    family, cand, _ = await dispatched(kit)
    [run_id] = [d["run_id"] for d in kit.repo.dispatched]
    created = kit.state.dispatches[family].at + github_offset + timedelta(seconds=3)
    set_run(kit, run_id, status="completed", conclusion="failure", created_at=created,
            updated_at=created + timedelta(seconds=20))
    kit.repo.jobs_of[run_id] = [Job(name="get-jobs", conclusion="failure", steps=(Step(name="Validate", conclusion="failure"),))]
    kit.clock.advance(25)
    await kit.outcomes.on_workflow_run(kit.state, completed_event(kit.repo.runs[run_id]))  # delivered fine
    return family, cand


async def test_the_start_up_failure_of_an_unlinked_dispatch_is_recorded(kit: Kit) -> None:
    _, cand = await broken_run_of_unlinked_dispatch(kit, timedelta(0))
    assert [a.error for a in kit.state.ledger.for_candidate(cand)] == ["run-failed"]


async def test_the_start_up_failure_of_an_unlinked_dispatch_is_recorded_with_our_clock_ahead_of_githubs(kit: Kit) -> None:
    family, cand = await broken_run_of_unlinked_dispatch(kit, -timedelta(minutes=2))
    kit.clock.advance(UNLINKED_CHECK_AFTER.total_seconds())
    await kit.claims.check_due(kit.state)
    await kit.reconciler.reconcile(REPO, 1, light=True)
    attempts = kit.state.ledger.for_candidate(cand)
    assert [a.error for a in attempts] == ["run-failed"], (
        f"the run's start-up failure was never recorded (attempts={attempts}); the family is "
        f"{'still in flight' if family in kit.state.dispatches else 'released for the next wave'}"
    )


async def test_the_claim_ref_of_a_family_removed_from_the_configs_is_deleted_too(kit: Kit) -> None:
    # A claim made elsewhere, then its family removed by a push: the claim is still an
    # orphan to settle, not a ref nobody will ever look at again.
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.branches_at[claim_ref(H200)] = kit.repo.head
    await kit.reconciler.reconcile(REPO, 1, light=True)
    assert H200 in kit.state.claims
    configs = yaml.safe_load(sc.NVIDIA)
    del configs[H200.split(":", 1)[1]]
    kit.repo.put_files({"configs/nvidia-master.yaml": yaml.safe_dump(configs)})
    await kit.reconciler.reconcile(REPO, 1)
    assert H200 not in kit.state.catalog
    await kit.reconciler.reconcile(REPO, 1, light=True)
    assert claim_ref(H200) in kit.repo.branches_at  # younger than one wave: kept
    kit.clock.advance(timedelta(minutes=121).total_seconds())
    await kit.reconciler.reconcile(REPO, 1, light=True)
    assert claim_ref(H200) not in kit.repo.branches_at and H200 not in kit.state.claims


async def test_a_stray_whose_family_came_back_is_a_claim_again_not_deleted(kit: Kit) -> None:
    # The strays are as old as the last listing (a light reconcile): a family back in the
    # configs since, claimed afresh elsewhere, keeps its ref for the orphan rule's wave.
    await kit.reconciler.reconcile(REPO, 1)
    first, second, third = kit.repo.head, "a" * 40, "b" * 40
    configs = yaml.safe_load(sc.NVIDIA)
    del configs[H200.split(":", 1)[1]]
    kit.repo.files[second] = {**kit.repo.files[first], "configs/nvidia-master.yaml": yaml.safe_dump(configs)}
    kit.repo.files[third] = dict(kit.repo.files[first])
    await pushed(kit, second)  # the family removed
    kit.repo.branches_at[claim_ref(H200)] = second
    await kit.reconciler.reconcile(REPO, 1, light=True)  # its leftover ref noted as a stray
    assert set(kit.state.meta.stray_refs) == {claim_ref(H200).removeprefix("klaud/claim-")}
    del kit.repo.branches_at[claim_ref(H200)]
    await pushed(kit, third)  # the family is back
    other = next(family.id for family in kit.state.catalog if family.id != H200)
    kit.clock.advance(60)
    claim_elsewhere(kit, other)  # an orphan by the time of the check below
    kit.clock.advance(timedelta(minutes=99).total_seconds())
    claim_elsewhere(kit, H200)  # claimed anew, its run not listed yet
    kit.clock.advance(timedelta(minutes=21).total_seconds())

    await kit.claims.check_due(kit.state)  # due for the orphan; the stray is a wave old

    assert claim_ref(other) not in kit.repo.branches_at
    assert claim_ref(H200) in kit.repo.branches_at and H200 in kit.state.claims


async def pushed(kit: Kit, head: str) -> None:
    """A push of `head` to the default branch, as its event reaches Klaud."""
    before, kit.repo.head = kit.repo.head, head
    event = PushEvent.model_validate({
        "ref": "refs/heads/main", "before": before, "after": head, "deleted": False,
        "repository": {"full_name": REPO, "pushed_at": int(kit.clock.now().timestamp())},
        "installation": {"id": 1}, "sender": {"login": "a-maintainer"},
    })
    await kit.catalog.on_push(kit.state, event)


def claim_elsewhere(kit: Kit, family: str) -> None:
    """A claim ref made by another planner, as its push makes it known here."""
    kit.repo.branches_at[claim_ref(family)] = kit.repo.head
    known = kit.state.catalog.get(family)
    assert known is not None
    kit.state.claims[family] = Claim(family, known.candidate, None, claim_ref(family), kit.clock.now())


async def test_a_claim_ref_naming_no_known_family_is_deleted_once_a_wave_old_without_a_run(kit: Kit) -> None:
    # Removed from the configs while another planner held it, or left when the store was
    # lost: no claim here names it, and no wave will ever settle it.
    await kit.reconciler.reconcile(REPO, 1)
    stray, running = "klaud/claim-0123456789abcdef", "klaud/claim-fedcba9876543210"
    kit.repo.branches_at[stray] = kit.repo.head
    kit.repo.branches_at[running] = kit.repo.head
    kit.repo.runs[78] = WorkflowRun(
        id=78, path=".github/workflows/klaud-candidate.yml", head_sha=kit.repo.head, status="queued",
        display_title="Klaud Cold candidate fedcba9876543210-0000000000000001", created_at=kit.clock.now(),
    )
    await kit.reconciler.reconcile(REPO, 1, light=True)
    kit.clock.advance(timedelta(minutes=119).total_seconds())
    await kit.reconciler.reconcile(REPO, 1, light=True)
    assert {stray, running} <= set(kit.repo.branches_at)  # younger than one wave: kept
    kit.clock.advance(timedelta(minutes=2).total_seconds())
    await kit.reconciler.reconcile(REPO, 1, light=True)
    assert stray not in kit.repo.branches_at
    assert running in kit.repo.branches_at  # its run is still in flight
    set_run(kit, 78, status="completed", conclusion="failure")
    await kit.reconciler.reconcile(REPO, 1, light=True)
    assert running not in kit.repo.branches_at


async def test_a_stray_claim_ref_is_deleted_a_wave_after_it_was_first_listed_across_restarts(ck: CrashKit) -> None:
    # When it was first listed is stored: restarts (or owners changing) more often than a
    # wave must not keep it waiting forever.
    process = await ck.boot()
    await process.reconciler.reconcile(REPO, 1)
    stray = "klaud/claim-0123456789abcdef"
    ck.repo.branches_at[stray] = ck.repo.head
    await process.reconciler.reconcile(REPO, 1, light=True)
    for _ in range(2):
        ck.clock.advance(timedelta(minutes=50).total_seconds())
        process = await ck.restart()
        await process.reconciler.reconcile(REPO, 1, light=True)
    assert stray in ck.repo.branches_at  # 100 minutes: younger than a wave
    ck.clock.advance(timedelta(minutes=21).total_seconds())
    process = await ck.restart()
    await process.reconciler.reconcile(REPO, 1, light=True)
    assert stray not in ck.repo.branches_at
    assert process.state.meta.stray_refs == {}


async def test_a_claim_whose_ref_was_deleted_elsewhere_is_dropped_unless_a_dispatch_keeps_it(kit: Kit) -> None:
    # DESIGN §4 "Claims and runs never get stuck": the light reconcile lists the claim refs;
    # a claim made elsewhere whose ref is gone no longer claims the family, while a family
    # with a dispatch of ours stays in flight even if someone deleted its ref.
    family, _, _ = await dispatched(kit)
    preview = await kit.waves.preview(REPO)
    assert preview is not None
    other = next(d.family for d in preview.decisions if d.family != family and d.decision != "in-flight")
    kit.repo.branches_at[claim_ref(other)] = kit.repo.head  # another planner's claim
    await kit.reconciler.reconcile(REPO, 1, light=True)
    assert other in kit.state.claims and kit.state.claims[other].wave is None
    del kit.repo.branches_at[claim_ref(other)]
    del kit.repo.branches_at[claim_ref(family)]
    await kit.reconciler.reconcile(REPO, 1, light=True)
    assert other not in kit.state.claims
    assert family in kit.state.claims and family in kit.state.dispatches


async def test_claims_found_on_github_carry_their_own_familys_candidate(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    preview = await kit.waves.preview(REPO)
    assert preview is not None
    families = [d.family for d in preview.decisions[:3]]
    for family in families:
        kit.repo.branches_at[claim_ref(family)] = kit.repo.head
    await kit.reconciler.reconcile(REPO, 1, light=True)
    for family in families:
        assert kit.state.claims[family].candidate == kit.state.catalog.get(family).candidate, family



async def test_a_completed_run_whose_only_outcome_is_another_candidates_releases_its_claim(kit: Kit) -> None:
    # The run's artifact answers for some other candidate: its outcome is recorded for that
    # one, and this dispatch, left with no attempt of its own, must not stay in flight.
    family, cand, run_id = await dispatched(kit)
    other = next(f.candidate for f in kit.state.catalog if f.id != family)
    set_run(kit, run_id, status="completed", conclusion="success", updated_at=kit.clock.now())
    kit.repo.artifacts_of[run_id] = [Artifact(id=6, name=f"klaud-candidate-{other}", expired=False, archive_download_url="x")]
    kit.repo.archives[6] = artifact_zip(OUTCOME)
    kit.clock.advance(TTL.total_seconds())
    await kit.claims.check_due(kit.state)
    assert kit.state.ledger.for_candidate(cand) == []
    assert family not in kit.state.dispatches and family not in kit.state.claims
    assert claim_ref(family) not in kit.repo.branches_at


async def test_unlinked_dispatches_of_two_waves_each_find_their_completed_run(kit: Kit) -> None:
    # Runs are looked up from the oldest unlinked dispatch on: from the newest, the older
    # dispatch's run would be taken for absent and its outcome lost with its claim.
    kit.repo.answer_run_ids = False
    await dispatched(kit)
    kit.clock.advance(timedelta(hours=2).total_seconds())
    second_wave = await kit.waves.run(REPO, trigger="test")
    assert second_wave is not None and len(second_wave.selected) == 1
    made = {d.candidate: d.at for d in kit.state.dispatches.values()}
    assert len(set(made.values())) == 2
    for dispatch in kit.repo.dispatched:
        at = made[dispatch["inputs"]["candidate"]]
        set_run(kit, dispatch["run_id"], status="completed", conclusion="success", created_at=at, updated_at=at)
    kit.clock.advance(UNLINKED_CHECK_AFTER.total_seconds())
    await kit.claims.check_due(kit.state)
    recorded = {a.candidate: a.run_id for a in kit.state.ledger.all()}
    assert recorded == {d["inputs"]["candidate"]: d["run_id"] for d in kit.repo.dispatched}
    assert kit.state.dispatches == {}


async def test_a_canary_whose_dispatch_started_no_run_is_armed_again(kit: Kit) -> None:
    await paused_with_a_canary_armed(kit)
    # GitHub's answer to the canary's dispatch is lost; it started no run.
    kit.repo.fail("dispatch", Unavailable(502, "Bad Gateway", maybe_applied=True))
    assert await kit.waves.run(REPO, trigger="schedule") is not None
    assert kit.repo.dispatched == [] and not kit.state.canary_armed

    kit.clock.advance(UNLINKED_CHECK_AFTER.total_seconds())
    await kit.claims.check_due(kit.state)  # no run of it: its claim is released
    assert kit.state.dispatches == {} and kit.state.canary_armed
    assert (await kit.live.store.get("", "repo", REPO))["canary"]["armed"]  # stored with the release

    kit.clock.advance(2 * 3600)
    later = await kit.waves.run(REPO, trigger="schedule")
    assert later is not None and len(later.selected) == 1 and len(kit.repo.dispatched) == 1  # the canary


async def retry_dispatched(kit: Kit, *, answer_lost: bool = False) -> tuple[str, str]:
    """A candidate cooling down, approved by `/klaud retry` and dispatched: (family, candidate).
    `answer_lost`: GitHub's answer to the dispatch is lost, and no run came of it."""
    from bot.services import controls
    from tests.services.test_long_running import failed

    await kit.reconciler.reconcile(REPO, 1)
    family = kit.state.catalog.get("configs/nvidia-master.yaml:dsr1-fp8-h200-trt")
    kit.state.record_attempt(failed(family.candidate, 501, kit.clock.now()))  # cooling down
    await controls.approve_retry(kit.live, kit.state, family, "alice", kit.clock.now())
    if answer_lost:
        kit.repo.fail("dispatch", Unavailable(502, "Bad Gateway", maybe_applied=True))
    wave = await kit.waves.run(REPO, trigger="schedule")
    assert wave is not None and family.candidate in wave.selected
    assert family.candidate not in kit.state.retries  # used by the dispatch
    return family.id, family.candidate


async def test_a_retry_whose_dispatch_started_no_run_is_pending_again(kit: Kit) -> None:
    family, candidate = await retry_dispatched(kit, answer_lost=True)
    restarted = await kit.live.load_repo(REPO)  # what the dispatch used is stored with it
    assert restarted is not None and restarted.dispatches[family].approval.by == "alice"

    kit.clock.advance(UNLINKED_CHECK_AFTER.total_seconds())
    await kit.claims.check_due(kit.state)  # no run of it: its claim is released

    assert kit.state.retries[candidate].by == "alice"
    assert candidate in (await kit.live.store.load(REPO))["retry"]
    kit.clock.advance(2 * 3600)
    later = await kit.waves.run(REPO, trigger="schedule")
    assert later is not None and candidate in later.selected  # the person's retry, sent
    assert len(kit.repo.dispatched) == 5 and candidate not in kit.state.retries


async def test_a_retry_whose_dispatch_started_no_run_is_not_given_back_once_its_image_changed(kit: Kit) -> None:
    from tests.services.test_catalog_sync import push

    image = "nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc4"
    h200, _ = await retry_dispatched(kit, answer_lost=True)
    before, after = kit.repo.head, "b" * 40  # the image is bumped meanwhile: a new candidate
    kit.repo.files[after] = {**kit.repo.files[before], "configs/nvidia-master.yaml": sc.NVIDIA.replace(image, image + "x")}
    kit.repo.head = after
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))

    kit.clock.advance(UNLINKED_CHECK_AFTER.total_seconds())
    await kit.claims.check_due(kit.state)

    assert kit.state.dispatches.get(h200) is None and kit.state.retries == {}


async def test_a_retry_whose_run_started_and_was_linked_by_its_event_is_not_given_back(kit: Kit) -> None:
    kit.repo.answer_run_ids = False  # GitHub Enterprise Server: 204, the run linked by its event
    family, candidate = await retry_dispatched(kit)
    [sent] = [d for d in kit.repo.dispatched if d["inputs"]["candidate"] == candidate]
    await kit.outcomes.on_workflow_run(kit.state, run_requested(kit, sent["run_id"]))  # the run started
    assert kit.state.dispatches[family].run_id == sent["run_id"]
    assert kit.state.dispatches[family].approval is None, "approval kept after its run was linked"


async def test_a_retry_whose_linked_run_was_deleted_is_not_given_back(kit: Kit) -> None:
    kit.repo.answer_run_ids = False
    family, candidate = await retry_dispatched(kit)
    [sent] = [d for d in kit.repo.dispatched if d["inputs"]["candidate"] == candidate]
    await kit.outcomes.on_workflow_run(kit.state, run_requested(kit, sent["run_id"]))  # the run started
    del kit.repo.runs[sent["run_id"]]  # a person deleted the run meanwhile
    kit.clock.advance(TTL.total_seconds())
    await kit.claims.check_due(kit.state)  # the linked run is absent: the claim is released
    assert family not in kit.state.dispatches
    # The retry was spent on a run that did start; with a 200 answer (linked at once) it is not
    # given back (control test below): the two must agree.
    assert candidate not in kit.state.retries


async def test_a_retry_whose_run_linked_by_the_dispatchs_answer_was_deleted_is_not_given_back(kit: Kit) -> None:
    family, candidate = await retry_dispatched(kit)
    run_id = kit.state.dispatches[family].run_id
    assert run_id is not None
    del kit.repo.runs[run_id]
    kit.clock.advance(TTL.total_seconds())
    await kit.claims.check_due(kit.state)
    assert family not in kit.state.dispatches and candidate not in kit.state.retries


async def test_a_canary_whose_run_started_and_was_deleted_is_not_armed_again(kit: Kit) -> None:
    # DESIGN §4: "if its run produces an outcome, dispatch resumes, else it stays paused".
    await paused_with_a_canary_armed(kit)
    assert await kit.waves.run(REPO, trigger="schedule") is not None
    [dispatch] = kit.state.dispatches.values()
    assert dispatch.run_id is not None  # GitHub's 200 answer named its run: a run started
    del kit.repo.runs[dispatch.run_id]
    kit.clock.advance(TTL.total_seconds())
    await kit.claims.check_due(kit.state)
    assert kit.state.dispatches == {}
    assert not kit.state.canary_armed
