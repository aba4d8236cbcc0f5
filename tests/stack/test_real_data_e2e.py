"""The real InferenceX master configs and a real image-bump PR through the whole stack.

Reads ../shared/fixtures (KLAUD_FIXTURES); skipped with a reason when it is absent.
"""

from __future__ import annotations

import json

import yaml

from bot.core.catalog import parse_runners
from tests import scenarios as sc
from tests.harness import sandbox_stack

NV = "configs/nvidia-master.yaml"


def real_scenario(fixtures) -> dict:
    scenario = sc.scenario()
    files = scenario["repositories"][0]["files"]
    for name in ("nvidia-master.yaml", "amd-master.yaml", "runners.yaml"):
        files[f"configs/{name}"] = (fixtures / "inferencex" / "configs" / name).read_text()
    bump = json.loads((fixtures / "inferencex" / "patches" / "d4363bd7f.json").read_text())
    scenario["repositories"][0]["pulls"] = [{
        "number": 77, "title": bump["subject"], "user": "bob", "head_ref": "bump-dsr1-fp4-b200-sglang",
        "files": [{"filename": f["filename"], "status": f["status"], "patch": f["patch"]} for f in bump["files"]],
    }]
    return scenario


async def test_real_configs_and_a_real_image_bump_end_to_end(tmp_path, fixtures):
    configs = fixtures / "inferencex" / "configs"
    keys = {f"{NV}:{k}" for k in yaml.safe_load((configs / "nvidia-master.yaml").read_text())}
    keys |= {f"configs/amd-master.yaml:{k}" for k in yaml.safe_load((configs / "amd-master.yaml").read_text())}
    async with sandbox_stack(tmp_path, real_scenario(fixtures)) as run:
        state = run.state()
        assert {f["family"] for f in state["families"]} == keys and len(keys) == 208
        [pull] = state["pulls"]
        bumped = {f"{NV}:dsr1-fp4-b200-sglang": "image", f"{NV}:dsr1-fp4-b200-sglang-mtp": "image"}
        assert pull["touches"] == bumped
        run.reset_requests()
        wave = await run.klaud.waves.run("acme/bench", trigger="test")
        assert [r for r in run.requests["requests"] if r["method"] == "GET"] == []
        assert run.requests["total"] == 2 * len(wave.selected)  # a claim and a dispatch each
        assert len(wave.decisions) == 208 and {d.family for d in wave.decisions} == keys
        for family in bumped:
            decision = next(d for d in wave.decisions if d.family == family)
            assert decision.decision == "overlap" and decision.pull_requests == (77,)
        # Families on clusters the scenario's capacity feed does not list are blocked, with the reason.
        blocked = [d for d in wave.decisions if d.decision == "capacity"]
        assert blocked and all(d.reason for d in blocked)
        assert len(wave.selected) == 5  # the default max_candidates_per_wave


def every_cluster_idle(scenario: dict) -> dict:
    runners = parse_runners(scenario["repositories"][0]["files"]["configs/runners.yaml"])
    return {"clusters": [sc.cluster(c) for c in sorted(runners.declared)]}


def broken_diagnostics_run(run_id: int, candidate: str, conclusion: str) -> dict:
    """A run whose diagnostics step crashed half-way and whose upload still ran."""
    return {
        "id": run_id, "conclusion": conclusion,
        "jobs": [{"name": "Klaud Cold", "conclusion": conclusion,
                  "steps": [{"name": "Diagnostics", "conclusion": conclusion}]}],
        "artifacts": [{"name": f"klaud-candidate-{candidate}", "expired": False,
                       "files": {"candidate-diagnostics.json": '{"candidate-outcome": {"outcome": "fail'}}],
    }


async def finish_and_wait(run, wave, conclusion: str) -> object:
    """Each run the wave dispatched ends with a broken artifact; the next wave, 2 h later."""
    made = {d["inputs"]["candidate"]: d["run_id"] for d in run.github()["dispatches"]}
    for candidate in wave.selected:
        await run.act({"action": "complete_run", "repo": "acme/bench",
                       "run": broken_diagnostics_run(made[candidate], candidate, conclusion)})
    await run.act({"action": "advance_clock", "seconds": 2 * 3600 + 60})
    await run.settle()
    return await run.klaud.waves.run("acme/bench", trigger="test")


async def test_runs_failing_with_a_broken_artifact_pause_dispatch_on_the_real_configs(tmp_path, fixtures):
    # What this catches (a review on the real configs): a failed run that left a broken
    # artifact was `invalid-json`, which the pause rule did not count: the five stalest of the
    # 208 families were dispatched wave after wave and the others never had a turn.
    scenario = real_scenario(fixtures)
    scenario["repositories"][0]["pulls"] = []
    scenario["capacity"] = every_cluster_idle(scenario)
    async with sandbox_stack(tmp_path, scenario) as run:
        wave = await run.klaud.waves.run("acme/bench", trigger="test")
        assert len(wave.selected) == 5
        wave = await finish_and_wait(run, wave, "failure")
        assert run.state()["blocked"]["code"] == "dispatch-paused"
        assert "3 of the 3 finished runs of wave 1 failed before an outcome in job `Klaud Cold`" in run.state()["blocked"]["reason"]
        assert wave.selected == ()


async def test_a_run_that_succeeds_with_a_broken_artifact_is_not_dispatched_every_wave(tmp_path, fixtures):
    scenario = real_scenario(fixtures)
    scenario["repositories"][0]["pulls"] = []
    scenario["repositories"][0]["files"][".github/klaud.yml"] = "max_candidates_per_wave: 1\n"
    scenario["capacity"] = every_cluster_idle(scenario)
    async with sandbox_stack(tmp_path, scenario) as run:
        wave = await run.klaud.waves.run("acme/bench", trigger="test")
        [first] = wave.selected
        for _ in range(6):
            wave = await finish_and_wait(run, wave, "success")
        made = [d["inputs"]["candidate"] for d in run.github()["dispatches"]]
        # Once may be bad luck, twice in a row cools it down: the next family gets its turns.
        assert made[:2] == [first, first] and {made.count(c) for c in made[:6]} == {2}, made
        [cooling] = [d for d in wave.decisions if d.candidate == first]
        assert cooling.decision == "cooldown"
        assert "the last 2 runs left no readable outcome (invalid-json" in cooling.reason
