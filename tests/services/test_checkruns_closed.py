"""A Klaud PR closed while its check run was being written leaves no entry behind."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from structlog.testing import capture_logs

from bot.core.domain import Dispatch, family_hash
from bot.core.events import PullRequestEvent
from bot.services.checkruns import CheckPublisher
from bot.store.change import Change
from bot.store.errors import StoreUnavailable
from tests import scenarios as sc
from tests.services.conftest import NOW, REPO, Kit
from tests.services.fakes import pull_event

H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"
OLDER = "0123456789abcdef"  # the image part of a candidate the family has since moved on from


def event(action: str, number: int, head_ref: str, **changes: Any) -> PullRequestEvent:
    return pull_event(action, number, updated_at=NOW, head_ref=head_ref, user="klaud-cold[bot]", **changes)


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
    kit.repo.create_check_run = create  # type: ignore[method-assign]
    kit.repo.calls.clear()
    await checks.settle()  # the publish the push marked, which waited for the one above
    await checks.publish((REPO, 1000), force=True)
    await checks.close()

    # Looked for once, found, and updated from then on: never created again.
    assert [call[0] for call in kit.repo.calls] == ["check_run_on", "update_check_run", "update_check_run"]


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


async def test_a_klaud_pr_works_on_the_candidate_its_branch_names(kit: Kit) -> None:
    # What this catches: the check run showed the family's current candidate, not the older one the PR's branch names.
    await kit.reconciler.reconcile(REPO, 1)
    checks = CheckPublisher(kit.live, kit.clock, delay_seconds=0)
    older = f"{family_hash(H200)}-{OLDER}"
    assert older != sc.candidate(H200)
    await kit.pulls.on_pull_request(kit.state, event("opened", 1000, f"klaud/auto-{older}"))
    pull = kit.state.overlap.get(1000)
    assert pull is not None
    view = checks.view(kit.state, pull)
    await checks.close()
    assert view.family is not None and view.family.id == H200
    assert view.candidate == older


async def test_a_dispatch_of_the_familys_newer_candidate_does_not_put_an_older_pr_in_flight(kit: Kit) -> None:
    # What this catches: any dispatch of the family showed the PR's check run in progress, whatever candidate it ran.
    await kit.reconciler.reconcile(REPO, 1)
    checks = CheckPublisher(kit.live, kit.clock, delay_seconds=0)
    older = f"{family_hash(H200)}-{OLDER}"
    await kit.pulls.on_pull_request(kit.state, event("opened", 1000, f"klaud/auto-{older}"))
    await kit.pulls.on_pull_request(kit.state, event("opened", 1001, f"klaud/auto-{sc.candidate(H200)}"))
    kit.state.dispatches[H200] = Dispatch(H200, sc.candidate(H200), 1, "main", NOW)
    older_pr, current_pr = kit.state.overlap.get(1000), kit.state.overlap.get(1001)
    assert older_pr is not None and current_pr is not None
    older_view, current_view = checks.view(kit.state, older_pr), checks.view(kit.state, current_pr)
    await checks.close()
    assert current_view.in_flight and not older_view.in_flight


async def test_a_new_klaud_pr_of_a_family_no_config_names_gets_its_check_run(kit: Kit) -> None:
    # What this catches: a new head was marked only through its family, so a Klaud PR whose family is unknown got no check run.
    await kit.reconciler.reconcile(REPO, 1)
    checks = CheckPublisher(kit.live, kit.clock, delay_seconds=0)
    kit.repo.calls.clear()
    await kit.pulls.on_pull_request(kit.state, event("opened", 1000, f"klaud/auto-{'a' * 16}-{'b' * 16}"))
    await checks.settle()
    await checks.close()
    assert [call[0] for call in kit.repo.calls if "check_run" in call[0]] == ["create_check_run"]
    assert "1000" in kit.state.meta.check_runs


async def test_a_check_run_created_for_a_head_the_pr_left_does_not_replace_the_new_heads_record(
    kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What this catches: the id of a run created on the old head was stored after the PR moved on, so the new head got a second check run.
    await kit.reconciler.reconcile(REPO, 1)
    checks = CheckPublisher(kit.live, kit.clock, delay_seconds=0)
    head_ref = f"klaud/auto-{sc.candidate(H200)}"
    create = kit.repo.create_check_run
    new_head_published: list[asyncio.Task[None]] = []

    async def create_while_the_pr_moves_on(payload: dict[str, Any]) -> int | None:
        check_id = await create(payload)
        if not new_head_published:
            # The PR gets a new head, whose check run is asked for before this answer is used.
            await kit.pulls.on_pull_request(kit.state, event(
                "synchronize", 1000, head_ref, head_sha="f" * 40))
            new_head_published.append(asyncio.create_task(checks.publish((REPO, 1000))))
        return check_id

    monkeypatch.setattr(kit.repo, "create_check_run", create_while_the_pr_moves_on)
    await kit.pulls.on_pull_request(kit.state, event("opened", 1000, head_ref))
    await checks.settle()
    await asyncio.gather(*new_head_published)
    monkeypatch.setattr(kit.repo, "create_check_run", create)
    await checks.publish((REPO, 1000), force=True)
    await checks.close()
    assert kit.state.meta.check_runs["1000"]["head_sha"] == "f" * 40
    on_new_head = [i for i, run in kit.repo.check_runs.items() if run.get("head_sha") == "f" * 40]
    assert len(on_new_head) == 1, kit.repo.check_runs


async def test_a_klaud_prs_check_run_does_not_list_the_pr_itself_as_an_overlap(kit: Kit) -> None:
    # What this catches: the check run listed its own PR as "already working on this family".
    await kit.reconciler.reconcile(REPO, 1)
    checks = CheckPublisher(kit.live, kit.clock, delay_seconds=0)
    await kit.pulls.on_pull_request(kit.state, event("opened", 1000, f"klaud/auto-{sc.candidate(H200)}"))
    pull = kit.state.overlap.get(1000)
    assert pull is not None
    family = kit.state.family_by_hash(family_hash(H200))
    assert family is not None and [o.pr for o in kit.state.overlap.overlaps(family, NOW, 7)] == [1000]
    view = checks.view(kit.state, pull)
    await checks.close()
    assert [o.pr for o in view.overlaps] == []


async def test_no_check_run_is_published_on_a_persons_pr(kit: Kit) -> None:
    # What this catches: publishing a PR that is not Klaud's created a Klaud Cold check run on it.
    await kit.reconciler.reconcile(REPO, 1)
    checks = CheckPublisher(kit.live, kit.clock, delay_seconds=0)
    await kit.pulls.on_pull_request(kit.state, pull_event("opened", 12, updated_at=NOW))
    assert kit.state.overlap.get(12) is not None
    kit.repo.calls.clear()
    await checks.publish((REPO, 12), force=True)
    await checks.close()
    assert [call[0] for call in kit.repo.calls if "check_run" in call[0]] == []
    assert kit.state.meta.check_runs == {}


async def test_a_klaud_pr_reopened_on_the_same_head_keeps_its_one_check_run(kit: Kit) -> None:
    # The close drops the PR's entry; reopened on the same head, its check run was made a
    # second time beside the first (GitHub shows both on the commit).
    await kit.reconciler.reconcile(REPO, 1)
    checks = CheckPublisher(kit.live, kit.clock, delay_seconds=0)
    head_ref = f"klaud/auto-{sc.candidate(H200)}"
    await kit.pulls.on_pull_request(kit.state, event("opened", 1000, head_ref))
    await checks.settle()
    assert len(kit.repo.check_runs) == 1
    for minutes, action in ((1, "closed"), (2, "reopened")):
        later = pull_event(action, 1000, updated_at=NOW + timedelta(minutes=minutes), head_ref=head_ref,
                           user="klaud-cold[bot]")
        kit.repo.calls.clear()
        await kit.pulls.on_pull_request(kit.state, later)
        await checks.settle()
    await checks.close()
    assert [call[0] for call in kit.repo.calls if "check_run" in call[0]] == ["check_run_on", "update_check_run"]
    assert len(kit.repo.check_runs) == 1
