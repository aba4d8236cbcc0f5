"""A repository renamed on the sandbox GitHub: Klaud's state follows it, whole, under one name."""

from __future__ import annotations

import json
from typing import Any

from bot.core.doctor import REQUIRED_EVENTS
from tests import scenarios as sc
from tests.builders import delivery
from tests.harness import sandbox_stack

OLD, NEW = "acme/bench", "acme/bench-next"
H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"


async def held_and_planned(run: Any) -> set[str]:
    """A hold and a dispatched wave: what a state rebuilt from GitHub would not keep whole."""
    await run.act({"action": "comment", "repo": OLD, "number": 12, "user": "alice", "body": f"/klaud hold {H200} w"})
    wave = await run.klaud.waves.run(OLD, trigger="test")
    await run.settle()
    assert wave is not None and run.klaud.live.repo(OLD).meta.wave == 1
    return set(run.klaud.live.repo(OLD).dispatches)


def assert_followed(run: Any, dispatched: set[str]) -> None:
    assert [state.name for state in run.klaud.live.repos.values()] == [NEW]
    state = run.klaud.live.repo(NEW)
    assert state.meta.wave == 1 and set(state.dispatches) == dispatched and H200 in state.holds


async def test_repository_renamed_moves_the_state_and_waves_go_to_the_new_name(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        dispatched = await held_and_planned(run)

        await run.act({"action": "rename_repository", "repo": OLD, "name": "bench-next"})

        assert_followed(run, dispatched)
        assert sorted(await run.klaud.store.repos()) == [NEW]
        await run.act({"action": "open_pull", "repo": NEW, "pull": sc.image_bump(20, "gptoss-fp4-b200-vllm")})
        assert run.klaud.live.repo(NEW).overlap.get(20) is not None
        run.reset_requests()
        await run.klaud.waves.run(NEW, trigger="test")
        await run.settle()
        paths = [request["path"] for request in run.requests["requests"] if "/repos/" in request["path"]]
        assert paths and not [path for path in paths if "/repos/acme/bench/" in path], "no redirected request"
        assert run.klaud.live.repo(NEW).meta.wave == 2


async def test_without_the_repository_event_the_first_event_under_the_new_name_moves_the_state(tmp_path):
    scenario = sc.scenario(pulls=[sc.image_bump(12)])
    scenario["repositories"][0]["events"] = sorted(REQUIRED_EVENTS - {"repository"})
    async with sandbox_stack(tmp_path, scenario) as run:
        dispatched = await held_and_planned(run)

        await run.act({"action": "rename_repository", "repo": OLD, "name": "bench-next"})
        assert run.klaud.live.repo(OLD) is not None, "the sandbox withheld the repository event"
        await run.act({"action": "comment", "repo": NEW, "number": 12, "user": "alice", "body": "/klaud help"})

        assert_followed(run, dispatched)
        replies = [c for c in run.github(NEW)["comments"] if c["user"] == "klaud-cold[bot]"]
        assert replies, "the command under the new name was answered"


async def test_repository_transferred_moves_the_state_to_its_new_name(tmp_path):
    # What this catches: a `repository` `transferred` event ignored, so holds and state stay under the old name until some later event happens to move them.
    scenario = sc.scenario()
    scenario["repositories"][0]["events"] = sorted(REQUIRED_EVENTS - {"repository"})
    async with sandbox_stack(tmp_path, scenario) as run:
        await run.act({"action": "comment", "repo": OLD, "number": 12, "user": "alice", "body": f"/klaud hold {H200} w"})
        repo_id = run.klaud.live.repo(OLD).meta.repo_id
        await run.act({"action": "rename_repository", "repo": OLD, "name": "bench-next"})
        assert run.klaud.live.repo(OLD) is not None, "the sandbox withheld the repository event"
        transferred = {"action": "transferred", "repository": {"full_name": NEW, "id": repo_id},
                       "installation": {"id": 1}, "sender": {"login": "alice"}}
        await run.klaud.handle(delivery("t", "repository", json.dumps(transferred).encode()))
        assert [state.name for state in run.klaud.live.repos.values()] == [NEW]
        assert H200 in run.klaud.live.repo(NEW).holds


async def test_a_new_default_branch_is_followed_as_soon_as_the_repository_event_says_so(tmp_path):
    # What this catches: `repository` edited was not handled, so pushes kept being compared
    # with the old default branch until the next light reconcile: a push bumping an image on
    # the new one was ignored and the plan kept the old candidate.
    family = "configs/nvidia-master.yaml:dsr1-fp4-b200-sglang"
    old_image = sc.FAMILIES[family]
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await run.settle()
        repo = run.sandbox.world.repo(OLD)
        repo.refs["refs/heads/trunk"] = repo.refs["refs/heads/main"]
        repo.default_branch = "trunk"  # an admin's change: GitHub sends `repository` edited
        edited = {"action": "edited", "changes": {"default_branch": {"from": "main"}},
                  "repository": {"id": run.klaud.live.repo(OLD).meta.repo_id, "full_name": OLD, "name": "bench",
                                 "default_branch": "trunk"},
                  "installation": {"id": 1}, "sender": {"login": "alice", "type": "User"}}
        await run.klaud.handle(delivery("edited", "repository", json.dumps(edited).encode()))
        assert run.klaud.live.repo(OLD).meta.default_branch == "trunk"
        await run.act({"action": "push_default", "repo": OLD,
                       "files": {"configs/nvidia-master.yaml": sc.NVIDIA.replace(old_image, old_image + "-new")}})
        await run.settle()
        images = {f["family"]: f["image"] for f in run.state()["families"]}
        assert images[family] == old_image + "-new"
