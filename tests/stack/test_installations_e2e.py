"""The App installed, given and denied repositories, uninstalled, suspended, end to end on
the sandbox GitHub (DESIGN §1: `installation` events reconcile the repositories they add;
local state is a cache of GitHub, so what the App loses is forgotten)."""

from __future__ import annotations

import copy
import json
from typing import Any

from tests import scenarios as sc
from tests.builders import delivery
from tests.harness import sandbox_stack

REPO, LAB, GLOBEX = "acme/bench", "acme/lab", "globex/bench"
B200 = "configs/nvidia-master.yaml:dsr1-fp4-b200-sglang"


def scenario() -> dict[str, Any]:
    """acme/bench with the App; acme/lab on the same account and globex/bench on another,
    both as ready for Klaud as acme/bench, without it."""
    made = sc.scenario()
    bench = made["repositories"][0]
    lab = {**copy.deepcopy(bench), "full_name": LAB, "installed": False}
    globex = {**copy.deepcopy(bench), "full_name": GLOBEX, "installation_id": 2, "installed": False}
    made["repositories"] += [lab, globex]
    return made


async def kept(run: Any) -> list[str]:
    """The repositories Klaud keeps, in memory and in its store."""
    in_memory = sorted(state.name for state in run.klaud.live.repos.values())
    assert sorted(await run.klaud.store.repos()) == in_memory
    return in_memory


async def planned(run: Any, repo: str) -> list[str]:
    """The families a wave of `repo` dispatched on GitHub."""
    await run.klaud.waves.run(repo, trigger="test")
    await run.settle()
    return sorted(d["inputs"]["family"] for d in run.github(repo)["dispatches"])


async def test_repositories_given_to_the_app_are_reconciled_and_planned(tmp_path):
    async with sandbox_stack(tmp_path, scenario()) as run:
        assert await kept(run) == [REPO]
        await run.act({"action": "add_repositories", "repos": [LAB]})
        await run.act({"action": "install_app", "repos": [GLOBEX]})

        assert await kept(run) == [REPO, LAB, GLOBEX]
        assert run.klaud.live.repo(GLOBEX).meta.installation == 2
        for repo in (LAB, GLOBEX):
            assert {f["family"] for f in run.state(repo)["families"]} == set(sc.FAMILIES)
            assert await planned(run, repo) == sorted(sc.FAMILIES)


async def test_repositories_the_app_loses_are_forgotten_and_a_new_install_rebuilds_them(tmp_path):
    async with sandbox_stack(tmp_path, scenario()) as run:
        await run.act({"action": "add_repositories", "repos": [LAB]})
        await run.act({"action": "comment", "repo": REPO, "number": 30, "user": "alice",
                       "body": f"/klaud hold {B200} until the fix"})
        dispatched = await planned(run, REPO)  # the wave also writes the dashboard issue
        assert B200 not in dispatched

        await run.act({"action": "remove_repositories", "repos": [LAB]})
        assert await kept(run) == [REPO]
        answer = await run.act({"action": "uninstall_app", "installation_id": 1})
        assert answer["statuses"] == [202]
        assert await kept(run) == []

        installed = await run.act({"action": "install_app", "repos": [REPO]})
        assert await kept(run) == [REPO]
        state = run.klaud.live.repo(REPO)
        assert state.meta.installation == installed["installation_id"] != 1
        # Rebuilt from GitHub: the hold from the dashboard issue, the only place GitHub
        # keeps it, and the wave's dispatches from their claim refs.
        assert B200 in state.holds
        assert sorted(state.claims) == dispatched


async def test_the_old_installations_deleted_coming_after_a_new_install_forgets_nothing(tmp_path):
    async with sandbox_stack(tmp_path, scenario()) as run:
        run.sandbox.set_faults({"rules": [{"webhook": "installation", "action": "deleted", "count": 1}]})
        await run.act({"action": "uninstall_app", "installation_id": 1})
        installed = await run.act({"action": "install_app", "repos": [REPO]})
        assert run.klaud.live.repo(REPO).meta.installation == installed["installation_id"]

        [late] = [d for d in run.sandbox.deliveries if d.outcome == "dropped"]
        await run.klaud.handle(delivery(late.id, late.event, json.dumps(late.payload).encode()))
        await run.settle()
        assert await kept(run) == [REPO]
        assert run.klaud.live.repo(REPO).meta.installation == installed["installation_id"]


async def test_a_pr_opened_while_suspended_is_caught_up_at_unsuspend(tmp_path):
    async with sandbox_stack(tmp_path, scenario()) as run:
        await run.act({"action": "suspend_app", "installation_id": 1})
        assert await kept(run) == [REPO], "a suspended installation's state is kept"

        opened = await run.act({"action": "open_pull", "repo": REPO, "pull": sc.image_bump(12)})
        assert opened["deliveries"] == [], "GitHub sends a suspended installation no webhook"
        assert run.state()["pulls"] == []
        # GitHub refuses the App's writes meanwhile: a wave dispatches nothing, and says why.
        wave = await run.klaud.waves.run(REPO, trigger="test")
        await run.settle()
        assert wave is not None and wave.selected == () and run.github()["dispatches"] == []
        assert all("This installation has been suspended" in d.reason for d in wave.decisions)

        await run.act({"action": "unsuspend_app", "installation_id": 1})
        assert [p["number"] for p in run.state()["pulls"]] == [12]
        decision = next(d for d in (await run.klaud.waves.preview(REPO)).decisions if d.family == B200)
        assert (decision.decision, decision.pull_requests) == ("overlap", (12,))


def reinstalled_while_its_events_were_lost(run: Any) -> int:
    """The App uninstalled and installed again on the account while Klaud was down: GitHub
    sent `installation` deleted and created once, both lost (it does not redeliver)."""
    world = run.sandbox.world
    world.uninstall(1)
    fresh = world.install([world.repo(REPO)])
    assert fresh != 1
    return fresh


async def test_events_after_a_missed_reinstall_go_through_the_new_installation(tmp_path) -> None:
    # The kept installation 1 reaches the repository no more: its events, reconciles and
    # waves all failed (404) until someone deleted its state by hand.
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await run.settle()
        fresh = reinstalled_while_its_events_were_lost(run)
        await run.act({"action": "open_pull", "repo": REPO, "pull": sc.image_bump(40)})
        await run.act({"action": "comment", "repo": REPO, "number": 40, "user": "alice", "body": "/klaud help"})
        assert run.klaud.live.repo(REPO).meta.installation == fresh
        pull = next(p for p in run.state()["pulls"] if p["number"] == 40)
        assert pull["touches"] == {B200: "image"}
        assert [c for c in run.github()["comments"] if c["user"] == "klaud-cold[bot]"], "the command went unanswered"
        # A late event of the old installation leaves the new one, and is processed.
        late = {"action": "edited", "repository": {"full_name": REPO, "id": run.klaud.live.repo(REPO).meta.repo_id},
                "installation": {"id": 1}, "issue": {"number": 1, "body": ""}, "sender": {"login": "bob"}}
        await run.klaud.handle(delivery("late", "issues", json.dumps(late).encode()))
        assert run.klaud.live.repo(REPO).meta.installation == fresh


async def test_discovery_follows_a_repository_to_its_new_installation(tmp_path) -> None:
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await run.settle()
        fresh = reinstalled_while_its_events_were_lost(run)
        await run.klaud.reconciler.reconcile_new_installations()
        assert run.klaud.live.repo(REPO).meta.installation == fresh
        assert REPO not in run.klaud.reconciler.failures
        wave = await run.klaud.waves.run(REPO, trigger="test")
        assert wave is not None and wave.selected, "the wave reaches GitHub through the new installation"
