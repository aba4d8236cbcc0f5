"""The scheduler and time (found by an audit of time, each failing before): a shortened cadence
takes effect at once, and a clock that ran ahead and was set back neither stops waves and
reconciles nor drops attempts whose cooldowns still run."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

from bot.core.domain import parse_time, stamp
from bot.core.events import PushEvent
from bot.github.errors import Unauthorized, Unavailable
from bot.services.scheduler import LIGHT_RECONCILE_EVERY, Scheduler, next_boundary
from bot.services.waves import WaveRunner
from tests.services.conftest import NOW, REPO, Kit


def scheduler(kit: Kit) -> Scheduler:
    return Scheduler(kit.live, kit.waves, kit.reconciler, kit.outcomes, kit.clock, rng=random.Random(1))


def push_policy(kit: Kit, text: str, after: str) -> PushEvent:
    before = kit.repo.head
    kit.repo.files[after] = {**kit.repo.files[before], ".github/klaud.yml": text}
    kit.repo.head = after
    return PushEvent.model_validate({
        "ref": "refs/heads/main", "before": before, "after": after,
        "repository": {"full_name": REPO, "pushed_at": int(kit.clock.now().timestamp())},
        "installation": {"id": 1},
    })


async def waves_over(kit: Kit, ticks: Scheduler, seconds: int, step: int = 60) -> list[datetime]:
    """Tick every `step` seconds for `seconds`; the times at which a wave ran."""
    at = []
    for _ in range(seconds // step):
        if await ticks.tick():
            at.append(kit.clock.now())
        kit.clock.advance(step)
    return at


async def test_a_long_downtime_runs_the_missed_wave_once(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    ticks = scheduler(kit)
    await ticks.tick()  # sets the first next_wave_at
    kit.clock.advance(timedelta(days=3).total_seconds())  # the process was down 3 days
    ran = await waves_over(kit, ticks, 30 * 60)
    assert len(ran) == 1, ran


async def test_a_shorter_wave_every_minutes_takes_effect_at_its_next_boundary(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    ticks = scheduler(kit)
    await ticks.tick()
    first = parse_time(kit.state.meta.next_wave_at)
    assert first is not None and first >= NOW + timedelta(hours=2)  # default cadence: 120 min
    # A minute later a maintainer sets a 10-minute cadence on the default branch.
    kit.clock.advance(60)
    await kit.catalog.on_push(kit.state, push_policy(kit, "wave_every_minutes: 10\n", "e" * 40))
    assert kit.state.policy.wave_every_minutes == 10
    ran = await waves_over(kit, ticks, 60 * 60)
    # The next 10-minute UTC boundary is 08:10 (+ <= 60 s jitter): within the hour, waves run.
    assert ran, f"no wave in the hour after the cadence became 10 min; next_wave_at={kit.state.meta.next_wave_at}"


async def test_a_weekly_cadence_changed_to_two_hours_does_not_wait_a_week(kit: Kit) -> None:
    kit.repo.put_files({".github/klaud.yml": "wave_every_minutes: 10080\n"})
    await kit.reconciler.reconcile(REPO, 1)
    ticks = scheduler(kit)
    await ticks.tick()
    kit.clock.advance(60)
    await kit.catalog.on_push(kit.state, push_policy(kit, "wave_every_minutes: 120\n", "e" * 40))
    await ticks.tick()
    due = parse_time(kit.state.meta.next_wave_at)
    assert due is not None
    assert due - kit.clock.now() <= timedelta(minutes=121), f"next wave still at {stamp(due)} (weekly slot)"


async def test_a_clock_that_jumped_forward_and_was_corrected_does_not_stop_waves(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    ticks = scheduler(kit)
    await ticks.tick()
    # The host clock jumps a year ahead (bad RTC after a reboot), a wave runs then, and
    # NTP brings the clock back a minute later.
    kit.clock.set(NOW + timedelta(days=365))
    assert await ticks.tick() == [REPO]
    kit.clock.set(NOW + timedelta(minutes=1))
    ran = await waves_over(kit, ticks, 6 * 3600, step=300)
    assert ran, f"no wave for 6 h after the clock was corrected; next_wave_at={kit.state.meta.next_wave_at}"


async def test_a_clock_that_jumped_forward_and_was_corrected_still_reconciles(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    ticks = scheduler(kit)
    kit.clock.set(NOW + timedelta(days=365))
    await ticks.tick()  # light reconcile due: reconciled_at = a year ahead
    kit.clock.set(NOW + timedelta(minutes=1))
    kit.repo.calls.clear()
    await waves_over(kit, ticks, int((LIGHT_RECONCILE_EVERY * 2).total_seconds()), step=600)
    assert any(c[0] == "open_pulls" for c in kit.repo.calls), (
        f"no light reconcile in 12 h after the clock came back; reconciled_at={kit.state.meta.reconciled_at}"
    )


def test_next_boundary_is_strictly_after_now_on_utc_multiples() -> None:
    at = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    assert next_boundary(at, 120, 0) == datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
    assert next_boundary(at - timedelta(microseconds=1), 120, 0) == at
    assert next_boundary(at, 7, 30) == datetime(2026, 11, 30, 8, 4, 30, tzinfo=UTC)  # 1970-based multiples


async def test_a_clock_that_jumped_forward_and_was_corrected_keeps_cooldowns(kit: Kit) -> None:
    from bot.core.events import Artifact, WorkflowRunEvent
    from tests.services.fakes import artifact_zip
    from tests.services.test_claims import OUTCOME, dispatched

    family, cand, run_id = await dispatched(kit)
    kit.repo.artifacts_of[run_id] = [Artifact(id=5, name=f"klaud-candidate-{cand}", expired=False, archive_download_url="x")]
    kit.repo.archives[5] = artifact_zip(OUTCOME)  # "incompatible": 24 h cooldown
    run = kit.repo.runs[run_id].model_copy(update={"status": "completed", "conclusion": "success",
                                                    "created_at": kit.clock.now(), "updated_at": kit.clock.now()})
    kit.repo.runs[run_id] = run
    await kit.outcomes.on_workflow_run(kit.state, WorkflowRunEvent.model_validate({
        "action": "completed", "workflow_run": run.model_dump(mode="json"),
        "repository": {"full_name": REPO}, "installation": {"id": 1}}))
    ticks = scheduler(kit)
    kit.clock.advance(3600)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and next(d for d in wave.decisions if d.family == family).decision == "cooldown"
    # The clock jumps 15 days ahead for a moment (one tick), then NTP corrects it.
    real = kit.clock.now()
    kit.clock.set(real + timedelta(days=15))
    await ticks.tick()
    kit.clock.set(real + timedelta(minutes=1))
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None
    decision = next(d for d in wave.decisions if d.family == family)
    assert decision.decision == "cooldown", (
        f"1 h after an incompatible outcome the family is {decision.decision}: {decision.reason}"
    )


async def test_a_longer_cadence_pushed_moves_the_next_wave_to_its_own_slots(kit: Kit) -> None:
    # What this catches: 120 -> 1440 minutes kept the 10:00 slot set under 120, and one
    # wave ran off the new cadence before the daily ones.
    await kit.reconciler.reconcile(REPO, 1)
    ticks = scheduler(kit)
    await ticks.tick()
    kit.clock.advance(60)
    await kit.catalog.on_push(kit.state, push_policy(kit, "wave_every_minutes: 1440\n", "e" * 40))
    ran = await waves_over(kit, ticks, 24 * 3600, step=60)
    assert [t.strftime("%H:%M") for t in ran] == ["00:01"]  # midnight UTC (plus jitter) only


async def test_discovery_and_retention_run_again_after_the_clock_is_set_back(kit: Kit, monkeypatch) -> None:
    # What this catches: a clock that jumped a year ahead and was set back kept discovery of
    # new installations and retention waiting a year: their last run was "in the future".
    await kit.reconciler.reconcile(REPO, 1)
    calls: list[str] = []

    async def discover() -> list[str]:
        calls.append("discover")
        return []

    async def prune() -> None:
        calls.append("prune")

    monkeypatch.setattr(kit.reconciler, "reconcile_new_installations", discover)
    ticks = Scheduler(kit.live, kit.waves, kit.reconciler, kit.outcomes, kit.clock, rng=random.Random(1), prune=prune)
    await ticks.tick()
    kit.clock.set(NOW + timedelta(days=365))
    await ticks.tick()
    kit.clock.set(NOW + timedelta(minutes=1))
    calls.clear()
    await ticks.tick()
    assert calls == ["discover", "prune"]


async def test_retries_that_raise_are_backed_off_not_repeated_at_every_tick(kit: Kit, monkeypatch) -> None:
    # What this catches: with the store refusing writes, a failed reconcile's retry and a
    # due artifact re-read raised out of the tick: GitHub was called again at every tick (and
    # retention skipped) for as long as it lasted.
    from bot.github.errors import Unavailable
    from bot.services.reconcile import FIRST_RETRY
    from tests.services.test_outcomes import completed, with_artifact

    await kit.reconciler.reconcile(REPO, 1)
    with_artifact(kit, 302)
    kit.repo.fail("download", Unavailable(502, "Bad Gateway"))
    await kit.outcomes.on_workflow_run(kit.state, completed(302))
    kit.repo.fail("repository", Unavailable(502, "Bad Gateway"))
    assert await kit.reconciler._try_reconcile(REPO, 1) is False
    kit.clock.advance(max(FIRST_RETRY, timedelta(hours=1)).total_seconds())
    kit.state.meta.next_wave_at = stamp(kit.clock.now() + timedelta(hours=1))
    kit.state.meta.reconciled_at = stamp(kit.clock.now())

    async def refuse(change: object) -> None:
        raise OSError("attempt to write a readonly database")

    monkeypatch.setattr(kit.live.store, "apply", refuse)
    ticks = scheduler(kit)
    calls = []
    for _ in range(10):
        kit.repo.calls.clear()
        await ticks.tick()  # raises nothing
        calls.append(len(kit.repo.calls))
        kit.clock.advance(1)
    assert calls[0] > 0 and calls[1:] == [0] * 9


# A clock that ran ahead (a bad RTC a year ahead; GitHub refuses the App's JWT then, so every
# GitHub call fails) left backoffs set a year ahead: once set back, that work never ran again.

async def test_a_light_reconcile_that_failed_while_the_clock_ran_ahead_runs_again_after_it_is_corrected(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    ticks = scheduler(kit)
    await ticks.tick()
    # The host clock jumps a year ahead; GitHub refuses the App's JWT (exp/iat a year off),
    # so the light reconcile due at that tick fails.
    kit.clock.set(NOW + timedelta(days=365))
    kit.repo.fail("head_sha", Unauthorized(401, "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued"), times=1)
    await ticks.tick()
    # NTP corrects the clock a minute later; GitHub answers again.
    kit.clock.set(NOW + timedelta(minutes=1))
    kit.repo.calls.clear()
    for _ in range(int((LIGHT_RECONCILE_EVERY * 2).total_seconds()) // 600):
        await ticks.tick()
        kit.clock.advance(600)
    assert any(c[0] == "open_pulls" for c in kit.repo.calls), (
        f"no light reconcile in 12 h after the clock came back; backoff={ticks._failing}"
    )


async def test_a_wave_that_failed_while_the_clock_ran_ahead_runs_again_after_it_is_corrected(kit: Kit, monkeypatch) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    ticks = scheduler(kit)
    await ticks.tick()
    kit.state.meta.reconciled_at = stamp(NOW + timedelta(days=365))  # no reconcile in the way
    kit.clock.set(NOW + timedelta(days=365))
    real_apply = kit.live.store.apply

    async def refuse(change: object) -> None:
        raise OSError("disk I/O error")

    monkeypatch.setattr(kit.live.store, "apply", refuse)
    assert await ticks.tick() == []  # the wave due then fails (the store refused its write)
    monkeypatch.setattr(kit.live.store, "apply", real_apply)
    kit.clock.set(NOW + timedelta(minutes=1))
    ran = []
    for _ in range(6 * 3600 // 300):
        ran += await ticks.tick()
        kit.clock.advance(300)
    assert ran, f"no wave for 6 h after the clock was corrected; backoff={ticks._failing}"


# A retry wave and the scheduled wave, both overdue after a downtime, ran one tick apart:
# twice `max_candidates_per_wave` dispatched for one wave time.

async def test_an_overdue_retry_wave_and_scheduled_wave_run_as_one_wave(kit: Kit) -> None:
    kit.repo.put_files({".github/klaud.yml": "max_candidates_per_wave: 2\n"})
    await kit.reconciler.reconcile(REPO, 1)
    assert kit.state.policy.max_candidates_per_wave == 2
    ticks = scheduler(kit)
    await ticks.tick()  # sets next_wave_at: 10:00 (+ jitter)
    kit.clock.set(parse_time(kit.state.meta.next_wave_at))
    kit.repo.fail("dispatch", Unavailable(502, "Bad Gateway"), times=100)  # GitHub unwell
    assert await ticks.tick() == [REPO]  # the 10:00 wave: every dispatch failed
    assert kit.state.meta.retry_wave_at is not None
    kit.repo.clear_failures("dispatch")
    # The process is down (or suspended) from 10:03 until 12:30: both the retry wave (10:05)
    # and the 12:00 wave are overdue when it runs again.
    kit.clock.set(NOW + timedelta(hours=4, minutes=30))
    kit.repo.calls.clear()
    waves = []
    for _ in range(60):
        waves += await ticks.tick()
        kit.clock.advance(1)
    dispatched = [c for c in kit.repo.calls if c[0] == "dispatch"]
    assert len(waves) == 1 and len(dispatched) <= 2, (
        f"{len(waves)} waves in the minute after the downtime, {len(dispatched)} dispatches "
        f"(max_candidates_per_wave {kit.state.policy.max_candidates_per_wave})"
    )


async def test_a_retry_wave_left_due_runs_once_in_dry_run_not_at_every_tick(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.state.meta.retry_wave_at = stamp(NOW + timedelta(minutes=5))  # stored before the restart
    dry = WaveRunner(kit.live, kit.capacity, kit.clock, dry_run=True)
    ticks = Scheduler(kit.live, dry, kit.reconciler, kit.outcomes, kit.clock, rng=random.Random(1))
    kit.clock.advance(6 * 60)
    waves = []
    for _ in range(60):
        waves += await ticks.tick()
        kit.clock.advance(1)
    assert len(waves) <= 1, f"{len(waves)} dry-run waves in one minute; retry_wave_at={kit.state.meta.retry_wave_at}"
