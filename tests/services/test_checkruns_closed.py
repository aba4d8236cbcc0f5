"""A Klaud PR closed while its check run was being written leaves no entry behind."""

from __future__ import annotations

from typing import Any

from bot.core.events import PullRequestEvent
from bot.services.checkruns import CheckPublisher
from tests import scenarios as sc
from tests.services.conftest import NOW, REPO, Kit
from tests.services.fakes import pull_event

H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"


def event(action: str, number: int, head_ref: str) -> PullRequestEvent:
    return pull_event(action, number, updated_at=NOW, head_ref=head_ref, user="klaud-cold[bot]")


async def test_a_klaud_pr_closed_while_its_check_run_is_created_keeps_no_entry(kit: Kit) -> None:
    # The candidate's cleanup closes its PR right as the check run's POST is answered: the
    # entry was written back after the close dropped it, and stayed in the meta for good.
    await kit.reconciler.reconcile(REPO, 1)
    checks = CheckPublisher(kit.live, kit.clock, delay_seconds=0)
    head_ref = f"klaud/auto-{sc.candidate(H200)}"
    create = kit.repo.create_check_run

    async def create_while_the_pr_closes(payload: dict[str, Any]) -> int | None:
        check_id = await create(payload)
        await kit.pulls.on_pull_request(kit.state, event("closed", 1000, head_ref))
        return check_id

    kit.repo.create_check_run = create_while_the_pr_closes  # type: ignore[method-assign]
    await kit.pulls.on_pull_request(kit.state, event("opened", 1000, head_ref))
    await checks.publish((REPO, 1000))
    await checks.close()

    stored = await kit.live.store.get("", "repo", REPO)
    assert kit.state.meta.check_runs == {} and stored["check_runs"] == {}
