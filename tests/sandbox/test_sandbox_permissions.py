"""Installation permissions and events: GitHub's 403s and the webhooks it never sends."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from bot.sandbox import Sandbox, SandboxError
from tests.conftest import ROOT
from tests.sandbox.test_sandbox_support import (
    Hub,
    Receiver,
    repo_of,
    serve,
    small_scenario,
)

REPO = "/repos/acme/bench"
MANIFEST = yaml.safe_load((ROOT / "app.yaml").read_text())


def scenario_with(**settings: Any) -> dict[str, Any]:
    scenario = small_scenario()
    repo_of(scenario).update(settings)
    return scenario


def without(name: str, **changed: str) -> dict[str, str]:
    """app.yaml's permissions less `name`, with `changed` levels."""
    permissions = {k: v for k, v in MANIFEST["default_permissions"].items() if k != name}
    return {**permissions, **changed}


async def test_defaults_are_what_the_app_manifest_asks_for(hub: Hub) -> None:
    expected = MANIFEST["default_permissions"]
    app = await hub.json("GET", "/app")
    assert (app["permissions"], sorted(app["events"])) == (expected, sorted(MANIFEST["default_events"]))
    installation = await hub.json("GET", f"{REPO}/installation")
    assert installation["permissions"] == expected
    assert sorted(installation["events"]) == sorted([*MANIFEST["default_events"], "installation",
                                                     "installation_repositories"])
    [listed] = await hub.json("GET", "/app/installations")
    assert listed["permissions"] == expected
    token = await hub.json("POST", "/app/installations/1/access_tokens", status=201)
    assert token["permissions"] == expected


def head_of(hub: Hub) -> str:
    sha: str = hub.state()["head_sha"]
    return sha


# (permissions, method, path, body, status): each route refused or allowed by one change.
CASES: list[tuple[dict[str, str], str, str, dict[str, Any] | None, int]] = [
    (without("contents"), "GET", f"{REPO}/contents/configs/runners.yaml", None, 403),
    (without("contents"), "GET", f"{REPO}/compare/main...bump-sglang", None, 403),
    (without("contents", contents="read"), "GET", f"{REPO}/git/matching-refs/heads", None, 200),
    (without("contents", contents="read"), "POST", f"{REPO}/git/refs",
     {"ref": "refs/heads/klaud/claim-x", "sha": "HEAD"}, 403),
    (without("pull_requests"), "GET", f"{REPO}/pulls/12/files", None, 403),
    (without("actions"), "GET", f"{REPO}/actions/runs", None, 403),
    (without("actions"), "GET", f"{REPO}/actions/runs/101/jobs", None, 403),
    (without("actions", actions="read"), "GET", f"{REPO}/actions/runs/101/artifacts", None, 200),
    (without("actions", actions="read"), "POST",
     f"{REPO}/actions/workflows/klaud-candidate.yml/dispatches",
     {"ref": "main", "inputs": {"candidate": "c", "family": "f", "base": "b"}}, 403),
    (without("checks"), "GET", f"{REPO}/commits/main/check-runs", None, 403),
    (without("checks", checks="read"), "POST", f"{REPO}/check-runs",
     {"name": "Klaud Cold", "head_sha": "HEAD"}, 403),
    (without("issues"), "GET", f"{REPO}/issues/12/comments", None, 200),  # pull_requests: read
    (without("issues"), "POST", f"{REPO}/issues/12/comments", {"body": "hi"}, 403),
    (without("issues", pull_requests="write"), "POST", f"{REPO}/issues/12/comments",
     {"body": "hi"}, 201),
    (without("issues", pull_requests="none"), "GET", f"{REPO}/issues/12/comments", None, 403),
    ({"contents": "read"}, "GET", REPO, None, 200),  # metadata comes with any permission
    ({"contents": "read"}, "GET", f"{REPO}/activity", None, 200),
    ({"contents": "read"}, "GET", f"{REPO}/collaborators/bob/permission", None, 200),
]


@pytest.mark.parametrize(("permissions", "method", "path", "body", "status"), CASES)
async def test_a_missing_permission_answers_403(
    permissions: dict[str, str], method: str, path: str, body: dict[str, Any] | None,
    status: int,
) -> None:
    granted = {k: v for k, v in permissions.items() if v != "none"}
    async for hub in serve(Sandbox(scenario_with(permissions=granted))):
        before = hub.sandbox.state_document()
        if body is not None:
            body = {k: head_of(hub) if v == "HEAD" else v for k, v in body.items()}
        response = await hub.api(method, path, json=body)
        assert response.status == status, await response.text()
        if status == 403:
            answer = await response.json()
            assert answer == {"message": "Resource not accessible by integration",
                              "documentation_url": answer["documentation_url"],
                              "status": "403"}
            assert response.headers["x-accepted-github-permissions"]
            assert hub.sandbox.state_document() == before  # nothing was applied
        await hub.sandbox.drain()


async def test_the_accepted_permissions_header_names_the_alternatives() -> None:
    async for hub in serve(Sandbox(scenario_with(permissions={"contents": "read"}))):
        refused = await hub.api("POST", f"{REPO}/issues/12/comments", json={"body": "hi"})
        assert refused.headers["x-accepted-github-permissions"] == (
            "issues=write; pull_requests=write")


async def test_a_token_minted_with_fewer_permissions_is_held_to_them() -> None:
    async for hub in serve(Sandbox(small_scenario())):
        minted = await hub.json("POST", "/app/installations/1/access_tokens", status=201,
                                json={"permissions": {"contents": "read"}})
        assert minted["permissions"] == {"contents": "read"}
        hub.token = f"token {minted['token']}"
        assert (await hub.api("GET", f"{REPO}/contents/configs/runners.yaml")).status == 200
        claim = {"ref": "refs/heads/klaud/claim-x", "sha": head_of(hub)}
        assert (await hub.api("POST", f"{REPO}/git/refs", json=claim)).status == 403
        assert (await hub.api("GET", f"{REPO}/pulls")).status == 403
        hub.token = "token anything"  # an unknown token acts with the installation's
        assert (await hub.api("POST", f"{REPO}/git/refs", json=claim)).status == 201
        too_much = await hub.api("POST", "/app/installations/1/access_tokens",
                                 json={"permissions": {"administration": "write"}})
        assert too_much.status == 422


async def test_events_the_installation_does_not_subscribe_to_are_skipped(
    receiver: Receiver,
) -> None:
    scenario = scenario_with(events=["push"])
    async for hub in serve(Sandbox(scenario, deliver_to=receiver.url)):
        commented = await hub.act(action="comment", repo="acme/bench", number=12, user="bob",
                                  body="hi")
        assert (commented["deliveries"], commented["statuses"]) == ([], [])
        pushed = await hub.act(action="push_default", repo="acme/bench", files={"a.md": "a\n"})
        assert pushed["statuses"] == [202]
        listed = await (await hub.client.get("/_sandbox/deliveries")).json()
        assert [(d["event"], d["outcome"], d["reason"]) for d in listed] == [
            ("issue_comment", "skipped", "the installation does not subscribe to issue_comment"),
            ("push", "sent", None)]
        installation = await hub.json("GET", f"{REPO}/installation")
        assert installation["events"] == ["push"]


async def test_events_the_installation_may_not_see_are_skipped(receiver: Receiver) -> None:
    async for hub in serve(Sandbox(scenario_with(permissions=without("actions")),
                                   deliver_to=receiver.url)):
        answer = await hub.act(action="complete_run", repo="acme/bench",
                               run={"workflow": "klaud-plan.yml"})
        assert answer["statuses"] == [] and receiver.received == []
        [skipped] = hub.sandbox.deliveries
        assert skipped.outcome == "skipped"
        assert skipped.reason == "the installation has no permission to receive workflow_run"


def test_repositories_of_one_installation_share_its_permissions() -> None:
    scenario = scenario_with(permissions={"contents": "read"})
    other = {**repo_of(scenario), "full_name": "acme/other", "pulls": [], "runs": []}
    del other["permissions"]
    scenario["repositories"].append(other)
    with pytest.raises(SandboxError, match="installation 1"):
        Sandbox(scenario)


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", f"{REPO}/issues/40/comments", {"body": "hi"}),
    ("GET", f"{REPO}/issues/40/comments", None),
    ("PATCH", f"{REPO}/issues/comments/COMMENT", {"body": "edited"}),
    ("POST", f"{REPO}/issues/comments/COMMENT/reactions", {"content": "eyes"}),
])
async def test_comments_on_a_plain_issue_need_the_issues_permission(
    method: str, path: str, body: dict[str, Any] | None,
) -> None:
    # pull_requests covers the issue side of a pull request only (it commented on one before).
    scenario = scenario_with(permissions=without("issues", pull_requests="write"),
                             issues=[{"number": 40, "title": "t", "user": "alice"}])
    async for hub in serve(Sandbox(scenario)):
        comment = hub.sandbox.world.add_comment(hub.sandbox.world.repo("acme/bench"), 40, "alice", "hello", via_app=False)
        response = await hub.api(method, path.replace("COMMENT", str(comment.id)), json=body)
        assert response.status == 403, await response.text()
        await hub.sandbox.drain()
