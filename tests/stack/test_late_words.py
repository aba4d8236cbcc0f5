"""The last permitted word on a family's hold stands, whatever reached Klaud late: commands
found by the comment sweep, dashboard ticks whose webhook was lost or that a later edit
carried (each case found by a chaos soak, and failed before its fix)."""

from __future__ import annotations

from typing import Any

from tests import scenarios as sc
from tests.harness import sandbox_stack
from tests.stack.test_dashboard_e2e import (
    dashboards,
    held_twice,
    tick_box,
    tick_unhold,
    wave,
)
from tests.stack.test_people_e2e import comment as comment_on
from tests.stack.test_waves_e2e import decision as decision_of

REPO = "acme/bench"
H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"
B200 = "configs/nvidia-master.yaml:dsr1-fp4-b200-sglang"


def held(run: Any) -> list[str]:
    return sorted(h["family"] for h in run.state()["holds"])


async def comment(run: Any, user: str, body: str, *, lost: bool = False) -> dict[str, Any]:
    """`user`'s comment on #900; with `lost`, its webhook is dropped."""
    if lost:
        run.sandbox.set_faults({"rules": [{"webhook": "issue_comment", "count": 1}]})
    made = await comment_on(run, 900, user, body)
    run.sandbox.set_faults({"rules": []})
    return made


async def comments_a_minute_apart(run: Any, words: list[tuple[str, str, bool]]) -> None:
    """Each (user, body, lost) a comment on #900, a minute after the one before."""
    for index, (user, body, lost) in enumerate(words):
        if index:
            run.sandbox.clock.advance(60)
        await comment(run, user, body, lost=lost)


async def sweep(run: Any) -> dict[str, Any]:
    await run.act({"action": "advance_clock", "seconds": 3600})
    report = await run.klaud.reconciler.reconcile(REPO, 1, light=True)
    await run.settle()
    return report


async def test_a_refused_unhold_by_a_reader_does_not_cancel_a_writers_hold_found_late(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await comments_a_minute_apart(run, [
            ("alice", f"/klaud hold {H200} weights", True),  # t0, webhook lost
            ("carol", f"/klaud unhold {H200}", False),  # t1, carol may only read: refused
        ])
        report = await sweep(run)
        assert report.get("commands_answered") == 1
        assert held(run) == [H200]  # alice's is the last permitted word


async def test_a_hold_found_late_does_not_undo_a_later_unhold_tick(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        issue = await held_twice(run)  # H200, B200 held; dashboard shows their unhold boxes
        run.sandbox.clock.advance(60)
        await comment(run, "alice", f"/klaud hold {H200} still waiting", lost=True)  # t0, lost
        run.sandbox.clock.advance(60)
        await tick_unhold(run, issue, issue["body"], H200, "bob")  # t1, on time: released
        await run.klaud.dashboard.settle()
        assert held(run) == [B200]
        report = await sweep(run)
        assert report.get("commands_answered") == 1
        assert held(run) == [B200]  # bob's tick at t1 is the last word


async def test_an_old_tick_taken_with_a_later_edit_keeps_its_own_time(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        issue = await held_twice(run)
        run.sandbox.set_faults({"rules": [{"webhook": "issues", "rate": 1.0}]})
        body = await tick_unhold(run, issue, issue["body"], H200, "alice")  # t0, lost
        run.sandbox.set_faults({"rules": []})
        run.sandbox.clock.advance(60)
        await comment(run, "alice", f"/klaud hold {H200} new weights")  # t1, on time: hold at t1
        run.sandbox.clock.advance(60)
        await tick_unhold(run, issue, body, B200, "bob")  # t2: bob's edit carries alice's old tick
        await run.klaud.dashboard.settle()
        assert held(run) == [H200]  # alice's tick (t0) predates the hold of t1



async def test_a_later_retry_does_not_cancel_an_earlier_hold_found_late(tmp_path):
    # What this catches: a later `/klaud retry` counted as a later word on the hold (found by a chaos soak).
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await comment(run, "bob", f"/klaud hold {H200} bad weights", lost=True)  # t0, webhook lost
        run.sandbox.clock.advance(90)
        await comment(run, "alice", f"/klaud retry {H200}")  # t1, on time; says nothing on holds
        report = await sweep(run)
        assert report.get("commands_answered") == 1
        assert held(run) == [H200]


NEW = "qwen3-fp8-h200-sglang"
NEW_ID = f"configs/nvidia-master.yaml:{NEW}"


def renamed_block(key: str, new_key: str) -> str:
    """The block of `key` in the scenario's nvidia master config, as family `new_key`."""
    lines = sc.NVIDIA.splitlines()
    start = lines.index(f"{key}:")
    end = next((n for n in range(start + 1, len(lines)) if lines[n] and not lines[n].startswith(" ")), len(lines))
    return "\n".join([f"{new_key}:", *lines[start + 1:end]]).rstrip() + "\n"


async def test_a_refused_later_hold_does_not_cancel_an_earlier_hold_found_late(tmp_path):
    # What this catches: a later command Klaud refused (its family unknown yet) counted as a later word (a chaos soak).
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        run.sandbox.set_faults({"rules": [{"webhook": "push", "count": 1}]})  # Klaud misses the push
        text = sc.NVIDIA.rstrip("\n") + "\n\n" + renamed_block("dsr1-fp8-h200-trt", NEW)
        await run.act({"action": "push_default", "repo": REPO, "files": {"configs/nvidia-master.yaml": text}})
        run.sandbox.set_faults({"rules": []})
        run.sandbox.clock.advance(60)
        await comment(run, "bob", f"/klaud hold {NEW} new weights", lost=True)  # t0, webhook lost
        run.sandbox.clock.advance(30)
        await comment(run, "bob", f"/klaud hold {NEW} new weights")  # t1, on time: family unknown yet
        assert held(run) == []  # refused ("Not done"): it changed nothing
        await sweep(run)  # the light reconcile learns the family and finds the comment of t0
        assert NEW_ID in {f["family"] for f in run.state()["families"]}
        assert held(run) == [NEW_ID]  # bob's t0 hold: no later word changed the family


async def test_a_fresh_tick_releases_a_hold_renewed_before_it(tmp_path):
    # What this catches: a fresh tick, on time, was refused when the hold was renewed after the last render (a chaos soak).
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await held_twice(run)  # H200, B200 held by alice; dashboard rendered with both boxes
        run.sandbox.clock.advance(3600)
        await comment(run, "bob", f"/klaud hold {H200} still broken")  # t1, on time: renewed
        run.sandbox.clock.advance(600)
        [issue] = dashboards(run)  # what bob sees now: H200 held, its unhold box
        assert f"- [ ] unhold `{H200}`" in issue["body"]
        await tick_unhold(run, issue, issue["body"], H200, "bob")  # t2 > t1, on time
        await run.klaud.dashboard.settle()
        assert held(run) == [B200]  # as `/klaud unhold` at t2 would: H200 released


def decision(run: Any, family: str) -> str:
    """The last wave's decision of `family`."""
    return str(decision_of(run.klaud.dashboard._last_wave[REPO], family).decision)


async def test_a_retry_box_found_late_does_not_clear_a_cooldown_begun_after_it(tmp_path):
    # What this catches: a retry box found late stored an approval that cleared a cooldown begun after it (a chaos soak).
    cand = sc.candidate(H200)
    scenario = sc.scenario(runs=[sc.run(301, cand, "readiness-blocked", completed_at="2026-11-30T07:00:00Z")])
    async with sandbox_stack(tmp_path, scenario) as run:
        await wave(run)
        assert decision(run, H200) == "cooldown"
        [issue] = dashboards(run)
        run.sandbox.set_faults({"rules": [{"webhook": "issues", "rate": 1.0}]})
        ticked = issue["body"].replace(f"- [ ] retry `{H200}`", f"- [x] retry `{H200}`")
        await run.act({"action": "edit_issue", "repo": REPO, "number": issue["number"], "user": "alice", "body": ticked})
        run.sandbox.set_faults({"rules": []})  # t0: alice's tick, lost
        run.sandbox.clock.advance(60)
        await comment(run, "bob", f"/klaud retry {H200}")  # t1: on time
        run.sandbox.clock.advance(600)
        await wave(run)  # uses one approval: dispatched; its render finds alice's tick
        assert decision(run, H200) == "selected"
        [active] = [r.id for r in run.sandbox.world.repos[REPO].runs.values()
                    if r.status != "completed" and cand in (r.display_title or "")]
        await run.act({"action": "complete_run", "repo": REPO, "run": {
            "id": active, "conclusion": "success", "artifacts": [{"name": f"klaud-candidate-{cand}",
            "expired": False, "files": {"candidate-diagnostics.json": sc.diagnostics("incompatible")}}]}})
        run.sandbox.clock.advance(3600)
        await wave(run)
        assert decision(run, H200) == "cooldown"  # the incompatible outcome began after both asks

async def test_a_late_hold_does_not_let_a_late_unhold_undo_a_newer_hold(tmp_path):
    # What this catches (a fifth chaos soak): bob's lost hold re-dated alice's newer hold
    # to its own older time, so bob's lost unhold, written between them, released it.
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await comments_a_minute_apart(run, [
            ("bob", f"/klaud hold {H200} a", True),  # t0
            ("bob", f"/klaud unhold {H200}", True),  # t1
            ("alice", f"/klaud hold {H200} b", False),  # t2, on time
        ])
        report = await sweep(run)  # finds t0, then t1
        assert report.get("commands_answered") == 2
        assert held(run) == [H200]


async def test_an_older_unhold_found_late_does_not_let_a_hold_between_undo_a_newer_unhold(tmp_path):
    # What this catches (a chaos soak, seed 66): bob's unhold (t0) and alice's hold (t1) are
    # lost; alice's unhold (t2) comes on time. The sweep answered t0 first, which dated the
    # family's release back from t2 to t0; then t1's hold was no longer "released after" and
    # held the family for good, though the last word was alice's unhold.
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await comments_a_minute_apart(run, [
            ("bob", f"/klaud unhold {H200}", True),  # t0
            ("alice", f"/klaud hold {H200} new weights", True),  # t1
            ("alice", f"/klaud unhold {H200}", False),  # t2, on time
        ])
        assert held(run) == []
        report = await sweep(run)
        assert report.get("commands_answered") == 2
        assert held(run) == []


def cooling_scenario(family: str) -> dict[str, Any]:
    """The scenario, `family`'s candidate cooling down after a verified outcome."""
    return sc.scenario(runs=[sc.run(301, sc.candidate(family), "readiness-blocked", completed_at="2026-11-30T07:00:00Z")])


async def held_and_rendered(run: Any, family: str) -> dict[str, Any]:
    """`family` held by alice; after a wave, the dashboard issue."""
    await comment(run, "alice", f"/klaud hold {family} new weights")
    await wave(run)
    [issue] = dashboards(run)
    return issue


async def test_a_readers_tick_carried_by_a_writers_edit_does_not_act(tmp_path):
    # What this catches (a chaos soak, seed 33): carol (read) ticks `retry`, her `issues`
    # webhook lost; bob (write) then ticks another box on the issue as it now reads, so his
    # edit carries carol's tick. Every box ticked before an edit was taken as the editor's:
    # carol's retry acted as bob's and the family in cooldown was dispatched. DESIGN §4: a
    # box acts for users with write permission.
    async with sandbox_stack(tmp_path, cooling_scenario(H200)) as run:
        issue = await held_and_rendered(run, B200)
        assert decision(run, H200) == "cooldown"
        run.sandbox.set_faults({"rules": [{"webhook": "issues", "rate": 1.0}]})
        by_carol = await tick_box(run, issue, issue["body"], "retry", H200, "carol")
        run.sandbox.set_faults({"rules": []})
        run.sandbox.clock.advance(60)
        await tick_box(run, issue, by_carol, "unhold", B200, "bob")
        await run.klaud.dashboard.settle()
        assert held(run) == []  # bob's own tick acted
        assert run.state()["retries"] == []  # carol may only read
        run.sandbox.clock.advance(600)
        await wave(run)
        assert decision(run, H200) == "cooldown"


async def test_a_readers_lost_tick_is_not_taken_as_the_last_writers_at_the_next_render(tmp_path):
    # What this catches (a chaos soak, seed 28): carol ticks `unhold` (webhook lost), then bob
    # ticks another box (webhook lost too). The next render read the issue, found both boxes
    # ticked, and credited them all to its last editor (bob): carol's unhold released the hold.
    async with sandbox_stack(tmp_path, cooling_scenario(B200)) as run:
        issue = await held_and_rendered(run, H200)
        assert f"- [ ] unhold `{H200}`" in issue["body"] and f"- [ ] retry `{B200}`" in issue["body"]
        run.sandbox.set_faults({"rules": [{"webhook": "issues", "rate": 1.0}]})
        by_carol = await tick_box(run, issue, issue["body"], "unhold", H200, "carol")
        run.sandbox.clock.advance(60)
        await tick_box(run, issue, by_carol, "retry", B200, "bob")
        run.sandbox.set_faults({"rules": []})
        run.sandbox.clock.advance(600)
        await wave(run)  # the render reads the issue first
        assert held(run) == [H200]  # carol may only read
