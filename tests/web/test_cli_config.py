"""`klaud config check FILE` and `klaud config schema` (DESIGN §3.1): the policy file checked
before it is pushed, with the words a push would show on the check runs."""

from __future__ import annotations

import json

from bot.cli import main
from bot.core.policy import Policy


def test_a_valid_policy_file_is_valid_and_json_prints_the_policy_in_force(tmp_path, capsys):
    policy = tmp_path / "klaud.yml"
    policy.write_text("cooldown_hours: 48\ncandidate_inputs: {candidate: candidate}\n")
    assert main(["config", "check", str(policy)]) == 0
    assert capsys.readouterr().out == f"{policy}: valid\n"
    assert main(["config", "check", "--json", str(policy)]) == 0
    in_force = json.loads(capsys.readouterr().out)
    assert in_force["cooldown_hours"] == 48 and in_force["candidate_inputs"] == {"candidate": "candidate"}
    assert in_force["max_candidates_per_wave"] == Policy().max_candidates_per_wave  # defaults included


def test_an_invalid_policy_file_exits_1_naming_every_problem_in_one_line(tmp_path, capsys):
    policy = tmp_path / "klaud.yml"
    policy.write_text("cooldown_hours: 500\ncandiate_workflow: x.yml\n")
    assert main(["config", "check", str(policy)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"klaud: {policy}: cooldown_hours: Input should be less than or equal to 168;"
                            " candiate_workflow: Extra inputs are not permitted\n")
    policy.write_text("cooldown_hours: [\n")
    assert main(["config", "check", str(policy)]) == 1
    assert capsys.readouterr().err.startswith(f"klaud: {policy}: not valid YAML at line")


def test_a_policy_file_that_cannot_be_read_is_a_bad_argument(tmp_path, capsys):
    assert main(["config", "check", str(tmp_path / "missing.yml")]) == 2
    assert capsys.readouterr().err == f"klaud: {tmp_path / 'missing.yml'}: cannot read: No such file or directory\n"


def test_the_schema_describes_every_key_with_its_bounds_and_refuses_unknown_keys(capsys):
    assert main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == ".github/klaud.yml" and schema["additionalProperties"] is False
    assert set(schema["properties"]) == set(Policy.model_fields)
    assert (schema["properties"]["cooldown_hours"]["minimum"], schema["properties"]["cooldown_hours"]["maximum"]) == (1, 168)
    assert schema["properties"]["capacity_rule"]["enum"] == ["all", "any"]
    # The validator refuses these empty: an editor should say so too.
    assert schema["properties"]["outcome_workflows"]["minItems"] == schema["properties"]["config_globs"]["minItems"] == 1
