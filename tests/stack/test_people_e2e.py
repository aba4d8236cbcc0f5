"""/klaud commands and the Klaud Cold check run, end to end against the sandbox (issue 6)."""

from __future__ import annotations

import json
import re

import pytest

from bot.core.domain import Hold
from tests import scenarios as sc
from tests.builders import delivery
from tests.harness import sandbox_stack

NV = "configs/nvidia-master.yaml"
B200 = f"{NV}:dsr1-fp4-b200-sglang"
H200 = f"{NV}:dsr1-fp8-h200-trt"
GPTOSS = f"{NV}:gptoss-fp4-b200-vllm"
FAILING_JOBS = [{"name": "get-jobs", "conclusion": "failure", "steps": [{"name": "matrix", "conclusion": "failure"}]}]


def klaud_pr(number: int, family: str) -> dict:
    return {
        "number": number, "title": "[Klaud Cold] Update image / 更新镜像", "user": "Klaud-Cold",
        "head_ref": f"klaud/auto-{sc.candidate(family)}", "draft": True,
        "files": [{"filename": "perf-changelog.yaml", "status": "modified", "content": "- bump\n"}],
    }


def replies(run, number: int) -> list[str]:
    return [c["body"] for c in run.github()["comments"] if c["issue_number"] == number and c["user"] == "klaud-cold[bot]"]


def checks(run, head_sha: str | None = None) -> list[dict]:
    return [c for c in run.github()["check_runs"] if c["name"] == "Klaud Cold" and (head_sha is None or c["head_sha"] == head_sha)]


async def comment(run, number: int, user: str, body: str) -> dict:
    return await run.act({"action": "comment", "repo": "acme/bench", "number": number, "user": user, "body": body})


def outside_code(markdown: str) -> str:
    """The Markdown with its code spans removed: what GitHub renders as Markdown."""
    return re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", markdown)


@pytest.mark.parametrize(
    "user, verb, allowed",
    [("bob", "hold", True), ("alice", "hold", True), ("carol", "hold", False), ("mallory", "hold", False),
     ("carol", "retry", False), ("carol", "unhold", False), ("carol", "status", True), ("mallory", "help", True)],
)
async def test_permissions_per_verb(tmp_path, user, verb, allowed):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        await comment(run, 12, user, f"/klaud {verb} {H200}")
        [reply] = replies(run, 12)
        refused = "needs write, maintain or admin permission" in reply
        assert refused is not allowed, reply
        assert reply.startswith("<!-- klaud-command:")
        held = H200 in run.klaud.live.repo("acme/bench").holds
        assert held is (allowed and verb == "hold")


async def test_hold_then_a_wave_skips_the_family_until_unhold(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        answer = await comment(run, 12, "bob", f"/klaud hold {GPTOSS} waiting for new weights")
        [reply] = replies(run, 12)
        assert "bob" in reply and "waiting for new weights" in reply
        reactions = run.github()["reactions"]
        assert {(r["comment_id"], r["content"]) for r in reactions} == {(answer["comment_id"], "eyes")}
        wave = await run.klaud.waves.run("acme/bench", trigger="test")
        held = next(d for d in wave.decisions if d.family == GPTOSS)
        assert held.decision == "held" and "waiting for new weights" in held.reason
        await comment(run, 12, "alice", f"/klaud unhold {GPTOSS}")
        assert "Released" in replies(run, 12)[-1]
        assert GPTOSS not in run.klaud.live.repo("acme/bench").holds


async def test_target_defaults_to_the_family_of_a_klaud_pr(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[klaud_pr(50, H200), sc.image_bump(12)])) as run:
        await comment(run, 50, "alice", "/klaud hold waiting for weights")
        assert run.klaud.live.repo("acme/bench").holds[H200].reason == "waiting for weights"
        await comment(run, 12, "alice", "/klaud hold")
        assert "this is not a Klaud pull request" in replies(run, 12)[-1]


async def test_two_commands_one_reply_and_code_blocks_ignored(tmp_path):
    body = f"Thanks!\n/klaud status {B200}\n```\n/klaud hold {B200}\n```\n> /klaud hold {B200}\n\n/KLAUD help\n"
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        await comment(run, 12, "carol", body)
        [reply] = replies(run, 12)
        assert "dsr1-fp4-b200-sglang" in reply and "overlap" in reply
        assert reply.index("Status of") < reply.index("/klaud retry")
        assert run.klaud.live.repo("acme/bench").holds == {}
        await comment(run, 12, "carol", "no commands here, just `/klaud hold` in code")
        assert len(replies(run, 12)) == 1


async def test_redelivered_comment_is_answered_once(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        answer = await comment(run, 12, "bob", f"/klaud hold {H200} maintenance\n/klaud status {H200}")
        assert len(replies(run, 12)) == 1
        # GitHub redelivers the same event under a new delivery id.
        original = next(d for d in run.sandbox.deliveries if d.id == answer["deliveries"][0])
        body = json.dumps(original.payload).encode()
        await run.klaud.handle(delivery("redelivery-1", "issue_comment", body))
        assert len(replies(run, 12)) == 1


async def test_status_on_another_pr_answers_for_the_families_it_overlaps(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        await comment(run, 12, "carol", "/klaud status")
        [reply] = replies(run, 12)
        assert f"Status of `{B200}`" in reply and "PR #12 changes this family's image line" in reply


async def test_a_family_key_alone_works_and_a_typo_gets_suggestions(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        await comment(run, 12, "alice", "/klaud hold dsr1-fp8-h200-trt new weights")
        assert run.klaud.live.repo("acme/bench").holds[H200].reason == "new weights"
        await comment(run, 12, "carol", "/klaud status dsr1-fp8-h200-trtllm")
        reply = replies(run, 12)[-1]
        assert "did you mean `dsr1-fp8-h200-trt`" in reply and reply.rstrip().endswith("`?")  # no "?."


async def test_bot_comments_and_edits_are_ignored(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        await comment(run, 12, "Klaud-Cold", f"/klaud hold {H200}")
        assert replies(run, 12) == []
        assert run.klaud.live.repo("acme/bench").holds == {}
        payload = {"action": "edited", "comment": {"id": 5, "body": f"/klaud hold {H200}", "user": {"login": "bob"}},
                   "issue": {"number": 12}, "repository": {"full_name": "acme/bench"}, "installation": {"id": 1}}
        await run.klaud.handle(delivery("edit-1", "issue_comment", json.dumps(payload).encode()))
        assert run.klaud.live.repo("acme/bench").holds == {}


async def test_unknown_target_and_unknown_verb(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        await comment(run, 12, "bob", "/klaud retry configs/nvidia-master.yaml:nope\n/klaud frobnicate")
        [reply] = replies(run, 12)
        assert "unknown family" in reply
        assert "/klaud hold" in reply


async def test_retry_clears_the_cooldown_for_one_wave(tmp_path):
    cand = sc.candidate(H200)
    scenario = sc.scenario(runs=[sc.run(101, cand, "readiness-blocked")], pulls=[sc.image_bump(12)], policy="max_candidates_per_wave: 5\n")
    async with sandbox_stack(tmp_path, scenario) as run:
        before = await run.klaud.waves.preview("acme/bench")
        assert next(d for d in before.decisions if d.family == H200).decision == "cooldown"
        await comment(run, 12, "bob", f"/klaud retry {cand}")
        assert "Cleared the cooldown" in replies(run, 12)[-1]
        # A dry plan shows the effect without consuming the approval.
        preview = await run.klaud.waves.preview("acme/bench")
        assert next(d for d in preview.decisions if d.family == H200).decision == "selected"
        assert cand in run.klaud.live.repo("acme/bench").retries
        wave = await run.klaud.waves.run("acme/bench", trigger="test")
        assert cand in wave.selected
        assert cand not in run.klaud.live.repo("acme/bench").retries
        # Its next outcome arrives; the cooldown applies again (the approval was one-shot).
        dispatch = next(d for d in run.github()["dispatches"] if d["inputs"]["candidate"] == cand)
        await run.act({"action": "complete_run", "repo": "acme/bench", "run": {
            "id": dispatch["run_id"], "workflow": "klaud-candidate.yml", "conclusion": "success",
            "artifacts": [{"name": f"klaud-candidate-{cand}", "files": {"candidate-diagnostics.json": sc.diagnostics("failed")}}]}})
        after = await run.klaud.waves.run("acme/bench", trigger="test")
        assert next(d for d in after.decisions if d.family == H200).decision == "cooldown"


async def test_check_run_created_on_open_and_updated_when_an_outcome_arrives(tmp_path):
    cand = sc.candidate(H200)
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        answer = await run.act({"action": "open_pull", "repo": "acme/bench", "pull": klaud_pr(50, H200)})
        head = answer["head_sha"]
        [check] = checks(run, head)
        assert (check["status"], check["conclusion"]) == ("completed", "neutral")
        assert cand in check["output"]["summary"] and "/klaud retry" in check["output"]["summary"]
        await run.act({"action": "complete_run", "repo": "acme/bench", "run": sc.run(301, cand, "readiness-blocked")})
        [check] = checks(run, head)
        assert check["conclusion"] == "failure"
        assert "readiness-blocked" in check["output"]["summary"] and "301" in check["output"]["summary"]
        # A new head gets its own check run.
        pushed = await run.act({"action": "push_pull", "repo": "acme/bench", "number": 50,
                                "files": [{"filename": "perf-changelog.yaml", "status": "modified", "content": "- bump 2\n"}]})
        assert len(checks(run, pushed["head_sha"])) == 1


@pytest.mark.parametrize(
    "outcome, phase, extra, conclusion",
    [("validated", "final-sweep", {"pull_request": 50, "run_ids": [9]}, "success"),
     ("capacity-deferred", "targeted", {}, "neutral"),
     ("handoff", "cleanup", {"pull_request": 50}, "neutral"),
     ("incompatible", "targeted", {}, "failure"),
     ("unexpected-error", "unknown", {}, "failure")],
)
async def test_check_conclusion_follows_the_outcome(tmp_path, outcome, phase, extra, conclusion):
    cand = sc.candidate(H200)
    files = {"candidate-diagnostics.json": sc.diagnostics(outcome, phase, **extra)}
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[klaud_pr(50, H200)], runs=[sc.run(301, cand, None, files=files)])) as run:
        await run.klaud.checks.publish(("acme/bench", 50))
        [check] = checks(run)
        assert check["conclusion"] == conclusion


async def test_burst_of_changes_makes_one_patch(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[klaud_pr(50, H200)]), klaud_options={"check_delay_seconds": 0.3}) as run:
        await run.klaud.checks.publish(("acme/bench", 50))
        run.reset_requests()
        state = run.klaud.live.repo("acme/bench")
        for _ in range(10):
            await run.klaud.live.notify(state, {H200})
        await run.sandbox.act({"action": "comment", "repo": "acme/bench", "number": 50, "user": "bob", "body": f"/klaud hold {H200} burst"})
        await run.settle()
        patches = run.requests["by_route"].get("PATCH /repos/{owner}/{repo}/check-runs/{check_run_id}", 0)
        assert patches == 1
        [check] = checks(run)
        assert "burst" in check["output"]["summary"]


async def test_rerequested_rerenders_and_own_check_events_are_ignored(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[klaud_pr(50, H200)])) as run:
        await run.klaud.checks.publish(("acme/bench", 50))
        [check] = checks(run)
        run.reset_requests()
        for action in ("created", "completed"):
            payload = {"action": action, "check_run": {"id": check["id"], "name": "Klaud Cold", "head_sha": check["head_sha"]},
                       "repository": {"full_name": "acme/bench"}, "installation": {"id": 1}}
            await run.klaud.handle(delivery(action, "check_run", json.dumps(payload).encode()))
        assert run.requests["total"] == 0
        payload = {"action": "rerequested", "check_run": {"id": check["id"], "name": "Klaud Cold", "head_sha": check["head_sha"]},
                   "repository": {"full_name": "acme/bench"}, "installation": {"id": 1}}
        await run.klaud.handle(delivery("rr", "check_run", json.dumps(payload).encode()))
        assert run.requests["by_route"].get("PATCH /repos/{owner}/{repo}/check-runs/{check_run_id}") == 1


async def test_re_run_all_checks_rerenders_the_klaud_check_run(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[klaud_pr(50, H200)])) as run:
        await run.klaud.checks.publish(("acme/bench", 50))
        [check] = checks(run)
        run.reset_requests()
        await run.act({"action": "rerequest_suite", "repo": "acme/bench", "head_sha": check["head_sha"], "user": "bob"})
        assert run.requests["by_route"].get("PATCH /repos/{owner}/{repo}/check-runs/{check_run_id}") == 1


async def test_a_push_that_breaks_the_policy_rerenders_the_check_runs_at_once(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[klaud_pr(50, H200)])) as run:
        await run.klaud.checks.publish(("acme/bench", 50))
        await run.act({"action": "push_default", "repo": "acme/bench", "files": {".github/klaud.yml": "cooldown_hours: 0\n"}})
        [check] = checks(run)  # no other event, no forced publish
        assert "Invalid `.github/klaud.yml`" in check["output"]["summary"]


async def test_invalid_policy_is_reported_on_the_check_run(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[klaud_pr(50, H200)])) as run:
        await run.act({"action": "push_default", "repo": "acme/bench", "files": {".github/klaud.yml": "cooldown_hours: 0\n"}})
        await run.klaud.checks.publish(("acme/bench", 50), force=True)
        [check] = checks(run)
        assert "cooldown_hours" in check["output"]["summary"] and ".github/klaud.yml" in check["output"]["summary"]


async def test_a_wave_refreshes_a_check_run_whose_cooldown_ended(tmp_path):
    cand = sc.candidate(H200)
    scenario = sc.scenario(pulls=[klaud_pr(50, H200)], runs=[sc.run(301, cand, "readiness-blocked")])
    async with sandbox_stack(tmp_path, scenario) as run:
        await run.klaud.checks.publish(("acme/bench", 50))
        assert "cooling down until" in checks(run)[0]["output"]["summary"]
        await run.act({"action": "advance_clock", "seconds": 25 * 3600})
        await run.klaud.waves.run("acme/bench", trigger="test")
        await run.settle()
        [check] = checks(run)
        assert "cooling down until" not in check["output"]["summary"]
        assert check["conclusion"] == "failure"  # the latest outcome still decides the conclusion


async def test_the_hold_of_a_family_gone_from_the_configs_can_still_be_released(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        await comment(run, 77, "bob", f"/klaud hold {H200} waiting")
        gone = sc.NVIDIA.replace("dsr1-fp8-h200-trt:", "dsr1-fp8-h200-trt-v2:")
        await run.act({"action": "push_default", "repo": "acme/bench", "files": {"configs/nvidia-master.yaml": gone}})
        state = run.klaud.live.repo("acme/bench")
        assert H200 not in state.catalog and H200 in state.holds
        # The dashboard's box, then the command: both were refused, the hold stayed for good.
        await run.klaud.waves.run("acme/bench", trigger="test")
        await run.settle()
        [dash] = [i for i in run.github()["issues"] if i["title"] == "Klaud Cold dashboard"]
        ticked = dash["body"].replace(f"- [ ] unhold `{H200}`", f"- [x] unhold `{H200}`")
        await run.act({"action": "edit_issue", "repo": "acme/bench", "number": dash["number"], "user": "alice", "body": ticked})
        assert H200 not in state.holds
        await comment(run, 77, "bob", f"/klaud hold {H200} again")  # a family not in the configs: refused
        assert H200 not in state.holds
        state.holds[H200] = Hold(H200, "bob", "left behind", run.sandbox.clock.now())
        await comment(run, 77, "alice", f"/klaud unhold {H200}")
        assert H200 not in state.holds and "Released" in replies(run, 77)[-1]


async def test_one_klaud_check_run_per_head_after_its_creation_answer_was_lost(tmp_path):
    # Created on GitHub, its id never reached the store (a lost answer; a crash between the
    # POST and the commit is the same): the next render created a second one on the head.
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[klaud_pr(50, H200)])) as run:
        await run.settle()
        run.sandbox.set_faults({"rules": [{"method": "POST", "route": "/check-runs$", "lose_answer": True, "count": 1}]})
        await run.act({"action": "push_pull", "repo": "acme/bench", "number": 50,
                       "files": [{"filename": "perf-changelog.yaml", "status": "modified", "content": "- two\n"}]})
        run.sandbox.set_faults({"rules": []})
        head = run.klaud.live.repo("acme/bench").overlap.get(50).head_sha
        await run.act({"action": "comment", "repo": "acme/bench", "number": 50, "user": "alice",
                       "body": "/klaud hold waiting"})
        [check] = checks(run, head)
        assert "held" in check["output"]["title"]


async def test_a_retry_approved_on_a_klaud_pr_clears_the_cooldown_on_its_check_run(tmp_path):
    # What this catches: the check run ignored a retry approval and kept saying the candidate cools down.
    cand = sc.candidate(H200)
    scenario = sc.scenario(pulls=[klaud_pr(50, H200)], runs=[sc.run(301, cand, "readiness-blocked")])
    async with sandbox_stack(tmp_path, scenario) as run:
        await run.klaud.checks.publish(("acme/bench", 50))
        assert "cooling down until" in checks(run)[0]["output"]["summary"]
        await comment(run, 50, "bob", "/klaud retry")
        await run.settle()
        [check] = checks(run)
        assert "cooling down until" not in check["output"]["summary"], check["output"]["summary"]


async def test_a_rerequest_of_another_check_run_leaves_the_klaud_check_run_alone(tmp_path):
    # What this catches: a re-run asked for any check run of the head re-rendered (and rewrote) the Klaud Cold one.
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[klaud_pr(50, H200)])) as run:
        await run.klaud.checks.publish(("acme/bench", 50))
        [check] = checks(run)
        run.reset_requests()
        payload = {"action": "rerequested", "check_run": {"id": 4321, "name": "CI", "head_sha": check["head_sha"]},
                   "repository": {"full_name": "acme/bench"}, "installation": {"id": 1}}
        await run.klaud.handle(delivery("rr-other", "check_run", json.dumps(payload).encode()))
        assert run.requests["total"] == 0


async def paused_by_failed_runs(run) -> None:
    """A wave whose first three runs fail before any GPU work: dispatch pauses."""
    await run.klaud.waves.run("acme/bench", trigger="test")
    for dispatch in run.github()["dispatches"][:3]:
        await run.act({"action": "complete_run", "repo": "acme/bench",
                       "run": {"id": dispatch["run_id"], "conclusion": "failure", "jobs": FAILING_JOBS}})


async def test_resume_arms_one_canary_keeps_it_and_says_why_dispatch_was_paused(tmp_path):
    # What this catches: /klaud resume armed a canary without storing it or refreshing the check runs, forgot the pause reason, or armed a second canary while one ran.
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[klaud_pr(50, H200)])) as run:
        await paused_by_failed_runs(run)
        state = run.klaud.live.repo("acme/bench")
        assert state.blocked().code == "dispatch-paused"
        reason = state.meta.pause["reason"]
        await run.settle()
        assert "a canary is armed" not in checks(run)[0]["output"]["summary"]
        await comment(run, 77, "bob", "/klaud resume")
        reply = replies(run, 77)[-1]
        assert "Canary armed" in reply and f"({reason})" in reply, reply
        await run.settle()
        assert "a canary is armed" in checks(run)[0]["output"]["summary"]
        canary = await run.klaud.waves.run("acme/bench", trigger="test")
        assert len(canary.selected) == 1
        await comment(run, 77, "bob", "/klaud resume")
        assert "A canary is already running" in replies(run, 77)[-1]


async def test_a_marker_typed_by_a_person_does_not_count_as_an_answer(tmp_path):
    # What this catches: reply markers were counted in anyone's comments, so a person could stop the bot answering another comment.
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        first = await comment(run, 12, "carol", "just a remark")
        # The next comment ids, in the sandbox's order: this one, then bob's command.
        decoy = await comment(run, 12, "carol", f"quoting <!-- klaud-command:{first['comment_id'] + 2} -->")
        assert decoy["comment_id"] == first["comment_id"] + 1
        command = await comment(run, 12, "bob", f"/klaud hold {H200} maintenance")
        assert command["comment_id"] == first["comment_id"] + 2
        assert H200 in run.klaud.live.repo("acme/bench").holds
        [reply] = replies(run, 12)
        assert reply.startswith(f"<!-- klaud-command:{command['comment_id']} -->")


async def test_unhold_without_a_target_releases_the_family_of_the_klaud_pr(tmp_path):
    # What this catches: an unhold without a target bypassed the PR's default family and released nothing.
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[klaud_pr(50, H200)])) as run:
        await comment(run, 50, "alice", "/klaud hold waiting for weights")
        assert H200 in run.klaud.live.repo("acme/bench").holds
        await comment(run, 50, "alice", "/klaud unhold")
        assert H200 not in run.klaud.live.repo("acme/bench").holds
        assert "Released" in replies(run, 50)[-1]


async def test_status_shows_the_hold_the_overlapping_prs_and_an_approved_retry(tmp_path):
    # What this catches: status left out the family's hold, its overlapping PRs, or that a retry was approved.
    cand = sc.candidate(H200)
    scenario = sc.scenario(runs=[sc.run(101, cand, "readiness-blocked")], pulls=[sc.image_bump(12)])
    async with sandbox_stack(tmp_path, scenario) as run:
        await comment(run, 77, "carol", f"/klaud status {B200}")
        assert "| Overlapping PRs | #12 (" in replies(run, 77)[-1]
        await comment(run, 77, "carol", f"/klaud status {H200}")
        cooling = replies(run, 77)[-1]
        assert "cooling down until" in cooling, cooling
        await comment(run, 77, "bob", f"/klaud retry {cand}")
        await comment(run, 77, "carol", f"/klaud status {H200}")
        approved = replies(run, 77)[-1]
        assert "cooling down until" not in approved, approved
        await comment(run, 77, "bob", f"/klaud hold {H200} new weights soon")
        await comment(run, 77, "carol", f"/klaud status {H200}")
        held = replies(run, 77)[-1]
        assert "| Hold | by " in held and "new weights soon" in held, held


async def test_a_canary_armed_by_resume_is_stored_at_once(tmp_path):
    # What this catches: the armed canary stayed in memory only (lost on a restart) unless some other write stored it.
    async with sandbox_stack(tmp_path, sc.scenario(policy="dashboard: false\n")) as run:
        await paused_by_failed_runs(run)
        assert run.klaud.live.repo("acme/bench").blocked().code == "dispatch-paused"
        await comment(run, 77, "bob", "/klaud resume")
        assert "Canary armed" in replies(run, 77)[-1]
        stored = await run.klaud.live.store.get("", "repo", "acme/bench")
        assert stored["canary"]["armed"] is True, stored.get("canary")


async def test_status_shows_a_hold_reason_only_inside_code_spans(tmp_path):
    # What this catches (review H): the "Next wave" row showed the held decision's reason,
    # which carries the hold's free text, as Markdown: it @-mentioned people, showed images
    # and could hide the rest of the reply behind `<!--` (README: replies mention nobody).
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        await comment(run, 12, "bob", f"/klaud hold {H200} ping @carol ![x](https://evil.example/t.png) <!--")
        await comment(run, 12, "carol", f"/klaud status {H200}")
        reply = replies(run, 12)[-1]
        assert "**held**, `held by bob since " in reply, reply
        marker, answer = reply.split("\n", 1)  # the reply's own marker is the first line
        assert marker.startswith("<!-- klaud-command:")
        rendered = outside_code(answer)
        for hostile in ("@carol", "![x](https://evil.example", "<!--"):
            assert hostile not in rendered, reply


async def test_resume_while_the_policy_turns_dispatch_off_and_a_pause_stands_says_both(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[klaud_pr(50, H200)])) as run:
        await paused_by_failed_runs(run)
        state = run.klaud.live.repo("acme/bench")
        assert state.meta.pause is not None
        state.set_policy_text("enabled: false\n")
        await comment(run, 77, "bob", "/klaud resume")
        reply = replies(run, 77)[-1]
        assert "Not resumed" in reply and "paused after failed runs" in reply
        assert "not paused after failed runs" not in reply


async def test_resume_while_the_policy_turns_dispatch_off_says_so(tmp_path):
    # What this catches (review H): with `enabled: false`, /plan, /klaud status and the
    # status page say dispatch is paused, and /klaud resume answered that it was not paused.
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)], policy="enabled: false\n")) as run:
        plan = await run.klaud.waves.preview("acme/bench")
        assert plan.blocked is not None and plan.blocked.code == "dispatch-paused"
        await comment(run, 12, "alice", "/klaud resume")
        reply = replies(run, 12)[-1]
        assert "Not resumed: dispatch is off by the policy" in reply and plan.blocked.reason in reply, reply
        assert "`enabled` in `.github/klaud.yml`" in reply, reply
        assert not run.klaud.live.repo("acme/bench").canary_armed


async def test_a_check_run_shows_the_block_the_plan_and_state_document_give_for_enabled_false(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[klaud_pr(50, H200)])) as run:
        await run.act({"action": "push_default", "repo": "acme/bench", "files": {".github/klaud.yml": "enabled: false\n"}})
        await run.settle()
        plan = await run.klaud.waves.preview("acme/bench")
        assert plan.blocked is not None and plan.blocked.code == "dispatch-paused"
        assert run.state()["blocked"]["code"] == "dispatch-paused"
        [check] = checks(run)
        # DESIGN §4: the pause shows on /plan, the state document, every Klaud check run ...
        assert "dispatch paused" in check["output"]["title"], check["output"]["title"]


async def test_enabled_false_rerenders_nothing_when_nothing_changed(tmp_path):
    # DESIGN/checkruns: "one its check run already shows costs nothing: the render's digest is
    # stored with it"; dashboard: "rendered again (unchanged, nothing is sent)".
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[klaud_pr(50, H200)])) as run:
        await run.act({"action": "push_default", "repo": "acme/bench", "files": {".github/klaud.yml": "enabled: false\n"}})
        await run.settle()
        [check] = checks(run)
        assert "dispatch paused" in check["output"]["title"]
        state = run.klaud.live.repo("acme/bench")
        run.reset_requests()
        run.sandbox.clock.advance(600)  # ten minutes on, nothing changed
        run.klaud.checks.repository_taken(state)
        run.klaud.dashboard.repository_taken(state)
        await run.settle()
        writes = [r for r in run.requests.get("requests", []) if r.get("method") not in ("GET", "HEAD")]
        assert writes == [], writes


async def test_a_reply_clipped_at_the_comment_limit_leaves_no_typed_text_outside_a_code_span(tmp_path):
    # Anyone may write `/klaud status`, and a target is any word shaped like a family id,
    # however long. Echoed twice, a 40,000-character one passed GitHub's comment limit, and
    # the cut fell inside the second code span: its backtick unclosed, the rest of the text
    # was Markdown again, and the bot's reply mentioned a team (README: replies mention nobody).
    target = ",@acme/admins," + "a" * 40_000 + ".yaml:x"
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        await comment(run, 12, "mallory", f"/klaud status {target}")
        [reply] = replies(run, 12)
        assert len(reply.encode("utf-8")) <= 65_536
        assert "@acme/admins" not in outside_code(reply), reply[-200:]



async def test_a_klaud_pr_check_run_keeps_its_outcome_once_the_attempt_leaves_memory(tmp_path):
    # Attempts older than ATTEMPT_MEMORY (14 days) leave memory (the store keeps them). A
    # Klaud PR open longer than that, re-rendered for any reason (a hold, an overlapping PR,
    # a pause), turned from `failure` to `neutral` "Waiting for a wave" with "No attempts
    # yet." – though its candidate ran, and no wave will try it while the PR claims the family.
    from bot.core.cooldown import ATTEMPT_MEMORY

    cand = sc.candidate(H200)
    scenario = sc.scenario(pulls=[klaud_pr(50, H200)], runs=[sc.run(301, cand, "readiness-blocked")])
    async with sandbox_stack(tmp_path, scenario) as run:
        await run.klaud.checks.publish(("acme/bench", 50))
        assert checks(run)[0]["conclusion"] == "failure"
        await run.act({"action": "advance_clock", "seconds": 15 * 24 * 3600})
        state = run.klaud.live.repo("acme/bench")
        state.forget_attempts_before(run.klaud.clock.now() - ATTEMPT_MEMORY)  # the scheduler's housekeeping
        await comment(run, 50, "bob", f"/klaud hold {H200} new weights")
        [check] = checks(run)
        assert "new weights" in check["output"]["summary"]  # re-rendered
        assert check["conclusion"] == "failure", check["output"]["title"]
        assert "readiness-blocked" in check["output"]["summary"] and "No attempts yet." not in check["output"]["summary"]
