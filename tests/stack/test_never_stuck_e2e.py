"""Never stuck, never twice (DESIGN §4): crashes, lost events and failures before an outcome,
end to end against the sandbox GitHub."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bot.app import Klaud
from bot.core.domain import claim_ref
from bot.github.repo import GitHubRepo
from bot.sandbox import Sandbox
from bot.services.claims import UNLINKED_CHECK_AFTER
from bot.web.webhook import create_webhook_app
from tests import scenarios as sc
from tests.builders import delivery
from tests.harness import SECRET, make_settings, sandbox_stack
from tests.stack.test_waves_e2e import decision

REPO = "acme/bench"
ONE_WAVE = 2 * 3600 + 120


def dispatched_candidates(github: dict[str, Any]) -> list[str]:
    return [d["inputs"]["candidate"] for d in github["dispatches"]]


@asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app, shutdown_timeout=0.5, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def klaud_on(sandbox: Sandbox, sandbox_url: str, db: Path) -> AsyncIterator[Klaud]:
    """A Klaud process on `db`, talking to a sandbox that outlives it (and on its clock)."""
    settings = make_settings(db, KLAUD_GITHUB_URL=f"{sandbox_url}/_sandbox/github",
                             KLAUD_CAPACITY_URL=f"{sandbox_url}/_sandbox/capacity")
    klaud = Klaud(settings, clock=sandbox.clock, check_delay_seconds=0.01,
                  inbox_options={"base_delay": 0.005, "max_delay": 0.02})
    async with served(create_webhook_app(klaud)) as url:
        sandbox.deliver_to = f"{url}/webhook"
        await klaud.start(drain=True, reconcile=True)
        try:
            yield klaud
        finally:
            sandbox.deliver_to = None
            await klaud.stop(grace=0.5)


async def settle(sandbox: Sandbox, klaud: Klaud) -> None:
    for _ in range(20):
        await sandbox.drain()
        await klaud.inbox.drained()
        if klaud.inbox.backlog == 0:
            return
    raise AssertionError("the bot did not settle")


async def test_a_crash_between_claim_and_dispatch_frees_the_family_within_one_light_reconcile(tmp_path, monkeypatch):
    sandbox = Sandbox(sc.scenario(policy="max_candidates_per_wave: 1\n"), webhook_secret=SECRET)
    async with served(sandbox.create_app()) as sandbox_url:
        sandbox.world.origin = sandbox_url
        async with klaud_on(sandbox, sandbox_url, tmp_path / "k.db") as klaud:
            # The process dies once the claim ref exists, before the dispatch is sent.
            reached = asyncio.Event()

            async def die_before_dispatching(*_: Any, **__: Any) -> None:
                reached.set()
                await asyncio.Event().wait()

            with monkeypatch.context() as patch:
                patch.setattr(GitHubRepo, "dispatch", die_before_dispatching)
                wave = asyncio.create_task(klaud.waves.run(REPO, trigger="test"))
                await reached.wait()
                wave.cancel()  # nothing after this line runs: the process is gone
                await asyncio.gather(wave, return_exceptions=True)
        [ref] = [r for r in sandbox.state_document()["repositories"][REPO]["refs"] if "claim" in r]
        async with klaud_on(sandbox, sandbox_url, tmp_path / "k.db") as klaud:
            state = klaud.live.repo(REPO)
            # What the wave was about to dispatch was committed first: a dispatch without a run.
            assert state is not None and set(state.claims) == set(state.dispatches)
            [family] = state.dispatches
            assert ref.endswith(claim_ref(family)) and state.dispatches[family].run_id is None
            first = await klaud.waves.run(REPO, trigger="test")
            assert decision(first, family).decision == "in-flight"
            sandbox.clock.advance(ONE_WAVE)
            await klaud.reconciler.reconcile(REPO, 1, light=True)
            assert ref not in sandbox.state_document()["repositories"][REPO]["refs"]
            again = await klaud.waves.run(REPO, trigger="test")
            assert decision(again, family).decision == "selected"
        made = dispatched_candidates(sandbox.state_document()["repositories"][REPO])
        assert len(made) == len(set(made))  # nothing dispatched twice


async def test_a_dropped_completed_delivery_is_recovered_by_the_light_reconcile(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(policy="max_candidates_per_wave: 1\n")) as run:
        wave = await run.klaud.waves.run(REPO, trigger="test")
        [cand] = wave.selected
        family = decision_family(wave, cand)
        [made] = run.github()["dispatches"]
        run.sandbox.set_faults({"rules": [{"webhook": "workflow_run", "action": "completed", "count": 1}]})
        await run.act({"action": "complete_run", "repo": REPO, "run": {
            "id": made["run_id"], "conclusion": "success",
            "artifacts": [{"name": f"klaud-candidate-{cand}", "expired": False,
                           "files": {"candidate-diagnostics.json": sc.diagnostics("incompatible")}}]}})
        assert family in run.klaud.live.repo(REPO).dispatches  # the event never came
        await run.act({"action": "advance_clock", "seconds": 3600})
        await run.klaud.reconciler.reconcile(REPO, 1, light=True)
        [attempt] = [a for a in run.state()["attempts"] if a["candidate"] == cand]
        assert (attempt["verified"], attempt["outcome"]) == (True, "incompatible")
        assert family not in run.klaud.live.repo(REPO).claims


def decision_family(wave: Any, cand: str) -> str:
    return str(next(d.family for d in wave.decisions if d.candidate == cand))


def claim_refs(run: Any) -> set[str]:
    return {ref for ref in run.github()["refs"] if "claim" in ref}


def refs_of(wave: Any, candidates: list[str]) -> set[str]:
    return {f"refs/heads/{claim_ref(decision_family(wave, c))}" for c in candidates}


async def test_under_thirty_percent_5xx_the_document_says_what_became_of_each_dispatch(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        run.sandbox.set_faults({"seed": 7, "rules": [
            {"method": "POST", "route": "/dispatches$", "status": 502, "rate": 0.3}]})
        wave = await run.klaud.waves.run(REPO, trigger="test")
        run.sandbox.set_faults({"rules": []})
        made = dispatched_candidates(run.github())
        # A 502 may come after GitHub queued the run: such a dispatch keeps its claim, in
        # flight, and its decision says the answer was lost.
        unanswered = [d.candidate for d in wave.decisions if "answer was lost" in d.reason]
        assert unanswered and made and set(wave.selected) == set(made) | set(unanswered)
        [stored] = [w for w in await stored_waves(run) if w["wave"] == wave.wave]
        assert sorted(stored["selected"]) == sorted(wave.selected)
        assert claim_refs(run) == refs_of(wave, list(wave.selected))
        # Ten minutes on, no run is titled with their candidate ids: their claims go.
        run.sandbox.clock.advance(UNLINKED_CHECK_AFTER.total_seconds())
        await run.klaud.reconciler.claims.check_due(run.klaud.live.repo(REPO))
        assert claim_refs(run) == refs_of(wave, made)


async def test_a_dispatch_applied_under_a_cut_connection_runs_once_and_is_linked_to_its_run(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(policy="max_candidates_per_wave: 1\n")) as run:
        run.sandbox.set_faults({"rules": [
            {"method": "POST", "route": "/dispatches$", "lose_answer": True, "count": 1}]})
        first = await run.klaud.waves.run(REPO, trigger="test")
        second = await run.klaud.waves.run(REPO, trigger="test")
        [cand] = first.selected
        assert dispatched_candidates(run.github()).count(cand) == 1 and cand not in second.selected
        run.sandbox.clock.advance(UNLINKED_CHECK_AFTER.total_seconds())
        state = run.klaud.live.repo(REPO)
        await run.klaud.reconciler.claims.check_due(state)
        [made] = [d for d in run.github()["dispatches"] if d["inputs"]["candidate"] == cand]
        assert state.dispatches[decision_family(first, cand)].run_id == made["run_id"]


async def stored_waves(run: Any) -> list[dict[str, Any]]:
    state = run.klaud.live.repo(REPO)
    documents = [await run.klaud.store.wave(state.name, number) for number in range(1, state.meta.wave + 1)]
    return [document for document in documents if document is not None]


def failing_jobs() -> list[dict[str, Any]]:
    return [{"name": "get-jobs", "conclusion": "failure",
             "steps": [{"name": "Generate matrix", "conclusion": "failure"}]}]


async def test_runs_failing_in_get_jobs_pause_dispatch_until_a_canary_succeeds(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        wave = await run.klaud.waves.run(REPO, trigger="test")
        assert len(wave.selected) == 5
        for made in run.github()["dispatches"]:
            await run.act({"action": "complete_run", "repo": REPO, "run": {
                "id": made["run_id"], "conclusion": "failure", "jobs": failing_jobs()}})
        state = run.state()
        assert state["blocked"]["code"] == "dispatch-paused"
        assert "job `get-jobs`, step `Generate matrix`" in state["blocked"]["reason"]
        await run.act({"action": "advance_clock", "seconds": ONE_WAVE})
        paused = await run.klaud.waves.run(REPO, trigger="test")
        assert paused.selected == () and paused.document()["blocked"]["code"] == "dispatch-paused"
        assert {d.decision for d in paused.decisions} >= {"paused"}
        assert "dispatch paused" in (await run.klaud.plan_document(REPO))["blocked"]["reason"]
        # A push arms the canary: one candidate goes out.
        await run.act({"action": "push_default", "repo": REPO, "files": {"README.md": "fixed the matrix\n"}})
        canary = await run.klaud.waves.run(REPO, trigger="test")
        [cand] = canary.selected
        [made] = [d for d in run.github()["dispatches"] if d["inputs"]["candidate"] == cand][-1:]
        await run.act({"action": "complete_run", "repo": REPO, "run": {
            "id": made["run_id"], "conclusion": "success",
            "artifacts": [{"name": f"klaud-candidate-{cand}", "expired": False,
                           "files": {"candidate-diagnostics.json": sc.diagnostics("capacity-deferred")}}]}})
        assert run.state()["blocked"] is None
        resumed = await run.klaud.waves.run(REPO, trigger="test")
        assert resumed.document()["blocked"] is None and resumed.selected


async def lost_push(run: Any) -> None:
    run.sandbox.set_faults({"rules": [{"webhook": "push", "count": 1}]})
    await run.act({"action": "push_default", "repo": REPO, "files": {"README.md": f"{run.sandbox.clock.now()}\n"}})
    run.sandbox.set_faults({"rules": []})


async def test_a_push_missed_arms_the_canary_only_when_it_came_after_the_pause(tmp_path):
    # What this catches (a chaos soak, seed 630): a push whose webhook was lost, made before
    # the runs of a wave failed and paused dispatch, was found by the light reconcile and
    # armed the canary: the next wave sent one out with no push and no /klaud resume since
    # the pause (one written before it is refused as late), and its outcome resumed dispatch.
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        first = await run.klaud.waves.run(REPO, trigger="test")
        assert len(first.selected) == 5
        await lost_push(run)
        await run.act({"action": "advance_clock", "seconds": 600})  # well past the clocks' skew
        for made in run.github()["dispatches"][:3]:
            await run.act({"action": "complete_run", "repo": REPO, "run": {
                "id": made["run_id"], "conclusion": "failure", "jobs": failing_jobs()}})
        assert run.state()["blocked"]["code"] == "dispatch-paused"
        await run.act({"action": "advance_clock", "seconds": ONE_WAVE})
        await run.klaud.reconciler.reconcile(REPO, 1, light=True)  # finds the moved head
        assert (await run.klaud.waves.run(REPO, trigger="test")).selected == ()
        await lost_push(run)  # after the pause: it may fix what paused dispatch
        await run.act({"action": "advance_clock", "seconds": ONE_WAVE})
        await run.klaud.reconciler.reconcile(REPO, 1, light=True)
        assert len((await run.klaud.waves.run(REPO, trigger="test")).selected) == 1


def docs_pull(number: int) -> dict[str, Any]:
    """A pull request that changes no family (a document)."""
    return {"number": number, "title": "Docs", "user": "bob", "head_ref": "docs", "draft": False, "labels": [],
            "created_at": sc.NOW, "updated_at": sc.NOW,
            "files": [{"filename": "docs/notes.md", "status": "added", "content": "notes\n"}]}


@pytest.mark.parametrize("activity", ["listed", "refused"])
async def test_a_push_missed_before_the_pause_arms_no_canary_after_a_push_to_another_branch(tmp_path, activity):
    # The limit the repository's `pushed_at` left (stop 36): it dates the last push to any
    # branch, so a missed push made before the pause armed the canary once someone pushed
    # to a pull request's branch after it. The default branch's activity dates the push
    # itself; where GitHub has no activity API, `pushed_at` still decides.
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[docs_pull(60)])) as run:
        first = await run.klaud.waves.run(REPO, trigger="test")
        assert first.selected
        await lost_push(run)
        await run.act({"action": "advance_clock", "seconds": 600})
        for made in run.github()["dispatches"][:3]:
            await run.act({"action": "complete_run", "repo": REPO, "run": {
                "id": made["run_id"], "conclusion": "failure", "jobs": failing_jobs()}})
        assert run.state()["blocked"]["code"] == "dispatch-paused"
        await run.act({"action": "advance_clock", "seconds": 600})
        await run.act({"action": "push_pull", "repo": REPO, "number": 60,
                       "files": [{"filename": "docs/notes.md", "status": "added", "content": "more notes\n"}]})
        if activity == "refused":
            run.sandbox.set_faults({"rules": [{"method": "GET", "route": "/activity$", "status": 404}]})
        await run.act({"action": "advance_clock", "seconds": ONE_WAVE})
        await run.klaud.reconciler.reconcile(REPO, 1, light=True)  # finds the moved head
        armed = len((await run.klaud.waves.run(REPO, trigger="test")).selected)
        assert armed == (0 if activity == "listed" else 1)


async def test_a_candidate_failing_twice_before_an_outcome_cools_down_once_does_not(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(policy="max_candidates_per_wave: 1\n")) as run:
        for attempt in (1, 2):
            wave = await run.klaud.waves.run(REPO, trigger="test")
            [cand] = wave.selected
            family = decision_family(wave, cand)
            made = run.github()["dispatches"][-1]
            await run.act({"action": "complete_run", "repo": REPO, "run": {
                "id": made["run_id"], "conclusion": "failure", "jobs": failing_jobs()}})
            preview = await run.klaud.waves.preview(REPO)
            verdict = decision(preview, family)
            if attempt == 1:
                assert verdict.decision == "selected"  # once: eligible next wave
            else:
                assert verdict.decision == "cooldown"
                assert "job `get-jobs`, step `Generate matrix`" in verdict.reason
            await run.act({"action": "advance_clock", "seconds": 600})


async def test_a_misnamed_candidate_workflow_is_a_setup_error_with_zero_claim_writes(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(policy="candidate_workflow: klaud-candidat.yml\n")) as run:
        run.reset_requests()
        wave = await run.klaud.waves.run(REPO, trigger="test")
        assert run.requests["total"] == 0 and wave.selected == ()
        assert wave.document()["blocked"]["code"] == "setup-error"
        assert run.state()["setup_errors"][0]["code"] == "candidate-workflow-missing"
        # The push that fixes the name lifts it.
        await run.act({"action": "push_default", "repo": REPO, "files": {".github/klaud.yml": None}})
        assert run.state()["blocked"] is None
        assert (await run.klaud.waves.run(REPO, trigger="test")).selected


async def test_a_claim_ref_refused_by_a_ruleset_fails_the_dispatch_instead_of_reading_as_claimed(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(policy="max_candidates_per_wave: 1\n")) as run:
        refused = "Repository rule violations found\n\nCannot create ref due to creations being restricted."
        run.sandbox.set_faults({"rules": [
            {"method": "POST", "route": "/git/refs$", "status": 422, "message": refused}]})
        wave = await run.klaud.waves.run(REPO, trigger="test")
        run.sandbox.set_faults({"rules": []})
        # Taken for another wave's claim, it was `claimed` every wave, and nothing was ever
        # dispatched or said why.
        kinds = {d.decision for d in wave.decisions}
        assert "claimed" not in kinds and "dispatch-failed" in kinds
        assert any("Cannot create ref" in d.reason for d in wave.decisions)
        assert run.klaud.live.repo(REPO).claims == {}


async def test_new_permissions_accepted_reconciles_the_repositories_it_names(tmp_path):
    # What this catches: an installation's `new_permissions_accepted` not reconciling its repositories (state missing, e.g. lost while a permission was refused, is never rebuilt).
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        removed = {"action": "removed", "installation": {"id": 1}, "repositories_removed": [{"full_name": REPO}],
                   "repositories_added": [], "sender": {"login": "alice"}}
        await run.klaud.handle(delivery("r", "installation_repositories", json.dumps(removed).encode()))
        assert run.klaud.live.repo(REPO) is None
        accepted = {"action": "new_permissions_accepted", "installation": {"id": 1},
                    "repositories": [{"full_name": REPO}], "sender": {"login": "alice"}}
        await run.klaud.handle(delivery("n", "installation", json.dumps(accepted).encode()))
        state = run.klaud.live.repo(REPO)
        assert state is not None and {f.id for f in state.catalog} == set(sc.FAMILIES)


async def test_a_command_whose_webhook_was_dropped_is_answered_by_the_light_reconcile(tmp_path):
    h200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        run.sandbox.set_faults({"rules": [{"webhook": "issue_comment", "action": "created", "count": 1}]})
        made = await run.act({"action": "comment", "repo": REPO, "number": 12, "user": "alice",
                              "body": f"/klaud hold {h200} new weights"})
        assert h200 not in run.klaud.live.repo(REPO).holds  # the event never came
        await run.act({"action": "advance_clock", "seconds": 3600})
        report = await run.klaud.reconciler.reconcile(REPO, 1, light=True)
        await run.settle()
        assert report["commands_answered"] == 1
        assert run.klaud.live.repo(REPO).holds[h200].by == "alice"
        github = run.github()
        [reply] = [c for c in github["comments"] if f"klaud-command:{made['comment_id']}" in c["body"]]
        assert reply["user"] == "klaud-cold[bot]" and reply["issue_number"] == 12
        assert {"comment_id": made["comment_id"], "content": "eyes", "user": "klaud-cold[bot]"}.items() <= next(
            r for r in github["reactions"] if r["comment_id"] == made["comment_id"]).items()


async def test_a_retry_found_late_does_not_clear_a_cooldown_it_was_not_written_for(tmp_path):
    # Found by a stack-level soak: `/klaud retry` written while the family was not cooling
    # down (its webhook lost), then a real failure; the light reconcile answered the comment
    # hours later, cleared the new cooldown, and the next wave dispatched the family.
    family = "configs/nvidia-master.yaml:gptoss-fp4-b200-vllm"
    async with sandbox_stack(tmp_path, sc.scenario(policy="max_candidates_per_wave: 5\n")) as run:
        run.sandbox.set_faults({"rules": [{"webhook": "issue_comment", "count": 1}]})
        await run.act({"action": "comment", "repo": REPO, "number": 900, "user": "alice",
                       "body": "/klaud retry gptoss-fp4-b200-vllm"})
        wave = await run.klaud.waves.run(REPO, trigger="test")
        cand = decision(wave, family).candidate
        [made] = [d for d in run.github()["dispatches"] if d["inputs"]["candidate"] == cand]
        await run.act({"action": "complete_run", "repo": REPO, "run": {
            "id": made["run_id"], "conclusion": "success",
            "artifacts": [{"name": f"klaud-candidate-{cand}", "expired": False,
                           "files": {"candidate-diagnostics.json": sc.diagnostics("failed")}}]}})
        await run.act({"action": "advance_clock", "seconds": 6 * 3600})
        report = await run.klaud.reconciler.reconcile(REPO, 1, light=True)
        await run.settle()
        assert report["commands_answered"] == 1
        again = await run.klaud.waves.run(REPO, trigger="test")
        assert decision(again, family).decision == "cooldown"
