"""The scheduler's tick against an in-memory repository: one repository's GitHub trouble is
backed off from and holds up neither its other work nor the tick's later steps."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from structlog.testing import capture_logs

from bot.core.domain import stamp
from bot.github.errors import BadRequest, NotFound
from bot.services.reconcile import FIRST_RETRY
from bot.services.scheduler import LIGHT_RECONCILE_EVERY, Scheduler
from bot.store.change import Change
from bot.store.errors import LeaseTaken
from tests.services.conftest import REPO, Kit
from tests.services.test_claims import TTL, dispatched


def scheduler(kit: Kit) -> Scheduler:
    return Scheduler(kit.live, kit.waves, kit.reconciler, kit.outcomes, kit.clock)


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

    ticks.tick = tick_waiting_on_github  # type: ignore[method-assign]
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
