"""What a process running for weeks must not accumulate: backoff counters, attempts in memory,
retention that never comes, a retry wave skipped every second."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
from structlog.testing import capture_logs

from bot.core.cooldown import ATTEMPT_MEMORY
from bot.core.domain import Attempt, parse_time, stamp
from bot.core.events import Repository
from bot.github.errors import NotFound, Unavailable
from bot.services.reconcile import MAX_RETRY, retry_delay
from bot.services.scheduler import LIGHT_RECONCILE_EVERY, Scheduler
from bot.web.inbox import Inbox
from handlers import router
from handlers.context import WebhookEvent
from tests.services.conftest import REPO, Kit
from tests.services.fakes import FakeRepo


def failed(candidate: str, run_id: int, completed_at: datetime) -> Attempt:
    return Attempt(candidate, None, run_id, 1, "a" * 40, completed_at, True, "failed", "targeted", None, None, None)


@pytest.mark.parametrize("failures", [1, 42, 10_000])
def test_backoff_is_defined_for_any_number_of_failures(failures: int) -> None:
    # 42 failures in a row (36 h of a suspended installation) overflowed timedelta.
    assert timedelta(0) < retry_delay(failures) <= MAX_RETRY
    inbox = Inbox.__new__(Inbox)
    inbox.base_delay, inbox.max_delay = 2.0, 600.0
    assert 0 < inbox.retry_delay(failures) <= 600.0


def idle_scheduler(kit: Kit, **options) -> Scheduler:  # type: ignore[no-untyped-def]
    """A scheduler with no wave or light reconcile due for a day."""
    kit.state.meta.next_wave_at = stamp(kit.clock.now() + timedelta(days=1))
    kit.state.meta.reconciled_at = stamp(kit.clock.now() + timedelta(days=1))
    return Scheduler(kit.live, kit.waves, kit.reconciler, kit.outcomes, kit.clock, **options)


async def test_a_bug_in_one_repositorys_work_is_backed_off_from_and_the_tick_goes_on(kit: Kit, monkeypatch) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    calls = []

    async def broken(state) -> None:  # type: ignore[no-untyped-def]
        calls.append(state.name)
        raise KeyError("a bug")

    monkeypatch.setattr(kit.claims, "check_due", broken)
    kit.state.meta.next_wave_at = stamp(kit.clock.now() - timedelta(minutes=1))
    kit.state.meta.reconciled_at = stamp(kit.clock.now())
    ticks = Scheduler(kit.live, kit.waves, kit.reconciler, kit.outcomes, kit.clock)
    with capture_logs() as logs:
        assert await ticks.tick() == [REPO]  # the wave after the broken step still ran
        for _ in range(30):
            kit.clock.advance(1)
            await ticks.tick()
    assert calls == [REPO]
    assert [entry["event"] for entry in logs if entry["log_level"] == "error"] == ["scheduler.repo_failed"]


async def test_attempts_older_than_any_rule_reads_leave_memory_every_six_hours(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    family = next(iter(kit.state.catalog))
    old = failed(family.candidate, 1, kit.clock.now() - ATTEMPT_MEMORY - timedelta(hours=1))
    recent = failed(family.candidate, 2, kit.clock.now() - timedelta(days=1))
    for each in (old, recent):
        kit.state.record_attempt(each)
    ticks = idle_scheduler(kit)
    await ticks.tick()
    assert len(kit.state.ledger) == 2
    kit.clock.advance(LIGHT_RECONCILE_EVERY.total_seconds())
    await ticks.tick()
    assert kit.state.ledger.for_candidate(family.candidate) == [recent]


async def test_retention_runs_at_the_first_tick_then_every_six_hours(kit: Kit) -> None:
    # A process restarted more often than every 6 hours never pruned anything.
    await kit.reconciler.reconcile(REPO, 1)
    pruned = []

    async def prune() -> None:
        pruned.append(kit.clock.now())

    ticks = idle_scheduler(kit, prune=prune)
    await ticks.tick()
    await ticks.tick()
    assert len(pruned) == 1
    kit.clock.advance(LIGHT_RECONCILE_EVERY.total_seconds())
    await ticks.tick()
    assert len(pruned) == 2


async def test_a_retry_wave_due_when_the_repository_is_disabled_is_dropped(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.fail("dispatch", Unavailable(502, "Bad Gateway"), times=100)
    await kit.waves.run(REPO, trigger="schedule")  # every dispatch failed: a retry in 5 minutes
    assert kit.state.meta.retry_wave_at is not None
    kit.state.set_policy_text("enabled: false\n")
    ticks = idle_scheduler(kit)
    kit.clock.advance(timedelta(minutes=6).total_seconds())
    with capture_logs() as logs:
        for _ in range(60):
            await ticks.tick()
            kit.clock.advance(1)
    assert [entry["event"] for entry in logs].count("wave.skipped") == 1
    assert kit.state.meta.retry_wave_at is None


def series_of(repo: str) -> list[str]:
    from prometheus_client import generate_latest

    from bot.metrics import REGISTRY

    text = generate_latest(REGISTRY).decode()
    return [line for line in text.splitlines() if f'repo="{repo}"' in line and not line.startswith("#")]


async def test_an_uninstalled_repository_leaves_no_metric_series_and_no_cached_wave(kit: Kit) -> None:
    from bot.services.dashboard import DashboardKeeper
    from bot.services.permissions import Permissions

    dashboard = DashboardKeeper(kit.live, Permissions(kit.clock), kit.clock, delay_seconds=0)
    kit.live.wave_listeners.append(dashboard.wave_done)
    await kit.reconciler.reconcile(REPO, 1)
    wave = await kit.waves.run(REPO, trigger="schedule")
    assert series_of(REPO) and wave is not None
    dashboard._last_wave[REPO] = wave  # what wave_done keeps, without publishing

    await kit.live.forget(REPO)  # `installation_repositories` removed

    assert series_of(REPO) == [] and dashboard._last_wave == {}


async def test_a_failed_reconcile_of_a_repository_since_uninstalled_is_not_tried_again(kit: Kit) -> None:
    kit.repo.fail("repository", Unavailable(502, "Bad Gateway"))
    assert await kit.reconciler._try_reconcile(REPO, 1) is False
    await kit.live.forget(REPO)
    kit.repo.fail("repository", NotFound(404, "Not Found"), times=100)
    kit.repo.calls.clear()
    kit.clock.advance(timedelta(hours=2).total_seconds())
    await kit.reconciler.retry_failed()
    assert kit.reconciler.failures == {} and kit.repo.calls == []


async def test_a_repository_deleted_on_github_leaves_memory_at_its_repository_deleted_event(kit: Kit, monkeypatch) -> None:
    """GitHub sends `repository` `deleted` (and no `installation_repositories` to an
    installation on all repositories). Its state, waves, light reconciles (every answer a
    404) and metric series went on for as long as the process ran."""
    await kit.reconciler.reconcile(REPO, 1)
    kit.state.meta.next_wave_at = stamp(kit.clock.now() + timedelta(days=30))

    def gone(operation: str, *args: object) -> None:
        kit.repo.calls.append((operation, *args))
        raise NotFound(404, "Not Found")

    kit.repo._call = gone  # type: ignore[method-assign]  # every route of it answers 404

    async def none_listed(installation: int) -> list[Repository]:
        return []

    async def no_such_id(installation: int, repository_id: int) -> None:
        return None

    monkeypatch.setattr(kit.live.github, "repositories", none_listed)  # no installation lists it
    monkeypatch.setattr(kit.live.github, "repository_by_id", no_such_id)
    body = json.dumps({
        "action": "deleted",
        "repository": {"id": kit.repo.id, "full_name": REPO, "name": "bench", "owner": {"login": "acme"}},
        "installation": {"id": 1},
        "sender": {"login": "alice"},
    }).encode()
    await router.dispatch(WebhookEvent(body, event="repository", delivery_id="d-1", action="deleted"),
                          SimpleNamespace(repos=kit.reconciler))

    ticks = Scheduler(kit.live, kit.waves, kit.reconciler, kit.outcomes, kit.clock)
    kit.repo.calls.clear()
    for _ in range(4 * 24):  # four days, an hour apart: light reconciles and discovery every 6 h
        kit.clock.advance(timedelta(hours=1).total_seconds())
        await ticks.tick()
    assert kit.live.repo(REPO) is None and kit.repo.calls == []


async def test_a_retry_approval_leaves_with_its_candidate_when_the_image_changes(kit: Kit) -> None:
    from bot.services import controls
    from tests import scenarios as sc
    from tests.services.test_catalog_sync import push

    h200, image = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt", "nvcr.io/nvidia/tensorrt-llm/release:1.2.0rc4"
    await kit.reconciler.reconcile(REPO, 1)
    family = kit.state.catalog.get(h200)
    kit.state.record_attempt(failed(family.candidate, 501, kit.clock.now()))  # cooling down
    await controls.approve_retry(kit.live, kit.state, family, "alice", kit.clock.now())
    assert family.candidate in kit.state.retries
    before, after = kit.repo.head, "b" * 40  # a person's image bump is merged before the wave
    kit.repo.files[after] = {**kit.repo.files[before], "configs/nvidia-master.yaml": sc.NVIDIA.replace(image, image + "x")}
    kit.repo.head = after

    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))

    assert kit.state.retries == {} and (await kit.live.store.load(REPO)).get("retry", {}) == {}


async def test_image_bumps_leave_no_ledger_entries_of_candidates_no_family_has(kit: Kit) -> None:
    # What this catches: each image bump gives its family a new candidate, and every plan reads
    # the ledger for every family's candidate; the ledger cached an empty ordered list for each
    # one ever read, with no attempt of it for the trim to forget.
    from tests import scenarios as sc
    from tests.services.test_catalog_sync import push

    await kit.reconciler.reconcile(REPO, 1)
    await kit.waves.preview(REPO)
    head = kit.repo.head
    for n in range(30):
        after = f"{n + 1:040x}"
        bumped = sc.NVIDIA.replace("release:1.2.0rc4", f"release:9.{n}")
        kit.repo.files[after] = {**kit.repo.files[head], "configs/nvidia-master.yaml": bumped}
        kit.repo.head = after
        await kit.catalog.on_push(kit.state, push("refs/heads/main", head, after))
        head = after
        kit.clock.advance(timedelta(hours=2).total_seconds())
        await kit.waves.preview(REPO)  # every wave, /plan and the status page plan like this
    kit.state.forget_attempts_before(kit.clock.now() - timedelta(days=14))  # the six-hourly trim
    cached = kit.state.ledger._ordered
    stale = set(cached) - {family.candidate for family in kit.state.catalog}
    assert not stale, f"{len(stale)} entries of candidates no family has ({len(cached)} in all)"


async def test_a_disabled_repositorys_scheduled_wave_moves_on_to_its_next_slot(kit: Kit) -> None:
    # Left at the slot that passed, it was due, and skipped with a log line, every tick.
    await kit.reconciler.reconcile(REPO, 1)
    kit.state.set_policy_text("enabled: false\n")
    ticks = idle_scheduler(kit)
    await ticks.tick()  # sets the first slot
    due = kit.state.meta.next_wave_at
    assert due is not None
    kit.clock.advance(timedelta(minutes=kit.state.policy.wave_every_minutes + 5).total_seconds())
    with capture_logs() as logs:
        for _ in range(60):
            await ticks.tick()
            kit.clock.advance(1)
    assert [entry["event"] for entry in logs].count("wave.skipped") == 1
    assert kit.state.meta.next_wave_at is not None and kit.state.meta.next_wave_at > due
    assert parse_time(kit.state.meta.next_wave_at) > kit.clock.now()


async def test_the_plan_of_a_disabled_repository_selects_nothing_and_says_why(kit: Kit) -> None:
    # What this catches: `klaud plan`, `/plan` and the status page showing families
    # "selected" for a repository whose policy turned Klaud off, where no wave ever runs.
    await kit.reconciler.reconcile(REPO, 1)
    enabled = await kit.waves.preview(REPO)
    assert enabled is not None and enabled.selected and enabled.blocked is None
    kit.state.set_policy_text("enabled: false\n")
    plan = await kit.waves.preview(REPO)
    assert plan is not None and not plan.selected
    assert plan.blocked is not None and "enabled: false" in plan.blocked.reason
    paused = {d.family for d in plan.decisions if d.decision == "paused"}
    assert paused == {d.family for d in enabled.decisions if d.decision == "selected"}
    assert all("enabled: false" in d.reason for d in plan.decisions if d.family in paused)
    assert await kit.waves.run(REPO, trigger="schedule") is None  # and no wave runs


async def test_failed_reconciles_of_repositories_github_no_longer_has_do_not_pile_up(kit: Kit, monkeypatch) -> None:
    """Repositories added to the installation whose first reconcile met a GitHub outage,
    then deleted (or their access removed) with that webhook lost: each stayed in
    `Reconciler.failures` for good, asked of GitHub every hour (a 404 each time), though
    discovery no longer lists it."""
    await kit.reconciler.reconcile(REPO, 1)
    kit.state.meta.next_wave_at = stamp(kit.clock.now() + timedelta(days=365))
    repos = kit.live.github.repos  # type: ignore[union-attr]

    async def listed(installation: int) -> list[Repository]:  # what GitHub lists now: the kept one
        return [Repository(full_name=REPO, id=kit.repo.id)]

    monkeypatch.setattr(kit.live.github, "repositories", listed)
    ticks = Scheduler(kit.live, kit.waves, kit.reconciler, kit.outcomes, kit.clock)
    churned = 20
    for n in range(churned):  # one repository a day comes and goes
        name = f"acme/tmp-{n}"
        repos[name] = repo = FakeRepo(name, id=7000 + n)
        repo.fail("repository", Unavailable(502, "Bad Gateway"))
        await kit.reconciler.reconcile_all(1, [name])  # `installation_repositories` added, GitHub unwell
        repo.fail("repository", NotFound(404, "Not Found"), times=10_000)  # deleted; its webhook lost
        for _ in range(24):
            kit.clock.advance(timedelta(hours=1).total_seconds())
            await ticks.tick()
    calls = sum(len(repos[f"acme/tmp-{n}"].calls) for n in range(churned))
    assert len(kit.reconciler.failures) <= 1, (
        f"{len(kit.reconciler.failures)} failed reconciles kept, {calls} calls to repositories GitHub no longer has")
