"""Pull requests from forks: another account's copy of the repository holds the head branch."""

from __future__ import annotations

from typing import Any

from tests.sandbox.test_sandbox_support import BUMPED, MASTER, Hub, Receiver, events

REPO = "/repos/acme/bench"
FORK_PULL = {"title": "Bump SGLang from my fork", "user": "mallory", "head_ref": "main",
             "head_repo": "mallory/bench", "files": [{"filename": "configs/nvidia-master.yaml",
                                                      "content": BUMPED}]}


async def open_fork_pull(hub: Hub, **changes: Any) -> dict[str, Any]:
    return await hub.act(action="open_pull", repo="acme/bench", pull={**FORK_PULL, **changes})


async def test_a_fork_pull_request_names_the_fork_as_its_head(wired: Hub, receiver: Receiver) -> None:
    main = wired.state()["head_sha"]
    answer = await open_fork_pull(wired)
    [(_, payload)] = events(receiver)
    head, base = payload["pull_request"]["head"], payload["pull_request"]["base"]
    assert (head["label"], head["ref"], head["user"]["login"]) == ("mallory:main", "main", "mallory")
    assert head["repo"]["full_name"] == "mallory/bench" and head["repo"]["fork"] is True
    assert head["repo"]["owner"]["login"] == "mallory" and head["repo"]["owner"]["type"] == "User"
    assert head["repo"]["id"] != base["repo"]["id"] and base["repo"]["fork"] is False
    assert set(head["repo"]) == set(base["repo"])
    assert payload["repository"]["full_name"] == "acme/bench" and payload["sender"]["login"] == "mallory"
    # The fork's branch is not ours: our `main` stays, the head is found by its sha alone.
    assert wired.state()["refs"]["refs/heads/main"] == main
    [changed] = await wired.json("GET", f"{REPO}/pulls/13/files")
    assert "+  image: lmsysorg/sglang:v0.5.17-cu130" in changed["patch"]
    raw = {"Accept": "application/vnd.github.raw"}
    at_head = await wired.api("GET", f"{REPO}/contents/configs/nvidia-master.yaml?ref={answer['head_sha']}",
                              headers=raw)
    assert await at_head.text() == BUMPED
    at_base = await wired.api("GET", f"{REPO}/contents/configs/nvidia-master.yaml?ref={main}", headers=raw)
    assert await at_base.text() == MASTER
    listed = await wired.json("GET", f"{REPO}/pulls?head=mallory:main")
    assert [p["number"] for p in listed] == [13]
    assert await wired.json("GET", f"{REPO}/pulls?head=acme:main") == []


async def test_a_fork_stays_the_head_through_push_edit_and_close(wired: Hub, receiver: Receiver) -> None:
    await open_fork_pull(wired)
    refs = wired.state()["refs"]
    await wired.act(action="push_pull", repo="acme/bench", number=13,
                    files=[{"filename": "README.md", "status": "added", "content": "# fork\n"}])
    await wired.act(action="edit_pull", repo="acme/bench", number=13, title="Only the README")
    await wired.act(action="close_pull", repo="acme/bench", number=13)
    sent = [(p["action"], p["pull_request"]["head"]["repo"]["full_name"]) for _, p in events(receiver)]
    assert sent == [("opened", "mallory/bench"), ("synchronize", "mallory/bench"),
                    ("edited", "mallory/bench"), ("closed", "mallory/bench")]
    assert wired.state()["refs"] == refs, "a push to the fork moves no branch of ours"
    [pull] = [p for p in wired.state()["pulls"] if p["number"] == 13]
    assert pull["head_repo"] == "mallory/bench"


async def test_a_fork_is_another_accounts(hub: Hub) -> None:
    response = await hub.client.post("/_sandbox/act", json={
        "action": "open_pull", "repo": "acme/bench", "pull": {**FORK_PULL, "head_repo": "ACME/bench-copy"}})
    assert response.status == 422
    assert 13 not in hub.sandbox.world.repo("acme/bench").pulls


async def test_a_pull_request_run_from_a_fork_names_the_fork_and_no_pull_request(
    wired: Hub, receiver: Receiver
) -> None:
    # GitHub leaves a run's `pull_requests` empty when the head is in a fork.
    opened = await open_fork_pull(wired)
    receiver.received.clear()
    await wired.act(action="complete_run", repo="acme/bench", run={
        "workflow": "run-sweep.yml", "event": "pull_request", "head_sha": opened["head_sha"],
        "head_branch": "main", "head_repository": "mallory/bench", "actor": "mallory",
        "pull_requests": [13], "artifacts": [{"name": "sweep", "files": {"x.json": {}}}]})
    [(_, payload)] = events(receiver)
    run = payload["workflow_run"]
    assert (run["event"], run["pull_requests"]) == ("pull_request", [])
    assert run["head_repository"]["full_name"] == "mallory/bench" and run["head_repository"]["fork"] is True
    assert run["repository"]["full_name"] == "acme/bench"
    [artifact] = (await wired.json("GET", f"{REPO}/actions/runs/{run['id']}/artifacts"))["artifacts"]
    assert artifact["workflow_run"]["head_repository_id"] == run["head_repository"]["id"]


async def test_a_run_from_a_fork_in_the_repositorys_own_account_is_refused(hub: Hub) -> None:
    # What this catches: the fork check covered pull requests only; a run's head repository
    # in the same account is no fork GitHub could make.
    response = await hub.client.post("/_sandbox/act", json={
        "action": "complete_run", "repo": "acme/bench", "run": {
            "workflow": "run-sweep.yml", "event": "pull_request", "head_sha": "a" * 40,
            "head_repository": "acme/bench-copy", "actor": "mallory"}})
    assert response.status == 422
    assert "a fork belongs to another account" in (await response.json())["detail"]


async def test_a_check_run_on_a_forks_head_lists_no_pull_request(wired: Hub) -> None:
    # GitHub lists in a check run's `pull_requests` only those whose head is in the repository.
    opened = await open_fork_pull(wired)
    made = await wired.json("POST", f"{REPO}/check-runs", status=201,
                            json={"name": "Klaud Cold", "head_sha": opened["head_sha"]})
    assert made["pull_requests"] == []
