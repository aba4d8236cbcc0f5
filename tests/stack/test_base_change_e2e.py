"""A pull request retargeted to another base branch, end to end on the sandbox GitHub.

A PR's overlap is what its diff changes (DESIGN §4 "Overlap index"), and GitHub's diff is
the head's against the base: `pull_request` edited with `changes.base` gives it another.
"""

from __future__ import annotations

from typing import Any

from tests import scenarios as sc
from tests.harness import sandbox_stack

REPO = "acme/bench"
B200 = "configs/nvidia-master.yaml:dsr1-fp4-b200-sglang"
BUMP_BRANCH = "bump-dsr1-fp4-b200-sglang"  # sc.image_bump's


async def b200(run: Any) -> tuple[str, tuple[int, ...]]:
    decision = next(d for d in (await run.klaud.waves.preview(REPO)).decisions if d.family == B200)
    return decision.decision, decision.pull_requests


def file_reads(run: Any) -> list[str]:
    return [r["path"] for r in run.requests["requests"] if r["path"].endswith("/files")]


async def retarget(run: Any, base: str) -> None:
    run.reset_requests()
    await run.act({"action": "edit_pull", "repo": REPO, "number": 13, "base": base, "user": "bob"})
    assert file_reads(run) == [f"/repos/{REPO}/pulls/13/files"], "the new base's diff is read"


async def test_a_pr_retargeted_onto_main_overlaps_what_it_brings_and_stops_when_retargeted_away(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        # bob stacks #13 (a README) on #12's bump, then gives up #12 and retargets #13 at
        # main, which brings the bump along.
        await run.act({"action": "open_pull", "repo": REPO, "pull": {
            "title": "Document the bump", "user": "bob", "head_ref": "docs", "base_ref": BUMP_BRANCH,
            "files": [{"filename": "README.md", "status": "added", "content": "# bench\n"}]}})
        assert await b200(run) == ("overlap", (12,))
        await run.act({"action": "close_pull", "repo": REPO, "number": 12})
        assert await b200(run) == ("selected", ())

        await retarget(run, "main")
        assert await b200(run) == ("overlap", (13,))
        await retarget(run, BUMP_BRANCH)
        assert await b200(run) == ("selected", ())
        await retarget(run, "main")
        assert await b200(run) == ("overlap", (13,))
        # A light reconcile keeps what the last base said without reading the files again.
        run.reset_requests()
        await run.klaud.reconciler.reconcile(REPO, 1, light=True)
        await run.settle()
        assert file_reads(run) == [] and await b200(run) == ("overlap", (13,))
