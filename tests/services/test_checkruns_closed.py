"""A Klaud PR closed while its check run was being written leaves no entry behind."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from structlog.testing import capture_logs

from bot.core.events import PullRequestEvent
from bot.services.checkruns import CheckPublisher
from bot.store.change import Change
from bot.store.errors import StoreUnavailable
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


async def test_a_check_run_is_looked_for_only_when_a_creation_for_its_head_may_have_landed(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    checks = CheckPublisher(kit.live, kit.clock, delay_seconds=0)
    head_ref = f"klaud/auto-{sc.candidate(H200)}"
    kit.repo.calls.clear()
    await kit.pulls.on_pull_request(kit.state, event("opened", 1000, head_ref))
    await checks.settle()
    assert [call[0] for call in kit.repo.calls if "check_run" in call[0]] == ["create_check_run"], (
        "a new head: no search first")

    # The next head's creation is made, but its answer never arrives.
    create = kit.repo.create_check_run

    async def answer_lost(payload: dict[str, Any]) -> int | None:
        await create(payload)
        raise ConnectionError("the answer was lost")

    kit.repo.create_check_run = answer_lost  # type: ignore[method-assign]
    pushed = pull_event("synchronize", 1000, updated_at=NOW + timedelta(minutes=1), head_ref=head_ref,
                        user="klaud-cold[bot]", head_sha="f" * 40)
    await kit.pulls.on_pull_request(kit.state, pushed)
    with pytest.raises(ConnectionError):
        await checks.publish((REPO, 1000), force=True)
    await checks.settle()
    kit.repo.create_check_run = create  # type: ignore[method-assign]
    kit.repo.calls.clear()
    await checks.publish((REPO, 1000), force=True)
    await checks.close()

    assert [call[0] for call in kit.repo.calls] == ["check_run_on", "update_check_run"]


async def test_a_store_refusing_a_check_runs_record_leaves_its_key_usable(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    # The store down for a moment, or the repository taken by another replica meanwhile:
    # the flush fails like after GitHub trouble, and the next change publishes again.
    await kit.reconciler.reconcile(REPO, 1)
    checks = CheckPublisher(kit.live, kit.clock, delay_seconds=0)
    head_ref = f"klaud/auto-{sc.candidate(H200)}"
    apply = kit.live.store.apply
    refusals: list[Exception] = []

    async def refused_once(change: Change) -> None:
        if refusals:
            raise refusals.pop()
        await apply(change)

    monkeypatch.setattr(kit.live.store, "apply", refused_once)
    with capture_logs() as logs:
        await kit.pulls.on_pull_request(kit.state, event("opened", 1000, head_ref))
        refusals.append(StoreUnavailable("the store restarts"))  # when the check run's record is written
        await checks.settle()
    assert [e["event"] for e in logs if "flush" in e["event"]] == ["check_flush_failed"]
    await kit.live.reload_stale()
    await kit.pulls.on_pull_request(kit.state, event("synchronize", 1000, head_ref))
    await checks.settle()
    await checks.close()
    # Published again, the run created before the refusal was found, not created twice.
    assert not refusals and kit.state.meta.check_runs["1000"]["id"] == 9001
    assert [call[0] for call in kit.repo.calls].count("create_check_run") == 1
