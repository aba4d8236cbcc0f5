"""Scenario loading, the bundled demo scenario, and pull-request patches."""

from __future__ import annotations

import io
import json
import re
import zipfile
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.core.domain import ARTIFACT_RE, BRANCH_CANDIDATE_RE, candidate_id, parse_time
from bot.sandbox import (
    BUNDLED_SCENARIO,
    Sandbox,
    ScenarioError,
    load_scenario,
    make_demo,
)
from bot.sandbox.gate import FaultSettings
from bot.sandbox.patches import PatchError, apply_patch, count_changes
from tests.sandbox.test_sandbox_support import DIAGNOSTICS, serve, small_scenario

# --- load_scenario ---------------------------------------------------------------------


def test_none_loads_the_bundled_scenario() -> None:
    scenario = load_scenario(None)
    assert scenario == json.loads(BUNDLED_SCENARIO.read_text())
    assert scenario["repositories"][0]["full_name"] == "acme/bench"


def test_invalid_json_names_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"now": "2026-11-30T08:00:00Z",\n "repositories": [}\n')
    with pytest.raises(ScenarioError, match=r"broken\.json: not valid JSON at line 2 column"):
        load_scenario(path)


def test_missing_file_is_a_scenario_error(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "absent.json")


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda s: s.pop("now"), "now: Field required"),
        (lambda s: s.update(now="2026-11-30T08:00:00"), "now: Input should have timezone info"),
        (lambda s: s["repositories"][0].update(full_name="bench"), "repositories.0.full_name"),
        (lambda s: s["repositories"][0]["pulls"][0].pop("title"), "repositories.0.pulls.0.title"),
        (lambda s: s["repositories"][0]["collaborators"].update(eve="owner"),
         "repositories.0.collaborators.eve"),
        (lambda s: s.update(timeline=[{"action": "teleport"}]), "timeline.0"),
        (lambda s: s.update(extra=1), "extra: Extra inputs are not permitted"),
    ],
)
def test_invalid_shape_names_the_key_path(tmp_path: Path, change: Any, where: str) -> None:
    scenario = small_scenario()
    change(scenario)
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario))
    with pytest.raises(ScenarioError) as raised:
        load_scenario(path)
    assert where in str(raised.value)
    assert str(raised.value).startswith(str(path))


def test_top_level_must_be_an_object(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    path.write_text("[]")
    with pytest.raises(ScenarioError, match="expected a JSON object"):
        load_scenario(path)


# --- the bundled demo ------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo() -> dict[str, Any]:
    return load_scenario(None)


def families(repo: dict[str, Any]) -> dict[str, str]:
    """family id -> image, read straight from the master configs."""
    found = {}
    for path, text in repo["files"].items():
        if path.startswith("configs/") and path.endswith("-master.yaml"):
            for key, block in yaml.safe_load(text).items():
                found[f"{path}:{key}"] = block["image"]
    return found


def test_demo_file_is_what_the_generator_writes() -> None:
    assert make_demo.render() == BUNDLED_SCENARIO.read_text(encoding="utf-8")


def test_demo_has_about_thirty_realistic_families(demo: dict[str, Any]) -> None:
    repo = demo["repositories"][0]
    found = families(repo)
    assert 25 <= len(found) <= 35
    assert {path.split(":")[0] for path in found} == {
        "configs/nvidia-master.yaml", "configs/amd-master.yaml"}
    parsed = {path: yaml.safe_load(repo["files"][path]) for path in
              ("configs/nvidia-master.yaml", "configs/amd-master.yaml")}
    runners = {parsed[path][key]["runner"] for path, key in (f.split(":") for f in found)}
    assert any(r.startswith("cluster:") for r in runners) and "b200" in runners
    assert "labels" in yaml.safe_load(repo["files"]["configs/runners.yaml"])
    assert repo["collaborators"] == {"alice": "admin", "bob": "write", "carol": "read"}
    assert ".github/workflows/klaud-candidate.yml" in repo["files"]


def test_demo_artifacts_and_klaud_branch_name_real_candidates(demo: dict[str, Any]) -> None:
    repo = demo["repositories"][0]
    candidates = {candidate_id(f, image) for f, image in families(repo).items()}
    names = [a["name"] for run in repo["runs"] for a in run["artifacts"]]
    names += [a["name"] for step in demo["timeline"] if step["action"] == "complete_run"
              for a in step["run"]["artifacts"]]
    for name in names:
        match = ARTIFACT_RE.match(name)
        assert match and match.group(1) in candidates, name
    own = [p for p in repo["pulls"] if p["head_ref"].startswith("klaud/")]
    assert len(own) == 1 and own[0]["user"] == "Klaud-Cold" and own[0]["draft"] is True
    branch = BRANCH_CANDIDATE_RE.match(own[0]["head_ref"])
    assert branch and branch.group(1) in candidates


def time_of(text: str) -> datetime:
    parsed = parse_time(text)
    assert parsed is not None, text
    return parsed


def test_demo_covers_every_kind_of_outcome_and_artifact_problem(demo: dict[str, Any]) -> None:
    now = time_of(demo["now"])
    seen = {}
    for run in demo["repositories"][0]["runs"]:
        assert run["workflow"] == "klaud-plan.yml" and run["event"] == "schedule"
        age = (now - time_of(run["completed_at"])).total_seconds() / 3600
        for artifact in run["artifacts"]:
            document = artifact.get("files", {}).get("candidate-diagnostics.json")
            if artifact.get("expired"):
                seen["expired"] = age
            elif "raw_zip_base64" in artifact:
                seen["broken-zip"] = age
            elif isinstance(document, str):
                seen["invalid-json"] = age
            else:
                seen[document["candidate-outcome"]["outcome"]] = age
    assert set(seen) >= {"validated", "capacity-deferred", "readiness-blocked", "failed",
                         "unexpected-error", "expired", "broken-zip", "invalid-json"}
    assert seen["readiness-blocked"] < 24
    assert max(age for kind, age in seen.items() if kind == "failed") > 24


def test_demo_pull_requests_cover_every_kind(demo: dict[str, Any]) -> None:
    now = time_of(demo["now"])
    pulls = demo["repositories"][0]["pulls"]
    idle = [p for p in pulls if (now - time_of(p["updated_at"])).days >= 10]
    assert len(idle) == 1
    shared = [p for p in pulls if all(not f["filename"].startswith("configs/") for f in p["files"])]
    assert shared and {f["filename"] for f in shared[0]["files"]} >= {"perf-changelog.yaml"}
    omitted = [p for p in pulls for f in p["files"] if "patch" in f and f["patch"] is None]
    assert len(omitted) == 1
    clusters = demo["capacity"]["clusters"]
    assert any(c["stale"] for c in clusters)
    busy = [c for c in clusters if (c["allocated"] + c["mixed"]) * 5 >= c["total"] * 4]
    eligible = [c for c in clusters if not c["stale"] and c["idle"] > 0
                and (c["allocated"] + c["mixed"]) * 5 < c["total"] * 4]
    assert busy and len(eligible) >= 3
    assert [step["action"] for step in demo["timeline"]] == ["open_pull", "comment", "complete_run"]
    assert demo["timeline"][1]["body"].startswith("/klaud hold ")
    assert demo["timeline"][1]["user"] == "alice"


async def test_demo_serves_its_pulls_with_patches(demo: dict[str, Any]) -> None:
    async for hub in serve(Sandbox(demo)):
        pulls = await hub.json("GET", "/repos/acme/bench/pulls", params={"per_page": "100"})
        assert len(pulls) == 6
        omitted = await hub.json("GET", "/repos/acme/bench/pulls/4106/files")
        assert "patch" not in omitted[0]
        bump = await hub.json("GET", "/repos/acme/bench/pulls/4101/files")
        assert bump[0]["patch"].startswith("@@ ")
        assert "+  image: lmsysorg/sglang:v0.5.17-rocm700-mi35x" in bump[0]["patch"]
        runs = await hub.json("GET", "/repos/acme/bench/actions/workflows/klaud-plan.yml/runs",
                              params={"status": "completed"})
        assert runs["total_count"] == 3


# --- patches ---------------------------------------------------------------------------


def test_apply_patch_small_cases() -> None:
    assert apply_patch("a\nb\nc\n", "@@ -2 +2 @@\n-b\n+B\n") == "a\nB\nc\n"
    assert apply_patch("", "@@ -0,0 +1,2 @@\n+x\n+y\n") == "x\ny\n"
    assert apply_patch("a\n", "@@ -1 +1 @@\n-a\n+a\n\\ No newline at end of file\n") == "a"
    assert apply_patch("a\nb", "@@ -1,2 +1,2 @@\n a\n-b\n\\ No newline at end of file\n+c\n") == "a\nc\n"
    with pytest.raises(PatchError):
        apply_patch("a\nb\n", "@@ -2 +2 @@\n-x\n+y\n")
    with pytest.raises(PatchError):
        apply_patch("a\n", "not a patch\n")
    assert count_changes("@@ -1,2 +1,3 @@\n a\n-b\n+c\n+d\n") == (2, 1)


def test_apply_patch_reproduces_real_master_config_changes(fixtures: Path) -> None:
    checked = 0
    for path in sorted((fixtures / "inferencex" / "patches").glob("*.json")):
        for changed in json.loads(path.read_text())["files"]:
            if "base_content" in changed and "content" in changed:
                assert apply_patch(changed["base_content"], changed["patch"]) == changed["content"]
                checked += 1
    assert checked >= 10


async def test_computed_patches_equal_git_diff_end_to_end(fixtures: Path) -> None:
    change = json.loads((fixtures / "inferencex" / "patches" / "d4363bd7f.json").read_text())
    master = next(f for f in change["files"] if f["filename"] == "configs/nvidia-master.yaml")
    scenario = small_scenario()
    repo = scenario["repositories"][0]
    repo["files"]["configs/nvidia-master.yaml"] = master["base_content"]
    repo["pulls"][0]["files"] = [{"filename": master["filename"], "content": master["content"]}]
    async for hub in serve(Sandbox(scenario)):
        files = await hub.json("GET", "/repos/acme/bench/pulls/12/files")
        assert files[0]["patch"] == master["patch"]


def test_artifact_archives_hold_exactly_the_scenario_files() -> None:
    sandbox = Sandbox(small_scenario())
    artifact = sandbox.world.repo("acme/bench").runs[101].artifacts[0]
    with zipfile.ZipFile(io.BytesIO(artifact.data)) as archive:
        assert archive.namelist() == ["candidate-diagnostics.json"]
        assert json.loads(archive.read("candidate-diagnostics.json")) == DIAGNOSTICS


# --- the README's examples -------------------------------------------------------------


def readme_examples() -> list[dict[str, Any]]:
    readme = (Path(__file__).resolve().parents[2] / "bot" / "sandbox" / "README.md").read_text()
    return [json.loads(block) for block in re.findall(r"```json\n(.*?)```", readme, re.DOTALL)]


def test_the_readmes_scenario_and_faults_examples_are_accepted() -> None:
    faults, scenario = sorted(readme_examples(), key=lambda example: "rules" not in example)
    assert len(FaultSettings.model_validate(faults).rules) == 6
    sandbox = Sandbox(scenario)
    assert sandbox.world.installation(1).events == tuple(
        scenario["repositories"][0]["events"])


def test_a_scenario_over_the_cap_is_told_so_even_when_the_cut_splits_a_character(tmp_path, monkeypatch) -> None:
    from bot.sandbox import scenario as scenario_module

    monkeypatch.setattr(scenario_module, "MAX_SCENARIO_BYTES", 1000)
    path = tmp_path / "big.json"
    path.write_text('{"now":  "' + "é" * 2000 + '"}', encoding="utf-8")  # valid UTF-8, 4,000+ bytes
    with pytest.raises(ScenarioError, match="over 1000 bytes"):
        load_scenario(path)
