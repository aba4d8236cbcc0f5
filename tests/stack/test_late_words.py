"""The last permitted word on a family's hold stands, whatever reached Klaud late: commands
found by the comment sweep, dashboard ticks whose webhook was lost or that a later edit
carried (each case found by a chaos soak, and failed before its fix)."""

from __future__ import annotations

from typing import Any

from tests import scenarios as sc
from tests.harness import sandbox_stack
from tests.stack.test_dashboard_e2e import held_twice, tick_unhold

REPO = "acme/bench"
H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"
B200 = "configs/nvidia-master.yaml:dsr1-fp4-b200-sglang"


def held(run: Any) -> list[str]:
    return sorted(h["family"] for h in run.state()["holds"])


async def comment(run: Any, user: str, body: str, *, lost: bool = False) -> dict[str, Any]:
    if lost:
        run.sandbox.set_faults({"rules": [{"webhook": "issue_comment", "count": 1}]})
    made = await run.act({"action": "comment", "repo": REPO, "number": 900, "user": user, "body": body})
    run.sandbox.set_faults({"rules": []})
    return made


async def sweep(run: Any) -> dict[str, Any]:
    await run.act({"action": "advance_clock", "seconds": 3600})
    report = await run.klaud.reconciler.reconcile(REPO, 1, light=True)
    await run.settle()
    return report


async def test_a_refused_unhold_by_a_reader_does_not_cancel_a_writers_hold_found_late(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await comment(run, "alice", f"/klaud hold {H200} weights", lost=True)  # t0, webhook lost
        run.sandbox.clock.advance(60)
        await comment(run, "carol", f"/klaud unhold {H200}")  # t1, carol may only read: refused
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
