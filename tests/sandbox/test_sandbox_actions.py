"""Control actions: state changes, answers, and the signed webhooks they deliver."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import gidgethub
import pytest
from gidgethub import sansio

from bot.sandbox import Sandbox, SandboxError, ScenarioError, load_scenario
from tests.sandbox.test_sandbox_support import (
    BUMPED,
    DIAGNOSTICS,
    MASTER,
    Hub,
    Receiver,
    events,
    serve,
    small_scenario,
)

REPO = "/repos/acme/bench"


async def test_webhook_is_signed_and_carries_githubs_headers(
    wired: Hub, receiver: Receiver
) -> None:
    answer = await wired.act(action="comment", repo="acme/bench", number=12, user="alice",
                             body="/klaud status")
    assert answer["statuses"] == [202]
    headers, body = receiver.received[0]
    assert answer["deliveries"] == [headers["X-GitHub-Delivery"]]
    expected = hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert headers["X-Hub-Signature-256"] == f"sha256={expected}"
    assert headers["X-Hub-Signature"] == "sha1=" + hmac.new(b"s3cret", body, hashlib.sha1).hexdigest()
    assert headers["User-Agent"] == "GitHub-Hookshot/sandbox"
    assert headers["X-GitHub-Hook-Installation-Target-Type"] == "integration"
    assert headers["X-GitHub-Hook-Installation-Target-ID"] == "1"
    assert headers["X-GitHub-Hook-ID"].isdigit()
    assert headers["Content-Type"] == "application/json"
    # gidgethub, which the bot uses, accepts it with the secret and refuses it without.
    lowered = {name.lower(): value for name, value in headers.items()}
    event = sansio.Event.from_http(lowered, body, secret="s3cret")
    assert event.event == "issue_comment" and event.data["action"] == "created"
    with pytest.raises(gidgethub.ValidationFailure):
        sansio.Event.from_http(lowered, body, secret="wrong")


async def test_delivery_ids_are_fresh_and_statuses_are_the_receivers(
    wired: Hub, receiver: Receiver
) -> None:
    receiver.status = 500
    first = await wired.act(action="dispatch", repo="acme/bench", event_type="klaud-plan")
    second = await wired.act(action="dispatch", repo="acme/bench", event_type="klaud-plan")
    assert first["statuses"] == [500] and second["statuses"] == [500]
    assert first["deliveries"] != second["deliveries"]


async def test_unreachable_receiver_gives_a_null_status(hub: Hub) -> None:
    hub.sandbox.deliver_to = "http://127.0.0.1:9/webhook"
    answer = await hub.act(action="dispatch", repo="acme/bench", event_type="x")
    assert answer["statuses"] == [None] and len(answer["deliveries"]) == 1
    assert hub.sandbox.deliveries[-1].error is not None


async def test_without_a_target_actions_change_state_and_answer_empty(hub: Hub) -> None:
    answer = await hub.act(action="comment", repo="acme/bench", number=12, user="bob", body="hi")
    assert answer["deliveries"] == [] and answer["statuses"] == []
    assert hub.state()["comments"][0]["body"] == "hi"


async def test_open_pull(wired: Hub, receiver: Receiver) -> None:
    answer = await wired.act(action="open_pull", repo="acme/bench", pull={
        "title": "Tune GPT-OSS", "user": "carol", "head_ref": "tune", "draft": True,
        "files": [{"filename": "configs/nvidia-master.yaml",
                   "content": MASTER.replace("conc-end: 128", "conc-end: 256")}]})
    assert answer["number"] == 13  # after #12
    pull = next(p for p in wired.state()["pulls"] if p["number"] == 13)
    assert pull["head_sha"] == answer["head_sha"] and pull["draft"] is True
    assert wired.state()["refs"]["refs/heads/tune"] == answer["head_sha"]
    [(name, payload)] = events(receiver)
    assert name == "pull_request" and payload["action"] == "opened"
    assert payload["number"] == 13
    assert payload["pull_request"]["head"]["sha"] == answer["head_sha"]
    assert payload["pull_request"]["created_at"] == "2026-11-30T08:00:00Z"
    assert payload["sender"]["login"] == "carol"
    assert payload["installation"] == {"id": 1, "node_id": payload["installation"]["node_id"]}
    assert payload["repository"]["full_name"] == "acme/bench"
    files = await wired.json("GET", f"{REPO}/pulls/13/files")
    assert "+      - { tp: 8, conc-start: 4, conc-end: 256 }" in files[0]["patch"]


async def test_push_pull_replaces_the_changes(wired: Hub, receiver: Receiver) -> None:
    before = wired.state()["pulls"][0]["head_sha"]
    answer = await wired.act(action="push_pull", repo="acme/bench", number=12, head_sha="a" * 40,
                             files=[{"filename": "README.md", "status": "added",
                                     "content": "# bench\n"}])
    assert answer["head_sha"] == "a" * 40
    [(name, payload)] = events(receiver)
    assert (name, payload["action"]) == ("pull_request", "synchronize")
    assert (payload["before"], payload["after"]) == (before, "a" * 40)
    files = await wired.json("GET", f"{REPO}/pulls/12/files")
    assert [(f["filename"], f["status"]) for f in files] == [("README.md", "added")]
    assert files[0]["patch"] == "@@ -0,0 +1 @@\n+# bench\n"
    commits = await wired.json("GET", f"{REPO}/compare/{before}...{'a' * 40}")
    assert commits["status"] == "ahead" and commits["ahead_by"] == 1


async def test_edit_pull_sends_one_event_per_change(wired: Hub, receiver: Receiver) -> None:
    await wired.act(action="edit_pull", repo="acme/bench", number=12, title="Bump SGLang again",
                    draft=True, labels=["klaud-handoff"])
    sent = [(name, p["action"], p.get("label", {}).get("name")) for name, p in events(receiver)]
    assert sent == [("pull_request", "edited", None),
                    ("pull_request", "converted_to_draft", None),
                    ("pull_request", "unlabeled", "perf"),
                    ("pull_request", "labeled", "klaud-handoff")]
    assert events(receiver)[0][1]["changes"] == {"title": {"from": "Bump SGLang"}}
    pull = wired.state()["pulls"][0]
    assert pull["title"] == "Bump SGLang again" and pull["draft"] is True
    assert pull["labels"] == ["klaud-handoff"]
    assert pull["updated_at"] == "2026-11-30T08:00:00Z"
    receiver.received.clear()
    await wired.act(action="edit_pull", repo="acme/bench", number=12, draft=False)
    assert [p["action"] for _, p in events(receiver)] == ["ready_for_review"]


async def test_close_without_merge(wired: Hub, receiver: Receiver) -> None:
    head = wired.state()["head_sha"]
    answer = await wired.act(action="close_pull", repo="acme/bench", number=12, merged=False)
    assert answer["merged"] is False
    [(name, payload)] = events(receiver)
    assert name == "pull_request" and payload["action"] == "closed"
    assert payload["pull_request"]["merged"] is False
    assert payload["pull_request"]["state"] == "closed"
    assert wired.state()["head_sha"] == head
    assert await wired.json("GET", f"{REPO}/pulls") == []


async def test_merge_applies_the_files_and_pushes(wired: Hub, receiver: Receiver) -> None:
    before = wired.state()["head_sha"]
    answer = await wired.act(action="close_pull", repo="acme/bench", number=12, merged=True,
                             user="alice")
    after = wired.state()["head_sha"]
    assert answer["merge_commit_sha"] == after != before
    (closed, pr), (pushed, push) = events(receiver)
    assert closed == "pull_request" and pr["pull_request"]["merged"] is True
    assert pr["pull_request"]["merged_by"]["login"] == "alice"
    assert pr["pull_request"]["merge_commit_sha"] == after
    assert pushed == "push"
    assert (push["ref"], push["before"], push["after"]) == ("refs/heads/main", before, after)
    assert push["head_commit"]["id"] == after
    assert push["head_commit"]["modified"] == ["configs/nvidia-master.yaml"]
    assert push["compare"].endswith(f"{before[:12]}...{after[:12]}")
    assert isinstance(push["repository"]["pushed_at"], int)  # push payloads use epoch seconds
    raw = await wired.api("GET", f"{REPO}/contents/configs/nvidia-master.yaml",
                          headers={"Accept": "application/vnd.github.raw"})
    assert await raw.text() == BUMPED
    compared = await wired.json("GET", f"{REPO}/compare/{before}...main")
    assert [f["filename"] for f in compared["files"]] == ["configs/nvidia-master.yaml"]


async def test_comment_on_a_number_without_a_pull_makes_an_issue(
    wired: Hub, receiver: Receiver
) -> None:
    answer = await wired.act(action="comment", repo="acme/bench", number=40, user="bob",
                             body="/klaud help")
    [(name, payload)] = events(receiver)
    assert name == "issue_comment" and payload["comment"]["id"] == answer["comment_id"]
    assert payload["comment"]["user"]["login"] == "bob"
    assert payload["issue"]["number"] == 40 and "pull_request" not in payload["issue"]
    assert payload["comment"]["author_association"] == "MEMBER"
    receiver.received.clear()
    await wired.act(action="comment", repo="acme/bench", number=12, user="carol", body="hi")
    [(_, on_pull)] = events(receiver)
    assert on_pull["issue"]["pull_request"]["url"].endswith("/pulls/12")
    assert on_pull["comment"]["author_association"] == "COLLABORATOR"


async def test_complete_run_new_and_dispatched(wired: Hub, receiver: Receiver) -> None:
    answer = await wired.act(action="complete_run", repo="acme/bench", run={
        "workflow": "klaud-plan.yml", "event": "schedule", "artifacts": [
            {"name": "klaud-candidate-new", "files": {"candidate-diagnostics.json": DIAGNOSTICS}}]})
    [(name, payload)] = events(receiver)
    assert (name, payload["action"]) == ("workflow_run", "completed")
    run = payload["workflow_run"]
    assert run["id"] == answer["run_id"] and run["status"] == "completed"
    assert run["conclusion"] == "success" and run["path"] == ".github/workflows/klaud-plan.yml"
    assert payload["workflow"]["path"] == ".github/workflows/klaud-plan.yml"
    listed = await wired.json("GET", f"{REPO}/actions/runs/{answer['run_id']}/artifacts")
    assert [a["name"] for a in listed["artifacts"]] == ["klaud-candidate-new"]

    await wired.api("POST", f"{REPO}/actions/workflows/klaud-candidate.yml/dispatches", json={
        "ref": "main", "inputs": {"candidate": "c", "family": "f", "base": "b"}})
    await wired.sandbox.drain()
    dispatched = wired.state()["dispatches"][0]["run_id"]
    receiver.received.clear()
    done = await wired.act(action="complete_run", repo="acme/bench", run={
        "id": dispatched, "workflow": "klaud-candidate.yml", "conclusion": "failure"})
    assert done["run_id"] == dispatched
    run = await wired.json("GET", f"{REPO}/actions/runs/{dispatched}")
    assert (run["status"], run["conclusion"], run["event"]) == (
        "completed", "failure", "workflow_dispatch")
    again = await wired.client.post("/_sandbox/act", json={
        "action": "complete_run", "repo": "acme/bench",
        "run": {"id": dispatched, "workflow": "klaud-candidate.yml"}})
    assert again.status == 409
    rerun = await wired.act(action="complete_run", repo="acme/bench", run={
        "id": dispatched, "workflow": "klaud-candidate.yml", "run_attempt": 2})
    assert rerun["run_id"] == dispatched
    assert (await wired.json("GET", f"{REPO}/actions/runs/{dispatched}"))["run_attempt"] == 2


async def test_a_rerun_starts_anew_and_lists_its_own_jobs(wired: Hub, receiver: Receiver) -> None:
    # GitHub: `run_started_at` "resets on re-run", and the jobs listed are the latest
    # attempt's. Klaud tells a re-run's artifacts from attempt 1's by that start.
    await wired.api("POST", f"{REPO}/actions/workflows/klaud-candidate.yml/dispatches", json={
        "ref": "main", "inputs": {"candidate": "c", "family": "f", "base": "b"}})
    await wired.sandbox.drain()
    run_id = wired.state()["dispatches"][0]["run_id"]
    wired.sandbox.clock.advance(1800)
    await wired.act(action="complete_run", repo="acme/bench", run={
        "id": run_id, "workflow": "klaud-candidate.yml", "conclusion": "success",
        "jobs": [{"name": "Klaud Cold", "steps": [{"name": "Run the candidate session"}]}],
        "artifacts": [{"name": "klaud-candidate-c", "files": {"candidate-diagnostics.json": DIAGNOSTICS}}]})
    first = await wired.json("GET", f"{REPO}/actions/runs/{run_id}")
    [artifact] = (await wired.json("GET", f"{REPO}/actions/runs/{run_id}/artifacts"))["artifacts"]
    wired.sandbox.clock.advance(20 * 3600)  # a person re-runs it; attempt 2 uploads nothing
    receiver.received.clear()
    await wired.act(action="complete_run", repo="acme/bench", run={
        "id": run_id, "workflow": "klaud-candidate.yml", "run_attempt": 2, "conclusion": "failure"})
    rerun = await wired.json("GET", f"{REPO}/actions/runs/{run_id}")
    [(_, payload)] = [(n, p) for n, p in events(receiver) if n == "workflow_run"]
    for shown in (rerun, payload["workflow_run"]):
        assert shown["run_attempt"] == 2
        assert shown["run_started_at"] > first["updated_at"] >= artifact["created_at"], shown["run_started_at"]
    [job] = (await wired.json("GET", f"{REPO}/actions/runs/{run_id}/jobs"))["jobs"]
    assert (job["name"], job["conclusion"], job["started_at"]) == ("Klaud Cold", "failure", rerun["run_started_at"])
    assert [(s["name"], s["conclusion"]) for s in job["steps"]] == [("Run the candidate session", "failure")]


async def test_push_default_adds_changes_and_deletes(wired: Hub, receiver: Receiver) -> None:
    before = wired.state()["head_sha"]
    answer = await wired.act(action="push_default", repo="acme/bench", user="bob",
                             files={"configs/runners.yaml": None, "docs/a.md": "a\n",
                                    "configs/nvidia-master.yaml": BUMPED})
    assert answer["before"] == before and answer["sha"] == wired.state()["head_sha"]
    [(name, push)] = events(receiver)
    assert name == "push" and push["pusher"]["name"] == "bob"
    commit = push["commits"][0]
    assert (commit["added"], commit["removed"], commit["modified"]) == (
        ["docs/a.md"], ["configs/runners.yaml"], ["configs/nvidia-master.yaml"])
    assert commit["timestamp"] == "2026-11-30T08:00:00Z"
    missing = await wired.api("GET", f"{REPO}/contents/configs/runners.yaml")
    assert missing.status == 404
    old = await wired.api("GET", f"{REPO}/contents/configs/runners.yaml", params={"ref": before})
    assert old.status == 200


async def test_push_default_onto_an_earlier_commit_is_a_force_push(wired: Hub, receiver: Receiver) -> None:
    start = wired.state()["head_sha"]
    bumped = await wired.act(action="push_default", repo="acme/bench", files={"configs/nvidia-master.yaml": BUMPED})
    forced = await wired.act(action="push_default", repo="acme/bench", onto=start, files={"docs/a.md": "a\n"})
    [(_, first), (_, second)] = events(receiver)
    assert first["forced"] is False
    assert second["forced"] is True and (second["before"], second["after"]) == (bumped["sha"], forced["sha"])
    compare = await wired.json("GET", f"{REPO}/compare/{bumped['sha']}...{forced['sha']}")
    assert compare["status"] == "diverged"
    assert [f["filename"] for f in compare["files"]] == ["docs/a.md"]  # from the merge base: the bump is unsaid
    unknown = await wired.client.post("/_sandbox/act", json={
        "action": "push_default", "repo": "acme/bench", "onto": "0" * 40, "files": {"a.md": "a\n"}})
    assert unknown.status == 404 and "has no commit" in await unknown.text()


async def test_repository_dispatch(wired: Hub, receiver: Receiver) -> None:
    await wired.act(action="dispatch", repo="acme/bench", event_type="klaud-plan",
                    client_payload={"reason": "manual"})
    [(name, payload)] = events(receiver)
    assert name == "repository_dispatch"
    assert payload["action"] == "klaud-plan" and payload["branch"] == "main"
    assert payload["client_payload"] == {"reason": "manual"}
    assert payload["sender"]["login"] == "alice"


async def test_set_capacity_and_advance_clock(hub: Hub) -> None:
    feed = await (await hub.client.get("/_sandbox/capacity")).json()
    assert feed["kind"] == "inferencex.status.clusters"
    assert feed["generatedAt"] == "2026-11-30T08:00:00Z"
    assert feed["data"]["available"] is True
    first = feed["data"]["clusters"][0]
    assert first["id"] == "b200-nb" and first["stale"] is False
    assert first["observedAt"] == first["receivedAt"] == feed["generatedAt"]
    assert first["summary"] == {"totalNodes": 8, "allocatedNodes": 2, "mixedNodes": 0,
                                "idleNodes": 6, "downNodes": 0, "otherNodes": 0}
    assert feed["data"]["clusters"][1]["stale"] is True
    moved = await hub.act(action="advance_clock", seconds=7200)
    assert moved == {"deliveries": [], "statuses": [], "now": "2026-11-30T10:00:00Z"}
    await hub.act(action="set_capacity", capacity={"available": False, "clusters": [
        {"id": "x", "total": 1, "idle": 1, "status": "maintenance"}]})
    feed = await (await hub.client.get("/_sandbox/capacity")).json()
    assert feed["generatedAt"] == "2026-11-30T10:00:00Z"
    assert feed["data"]["available"] is False
    assert [c["status"] for c in feed["data"]["clusters"]] == ["maintenance"]
    assert hub.sandbox.state_document()["now"] == "2026-11-30T10:00:00Z"


async def test_bad_actions_answer_400_404_409(hub: Hub) -> None:
    unknown = await hub.client.post("/_sandbox/act", json={"action": "explode"})
    assert unknown.status == 400
    assert (await unknown.json())["error"] == "invalid-action"
    missing = await hub.client.post("/_sandbox/act", json={"action": "comment", "repo": "acme/bench"})
    assert missing.status == 400 and "number" in (await missing.json())["detail"]
    no_repo = await hub.client.post("/_sandbox/act", json={
        "action": "dispatch", "repo": "acme/none", "event_type": "x"})
    assert no_repo.status == 404
    no_pull = await hub.client.post("/_sandbox/act", json={
        "action": "close_pull", "repo": "acme/bench", "number": 99})
    assert no_pull.status == 404
    await hub.act(action="close_pull", repo="acme/bench", number=12)
    twice = await hub.client.post("/_sandbox/act", json={
        "action": "close_pull", "repo": "acme/bench", "number": 12})
    assert twice.status == 409
    with pytest.raises(ScenarioError):
        await hub.sandbox.act({"action": "advance_clock", "seconds": -1})
    with pytest.raises(SandboxError):
        await hub.sandbox.act({"action": "push_pull", "repo": "acme/bench", "number": 12,
                               "files": []})


async def test_bot_writes_are_announced_in_the_background(wired: Hub, receiver: Receiver) -> None:
    made = await wired.api("POST", f"{REPO}/issues/12/comments", json={"body": "Klaud here"})
    assert made.status == 201
    head = wired.state()["pulls"][0]["head_sha"]
    await wired.api("POST", f"{REPO}/check-runs", json={"name": "Klaud Cold", "head_sha": head})
    await wired.sandbox.drain()
    sent = [(name, p["action"]) for name, p in events(receiver)]
    assert sent == [("issue_comment", "created"), ("check_run", "created")]
    comment = events(receiver)[0][1]["comment"]
    assert comment["user"] == {**comment["user"], "login": "klaud-cold[bot]", "type": "Bot"}
    assert all(d.background for d in wired.sandbox.deliveries)
    summary = await (await wired.client.get("/_sandbox/deliveries")).json()
    assert [d["status"] for d in summary] == [202, 202]


async def test_timeline_of_the_bundled_scenario_plays(receiver: Receiver) -> None:
    sandbox = Sandbox(load_scenario(None), deliver_to=receiver.url)
    async for hub in serve(sandbox):
        answers = await sandbox.run_timeline()
        assert [a["statuses"] for a in answers] == [[202], [202], [202]]
        state = hub.state()
        assert any(p["number"] == 4107 for p in state["pulls"])
        assert state["comments"][-1]["body"].startswith("/klaud hold ")
        assert any(r["id"] == 28123456704 and r["status"] == "completed" for r in state["runs"])
        assert [name for name, _ in events(receiver)] == [
            "pull_request", "issue_comment", "workflow_run"]


async def test_state_document_shape(hub: Hub) -> None:
    document = await (await hub.client.get("/_sandbox/state")).json()
    assert document["now"] == "2026-11-30T08:00:00Z"
    repo = document["repositories"]["acme/bench"]
    assert set(repo) >= {"head_sha", "refs", "pulls", "runs", "check_runs", "comments",
                         "reactions", "dispatches"}
    assert repo["refs"]["refs/heads/main"] == repo["head_sha"]
    assert [r["id"] for r in repo["runs"]] == [101, 102]
    assert repo["runs"][0]["artifacts"][1] == {
        "id": repo["runs"][0]["artifacts"][1]["id"], "name": "klaud-candidate-old", "expired": True}


def test_sandbox_validates_the_scenario_it_is_given() -> None:
    broken = small_scenario()
    broken["repositories"][0]["pulls"][0]["files"][0]["status"] = "exploded"
    with pytest.raises(ScenarioError, match=r"repositories\.0\.pulls\.0\.files\.0\.status"):
        Sandbox(broken)
    twice = small_scenario()
    twice["repositories"].append(twice["repositories"][0])
    with pytest.raises(SandboxError, match="twice"):
        Sandbox(twice)


async def test_refs_written_through_the_api_send_their_push_as_github_does(wired: Hub, receiver: Receiver) -> None:
    head = wired.state()["head_sha"]
    ref = "refs/heads/klaud/claim-0123456789abcdef"
    await wired.json("POST", f"{REPO}/git/refs", status=201, json={"ref": ref, "sha": head})
    assert (await wired.api("DELETE", f"{REPO}/git/{ref}")).status == 204
    await wired.sandbox.drain()
    made, gone = [payload for name, payload in events(receiver) if name == "push"]
    assert (made["ref"], made["before"], made["after"], made["created"], made["deleted"]) == (ref, "0" * 40, head, True, False)
    assert (gone["ref"], gone["before"], gone["after"], gone["created"], gone["deleted"]) == (ref, head, "0" * 40, False, True)
    assert made["sender"]["login"] == "klaud-cold[bot]" and made["commits"] == []


async def test_rename_repository_redirects_the_old_name_and_sends_repository_renamed(
    wired: Hub, receiver: Receiver
) -> None:
    answer = await wired.act(action="rename_repository", repo="acme/bench", name="bench-next")
    assert answer["full_name"] == "acme/bench-next"
    [(name, payload)] = events(receiver)
    assert (name, payload["action"]) == ("repository", "renamed")
    assert payload["changes"] == {"repository": {"name": {"from": "bench"}}}
    assert payload["repository"]["full_name"] == "acme/bench-next"

    # Authentication comes first, as on GitHub: no credentials, no new name.
    anonymous = await wired.client.get(f"/_sandbox/github{REPO}", allow_redirects=False)
    assert anonymous.status == 401 and "Location" not in anonymous.headers
    repository = await wired.json("GET", "/repos/acme/bench-next")
    # GitHub's Location names the repository by id, not by its new name.
    read = await wired.api("GET", f"{REPO}/pulls?state=open")
    assert read.status == 301
    by_id = f"/_sandbox/github/repositories/{repository['id']}"
    assert read.headers["Location"].endswith(f"{by_id}/pulls?state=open")
    pulls = await wired.client.get(f"{by_id}/pulls?state=open", headers={"Authorization": wired.token})
    assert pulls.status == 200 and [p["number"] for p in await pulls.json()] == [12]
    write = await wired.api("POST", f"{REPO}/issues/12/comments", json={"body": "hi"})
    assert write.status == 307  # a write is redirected with its method and body kept
    assert write.headers["Location"].endswith(f"{by_id}/issues/12/comments")
    await wired.json("GET", "/repositories/999999/pulls", status=404)
    assert repository["full_name"] == "acme/bench-next"
    # The id stays: GitHub finds a repository by it whatever it is called now.
    assert (await wired.json("GET", f"/repositories/{repository['id']}"))["full_name"] == "acme/bench-next"
    await wired.json("GET", "/repositories/1", status=404)
    # Followed, as GitHub's clients do: the old name still works.
    followed = await wired.client.get("/_sandbox/github/repos/acme/bench", headers={"Authorization": wired.token})
    assert followed.status == 200 and (await followed.json())["full_name"] == "acme/bench-next"


async def test_rename_repository_refuses_an_unknown_repository_and_a_name_with_a_slash(hub: Hub) -> None:
    response = await hub.client.post("/_sandbox/act", json={"action": "rename_repository", "repo": "acme/nope",
                                                            "name": "x"})
    assert response.status == 404
    response = await hub.client.post("/_sandbox/act", json={"action": "rename_repository", "repo": "acme/bench",
                                                            "name": "bad/name"})
    assert response.status == 400


async def test_delete_repository_answers_404_and_sends_repository_deleted_and_repositories_removed(
    wired: Hub, receiver: Receiver
) -> None:
    repository = await wired.json("GET", "/repos/acme/bench")
    await wired.act(action="delete_repository", repo="acme/bench", user="alice")
    [(first, deleted), (second, removed)] = events(receiver)
    assert (first, deleted["action"], deleted["repository"]["id"]) == ("repository", "deleted", repository["id"])
    assert deleted["installation"]["id"] == removed["installation"]["id"] and deleted["sender"]["login"] == "alice"
    assert (second, removed["action"]) == ("installation_repositories", "removed")
    assert [r["full_name"] for r in removed["repositories_removed"]] == ["acme/bench"]
    await wired.json("GET", "/repos/acme/bench", status=404)
    await wired.json("GET", f"/repositories/{repository['id']}", status=404)
    assert (await wired.json("GET", "/installation/repositories"))["repositories"] == []


async def test_pushed_at_is_the_last_push_to_any_branch(wired: Hub) -> None:
    # GitHub's `pushed_at` moves with a push to any branch, which the canary rule reads
    # (catalog_sync.pushed_since_pause); the sandbox gave the default branch's head time.
    before = (await wired.json("GET", "/repos/acme/bench"))["pushed_at"]
    wired.sandbox.clock.advance(3600)
    await wired.act(action="push_pull", repo="acme/bench", number=12, head_sha="a" * 40,
                    files=[{"filename": "README.md", "status": "added", "content": "# bench\n"}])
    assert (await wired.json("GET", "/repos/acme/bench"))["pushed_at"] > before


async def test_the_activity_lists_each_branch_move_newest_first(wired: Hub) -> None:
    # GitHub's repository activity dates a missed push to the default branch (the canary
    # rule and image dates, catalog_sync.catch_up), where `pushed_at` says any branch's.
    head = (await wired.json("GET", "/repos/acme/bench/commits/main"))["sha"]
    pushed = await wired.act(action="push_default", repo="acme/bench", files={"README.md": "one\n"})
    wired.sandbox.clock.advance(60)
    await wired.act(action="push_pull", repo="acme/bench", number=12, head_sha="a" * 40,
                    files=[{"filename": "README.md", "status": "added", "content": "# bench\n"}])
    wired.sandbox.clock.advance(60)
    merged = await wired.act(action="close_pull", repo="acme/bench", number=12, merged=True, user="alice")
    main = await wired.json("GET", "/repos/acme/bench/activity?ref=refs/heads/main")
    assert [(a["activity_type"], a["before"], a["after"]) for a in main] == [
        ("pr_merge", pushed["sha"], merged["merge_commit_sha"]), ("push", head, pushed["sha"])]
    assert main[0]["timestamp"] > main[1]["timestamp"] and main[0]["actor"]["login"] == "alice"
    assert await wired.json("GET", "/repos/acme/bench/activity?ref=main&direction=asc") == list(reversed(main))
    [branch] = await wired.json("GET", "/repos/acme/bench/activity?ref=bump-sglang")
    assert (branch["ref"], branch["after"]) == ("refs/heads/bump-sglang", "a" * 40)
    assert len(await wired.json("GET", "/repos/acme/bench/activity?activity_type=push")) == 2
    # GitHub refuses what it does not know, rather than listing nothing.
    await wired.json("GET", "/repos/acme/bench/activity?activity_type=pushed", status=422)
    await wired.json("GET", "/repos/acme/bench/activity?direction=newest", status=422)


async def open_stacked_pull(hub: Hub) -> dict[str, Any]:
    """#13, on top of #12's branch: against it, a README alone."""
    return await hub.act(action="open_pull", repo="acme/bench", pull={
        "title": "Document the bump", "user": "bob", "head_ref": "stacked", "base_ref": "bump-sglang",
        "files": [{"filename": "README.md", "status": "added", "content": "# bench\n"}]})


async def test_edit_pull_base_retargets_and_the_files_follow(wired: Hub, receiver: Receiver) -> None:
    await open_stacked_pull(wired)
    bump_head = wired.state()["pulls"][0]["head_sha"]
    assert [f["filename"] for f in await wired.json("GET", f"{REPO}/pulls/13/files")] == ["README.md"]
    receiver.received.clear()
    await wired.act(action="edit_pull", repo="acme/bench", number=13, base="main", user="bob")
    [(name, payload)] = events(receiver)
    assert (name, payload["action"]) == ("pull_request", "edited")
    assert payload["changes"] == {"base": {"ref": {"from": "bump-sglang"}, "sha": {"from": bump_head}}}
    base = payload["pull_request"]["base"]
    assert (base["ref"], base["sha"]) == ("main", wired.state()["head_sha"])
    # Against main the head brings #12's commit along.
    files = await wired.json("GET", f"{REPO}/pulls/13/files")
    assert [f["filename"] for f in files] == ["README.md", "configs/nvidia-master.yaml"]
    await wired.act(action="edit_pull", repo="acme/bench", number=13, base="bump-sglang")
    assert [f["filename"] for f in await wired.json("GET", f"{REPO}/pulls/13/files")] == ["README.md"]


async def test_edit_pull_base_is_refused_as_github_refuses_it(hub: Hub) -> None:
    await open_stacked_pull(hub)

    async def retarget(number: int, base: str) -> tuple[int, str]:
        response = await hub.client.post("/_sandbox/act", json={
            "action": "edit_pull", "repo": "acme/bench", "number": number, "base": base})
        return response.status, (await response.json())["detail"]

    assert await retarget(13, "release") == (422, "Proposed base branch 'release' was not found")
    # "stacked" holds every commit of #12.
    assert await retarget(12, "stacked") == (
        422, "There are no new commits between base branch 'stacked' and head branch 'bump-sglang'")
    await hub.act(action="close_pull", repo="acme/bench", number=12)
    assert await retarget(12, "stacked") == (422, "Cannot change the base branch of a closed pull request.")
    response = await hub.client.post("/_sandbox/act", json={
        "action": "close_pull", "repo": "acme/bench", "number": 13, "merged": True})
    assert response.status == 422, "merges go to the default branch alone"
    assert [p["base_ref"] for p in hub.state()["pulls"]] == ["main", "bump-sglang"]


async def test_an_edit_whose_new_base_is_refused_changes_nothing(hub: Hub) -> None:
    # What this catches: the title was changed before the base was refused (422), with no
    # event: GitHub refuses the whole edit.
    response = await hub.client.post("/_sandbox/act", json={
        "action": "edit_pull", "repo": "acme/bench", "number": 12, "title": "Renamed", "base": "release"})
    assert response.status == 422
    assert [p["title"] for p in hub.state()["pulls"] if p["number"] == 12] == ["Bump SGLang"]


@pytest.mark.parametrize(("second", "complaint"), [
    ({"full_name": "globex/bench", "installation_id": 1}, "installation 1 is another account's"),
    ({"full_name": "acme/extra", "installation_id": 2}, "an account has one installation"),
])
def test_a_scenario_gives_each_account_one_installation(second: dict, complaint: str) -> None:
    # What this catches: the sandbox's install and add checks go by installation id, and a
    # scenario tying one id to two accounts (or two ids to one) let them accept what GitHub
    # refuses: two accounts in one installation, a second installation on one account.
    scenario = small_scenario()
    scenario["repositories"].append(second)
    with pytest.raises(ScenarioError, match=complaint):
        Sandbox(scenario)
