"""Every webhook the sandbox sends has the shape of GitHub's real example for that event."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bot.sandbox import Sandbox
from bot.sandbox.events import Payloads
from bot.sandbox.world import Event
from tests.sandbox.test_sandbox_support import Hub, small_scenario

# Keys an App's payload has beyond the examples (most examples are not from an App, and
# `organization` depends on who owns the repository).
ENVELOPE_EXTRAS = {"installation", "organization"}
# Objects whose keys are data rather than shape.
FREE_FORM = {"client_payload", "permissions", "changes"}
# Examples recorded at different times disagree on these objects (the repository_dispatch
# repository predates `disabled`, the check_run app predates `slug` and `client_id`); ours
# must hold every key the example has.
AT_LEAST = {"repository", "app"}


def key_mismatches(ours: Any, example: Any, path: str = "") -> list[str]:
    """Where the nested key sets differ (first element of lists, dicts all the way down)."""
    if isinstance(ours, dict) and isinstance(example, dict):
        problems = []
        if path.rsplit(".", 1)[-1] in AT_LEAST:
            if set(example) - set(ours):
                problems.append(f"{path}: example only {sorted(set(example) - set(ours))}")
        elif set(ours) != set(example):
            problems.append(f"{path or '.'}: ours only {sorted(set(ours) - set(example))}, "
                            f"example only {sorted(set(example) - set(ours))}")
        for key in set(ours) & set(example):
            if key not in FREE_FORM:
                problems += key_mismatches(ours[key], example[key], f"{path}.{key}")
        return problems
    if isinstance(ours, list) and isinstance(example, list) and ours and example:
        return key_mismatches(ours[0], example[0], f"{path}[0]")
    return []


def example(fixtures: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (fixtures / "octokit-webhooks" / name).read_text())
    return data


def assert_same_shape(event: Event, fixture: dict[str, Any], main: str | None) -> None:
    ours = {k: v for k, v in event.payload.items() if k not in ENVELOPE_EXTRAS}
    theirs = {k: v for k, v in fixture.items() if k not in ENVELOPE_EXTRAS}
    assert set(ours) == set(theirs)
    assert event.payload["installation"]["id"] == 1
    assert set(event.payload["installation"]) == {"id", "node_id"}
    if main is not None:
        assert set(event.payload[main]) == set(fixture[main])
    assert key_mismatches(ours, theirs) == []


async def collect(hub: Hub) -> list[Event]:
    """Drive every action once; the sandbox keeps each webhook it sent."""
    head = hub.state()["pulls"][0]["head_sha"]
    await hub.act(action="open_pull", repo="acme/bench", pull={
        "title": "t", "user": "carol", "head_ref": "t", "files": []})
    await hub.act(action="push_pull", repo="acme/bench", number=12, files=[])
    await hub.act(action="edit_pull", repo="acme/bench", number=12, draft=True, labels=["x"])
    await hub.act(action="edit_pull", repo="acme/bench", number=12, draft=False)
    await hub.act(action="comment", repo="acme/bench", number=77, user="bob", body="hi")
    await hub.act(action="complete_run", repo="acme/bench", run={
        "workflow": "klaud-plan.yml", "pull_requests": [12]})
    await hub.act(action="dispatch", repo="acme/bench", event_type="klaud-plan",
                  client_payload={"unit": False})
    await hub.act(action="close_pull", repo="acme/bench", number=12, merged=True)
    check = await hub.json("POST", "/repos/acme/bench/check-runs", status=201,
                           json={"name": "Klaud Cold", "head_sha": head})
    dispatched = await hub.json(
        "POST", "/repos/acme/bench/actions/workflows/klaud-candidate.yml/dispatches",
        json={"ref": "main", "inputs": {"candidate": "c", "family": "f", "base": "b"},
              "return_run_details": True})
    await hub.act(action="start_run", repo="acme/bench",
                  run={"id": dispatched["workflow_run_id"]})
    await hub.act(action="rerequest_check", repo="acme/bench", check_run_id=check["id"],
                  user="bob")
    await hub.act(action="rerequest_suite", repo="acme/bench", head_sha=head, user="bob")
    await hub.json("PATCH", f"/repos/acme/bench/check-runs/{check['id']}",
                   json={"status": "completed", "conclusion": "success"})
    made = await hub.json("POST", "/repos/acme/bench/issues", status=201, json={"title": "t"})
    await hub.act(action="edit_issue", repo="acme/bench", number=made["number"], user="bob",
                  body="b")
    await hub.sandbox.drain()
    # Withheld deliveries (events app.yaml does not subscribe to) keep their payloads too.
    return [Event(d.event, d.payload) for d in hub.sandbox.deliveries]


CASES = [
    ("pull_request", "opened", "pull_request/opened.with-organization.payload.json", "pull_request"),
    ("pull_request", "synchronize", "pull_request/synchronize.payload.json", "pull_request"),
    ("pull_request", "converted_to_draft", "pull_request/converted_to_draft.with-organization.payload.json",
     "pull_request"),
    ("pull_request", "ready_for_review", "pull_request/ready_for_review.with-organization.payload.json",
     "pull_request"),
    ("pull_request", "labeled", "pull_request/labeled.with-organization.payload.json", "pull_request"),
    ("pull_request", "unlabeled", "pull_request/unlabeled.with-organization.payload.json", "pull_request"),
    ("pull_request", "closed", "pull_request/closed.with-organization.payload.json", "pull_request"),
    ("push", None, "push/with-new-branch.payload.json", "head_commit"),
    ("issue_comment", "created", "issue_comment/created.with-installation.payload.json", "comment"),
    ("workflow_run", "completed", "workflow_run/completed.with-pull-requests.payload.json", "workflow_run"),
    ("workflow_run", "requested", "workflow_run/requested.payload.json", "workflow_run"),
    ("repository_dispatch", "klaud-plan", "repository_dispatch/payload.json", None),
    ("check_run", "created", "check_run/created.with-organization.payload.json", "check_run"),
    ("check_run", "completed", "check_run/completed.with-organization.payload.json", "check_run"),
    ("workflow_run", "in_progress", "workflow_run/requested.payload.json", "workflow_run"),
    ("check_suite", "rerequested", "check_suite/rerequested.with-organization.payload.json",
     "check_suite"),
]
# Compared by tests of their own: the check_run example of `rerequested` predates two keys,
# and octokit has no `issues` examples.
CHECKED_APART = {("check_run", "rerequested"), ("issues", "opened"), ("issues", "edited")}
# The issue object of `issues` events is the one `issue_comment` events carry.
ISSUE_EXAMPLE = "issue_comment/created.with-installation.payload.json"


async def test_every_webhook_matches_githubs_example(hub: Hub, fixtures: Path) -> None:
    sent = await collect(hub)
    for name, action, fixture, main in CASES:
        matching = [e for e in sent if e.name == name and e.action == action]
        assert matching, f"no {name} {action} was sent"
        assert_same_shape(matching[0], example(fixtures, fixture), main)
    covered = {(name, action) for name, action, _, _ in CASES}
    assert {(e.name, e.action) for e in sent} == covered | CHECKED_APART


async def test_rerequested_check_run_matches_githubs_example(hub: Hub, fixtures: Path) -> None:
    [event] = [e for e in await collect(hub) if (e.name, e.action) == ("check_run", "rerequested")]
    rerequested = example(fixtures, "check_run/rerequested.with-organization.payload.json")
    assert set(event.payload) == set(rerequested) | ENVELOPE_EXTRAS
    created = example(fixtures, "check_run/created.with-organization.payload.json")
    assert set(event.payload["check_run"]) == set(created["check_run"])
    assert event.payload["sender"]["login"] == "bob"


@pytest.mark.parametrize(("action", "extra"), [("opened", set()), ("edited", {"changes"})])
async def test_issues_events_carry_githubs_issue(
    hub: Hub, fixtures: Path, action: str, extra: set[str]
) -> None:
    [event] = [e for e in await collect(hub) if (e.name, e.action) == ("issues", action)]
    assert set(event.payload) == {"action", "issue", "repository", "sender"} | extra | (
        ENVELOPE_EXTRAS)
    issue = example(fixtures, ISSUE_EXAMPLE)["issue"]
    assert key_mismatches(event.payload["issue"], issue) == []


async def test_comment_on_a_pull_request_has_the_pull_request_link(
    hub: Hub, fixtures: Path
) -> None:
    await hub.act(action="comment", repo="acme/bench", number=12, user="bob", body="hi")
    [event] = [Event(d.event, d.payload) for d in hub.sandbox.deliveries]
    fixture = example(fixtures, "issue_comment/created.with-installation.payload.json")
    assert set(event.payload["issue"]) == set(fixture["issue"]) | {"pull_request"}
    assert set(event.payload["issue"]["pull_request"]) == {
        "url", "html_url", "diff_url", "patch_url", "merged_at"}


def test_key_mismatches_reports_nested_differences() -> None:
    problems = key_mismatches({"a": {"b": 1, "c": [{"d": 1}]}}, {"a": {"b": 2, "c": [{"e": 1}]}})
    assert problems == [".a.c[0]: ours only ['d'], example only ['e']"]


def test_payload_builder_is_usable_without_a_server() -> None:
    sandbox = Sandbox(small_scenario())
    repo = sandbox.world.repo("acme/bench")
    event = Payloads(sandbox.world).repository_dispatch(repo, "klaud-plan", {}, "alice")
    assert event.payload["repository"]["url"].startswith("http://sandbox.invalid/")

