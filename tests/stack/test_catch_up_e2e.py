"""A delivery given up on after every retry (GitHub down longer than they last) leaves what
it would have changed due: its repository's light reconcile runs at the next scheduler tick
once GitHub answers, not at the 6-hourly one (a lost event's known limit: hours)."""

from __future__ import annotations

from tests import scenarios as sc
from tests.harness import sandbox_stack
from tests.stack.test_people_e2e import GPTOSS, comment, replies

OUTAGE = {"rules": [{"method": "POST", "route": "/comments$", "status": 502}]}  # every reply refused


async def test_a_command_whose_delivery_failed_through_an_outage_is_answered_once_github_is_back(tmp_path):
    inbox = {"base_delay": 0.005, "max_delay": 0.02, "max_attempts": 2}
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)]),
                             klaud_options={"inbox_options": inbox}) as run:
        await run.klaud.scheduler.tick()  # the first wave is scheduled; nothing is due
        run.sandbox.set_faults(OUTAGE)
        await comment(run, 12, "bob", f"/klaud hold {GPTOSS} waiting for new weights")

        assert replies(run, 12) == []
        run.sandbox.set_faults({"rules": []})  # GitHub is back
        await run.klaud.scheduler.tick()  # the command is younger than the sweep's grace: left
        assert replies(run, 12) == []

        await run.act({"action": "advance_clock", "seconds": 11 * 60})
        await run.klaud.scheduler.tick()
        await run.settle()

        [reply] = replies(run, 12)
        assert "waiting for new weights" in reply
        assert GPTOSS in run.klaud.live.repo("acme/bench").holds
