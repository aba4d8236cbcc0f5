"""`klaud doctor`'s checks (bot/core/doctor.py) and the manifest they check against."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from bot.core.doctor import (
    REQUIRED_EVENTS,
    REQUIRED_PERMISSIONS,
    capacity_check,
    config_checks,
    events_check,
    permission_check,
    workflow_checks,
)
from bot.core.domain import CapacityReading
from bot.core.setup import SetupError, workflow_setup_errors
from tests.builders import family

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


def test_app_yaml_asks_for_exactly_what_the_doctor_requires() -> None:
    manifest = yaml.safe_load((ROOT / "app.yaml").read_text())
    assert manifest["default_permissions"] == dict(REQUIRED_PERMISSIONS)
    assert set(manifest["default_events"]) == REQUIRED_EVENTS


def test_missing_permissions_and_events_are_named_with_a_fix() -> None:
    check = permission_check({**REQUIRED_PERMISSIONS, "issues": "read", "checks": "none"})
    assert not check.ok and "issues: write" in check.detail and "checks: write" in check.detail
    assert "Permissions" in check.hint
    assert permission_check({**REQUIRED_PERMISSIONS, "contents": "admin"}).ok  # more is enough
    check = events_check(REQUIRED_EVENTS - {"issues"})
    assert not check.ok and check.detail.endswith("issues")


def test_the_workflow_needs_a_run_name_with_the_candidate() -> None:
    text = "on:\n  workflow_dispatch:\n    inputs: {candidate: {}}\n"
    checks = workflow_checks("w.yml", text, [], "candidate")
    assert [c.ok for c in checks] == [True, False] and "inputs.candidate" in checks[1].hint
    named = "run-name: Klaud ${{ inputs.candidate }}\n" + text
    assert all(c.ok for c in workflow_checks("w.yml", named, [], "candidate"))


@pytest.mark.parametrize(("run_name", "names_the_candidate"), [
    ("run-name: Klaud Cold ${{ inputs.candidate }} for ${{ inputs.family }}", True),
    ("run-name: Klaud Cold ${{ github.event.inputs.candidate }}", True),
    ("run-name: ${{ format('Klaud Cold {0}', inputs.candidate) }}", True),
    ("run-name: Klaud Cold ${{ inputs.candidate_id }}", False),
    ("run-name: Klaud Cold ${{ github.event.client_payload.inputs.candidate }}", False),
    ("run-name: Klaud Cold inputs.candidate", False),
])
def test_a_run_name_passes_when_any_of_its_expressions_reads_the_candidate_input(
    run_name: str, names_the_candidate: bool
) -> None:
    # What this catches: only the last `${{ inputs.X }}` of the line was read, and never
    # `github.event.inputs.X`: a workflow titling its runs correctly failed the doctor.
    text = run_name + "\non:\n  workflow_dispatch:\n    inputs: {candidate: {}, family: {}}\n"
    checks = workflow_checks("klaud-candidate.yml", text, [], "candidate")
    assert [(c.name, c.ok) for c in checks] == [("candidate workflow", True), ("run-name", names_the_candidate)]


def test_setup_errors_become_failed_checks_with_hints() -> None:
    [check] = workflow_checks("w.yml", None, [SetupError("candidate-workflow-missing", "w.yml does not exist")], "candidate")
    assert not check.ok and "deploy/klaud-candidate.yml" in check.hint


def test_a_typed_input_klaud_fills_fails_the_workflow_check_with_a_fix() -> None:
    text = "on:\n  workflow_dispatch:\n    inputs:\n      candidate: {}\n      wave: {type: boolean}\n"
    [check] = workflow_checks("w.yml", text, workflow_setup_errors("w.yml", text, ["candidate", "wave"]), "candidate")
    assert not check.ok and "wave (boolean)" in check.detail
    assert check.line() == (
        "FAIL  candidate workflow: .github/workflows/w.yml types the input(s) wave (boolean) that Klaud fills with"
        " its own values, which GitHub refuses for a choice or boolean input"
        " (fix: declare these inputs `type: string`, or leave them out of candidate_inputs)"
    )


def test_config_errors_split_into_parsing_and_runners() -> None:
    checks = config_checks({"configs/runners.yaml": "runner x_0 resolves to no declared cluster"}, "configs/runners.yaml", 5)
    assert [(c.name, c.ok) for c in checks] == [("master configs", True), ("runners", False)]


def test_the_capacity_feed_must_report_every_target_cluster() -> None:
    families = [family("a", clusters=("b200-nscale",)), family("b", clusters=("h200-nb",))]
    reading = CapacityReading(eligible=frozenset(), known=frozenset({"b200-nscale"}), at=NOW)
    check = capacity_check(reading, families)
    assert not check.ok and "h200-nb" in check.detail
    closed = CapacityReading(eligible=frozenset(), known=frozenset(), at=NOW, error="capacity-feed-not-configured")
    assert "KLAUD_CAPACITY_URL" in capacity_check(closed, families).hint


@pytest.mark.parametrize(("error", "hint"), [
    ("capacity-feed-not-configured", "set KLAUD_CAPACITY_URL and KLAUD_CAPACITY_TOKEN"),
    ("http-401", "refused KLAUD_CAPACITY_TOKEN"),
    ("capacity-token-invalid", "no request can carry"),
    ("http-503", "failing or busy"),
    ("http-429", "failing or busy"),
    ("stale-feed", "this host's clock"),
    ("invalid-json", "something other than a cluster status feed"),
])
def test_the_fix_for_an_unusable_feed_is_the_one_for_its_error(error: str, hint: str) -> None:
    # Every error was told to set KLAUD_CAPACITY_URL, also when it was set (a stale feed).
    closed = CapacityReading(eligible=frozenset(), known=frozenset(), at=NOW, error=error)
    assert hint in capacity_check(closed, []).hint


def test_every_config_problem_is_a_line_of_its_own_and_runner_problems_say_how_to_fix_them() -> None:
    master = "configs/nvidia-master.yaml"
    errors = {
        "configs/runners.yaml": "label h100 lists h100-x_0, which names no cluster declared in runners.yaml\n"
                                "label b200 lists b200-y_1, which names no cluster declared in runners.yaml",
        master: f"{master}:3: `fam-a` runner `cluster:b300-new` names cluster b300-new, which runners.yaml does not declare\n"
                f"{master}:9: `fam-b` has no image",
    }
    checks = config_checks(errors, "configs/runners.yaml", 5)
    assert [(c.name, c.ok) for c in checks] == [("master configs", False)] + [("runners", False)] * 3
    assert all("\n" not in c.line() for c in checks)
    assert checks[0].detail == f"{master}:9: `fam-b` has no image"
    undeclared = checks[1]  # sorted by path: the master config first
    assert undeclared.hint == ("declare b300-new in configs/runners.yaml (a `clusters:` key, or `cluster:b300-new`"
                               " under `hardware:`), or fix the runner's name")
    assert [c.hint for c in checks[2:4]] == ["declare the cluster in configs/runners.yaml or fix the runner's name"] * 2


def test_the_capacity_feed_check_fails_for_a_target_cluster_whose_entry_is_invalid() -> None:
    # A feed that names the cluster but with counts as text makes every family on it wait
    # at every wave: the doctor must not report the feed as fine.
    from tests.core.test_capacity import cluster, evaluate, feed

    broken = cluster("b200-nscale")
    broken["summary"]["idleNodes"] = "6"
    reading = evaluate(feed(broken))
    families = [family("a", clusters=("b200-nscale",))]
    check = capacity_check(reading, families)
    assert not check.ok
    assert "b200-nscale" in check.detail
