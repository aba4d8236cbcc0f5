"""Live state kept current by events, end to end against the sandbox GitHub (issue 4)."""

from __future__ import annotations

import base64
import io
import zipfile
from datetime import UTC

import pytest

from bot.app import Klaud
from tests import scenarios as sc
from tests.harness import make_settings, sandbox_stack

NV = "configs/nvidia-master.yaml"
B200 = f"{NV}:dsr1-fp4-b200-sglang"
H200 = f"{NV}:dsr1-fp8-h200-trt"
GPTOSS = f"{NV}:gptoss-fp4-b200-vllm"
MI355 = "configs/amd-master.yaml:dsr1-fp8-mi355x-sglang"


def family(state: dict, family_id: str) -> dict:
    return next(f for f in state["families"] if f["family"] == family_id)


def pull(state: dict, number: int) -> dict | None:
    return next((p for p in state["pulls"] if p["number"] == number), None)


def attempts_of(state: dict, candidate: str) -> list[dict]:
    return [a for a in state["attempts"] if a["candidate"] == candidate]


def routes(run) -> dict[str, int]:
    return run.requests["by_route"]


async def test_install_reconcile_builds_the_catalog(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        state = run.state()
        assert {f["family"] for f in state["families"]} == set(sc.FAMILIES)
        b200 = family(state, B200)
        assert b200["candidate"] == "d92e15065c55779d-555679de269db36f"  # domain §3.3 worked example
        assert b200["clusters"] == ["b200-dgxc", "b200-nscale"]
        assert family(state, GPTOSS)["clusters"] == ["b200-nscale"]
        assert state["head_sha"] == run.github()["head_sha"]
        assert state["policy"]["cooldown_hours"] == 24
        async with run.klaud.session.get(f"{run.admin_url}/api/v1/repos/acme/bench/state") as response:
            document = await response.json()
        assert response.status == 200
        design_order = ["repo", "head_sha", "policy", "families", "policy_error", "config_errors", "setup_errors",
                        "blocked", "pulls", "attempts", "holds", "retries", "claims"]  # DESIGN §3.5
        assert [key for key in document if key in design_order] == design_order
        async with run.klaud.session.get(f"{run.admin_url}/api/v1/repos/acme/nope/state") as response:
            assert response.status == 404


async def test_push_rereads_only_changed_configs_and_dates_image_changes(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        before = family(run.state(), B200)
        before_h200 = family(run.state(), H200)["image_changed_at"]
        run.reset_requests()
        bumped = sc.NVIDIA.replace("lmsysorg/sglang:v0.5.16-cu130", "lmsysorg/sglang:v0.5.17-cu130")
        await run.act({"action": "push_default", "repo": "acme/bench", "files": {NV: bumped}})
        state = run.state()
        after = family(state, B200)
        assert after["image"] == "lmsysorg/sglang:v0.5.17-cu130"
        assert after["candidate"] != before["candidate"] and after["candidate"][:16] == before["candidate"][:16]
        assert after["image_changed_at"] == run.sandbox.state_document()["now"]
        # Its image did not change: it keeps the date the history gave it at install.
        assert family(state, H200)["image_changed_at"] == before_h200 == "2025-11-30T08:00:00Z"
        # One compare and one read of the changed file; the AMD config was not read again.
        by_route = routes(run)
        assert by_route.get("GET /repos/{owner}/{repo}/compare/{basehead}") == 1
        contents = [r for r in run.requests["requests"] if r["route"].startswith("GET /repos/{owner}/{repo}/contents")]
        assert [r["path"].split("/contents/")[1].split("?")[0] for r in contents] == [NV]


async def test_config_over_one_megabyte_is_read_through_the_raw_media_type(tmp_path):
    padding = "".join(f"# benchmark note {n:07d}: {'x' * 60}\n" for n in range(16_000))  # about 1.3 MB
    scenario = sc.scenario()
    scenario["repositories"][0]["files"][NV] = sc.NVIDIA + padding
    async with sandbox_stack(tmp_path, scenario) as run:
        assert {f["family"] for f in run.state()["families"]} == set(sc.FAMILIES)


async def test_unparseable_config_keeps_the_last_good_families(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await run.act({"action": "push_default", "repo": "acme/bench", "files": {NV: sc.NVIDIA + "broken: [unclosed\n"}})
        state = run.state()
        assert {f["family"] for f in state["families"]} == set(sc.FAMILIES)
        [error] = [e for e in state["config_errors"] if e["path"] == NV]
        assert "line" in error["detail"]
        # A later good push clears the error.
        await run.act({"action": "push_default", "repo": "acme/bench", "files": {NV: sc.NVIDIA}})
        assert [e for e in run.state()["config_errors"] if e["path"] == NV] == []


async def test_deleted_family_and_added_family_follow_pushes(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        without_gptoss = sc.NVIDIA.split("gptoss-fp4-b200-vllm:")[0]
        added = without_gptoss + "newfam-fp8-b200-sglang:\n  image: lmsysorg/sglang:v0.6.0\n  runner: b200\n  model-prefix: newfam\n  precision: fp8\n  framework: sglang\n"
        await run.act({"action": "push_default", "repo": "acme/bench", "files": {NV: added}})
        ids = {f["family"] for f in run.state()["families"]}
        assert GPTOSS not in ids and f"{NV}:newfam-fp8-b200-sglang" in ids


async def test_invalid_policy_keeps_the_last_good_one(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(policy="cooldown_hours: 48\n")) as run:
        assert run.state()["policy"]["cooldown_hours"] == 48
        await run.act({"action": "push_default", "repo": "acme/bench", "files": {".github/klaud.yml": "cooldown_hours: 500\nsurprise: 1\n"}})
        state = run.state()
        assert state["policy"]["cooldown_hours"] == 48
        assert "cooldown_hours" in state["policy_error"] and "surprise" in state["policy_error"]
        await run.act({"action": "push_default", "repo": "acme/bench", "files": {".github/klaud.yml": "cooldown_hours: 12\n"}})
        state = run.state()
        assert state["policy"]["cooldown_hours"] == 12 and state["policy_error"] is None


async def test_pull_request_lifecycle_fetches_files_once_per_head(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        run.reset_requests()
        await run.act({"action": "open_pull", "repo": "acme/bench", "pull": sc.image_bump(12)})
        assert pull(run.state(), 12)["touches"] == {B200: "image"}
        files_route = "GET /repos/{owner}/{repo}/pulls/{pull_number}/files"
        assert routes(run)[files_route] == 1
        # Metadata-only actions read no files.
        await run.act({"action": "edit_pull", "repo": "acme/bench", "number": 12, "title": "Bump it", "labels": ["x"]})
        await run.act({"action": "edit_pull", "repo": "acme/bench", "number": 12, "draft": True})
        assert routes(run)[files_route] == 1
        assert pull(run.state(), 12)["draft"] is True
        # A new head changes what it touches: now a flag of another family.
        flags = sc.NVIDIA.replace("conc-start: 4, conc-end: 32", "conc-start: 8, conc-end: 32")
        await run.act({"action": "push_pull", "repo": "acme/bench", "number": 12, "files": [{"filename": NV, "status": "modified", "content": flags}]})
        assert pull(run.state(), 12)["touches"] == {H200: "flags"}
        assert routes(run)[files_route] == 2
        await run.act({"action": "close_pull", "repo": "acme/bench", "number": 12})
        assert pull(run.state(), 12) is None


async def test_shared_file_change_touches_nothing(tmp_path):
    shared = {
        "number": 20, "title": "Docs", "user": "carol", "head_ref": "docs", "files": [
            {"filename": ".github/workflows/run-sweep.yml", "status": "modified", "content": "name: sweep\n"},
            {"filename": "perf-changelog.yaml", "status": "modified", "content": "- date: 2026-11-02\n"},
        ],
    }
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await run.act({"action": "open_pull", "repo": "acme/bench", "pull": shared})
        assert pull(run.state(), 20)["touches"] == {}


async def test_omitted_patch_falls_back_to_a_local_diff(tmp_path):
    bumped = sc.NVIDIA.replace("vllm/vllm-openai:v0.11.2", "vllm/vllm-openai:v0.12.0")
    omitted = {"number": 30, "title": "Big", "user": "bob", "head_ref": "big",
               "files": [{"filename": NV, "status": "modified", "patch": None, "content": bumped}]}
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await run.act({"action": "open_pull", "repo": "acme/bench", "pull": omitted})
        assert pull(run.state(), 30)["touches"] == {GPTOSS: "image"}


async def test_an_omitted_patch_is_diffed_from_the_merge_base_not_the_base_tip(tmp_path):
    # GitHub's file list is the head against the merge base; a PR's `base.sha` is the base
    # branch's tip when it was opened. Diffed from there, the PR was charged with every image
    # the default branch bumped since its branch point (over-blocking those families).
    def bumped(text: str, family: str) -> str:
        return text.replace(sc.FAMILIES[family], sc.FAMILIES[family] + "-post1")

    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        run.sandbox.set_faults({"rules": [{"webhook": "pull_request", "action": "opened", "count": 1}]})
        pr = {"number": 30, "title": "Bump gpt-oss", "user": "bob", "head_ref": "bump-gptoss",
              "files": [{"filename": NV, "status": "modified", "patch": None, "content": bumped(sc.NVIDIA, GPTOSS)}]}
        await run.act({"action": "open_pull", "repo": "acme/bench", "pull": pr})
        await run.act({"action": "push_default", "repo": "acme/bench", "files": {NV: bumped(sc.NVIDIA, B200)}})
        repo = run.sandbox.world.repo("acme/bench")
        branch_point, repo.pulls[30].base_sha = repo.pulls[30].base_sha, repo.head_sha  # opened after main moved
        assert repo.merge_base(repo.pulls[30].base_sha, repo.pulls[30].head_sha) == branch_point
        await run.klaud.reconciler.reconcile("acme/bench", 1, light=True)
        assert pull(run.state(), 30)["touches"] == {GPTOSS: "image"}


async def test_idle_human_pr_stays_indexed_but_blocks_nothing(tmp_path):
    idle = sc.image_bump(40, updated_at="2026-11-20T08:00:00Z")
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[idle])) as run:
        state = run.state()
        assert pull(state, 40)["idle"] is True and pull(state, 40)["touches"] == {B200: "image"}
        wave = await run.klaud.waves.preview("acme/bench")
        decision = next(d for d in wave.decisions if d.family == B200)
        assert decision.decision == "selected"


async def test_a_comment_on_an_idle_human_pr_makes_it_block_again(tmp_path):
    # GitHub moves a PR's `updated_at` for a comment on it; Klaud heard of it only at the next
    # light reconcile (up to 6 hours, three waves), and a `/klaud status` there said "idle".
    idle = sc.image_bump(40, updated_at="2026-11-20T08:00:00Z")
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[idle])) as run:
        await run.act({"action": "comment", "repo": "acme/bench", "number": 40, "user": "bob",
                       "body": "Still working on this, rebasing today."})
        world = run.sandbox.state_document()
        on_github = next(p for p in world["repositories"]["acme/bench"]["pulls"] if p["number"] == 40)
        assert on_github["updated_at"] == world["now"]
        assert pull(run.state(), 40)["idle"] is False and pull(run.state(), 40)["updated_at"] == world["now"]
        wave = await run.klaud.waves.preview("acme/bench")
        decision = next(d for d in wave.decisions if d.family == B200)
        assert decision.decision == "overlap", decision.reason


async def test_klaud_own_pr_claims_its_family(tmp_path):
    own = {"number": 50, "title": "[Klaud Cold] bump", "user": "Klaud-Cold", "head_ref": f"klaud/auto-{sc.candidate(H200)}",
           "draft": True, "files": [{"filename": "perf-changelog.yaml", "status": "modified", "content": "- x\n"}]}
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[own])) as run:
        assert pull(run.state(), 50)["klaud_own"] is True
        wave = await run.klaud.waves.preview("acme/bench")
        decision = next(d for d in wave.decisions if d.family == H200)
        assert decision.decision == "claimed" and "#50" in decision.reason


def _zip(members: dict[str, bytes]) -> str:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.parametrize(
    "artifact, error",
    [
        ({"expired": True, "files": {"candidate-diagnostics.json": sc.diagnostics("failed")}}, "artifact-expired"),
        ({"raw_zip_base64": base64.b64encode(b"not a zip at all").decode()}, "not-a-zip"),
        ({"files": {"other.json": {"x": 1}}}, "member-missing"),
        ({"files": {"candidate-diagnostics.json": "{broken"}}, "invalid-json"),
        ({"files": {"candidate-diagnostics.json": {"action-outcome": "success"}}}, "outcome-missing"),
        ({"files": {"candidate-diagnostics.json": sc.diagnostics("validated", "targeted", pull_request=3, run_ids=[1])}}, "outcome-invalid"),
        ({"files": {"candidate-diagnostics.json": sc.diagnostics("failed", "baseline", reason_code="not-a-code")}}, "outcome-invalid"),
        ({"raw_zip_base64": _zip({"../candidate-diagnostics.json": b"{}"})}, "unsafe-path"),
        ({"raw_zip_base64": _zip({"candidate-diagnostics.json": b"{" + b" " * (9 * 1024 * 1024) + b"}"})}, "member-too-large"),
    ],
    ids=["expired", "not-zip", "missing-member", "invalid-json", "no-outcome", "validated-needs-final-sweep",
         "bad-reason-code", "path-traversal", "zip-bomb"],
)
async def test_unreadable_artifacts_are_stored_unverified_with_their_code(tmp_path, artifact, error):
    cand = sc.candidate(H200)
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        spec = {"name": f"klaud-candidate-{cand}", **artifact}
        answer = await run.act({"action": "complete_run", "repo": "acme/bench", "run": {
            "workflow": "klaud-plan.yml", "event": "schedule", "conclusion": "success", "artifacts": [spec]}})
        assert answer["statuses"] == [202]
        [attempt] = attempts_of(run.state(), cand)
        assert (attempt["verified"], attempt["outcome"], attempt["error"]) == (False, None, error)
        # An unreadable outcome never blocks the candidate.
        wave = await run.klaud.waves.preview("acme/bench")
        assert next(d for d in wave.decisions if d.family == H200).decision == "selected"


async def test_transient_download_error_is_retried_in_the_background(tmp_path):
    cand = sc.candidate(H200)
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        run.sandbox.set_faults({"rules": [{"method": "GET", "route": r"/actions/artifacts/\d+/zip", "status": 500, "count": 50}]})
        await run.act({"action": "complete_run", "repo": "acme/bench", "run": {
            "workflow": "klaud-plan.yml", "event": "schedule", "conclusion": "success",
            "artifacts": [{"name": f"klaud-candidate-{cand}", "files": {"candidate-diagnostics.json": sc.diagnostics("readiness-blocked")}}]}})
        [attempt] = attempts_of(run.state(), cand)
        assert attempt["error"] == "download-failed" and not attempt["verified"]
        # The delivery itself finished: the retry happens outside it.
        assert run.klaud.inbox.backlog == 0
        run.sandbox.set_faults({"rules": []})
        await run.act({"action": "advance_clock", "seconds": 3600})
        assert await run.klaud.outcomes.retry_artifacts_of(run.klaud.live.repo("acme/bench")) == 1
        [attempt] = attempts_of(run.state(), cand)
        assert (attempt["verified"], attempt["outcome"]) == (True, "readiness-blocked")
        assert run.klaud.live.repo("acme/bench").pending_artifacts == {}


async def test_artifact_gone_before_its_retry_is_recorded_not_found(tmp_path):
    cand = sc.candidate(H200)
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        run.sandbox.set_faults({"rules": [{"method": "GET", "route": r"/actions/artifacts/\d+", "status": 500}]})
        await run.act({"action": "complete_run", "repo": "acme/bench", "run": {
            "workflow": "klaud-plan.yml", "event": "schedule", "conclusion": "success",
            "artifacts": [{"name": f"klaud-candidate-{cand}", "files": {"candidate-diagnostics.json": sc.diagnostics("failed")}}]}})
        # Still failing at the first retry: rescheduled, not given up.
        await run.act({"action": "advance_clock", "seconds": 3600})
        assert await run.klaud.outcomes.retry_artifacts_of(run.klaud.live.repo("acme/bench")) == 1
        assert len(run.klaud.live.repo("acme/bench").pending_artifacts) == 1
        # Then the artifact is gone for good.
        run.sandbox.set_faults({"rules": [{"method": "GET", "route": r"/actions/artifacts/\d+$", "status": 404}]})
        await run.act({"action": "advance_clock", "seconds": 6 * 3600})
        assert await run.klaud.outcomes.retry_artifacts_of(run.klaud.live.repo("acme/bench")) == 1
        [attempt] = attempts_of(run.state(), cand)
        assert (attempt["verified"], attempt["error"]) == (False, "artifact-not-found")
        assert run.klaud.live.repo("acme/bench").pending_artifacts == {}


async def test_receipt_comment_records_the_same_attempt_once(tmp_path):
    cand = sc.candidate(MI355)
    receipt = (
        f"<!-- klaud-outcome:777:{cand}\n"
        '{"head": "' + "b" * 40 + '", "outcome": {"outcome": "incompatible", "phase": "targeted", "pull-request": 9, '
        '"run-ids": [], "repairs-used": 1}, "validation": null}\n-->\n**incompatible** · Reason: —'
    )
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(9, "dsr1-fp8-h200-trt")])) as run:
        for _ in range(2):
            await run.act({"action": "comment", "repo": "acme/bench", "number": 9, "user": "klaud-cold[bot]", "body": receipt})
        [attempt] = attempts_of(run.state(), cand)
        assert (attempt["verified"], attempt["outcome"], attempt["run_id"]) == (True, "incompatible", 777)
        # The same body from a person is not an outcome, not even from a person whose
        # account is named like the bot (a `User`, not a `Bot`).
        for person in ("carol", "Klaud-Cold"):
            await run.act({"action": "comment", "repo": "acme/bench", "number": 9, "user": person,
                           "body": receipt.replace(":777:", ":778:")})
        assert len(attempts_of(run.state(), cand)) == 1


async def test_restart_rebuilds_from_the_store_without_github(tmp_path):
    cand = sc.candidate(H200)
    scenario = sc.scenario(pulls=[sc.image_bump(12)], runs=[sc.run(101, cand, "readiness-blocked")])
    async with sandbox_stack(tmp_path, scenario) as run:
        before = run.state()
    # A second Klaud on the same store, pointed at a live sandbox: it must not call it.
    async with sandbox_stack(tmp_path, scenario) as second:
        assert second.requests["total"] == 0
        after = second.state()
    for key in ("families", "pulls", "attempts", "head_sha"):
        assert after[key] == before[key], key


async def test_reconcile_catches_up_after_missed_events(tmp_path):
    cand = sc.candidate(H200)
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        target = run.sandbox.deliver_to
        run.sandbox.deliver_to = None  # GitHub's webhooks are lost
        await run.sandbox.act({"action": "close_pull", "repo": "acme/bench", "number": 12})
        await run.sandbox.act({"action": "open_pull", "repo": "acme/bench", "pull": sc.image_bump(13, "gptoss-fp4-b200-vllm")})
        await run.sandbox.act({"action": "complete_run", "repo": "acme/bench", "run": sc.run(202, cand, "failed", completed_at="2026-11-30T07:30:00Z")})
        run.sandbox.deliver_to = target
        assert pull(run.state(), 12) is not None
        report = await run.klaud.reconciler.reconcile("acme/bench", 1)
        state = run.state()
        assert pull(state, 12) is None and pull(state, 13)["touches"] == {GPTOSS: "image"}
        assert [a["outcome"] for a in attempts_of(state, cand)] == ["failed"]
        assert report["pulls_removed"] == 1 and report["after"]["attempts"] == 1


@pytest.mark.parametrize("activity", ["listed", "refused"])
async def test_light_reconcile_catches_a_missed_default_branch_push(tmp_path, activity):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        target, run.sandbox.deliver_to = run.sandbox.deliver_to, None
        bumped = sc.NVIDIA.replace("vllm/vllm-openai:v0.11.2", "vllm/vllm-openai:v0.12.0")
        await run.sandbox.act({"action": "push_default", "repo": "acme/bench", "files": {NV: bumped}})
        pushed_at = run.sandbox.state_document()["now"]
        run.sandbox.deliver_to = target
        assert family(run.state(), GPTOSS)["image"] == "vllm/vllm-openai:v0.11.2"
        await run.act({"action": "advance_clock", "seconds": 3 * 3600})
        if activity == "refused":  # an older GitHub Enterprise Server has no activity API
            run.sandbox.set_faults({"rules": [{"method": "GET", "route": "/activity$", "status": 404}]})
        await run.klaud.reconciler.reconcile("acme/bench", 1, light=True)
        state = run.state()
        assert family(state, GPTOSS)["image"] == "vllm/vllm-openai:v0.12.0"
        # Dated by the repository's activity when the push happened, not when it was found
        # (an image three hours fresher than it is); else, when it was found.
        noticed = run.sandbox.state_document()["now"]
        assert family(state, GPTOSS)["image_changed_at"] == (pushed_at if activity == "listed" else noticed)
        assert family(state, H200)["image_changed_at"] == "2025-11-30T08:00:00Z"  # from the history
        assert state["head_sha"] == run.github()["head_sha"]


async def test_push_whose_compare_is_gone_rereads_every_config(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        run.sandbox.set_faults({"rules": [{"method": "GET", "route": "/compare/", "status": 404}]})
        bumped = sc.AMD.replace("rocm/vllm:rocm7.0.0_vllm_0.10.1", "rocm/vllm:rocm7.1.0_vllm_0.11.0")
        answer = await run.act({"action": "push_default", "repo": "acme/bench", "files": {"configs/amd-master.yaml": bumped}})
        assert answer["statuses"] == [202]
        assert family(run.state(), "configs/amd-master.yaml:llama70b-fp8-mi300x-vllm")["image"] == "rocm/vllm:rocm7.1.0_vllm_0.11.0"


async def test_a_force_push_dropping_a_bump_rereads_every_config(tmp_path):
    # GitHub diffs a comparison from the merge base: the config only the dropped commit
    # changed is not listed, and the catalog kept the image the branch no longer has.
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        start = run.sandbox.world.repo("acme/bench").head_sha
        bumped = sc.NVIDIA.replace("lmsysorg/sglang:v0.5.16-cu130", "lmsysorg/sglang:v0.5.17-cu130")
        await run.act({"action": "push_default", "repo": "acme/bench", "files": {NV: bumped}})
        assert family(run.state(), B200)["image"] == "lmsysorg/sglang:v0.5.17-cu130"
        answer = await run.act({"action": "push_default", "repo": "acme/bench", "onto": start,
                                "files": {"README.md": "unrelated\n"}})
        assert answer["statuses"] == [202]
        assert family(run.state(), B200)["image"] == "lmsysorg/sglang:v0.5.16-cu130"


async def test_a_push_of_more_files_than_a_comparison_lists_rereads_every_config(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        files = {f"benchmarks/page-{n:03d}.md": f"page {n}\n" for n in range(320)}
        # Listed after the 300 files a comparison shows: unseen, its bump was missed.
        files[NV] = sc.NVIDIA.replace("lmsysorg/sglang:v0.5.16-cu130", "lmsysorg/sglang:v0.5.18-cu130")
        await run.act({"action": "push_default", "repo": "acme/bench", "files": files})
        assert family(run.state(), B200)["image"] == "lmsysorg/sglang:v0.5.18-cu130"


async def test_light_reconcile_reads_files_only_for_changed_heads(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12), sc.image_bump(13, "gptoss-fp4-b200-vllm")])) as run:
        run.reset_requests()
        report = await run.klaud.reconciler.reconcile("acme/bench", 1, light=True)
        assert report["files_fetched"] == 0 and report["open_pulls"] == 2
        assert "GET /repos/{owner}/{repo}/pulls/{pull_number}/files" not in routes(run)


async def test_installation_removed_forgets_the_repository(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        payload = {"action": "removed", "installation": {"id": 1}, "repositories_removed": [{"full_name": "acme/bench"}],
                   "repositories_added": [], "sender": {"login": "alice"}}
        import json

        from tests.builders import delivery

        await run.klaud.handle(delivery("x", "installation_repositories", json.dumps(payload).encode()))
        assert run.klaud.live.repo("acme/bench") is None
    # The next process on the store (one at a time: the store is locked) knows nothing of it.
    fresh = Klaud(make_settings(tmp_path / "klaud.db"))
    await fresh.start(drain=False)
    assert fresh.live.repos == {}
    await fresh.stop()


async def test_a_repository_deleted_on_github_is_forgotten_at_its_repository_deleted_event(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        # An installation on all repositories gets no `installation_repositories` removed.
        run.sandbox.set_faults({"rules": [{"webhook": "installation_repositories", "rate": 1.0}]})
        run.reset_requests()
        await run.act({"action": "delete_repository", "repo": "acme/bench"})
        assert run.klaud.live.repo("acme/bench") is None
        assert await run.klaud.live.store.repos() == [] and run.requests["total"] == 0


def rate_limit_series() -> list[str]:
    from prometheus_client import generate_latest

    from bot.metrics import REGISTRY

    text = generate_latest(REGISTRY).decode()
    return [line for line in text.splitlines() if line.startswith("klaud_github_rate_limit_remaining{")]


async def test_an_uninstalled_installation_leaves_no_client_token_lock_or_rate_limit_series(tmp_path):
    # What this catches: each installation ever used kept its client (an ETag cache of up to
    # 32 MiB), its token lock and its metric series for as long as the process ran.
    import json

    from bot.github.client import _Token
    from tests.builders import delivery

    klaud = Klaud(make_settings(tmp_path / "klaud.db"))
    await klaud.start(drain=False)
    try:
        github = klaud.github

        async def mint(installation_id: int) -> _Token:  # GitHub's answer, without HTTP
            now = klaud.clock.timestamp()
            return _Token(f"token t{installation_id}", now + 3600, now)

        github._mint = mint
        before = (len(github._clients), len(github._token_locks), len(rate_limit_series()))
        for installation in range(1000, 1020):
            # What a reconcile of one of its repositories does: its client answers, minting
            # a token and noting the rate limit. Then the App is uninstalled from that account.
            client = klaud.live.github.repo(f"org{installation}/bench", installation).client
            await client._api._credential(None)
            client._api._note_rate_limit("http://127.0.0.1:9/repos/o/r", {"x-ratelimit-remaining": "4999"})
            payload = {"action": "deleted", "installation": {"id": installation, "account": {"login": f"org{installation}"}},
                       "repositories": [], "sender": {"login": "alice"}}
            await klaud.handle(delivery(f"del-{installation}", "installation", json.dumps(payload).encode()))
        assert (len(github._clients), len(github._token_locks), len(rate_limit_series())) == before
    finally:
        await klaud.stop(grace=1)


async def test_github_s_installation_payloads_suspend_unsuspend_and_delete(tmp_path, fixtures):
    import json

    from tests.builders import delivery

    def real(action: str) -> bytes:
        payload = json.loads((fixtures / "octokit-webhooks" / "installation" / f"{action}.payload.json").read_text())
        payload["installation"]["id"] = 1
        payload.pop("repositories", None)  # suspend and unsuspend name none; deleted may not
        return json.dumps(payload).encode()

    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await run.act({"action": "comment", "repo": "acme/bench", "number": 77, "user": "bob",
                       "body": f"/klaud hold {H200} new weights"})
        await run.klaud.handle(delivery("s", "installation", real("suspend")))
        state = run.klaud.live.repo("acme/bench")
        assert state is not None and H200 in state.holds  # kept, holds and all
        run.reset_requests()
        await run.klaud.handle(delivery("u", "installation", real("unsuspend")))
        assert routes(run).get("GET /repos/{owner}/{repo}/commits/{ref}") == 1  # a light reconcile: the head
        await run.klaud.handle(delivery("d", "installation", real("deleted")))
        assert run.klaud.live.repo("acme/bench") is None


async def test_klaud_reconcile_command_against_the_sandbox(tmp_path, monkeypatch, capsys):
    import asyncio
    import json as json_module
    from datetime import datetime

    from aiohttp import web

    from bot.cli import main
    from bot.core.clock import ManualClock
    from bot.runtime import generate_app_key
    from bot.sandbox import Sandbox

    private_pem, public_key = generate_app_key()
    # The command runs on the wall clock; the strict sandbox checks JWTs against its own.
    sandbox = Sandbox(sc.scenario(pulls=[sc.image_bump(12)]), clock=ManualClock(datetime.now(UTC)),
                      strict_auth=True, app_id=7, app_public_key=public_key)
    runner = web.AppRunner(sandbox.create_app(), shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    sandbox.world.origin = f"http://127.0.0.1:{port}"
    key_file = tmp_path / "app.pem"
    key_file.write_text(private_pem)
    for name, value in {"KLAUD_DB": f"sqlite:///{tmp_path / 'r.db'}", "KLAUD_APP_ID": "7",
                        "KLAUD_PRIVATE_KEY_FILE": str(key_file),
                        "KLAUD_GITHUB_URL": f"http://127.0.0.1:{port}/_sandbox/github"}.items():
        monkeypatch.setenv(name, value)
    try:
        assert await asyncio.to_thread(main, ["reconcile", "--repo", "acme/bench"]) == 0
        report = json_module.loads(capsys.readouterr().out)
        assert report["after"]["families"] == 5 and report["open_pulls"] == 1
        assert await asyncio.to_thread(main, ["reconcile", "--repo", "acme/other"]) == 2
    finally:
        await runner.cleanup()


async def test_image_ages_come_from_the_history_of_the_master_configs(tmp_path):
    scenario = sc.scenario()
    repo = scenario["repositories"][0]
    files = dict(repo["files"])
    old_image = sc.FAMILIES[H200]
    first = {**files, "configs/nvidia-master.yaml": sc.NVIDIA.replace(old_image, "nvcr.io/nvidia/tensorrt-llm/release:1.1.0")}
    repo["history"] = [
        {"at": "2026-01-10T09:00:00Z", "message": "Add the families", "files": first},
        {"at": "2026-11-20T09:00:00Z", "message": "Bump dsr1-fp8-h200-trt", "files": {"configs/nvidia-master.yaml": sc.NVIDIA}},
    ]
    async with sandbox_stack(tmp_path, scenario) as run:
        ages = {f["family"]: f["image_changed_at"] for f in run.state()["families"]}
        assert ages[H200] == "2026-11-20T09:00:00Z"
        assert ages["configs/nvidia-master.yaml:dsr1-fp4-b200-sglang"] == "2026-01-10T09:00:00Z"
        assert run.requests["by_route"].get("POST /graphql", 0) == 2  # one blame per master config
