"""The real InferenceX master configs and a real image-bump PR through the whole stack.

Reads ../shared/fixtures (KLAUD_FIXTURES); skipped with a reason when it is absent.
"""

from __future__ import annotations

import json

import yaml

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
