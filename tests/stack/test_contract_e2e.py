"""DESIGN clauses end to end that no other test checks: the wave metrics, the pause gauge,
`dashboard: false`, `candidate_inputs` on a dispatch, `runners_file` and `outcome_workflows`, check runs refreshed by an overlap, in
progress while in flight and re-rendered at once by a broken config or a setup error, and a
delivery read as `processing` while its handler runs."""

from __future__ import annotations

import asyncio

from bot.metrics import REGISTRY
from tests import scenarios as sc
from tests.harness import running_klaud, sandbox_stack
from tests.stack.test_people_e2e import checks, klaud_pr
from tests.web.test_ingest import PR_PAYLOAD, Recorder, make_klaud

REPO = "acme/bench"
NV = "configs/nvidia-master.yaml"
H200 = f"{NV}:dsr1-fp8-h200-trt"
B200 = f"{NV}:dsr1-fp4-b200-sglang"


def sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_wave_duration_and_candidates_by_decision_metrics_move(tmp_path):
    # DESIGN §3.3 /metrics: "wave duration ... candidates by decision".
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        waves_before = sample("klaud_wave_seconds_count", {})
        selected_before = sample("klaud_candidates_total", {"decision": "selected"})
        wave = await run.klaud.waves.run(REPO, trigger="test")
        assert sample("klaud_wave_seconds_count", {}) == waves_before + 1
        assert sample("klaud_candidates_total", {"decision": "selected"}) == selected_before + len(wave.selected)


async def test_a_pause_sets_klaud_dispatch_paused(tmp_path):
    # DESIGN §4 "Failures before an outcome": the pause shows on ... `klaud_dispatch_paused`.
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        wave = await run.klaud.waves.run(REPO, trigger="test")
        assert len(wave.selected) >= 3
        failing = [{"name": "get-jobs", "conclusion": "failure", "steps": [{"name": "matrix", "conclusion": "failure"}]}]
        for dispatch in run.github()["dispatches"][:3]:
            await run.act({"action": "complete_run", "repo": REPO,
                           "run": {"id": dispatch["run_id"], "conclusion": "failure", "jobs": failing}})
        assert run.klaud.live.repo(REPO).blocked().code == "dispatch-paused"
        await run.klaud.waves.run(REPO, trigger="test")
        assert sample("klaud_dispatch_paused", {"repo": REPO}) == 1


async def test_a_setup_error_or_enabled_false_from_a_push_sets_klaud_dispatch_paused_at_once(tmp_path):
    # What this catches: the gauge was set only by waves and pauses, so a setup error (or a
    # policy turning Klaud off) pushed after a wave showed on /plan at once, on /metrics
    # only after the next wave.
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await run.klaud.waves.run(REPO, trigger="test")
        assert sample("klaud_dispatch_paused", {"repo": REPO}) == 0
        await run.act({"action": "push_default", "repo": REPO,
                       "files": {".github/klaud.yml": "candidate_workflow: klaud-candidat.yml\n"}})
        await run.settle()
        assert run.klaud.live.repo(REPO).blocked().code == "setup-error"
        assert sample("klaud_dispatch_paused", {"repo": REPO}) == 1
        await run.act({"action": "push_default", "repo": REPO, "files": {".github/klaud.yml": "enabled: false\n"}})
        await run.settle()
        assert run.klaud.live.repo(REPO).blocked() is None
        assert sample("klaud_dispatch_paused", {"repo": REPO}) == 1


async def test_dashboard_false_keeps_no_dashboard_issue(tmp_path):
    # DESIGN §3.6 `dashboard: true` (keep the dashboard issue): false must keep none.
    async with sandbox_stack(tmp_path, sc.scenario(policy="dashboard: false\n")) as run:
        await run.klaud.waves.run(REPO, trigger="test")
        await run.settle()
        assert [i for i in run.github()["issues"] if i["title"] == "Klaud Cold dashboard"] == []


async def test_candidate_inputs_renames_and_omits_inputs_on_dispatch(tmp_path):
    # DESIGN §3.6 candidate_inputs: "Klaud's value -> the workflow input that receives it;
    # leave out a key to not send it".
    workflow = sc.CANDIDATE_WORKFLOW.replace(
        "      candidate: {required: true, type: string}\n      family: {required: true, type: string}\n"
        "      base: {required: true, type: string}\n      wave: {required: true, type: string}\n",
        "      cand_id: {required: true, type: string}\n",
    ).replace("inputs.candidate", "inputs.cand_id")
    scenario = sc.scenario(policy="candidate_inputs: {candidate: cand_id}\n")
    scenario["repositories"][0]["files"][".github/workflows/klaud-candidate.yml"] = workflow
    async with sandbox_stack(tmp_path, scenario) as run:
        wave = await run.klaud.waves.run(REPO, trigger="test")
        assert wave.selected
        sent = [d["inputs"] for d in run.github()["dispatches"]]
        assert sent and all(set(inputs) == {"cand_id"} for inputs in sent)
        assert {inputs["cand_id"] for inputs in sent} == set(wave.selected)


async def test_an_overlapping_pr_refreshes_the_klaud_check_run(tmp_path):
    # DESIGN §4 "Check run": refreshed "when its candidate's ... overlap change".
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[klaud_pr(50, H200)])) as run:
        await run.klaud.checks.publish((REPO, 50))
        assert "#12" not in checks(run)[0]["output"]["summary"]
        await run.act({"action": "open_pull", "repo": REPO, "pull": sc.image_bump(12, "dsr1-fp8-h200-trt")})
        [check] = checks(run)
        assert "#12" in check["output"]["summary"]


async def test_the_check_run_is_in_progress_while_its_candidate_is_in_flight(tmp_path):
    # DESIGN §4 "Check run": "In progress while the candidate is in flight".
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        wave = await run.klaud.waves.run(REPO, trigger="test")
        assert sc.candidate(H200) in wave.selected
        # The candidate session opens its PR while its run is still going.
        await run.act({"action": "open_pull", "repo": REPO, "pull": klaud_pr(50, H200)})
        [check] = checks(run)
        assert check["status"] == "in_progress" and check["conclusion"] is None


async def test_a_delivery_being_handled_reads_processing(tmp_path):
    # DESIGN §3.3 GET /api/v1/deliveries/{id}: status "queued"|"processing"|"done"|"failed".
    async with running_klaud(make_klaud(tmp_path, Recorder(delay=1.0))) as run:
        await run.post("pull_request", PR_PAYLOAD, delivery="slow-1")
        seen = set()
        for _ in range(200):
            status, body = await run.get_json("/api/v1/deliveries/slow-1")
            assert status == 200
            seen.add(body["status"])
            if body["status"] == "done":
                break
            await asyncio.sleep(0.02)
        assert "processing" in seen and "done" in seen


async def test_a_push_that_breaks_a_config_rerenders_the_check_runs_at_once(tmp_path):
    # DESIGN §4 "Check run": "A push that makes the policy or a config invalid, or a setup
    # error or pause, re-renders every Klaud check run at once." (The policy case is in
    # test_people_e2e.)
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[klaud_pr(50, H200)])) as run:
        await run.klaud.checks.publish((REPO, 50))
        broken = sc.RUNNERS.replace("  h200-nb: {}\n", "")
        await run.act({"action": "push_default", "repo": REPO, "files": {"configs/runners.yaml": broken}})
        [check] = checks(run)  # no other event, no forced publish
        assert "runners.yaml" in check["output"]["summary"]


async def test_a_setup_error_rerenders_the_check_runs_at_once(tmp_path):
    # The same clause, for a setup error.
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[klaud_pr(50, H200)])) as run:
        await run.klaud.checks.publish((REPO, 50))
        not_dispatchable = "name: x\non:\n  workflow_call: {}\njobs: {}\n"
        await run.act({"action": "push_default", "repo": REPO,
                       "files": {".github/workflows/klaud-candidate.yml": not_dispatchable}})
        [check] = checks(run)
        assert "Setup error" in check["output"]["summary"] or "setup error" in check["output"]["title"]


async def test_runners_file_names_where_the_runners_are_and_a_push_to_it_resolves_them_again(tmp_path):
    # DESIGN §3.6 `runners_file`: the runners document's path, read instead of configs/runners.yaml.
    scenario = sc.scenario(policy="runners_file: infra/runners.yaml\n")
    files = scenario["repositories"][0]["files"]
    files["infra/runners.yaml"] = files.pop("configs/runners.yaml")
    async with sandbox_stack(tmp_path, scenario) as run:
        state = run.klaud.live.repo(REPO)
        assert state.catalog.get(H200).clusters == ("h200-nb",)
        moved = sc.RUNNERS.replace("  h200-nb: {}\n", "  h200-cw: {}\n").replace(
            "    - h200-nb_0\n    - h200-nb_1\n", "    - h200-cw_0\n")
        await run.act({"action": "push_default", "repo": REPO, "files": {"infra/runners.yaml": moved}})
        assert run.klaud.live.repo(REPO).catalog.get(H200).clusters == ("h200-cw",)


async def test_outcome_workflows_names_the_workflows_whose_runs_carry_outcomes(tmp_path):
    # DESIGN §3.6 `outcome_workflows`: only those workflows' completed runs are read for outcomes.
    other = {**sc.run(301, sc.candidate(H200), "readiness-blocked"), "workflow": "nightly.yml"}
    default = sc.run(302, sc.candidate(B200), "readiness-blocked")
    scenario = sc.scenario(policy="outcome_workflows: [nightly.yml]\n", runs=[other, default])
    async with sandbox_stack(tmp_path, scenario) as run:
        ledger = run.klaud.live.repo(REPO).ledger
        assert [a.run_id for a in ledger.for_candidate(sc.candidate(H200))] == [301]
        assert ledger.for_candidate(sc.candidate(B200)) == []


async def test_a_configs_folder_of_more_than_a_thousand_files_is_read_whole(tmp_path):
    # GitHub's contents API lists a folder's first 1,000 entries only: the master configs past
    # them were never found, and a full reload retired their families without a word.
    scenario = sc.scenario()
    files = scenario["repositories"][0]["files"]
    files.update({f"configs/aaa-{number:04d}.md": "notes\n" for number in range(1_200)})
    async with sandbox_stack(tmp_path, scenario) as run:
        state = run.klaud.live.repo(REPO)
        assert {f.id for f in state.catalog} >= {H200, B200}


async def test_a_master_config_whose_name_holds_a_hash_sign_is_read_by_that_name(tmp_path):
    # A `#` in a path passed into the URL as it was: the rest of the path and `?ref=` became
    # a fragment, and the file was read as absent.
    scenario = sc.scenario()
    files = scenario["repositories"][0]["files"]
    files["configs/gpu#2-master.yaml"] = files.pop(NV)
    async with sandbox_stack(tmp_path, scenario) as run:
        keys = {f.id for f in run.klaud.live.repo(REPO).catalog}
        assert H200.replace(NV, "configs/gpu#2-master.yaml") in keys


async def test_a_glob_reaching_into_folders_reads_their_master_configs_from_github(tmp_path):
    scenario = sc.scenario(policy='config_globs: ["configs/**/*-master.yaml"]\n')
    files = scenario["repositories"][0]["files"]
    files["configs/nvidia/gpu-master.yaml"] = files.pop(NV)
    async with sandbox_stack(tmp_path, scenario) as run:
        keys = {f.id for f in run.klaud.live.repo(REPO).catalog}
        assert H200.replace(NV, "configs/nvidia/gpu-master.yaml") in keys
        assert any(key.startswith("configs/amd-master.yaml:") for key in keys)
