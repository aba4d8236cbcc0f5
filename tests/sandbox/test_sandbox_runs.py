"""Workflow runs: dispatch answers, jobs, and the run lifecycle (queued → in_progress → completed)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bot.sandbox import Sandbox
from tests.sandbox.test_sandbox_support import (
    CANDIDATE_WORKFLOW,
    Hub,
    Receiver,
    repo_of,
    serve,
    small_scenario,
)

REPO = "/repos/acme/bench"
DISPATCH = f"{REPO}/actions/workflows/klaud-candidate.yml/dispatches"
INPUTS = {"candidate": "d92e15065c55779d-555679de269db36f", "family": "f", "base": "b"}
# The keys of a job in GitHub's "List jobs for a workflow run" answer.
JOB_KEYS = {"id", "run_id", "workflow_name", "head_branch", "run_url", "run_attempt", "node_id",
            "head_sha", "url", "html_url", "status", "conclusion", "created_at", "started_at",
            "completed_at", "name", "steps", "check_run_url", "labels", "runner_id",
            "runner_name", "runner_group_id", "runner_group_name"}
STEP_KEYS = {"name", "status", "conclusion", "number", "started_at", "completed_at"}


def titled_scenario() -> dict[str, Any]:
    """The small scenario whose candidate workflow names its runs after the candidate."""
    scenario = small_scenario()
    repo_of(scenario)["files"][".github/workflows/klaud-candidate.yml"] = CANDIDATE_WORKFLOW.replace(
        "on:\n", "run-name: Klaud Cold candidate ${{ inputs.candidate }}\non:\n")
    repo_of(scenario)["runs"].append(
        {"id": 103, "workflow": "klaud-plan.yml", "status": "queued",
         "created_at": "2026-11-30T07:00:00Z",
         "jobs": [{"name": "plan", "steps": [{"name": "checkout"}, {"name": "plan"}]}]})
    return scenario


async def dispatch(hub: Hub, **extra: Any) -> Any:
    return await hub.json("POST", DISPATCH, json={"ref": "main", "inputs": INPUTS, **extra})


def sent(hub: Hub) -> list[tuple[str, str | None]]:
    return [(d.event, d.action) for d in hub.sandbox.deliveries]


async def test_dispatch_with_return_run_details_answers_the_run(hub: Hub) -> None:
    answer = await dispatch(hub, return_run_details=True)
    run_id = hub.state()["dispatches"][0]["run_id"]
    assert answer == {
        "workflow_run_id": run_id,
        "run_url": f"{answer['run_url'].split('/repos/')[0]}/repos/acme/bench/actions/runs/{run_id}",
        "html_url": f"https://github.com/acme/bench/actions/runs/{run_id}",
    }
    path = answer["run_url"][answer["run_url"].index("/repos/"):]
    run = await hub.json("GET", path)
    assert (run["id"], run["status"], run["conclusion"]) == (run_id, "queued", None)
    await hub.sandbox.drain()


async def test_dispatch_without_details_or_with_false_answers_204(hub: Hub) -> None:
    for body in ({}, {"return_run_details": False}):
        response = await hub.api("POST", DISPATCH, json={"ref": "main", "inputs": INPUTS, **body})
        assert response.status == 204 and await response.read() == b""
    assert len(hub.state()["dispatches"]) == 2
    await hub.sandbox.drain()


@pytest.mark.parametrize(
    ("workflow", "body", "status"),
    [
        ("klaud-candidate.yml", {"inputs": INPUTS, "return_run_details": "yes"}, 422),
        ("missing.yml", {"return_run_details": True}, 404),
        ("run-sweep.yml", {"return_run_details": True}, 422),
        ("klaud-candidate.yml", {"inputs": {**INPUTS, "colour": "red"},
                                 "return_run_details": True}, 422),
    ],
)
async def test_dispatch_refusals_hold_with_run_details(
    hub: Hub, workflow: str, body: dict[str, Any], status: int
) -> None:
    response = await hub.api("POST", f"{REPO}/actions/workflows/{workflow}/dispatches",
                             json={"ref": "main", **body})
    assert response.status == status
    assert hub.state()["dispatches"] == []
    assert [r["id"] for r in hub.state()["runs"]] == [101, 102]


async def test_scenario_jobs_are_listed_in_githubs_shape() -> None:
    scenario = small_scenario()
    repo_of(scenario)["runs"][1]["jobs"] = [
        {"name": "benchmark", "steps": [{"name": "checkout", "conclusion": "success"},
                                        {"name": "run sweep"}]},
        {"name": "report", "conclusion": "skipped"},
    ]
    async for hub in serve(Sandbox(scenario)):
        listed = await hub.json("GET", f"{REPO}/actions/runs/102/jobs")
        assert listed["total_count"] == 2
        benchmark, report = listed["jobs"]
        assert set(benchmark) == JOB_KEYS and set(benchmark["steps"][0]) == STEP_KEYS
        assert (benchmark["run_id"], benchmark["status"], benchmark["conclusion"]) == (
            102, "completed", "failure")  # the run's conclusion
        assert benchmark["workflow_name"] == "Klaud Cold candidate"
        assert benchmark["completed_at"] == "2026-11-27T03:00:00Z"
        assert [(s["number"], s["name"], s["status"], s["conclusion"])
                for s in benchmark["steps"]] == [(1, "checkout", "completed", "success"),
                                                 (2, "run sweep", "completed", "failure")]
        assert (report["conclusion"], report["steps"]) == ("skipped", [])
        assert benchmark["id"] != report["id"]
        first = await hub.api("GET", f"{REPO}/actions/runs/102/jobs", params={"per_page": "1"})
        page = await first.json()
        assert page["total_count"] == 2 and [j["name"] for j in page["jobs"]] == ["benchmark"]
        assert 'rel="next"' in first.headers["Link"]
        assert (await hub.json("GET", f"{REPO}/actions/runs/101/jobs")) == {
            "total_count": 0, "jobs": []}
        assert (await hub.api("GET", f"{REPO}/actions/runs/999/jobs")).status == 404


async def test_a_dispatched_run_starts_and_completes_keeping_its_title(
    receiver: Receiver,
) -> None:
    async for hub in serve(Sandbox(titled_scenario(), deliver_to=receiver.url)):
        run_id = (await dispatch(hub, return_run_details=True))["workflow_run_id"]
        await hub.sandbox.drain()
        hub.sandbox.clock.advance(60)
        started = await hub.act(action="start_run", repo="acme/bench", run={"id": run_id})
        assert started["run_id"] == run_id and started["statuses"] == [202]
        running = await hub.json("GET", f"{REPO}/actions/runs/{run_id}")
        assert (running["status"], running["conclusion"]) == ("in_progress", None)
        assert running["run_started_at"] == "2026-11-30T08:01:00Z"
        in_progress = await hub.json("GET", f"{REPO}/actions/runs", params={"status": "in_progress"})
        assert [r["id"] for r in in_progress["workflow_runs"]] == [run_id]

        done = await hub.act(action="complete_run", repo="acme/bench", run={
            "id": run_id, "conclusion": "failure",
            "jobs": [{"name": "candidate", "steps": [{"name": "bump", "conclusion": "success"},
                                                     {"name": "validate"}]}]})
        assert done["run_id"] == run_id
        run = await hub.json("GET", f"{REPO}/actions/runs/{run_id}")
        assert (run["status"], run["conclusion"]) == ("completed", "failure")
        assert run["display_title"] == f"Klaud Cold candidate {INPUTS['candidate']}"
        assert run["path"] == ".github/workflows/klaud-candidate.yml"
        assert run["head_sha"] == hub.state()["head_sha"]
        [job] = (await hub.json("GET", f"{REPO}/actions/runs/{run_id}/jobs"))["jobs"]
        assert [s["conclusion"] for s in job["steps"]] == ["success", "failure"]
        assert sent(hub) == [("workflow_run", "requested"), ("workflow_run", "in_progress"),
                             ("workflow_run", "completed")]
        payloads = [json.loads(body) for _, body in receiver.received]
        assert payloads[1]["workflow_run"]["status"] == "in_progress"
        assert payloads[2]["workflow_run"]["display_title"] == run["display_title"]


async def test_starting_moves_queued_jobs_and_completing_finishes_them() -> None:
    async for hub in serve(Sandbox(titled_scenario())):
        queued = await hub.json("GET", f"{REPO}/actions/runs/103/jobs")
        assert [(j["status"], j["conclusion"], j["runner_id"]) for j in queued["jobs"]] == [
            ("queued", None, None)]
        assert [s["status"] for s in queued["jobs"][0]["steps"]] == ["queued", "queued"]
        await hub.act(action="start_run", repo="acme/bench", run={"id": 103})
        running = (await hub.json("GET", f"{REPO}/actions/runs/103/jobs"))["jobs"][0]
        assert running["status"] == "in_progress" and running["runner_name"] is not None
        await hub.act(action="complete_run", repo="acme/bench",
                      run={"id": 103, "conclusion": "cancelled"})
        finished = (await hub.json("GET", f"{REPO}/actions/runs/103/jobs"))["jobs"][0]
        assert (finished["status"], finished["conclusion"]) == ("completed", "cancelled")
        assert {s["conclusion"] for s in finished["steps"]} == {"cancelled"}


@pytest.mark.parametrize(
    ("action", "status"),
    [
        ({"action": "start_run", "run": {"id": 101}}, 409),  # completed, not queued
        ({"action": "start_run", "run": {"id": 999}}, 404),
        ({"action": "complete_run", "run": {"id": 999, "conclusion": "success"}}, 404),
        ({"action": "complete_run", "run": {"id": 103, "workflow": "other.yml"}}, 409),
        ({"action": "complete_run", "run": {"id": 103, "conclusion": "exploded"}}, 400),
    ],
)
async def test_run_actions_that_do_not_fit_the_state(action: dict[str, Any], status: int) -> None:
    async for hub in serve(Sandbox(titled_scenario())):
        response = await hub.client.post("/_sandbox/act", json={**action, "repo": "acme/bench"})
        assert response.status == status, await response.text()
        assert next(r for r in hub.state()["runs"] if r["id"] == 103)["status"] == "queued"
