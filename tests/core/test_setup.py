"""Is the candidate workflow dispatchable with the inputs the policy sends? (bot/core/setup.py)"""

from __future__ import annotations

from bot.core.setup import workflow_setup_errors

EVERY = {"candidate": "candidate", "family": "family", "base": "base", "wave": "wave"}
GOOD = """\
name: Klaud Cold candidate
run-name: Klaud Cold candidate ${{ inputs.candidate }}
on:
  workflow_dispatch:
    inputs:
      candidate: {required: true, type: string}
      family: {type: string}
      base: {type: string}
      wave: {type: string}
jobs: {}
"""


def codes(text: str | None, inputs: dict[str, str] = EVERY) -> list[str]:
    return [e.code for e in workflow_setup_errors("klaud-candidate.yml", text, inputs.values())]


def test_a_dispatchable_workflow_declaring_every_input_is_fine() -> None:
    assert codes(GOOD) == []


def test_a_missing_workflow() -> None:
    [error] = workflow_setup_errors("klaud-candidat.yml", None, EVERY.values())
    assert error.code == "candidate-workflow-missing"
    assert ".github/workflows/klaud-candidat.yml does not exist" in error.detail


def test_a_workflow_without_workflow_dispatch() -> None:
    assert codes("on:\n  workflow_call:\n    inputs: {}\njobs: {}\n") == ["candidate-workflow-not-dispatchable"]
    assert codes("on: [push]\njobs: {}\n") == ["candidate-workflow-not-dispatchable"]


def test_short_forms_of_the_trigger_are_understood() -> None:
    assert codes("on: workflow_dispatch\njobs: {}\n", {"candidate": "candidate"}) == ["candidate-workflow-inputs"]
    assert codes("'on': [workflow_dispatch, push]\n", {}) == []


def test_undeclared_inputs_and_required_inputs_left_unsent() -> None:
    [undeclared] = workflow_setup_errors("w.yml", GOOD.replace("      wave: {type: string}\n", ""), EVERY.values())
    assert undeclared.code == "candidate-workflow-inputs" and "wave" in undeclared.detail
    required = GOOD.replace("family: {type: string}", "family: {required: true, type: string}")
    [unsent] = workflow_setup_errors("w.yml", required, ["candidate"])
    assert "requires the input(s) family" in unsent.detail


def test_an_adapted_mapping_fits_a_workflow_with_one_input() -> None:
    one = "on:\n  workflow_dispatch:\n    inputs:\n      id: {required: true}\njobs: {}\n"
    assert codes(one, {"candidate": "id"}) == []


def test_unreadable_text_is_reported_not_raised() -> None:
    assert codes("on: [unclosed\n") == ["candidate-workflow-invalid"]
    assert codes("on: " + "[" * 600 + "]" * 600 + "\n") == ["candidate-workflow-invalid"]  # RecursionError
    assert codes("- a list\n") == ["candidate-workflow-invalid"]


def test_input_names_yaml_1_1_reads_as_booleans_are_names_as_github_reads_them() -> None:
    # What this catches (a hostile-input review): `off`, `on`, `yes`, `no` are input names
    # for GitHub (YAML 1.2); PyYAML's YAML 1.1 read them as booleans and sorting the names
    # raised TypeError: every push and reconcile of the repository failed.
    workflow = GOOD.replace("      wave: {type: string}\n", "      wave: {type: string}\n      off: {required: true}\n"
                            "      yes: {type: string}\n      true: {required: true}\n      7: {required: true}\n")
    [error] = workflow_setup_errors("klaud-candidate.yml", workflow, EVERY.values())
    assert error.detail.endswith("requires the input(s) 7, off, true that Klaud does not send")
    assert codes(workflow, {**EVERY, "a": "off", "b": "true", "c": "7"}) == []
    assert codes(workflow.replace("on:\n", "'on':\n"), {**EVERY, "a": "off", "b": "true", "c": "7"}) == []


def test_inputs_klaud_fills_typed_choice_or_boolean_are_reported() -> None:
    # What this catches (review C): GitHub refuses a choice value outside its options and a
    # boolean other than true/false (422), so a workflow typing `family` or `wave` so was
    # taken as set up, and every dispatch of every wave was refused.
    typed = GOOD.replace("family: {type: string}", "family: {type: choice, options: [a, b]}").replace(
        "wave: {type: string}", "wave: {type: boolean}")
    [error] = workflow_setup_errors("klaud-candidate.yml", typed, EVERY.values())
    assert error.code == "candidate-workflow-input-types"
    assert error.detail.startswith(".github/workflows/klaud-candidate.yml types the input(s) family (choice), wave (boolean)")
    assert "\n" not in error.detail


def test_typed_inputs_klaud_does_not_fill_are_the_workflows_own_business() -> None:
    own = GOOD.replace("      wave: {type: string}\n",
                       "      wave: {type: string}\n      debug: {type: boolean}\n      level: {type: choice, options: [a]}\n")
    assert codes(own) == [] and "level: {type: choice" in own
    assert codes(own, {"candidate": "candidate", "wave": "level"}) == ["candidate-workflow-input-types"]
    assert codes(GOOD.replace("wave: {type: string}", "wave: {type: number}")) == []
