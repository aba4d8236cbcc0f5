"""A section that changed a repository's memory and then failed, before its commit, leaves
memory as the store holds it: run again (a retried delivery, the next tick), it writes what
the first try did not."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from bot.core.clock import ManualClock
from bot.core.events import Job
from bot.github.errors import Unavailable
from bot.services.catalog_sync import CatalogSync
from bot.services.claims import ClaimKeeper
from bot.services.live import LiveState
from bot.services.outcomes import OutcomeRecorder
from bot.services.pulls import PullSync
from bot.services.reconcile import Reconciler
from bot.store.change import Change
from bot.store.errors import StoreUnavailable
from tests.services.conftest import REPO, Kit
from tests.services.crash import INCOMPATIBLE, CrashKit, Process
from tests.services.test_outcomes import failed_run

H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"


def fails_in_get_jobs(ck: CrashKit, run_id: int) -> None:
    ck.repo.runs[run_id] = ck.repo.runs[run_id].model_copy(update={
        "status": "completed", "conclusion": "failure", "updated_at": ck.clock.now(), "created_at": ck.clock.now()})
    ck.repo.jobs_of[run_id] = [Job(name="get-jobs", conclusion="failure")]


def fail_next_commit(process: Process) -> None:
    """The store answers the next commit with a transient error (it restarts)."""
    persist = process.live.persist

    async def failing(change: Change) -> None:
        process.live.persist = persist  # type: ignore[method-assign]
        raise StoreUnavailable("the store restarts")

    process.live.persist = failing  # type: ignore[method-assign]


async def test_an_outcome_whose_commit_failed_is_stored_by_the_retried_delivery(ck: CrashKit) -> None:
    process, dispatch = await ck.dispatched()
    fails_in_get_jobs(ck, dispatch.run_id)
    fail_next_commit(process)
    with pytest.raises(StoreUnavailable):
        await process.outcomes.on_workflow_run(process.state, failed_run(dispatch.run_id))
    await process.outcomes.on_workflow_run(process.state, failed_run(dispatch.run_id))  # the inbox's retry

    process = await ck.restart()
    [stored] = process.state.ledger.for_candidate(dispatch.candidate)
    assert stored.run_id == dispatch.run_id and dispatch.family not in process.state.dispatches


async def test_a_run_whose_first_delivery_failed_still_counts_toward_the_pause(ck: CrashKit) -> None:
    process = await ck.boot()
    await process.reconciler.reconcile(REPO, 1)
    await process.waves.run(REPO, trigger="test")
    runs = [d.run_id for d in process.state.dispatches.values()][:3]
    ck.clock.advance(600)
    fails_in_get_jobs(ck, runs[0])
    fail_next_commit(process)
    with pytest.raises(StoreUnavailable):
        await process.outcomes.on_workflow_run(process.state, failed_run(runs[0]))
    for run_id in runs:
        fails_in_get_jobs(ck, run_id)
        await process.outcomes.on_workflow_run(process.state, failed_run(run_id))

    blocked = process.state.blocked()
    assert blocked is not None and blocked.code == "dispatch-paused"


async def test_a_light_reconcile_failing_half_way_loses_no_outcome(ck: CrashKit) -> None:
    ck.repo.put_files({".github/klaud.yml": "max_candidates_per_wave: 2\n"})
    process = await ck.boot()
    await process.reconciler.reconcile(REPO, 1)
    await process.waves.run(REPO, trigger="test")
    first, second = process.state.dispatches.values()
    ck.clock.advance(3600)
    assert first.run_id is not None and second.run_id is not None
    ck.complete_run(first.run_id, INCOMPATIBLE, 701)  # its delivery was lost
    read_run = ck.repo.run

    async def second_read_fails(run_id: int):  # type: ignore[no-untyped-def]
        if run_id == second.run_id:
            raise Unavailable(502, "Bad Gateway")
        return await read_run(run_id)

    ck.repo.run = second_read_fails  # type: ignore[method-assign]
    with pytest.raises(Unavailable):
        await process.reconciler.reconcile(REPO, 1, light=True)
    ck.repo.run = read_run  # type: ignore[method-assign]
    await process.reconciler.reconcile(REPO, 1, light=True)

    process = await ck.restart()
    assert [a.outcome for a in process.state.ledger.for_candidate(first.candidate)] == ["incompatible"]


async def test_a_cancelled_section_is_read_back_before_the_repositorys_next_work(ck: CrashKit) -> None:
    process, dispatch = await ck.dispatched()
    fails_in_get_jobs(ck, dispatch.run_id)
    reached = asyncio.Event()

    async def hangs(branch: str) -> bool:
        reached.set()
        await asyncio.Event().wait()
        return True

    ck.repo.delete_branch = hangs  # type: ignore[method-assign]
    handler = asyncio.create_task(process.outcomes.on_workflow_run(process.state, failed_run(dispatch.run_id)))
    await reached.wait()
    handler.cancel()  # the handler's timeout, or a stop past its grace
    await asyncio.gather(handler, return_exceptions=True)
    assert process.live.stale == {REPO}
    assert process.state.ledger.for_candidate(dispatch.candidate), "memory ran ahead of the store"

    await process.live.reload_stale()  # what the next tick (or the repository's next batch) does first

    assert process.state.ledger.for_candidate(dispatch.candidate) == []
    assert dispatch.family in process.state.dispatches and process.live.stale == set()


@pytest.mark.parametrize("name", ["acme/bench", "Acme/Bench"])
async def test_a_failed_section_keeps_what_it_persisted_before_failing_whatever_the_names_case(name: str) -> None:
    # Found in review: the read-back first commits what the delivery's unit holds of the
    # repository, matched by name; units note names in lowercase, so with GitHub's 'Acme/Bench'
    # the held change was read over in memory, and committed to the store after.
    from bot.core.domain import Hold
    from bot.store.db import Database
    from bot.store.records import STATE_SCHEMA, StateStore
    from tests.services.conftest import NOW, scenario_repo
    from tests.services.fakes import FakeRepos

    db = Database(":memory:")
    await db.open(STATE_SCHEMA)
    store = StateStore(db)
    repo = scenario_repo()
    repo.name = name
    live = LiveState(store, FakeRepos({name: repo}), ManualClock(NOW), ("klaud[bot]",))
    catalog, pulls, outcomes = CatalogSync(live), PullSync(live), OutcomeRecorder(live)
    await Reconciler(live, catalog, pulls, outcomes, ClaimKeeper(live, outcomes)).reconcile(name, 1)
    state = live.repo(name)
    assert state is not None
    unit = store.writer.begin_unit()  # what the inbox does around a delivery's handler
    with pytest.raises(RuntimeError):
        async with live.lock(name):
            await live.persist(state.hold(Hold(H200, "alice", "driver bug", NOW)))  # held by the unit
            raise RuntimeError("a later step of the section fails")
    await store.writer.end_unit(unit, ())

    assert H200 in live.repo(name).holds  # type: ignore[union-attr]
    await db.close()


@pytest.mark.parametrize(("error", "traceback"), [(StoreUnavailable("the store restarts"), False),
                                                  (TypeError("a bug in reading back"), True)])
async def test_a_failed_read_back_after_a_failed_section_shows_a_bug_whole(
    kit: Kit, monkeypatch: pytest.MonkeyPatch, error: Exception, traceback: bool
) -> None:
    async def read_back(name: str) -> None:
        raise error

    monkeypatch.setattr(kit.live, "_read_back", read_back)
    with capture_logs() as logs, pytest.raises(Unavailable):
        async with kit.live.lock(REPO):
            raise Unavailable(502, "Bad Gateway")
    [failed] = [e for e in logs if e["event"] == "live.read_back_failed"]
    assert (failed.get("exc_info") is error) is traceback
    assert REPO in kit.live.stale  # read back at the next batch or tick


async def test_a_push_whose_commit_died_still_arms_the_canary_of_a_paused_repository(ck: CrashKit) -> None:
    # What this catches: only the push's own handler armed the canary; its webhook lost, or
    # the process dead before its commit, the light reconcile read the new head and armed
    # nothing: dispatch stayed paused until a person acted.
    from tests.services.crash import Killed
    from tests.services.test_catalog_sync import push

    process = await ck.boot()
    await process.reconciler.reconcile(REPO, 1)
    await process.waves.run(REPO, trigger="test")
    for dispatch in list(process.state.dispatches.values()):
        fails_in_get_jobs(ck, dispatch.run_id)
        await process.outcomes.on_workflow_run(process.state, failed_run(dispatch.run_id))
    blocked = process.state.blocked()
    assert blocked is not None and blocked.code == "dispatch-paused"
    head, old = "e" * 40, ck.repo.head
    ck.repo.files[head] = dict(ck.repo.files[old])
    ck.repo.head = head
    process.die_at_commit(lambda change: True)
    with pytest.raises(Killed):
        await process.reconciler.catalog.on_push(process.state, push("refs/heads/main", old, head))
    process = await ck.restart()
    dispatched = len(ck.repo.dispatched)
    for _ in range(12 * 24):  # a day of ticks, 5 minutes apart
        ck.clock.advance(300)
        await process.scheduler.tick()
    assert process.state.meta.head_sha == head
    assert len(ck.repo.dispatched) > dispatched, "paused for good: the push's canary was lost"
