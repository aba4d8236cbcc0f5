"""Pull requests from forks, end to end on the sandbox GitHub (DESIGN §4 "Overlap index",
"Outcomes"): another account's fork holds the head branch, GitHub's payloads say so."""

from __future__ import annotations

from typing import Any

import pytest

from tests import scenarios as sc
from tests.harness import sandbox_stack

REPO = "acme/bench"
NV = "configs/nvidia-master.yaml"
B200 = f"{NV}:dsr1-fp4-b200-sglang"
H200 = f"{NV}:dsr1-fp8-h200-trt"
FORK = "mallory/bench"


def fork_pull(number: int, **fields: Any) -> dict[str, Any]:
    """mallory's pull request from her fork's `main`: an image bump of B200 unless told."""
    return {**sc.image_bump(number, user="mallory"), "head_ref": "main", "head_repo": FORK, **fields}


def pull_entry(run: Any, number: int) -> dict[str, Any]:
    return next(p for p in run.state()["pulls"] if p["number"] == number)


async def decisions(run: Any) -> dict[str, Any]:
    wave = await run.klaud.waves.preview(REPO)
    return {d.family: d for d in wave.decisions}


async def test_a_fork_pr_changing_a_familys_block_overlaps_it_like_any_human_pr(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        run.reset_requests()
        await run.act({"action": "open_pull", "repo": REPO, "pull": fork_pull(13)})
        entry = pull_entry(run, 13)
        assert (entry["author"], entry["klaud_own"], entry["touches"]) == ("mallory", False, {B200: "image"})
        # Its files are read from the repository it asks to merge into, as any PR's.
        paths = {r["path"] for r in run.requests["requests"]}
        assert paths == {f"/repos/{REPO}/pulls/13/files"}
        overlap = (await decisions(run))[B200]
        assert (overlap.decision, overlap.pull_requests) == ("overlap", (13,))

        await run.act({"action": "push_pull", "repo": REPO, "number": 13,
                       "files": [{"filename": "README.md", "status": "added", "content": "# fork\n"}]})
        assert pull_entry(run, 13)["touches"] == {}
        assert (await decisions(run))[B200].decision == "selected"

        await run.act({"action": "push_pull", "repo": REPO, "number": 13, "files": fork_pull(13)["files"]})
        assert (await decisions(run))[B200].decision == "overlap"
        await run.act({"action": "close_pull", "repo": REPO, "number": 13})
        assert [p["number"] for p in run.state()["pulls"]] == []
        assert (await decisions(run))[B200].decision == "selected"


@pytest.mark.parametrize(("head_repo", "own"), [(None, True), (FORK, False)])
async def test_a_pr_on_a_klaud_branch_is_klauds_own_only_in_the_repository_itself(tmp_path, head_repo, own):
    # Anyone can name a fork's branch `klaud/auto-…`: only the repository's own branch (which
    # only those who may push to it can make) is Klaud's PR, which claims its family.
    branch = f"klaud/auto-{sc.candidate(H200)}"
    pull = {**sc.image_bump(13, user="mallory"), "head_ref": branch, "head_repo": head_repo,
            "files": [{"filename": "README.md", "status": "added", "content": "# mine\n"}]}
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await run.act({"action": "open_pull", "repo": REPO, "pull": pull})
        entry = pull_entry(run, 13)
        assert entry["klaud_own"] is own
        assert ((await decisions(run))[H200].decision == "claimed") is own
        # Klaud's check run goes on its own PRs alone.
        checked = {c["head_sha"] for c in run.github()["check_runs"]}
        assert (entry["head_sha"] in checked) is own
        # A command without a target means the PR's family on a Klaud PR alone.
        await run.act({"action": "comment", "repo": REPO, "number": 13, "user": "alice", "body": "/klaud hold"})
        assert (H200 in run.klaud.live.repo(REPO).holds) is own
        # Rebuilt from the pulls API rather than the webhook, it is the same.
        await run.klaud.reconciler.reconcile(REPO, 1)
        await run.settle()
        assert pull_entry(run, 13)["klaud_own"] is own
        await run.act({"action": "comment", "repo": REPO, "number": 13, "user": "alice", "body": "/klaud unhold"})
        await run.klaud.waves.run(REPO, trigger="test")
        await run.settle()
        dispatched = {d["inputs"]["family"] for d in run.github()["dispatches"]}
        assert (H200 in dispatched) is not own


async def test_outcomes_of_pull_request_runs_from_a_fork_are_never_read(tmp_path):
    # A fork's pull request runs the workflows as its head has them: mallory's rewritten
    # candidate workflow uploads `klaud-candidate-<id>` saying "failed" for H200.
    cand = sc.candidate(H200)
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        opened = await run.act({"action": "open_pull", "repo": REPO, "pull": fork_pull(13)})
        run.reset_requests()
        answer = await run.act({"action": "complete_run", "repo": REPO, "run": {
            "workflow": "klaud-candidate.yml", "event": "pull_request", "head_sha": opened["head_sha"],
            "head_branch": "main", "head_repository": FORK, "actor": "mallory",
            "display_title": f"Klaud Cold candidate {cand}", "pull_requests": [13],
            "artifacts": [{"name": f"klaud-candidate-{cand}",
                           "files": {"candidate-diagnostics.json": sc.diagnostics("failed")}}]}})
        await run.klaud.reconciler.reconcile(REPO, 1)  # a full one reads the last days' runs
        await run.settle()
        assert not [a for a in run.klaud.live.repo(REPO).ledger.all() if a.run_id == answer["run_id"]]
        downloads = [r["path"] for r in run.requests["requests"] if r["path"].endswith("/zip")]
        assert downloads == [], "no artifact of the fork's run was read"
        assert (await decisions(run))[H200].decision == "selected"
