"""`klaud doctor` against sandbox repositories that break each check (DESIGN §3.1)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web

from bot.cli import main
from bot.core.clock import ManualClock
from bot.runtime import generate_app_key
from bot.sandbox import Sandbox
from tests import scenarios as sc

Breakage = Callable[[dict[str, Any]], None]


def repository(scenario: dict[str, Any]) -> dict[str, Any]:
    return scenario["repositories"][0]  # type: ignore[no-any-return]


def set_file(path: str, text: str | None) -> Breakage:
    def apply(scenario: dict[str, Any]) -> None:
        if text is None:
            repository(scenario)["files"].pop(path, None)
        else:
            repository(scenario)["files"][path] = text

    return apply


def drop_permission(name: str) -> Breakage:
    def apply(scenario: dict[str, Any]) -> None:
        granted = {"metadata": "read", "contents": "write", "pull_requests": "read", "issues": "write",
                   "actions": "write", "checks": "write"}
        granted.pop(name)
        repository(scenario)["permissions"] = granted

    return apply


def drop_cluster(cluster: str) -> Breakage:
    def apply(scenario: dict[str, Any]) -> None:
        scenario["capacity"]["clusters"] = [c for c in scenario["capacity"]["clusters"] if c["id"] != cluster]

    return apply


WORKFLOW = ".github/workflows/klaud-candidate.yml"


async def doctor(tmp_path, monkeypatch, capsys, breakage: Breakage | None = None) -> tuple[int, list[dict[str, Any]]]:
    scenario = sc.scenario()
    if breakage is not None:
        breakage(scenario)
    private_pem, public_key = generate_app_key()
    # The command runs on the wall clock: so does this sandbox (the capacity feed's age).
    sandbox = Sandbox(scenario, clock=ManualClock(datetime.now(UTC)), strict_auth=True, app_id=7,
                      app_public_key=public_key)
    runner = web.AppRunner(sandbox.create_app(), shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    sandbox.world.origin = url
    key_file = tmp_path / "app.pem"
    key_file.write_text(private_pem)
    env = {"KLAUD_DB": f"sqlite:///{tmp_path / 'd.db'}", "KLAUD_APP_ID": "7", "KLAUD_PRIVATE_KEY_FILE": str(key_file),
           "KLAUD_GITHUB_URL": f"{url}/_sandbox/github", "KLAUD_CAPACITY_URL": f"{url}/_sandbox/capacity"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        status = await asyncio.to_thread(main, ["doctor", "--json"])
    finally:
        await runner.cleanup()
    captured = capsys.readouterr()
    reports = [json.loads(line) for line in captured.out.splitlines()]
    assert len(reports) == 1, captured.err[-2000:]
    [report] = reports
    return status, report["checks"]


def failed(checks: list[dict[str, Any]]) -> dict[str, str]:
    return {c["check"]: c["detail"] for c in checks if not c["ok"]}


async def test_a_ready_repository_passes_every_check(tmp_path, monkeypatch, capsys):
    status, checks = await doctor(tmp_path, monkeypatch, capsys)
    assert failed(checks) == {} and status == 0
    assert {c["check"] for c in checks} == {
        "permissions", "events", "policy", "candidate workflow", "run-name", "master configs", "runners", "capacity feed",
    }


async def test_doctor_runs_beside_a_server_that_holds_the_sqlite_file(tmp_path, monkeypatch, capsys):
    from bot.store.lockfile import PidLock

    server = PidLock(str(tmp_path / "d.db"))  # what a running `klaud serve` holds
    server.acquire()
    try:
        # It refused ("in use by another Klaud process"), exit 1 as for a failed check.
        status, checks = await doctor(tmp_path, monkeypatch, capsys)
    finally:
        server.release()
    assert failed(checks) == {} and status == 0


@pytest.mark.parametrize(
    ("breakage", "check", "says"),
    [
        (drop_permission("checks"), "permissions", "checks: write"),
        (set_file(WORKFLOW, None), "candidate workflow", "does not exist on the default branch"),
        (set_file(WORKFLOW, "on:\n  workflow_call: {}\njobs: {}\n"), "candidate workflow", "no workflow_dispatch trigger"),
        (set_file(WORKFLOW, sc.CANDIDATE_WORKFLOW.replace("      wave: {required: true, type: string}\n", "")),
         "candidate workflow", "does not declare the input(s) wave"),
        (set_file(WORKFLOW, sc.CANDIDATE_WORKFLOW.replace(
            "      wave: {required: true, type: string}\n", "      wave: {required: true, type: choice, options: ['1', '2']}\n")),
         "candidate workflow", "types the input(s) wave (choice)"),
        (set_file(WORKFLOW, sc.CANDIDATE_WORKFLOW.replace("run-name: Klaud Cold candidate ${{ inputs.candidate }}\n", "")),
         "run-name", "does not name its runs"),
        (set_file("configs/amd-master.yaml", "key: [unclosed\n"), "master configs", "not valid YAML"),
        (set_file(".github/klaud.yml", "cooldown_hours: 0\n"), "policy", "cooldown_hours"),
        (drop_cluster("h200-nb"), "capacity feed", "does not report h200-nb"),
    ],
    ids=["permission", "workflow-missing", "not-dispatchable", "inputs", "input-types", "run-name", "config", "policy",
         "capacity"],
)
async def test_each_broken_setup_fails_its_check_with_a_fix(tmp_path, monkeypatch, capsys, breakage, check, says):
    status, checks = await doctor(tmp_path, monkeypatch, capsys, breakage)
    assert status == 1
    problems = failed(checks)
    assert check in problems and says in problems[check], problems
    assert all(c["hint"] for c in checks if not c["ok"])
