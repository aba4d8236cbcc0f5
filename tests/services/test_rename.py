"""A repository renamed on GitHub: its state follows the new name, never becomes two states.

GitHub answers a renamed repository's old name with a redirect (the `FakeRepos` here answer
both names with the same repository), and events name it as it was called when they were sent.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest

from bot.core.domain import Hold
from bot.core.errors import RepositoryMoved
from bot.core.events import Named, PullRequestEvent, RepoEvent
from bot.store.change import Change
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
    # An event under the new name without the repository's id, and a state stored before
    # ids were kept: the new name is built from GitHub, and the old state must not plan on.
    await planned_and_held(kit)
    claimed = set(kit.state.claims)
    kit.state.meta.repo_id = None
    rename_on_github(kit)
    await kit.reconciler.state_for(event(NEW, repo_id=None))
    assert set(kit.live.repos) == {REPO.lower(), NEW}

    report = await kit.reconciler.reconcile(REPO, 1, light=True)

    assert report["repo"] == NEW
    assert set(kit.live.repos) == {NEW} and await kit.live.store.repos() == [NEW]
    # The claims live on GitHub as refs: the state rebuilt from GitHub has them.
    assert claimed and set(kit.live.repos[NEW].claims) == claimed


async def test_an_old_named_event_whose_new_name_another_replica_keeps_is_handed_on_to_it(kit: Kit) -> None:
    # A replica that owned the old name claims an event queued behind the rename, while the
    # new name's events reached another replica first: the event must reach that one (a
    # `/klaud hold` in it would otherwise go unanswered), and nothing is kept here.
    rename_on_github(kit)

    async def admit(name: str) -> bool:
        return name.lower() != NEW.lower()

    kit.live.admit = admit

    with pytest.raises(RepositoryMoved) as moved:
        await kit.reconciler.state_for(event(REPO))

    assert moved.value.to == NEW
    assert kit.live.repos == {} and await kit.live.store.repos() == []


async def test_the_installation_listing_does_not_build_a_second_state_for_a_renamed_repository(kit: Kit) -> None:
    await planned_and_held(kit)
    rename_on_github(kit)

    assert await kit.reconciler.reconcile_new_installations() == []
    assert set(kit.live.repos) == {REPO.lower()}


async def test_reconciling_the_current_name_moves_the_state_kept_under_the_old_one(kit: Kit) -> None:
    # `klaud reconcile`, or an installation event naming the repository as it is called now,
    # after the rename's events were lost: a second state would plan beside the first.
    await planned_and_held(kit)
    dispatched = set(kit.state.dispatches)
    rename_on_github(kit)

    await kit.reconciler.reconcile(NEW, 1)

    await assert_moved(kit, dispatched)


async def test_a_new_repository_given_the_freed_old_name_gets_a_state_of_its_own(kit: Kit) -> None:
    from tests.services.conftest import scenario_repo

    await planned_and_held(kit)
    dispatched = set(kit.state.dispatches)
    rename_on_github(kit)
    await kit.reconciler.state_for(event(NEW))  # followed
    newcomer = scenario_repo()
    newcomer.id = 9999
    kit.live.github.repos[REPO] = newcomer  # type: ignore[union-attr]

    state = await kit.reconciler.state_for(event(REPO, repo_id=9999))

    assert state is not None and state.meta.repo_id == 9999 and state.name == REPO
    assert state is not kit.live.repo(NEW) and set(kit.live.repo(NEW).dispatches) == dispatched


async def test_a_missed_rename_whose_old_name_was_reused_follows_the_kept_repository_by_its_id(kit: Kit) -> None:
    from tests.services.conftest import scenario_repo

    await planned_and_held(kit)
    dispatched = set(kit.state.dispatches)
    rename_on_github(kit)
    newcomer = scenario_repo()
    newcomer.id = 9999
    kit.live.github.repos[REPO] = newcomer  # type: ignore[union-attr]  # no redirect any more

    await kit.reconciler.reconcile(REPO, 1, light=True)

    moved, fresh = kit.live.repo(NEW), kit.live.repo(REPO)
    assert moved is not None and moved.meta.repo_id == 4242 and set(moved.dispatches) == dispatched
    assert fresh is not None and fresh.meta.repo_id == 9999 and fresh.dispatches == {}
    assert newcomer.writes() == [], "nothing done on the repository that took the name"


async def test_an_old_installations_deleted_event_leaves_the_new_installations_repository(kit: Kit) -> None:
    await planned_and_held(kit)
    # Uninstalled (installation 1) and installed again (2): GitHub does not promise the order,
    # and the two are queued apart, so 'created' may be processed first.
    await kit.reconciler.reconcile_all(2, [REPO])
    await kit.reconciler.forget(1, [Named(full_name=REPO, id=4242)])

    assert kit.live.repo(REPO) is not None and kit.state.meta.installation == 2
    await kit.reconciler.forget(2, [Named(full_name=REPO, id=4242)])
    assert kit.live.repo(REPO) is None and await kit.live.store.repos() == []


async def test_removing_a_repository_by_the_name_of_a_missed_rename_forgets_its_state(kit: Kit) -> None:
    await planned_and_held(kit)
    rename_on_github(kit)

    await kit.reconciler.forget(1, [Named(full_name=NEW, id=4242)])

    assert kit.live.repos == {} and await kit.live.store.repos() == []


async def test_a_section_that_took_its_state_before_the_removal_writes_no_ghost_back(kit: Kit) -> None:
    # A check run's POST answered after the repository was removed: its record written back
    # under the name it left was a ghost loaded at the next start, failing for ever.
    from bot.services.live import GoneRepository

    await kit.reconciler.reconcile(REPO, 1)
    taken = kit.state
    await kit.live.forget(REPO)

    with pytest.raises(GoneRepository):
        await kit.live.persist(taken.save_meta())
    assert await kit.live.store.repos() == [] and kit.live.repos == {}
    await kit.reconciler.reconcile(REPO, 1)  # added back: kept, and written, again
    assert await kit.live.store.repos() == [REPO]


async def test_a_repository_stored_under_an_old_name_it_cannot_load_is_rebuilt_not_handed_on(kit: Kit) -> None:
    # One process (no replicas): a record under an earlier name that cannot be loaded
    # (written by another version, or damaged) names the repository's id. Handed on to
    # that name, the event would come back here until it failed, and every later one too.
    damaged = Change()
    damaged.puts.append(("", "repo", "acme/bench-old", json.dumps({"installation": "one", "repo_id": 4242})))
    await kit.live.store.apply(damaged)
    await kit.live.load()
    assert kit.live.repo("acme/bench-old") is None

    state = await kit.reconciler.state_for(event(REPO))

    assert state is not None and state.name == REPO


def klaud_pr_event(kit: Kit, action: str, repo_name: str, updated_at: datetime) -> PullRequestEvent:
    """Klaud's PR #77 on H200's branch, its repositories named `repo_name` (id 4242)."""
    state = kit.live.repo(REPO) or kit.live.repo(NEW)
    assert state is not None
    family = state.catalog.get(H200)
    assert family is not None
    named = {"full_name": repo_name, "id": 4242}
    return PullRequestEvent.model_validate({
        "action": action, "repository": named, "installation": {"id": 1},
        "pull_request": {
            "number": 77, "title": "[Klaud Cold] bump", "user": {"login": "klaud-cold[bot]", "type": "Bot"},
            "head": {"ref": f"klaud/auto-{family.candidate}", "sha": "c" * 40, "repo": named},
            "base": {"ref": "main", "sha": kit.repo.head, "repo": named},
            "created_at": (NOW - timedelta(hours=1)).isoformat(), "updated_at": updated_at.isoformat(),
        },
    })


async def test_a_klaud_pr_event_sent_under_the_old_name_keeps_the_pr_on_its_family(kit: Kit) -> None:
    # Labeled just before the rename, its delivery (queued under the old name, or redelivered)
    # runs after the move: its head repository still carries the old name, and the same id.
    await kit.reconciler.reconcile(REPO, 1)
    await kit.pulls.on_pull_request(kit.state, klaud_pr_event(kit, "opened", REPO, NOW - timedelta(hours=1)))
    kit.repo.pulls[77] = klaud_pr_event(kit, "labeled", NEW, NOW - timedelta(minutes=30)).pull_request
    rename_on_github(kit)
    moved = await kit.reconciler.state_for(event(NEW))
    assert moved is kit.live.repo(NEW) and moved is not None
    assert moved.overlap.klaud_prs().get(H200) == 77

    late = klaud_pr_event(kit, "labeled", REPO, NOW - timedelta(minutes=30))
    state = await kit.reconciler.state_for(late)
    assert state is moved
    await kit.pulls.on_pull_request(state, late)

    assert state.overlap.klaud_prs().get(H200) == 77


async def test_an_old_name_event_of_a_klaud_pr_does_not_free_its_family_for_the_next_wave(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.pulls[77] = klaud_pr_event(kit, "labeled", NEW, NOW - timedelta(minutes=30)).pull_request
    await kit.pulls.on_pull_request(kit.state, klaud_pr_event(kit, "opened", REPO, NOW - timedelta(hours=1)))
    rename_on_github(kit)
    state = await kit.reconciler.state_for(event(NEW))
    assert state is not None
    before = next(d for d in (await kit.waves.preview_state(state, NOW)).decisions if d.family == H200)
    assert before.decision == "claimed"

    late = klaud_pr_event(kit, "labeled", REPO, NOW - timedelta(minutes=30))
    await kit.pulls.on_pull_request(state, late)

    after = next(d for d in (await kit.waves.preview_state(state, NOW)).decisions if d.family == H200)
    assert (after.decision, after.reason) == (before.decision, before.reason)


class _ReadOnly:
    """A public repository as another installation's token sees it: every read answers,
    every write is refused (403)."""

    def __init__(self, repo: Any) -> None:
        self._repo = repo

    def __getattr__(self, name: str) -> Any:
        from bot.github.errors import BadRequest
        from tests.services.fakes import READS

        value = getattr(self._repo, name)
        if name in READS or not callable(value) or name.startswith("_"):
            return value

        async def refused(*args: Any, **kwargs: Any) -> Any:
            raise BadRequest(403, "Resource not accessible by integration")
        return refused


async def test_a_late_event_of_the_installation_a_public_repository_left_does_not_take_it_back(kit: Kit, monkeypatch) -> None:
    # Transferred to newco, where the App is installation 2, while the installation events
    # were lost. A delivery of installation 1 sent before the transfer and processed after:
    # a light reconcile through installation 1 succeeds (a public repository reads through
    # any installation) and took the repository back, every write then refused with 403.
    await kit.reconciler.reconcile(REPO, 1)
    github = kit.live.github
    moved = "newco/bench"
    kit.repo.name = moved
    github.repos[moved] = kit.repo
    github.moved_to[moved] = github.moved_to[REPO] = 2
    plain = github.repo
    monkeypatch.setattr(github, "repo", lambda full_name, installation: (
        plain(full_name, installation) if installation == 2 else _ReadOnly(plain(full_name, installation))))

    def event(name: str, installation: int) -> RepoEvent:
        return RepoEvent.model_validate({"repository": {"full_name": name, "id": 4242}, "installation": {"id": installation}})

    state = await kit.reconciler.state_for(event(moved, 2))
    assert state is not None and state.name == moved and state.meta.installation == 2
    assert await kit.reconciler.state_for(event(REPO, 1)) is state
    assert state.meta.installation == 2, "a late event of the old installation took the repository back"
    kit.clock.advance(3600)
    wave = await kit.waves.run(moved, trigger="test")
    assert wave is not None and wave.selected, [d.reason for d in wave.decisions][:2]
