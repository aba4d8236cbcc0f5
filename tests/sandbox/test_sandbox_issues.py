"""Issues (REST and `edit_issue`), and people asking to re-run checks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from bot.sandbox import Sandbox
from tests.sandbox.test_sandbox_support import (
    Hub,
    Receiver,
    repo_of,
    serve,
    small_scenario,
)

REPO = "/repos/acme/bench"


def issues_scenario(**settings: Any) -> dict[str, Any]:
    """Issue #30 (open, labelled) and #31 (closed) beside pull request #12; the
    installation hears `issues` and `check_suite` whatever app.yaml subscribes to."""
    scenario = small_scenario()
    repo_of(scenario).update(
        issues=[{"number": 30, "title": "Flaky runner", "user": "carol", "body": "It flakes.",
                 "labels": ["infra"]},
                {"title": "Old report", "user": "bob", "state": "closed",
                 "created_at": "2026-11-01T00:00:00Z"}],
        events=["issues", "issue_comment", "pull_request", "check_run", "check_suite"],
        **settings)
    return scenario


@pytest.fixture
async def tracker(receiver: Receiver) -> AsyncIterator[Hub]:
    async for hub in serve(Sandbox(issues_scenario(), deliver_to=receiver.url)):
        yield hub


def sent(hub: Hub) -> list[tuple[str, str | None, str]]:
    return [(d.event, d.action, d.payload["sender"]["login"]) for d in hub.sandbox.deliveries]


async def numbers(hub: Hub, **params: str) -> list[int]:
    return [i["number"] for i in await hub.json("GET", f"{REPO}/issues", params=params)]


async def test_listing_holds_issues_and_pulls_with_githubs_filters(tracker: Hub) -> None:
    assert await numbers(tracker) == [30, 12]  # open, newest first
    assert await numbers(tracker, state="all") == [30, 12, 31]
    assert await numbers(tracker, state="closed") == [31]
    assert await numbers(tracker, creator="CAROL") == [30]
    assert await numbers(tracker, labels="infra") == [30]
    assert await numbers(tracker, labels="perf") == [12]
    assert await numbers(tracker, labels="infra,perf") == []
    assert await numbers(tracker, direction="asc") == [12, 30]
    listed = await tracker.json("GET", f"{REPO}/issues")
    assert "pull_request" in listed[1] and "pull_request" not in listed[0]
    page = await tracker.api("GET", f"{REPO}/issues", params={"per_page": "1"})
    assert len(await page.json()) == 1 and 'rel="next"' in page.headers["Link"]
    assert (await tracker.api("GET", f"{REPO}/issues", params={"state": "shut"})).status == 422


async def test_creating_an_issue_takes_the_next_shared_number(tracker: Hub) -> None:
    made = await tracker.api("POST", f"{REPO}/issues", json={
        "title": "Klaud: cannot read configs", "body": "Details", "labels": ["klaud"]})
    assert made.status == 201
    issue = await made.json()
    assert issue["number"] == 32 and made.headers["Location"] == issue["url"]
    assert (issue["user"]["login"], issue["state"], issue["body"]) == (
        "klaud-cold[bot]", "open", "Details")
    assert [label["name"] for label in issue["labels"]] == ["klaud"]
    opened = await tracker.act(action="open_pull", repo="acme/bench", pull={
        "title": "t", "user": "bob", "head_ref": "t", "files": []})
    assert opened["number"] == 33
    await tracker.sandbox.drain()
    assert sent(tracker)[0] == ("issues", "opened", "klaud-cold[bot]")
    assert tracker.state()["issues"][-1] == {
        "number": 32, "title": "Klaud: cannot read configs", "body": "Details",
        "state": "open", "user": "klaud-cold[bot]", "labels": ["klaud"]}
    missing = await tracker.api("POST", f"{REPO}/issues", json={"body": "no title"})
    assert missing.status == 422
    assert (await missing.json())["errors"][0]["field"] == "title"


async def test_reading_one_issue_or_pull(tracker: Hub) -> None:
    issue = await tracker.json("GET", f"{REPO}/issues/30")
    assert (issue["title"], issue["body"], issue["user"]["login"]) == (
        "Flaky runner", "It flakes.", "carol")
    pull = await tracker.json("GET", f"{REPO}/issues/12")
    assert pull["pull_request"]["url"].endswith("/pulls/12")
    assert (await tracker.api("GET", f"{REPO}/issues/99")).status == 404


async def test_the_app_edits_an_issue(tracker: Hub) -> None:
    edited = await tracker.json("PATCH", f"{REPO}/issues/30", json={
        "body": "It flakes on b200.", "state": "closed", "labels": ["infra", "klaud"]})
    assert (edited["body"], edited["state"]) == ("It flakes on b200.", "closed")
    assert edited["closed_at"] == "2026-11-30T08:00:00Z"
    await tracker.sandbox.drain()
    assert [(e, a) for e, a, _ in sent(tracker)] == [
        ("issues", "edited"), ("issues", "closed"), ("issues", "labeled")]
    changes = tracker.sandbox.deliveries[0].payload["changes"]
    assert changes == {"body": {"from": "It flakes."}}
    assert tracker.sandbox.deliveries[2].payload["label"]["name"] == "klaud"
    assert tracker.state()["issues"][0]["state"] == "closed"
    bad = await tracker.api("PATCH", f"{REPO}/issues/30", json={"state": "shut"})
    assert bad.status == 422


async def test_editing_a_pull_through_the_issues_api_sends_pull_request_events(
    tracker: Hub,
) -> None:
    await tracker.json("PATCH", f"{REPO}/issues/12", json={"title": "Bump SGLang to 0.5.17"})
    await tracker.sandbox.drain()
    assert [(e, a) for e, a, _ in sent(tracker)] == [("pull_request", "edited")]
    assert tracker.state()["pulls"][0]["title"] == "Bump SGLang to 0.5.17"


async def test_a_person_edits_an_issue_body(tracker: Hub) -> None:
    answer = await tracker.act(action="edit_issue", repo="acme/bench", number=30, user="alice",
                               body="It flakes. Seen again today.")
    assert answer["number"] == 30 and answer["statuses"] == [202]
    [delivery] = tracker.sandbox.deliveries
    assert (delivery.event, delivery.action) == ("issues", "edited")
    assert delivery.payload["sender"]["login"] == "alice"
    assert delivery.payload["changes"] == {"body": {"from": "It flakes."}}
    assert delivery.payload["issue"]["body"] == "It flakes. Seen again today."
    for number in (12, 99):
        refused = await tracker.client.post("/_sandbox/act", json={
            "action": "edit_issue", "repo": "acme/bench", "number": number, "user": "alice",
            "body": "x"})
        assert refused.status == 404


async def test_plain_issues_need_the_issues_permission() -> None:
    scenario = issues_scenario(permissions={"pull_requests": "write", "contents": "read"})
    async for hub in serve(Sandbox(scenario)):
        assert (await hub.api("GET", f"{REPO}/issues/12")).status == 200
        assert (await hub.api("GET", f"{REPO}/issues/30")).status == 403
        assert (await hub.api("PATCH", f"{REPO}/issues/30", json={"body": "x"})).status == 403
        assert (await hub.api("GET", f"{REPO}/issues")).status == 403
        assert (await hub.api("POST", f"{REPO}/issues", json={"title": "x"})).status == 403
        assert hub.state()["issues"][0]["body"] == "It flakes."


async def make_check(hub: Hub, name: str, **fields: Any) -> dict[str, Any]:
    head = hub.state()["pulls"][0]["head_sha"]
    made: dict[str, Any] = await hub.json("POST", f"{REPO}/check-runs", status=201,
                                          json={"name": name, "head_sha": head, **fields})
    return made


async def test_rerequesting_one_check_run(tracker: Hub) -> None:
    check = await make_check(tracker, "Klaud Cold", conclusion="failure",
                             output={"title": "t", "summary": "s"})
    await tracker.sandbox.drain()
    answer = await tracker.act(action="rerequest_check", repo="acme/bench",
                               check_run_id=check["id"], user="alice")
    assert answer["check_run_id"] == check["id"]
    assert sent(tracker)[-1] == ("check_run", "rerequested", "alice")
    assert tracker.sandbox.deliveries[-1].payload["check_run"]["conclusion"] == "failure"
    missing = await tracker.client.post("/_sandbox/act", json={
        "action": "rerequest_check", "repo": "acme/bench", "check_run_id": 1, "user": "alice"})
    assert missing.status == 404


async def test_rerequesting_the_suite_of_a_commit(tracker: Hub) -> None:
    first = await make_check(tracker, "Klaud Cold", conclusion="success",
                             output={"title": "t", "summary": "s"})
    second = await make_check(tracker, "Klaud Lint", status="in_progress")
    assert first["check_suite"]["id"] == second["check_suite"]["id"]  # one suite per commit
    await tracker.sandbox.drain()
    head = first["head_sha"]
    answer = await tracker.act(action="rerequest_suite", repo="acme/bench", head_sha=head,
                               user="bob")
    assert answer["check_suite_id"] == first["check_suite"]["id"]
    assert sent(tracker)[-1] == ("check_suite", "rerequested", "bob")
    suite = tracker.sandbox.deliveries[-1].payload["check_suite"]
    assert (suite["head_sha"], suite["head_branch"]) == (head, "bump-sglang")
    assert (suite["status"], suite["conclusion"], suite["latest_check_runs_count"]) == (
        "in_progress", None, 2)
    assert [p["number"] for p in suite["pull_requests"]] == [12]
    missing = await tracker.client.post("/_sandbox/act", json={
        "action": "rerequest_suite", "repo": "acme/bench", "head_sha": "0" * 40,
        "user": "bob"})
    assert missing.status == 404
