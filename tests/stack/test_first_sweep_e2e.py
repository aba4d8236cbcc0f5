"""A command written on a repository given to the App while GitHub failed its first
reconcile (the command's delivery given up on) is answered once GitHub is back."""

from __future__ import annotations

from tests.harness import sandbox_stack
from tests.stack.test_installations_e2e import LAB, scenario

H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"
INBOX = {"base_delay": 0.005, "max_delay": 0.02, "max_attempts": 2}  # retries given up at once
LAB_DOWN = {"rules": [{"method": "GET", "route": "/repos/acme/lab$", "status": 502}]}


def replies(run, number: int) -> list[str]:
    return [c["body"] for c in run.github(LAB)["comments"]
            if c["issue_number"] == number and c["user"] == "klaud-cold[bot]"]


async def test_a_command_given_up_on_before_the_repositorys_first_reconcile_is_answered(tmp_path):
    async with sandbox_stack(tmp_path, scenario(), klaud_options={"inbox_options": INBOX}) as run:
        await run.klaud.scheduler.tick()
        run.sandbox.set_faults(LAB_DOWN)
        await run.act({"action": "add_repositories", "repos": [LAB]})  # its reconcile fails
        assert run.klaud.live.repo(LAB) is None
        await run.act({"action": "comment", "repo": LAB, "number": 7, "user": "alice",
                       "body": f"/klaud hold {H200} new driver"})  # its delivery given up on
        assert replies(run, 7) == []
        run.sandbox.set_faults({"rules": []})  # GitHub is back
        for _ in range(8):  # two days of ticks, a few hours apart
            await run.act({"action": "advance_clock", "seconds": 6 * 3600 + 60})
            await run.klaud.scheduler.tick()
            await run.settle()
        assert run.klaud.live.repo(LAB) is not None
        assert len(replies(run, 7)) == 1
        assert H200 in run.klaud.live.repo(LAB).holds
