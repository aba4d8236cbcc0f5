"""The scheduler's tick against an in-memory repository: one repository's GitHub trouble is
backed off from and holds up neither its other work nor the tick's later steps; what each
tick runs, and in which order; retry waves, light reconciles, trimming and housekeeping at
their exact times, on a leader and on a follower; the loop's life and its stop."""

from __future__ import annotations

import asyncio
import contextlib
import random
from datetime import UTC, datetime, timedelta
from typing import Any

from structlog.testing import capture_logs

from bot.core.clock import Clock
from bot.core.cooldown import ATTEMPT_MEMORY
from bot.core.domain import parse_time, stamp
from bot.github.errors import BadRequest, NotFound, Unavailable
from bot.services.missed_comments import GRACE as COMMENT_GRACE
from bot.services.reconcile import FIRST_RETRY, retry_delay
from bot.services.scheduler import LIGHT_RECONCILE_EVERY, MAX_JITTER_SECONDS, Scheduler
from bot.services.waves import RETRY_WAVE_AFTER
from bot.store.change import Change
from bot.store.errors import LeaseTaken, StoreUnavailable
from tests.services.conftest import NOW, REPO, Kit
from tests.services.fakes import pull
from tests.services.test_claims import TTL, dispatched
from tests.services.test_long_running import failed
from tests.services.test_outcomes import completed, with_artifact
from tests.services.test_pulls import H200
from tests.services.test_responder import TP_CHANGE


def scheduler(kit: Kit, **options: Any) -> Scheduler:
    options.setdefault("rng", random.Random(1))  # the same jitter every run
    return Scheduler(kit.live, kit.waves, kit.reconciler, kit.outcomes, kit.clock, **options)


async def test_a_failing_light_reconcile_backs_off_instead_of_running_every_tick(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.clock.advance((LIGHT_RECONCILE_EVERY + timedelta(minutes=1)).total_seconds())
    kit.state.meta.next_wave_at = stamp(kit.clock.now() + timedelta(hours=1))
    # The App lost the repository and the event saying so was lost.
    kit.repo.fail("head_sha", NotFound(404, "Not Found"), times=1000)
    kit.repo.calls.clear()
    ticks = scheduler(kit)
    for _ in range(30):  # thirty seconds of ticks
        await ticks.tick()
        kit.clock.advance(1)
    assert [c[0] for c in kit.repo.calls].count("head_sha") == 1
    kit.clock.advance(FIRST_RETRY.total_seconds())
    await ticks.tick()
    assert [c[0] for c in kit.repo.calls].count("head_sha") == 2  # tried again after the backoff


async def test_a_repository_to_catch_up_is_reconciled_light_once_the_comment_grace_has_passed(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)  # reconciled just now: the cadence is 6 h off
    kit.state.meta.next_wave_at = stamp(kit.clock.now() + timedelta(hours=1))
    ticks = scheduler(kit)
    ticks.catch_up(REPO.upper())  # a delivery given up on; any case of the name
    kit.repo.calls.clear()

    await ticks.tick()  # within the grace a command is still its own delivery's
    assert kit.repo.calls == []
    kit.clock.advance(COMMENT_GRACE.total_seconds())
    await ticks.tick()
    assert [c[0] for c in kit.repo.calls].count("head_sha") == 1
    await ticks.tick()
    assert [c[0] for c in kit.repo.calls].count("head_sha") == 1  # once


async def test_a_failing_claim_check_does_not_stop_the_due_wave(kit: Kit) -> None:
    family, _, _ = await dispatched(kit)
    kit.clock.advance(TTL.total_seconds())
    kit.repo.fail("run", BadRequest(403, "Resource not accessible by integration"), times=1000)
    kit.state.meta.next_wave_at = stamp(kit.clock.now() - timedelta(minutes=1))
    kit.state.meta.reconciled_at = stamp(kit.clock.now())
    # Stored: the failing claim check reads the repository back from the store.
    await kit.live.persist(kit.state.save_meta())
    kit.repo.calls.clear()
    ticks = scheduler(kit)
    assert await ticks.tick() == [REPO]
    wave = await kit.live.store.wave(REPO, kit.state.meta.wave)
    assert wave is not None
    decision = next(d for d in wave["decisions"] if d["family"] == family)
    assert decision["decision"] == "in-flight"  # unresolved, the family stays out of waves
    for _ in range(5):
        await ticks.tick()
    assert [c[0] for c in kit.repo.calls].count("run") == 1


async def test_stopping_cancels_a_tick_that_outlasts_the_grace(kit: Kit) -> None:
    # A tick waiting on a slow GitHub held `klaud serve` past a container's stop grace.
    ticks = scheduler(kit)
    waiting = asyncio.Event()

    async def tick_waiting_on_github() -> list[str]:
        waiting.set()
        await asyncio.Event().wait()  # an answer that never comes
        return []

    ticks.tick = tick_waiting_on_github
    ticks.start()
    await waiting.wait()
    await asyncio.wait_for(ticks.stop(grace=0.05), timeout=5)
    assert ticks._task is not None and ticks._task.cancelled()


async def test_a_wave_whose_write_another_replica_refused_is_not_backed_off_from(kit: Kit, monkeypatch) -> None:
    # Replicas: the repository's lease passed to another replica while this one planned
    # (it stalled past its lease). The refusal is no bug to back off from: the next lease
    # round lets the repository go, or, the lease being free again, the next tick waves.
    await kit.reconciler.reconcile(REPO, 1)
    kit.state.meta.next_wave_at = stamp(kit.clock.now() - timedelta(minutes=1))
    kit.state.meta.reconciled_at = stamp(kit.clock.now())
    await kit.live.persist(kit.state.save_meta())
    wave_before = kit.state.meta.wave
    apply = kit.live.store.apply
    refusals = [LeaseTaken("leases repo:o/r (replica-b) are held by another replica")]

    async def refused_once(change: Change) -> None:
        if refusals:
            raise refusals.pop()
        await apply(change)

    monkeypatch.setattr(kit.live.store, "apply", refused_once)
    ticks = scheduler(kit)
    with capture_logs() as logs:
        assert await ticks.tick() == []
    assert [(e["event"], e["log_level"]) for e in logs if e["event"].startswith("scheduler.")] == [
        ("scheduler.lease_taken", "warning")
    ]
    assert await ticks.tick() == [REPO]  # read back from the store, then waved at once
    assert (await kit.live.store.get("", "repo", REPO) or {})["wave"] == wave_before + 1


def quiet(kit: Kit) -> None:
    """No wave and no light reconcile due (a time ahead of the clock would make one due)."""
    kit.state.meta.next_wave_at = stamp(kit.clock.now() + timedelta(hours=1))
    kit.state.meta.reconciled_at = stamp(kit.clock.now())


def reads(kit: Kit, call: str) -> int:
    return [c[0] for c in kit.repo.calls].count(call)


# --- what a tick runs -----------------------------------------------------------------


async def test_a_tick_retries_a_transiently_failed_artifact_download(kit: Kit) -> None:
    # What this catches: tick no longer retrying the artifacts of each repository.
    await kit.reconciler.reconcile(REPO, 1)
    with_artifact(kit, 302)
    kit.repo.fail("download", Unavailable(502, "Bad Gateway"))
    await kit.outcomes.on_workflow_run(kit.state, completed(302))
    assert len(kit.state.pending_artifacts) == 1
    kit.clock.advance(timedelta(hours=1).total_seconds())
    quiet(kit)
    await scheduler(kit).tick()
    assert kit.state.pending_artifacts == {}
    assert [a.verified for a in kit.state.ledger.all() if a.run_id == 302] == [True]


async def test_a_tick_retries_a_failed_reconcile_after_its_backoff(kit: Kit) -> None:
    # What this catches: tick no longer calls reconciler.retry_failed().
    kit.repo.fail("repository", Unavailable(502, "Bad Gateway"))
    assert await kit.reconciler._try_reconcile(REPO, 1) is False
    assert kit.live.repo(REPO) is None
    ticks = scheduler(kit)
    kit.clock.advance(FIRST_RETRY.total_seconds())
    await ticks.tick()
    assert kit.reconciler.failures == {} and kit.live.repo(REPO) is not None


async def test_a_tick_reads_back_a_repository_whose_section_was_cancelled(kit: Kit) -> None:
    # What this catches: tick no longer calls live.reload_stale(): memory stays ahead of the store.
    await kit.reconciler.reconcile(REPO, 1)
    quiet(kit)
    await kit.live.persist(kit.state.save_meta())
    stored = kit.state.meta.wave

    async def cancelled_section() -> None:
        async with kit.live.lock(REPO):
            kit.state.meta.wave = stored + 40  # changed in memory, never committed
            raise asyncio.CancelledError

    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.create_task(cancelled_section())
    assert REPO in kit.live.stale
    await scheduler(kit).tick()
    assert kit.state.meta.wave == stored and kit.live.stale == set()


async def test_claims_whose_run_vanished_are_settled_before_the_wave_of_the_same_tick(kit: Kit) -> None:
    # What this catches: the claim check runs after the wave, which still sees the family in flight.
    family, _, run_id = await dispatched(kit)
    del kit.repo.runs[run_id]  # GitHub no longer knows the run: its claim is released at the TTL
    kit.clock.advance(TTL.total_seconds())
    kit.state.meta.next_wave_at = stamp(kit.clock.now() - timedelta(minutes=1))
    kit.state.meta.reconciled_at = stamp(kit.clock.now())
    assert await scheduler(kit).tick() == [REPO]
    wave = await kit.live.store.wave(REPO, kit.state.meta.wave)
    assert wave is not None
    decision = next(d for d in wave["decisions"] if d["family"] == family)
    assert decision["decision"] == "selected", decision


# --- backoff ---------------------------------------------------------------------------


async def failing_light_reconcile(kit: Kit, times: int = 1000) -> Scheduler:
    """A light reconcile due now whose first GitHub read fails `times` times (404)."""
    await kit.reconciler.reconcile(REPO, 1)
    kit.clock.advance((LIGHT_RECONCILE_EVERY + timedelta(minutes=1)).total_seconds())
    kit.state.meta.next_wave_at = stamp(kit.clock.now() + timedelta(hours=1))
    kit.repo.fail("head_sha", NotFound(404, "Not Found"), times=times)
    kit.repo.calls.clear()
    return scheduler(kit)


async def test_failed_work_is_tried_again_exactly_when_its_backoff_ends(kit: Kit) -> None:
    # What this catches: `now < retry_at` became `now <= retry_at` (one more second of waiting).
    ticks = await failing_light_reconcile(kit)
    await ticks.tick()
    kit.clock.advance(FIRST_RETRY.total_seconds())
    await ticks.tick()
    assert reads(kit, "head_sha") == 2


async def test_the_backoff_grows_with_failures_in_a_row(kit: Kit) -> None:
    # What this catches: every failure counted as the first (a 404 asked every minute for good).
    ticks = await failing_light_reconcile(kit)
    await ticks.tick()  # 1st failure: again in retry_delay(1)
    kit.clock.advance(retry_delay(1).total_seconds())
    await ticks.tick()  # 2nd failure: again in retry_delay(2)
    assert reads(kit, "head_sha") == 2
    kit.clock.advance(retry_delay(1).total_seconds())
    await ticks.tick()
    assert reads(kit, "head_sha") == 2, "tried again before retry_delay(2) had passed"
    kit.clock.advance((retry_delay(2) - retry_delay(1)).total_seconds())
    await ticks.tick()
    assert reads(kit, "head_sha") == 3


async def test_a_success_resets_the_backoff(kit: Kit) -> None:
    # What this catches: a success leaves the failure count, and the next failure waits longer.
    ticks = await failing_light_reconcile(kit, times=1)
    await ticks.tick()  # fails once
    kit.clock.advance(retry_delay(1).total_seconds())
    await ticks.tick()  # succeeds
    assert reads(kit, "head_sha") == 2 and ticks._failing == {}
    kit.repo.fail("head_sha", NotFound(404, "Not Found"), times=1000)
    kit.state.meta.reconciled_at = stamp(kit.clock.now() - LIGHT_RECONCILE_EVERY)
    # Stored too: the failed reconcile's section reads the repository back from the store.
    await kit.live.persist(kit.state.save_meta())
    await ticks.tick()  # a new first failure
    kit.clock.advance(retry_delay(1).total_seconds())
    await ticks.tick()
    assert reads(kit, "head_sha") == 4, "the first failure after a success waited like a second one"


async def test_a_repository_that_left_takes_no_backoff_with_it(kit: Kit) -> None:
    # What this catches: the backoff of a repository given up or removed stays, and holds up its
    # work when it is added again (and the dict grows for the life of the process).
    ticks = await failing_light_reconcile(kit, times=1)
    await ticks.tick()  # the light reconcile fails: backed off
    assert (REPO, "reconcile") in ticks._failing
    await kit.live.forget(REPO)  # uninstalled
    await ticks.tick()
    assert ticks._failing == {}
    await kit.reconciler.reconcile(REPO, 1)  # installed again, within the old backoff
    kit.state.meta.reconciled_at = stamp(kit.clock.now() - LIGHT_RECONCILE_EVERY)
    kit.repo.calls.clear()
    await ticks.tick()
    assert reads(kit, "head_sha") == 1


# --- waves -----------------------------------------------------------------------------


async def test_a_retry_wave_runs_exactly_at_its_time(kit: Kit) -> None:
    # What this catches: `retry_at <= now` became `<`.
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.fail("dispatch", Unavailable(502, "Bad Gateway"), times=100)
    await kit.waves.run(REPO, trigger="schedule")  # every dispatch failed: a retry wave is set
    retry_at = parse_time(kit.state.meta.retry_wave_at)
    assert retry_at is not None
    kit.repo.fail("dispatch", Unavailable(502, "Bad Gateway"), times=0)
    kit.clock.set(retry_at)
    quiet(kit)
    assert await scheduler(kit).tick() == [REPO]


async def test_a_retry_wave_that_fails_again_is_not_retried_again(kit: Kit) -> None:
    # What this catches: the retry wave ran with trigger "schedule", so its own failure set another
    # retry, every RETRY_WAVE_AFTER for as long as GitHub fails.
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.fail("dispatch", Unavailable(502, "Bad Gateway"), times=1000)
    await kit.waves.run(REPO, trigger="schedule")
    assert kit.state.meta.retry_wave_at is not None
    kit.clock.advance((RETRY_WAVE_AFTER + timedelta(seconds=1)).total_seconds())
    quiet(kit)
    assert await scheduler(kit).tick() == [REPO]  # the retry wave
    assert kit.state.meta.retry_wave_at is None


async def test_the_next_wave_time_stays_put_between_ticks(kit: Kit) -> None:
    # What this catches: the "later than the cadence allows" bound without the jitter allowance:
    # a slot set at a boundary (plus jitter) was moved, and stored, at every tick.
    await kit.reconciler.reconcile(REPO, 1)
    assert kit.clock.now() == NOW  # on a 120-minute boundary
    ticks = scheduler(kit)
    await ticks.tick()
    first = kit.state.meta.next_wave_at
    with capture_logs() as logs:
        for _ in range(30):
            kit.clock.advance(1)
            await ticks.tick()
    assert kit.state.meta.next_wave_at == first
    assert [e for e in logs if e["event"] == "scheduler.next_wave"] == []


async def test_scheduled_waves_are_spread_by_jitter(kit: Kit) -> None:
    # What this catches: no jitter, every installation calls GitHub in the same second.
    await kit.reconciler.reconcile(REPO, 1)
    await scheduler(kit, rng=random.Random(1)).tick()
    due = parse_time(kit.state.meta.next_wave_at)
    boundary = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    assert due is not None and timedelta(0) < due - boundary <= timedelta(seconds=MAX_JITTER_SECONDS)
    expected = random.Random(1).uniform(0, MAX_JITTER_SECONDS)
    assert abs((due - boundary).total_seconds() - expected) < 1e-3


async def test_setting_the_next_wave_waits_for_the_repositorys_lock(kit: Kit) -> None:
    # What this catches: next_wave_at written (memory and store) while another section holds the lock.
    await kit.reconciler.reconcile(REPO, 1)
    kit.state.meta.reconciled_at = stamp(kit.clock.now())
    ticks = scheduler(kit)
    async with kit.live.lock(REPO):
        tick = asyncio.create_task(ticks.tick())
        for _ in range(20):
            await asyncio.sleep(0)
        assert kit.state.meta.next_wave_at is None
    await tick
    assert kit.state.meta.next_wave_at is not None


# --- light reconciles ------------------------------------------------------------------


async def test_a_light_reconcile_is_due_exactly_six_hours_after_the_last(kit: Kit) -> None:
    # What this catches: `since < LIGHT_RECONCILE_EVERY` became `<=`.
    await kit.reconciler.reconcile(REPO, 1)
    kit.state.meta.reconciled_at = stamp(kit.clock.now())
    kit.clock.advance(LIGHT_RECONCILE_EVERY.total_seconds())
    kit.state.meta.next_wave_at = stamp(kit.clock.now() + timedelta(hours=1))
    kit.repo.calls.clear()
    await scheduler(kit).tick()
    assert reads(kit, "open_pulls") == 1


async def test_a_repository_never_reconciled_gets_a_light_reconcile_at_once(kit: Kit) -> None:
    # What this catches: no reconciled_at counted as "just reconciled": never reconciled again.
    await kit.reconciler.reconcile(REPO, 1)
    kit.state.meta.reconciled_at = None
    kit.state.meta.next_wave_at = stamp(kit.clock.now() + timedelta(hours=1))
    kit.repo.calls.clear()
    await scheduler(kit).tick()
    assert reads(kit, "open_pulls") == 1 and kit.state.meta.reconciled_at is not None


# --- housekeeping ----------------------------------------------------------------------


def record_old_and_recent(kit: Kit, run_id: int) -> None:
    """An attempt older than any rule reads (`run_id`) and a recent one (`run_id + 1`)."""
    family = next(iter(kit.state.catalog))
    kit.state.record_attempt(failed(family.candidate, run_id, kit.clock.now() - ATTEMPT_MEMORY - timedelta(hours=1)))
    kit.state.record_attempt(failed(family.candidate, run_id + 1, kit.clock.now() - timedelta(days=1)))


def kept(kit: Kit) -> set[int]:
    return {a.run_id for a in kit.state.ledger.all()}


async def test_old_attempts_leave_memory_every_six_hours_not_only_the_first_time(kit: Kit) -> None:
    # What this catches: the trim time was never moved on: after 12 h nothing was trimmed again.
    await kit.reconciler.reconcile(REPO, 1)
    ticks = scheduler(kit)
    for round_ in range(3):
        record_old_and_recent(kit, 100 + 10 * round_)
        kit.clock.advance(LIGHT_RECONCILE_EVERY.total_seconds())
        quiet(kit)
        await ticks.tick()
        assert 100 + 10 * round_ not in kept(kit), f"an old attempt was kept after {6 * (round_ + 1)} h"
        assert 100 + 10 * round_ + 1 in kept(kit), "a recent attempt was forgotten"


async def test_old_attempts_leave_memory_after_the_clock_came_back_from_a_jump(kit: Kit) -> None:
    # What this catches: a clock set back left the trim time in the future: no trimming for a year.
    await kit.reconciler.reconcile(REPO, 1)
    ticks = scheduler(kit)
    kit.clock.set(NOW + timedelta(days=365))  # one tick on a clock a year ahead
    quiet(kit)
    await ticks.tick()
    kit.clock.set(NOW + timedelta(minutes=1))  # NTP corrects it
    quiet(kit)
    await ticks.tick()
    record_old_and_recent(kit, 200)
    kit.clock.advance(LIGHT_RECONCILE_EVERY.total_seconds())
    quiet(kit)
    await ticks.tick()
    assert 200 not in kept(kit) and 201 in kept(kit)


async def test_a_replica_that_does_not_lead_trims_memory_but_neither_discovers_nor_prunes(kit: Kit, monkeypatch) -> None:
    # What this catches: every replica discovered installations and pruned the store.
    # And: a follower never trimmed its repositories' attempts.
    await kit.reconciler.reconcile(REPO, 1)
    calls: list[str] = []

    async def prune() -> None:
        calls.append("prune")

    async def discover() -> list[str]:
        calls.append("discover")
        return []

    monkeypatch.setattr(kit.reconciler, "reconcile_new_installations", discover)
    ticks = scheduler(kit, prune=prune, leads=lambda: False)
    quiet(kit)
    await ticks.tick()
    record_old_and_recent(kit, 300)
    kit.clock.advance(LIGHT_RECONCILE_EVERY.total_seconds())
    quiet(kit)
    await ticks.tick()
    assert calls == []
    assert 300 not in kept(kit) and 301 in kept(kit)


async def test_discovery_runs_exactly_six_hours_after_the_start(kit: Kit, monkeypatch) -> None:
    # What this catches: `>= LIGHT_RECONCILE_EVERY` became `>` for discovery (retention's is pinned
    # by test_long_running.py::test_retention_runs_at_the_first_tick_then_every_six_hours).
    await kit.reconciler.reconcile(REPO, 1)
    discovered: list[datetime] = []

    async def discover() -> list[str]:
        discovered.append(kit.clock.now())
        return []

    monkeypatch.setattr(kit.reconciler, "reconcile_new_installations", discover)
    ticks = scheduler(kit)
    quiet(kit)
    await ticks.tick()
    assert discovered == []  # done at start-up
    kit.clock.advance(LIGHT_RECONCILE_EVERY.total_seconds())
    quiet(kit)
    await ticks.tick()
    assert discovered == [kit.clock.now()]


# --- the loop --------------------------------------------------------------------------


async def test_the_loop_goes_on_after_a_tick_raised(kit: Kit) -> None:
    # What this catches: only GitHub errors were caught: a bug ended the loop, and every later wave.
    ticks = scheduler(kit, poll_seconds=0.001)
    calls: list[int] = []

    async def buggy_then_fine() -> list[str]:
        calls.append(1)
        if len(calls) == 1:
            raise KeyError("a bug")
        return []

    ticks.tick = buggy_then_fine
    ticks.start()
    for _ in range(200):
        if len(calls) >= 3:
            break
        await asyncio.sleep(0.005)
    await ticks.stop(grace=1)
    assert len(calls) >= 3


async def test_stop_returns_within_its_grace_when_a_tick_hangs(kit: Kit) -> None:
    # What this catches: the tick past its grace was not cancelled; stop() waited for it for good
    # (the other stop test passes anyway: its wait_for cancels the awaited tick).
    ticks = scheduler(kit)
    waiting = asyncio.Event()

    async def tick_waiting_on_github() -> list[str]:
        waiting.set()
        await asyncio.Event().wait()
        return []

    ticks.tick = tick_waiting_on_github  # type: ignore[method-assign]
    ticks.start()
    await waiting.wait()
    await asyncio.wait_for(ticks.stop(grace=0.05), timeout=5)  # a stop that waits for good fails here
    assert ticks._task is not None and ticks._task.cancelled()


async def test_a_light_reconcile_due_with_the_wave_goes_first(kit: Kit) -> None:
    # What this catches (a chaos soak): the wave ran before the light reconcile due in the
    # same tick: a PR whose webhook was lost, changing a family, was caught up only after
    # that wave had dispatched the family beside it.
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.pulls[12] = pull(12, updated_at=kit.clock.now())
    kit.repo.pull_files_of[12] = TP_CHANGE  # its `opened` webhook was lost
    kit.clock.advance(LIGHT_RECONCILE_EVERY.total_seconds())
    kit.state.meta.next_wave_at = stamp(kit.clock.now() - timedelta(minutes=1))
    assert await scheduler(kit).tick() == [REPO]
    wave = await kit.live.store.wave(REPO, kit.state.meta.wave)
    assert wave is not None
    [h200] = [d for d in wave["decisions"] if d["family"] == H200]
    assert h200["decision"] == "overlap"


def stored_given_up(kit_clock: Clock, times: dict[str, datetime]):  # type: ignore[no-untyped-def]
    """`DeliveryStore.given_up_within` over deliveries given up on at `times`; its calls."""
    calls: list[float] = []

    async def given_up_within(seconds: float) -> dict[str, float]:
        calls.append(seconds)
        ages = {repo: (kit_clock.now() - at).total_seconds() for repo, at in times.items()}
        return {repo: age for repo, age in ages.items() if age < seconds}

    return given_up_within, calls


async def test_a_catch_up_the_last_process_left_is_found_in_the_store_when_a_repository_is_taken_up(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.state.meta.next_wave_at = stamp(kit.clock.now() + timedelta(hours=1))
    # The process that gave up on a delivery a minute later stopped: its catch-up was in memory.
    given_up, calls = stored_given_up(kit.clock, {REPO.lower(): kit.clock.now() + timedelta(minutes=1)})
    kit.clock.advance(120)
    ticks = scheduler(kit, given_up=given_up)
    kit.repo.calls.clear()

    await ticks.tick()  # the grace runs from when it was given up on
    assert kit.repo.calls == []
    kit.clock.advance(COMMENT_GRACE.total_seconds() - 60)
    await ticks.tick()
    assert [c[0] for c in kit.repo.calls].count("head_sha") == 1
    for _ in range(3):
        await ticks.tick()
    assert [c[0] for c in kit.repo.calls].count("head_sha") == 1  # once
    assert len(calls) == 1  # the store is read when a repository is taken up, not every tick


async def test_a_delivery_given_up_on_before_the_last_catch_up_is_not_caught_up_again(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    given_up_at = kit.clock.now()
    given_up, _ = stored_given_up(kit.clock, {REPO.lower(): given_up_at})
    kit.clock.advance(COMMENT_GRACE.total_seconds())
    # The catch-up of the process before, whose sweep of comments (not wired in this kit)
    # went past the comment given up on.
    await kit.reconciler.reconcile(REPO, 1, light=True)
    kit.state.meta.comments_swept_at = stamp(given_up_at)
    kit.state.meta.next_wave_at = stamp(kit.clock.now() + timedelta(hours=1))
    ticks = scheduler(kit, given_up=given_up)
    kit.repo.calls.clear()
    for _ in range(3):
        await ticks.tick()
        kit.clock.advance(COMMENT_GRACE.total_seconds())
    assert kit.repo.calls == []


async def test_a_store_that_fails_the_read_of_deliveries_given_up_on_holds_up_no_wave(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.state.meta.next_wave_at = stamp(kit.clock.now() - timedelta(minutes=1))
    reads: list[float] = []

    async def unavailable(since: float) -> dict[str, float]:
        reads.append(since)
        raise StoreUnavailable("PostgreSQL localhost:5432/klaud: ConnectionRefusedError")

    ticks = scheduler(kit, given_up=unavailable)
    with capture_logs() as logs:
        assert await ticks.tick() == [REPO]
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["scheduler.given_up_unread"]
    await ticks.tick()
    assert len(reads) == 2  # read again at the next tick


async def test_a_repository_taken_up_again_is_looked_up_again(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.state.meta.next_wave_at = stamp(kit.clock.now() + timedelta(hours=1))
    given_up, calls = stored_given_up(kit.clock, {})
    ticks = scheduler(kit, given_up=given_up)
    await ticks.tick()
    state = kit.state
    kit.live.drop(REPO)  # another replica took it over
    await ticks.tick()
    kit.live.put(state)  # and this one took it back
    await ticks.tick()
    await ticks.tick()
    assert len(calls) == 2
