"""A refusal every family's claim or dispatch would get alike stops the wave at the first
(DESIGN §1: a wave dispatches at most a few candidates), through the sandbox's answers."""

from __future__ import annotations

from tests import scenarios as sc
from tests.harness import sandbox_stack

REPO = "acme/bench"


def posts(run, path_end: str) -> int:
    return sum(1 for r in run.requests["requests"] if r["method"] == "POST" and r["path"].endswith(path_end))


async def test_a_wave_after_a_lost_push_removed_the_workflow_dispatches_once(tmp_path) -> None:
    async with sandbox_stack(tmp_path, sc.scenario(policy="max_candidates_per_wave: 1\n")) as run:
        # The candidate workflow is removed by a push whose webhook never arrives: Klaud's
        # setup check still says it is there until the next light reconcile.
        run.sandbox.set_faults({"rules": [{"webhook": "push", "count": 1}]})
        await run.act({"action": "push_default", "repo": REPO,
                       "files": {".github/workflows/klaud-candidate.yml": None}})
        run.sandbox.set_faults({"rules": []})
        assert run.state()["blocked"] is None
        run.reset_requests()
        wave = await run.klaud.waves.run(REPO, trigger="test")
        assert (posts(run, "/dispatches"), posts(run, "/git/refs")) == (1, 1)
        assert wave is not None and wave.selected == ()
        assert not run.klaud.live.repo(REPO).claims, "the refused dispatch's claim is deleted"
        assert [r["method"] for r in run.requests["requests"] if "/git/refs/heads/klaud/" in r["path"]] == ["DELETE"]
