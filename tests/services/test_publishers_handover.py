"""The check runs and the dashboard of a repository that leaves this process while they are
written (its lease lapsed: another replica keeps it now)."""

from __future__ import annotations

from typing import Any

from structlog.testing import capture_logs

from bot.services.checkruns import CheckPublisher
from bot.services.dashboard import DashboardKeeper
from bot.services.permissions import Permissions
from tests import scenarios as sc
from tests.services.conftest import REPO, Kit
from tests.services.test_checkruns_closed import H200, event


def flush_logs(logs: list[dict[str, Any]]) -> list[tuple[str, str, bool]]:
    return [(e["event"], e["log_level"], "exc_info" in e) for e in logs if "flush" in e["event"]]


async def test_a_check_run_created_as_its_repository_leaves_ends_its_flush_in_one_line(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    checks = CheckPublisher(kit.live, kit.clock, delay_seconds=0)
    create = kit.repo.create_check_run

    async def create_as_it_leaves(payload: dict[str, Any]) -> int | None:
        check_id = await create(payload)
        kit.live.drop(REPO)  # the new owner finds it by its head and updates it
        return check_id

    kit.repo.create_check_run = create_as_it_leaves  # type: ignore[method-assign]
    with capture_logs() as logs:
        await kit.pulls.on_pull_request(kit.state, event("opened", 1000, f"klaud/auto-{sc.candidate(H200)}"))
        await checks.settle()
    await checks.close()
    assert flush_logs(logs) == [("check_flush_failed", "warning", False)]


async def test_a_dashboard_created_as_its_repository_leaves_ends_its_flush_in_one_line(kit: Kit) -> None:
    dashboard = DashboardKeeper(kit.live, Permissions(kit.clock), kit.clock, delay_seconds=0)
    kit.live.wave_listeners.append(dashboard.wave_done)
    await kit.reconciler.reconcile(REPO, 1)
    create = kit.repo.create_issue

    async def create_as_it_leaves(title: str, body: str) -> int:
        number = await create(title, body)
        kit.live.drop(REPO)  # the new owner finds it by its title and updates it
        return number

    kit.repo.create_issue = create_as_it_leaves  # type: ignore[method-assign]
    with capture_logs() as logs:
        assert await kit.waves.run(REPO, trigger="schedule") is not None
        await dashboard.settle()
    await dashboard.close()
    assert [call[0] for call in kit.repo.calls].count("create_issue") == 1
    assert flush_logs(logs) == [("check_flush_failed", "warning", False)]
