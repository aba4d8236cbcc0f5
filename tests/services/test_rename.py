"""A repository renamed on GitHub: its state follows the new name, never becomes two states.

GitHub answers a renamed repository's old name with a redirect (the `FakeRepos` here answer
both names with the same repository), and events name it as it was called when they were sent.
"""

from __future__ import annotations

from bot.core.domain import Hold
from bot.core.events import RepoEvent
from tests.services.conftest import NOW, REPO, Kit

NEW = "acme/bench-next"
H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"


def event(name: str, repo_id: int | None = 4242) -> RepoEvent:
    return RepoEvent.model_validate({"repository": {"full_name": name, "id": repo_id}, "installation": {"id": 1}})


async def planned_and_held(kit: Kit) -> None:
    """A reconciled repository with a wave dispatched and a hold: what a rebuild would lose."""
    await kit.reconciler.reconcile(REPO, 1)
    await kit.live.persist(kit.state.hold(Hold(H200, "alice", "driver bug", NOW)))
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and kit.state.dispatches and kit.state.meta.wave == 1


def rename_on_github(kit: Kit) -> None:
    kit.repo.name = NEW
    kit.live.github.repos[NEW] = kit.repo  # type: ignore[union-attr]


async def assert_moved(kit: Kit, dispatched: set[str]) -> None:
    state = kit.live.repo(NEW)
    assert state is not None and kit.live.repo(REPO) is None
    assert set(kit.live.repos) == {NEW}
    assert state.meta.wave == 1 and set(state.dispatches) == dispatched and H200 in state.holds
    assert await kit.live.store.repos() == [NEW]
    # What the store holds under the new name is the whole state (a restart reads it).
    kit.live.drop(NEW)
    reloaded = await kit.live.load_repo(NEW)
    assert reloaded is not None and reloaded.meta.wave == 1 and set(reloaded.dispatches) == dispatched
    assert H200 in reloaded.holds


async def test_the_light_reconcile_of_a_renamed_repository_moves_its_state_to_the_new_name(kit: Kit) -> None:
    await planned_and_held(kit)
    dispatched = set(kit.state.dispatches)
    rename_on_github(kit)

    report = await kit.reconciler.reconcile(REPO, 1, light=True)

    assert report["moved_from"] == REPO and report["repo"] == NEW and report["light"] is True
    await assert_moved(kit, dispatched)


async def test_the_first_event_under_the_new_name_finds_the_repository_by_its_id(kit: Kit) -> None:
    await planned_and_held(kit)
    dispatched = set(kit.state.dispatches)
    rename_on_github(kit)
    kit.repo.calls.clear()

    state = await kit.reconciler.state_for(event(NEW))

    assert state is kit.live.repo(NEW)
    assert ("directory", "configs", kit.repo.head) not in kit.repo.calls, "moved, not rebuilt by a full reconcile"
    await assert_moved(kit, dispatched)


async def test_events_still_named_by_the_old_name_reach_the_moved_state_without_a_second_one(kit: Kit) -> None:
    await planned_and_held(kit)
    rename_on_github(kit)
    moved = await kit.reconciler.state_for(event(NEW))
    kit.repo.calls.clear()

    assert await kit.reconciler.state_for(event(REPO)) is moved
    assert set(kit.live.repos) == {NEW} and kit.repo.calls == []


async def test_an_old_named_event_after_a_restart_is_matched_by_id_and_asks_github_once(kit: Kit) -> None:
    await planned_and_held(kit)
    rename_on_github(kit)
    await kit.reconciler.reconcile(REPO, 1, light=True)
    kit.live.former.clear()  # a restart: only the store is left
    kit.repo.calls.clear()

    assert await kit.reconciler.state_for(event(REPO)) is kit.live.repo(NEW)
    assert kit.repo.calls.count(("repository",)) == 1
    kit.repo.calls.clear()
    assert await kit.reconciler.state_for(event(REPO)) is kit.live.repo(NEW)
    assert kit.repo.calls == [] and set(kit.live.repos) == {NEW}


async def test_when_the_new_name_was_built_first_the_old_state_is_dropped(kit: Kit) -> None:
    # An event under the new name without the repository's id (an older stored state has
    # none either): the new name is built from GitHub, and the old state must not plan on.
    await planned_and_held(kit)
    claimed = set(kit.state.claims)
    rename_on_github(kit)
    await kit.reconciler.state_for(event(NEW, repo_id=None))
    assert set(kit.live.repos) == {REPO.lower(), NEW}

    report = await kit.reconciler.reconcile(REPO, 1, light=True)

    assert report["repo"] == NEW
    assert set(kit.live.repos) == {NEW} and await kit.live.store.repos() == [NEW]
    # The claims live on GitHub as refs: the state rebuilt from GitHub has them.
    assert claimed and set(kit.live.repos[NEW].claims) == claimed


async def test_the_installation_listing_does_not_build_a_second_state_for_a_renamed_repository(kit: Kit) -> None:
    await planned_and_held(kit)
    rename_on_github(kit)

    assert await kit.reconciler.reconcile_new_installations() == []
    assert set(kit.live.repos) == {REPO.lower()}
