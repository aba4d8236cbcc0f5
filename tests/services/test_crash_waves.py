"""A wave killed after its dispatches and before its commit: the restart must neither spend
more slots than the policy allows nor use a `/klaud retry` or a canary twice."""

from __future__ import annotations

import pytest

from bot.core.domain import Family, claim_ref, parse_time
from bot.core.events import WorkflowRunEvent
from bot.github.errors import Unavailable
from bot.services import controls
from tests.services.conftest import REPO
from tests.services.crash import INCOMPATIBLE, CrashKit, Killed, Process, wave_commit


async def wave_killed_at_its_commit(ck: CrashKit, process: Process) -> None:
    process.die_at_commit(wave_commit)
    with pytest.raises(Killed):
        await process.waves.run(REPO, trigger="schedule")
    await ck.kill()


def completed(ck: CrashKit, run_id: int) -> WorkflowRunEvent:
    run = ck.repo.runs[run_id]
    return WorkflowRunEvent.model_validate({
        "action": "completed", "workflow_run": run.model_dump(mode="json"),
        "repository": {"full_name": REPO}, "installation": {"id": 1},
    })


async def run_ends_incompatible(ck: CrashKit, process: Process, candidate: str, artifact_id: int) -> None:
    run_id = [d for d in ck.repo.dispatched if d["inputs"]["candidate"] == candidate][-1]["run_id"]
    ck.complete_run(run_id, INCOMPATIBLE, artifact_id)
    await process.outcomes.on_workflow_run(process.state, completed(ck, run_id))


async def cooling_down(ck: CrashKit) -> tuple[Process, str, Family]:
    """A process whose first wave's first candidate ended `incompatible` (cooling down)."""
    process = await ck.boot()
    await process.reconciler.reconcile(REPO, 1)
    candidate = (await process.waves.run(REPO, trigger="test")).selected[0]
    family = process.state.catalog.get(process.state.family_of_candidate(candidate) or "")
    assert family is not None
    await run_ends_incompatible(ck, process, candidate, 601)
    return process, candidate, family


async def test_a_wave_run_again_after_a_crash_spends_no_slot_twice(ck: CrashKit) -> None:
    ck.repo.put_files({".github/klaud.yml": "max_in_flight: 2\nmax_candidates_per_wave: 5\n"})
    process = await ck.boot()
    await process.reconciler.reconcile(REPO, 1)
    await wave_killed_at_its_commit(ck, process)
    assert len(ck.runs_in_flight()) == 2

    process = await ck.restart()
    # What was about to be dispatched was committed first: the store knows both.
    assert set(process.state.dispatches) == set(process.state.claims) and len(process.state.claims) == 2
    wave = await process.waves.run(REPO, trigger="schedule")

    assert wave.selected == () and len(ck.runs_in_flight()) == 2
    assert all(ck.dispatches_of(d["inputs"]["candidate"]) == 1 for d in ck.repo.dispatched)
    assert process.state.meta.wave == 2, "the dead wave's number is not given to the next one"


async def test_a_claim_ref_someone_else_holds_counts_as_in_flight(ck: CrashKit) -> None:
    ck.repo.put_files({".github/klaud.yml": "max_in_flight: 1\n"})
    process = await ck.boot()
    await process.reconciler.reconcile(REPO, 1)
    first = (await process.waves.preview(REPO)).decisions[0]
    ck.repo.branches_at[claim_ref(first.family)] = "f" * 40  # another planner's claim

    wave = await process.waves.run(REPO, trigger="schedule")

    assert wave.selected == () and ck.repo.dispatched == []
    assert next(d for d in wave.decisions if d.family == first.family).decision == "claimed"


async def test_a_retry_used_by_a_wave_that_died_gives_one_extra_dispatch(ck: CrashKit) -> None:
    process, candidate, family = await cooling_down(ck)
    ck.clock.advance(3600)
    await controls.approve_retry(process.live, process.state, family, "alice", ck.clock.now())
    await wave_killed_at_its_commit(ck, process)
    assert ck.dispatches_of(candidate) == 2  # the retry went out, then the process died

    process = await ck.restart()
    assert candidate not in process.state.retries, "the approval was used, and that is stored"
    await process.waves.run(REPO, trigger="schedule")
    await run_ends_incompatible(ck, process, candidate, 602)
    ck.clock.advance(2 * 3600 + 120)
    later = await process.waves.run(REPO, trigger="schedule")

    assert ck.dispatches_of(candidate) == 2
    assert next(d for d in later.decisions if d.candidate == candidate).decision == "cooldown"


async def test_a_canary_wave_that_died_sent_the_only_canary(ck: CrashKit) -> None:
    process = await ck.boot()
    await process.reconciler.reconcile(REPO, 1)
    async with process.live.lock(REPO):
        process.state.meta.pause = {"reason": "dispatch paused: 3 of 3 runs failed", "since": "2026-11-30T07:00:00Z"}
        assert process.state.arm_canary()
        await process.live.persist(process.state.save_meta())
    await wave_killed_at_its_commit(ck, process)
    [canary] = [d["inputs"]["candidate"] for d in ck.repo.dispatched]

    process = await ck.restart()
    assert process.state.canary_running() == canary
    await process.waves.run(REPO, trigger="schedule")

    assert [d["inputs"]["candidate"] for d in ck.repo.dispatched] == [canary]
    # Its outcome still ends the pause's canary (recognised as the canary).
    await run_ends_incompatible(ck, process, canary, 701)
    assert process.state.canary_running() is None


async def test_a_refused_dispatch_gives_back_its_retry_and_its_claim(ck: CrashKit) -> None:
    from bot.github.errors import GitHubError

    process, candidate, family = await cooling_down(ck)
    await controls.approve_retry(process.live, process.state, family, "alice", ck.clock.now())
    ck.clock.advance(2 * 3600 + 120)
    ck.repo.fail("dispatch", GitHubError(422, "Unexpected inputs provided"), times=10)

    await process.waves.run(REPO, trigger="schedule")

    assert candidate in process.state.retries and family.id not in process.state.claims
    assert claim_ref(family.id) not in ck.repo.branches_at
    process = await ck.restart()
    assert candidate in process.state.retries and family.id not in process.state.dispatches


async def test_a_refused_dispatch_whose_claim_release_failed_too_gives_back_its_retry(ck: CrashKit) -> None:
    # Found in review: the approval came back only when the claim's release worked.
    from bot.github.errors import BadRequest

    process, candidate, family = await cooling_down(ck)
    await controls.approve_retry(process.live, process.state, family, "alice", ck.clock.now())
    ck.clock.advance(2 * 3600 + 120)
    ck.repo.fail("dispatch", BadRequest(422, "Unexpected inputs provided"))
    ck.repo.fail("delete_branch", Unavailable(502, "Bad Gateway"))

    await process.waves.run(REPO, trigger="schedule")

    # The claim stays with its dispatch (the keeper releases it when it finds no run) ...
    assert process.state.dispatches[family.id].run_id is None
    # ... and the approval is there for the dispatch that will run.
    assert candidate in process.state.retries


async def test_the_wave_number_is_kept_when_the_scheduled_wave_dies(ck: CrashKit) -> None:
    process = await ck.boot()
    await process.reconciler.reconcile(REPO, 1)
    await process.scheduler.tick()  # sets the first wave's time
    ck.clock.set(parse_time(process.state.meta.next_wave_at))
    await wave_killed_at_its_commit(ck, process)

    process = await ck.restart()
    await process.scheduler.tick()  # the wave was still due: it runs once, now

    assert process.state.meta.wave == 2 and len(ck.repo.dispatched) == len(process.state.dispatches)
