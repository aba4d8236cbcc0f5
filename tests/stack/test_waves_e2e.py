"""Planning waves end to end against the sandbox GitHub (issue 5)."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import get_args

import aiohttp

from bot.cli import main as klaud_main
from bot.core.domain import DecisionKind, claim_ref
from tests import scenarios as sc
from tests.harness import sandbox_stack

NV = "configs/nvidia-master.yaml"
B200 = f"{NV}:dsr1-fp4-b200-sglang"
H200 = f"{NV}:dsr1-fp8-h200-trt"
GPTOSS = f"{NV}:gptoss-fp4-b200-vllm"
MI355 = "configs/amd-master.yaml:dsr1-fp8-mi355x-sglang"
MI300 = "configs/amd-master.yaml:llama70b-fp8-mi300x-vllm"


def decision(wave, family: str):
    return next(d for d in wave.decisions if d.family == family)


def reads(run) -> list[dict]:
    return [r for r in run.requests["requests"] if r["method"] == "GET"]


async def test_events_then_a_wave_claims_and_dispatches_without_reading_github(tmp_path):
    scenario = sc.scenario(busy=("mi300x-amd",), runs=[sc.run(101, sc.candidate(H200), "readiness-blocked")])
    async with sandbox_stack(tmp_path, scenario) as run:
        await run.act({"action": "open_pull", "repo": "acme/bench", "pull": sc.image_bump(12)})
        run.reset_requests()
        wave = await run.klaud.waves.run("acme/bench", trigger="test")
        assert reads(run) == []
        # The log did record the wave's requests: one claim and one dispatch per selection.
        assert run.requests["total"] == 2 * len(wave.selected) == 4
        assert decision(wave, H200).decision == "cooldown" and decision(wave, H200).until is not None
        assert decision(wave, B200).decision == "overlap" and decision(wave, B200).pull_requests == (12,)
        assert decision(wave, MI300).decision == "capacity" and "mi300x-amd" in decision(wave, MI300).reason
        assert set(wave.selected) == {sc.candidate(MI355), sc.candidate(GPTOSS)}
        github = run.github()
        for family in (MI355, GPTOSS):
            assert f"refs/heads/{claim_ref(family)}" in github["refs"]
        dispatched = {d["inputs"]["candidate"]: d for d in github["dispatches"]}
        assert set(dispatched) == set(wave.selected)
        inputs = dispatched[sc.candidate(MI355)]["inputs"]
        assert inputs == {"candidate": sc.candidate(MI355), "family": MI355, "base": github["head_sha"], "wave": "1"}
        assert dispatched[sc.candidate(MI355)]["workflow"] == "klaud-candidate.yml"
        # The wave document is stored and served.
        stored = await run.klaud.store.wave("acme/bench", 1)
        assert stored == wave.document()
        assert [d["family"] for d in stored["decisions"]] == [d.family for d in wave.decisions]
        # The next wave sees the dispatched candidates in flight.
        second = await run.klaud.waves.preview("acme/bench")
        assert decision(second, MI355).decision == "in-flight"


async def test_a_branch_named_klaud_fails_the_wave_once_naming_it(tmp_path):
    # git keeps branches as paths: no `klaud/claim-…` can be made while `klaud` exists. Each
    # family's claim failed alike, wave after wave, reason "422: Reference update failed".
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        async with aiohttp.ClientSession() as session, session.post(
            f"{run.url}/_sandbox/github/repos/acme/bench/git/refs",
            json={"ref": "refs/heads/klaud", "sha": run.github()["head_sha"]},
            headers={"Authorization": "token someone"},
        ) as response:
            assert response.status == 201
        run.reset_requests()
        wave = await run.klaud.waves.run("acme/bench", trigger="test")
        failed = [d for d in wave.decisions if d.decision == "dispatch-failed"]
        assert wave.selected == () and failed and run.github()["dispatches"] == []
        assert "branch 'klaud' exists" in failed[0].reason and "rename or delete 'klaud'" in failed[0].reason
        assert all("not tried" in d.reason and "'klaud'" in d.reason for d in failed[1:])
        posts = [r for r in run.requests["requests"] if r["method"] == "POST"]
        assert len(posts) == 1  # one claim tried, not one per family


async def test_lost_claim_race_gives_the_slot_to_the_next_candidate(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(policy="max_candidates_per_wave: 1\n")) as run:
        first = await run.klaud.waves.preview("acme/bench")
        winner = first.selected[0]
        family = next(d.family for d in first.decisions if d.candidate == winner)
        # Another planner claims that family behind Klaud's back (no webhook reaches Klaud).
        async with aiohttp.ClientSession() as session, session.post(
            f"{run.url}/_sandbox/github/repos/acme/bench/git/refs",
            json={"ref": f"refs/heads/{claim_ref(family)}", "sha": run.github()["head_sha"]},
            headers={"Authorization": "token other-planner"},
        ) as response:
            assert response.status == 201
        wave = await run.klaud.waves.run("acme/bench", trigger="test")
        assert decision(wave, family).decision == "claimed"
        assert len(wave.selected) == 1 and wave.selected[0] != winner
        assert len(run.github()["dispatches"]) == 1


async def test_concurrent_waves_never_dispatch_a_family_twice(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        first, second = await asyncio.gather(
            run.klaud.waves.run("acme/bench", trigger="a"), run.klaud.waves.run("acme/bench", trigger="b")
        )
        dispatched = [d["inputs"]["candidate"] for d in run.github()["dispatches"]]
        assert dispatched, "the first wave should have dispatched the eligible families"
        assert len(dispatched) == len(set(dispatched)) == len(first.selected) + len(second.selected)
        assert set(first.selected).isdisjoint(second.selected)
        assert {first.wave, second.wave} == {1, 2}


async def test_repository_dispatch_klaud_plan_runs_a_wave(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        answer = await run.act({"action": "dispatch", "repo": "acme/bench", "event_type": "klaud-plan"})
        assert answer["statuses"] == [202]
        assert run.klaud.live.repo("acme/bench").meta.wave == 1
        assert len(run.github()["dispatches"]) == 5
        await run.act({"action": "dispatch", "repo": "acme/bench", "event_type": "something-else"})
        assert run.klaud.live.repo("acme/bench").meta.wave == 1


async def test_outcome_releases_the_claim_and_starts_the_cooldown(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(policy="max_candidates_per_wave: 1\n")) as run:
        wave = await run.klaud.waves.run("acme/bench", trigger="test")
        [cand] = wave.selected
        family = decision_family = next(d.family for d in wave.decisions if d.candidate == cand)
        dispatch = run.github()["dispatches"][0]
        await run.act({"action": "complete_run", "repo": "acme/bench", "run": {
            "id": dispatch["run_id"], "workflow": "klaud-candidate.yml", "conclusion": "success",
            "artifacts": [{"name": f"klaud-candidate-{cand}", "files": {"candidate-diagnostics.json": sc.diagnostics("readiness-blocked")}}]}})
        assert f"refs/heads/{claim_ref(family)}" not in run.github()["refs"]
        state = run.klaud.live.repo("acme/bench")
        assert family not in state.claims and family not in state.dispatches
        nxt = await run.klaud.waves.preview("acme/bench")
        assert decision(nxt, decision_family).decision == "cooldown"
        assert "readiness-blocked" in decision(nxt, decision_family).reason


async def test_run_without_artifact_is_recorded_unverified_and_does_not_block(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(policy="max_candidates_per_wave: 1\n")) as run:
        wave = await run.klaud.waves.run("acme/bench", trigger="test")
        [cand] = wave.selected
        dispatch = run.github()["dispatches"][0]
        await run.act({"action": "complete_run", "repo": "acme/bench", "run": {
            "id": dispatch["run_id"], "conclusion": "success", "artifacts": []}})
        [attempt] = [a for a in run.state()["attempts"] if a["candidate"] == cand]
        assert (attempt["verified"], attempt["error"]) == (False, "artifact-missing")
        again = await run.klaud.waves.run("acme/bench", trigger="test")
        assert cand in again.selected


async def test_failed_dispatch_releases_its_claim_and_says_why(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        run.sandbox.set_faults({"rules": [{"method": "POST", "route": "/dispatches$", "status": 422, "count": 1}]})
        wave = await run.klaud.waves.run("acme/bench", trigger="test")
        [failed] = [d for d in wave.decisions if d.decision == "dispatch-failed"]
        assert "claim released" in failed.reason and "422" in failed.reason
        # The wave went on: every other family was dispatched, and only they hold claims.
        assert len(wave.selected) == 4
        assert sorted(d["inputs"]["candidate"] for d in run.github()["dispatches"]) == sorted(wave.selected)
        claimed = {ref for ref in run.github()["refs"] if "claim" in ref}
        assert f"refs/heads/{claim_ref(failed.family)}" not in claimed and len(claimed) == 4
        assert set(run.klaud.live.repo("acme/bench").claims) == {d.family for d in wave.decisions if d.decision == "selected"}


async def test_dry_run_dispatches_nothing(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(), env={"KLAUD_DRY_RUN": "true"}) as run:
        run.reset_requests()
        wave = await run.klaud.waves.run("acme/bench", trigger="test")
        assert len(wave.selected) == 5
        assert all("dry run: would claim" in d.reason for d in wave.decisions if d.decision == "selected")
        assert run.requests["total"] == 0
        assert run.github()["dispatches"] == []


async def test_capacity_feed_down_blocks_every_family_with_a_reason(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(), env={"KLAUD_CAPACITY_URL": "http://127.0.0.1:9/status"}) as run:
        wave = await run.klaud.waves.run("acme/bench", trigger="test")
        assert {d.decision for d in wave.decisions} == {"capacity"}
        assert all("every cluster counts as busy" in d.reason for d in wave.decisions)


async def test_capacity_rule_any_accepts_one_free_cluster(tmp_path):
    scenario = sc.scenario(busy=("b200-dgxc",), policy="capacity_rule: any\n")
    async with sandbox_stack(tmp_path, scenario) as run:
        wave = await run.klaud.waves.preview("acme/bench")
        assert decision(wave, B200).decision == "selected"
    async with sandbox_stack(tmp_path / "all", sc.scenario(busy=("b200-dgxc",))) as run:
        wave = await run.klaud.waves.preview("acme/bench")
        assert decision(wave, B200).decision == "capacity"


async def test_a_run_is_linked_by_the_dispatch_answer_even_without_run_name(tmp_path):
    scenario = sc.scenario(policy="max_candidates_per_wave: 1\n")
    files = scenario["repositories"][0]["files"]
    files[".github/workflows/klaud-candidate.yml"] = sc.CANDIDATE_WORKFLOW.replace(
        "run-name: Klaud Cold candidate ${{ inputs.candidate }}\n", ""
    )
    async with sandbox_stack(tmp_path, scenario) as run:
        target, run.sandbox.deliver_to = run.sandbox.deliver_to, None  # the run's events are lost
        first = await run.klaud.waves.run("acme/bench", trigger="test")
        run.sandbox.deliver_to = target
        [cand] = first.selected
        family = next(d.family for d in first.decisions if d.candidate == cand)
        [made] = run.github()["dispatches"]
        assert run.klaud.live.repo("acme/bench").dispatches[family].run_id == made["run_id"]
        # Past the claim TTL the run is read: still queued, so the family stays in flight and
        # nothing is dispatched again.
        await run.act({"action": "advance_clock", "seconds": 13 * 3600})
        state = run.klaud.live.repo("acme/bench")
        await run.klaud.reconciler.claims.check_due(state)
        assert state.dispatches[family].run_status == "queued"
        wave = await run.klaud.waves.run("acme/bench", trigger="test")
        assert decision(wave, family).decision == "in-flight"
        assert cand not in wave.selected
        assert [d["inputs"]["candidate"] for d in run.github()["dispatches"]].count(cand) == 1


async def test_expired_claim_whose_run_is_still_going_is_kept(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(policy="max_candidates_per_wave: 1\n")) as run:
        first = await run.klaud.waves.run("acme/bench", trigger="test")
        [cand] = first.selected
        family = next(d.family for d in first.decisions if d.candidate == cand)
        run_id = run.klaud.live.repo("acme/bench").dispatches[family].run_id
        await run.act({"action": "start_run", "repo": "acme/bench", "run": {"id": run_id}})
        await run.act({"action": "advance_clock", "seconds": 13 * 3600})
        state = run.klaud.live.repo("acme/bench")
        await run.klaud.reconciler.claims.check_due(state)
        assert state.dispatches[family].run_status == "in_progress"
        wave = await run.klaud.waves.run("acme/bench", trigger="test")
        assert decision(wave, family).decision == "in-flight" and "still in progress" in decision(wave, family).reason
        assert f"refs/heads/{claim_ref(family)}" in run.github()["refs"]


async def test_schedule_survives_a_restart_without_skipping_or_doubling(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        assert await run.klaud.scheduler.tick() == []  # first tick only schedules
        next_at = run.klaud.live.repo("acme/bench").meta.next_wave_at
        assert next_at == "2026-11-30T10:00:00Z"[:16] + next_at[16:]  # aligned to 10:00 UTC plus jitter
        await run.act({"action": "advance_clock", "seconds": 3 * 3600})
    # Restarted after the wave fell due: exactly one wave runs, then the next is scheduled.
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        run.sandbox.clock.set(run.sandbox.clock.now().replace(hour=11, minute=0))
        assert await run.klaud.scheduler.tick() == ["acme/bench"]
        assert await run.klaud.scheduler.tick() == []
        state = run.klaud.live.repo("acme/bench")
        assert state.meta.wave == 1
        assert state.meta.next_wave_at.startswith("2026-11-30T12:0")


async def test_plan_endpoint_and_cli_show_the_next_wave(tmp_path, capsys, monkeypatch):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        async with run.klaud.session.get(f"{run.admin_url}/api/v1/repos/acme/bench/plan") as response:
            document = await response.json()
        assert response.status == 200
        assert set(document) == {"repo", "at", "base", "wave", "selected", "blocked", "decisions"}
        assert len(document["decisions"]) == 5 and len(document["selected"]) == 5
        assert run.github()["dispatches"] == []
        for year_one in ("0001-01-01T00:00:00+01:00", "0001-01-01T00:00:00Z"):  # a 500 before
            async with run.klaud.session.get(f"{run.admin_url}/api/v1/repos/acme/bench/plan",
                                             params={"at": year_one}) as response:
                assert response.status == 400
    monkeypatch.setenv("KLAUD_DB", f"sqlite:///{tmp_path / 'klaud.db'}")
    monkeypatch.setenv("KLAUD_CAPACITY_URL", "http://127.0.0.1:9/none")
    assert await asyncio.to_thread(klaud_main, ["plan", "--repo", "acme/bench", "--json", "--at", "2026-11-30T09:00:00Z"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["at"] == "2026-11-30T09:00:00Z"
    assert {d["decision"] for d in printed["decisions"]} == {"capacity"}
    assert await asyncio.to_thread(klaud_main, ["plan", "--repo", "acme/none"]) == 2
    assert await asyncio.to_thread(klaud_main, ["plan", "--repo", "acme/bench", "--at", "0001-01-01T00:00:00+01:00"]) == 2


async def test_scheduler_survives_a_repository_whose_github_fails(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await run.klaud.scheduler.tick()  # schedules the first wave
        run.sandbox.set_faults({"rules": [{"method": "GET", "route": "/pulls$", "status": 404}]})
        await run.act({"action": "advance_clock", "seconds": 7 * 3600})
        # The wave is due and runs; the light reconcile that follows fails with a GitHub error.
        assert await run.klaud.scheduler.tick() == ["acme/bench"]
        run.sandbox.set_faults({"rules": []})
        await run.act({"action": "advance_clock", "seconds": 2 * 3600})
        assert await run.klaud.scheduler.tick() == ["acme/bench"]
        assert run.klaud.live.repo("acme/bench").meta.wave == 2


async def test_only_the_latest_wave_documents_are_kept(tmp_path, monkeypatch):
    import bot.services.waves

    monkeypatch.setattr(bot.services.waves, "KEEP_WAVES", 2)
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        for _ in range(3):
            await run.klaud.waves.run("acme/bench", trigger="test")
        stored = [number for number in range(1, 4) if await run.klaud.store.wave("acme/bench", number) is not None]
        assert stored == [2, 3]


async def test_housekeeping_runs_every_six_hours(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        calls = []

        async def chore() -> list[str]:
            calls.append(run.sandbox.clock.now())
            return []

        run.klaud.scheduler.prune = chore
        run.klaud.reconciler.reconcile_new_installations = chore  # type: ignore[method-assign]
        await run.klaud.scheduler.tick()
        assert len(calls) == 1  # pruning at the first tick; discovery was done at start-up
        await run.act({"action": "advance_clock", "seconds": 6 * 3600 + 1})
        await run.klaud.scheduler.tick()
        await run.klaud.scheduler.tick()
        assert len(calls) == 3  # discovery and pruning, once
    # The real prune runs against the real store.
    async with sandbox_stack(tmp_path / "real", sc.scenario()) as run:
        assert set(await run.klaud.prune()) == {"deliveries", "attempts"}


async def test_a_wave_sets_the_repository_gauges(tmp_path):
    from prometheus_client import generate_latest

    from bot.metrics import REGISTRY

    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        wave = await run.klaud.waves.run("acme/bench", trigger="test")
        sample = REGISTRY.get_sample_value
        assert sample("klaud_dispatch_paused", {"repo": "acme/bench"}) == 0
        assert sample("klaud_last_wave_timestamp_seconds", {"repo": "acme/bench"}) == wave.at.timestamp()
        # The last wave's decisions, every kind present (0 when none), matching the wave.
        decided = {kind: sample("klaud_last_wave_candidates", {"repo": "acme/bench", "decision": kind})
                   for kind in get_args(DecisionKind)}
        assert decided == {kind: float(sum(d.decision == kind for d in wave.decisions)) for kind in decided}
        assert sum(decided.values()) == len(wave.decisions) and decided["selected"] == len(wave.selected) > 0
        # The head commit is a year old: so is every image (a histogram, by repository).
        assert sample("klaud_family_image_age_days_count", {"repo": "acme/bench"}) == len(sc.FAMILIES)
        assert sample("klaud_family_image_age_days_bucket", {"repo": "acme/bench", "le": "180.0"}) == 0
        assert sample("klaud_family_image_age_days_bucket", {"repo": "acme/bench", "le": "365.0"}) == len(sc.FAMILIES)
        assert 'klaud_family_image_age_days_bucket{le="+Inf",repo="acme/bench"}' in generate_latest(REGISTRY).decode()


async def test_plan_while_a_server_holds_the_sqlite_store_asks_that_server(tmp_path, capsys, monkeypatch):
    """The SQLite lock keeps `klaud plan` out of a served store: it asks the server's admin
    API for the same plan (DESIGN §3.1), with the token and the time asked for."""
    monkeypatch.setenv("KLAUD_ADMIN_TOKEN", "s3cret")
    async with sandbox_stack(tmp_path, sc.scenario(), env={"KLAUD_ADMIN_TOKEN": "s3cret"}) as run:
        host, port = run.admin_url.removeprefix("http://").rsplit(":", 1)
        for name, value in {"KLAUD_DB": f"sqlite:///{tmp_path / 'klaud.db'}", "KLAUD_ADMIN_HOST": host,
                            "KLAUD_ADMIN_PORT": port}.items():
            monkeypatch.setenv(name, value)
        expected = await run.klaud.plan_document("acme/bench")
        assert expected is not None
        assert await asyncio.to_thread(klaud_main, ["plan", "--json"]) == 0
        printed = json.loads(capsys.readouterr().out)
        assert printed["decisions"] == expected["decisions"] and printed["wave"] == expected["wave"]
        assert await asyncio.to_thread(klaud_main, ["plan", "--repo", "acme/bench", "--json", "--at", "2026-11-30T09:00:00Z"]) == 0
        assert json.loads(capsys.readouterr().out)["at"] == "2026-11-30T09:00:00Z"
        assert await asyncio.to_thread(klaud_main, ["plan", "--repo", "acme/bench"]) == 0
        table = capsys.readouterr().out
        assert all(d["family"].split(":")[1] in table for d in expected["decisions"])
        assert await asyncio.to_thread(klaud_main, ["plan", "--repo", "acme/none"]) == 2
        assert "acme/none has no local state on the running server" in capsys.readouterr().err
        monkeypatch.setenv("KLAUD_ADMIN_TOKEN", "wrong")
        assert await asyncio.to_thread(klaud_main, ["plan"]) == 1
        assert "admin API answered 401" in capsys.readouterr().err
    monkeypatch.setenv("KLAUD_ADMIN_TOKEN", "s3cret")
    assert await asyncio.to_thread(klaud_main, ["plan", "--json"]) == 0  # the server is gone: the store again
    assert json.loads(capsys.readouterr().out)["repo"] == "acme/bench"


async def test_plan_json_prints_one_wave_document_per_repository_and_line(tmp_path, capsys, monkeypatch):
    # Several pretty-printed documents one after the other were neither one JSON value nor lines.
    scenario = sc.scenario()
    scenario["repositories"].append({**copy.deepcopy(scenario["repositories"][0]), "full_name": "acme/other"})
    async with sandbox_stack(tmp_path, scenario) as run:
        host, port = run.admin_url.removeprefix("http://").rsplit(":", 1)
        for name, value in {"KLAUD_DB": f"sqlite:///{tmp_path / 'klaud.db'}", "KLAUD_ADMIN_HOST": host,
                            "KLAUD_ADMIN_PORT": port}.items():
            monkeypatch.setenv(name, value)
        assert await asyncio.to_thread(klaud_main, ["plan", "--json"]) == 0  # through the server
        served = [json.loads(line)["repo"] for line in capsys.readouterr().out.splitlines()]
    assert await asyncio.to_thread(klaud_main, ["plan", "--json"]) == 0  # from the store
    stored = [json.loads(line)["repo"] for line in capsys.readouterr().out.splitlines()]
    assert sorted(served) == sorted(stored) == ["acme/bench", "acme/other"]


async def test_plan_from_a_server_that_keeps_no_repository_says_so(tmp_path, capsys, monkeypatch):
    # What this catches: against a server still starting (or with nothing reconciled), the
    # admin API lists no repository and `klaud plan` printed nothing at all, exit 0.
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await run.klaud.live.forget("acme/bench")
        host, port = run.admin_url.removeprefix("http://").rsplit(":", 1)
        for name, value in {"KLAUD_DB": f"sqlite:///{tmp_path / 'klaud.db'}", "KLAUD_ADMIN_HOST": host,
                            "KLAUD_ADMIN_PORT": port}.items():
            monkeypatch.setenv(name, value)
        assert await asyncio.to_thread(klaud_main, ["plan"]) == 0
        printed = capsys.readouterr()
        assert printed.out == "" and "keeps no repository yet" in printed.err
