"""Hostile input and careless operators, past the webhook listener (issue 11's rows).

Each test is named for the row of the issue it checks.
"""

from __future__ import annotations

import base64
import io
import json
import zipfile
from typing import Any

from tests import scenarios as sc
from tests.harness import headers_for, sandbox_stack
from tests.stack.test_dashboard_e2e import wave

REPO = "acme/bench"
H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"


async def post(run: Any, event: str, payload: dict[str, Any], delivery: str) -> int:
    body = json.dumps(payload).encode()
    async with run.klaud.session.post(f"{run.url}/webhook", data=body, headers=headers_for(event, body, delivery=delivery)) as answer:
        return int(answer.status)


async def test_full_name_differing_in_case_is_one_repository(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(policy="max_candidates_per_wave: 1\n")) as run:
        for delivery, name in (("d-1", "ACME/Bench"), ("d-2", "acme/BENCH")):
            payload = {"action": "klaud-plan", "repository": {"full_name": name}, "installation": {"id": 1}}
            assert await post(run, "repository_dispatch", payload, delivery) == 202
            await run.settle()
        assert len(run.klaud.live.repos) == 1
        # Two waves of one repository: the second sees the first's dispatch in flight.
        assert len(run.github()["dispatches"]) == 2
        candidates = [d["inputs"]["candidate"] for d in run.github()["dispatches"]]
        assert len(set(candidates)) == 2


async def test_workflow_run_updated_at_notatime_fails_at_once_and_the_queue_moves_on(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        bad = {
            "action": "completed",
            "workflow_run": {"id": 9, "path": ".github/workflows/klaud-plan.yml", "head_sha": "a" * 40,
                             "updated_at": "notatime"},
            "repository": {"full_name": REPO},
            "installation": {"id": 1},
        }
        assert await post(run, "workflow_run", bad, "bad-1") == 202
        good = {"action": "klaud-plan", "repository": {"full_name": REPO}, "installation": {"id": 1}}
        assert await post(run, "repository_dispatch", good, "good-1") == 202
        await run.settle()
        failed = await run.klaud.inbox.get("bad-1")
        assert failed is not None and (failed.status, failed.attempts) == ("failed", 1)
        assert "updated_at" in (failed.error or "")
        done = await run.klaud.inbox.get("good-1")
        assert done is not None and done.status == "done"


async def test_a_receipt_by_a_human_named_klaud_cold_is_not_an_outcome(tmp_path):
    cand = sc.candidate(H200)
    receipt = (
        f"<!-- klaud-outcome:777:{cand}\n"
        '{"head": "' + "b" * 40 + '", "outcome": {"outcome": "failed", "phase": "targeted", "pull-request": 9, '
        '"run-ids": [], "repairs-used": 1}, "validation": null}\n-->\n**failed**'
    )
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(9)])) as run:
        await run.act({"action": "comment", "repo": REPO, "number": 9, "user": "Klaud-Cold", "body": receipt})
        assert [a for a in run.state()["attempts"] if a["candidate"] == cand] == []
        preview = await run.klaud.waves.preview(REPO)
        assert next(d for d in preview.decisions if d.family == H200).decision != "cooldown"


def many_entries_zip(entries: int) -> str:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("candidate-diagnostics.json", json.dumps(sc.diagnostics("failed")))
        for n in range(entries):
            archive.writestr(f"x/{n}", b"")
    return base64.b64encode(buffer.getvalue()).decode()


async def test_an_artifact_of_too_many_entries_is_unverified_not_parsed(tmp_path):
    cand = sc.candidate(H200)
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        run_doc = sc.run(301, cand, "failed", completed_at="2026-11-30T07:59:00Z")
        run_doc["artifacts"][0]["raw_zip_base64"] = many_entries_zip(5000)
        await run.act({"action": "complete_run", "repo": REPO, "run": run_doc})
        [attempt] = [a for a in run.state()["attempts"] if a["candidate"] == cand]
        assert (attempt["verified"], attempt["error"]) == (False, "too-many-entries")


async def test_a_403_or_a_persistent_502_during_startup_reconcile_does_not_stop_serving(tmp_path):
    for status in (403, 502):
        faults = {"rules": [{"method": "GET", "route": "/pulls$", "status": status}]}
        scenario = sc.scenario()
        async with sandbox_stack(tmp_path / str(status), scenario, reconcile=False) as run:
            run.sandbox.set_faults(faults)
            await run.klaud.reconciler.reconcile_new_installations()
            assert run.klaud.live.repo(REPO) is None
            failure = run.klaud.reconciler.failures[REPO]
            assert str(status) in failure.error and failure.attempts == 1
            # The operator sees why the repository is missing.
            async with run.klaud.session.get(f"{run.admin_url}/api/v1/repos") as response:
                assert response.status == 200
                body = await response.json()
            assert body["repos"] == []
            assert body["failing"] == {REPO: failure.document()} and body["failing"][REPO]["attempts"] == 1
            # Serving goes on: a delivery is still acknowledged.
            payload = {"zen": "ok", "hook_id": 1}
            assert await post(run, "ping", payload, f"ping-{status}") == 200
            run.sandbox.set_faults({"rules": []})
            await run.act({"action": "advance_clock", "seconds": 61})
            await run.klaud.reconciler.retry_failed()
            assert run.klaud.live.repo(REPO) is not None and REPO not in run.klaud.reconciler.failures


async def test_thirty_percent_401_during_waves_loses_no_command(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(9)])) as run:
        run.reset_requests()
        run.sandbox.set_faults({"seed": 3, "rules": [{"route": "^/repos/", "status": 401, "rate": 0.3}]})
        ids = []
        for n, family in enumerate(sc.FAMILIES):
            answer = await run.act({"action": "comment", "repo": REPO, "number": 9, "user": "alice",
                                    "body": f"/klaud hold {family} 401 drill {n}"})
            ids += answer["deliveries"]
        await run.klaud.waves.run(REPO, trigger="test")
        run.sandbox.set_faults({"rules": []})
        await run.settle()
        assert [r for r in run.requests["requests"] if r["status"] == 401], "the drill injected no 401"
        assert {h["family"] for h in run.state()["holds"]} == set(sc.FAMILIES)
        for delivery in ids:
            stored = await run.klaud.inbox.get(delivery)
            assert stored is not None and stored.status == "done", stored


async def test_a_comment_of_thousands_of_commands_gets_one_reply_github_accepts(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(9)])) as run:
        body = "\n".join([f"/klaud hold {H200} flood"] + ["/klaud help"] * 5000)  # a legal 60,000-character comment
        await run.act({"action": "comment", "repo": REPO, "number": 9, "user": "mallory", "body": body})
        await run.settle()
        [reply] = [c["body"] for c in run.github()["comments"] if c["user"] == "klaud-cold[bot]"]
        assert len(reply) <= 65_536 and "4991 more `/klaud` commands were not run" in reply


def recorded_runs(run: Any) -> set[int]:
    return {a.run_id for a in run.klaud.live.repo(REPO).ledger.all()}


async def test_a_pull_request_run_titled_with_a_candidate_is_not_its_unlinked_dispatchs_run(tmp_path):
    # What this catches (a chaos soak, seed 34): a pull request's run of the candidate
    # workflow, titled with a candidate, stood in for that candidate's unlinked dispatch
    # (its answer lost) and its forged outcome was recorded.
    cand = sc.candidate(H200)
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        # The dispatch's answer is lost (502): Klaud keeps it unlinked, to be found by title.
        run.sandbox.set_faults({"rules": [{"route": "/dispatches$", "status": 502, "rate": 1.0}]})
        await wave(run)
        run.sandbox.set_faults({"rules": []})
        assert H200 in run.klaud.live.repo(REPO).dispatches
        run.sandbox.clock.advance(60)
        # A contributor's pull request runs the candidate workflow, titled with the candidate,
        # and uploads `klaud-candidate-<id>` saying "failed".
        await run.act({"action": "complete_run", "repo": REPO, "run": {
            "workflow": "klaud-candidate.yml", "event": "pull_request", "display_title": f"Klaud candidate {cand}",
            "conclusion": "success", "artifacts": [{"name": f"klaud-candidate-{cand}",
                                                     "files": {"candidate-diagnostics.json": sc.diagnostics("failed")}}]}})
        await run.settle()
        pr_run = max(r.id for r in run.sandbox.world.repos[REPO].runs.values() if r.event == "pull_request")
        assert pr_run not in recorded_runs(run)  # the workflow_run event is ignored
        await run.act({"action": "advance_clock", "seconds": 3600})
        await run.klaud.reconciler.reconcile(REPO, 1, light=True)
        await run.settle()
        assert pr_run not in recorded_runs(run)  # nor taken for the unlinked dispatch's run
        assert not [a for a in run.klaud.live.repo(REPO).ledger.for_candidate(cand) if a.verified]
