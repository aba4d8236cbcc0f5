"""One open PR whose files GitHub refuses does not keep the light reconcile from repairing
what lost webhooks left (end to end, on the sandbox); it overlaps every family meanwhile."""

from __future__ import annotations

from tests import scenarios as sc
from tests.harness import sandbox_stack
from tests.stack.test_live_state import GPTOSS, NV, pull
from tests.stack.test_waves_e2e import decision

B200 = "configs/nvidia-master.yaml:dsr1-fp4-b200-sglang"
FAULTS = {"rules": [
    {"webhook": "pull_request", "action": "closed", "count": 1},  # PR 12's close: lost
    {"method": "GET", "route": "/pulls/40/files$", "status": 422,
     "message": "Server Error: Sorry, this diff is taking too long to generate."},
]}


async def test_a_pr_closed_while_its_event_was_lost_is_removed_despite_a_pr_whose_files_github_refuses(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        await run.klaud.scheduler.tick()
        preview = await run.klaud.waves.preview("acme/bench")
        assert preview is not None and decision(preview, B200).decision == "overlap"
        run.sandbox.set_faults(FAULTS)
        await run.act({"action": "close_pull", "repo": "acme/bench", "number": 12, "merged": False})
        huge = {**sc.image_bump(40, "dsr1-fp8-h200-trt"), "head_ref": "big-refactor", "title": "Refactor"}
        await run.act({"action": "open_pull", "repo": "acme/bench", "pull": huge})
        for _ in range(3):  # light reconciles, 6 h apart, while the refactor stays open
            await run.act({"action": "advance_clock", "seconds": 6 * 3600 + 60})
            await run.klaud.scheduler.tick()
            await run.settle()
        assert 12 not in [p["number"] for p in run.state()["pulls"]]
        preview = await run.klaud.waves.preview("acme/bench")
        assert preview is not None
        assert decision(preview, B200).reason == "PR #40: file list unavailable; assuming it touches this family"


# GitHub answers a comparison it cannot compute in time with a 500, every time it is asked:
# "Server Error: Sorry, this diff is taking too long to generate." The very PRs whose
# patches it omits (large diffs) are the ones most likely to get it.
_COMPARE_TOO_LONG = {"rules": [{"method": "GET", "route": r"/compare/", "status": 500}]}


async def test_a_comparison_github_cannot_generate_leaves_the_local_diff_from_the_pr_base(tmp_path):
    bumped = sc.NVIDIA.replace("vllm/vllm-openai:v0.11.2", "vllm/vllm-openai:v0.12.0")
    omitted = {"number": 30, "title": "Big", "user": "bob", "head_ref": "big",
               "files": [{"filename": NV, "status": "modified", "patch": None, "content": bumped}]}
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        run.sandbox.set_faults(_COMPARE_TOO_LONG)
        await run.act({"action": "open_pull", "repo": "acme/bench", "pull": omitted})
        # Before the merge base was asked, the PR was diffed from its base.sha and indexed;
        # now its every refresh fails: the event (after its retries), and every reconcile.
        assert pull(run.state(), 30) is not None and pull(run.state(), 30)["touches"] == {GPTOSS: "image"}
        await run.klaud.reconciler.reconcile("acme/bench", 1, light=True)
