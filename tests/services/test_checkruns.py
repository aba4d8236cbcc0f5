"""The `Klaud Cold` check run of a Klaud PR follows its candidate, against an in-memory repository."""

from __future__ import annotations

from bot.core.events import Artifact, PullRequestEvent
from bot.services.checkruns import CheckPublisher
from tests import scenarios as sc
from tests.services.conftest import NOW, REPO, Kit
from tests.services.fakes import artifact_zip, pull_event
from tests.services.test_catalog_sync import push
from tests.services.test_checkruns_closed import event
from tests.services.test_outcomes import completed

H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"
CAND = sc.candidate(H200)


async def test_the_check_run_of_a_family_removed_from_the_configs_still_completes_with_its_outcome(kit: Kit) -> None:
    # What this catches: Klaud PRs were marked for a new render through the catalog, which
    # no longer holds a removed family: its PR's check run stayed in progress for good.
    await kit.reconciler.reconcile(REPO, 1)
    checks = CheckPublisher(kit.live, kit.clock, delay_seconds=0)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and CAND in wave.selected
    run_id = kit.state.dispatches[H200].run_id
    assert run_id is not None
    await kit.pulls.on_pull_request(kit.state, event("opened", 1000, f"klaud/auto-{CAND}"))
    await checks.settle()
    before, after = kit.repo.head, "e" * 40
    text = sc.NVIDIA
    removed = text[: text.index("dsr1-fp8-h200-trt:")] + text[text.index("gptoss-fp4-b200-vllm:"):]
    kit.repo.files[after] = {**kit.repo.files[before], "configs/nvidia-master.yaml": removed}
    kit.repo.head = after
    await kit.catalog.on_push(kit.state, push("refs/heads/main", before, after))
    assert kit.state.catalog.get(H200) is None
    kit.repo.artifacts_of[run_id] = [Artifact(id=77, name=f"klaud-candidate-{CAND}", expired=False, archive_download_url="x")]
    kit.repo.archives[77] = artifact_zip({"outcome": "validated", "phase": "final-sweep", "pull-request": 1000,
                                          "run-ids": [run_id], "repairs-used": 0})
    await kit.outcomes.on_workflow_run(kit.state, completed(run_id))
    await checks.settle()
    [check] = kit.repo.check_runs.values()
    assert (check["status"], check.get("conclusion")) == ("completed", "success")
    await checks.close()


async def test_closing_a_klaud_pr_takes_it_off_the_check_run_of_another_of_its_family(kit: Kit) -> None:
    # What this catches: a closed PR is gone from the index before its families are listed,
    # so its own family's other Klaud PR kept showing it as an overlap until the next wave.
    from datetime import timedelta

    from bot.core.domain import family_hash

    older = f"{family_hash(H200)}-0123456789abcdef"

    def klaud_pr(action: str, number: int, minutes: int, candidate: str) -> PullRequestEvent:
        return pull_event(action, number, updated_at=NOW + timedelta(minutes=minutes),
                          head_ref=f"klaud/auto-{candidate}", user="klaud-cold[bot]")

    await kit.reconciler.reconcile(REPO, 1)
    checks = CheckPublisher(kit.live, kit.clock, delay_seconds=0)
    await kit.pulls.on_pull_request(kit.state, klaud_pr("opened", 1000, 0, CAND))
    await kit.pulls.on_pull_request(kit.state, klaud_pr("opened", 1001, 1, older))
    await checks.settle()
    head = kit.state.meta.check_runs["1000"]["head_sha"]

    def summary() -> str:
        [check] = [c for c in kit.repo.check_runs.values() if c["head_sha"] == head]
        return str(check["output"]["summary"])

    assert "#1001" in summary()
    await kit.pulls.on_pull_request(kit.state, klaud_pr("closed", 1001, 2, older))
    await checks.settle()
    assert "#1001" not in summary()
    await checks.close()


async def test_a_head_pushed_back_to_keeps_its_one_check_run(kit: Kit) -> None:
    # What this catches: only the latest head's check run was remembered, so a PR pushed
    # back to a head it had before got a second `Klaud Cold` there, the first never updated.
    from datetime import timedelta

    first, second = "a" * 40, "b" * 40

    def moved(action: str, minutes: int, sha: str) -> PullRequestEvent:
        return pull_event(action, 1000, updated_at=NOW + timedelta(minutes=minutes),
                          head_ref=f"klaud/auto-{CAND}", user="klaud-cold[bot]", head_sha=sha)

    await kit.reconciler.reconcile(REPO, 1)
    checks = CheckPublisher(kit.live, kit.clock, delay_seconds=0)
    for minutes, (action, sha) in enumerate([("opened", first), ("synchronize", second), ("synchronize", first)]):
        await kit.pulls.on_pull_request(kit.state, moved(action, minutes, sha))
        await checks.settle()
    heads = [check["head_sha"] for check in kit.repo.check_runs.values()]
    assert sorted(heads) == [first, second]
    await checks.close()


async def test_the_check_run_of_a_candidate_cooling_down_after_two_failed_runs_is_a_failure(kit: Kit) -> None:
    # What this catches (review H): the check run said the capacity deferral before the two
    # failed runs, neutral, while the planner cooled the candidate down for those runs.
    from datetime import timedelta

    from bot.core.domain import Attempt

    deferred = Attempt(CAND, H200, 1, 1, "a" * 40, NOW - timedelta(hours=10), True, "capacity-deferred",
                       "targeted", None, None, None)
    failed = [Attempt(CAND, H200, run_id, 1, "a" * 40, NOW - timedelta(hours=hours), False, None, None, None, None,
                      "run-failed", source="run", failed_job="get-jobs", failed_step="matrix")
              for run_id, hours in ((2, 6), (3, 2))]
    await kit.reconciler.reconcile(REPO, 1)
    for attempt in (deferred, *failed):
        kit.state.record_attempt(attempt)
    checks = CheckPublisher(kit.live, kit.clock, delay_seconds=0)
    await kit.pulls.on_pull_request(kit.state, event("opened", 1000, f"klaud/auto-{CAND}"))
    await checks.settle()
    [check] = kit.repo.check_runs.values()
    assert (check["status"], check.get("conclusion")) == ("completed", "failure")
    assert check["output"]["title"] == "Latest attempt: unverified (run-failed) · cooling down"
    await checks.close()


async def test_a_rerender_asked_while_the_first_check_run_is_published_makes_no_second(kit: Kit) -> None:
    # What this catches: "Re-run all checks" (a forced publish) while the coalesced publish
    # of a new Klaud PR was creating its check run: both found none and both created one.
    import asyncio

    await kit.reconciler.reconcile(REPO, 1)
    await kit.pulls.on_pull_request(kit.state, pull_event("opened", 1000, updated_at=NOW, head_ref=f"klaud/auto-{CAND}",
                                                          user="klaud-cold[bot]", head_sha="a" * 40))
    checks = CheckPublisher(kit.live, kit.clock, delay_seconds=3600)  # the test publishes itself
    await asyncio.gather(checks.publish((REPO, 1000)), checks.rerender_head(kit.state, "a" * 40))
    assert len(kit.repo.check_runs) == 1
    await checks.close(grace=0)
