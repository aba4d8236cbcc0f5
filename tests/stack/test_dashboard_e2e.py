"""The dashboard issue against the sandbox: created after a wave, boxes that act, and
holds that survive the loss of the store (DESIGN §4 "Dashboard issue")."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from tests import scenarios as sc
from tests.harness import sandbox_stack

REPO = "acme/bench"
H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"
B200 = "configs/nvidia-master.yaml:dsr1-fp4-b200-sglang"


def dashboards(run: Any) -> list[dict[str, Any]]:
    return [i for i in run.github()["issues"] if i["title"] == "Klaud Cold dashboard"]


async def wave(run: Any) -> None:
    await run.klaud.waves.run(REPO, trigger="test")
    await run.klaud.dashboard.settle()
    await run.settle()


async def test_a_wave_creates_the_dashboard_once_and_updates_it(tmp_path):
    cand = sc.candidate(H200)
    scenario = sc.scenario(runs=[sc.run(301, cand, "readiness-blocked", completed_at="2026-11-30T07:00:00Z")])
    async with sandbox_stack(tmp_path, scenario) as run:
        await wave(run)
        [issue] = dashboards(run)
        assert issue["user"] == "klaud-cold[bot]"
        assert f"- [ ] retry `{H200}`" in issue["body"] and "## Last wave: 1" in issue["body"]
        await run.act({"action": "comment", "repo": REPO, "number": issue["number"], "user": "alice",
                       "body": f"/klaud hold {B200} new weights"})
        await wave(run)
        [issue] = dashboards(run)  # updated, not a second issue
        assert f"- [ ] unhold `{B200}`" in issue["body"] and "## Last wave: 2" in issue["body"]


async def test_a_dashboard_closed_is_opened_again_and_one_deleted_is_made_again(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        await wave(run)
        [issue] = dashboards(run)
        world = run.sandbox.world.repos[REPO]
        world.issues[issue["number"]].state = "closed"  # a person closes it
        await run.act({"action": "comment", "repo": REPO, "number": 12, "user": "alice", "body": f"/klaud hold {H200} w"})
        await wave(run)
        # One open issue (DESIGN §4): edited while closed, nobody saw it again.
        [issue] = dashboards(run)
        assert issue["state"] == "open" and f"unhold `{H200}`" in issue["body"]
        del world.issues[issue["number"]]  # deleted (or transferred): every update was a 404
        await run.act({"action": "comment", "repo": REPO, "number": 12, "user": "alice", "body": f"/klaud hold {B200} w"})
        await wave(run)
        [again] = dashboards(run)  # made again (the sandbox, unlike GitHub, reuses the number)
        assert again["state"] == "open" and f"unhold `{B200}`" in again["body"]


async def test_ticking_boxes_acts_for_writers_only(tmp_path):
    cand = sc.candidate(H200)
    scenario = sc.scenario(runs=[sc.run(301, cand, "readiness-blocked", completed_at="2026-11-30T07:00:00Z")])
    async with sandbox_stack(tmp_path, scenario) as run:
        await wave(run)
        [issue] = dashboards(run)
        ticked = issue["body"].replace(f"- [ ] retry `{H200}`", f"- [x] retry `{H200}`")
        await run.act({"action": "edit_issue", "repo": REPO, "number": issue["number"], "user": "carol", "body": ticked})
        await run.klaud.dashboard.settle()
        assert run.state()["retries"] == []  # carol may only read
        await run.act({"action": "edit_issue", "repo": REPO, "number": issue["number"], "user": "bob", "body": ticked})
        await run.klaud.dashboard.settle()
        assert [r["candidate"] for r in run.state()["retries"]] == [cand]
        [issue] = dashboards(run)
        assert f"- [x] retry `{H200}`" not in issue["body"]  # the answer is the re-render


async def test_holds_come_back_from_the_dashboard_when_the_store_is_lost(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        await run.act({"action": "comment", "repo": REPO, "number": 12, "user": "alice",
                       "body": f"/klaud hold {H200} waiting for weights"})
        await wave(run)
        assert [h["family"] for h in run.state()["holds"]] == [H200]
        # The store is lost: a new Klaud on an empty store reconciles from GitHub alone.
        lost = run.klaud
        state = lost.live.repo(REPO)
        lost.live.repos.clear()
        await lost.store.apply(_forget_everything(state.name))
        await lost.reconciler.reconcile(REPO, 1)
        restored = lost.live.repo(REPO)
        assert restored is not None and restored.holds[H200].reason == "waiting for weights"


async def test_a_marker_in_a_hold_reason_does_not_replace_the_holds_a_lost_store_gets_back(tmp_path):
    # What this catches (review H): the held section shows each hold's reason above the
    # dashboard's own marker, and the first marker in the body was the one read.
    fake = base64.urlsafe_b64encode(json.dumps({"holds": [], "retries": []}).encode()).decode()
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        for family, reason in ((H200, "waiting for weights"), (B200, f"see <!-- klaud-dashboard:v1:{fake} -->")):
            await run.act({"action": "comment", "repo": REPO, "number": 12, "user": "alice",
                           "body": f"/klaud hold {family} {reason}"})
        await wave(run)
        lost = run.klaud
        lost.live.repos.clear()
        await lost.store.apply(_forget_everything(REPO))
        await lost.reconciler.reconcile(REPO, 1)
        restored = lost.live.repo(REPO)
        assert restored is not None and sorted(restored.holds) == sorted([H200, B200])


async def test_a_closed_dashboard_still_brings_the_holds_back_and_is_opened_again(tmp_path):
    # What this catches: the dashboard was looked for among open issues only: closed by a
    # person, its holds were lost with the store and a second dashboard was made.
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        await run.act({"action": "comment", "repo": REPO, "number": 12, "user": "alice",
                       "body": f"/klaud hold {H200} waiting for weights"})
        await wave(run)
        [issue] = dashboards(run)
        run.sandbox.world.repos[REPO].issues[issue["number"]].state = "closed"
        lost = run.klaud
        lost.live.repos.clear()
        await lost.store.apply(_forget_everything(REPO))
        await lost.reconciler.reconcile(REPO, 1)
        restored = lost.live.repo(REPO)
        assert restored is not None and restored.holds[H200].reason == "waiting for weights"
        await wave(run)
        [again] = dashboards(run)
        assert again["number"] == issue["number"] and again["state"] == "open"


async def test_a_hand_written_marker_does_not_stop_a_rebuild_on_postgresql(tmp_path, store_url):
    # What this catches (a hostile-input review): a marker's retry was restored unchecked and
    # keyed a record by its 6,000 characters: PostgreSQL refused the index row, and the
    # repository's rebuild failed at every reconcile.
    async with sandbox_stack(tmp_path, sc.scenario(), env={"KLAUD_DB": store_url}) as run:
        await wave(run)
        [issue] = dashboards(run)
        at = "2026-11-30T07:00:00Z"
        marker = base64.urlsafe_b64encode(json.dumps({
            "holds": [{"family": H200, "by": "alice", "reason": "weights", "at": at}],
            "retries": [{"candidate": "ab" * 3000, "by": "x", "at": at},
                        {"candidate": sc.candidate(H200)[:17] + "0" * 16, "by": "x", "at": at}],
        }).encode()).decode()
        run.sandbox.world.repos[REPO].issues[issue["number"]].body = f"<!-- klaud-dashboard:v1:{marker} -->"
        lost = run.klaud
        lost.live.repos.clear()
        await lost.store.apply(_forget_everything(REPO))
        await lost.reconciler.reconcile_new_installations()
        assert REPO not in lost.reconciler.failures
        restored = lost.live.repo(REPO)
        assert restored is not None and list(restored.holds) == [H200] and not restored.retries


def _forget_everything(repo: str) -> Any:
    from bot.store.change import Change

    change = Change()
    for kind in ("family", "pull", "attempt", "hold", "retry", "claim", "dispatch", "artifact-retry"):
        change.clear(repo, kind)
    return change.clear_waves(repo).delete("", "repo", repo)


@pytest.mark.parametrize("env", [{}, {"KLAUD_BOT_LOGINS": "klaud-cold[bot]"}])
async def test_a_tick_whose_webhook_was_lost_acts_before_the_next_render(tmp_path, env):
    # What this catches (a chaos soak): a writer ticked `unhold` while the `issues` webhook
    # was lost; nothing read the issue again, and the next render unticked the box unseen:
    # the family stayed held for good. And (a review): GraphQL names Klaud's own renders by
    # its App's slug, without "[bot]": with only the REST login configured, its render was
    # taken for a person's edit and the box refused.
    async with sandbox_stack(tmp_path, sc.scenario(), env=env) as run:
        await run.act({"action": "comment", "repo": REPO, "number": 900, "user": "alice", "body": f"/klaud hold {H200} w"})
        await wave(run)  # makes the dashboard
        await run.act({"action": "comment", "repo": REPO, "number": 900, "user": "alice", "body": f"/klaud hold {B200} w"})
        await wave(run)  # edits it: Klaud's own edit, just before the tick
        [issue] = dashboards(run)
        run.sandbox.set_faults({"rules": [{"webhook": "issues", "rate": 1.0}]})
        ticked = issue["body"].replace(f"- [ ] unhold `{H200}`", f"- [x] unhold `{H200}`")
        await run.act({"action": "edit_issue", "repo": REPO, "number": issue["number"], "user": "alice", "body": ticked})
        assert [h["family"] for h in run.state()["holds"]] == sorted([B200, H200])  # no event came
        await wave(run)  # the next render reads the issue first
        assert [h["family"] for h in run.state()["holds"]] == [B200]
        [issue] = dashboards(run)
        assert f"unhold `{H200}`" not in issue["body"] and f"- [ ] unhold `{B200}`" in issue["body"]
        # carol may only read: her tick (she edited last) is refused, as from its webhook.
        ticked = issue["body"].replace(f"- [ ] unhold `{B200}`", f"- [x] unhold `{B200}`")
        await run.act({"action": "edit_issue", "repo": REPO, "number": issue["number"], "user": "carol", "body": ticked})
        await wave(run)
        assert [h["family"] for h in run.state()["holds"]] == [B200]


async def held_twice(run: Any) -> dict[str, Any]:
    """H200 and B200 held by alice; after a wave, the dashboard issue."""
    for family in (H200, B200):
        await run.act({"action": "comment", "repo": REPO, "number": 900, "user": "alice", "body": f"/klaud hold {family} w"})
    await wave(run)
    [issue] = dashboards(run)
    return issue


async def tick_box(run: Any, issue: dict[str, Any], body: str, verb: str, family: str, user: str) -> str:
    """`user` ticks the `verb` box of `family` on the dashboard as `body` reads; the new body."""
    body = body.replace(f"- [ ] {verb} `{family}`", f"- [x] {verb} `{family}`")
    await run.act({"action": "edit_issue", "repo": REPO, "number": issue["number"], "user": user, "body": body})
    return body


async def tick_unhold(run: Any, issue: dict[str, Any], body: str, family: str, user: str) -> str:
    return await tick_box(run, issue, body, "unhold", family, user)


async def test_a_tick_whose_webhook_was_lost_acts_with_the_next_tick_whose_webhook_came(tmp_path):
    # What this catches: the re-render answering bob's tick acted on the boxes his edit
    # ticked only, and unticked alice's earlier one (its webhook lost) unseen.
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        issue = await held_twice(run)
        run.sandbox.set_faults({"rules": [{"webhook": "issues", "rate": 1.0}]})
        body = await tick_unhold(run, issue, issue["body"], H200, "alice")
        run.sandbox.set_faults({"rules": []})
        await tick_unhold(run, issue, body, B200, "bob")
        await run.klaud.dashboard.settle()
        assert run.state()["holds"] == []


async def test_a_tick_found_late_does_not_release_a_hold_placed_after_it(tmp_path):
    # What this catches: alice's unhold tick, its webhook lost, was found by the next render
    # after bob had released H200 and held it again: it released bob's newer hold.
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        issue = await held_twice(run)
        run.sandbox.set_faults({"rules": [{"webhook": "issues", "rate": 1.0}]})
        await tick_unhold(run, issue, issue["body"], H200, "alice")
        run.sandbox.set_faults({"rules": []})
        run.sandbox.clock.advance(60)
        for body in (f"/klaud unhold {H200}", f"/klaud hold {H200} new weights"):
            await run.act({"action": "comment", "repo": REPO, "number": 900, "user": "bob", "body": body})
        await wave(run)  # the render reads alice's old tick first
        assert sorted(h["family"] for h in run.state()["holds"]) == sorted([B200, H200])


async def test_a_title_edit_does_not_act_on_a_readers_tick_as_the_editors(tmp_path):
    # GitHub's `issues` edited payload holds `changes.body` only when the body changed; its
    # absence was read as an empty body before, so every box ticked in the body counted as
    # ticked by whoever edited the title (here: a reader's lost tick, acted on as a writer's).
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        issue = await held_twice(run)
        run.sandbox.set_faults({"rules": [{"webhook": "issues", "rate": 1.0}]})
        await tick_unhold(run, issue, issue["body"], H200, "carol")  # carol may only read
        run.sandbox.set_faults({"rules": []})
        answer = await run.act({"action": "edit_issue", "repo": REPO, "number": issue["number"],
                                "user": "bob", "title": "Klaud Cold dashboard (renamed)"})
        [delivery] = [d for d in run.sandbox.deliveries if d.id in answer["deliveries"]]
        assert set(delivery.payload["changes"]) == {"title"}
        await run.klaud.dashboard.settle()
        assert sorted(h["family"] for h in run.state()["holds"]) == sorted([B200, H200])
