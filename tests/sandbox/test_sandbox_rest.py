"""The sandbox's REST routes: GitHub's shapes, status codes and headers."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import zipfile
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest

from bot.sandbox import Sandbox
from tests.sandbox.test_sandbox_support import (
    BUMPED,
    MASTER,
    Hub,
    repo_of,
    serve,
    small_scenario,
)

REPO = "/repos/acme/bench"


async def test_unknown_route_answers_404_json(hub: Hub) -> None:
    response = await hub.api("GET", "/repos/acme/bench/nonsense")
    assert response.status == 404
    body = await response.json()
    assert body["message"] == "Not Found"
    assert "documentation_url" in body
    assert response.headers["x-ratelimit-limit"] == "5000"


async def test_missing_authorization_is_401(hub: Hub) -> None:
    response = await hub.client.get("/_sandbox/github/repos/acme/bench")
    assert response.status == 401
    assert (await response.json())["message"] == "Requires authentication"


async def test_unknown_repository_is_404(hub: Hub) -> None:
    response = await hub.api("GET", "/repos/acme/other/pulls")
    assert response.status == 404


async def test_installation_token_and_installations(hub: Hub) -> None:
    made = await hub.json("POST", "/app/installations/1/access_tokens", status=201)
    assert made["token"].startswith("ghs_")
    assert made["expires_at"] == "2026-11-30T09:00:00Z"  # one hour by the sandbox clock
    assert made["permissions"]["checks"] == "write"
    assert made["repository_selection"] == "selected"
    assert (await hub.api("POST", "/app/installations/99/access_tokens")).status == 404
    installations = await hub.json("GET", "/app/installations")
    assert [(i["id"], i["account"]["login"]) for i in installations] == [(1, "acme")]
    listed = await hub.json("GET", "/installation/repositories")
    assert listed["total_count"] == 1
    assert listed["repositories"][0]["full_name"] == "acme/bench"
    assert (await hub.json("GET", f"{REPO}/installation"))["id"] == 1


async def test_repository(hub: Hub) -> None:
    repo = await hub.json("GET", REPO)
    assert repo["full_name"] == "acme/bench"
    assert repo["default_branch"] == "main"
    assert repo["owner"]["type"] == "Organization"
    assert repo["private"] is True


async def test_contents_at_default_branch_base_and_head(hub: Hub) -> None:
    state = hub.state()
    pull = state["pulls"][0]
    main = await hub.json("GET", f"{REPO}/contents/configs/nvidia-master.yaml")
    assert main["encoding"] == "base64" and main["type"] == "file"
    assert base64.b64decode(main["content"]).decode() == MASTER
    assert main["sha"] == git_blob_sha(MASTER)
    head = await hub.json("GET", f"{REPO}/contents/configs/nvidia-master.yaml",
                          params={"ref": pull["head_sha"]})
    assert base64.b64decode(head["content"]).decode() == BUMPED
    base = await hub.json("GET", f"{REPO}/contents/configs/nvidia-master.yaml",
                          params={"ref": pull["base_sha"]})
    assert base64.b64decode(base["content"]).decode() == MASTER
    by_branch = await hub.json("GET", f"{REPO}/contents/configs/nvidia-master.yaml",
                               params={"ref": "bump-sglang"})
    assert by_branch["sha"] == head["sha"]


async def test_contents_raw_directory_and_missing(hub: Hub) -> None:
    raw = await hub.api("GET", f"{REPO}/contents/configs/nvidia-master.yaml",
                        headers={"Accept": "application/vnd.github.raw+json"})
    assert raw.status == 200 and await raw.text() == MASTER
    listing = await hub.json("GET", f"{REPO}/contents/configs")
    assert {(e["name"], e["type"]) for e in listing} == {
        ("nvidia-master.yaml", "file"), ("runners.yaml", "file")}
    root = await hub.json("GET", f"{REPO}/contents/.github")
    assert [(e["name"], e["type"]) for e in root] == [("workflows", "dir")]
    missing = await hub.api("GET", f"{REPO}/contents/configs/nope.yaml")
    assert missing.status == 404
    assert (await missing.json())["message"] == "Not Found"
    bad_ref = await hub.api("GET", f"{REPO}/contents/README.md", params={"ref": "no-such"})
    assert bad_ref.status == 404


async def test_large_file_content_is_left_out() -> None:
    scenario = small_scenario()
    repo_of(scenario)["files"]["big.txt"] = "x" * (1024 * 1024 + 1)
    async for hub in serve(Sandbox(scenario)):
        big = await hub.json("GET", f"{REPO}/contents/big.txt")
        assert big["encoding"] == "none" and big["content"] == ""
        assert big["size"] == 1024 * 1024 + 1


async def test_pull_list_detail_and_files(hub: Hub) -> None:
    pulls = await hub.json("GET", f"{REPO}/pulls", params={"state": "open"})
    assert [p["number"] for p in pulls] == [12]
    assert "merged" not in pulls[0]  # the list answers GitHub's short form
    pull = await hub.json("GET", f"{REPO}/pulls/12")
    assert pull["merged"] is False and pull["changed_files"] == 1
    assert pull["head"]["ref"] == "bump-sglang"
    assert pull["base"]["sha"] == hub.state()["head_sha"]
    assert pull["user"] == {**pull["user"], "login": "bob", "type": "User"}
    assert [label["name"] for label in pull["labels"]] == ["perf"]
    files = await hub.json("GET", f"{REPO}/pulls/12/files")
    assert files[0]["filename"] == "configs/nvidia-master.yaml"
    assert files[0]["status"] == "modified"
    assert files[0]["additions"] == 1 and files[0]["deletions"] == 1
    assert "-  image: lmsysorg/sglang:v0.5.16-cu130" in files[0]["patch"]
    assert files[0]["patch"].startswith("@@ -1,")
    assert (await hub.api("GET", f"{REPO}/pulls/99")).status == 404
    assert await hub.json("GET", f"{REPO}/pulls", params={"state": "closed"}) == []
    assert len(await hub.json("GET", f"{REPO}/pulls", params={"head": "acme:bump-sglang"})) == 1
    assert await hub.json("GET", f"{REPO}/pulls", params={"head": "acme:other"}) == []


async def test_pull_files_paginate_with_link_and_stop_at_3000() -> None:
    scenario = small_scenario()
    repo_of(scenario)["pulls"][0]["files"] = [
        {"filename": f"docs/f{i:04}.md", "status": "added", "patch": "@@ -0,0 +1 @@\n+x"}
        for i in range(3005)
    ]
    async for hub in serve(Sandbox(scenario)):
        first = await hub.api("GET", f"{REPO}/pulls/12/files", params={"per_page": "100"})
        page = await first.json()
        assert len(page) == 100 and page[0]["filename"] == "docs/f0000.md"
        link = first.headers["Link"]
        assert 'page=2' in link and 'rel="next"' in link
        assert 'page=30' in link and 'rel="last"' in link
        last = await hub.json("GET", f"{REPO}/pulls/12/files",
                              params={"per_page": "100", "page": "30"})
        assert last[-1]["filename"] == "docs/f2999.md"
        past = await hub.json("GET", f"{REPO}/pulls/12/files",
                              params={"per_page": "100", "page": "31"})
        assert past == []
        capped = await hub.json("GET", f"{REPO}/pulls/12/files", params={"per_page": "500"})
        assert len(capped) == 100
        default = await hub.api("GET", f"{REPO}/pulls/12/files")
        assert len(await default.json()) == 30
        detail = await hub.json("GET", f"{REPO}/pulls/12")
        assert detail["changed_files"] == 3005


async def test_patch_null_is_left_out_and_contents_serve_the_head() -> None:
    scenario = small_scenario()
    repo_of(scenario)["pulls"][0]["files"][0]["patch"] = None
    async for hub in serve(Sandbox(scenario)):
        files = await hub.json("GET", f"{REPO}/pulls/12/files")
        assert "patch" not in files[0]
        assert (files[0]["additions"], files[0]["deletions"]) == (1, 1)
        head = hub.state()["pulls"][0]["head_sha"]
        text = await hub.api("GET", f"{REPO}/contents/configs/nvidia-master.yaml",
                             params={"ref": head}, headers={"Accept": "application/vnd.github.raw"})
        assert await text.text() == BUMPED


async def test_patch_only_file_is_applied_to_get_the_head_text() -> None:
    scenario = small_scenario()
    patch = ("@@ -1,3 +1,3 @@\n dsr1-fp4-b200-sglang:\n"
             "-  image: lmsysorg/sglang:v0.5.16-cu130\n+  image: lmsysorg/sglang:v0.5.17-cu130\n"
             "   model-prefix: dsr1\n")
    repo_of(scenario)["pulls"][0]["files"] = [
        {"filename": "configs/nvidia-master.yaml", "patch": patch}]
    async for hub in serve(Sandbox(scenario)):
        files = await hub.json("GET", f"{REPO}/pulls/12/files")
        assert files[0]["patch"] == patch
        head = hub.state()["pulls"][0]["head_sha"]
        text = await hub.api("GET", f"{REPO}/contents/configs/nvidia-master.yaml",
                             params={"ref": head}, headers={"Accept": "application/vnd.github.raw"})
        assert await text.text() == BUMPED


async def test_a_files_json_and_raw_forms_share_one_etag_as_on_github(hub: Hub) -> None:
    # What this catches: an ETag per representation, where GitHub gives one and answers
    # either's If-None-Match with 304 (a client caching by URL alone then reads the wrong form).
    url = f"{REPO}/contents/configs/runners.yaml"
    as_json = await hub.api("GET", url)
    raw = await hub.api("GET", url, headers={"Accept": "application/vnd.github.raw"})
    assert as_json.headers["ETag"] == raw.headers["ETag"]
    cross = await hub.api("GET", url, headers={"Accept": "application/vnd.github.raw", "If-None-Match": as_json.headers["ETag"]})
    assert cross.status == 304


async def test_etag_304_does_not_spend_the_budget(hub: Hub) -> None:
    first = await hub.api("GET", f"{REPO}/pulls")
    etag = first.headers["ETag"]
    remaining = int(first.headers["x-ratelimit-remaining"])
    again = await hub.api("GET", f"{REPO}/pulls", headers={"If-None-Match": etag})
    assert again.status == 304
    assert again.headers["ETag"] == etag
    assert int(again.headers["x-ratelimit-remaining"]) == remaining
    changed = await hub.act(action="edit_pull", repo="acme/bench", number=12, title="New")
    assert changed["number"] == 12
    after = await hub.api("GET", f"{REPO}/pulls", headers={"If-None-Match": etag})
    assert after.status == 200
    assert int(after.headers["x-ratelimit-remaining"]) == remaining - 1


async def test_rate_limit_headers_count_down_and_refuse_when_spent() -> None:
    async for hub in serve(Sandbox(small_scenario(rate_limit=3))):
        seen = []
        for _ in range(3):
            response = await hub.api("GET", REPO)
            assert response.status == 200
            seen.append(response.headers["x-ratelimit-remaining"])
        assert seen == ["2", "1", "0"]
        refused = await hub.api("GET", REPO)
        assert refused.status == 403
        assert "rate limit exceeded" in (await refused.json())["message"]
        assert refused.headers["x-ratelimit-remaining"] == "0"
        reset = int(refused.headers["x-ratelimit-reset"])
        assert reset == int(hub.sandbox.clock.now().timestamp()) + 3600
        assert refused.headers["x-ratelimit-resource"] == "core"
        hub.sandbox.clock.advance(3600)
        assert (await hub.api("GET", REPO)).status == 200


async def test_graphql_has_its_own_budget_and_when_spent_answers_200_rate_limited() -> None:
    # What this catches: GraphQL spending REST's budget and refused with REST's 403, where
    # GitHub keeps a separate budget and answers 200 with an error of type RATE_LIMITED.
    query = {"query": "{ repository(owner: \"acme\", name: \"bench\") { object(expression: \"main\") { oid } } }"}
    async for hub in serve(Sandbox(small_scenario(rate_limit=2))):
        hub.token = "token " + (await hub.json("POST", "/app/installations/1/access_tokens", status=201))["token"]
        for _ in range(2):
            assert (await hub.api("GET", REPO)).status == 200
        assert (await hub.api("GET", REPO)).status == 403  # REST's budget is spent
        for left in ("1", "0"):
            answered = await hub.api("POST", "/graphql", json=query)
            assert answered.status == 200 and "errors" not in await answered.json()
            assert (answered.headers["x-ratelimit-resource"], answered.headers["x-ratelimit-remaining"]) == ("graphql", left)
        refused = await hub.api("POST", "/graphql", json=query)
        assert refused.status == 200
        [error] = (await refused.json())["errors"]
        assert error["type"] == "RATE_LIMITED" and error["message"] == "API rate limit exceeded for installation ID 1."
        assert (refused.headers["x-ratelimit-resource"], refused.headers["x-ratelimit-remaining"]) == ("graphql", "0")


async def test_commit_and_compare(hub: Hub) -> None:
    head = hub.state()["head_sha"]
    commit = await hub.json("GET", f"{REPO}/commits/main")
    assert commit["sha"] == head and commit["parents"] == []
    assert (await hub.api("GET", f"{REPO}/commits/{'f' * 40}")).status == 422
    pushed = await hub.act(action="push_default", repo="acme/bench",
                           files={"configs/nvidia-master.yaml": BUMPED, "configs/runners.yaml": None,
                                  "docs/new.md": "hello\n"})
    compared = await hub.json("GET", f"{REPO}/compare/{head}...main")
    assert compared["status"] == "ahead" and compared["ahead_by"] == 1
    assert compared["commits"][0]["sha"] == pushed["sha"]
    assert {(f["filename"], f["status"]) for f in compared["files"]} == {
        ("configs/nvidia-master.yaml", "modified"), ("configs/runners.yaml", "removed"),
        ("docs/new.md", "added")}
    modified = next(f for f in compared["files"] if f["status"] == "modified")
    assert "+  image: lmsysorg/sglang:v0.5.17-cu130" in modified["patch"]
    behind = await hub.json("GET", f"{REPO}/compare/main...{head}")
    assert behind["status"] == "behind" and behind["behind_by"] == 1
    diverged = await hub.json("GET", f"{REPO}/compare/main...bump-sglang")
    assert diverged["status"] == "diverged"
    assert diverged["merge_base_commit"]["sha"] == head
    last = await hub.json("GET", f"{REPO}/commits/{pushed['sha']}")
    assert last["parents"][0]["sha"] == head
    assert {f["filename"] for f in last["files"]} == {
        "configs/nvidia-master.yaml", "configs/runners.yaml", "docs/new.md"}
    assert (await hub.api("GET", f"{REPO}/compare/main...nope")).status == 404


async def test_compare_of_unrelated_histories_is_404_as_on_github(hub: Hub) -> None:
    # GitHub: "No common ancestor between ..." (the sandbox answered 200 with `base` as the
    # merge base, which no caller could then tell from a real one).
    repo = hub.sandbox.world.repo("acme/bench")
    orphan = repo.commit({"README.md": "x\n"}, (), "orphan", "bob", datetime(2026, 11, 30, tzinfo=UTC))
    answer = await hub.api("GET", f"{REPO}/compare/main...{orphan.sha}")
    assert answer.status == 404 and "No common ancestor" in (await answer.json())["message"]


async def test_git_tree_lists_files(hub: Hub) -> None:
    tree = await hub.json("GET", f"{REPO}/git/trees/main", params={"recursive": "1"})
    # GitHub: any value of `recursive` returns the subtrees, "0" and "false" too.
    assert await hub.json("GET", f"{REPO}/git/trees/main", params={"recursive": "0"}) == tree
    blobs = {e["path"] for e in tree["tree"] if e["type"] == "blob"}
    assert "configs/nvidia-master.yaml" in blobs and ".github/workflows/run-sweep.yml" in blobs
    assert {"configs", ".github", ".github/workflows"} <= {
        e["path"] for e in tree["tree"] if e["type"] == "tree"}


async def test_refs_create_read_match_delete(hub: Hub) -> None:
    head = hub.state()["head_sha"]
    made = await hub.api("POST", f"{REPO}/git/refs",
                         json={"ref": "refs/heads/klaud/claim-0123456789abcdef", "sha": head})
    assert made.status == 201
    assert (await made.json())["object"]["sha"] == head
    again = await hub.api("POST", f"{REPO}/git/refs",
                          json={"ref": "refs/heads/klaud/claim-0123456789abcdef", "sha": head})
    assert again.status == 422
    assert (await again.json())["message"] == "Reference already exists"
    unknown = await hub.api("POST", f"{REPO}/git/refs", json={"ref": "refs/heads/x", "sha": "0" * 40})
    assert unknown.status == 422
    badname = await hub.api("POST", f"{REPO}/git/refs", json={"ref": "x", "sha": head})
    assert badname.status == 422
    # git keeps refs as paths: neither a folder nor a ref inside one can be made beside it.
    for clash in ("refs/heads/klaud", "refs/heads/klaud/claim-0123456789abcdef/x"):
        refused = await hub.api("POST", f"{REPO}/git/refs", json={"ref": clash, "sha": head})
        assert (refused.status, (await refused.json())["message"]) == (422, "Reference update failed")
    got = await hub.json("GET", f"{REPO}/git/ref/heads/klaud/claim-0123456789abcdef")
    assert got["ref"] == "refs/heads/klaud/claim-0123456789abcdef"
    matching = await hub.json("GET", f"{REPO}/git/matching-refs/heads/klaud")
    assert [r["ref"] for r in matching] == ["refs/heads/klaud/claim-0123456789abcdef"]
    assert (await hub.api("GET", f"{REPO}/git/ref/heads/klaud/nope")).status == 404
    deleted = await hub.api("DELETE", f"{REPO}/git/refs/heads/klaud/claim-0123456789abcdef")
    assert deleted.status == 204
    gone = await hub.api("DELETE", f"{REPO}/git/refs/heads/klaud/claim-0123456789abcdef")
    assert gone.status == 422
    assert (await gone.json())["message"] == "Reference does not exist"
    assert "refs/heads/klaud/claim-0123456789abcdef" not in hub.state()["refs"]
    beside = await hub.api("POST", f"{REPO}/git/refs", json={"ref": "refs/heads/klaud-other", "sha": head})
    assert beside.status == 201  # a name that begins alike is no folder of it


async def test_ref_update_must_fast_forward_unless_forced(hub: Hub) -> None:
    head = hub.state()["head_sha"]
    pushed = await hub.act(action="push_default", repo="acme/bench", files={"a.txt": "a\n"})
    await hub.json("POST", f"{REPO}/git/refs", status=201,
                   json={"ref": "refs/heads/lease", "sha": pushed["sha"]})
    backwards = await hub.api("PATCH", f"{REPO}/git/refs/heads/lease", json={"sha": head})
    assert backwards.status == 422
    forced = await hub.json("PATCH", f"{REPO}/git/refs/heads/lease", json={"sha": head, "force": True})
    assert forced["object"]["sha"] == head


async def test_runs_listing_filters_and_workflow_route(hub: Hub) -> None:
    runs = await hub.json("GET", f"{REPO}/actions/runs")
    assert runs["total_count"] == 2
    assert [r["id"] for r in runs["workflow_runs"]] == [101, 102]  # newest first
    first = runs["workflow_runs"][0]
    assert first["path"] == ".github/workflows/klaud-plan.yml"
    assert first["event"] == "schedule" and first["status"] == "completed"
    assert first["conclusion"] == "success" and first["run_attempt"] == 1
    recent = await hub.json("GET", f"{REPO}/actions/runs", params={"created": ">=2026-11-28"})
    assert [r["id"] for r in recent["workflow_runs"]] == [101]
    older = await hub.json("GET", f"{REPO}/actions/runs", params={"created": "<2026-11-28"})
    assert [r["id"] for r in older["workflow_runs"]] == [102]
    ranged = await hub.json("GET", f"{REPO}/actions/runs", params={"created": "2026-11-27..2026-11-29"})
    assert [r["id"] for r in ranged["workflow_runs"]] == [102]
    failed = await hub.json("GET", f"{REPO}/actions/runs", params={"status": "failure"})
    assert [r["id"] for r in failed["workflow_runs"]] == [102]
    bad = await hub.api("GET", f"{REPO}/actions/runs", params={"created": ">=yesterday"})
    assert bad.status == 422
    by_name = await hub.json("GET", f"{REPO}/actions/workflows/klaud-plan.yml/runs")
    assert [r["id"] for r in by_name["workflow_runs"]] == [101]
    by_id = await hub.json("GET", f"{REPO}/actions/workflows/{first['workflow_id']}/runs")
    assert [r["id"] for r in by_id["workflow_runs"]] == [101]
    assert (await hub.api("GET", f"{REPO}/actions/workflows/nope.yml/runs")).status == 404
    one = await hub.json("GET", f"{REPO}/actions/runs/102")
    assert one["name"] == "Klaud Cold candidate"  # the workflow file's `name:`
    assert (await hub.api("GET", f"{REPO}/actions/runs/999")).status == 404


@pytest.fixture
async def busy() -> AsyncIterator[Hub]:
    """1,005 completed runs of the candidate workflow, one a minute from 2026-11-01 00:00."""
    scenario = small_scenario()
    start = datetime(2026, 11, 1, tzinfo=UTC)
    repo_of(scenario)["runs"] = [
        {"id": 5000 + i, "workflow": "klaud-candidate.yml", "conclusion": "success",
         "created_at": (start + timedelta(minutes=i)).isoformat(),
         "completed_at": (start + timedelta(minutes=i, seconds=30)).isoformat()}
        for i in range(1005)
    ]
    async for served in serve(Sandbox(scenario)):
        yield served


async def listed_ids(hub: Hub, path: str, params: dict[str, str]) -> tuple[list[int], list[int]]:
    """The run ids of pages 1 to 11 of 100, and each page's total_count."""
    ids: list[int] = []
    totals: list[int] = []
    for page in range(1, 12):
        body = await hub.json("GET", path, params={**params, "per_page": "100", "page": str(page)})
        ids += [run["id"] for run in body["workflow_runs"]]
        totals.append(body["total_count"])
    return ids, totals


@pytest.mark.parametrize("route", ["actions/runs", "actions/workflows/klaud-candidate.yml/runs"])
async def test_a_filtered_run_listing_stops_at_1000_and_counts_every_match(busy: Hub, route: str) -> None:
    # What this catches (review C): the sandbox listed every match, where GitHub "will return
    # up to 1,000 results for each search when using the following parameters: actor,
    # branch, check_suite_id, created, event, head_sha, status".
    newest_first = list(range(6004, 4999, -1))
    ids, totals = await listed_ids(busy, f"{REPO}/{route}", {"status": "completed", "created": ">=2026-11-01"})
    assert ids == newest_first[:1000] and set(totals) == {1005}
    tenth = await busy.api("GET", f"{REPO}/{route}", params={"created": ">=2026-11-01", "per_page": "100", "page": "10"})
    assert 'rel="next"' not in tenth.headers.get("Link", "")
    everything, _ = await listed_ids(busy, f"{REPO}/{route}", {})
    assert everything == newest_first  # no search parameter: no cap


async def test_a_created_range_of_instants_lists_the_runs_the_cap_left_out(busy: Hub) -> None:
    # How a client reaches past the cap: `created=BOUND..OLDEST` (both ends included).
    ids, _ = await listed_ids(busy, f"{REPO}/actions/workflows/klaud-candidate.yml/runs",
                              {"status": "completed", "created": "2026-11-01T00:00:00Z..2026-11-01T00:05:00Z"})
    assert ids == [5005, 5004, 5003, 5002, 5001, 5000]


async def test_artifacts_list_and_zip_redirect(hub: Hub) -> None:
    listed = await hub.json("GET", f"{REPO}/actions/runs/101/artifacts")
    assert listed["total_count"] == 2
    by_name = {a["name"]: a for a in listed["artifacts"]}
    good, old = by_name["klaud-candidate-good"], by_name["klaud-candidate-old"]
    assert good["expired"] is False and old["expired"] is True
    assert good["workflow_run"]["id"] == 101
    assert good["expires_at"] == "2026-12-14T06:00:00Z"
    named = await hub.json("GET", f"{REPO}/actions/runs/101/artifacts",
                           params={"name": "klaud-candidate-good"})
    assert [a["id"] for a in named["artifacts"]] == [good["id"]]
    redirect = await hub.api("GET", f"{REPO}/actions/artifacts/{good['id']}/zip")
    assert redirect.status == 302
    location = redirect.headers["Location"]
    assert "/_sandbox/blobs/" in location
    blob = await hub.client.get(location[location.index("/_sandbox/"):])  # no Authorization
    assert blob.status == 200
    with zipfile.ZipFile(io.BytesIO(await blob.read())) as archive:
        assert archive.namelist() == ["candidate-diagnostics.json"]
        document = json.loads(archive.read("candidate-diagnostics.json"))
    assert document["candidate-outcome"]["outcome"] == "capacity-deferred"
    expired = await hub.api("GET", f"{REPO}/actions/artifacts/{old['id']}/zip")
    assert (expired.status, (await expired.json())["message"]) == (410, "Artifact has expired")  # GitHub: 410 Gone
    assert (await hub.api("GET", f"{REPO}/actions/artifacts/1/zip")).status == 404
    everything = await hub.json("GET", f"{REPO}/actions/artifacts")
    assert everything["total_count"] == 2


async def test_artifacts_expire_fourteen_days_after_they_were_made(hub: Hub) -> None:
    async def good() -> dict:  # the scenario's other artifact has expired from the start
        listed = await hub.json("GET", f"{REPO}/actions/runs/101/artifacts")
        [artifact] = [a for a in listed["artifacts"] if a["name"] == "klaud-candidate-good"]
        return artifact

    listed = await good()
    expires_at = datetime.fromisoformat(listed["expires_at"])
    assert expires_at - datetime.fromisoformat(listed["created_at"]) == timedelta(days=14)  # made by the run
    hub.sandbox.clock.advance((expires_at - hub.sandbox.clock.now()).total_seconds() - 1)
    assert (await good())["expired"] is False
    hub.sandbox.clock.advance(1)
    assert (await good())["expired"] is True


async def test_broken_artifact_contents_are_served_as_given() -> None:
    scenario = small_scenario()
    repo_of(scenario)["runs"][0]["artifacts"] = [
        {"name": "klaud-candidate-raw", "raw_zip_base64": base64.b64encode(b"not a zip").decode()},
        {"name": "klaud-candidate-text", "files": {"candidate-diagnostics.json": "{broken"}},
    ]
    async for hub in serve(Sandbox(scenario)):
        listed = await hub.json("GET", f"{REPO}/actions/runs/101/artifacts")
        data = {}
        for artifact in listed["artifacts"]:
            redirect = await hub.api("GET", f"{REPO}/actions/artifacts/{artifact['id']}/zip")
            location = redirect.headers["Location"]
            data[artifact["name"]] = await (await hub.client.get(
                location[location.index("/_sandbox/"):])).read()
        assert data["klaud-candidate-raw"] == b"not a zip"
        with zipfile.ZipFile(io.BytesIO(data["klaud-candidate-text"])) as archive:
            assert archive.read("candidate-diagnostics.json") == b"{broken"


async def test_workflow_dispatch_records_and_queues_a_run(hub: Hub) -> None:
    inputs = {"candidate": "d92e15065c55779d-555679de269db36f",
              "family": "configs/nvidia-master.yaml:dsr1-fp4-b200-sglang",
              "base": hub.state()["head_sha"], "wave": "3"}
    response = await hub.api("POST", f"{REPO}/actions/workflows/klaud-candidate.yml/dispatches",
                             json={"ref": "main", "inputs": inputs})
    assert response.status == 204
    dispatch = hub.state()["dispatches"][0]
    assert dispatch["workflow"] == "klaud-candidate.yml"
    assert dispatch["ref"] == "main" and dispatch["inputs"] == inputs
    assert dispatch["at"] == "2026-11-30T08:00:00Z"
    run = await hub.json("GET", f"{REPO}/actions/runs/{dispatch['run_id']}")
    assert run["status"] == "queued" and run["conclusion"] is None
    assert run["event"] == "workflow_dispatch" and run["head_branch"] == "main"
    queued = await hub.json("GET", f"{REPO}/actions/runs", params={"status": "queued"})
    assert [r["id"] for r in queued["workflow_runs"]] == [dispatch["run_id"]]


@pytest.mark.parametrize(
    ("workflow", "body", "status", "message"),
    [
        ("klaud-candidate.yml", {"ref": "main", "inputs": {"candidate": "x", "family": "f",
                                                           "base": "b", "colour": "red"}},
         422, 'Unexpected inputs provided: ["colour"]'),
        ("klaud-candidate.yml", {"ref": "main", "inputs": {"candidate": "x"}},
         422, "Required input 'family' not provided"),
        ("klaud-candidate.yml", {"ref": "nope", "inputs": {}}, 422, "No ref found for: nope"),
        # A commit SHA is not a ref GitHub dispatches on (github/docs#590).
        ("klaud-candidate.yml", {"ref": "HEAD", "inputs": {"candidate": "x", "family": "f", "base": "b"}},
         422, "No ref found for: HEAD"),
        ("run-sweep.yml", {"ref": "main"}, 422,
         "Workflow does not have 'workflow_dispatch' trigger"),
        ("missing.yml", {"ref": "main"}, 404, "Not Found"),
    ],
)
async def test_workflow_dispatch_errors(
    hub: Hub, workflow: str, body: dict[str, object], status: int, message: str
) -> None:
    if body.get("ref") == "HEAD":
        body = dict(body, ref=hub.state()["head_sha"])
        message = message.replace("HEAD", str(body["ref"]))
    response = await hub.api("POST", f"{REPO}/actions/workflows/{workflow}/dispatches", json=body)
    assert response.status == status
    assert (await response.json())["message"] == message
    assert hub.state()["dispatches"] == []


TYPED_WORKFLOW = """\
name: Typed
on:
  workflow_dispatch:
    inputs:
      level: {required: true, type: choice, options: [info, warning, debug]}
      debug: {required: false, type: boolean, default: false}
"""


@pytest.fixture
async def typed() -> AsyncIterator[Hub]:
    """The small scenario with a workflow whose inputs are typed `choice` and `boolean`."""
    scenario = small_scenario()
    repo_of(scenario)["files"][".github/workflows/typed.yml"] = TYPED_WORKFLOW
    async for served in serve(Sandbox(scenario)):
        yield served


# What this catches (review C): the sandbox took any value for a typed input, where GitHub
# answers 422, e.g. "Provided value 'gfx906' for input 'amdgpu_family' not in the list of
# allowed values" (ROCm/TheRock#3651) and "Provided value '' for input 'debug' …" (cli/cli#5246).
@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"level": "verbose"}, "Provided value 'verbose' for input 'level' not in the list of allowed values"),
        ({"level": "info", "debug": "yes"}, "Provided value 'yes' for input 'debug' not in the list of allowed values"),
        ({"level": "info", "debug": ""}, "Provided value '' for input 'debug' not in the list of allowed values"),
    ],
)
async def test_a_dispatch_is_refused_a_value_outside_a_typed_inputs_allowed_values(
    typed: Hub, inputs: dict[str, str], message: str
) -> None:
    response = await typed.api("POST", f"{REPO}/actions/workflows/typed.yml/dispatches",
                               json={"ref": "main", "inputs": inputs})
    assert response.status == 422, await response.text()
    assert (await response.json())["message"] == message
    assert typed.state()["dispatches"] == []


async def test_a_dispatch_within_a_typed_inputs_allowed_values_is_taken(typed: Hub) -> None:
    for inputs in ({"level": "debug", "debug": "true"}, {"level": "info", "debug": False}):
        response = await typed.api("POST", f"{REPO}/actions/workflows/typed.yml/dispatches",
                                   json={"ref": "main", "inputs": inputs})
        assert response.status == 204, await response.text()
    assert [d["inputs"]["level"] for d in typed.state()["dispatches"]] == ["debug", "info"]


async def test_check_runs_create_update_and_list(hub: Hub) -> None:
    head = hub.state()["pulls"][0]["head_sha"]
    created = await hub.json("POST", f"{REPO}/check-runs", status=201, json={
        "name": "Klaud Cold", "head_sha": head, "status": "in_progress",
        "output": {"title": "In flight", "summary": "Candidate dispatched"}})
    assert created["status"] == "in_progress" and created["conclusion"] is None
    assert created["app"]["slug"] == "klaud-cold"
    assert [p["number"] for p in created["pull_requests"]] == [12]
    updated = await hub.json("PATCH", f"{REPO}/check-runs/{created['id']}", json={
        "conclusion": "success", "output": {"title": "Validated", "summary": "ok"}})
    assert updated["status"] == "completed" and updated["conclusion"] == "success"
    assert updated["completed_at"] == "2026-11-30T08:00:00Z"
    assert updated["output"]["title"] == "Validated"
    second = await hub.json("POST", f"{REPO}/check-runs", status=201,
                            json={"name": "Klaud Cold", "head_sha": head})
    listed = await hub.json("GET", f"{REPO}/commits/{head}/check-runs")
    assert [c["id"] for c in listed["check_runs"]] == [second["id"]]  # latest per name
    both = await hub.json("GET", f"{REPO}/commits/bump-sglang/check-runs", params={"filter": "all"})
    assert both["total_count"] == 2
    state = hub.state()["check_runs"]
    assert state[0]["conclusion"] == "success" and state[0]["output"]["summary"] == "ok"
    invalid = await hub.api("POST", f"{REPO}/check-runs", json={"name": "x", "head_sha": "0" * 40})
    assert invalid.status == 422
    bad_status = await hub.api("PATCH", f"{REPO}/check-runs/{second['id']}", json={"status": "done"})
    assert bad_status.status == 422
    for refused in ({"status": "waiting"}, {"status": "pending"}, {"conclusion": "stale"}):  # GitHub's or Actions' own
        assert (await hub.api("PATCH", f"{REPO}/check-runs/{second['id']}", json=refused)).status == 422
    reopened = await hub.json("PATCH", f"{REPO}/check-runs/{created['id']}", json={"status": "in_progress"})
    assert (reopened["status"], reopened["conclusion"], reopened["completed_at"]) == ("in_progress", None, None)
    assert (await hub.api("PATCH", f"{REPO}/check-runs/1", json={})).status == 404
    await hub.sandbox.drain()


async def test_comments_create_list_update(hub: Hub) -> None:
    made = await hub.api("POST", f"{REPO}/issues/12/comments", json={"body": "Hello"})
    assert made.status == 201
    comment = await made.json()
    assert comment["user"]["login"] == "klaud-cold[bot]"
    assert comment["user"]["type"] == "Bot"
    assert comment["performed_via_github_app"]["slug"] == "klaud-cold"
    assert made.headers["Location"] == comment["url"]
    listed = await hub.json("GET", f"{REPO}/issues/12/comments")
    assert [c["body"] for c in listed] == ["Hello"]
    patched = await hub.json("PATCH", f"{REPO}/issues/comments/{comment['id']}", json={"body": "Bye"})
    assert patched["body"] == "Bye"
    assert hub.state()["comments"][0]["body"] == "Bye"
    assert (await hub.api("POST", f"{REPO}/issues/12/comments", json={})).status == 422
    assert (await hub.api("POST", f"{REPO}/issues/77/comments", json={"body": "x"})).status == 404
    assert (await hub.api("POST", f"{REPO}/issues/12/comments", data=b"{nope",
                          headers={"Content-Type": "application/json"})).status == 400
    await hub.sandbox.drain()


async def test_bodies_and_check_outputs_over_githubs_limits_are_422(hub: Hub) -> None:
    longest = "x" * 65_536
    made = await hub.api("POST", f"{REPO}/issues/12/comments", json={"body": longest})
    assert made.status == 201
    too_long = await hub.api("POST", f"{REPO}/issues/12/comments", json={"body": longest + "x"})
    assert too_long.status == 422 and "body is too long" in (await too_long.json())["errors"][0]["message"]
    comment = await made.json()
    assert (await hub.api("PATCH", f"{REPO}/issues/comments/{comment['id']}", json={"body": longest + "x"})).status == 422
    assert (await hub.api("POST", f"{REPO}/issues", json={"title": "t", "body": longest + "x"})).status == 422
    head = hub.state()["pulls"][0]["head_sha"]
    for summary, status in (("s" * 65_535, 201), ("s" * 65_536, 422)):
        output = {"title": "t", "summary": summary}
        check = await hub.api("POST", f"{REPO}/check-runs", json={"name": "x", "head_sha": head, "output": output})
        assert check.status == status
    await hub.sandbox.drain()


async def test_reactions_201_then_200_for_the_same(hub: Hub) -> None:
    acted = await hub.act(action="comment", repo="acme/bench", number=12, user="alice",
                          body="/klaud retry")
    path = f"{REPO}/issues/comments/{acted['comment_id']}/reactions"
    first = await hub.api("POST", path, json={"content": "eyes"})
    assert first.status == 201
    assert (await first.json())["user"]["login"] == "klaud-cold[bot]"
    second = await hub.api("POST", path, json={"content": "eyes"})
    assert second.status == 200
    assert (await second.json())["id"] == (await first.json())["id"]
    assert (await hub.api("POST", path, json={"content": "party"})).status == 422
    assert hub.state()["reactions"] == [
        {"comment_id": acted["comment_id"], "content": "eyes", "user": "klaud-cold[bot]"}]
    comment = await hub.json("GET", f"{REPO}/issues/comments/{acted['comment_id']}")
    assert comment["reactions"]["eyes"] == 1 and comment["reactions"]["total_count"] == 1


@pytest.mark.parametrize(
    ("user", "permission", "role"),
    [("alice", "admin", "admin"), ("bob", "write", "write"), ("carol", "read", "read"),
     ("mo", "write", "maintain"), ("mallory", "none", "none")],
)
async def test_collaborator_permission(hub: Hub, user: str, permission: str, role: str) -> None:
    answer = await hub.json("GET", f"{REPO}/collaborators/{user}/permission")
    assert answer["permission"] == permission
    assert answer["role_name"] == role
    assert answer["user"]["login"] == user


def git_blob_sha(text: str) -> str:
    data = text.encode()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


async def test_the_repository_comment_listing_filters_sorts_and_hides_issues_without_permission(hub: Hub) -> None:
    first = await hub.json("POST", f"{REPO}/issues/12/comments", status=201, json={"body": "on the PR"})
    hub.sandbox.clock.advance(60)
    issue = await hub.json("POST", f"{REPO}/issues", status=201, json={"title": "t", "body": "b"})
    second = await hub.json("POST", f"{REPO}/issues/{issue['number']}/comments", status=201,
                            json={"body": "on the issue"})
    listed = await hub.json("GET", f"{REPO}/issues/comments")
    assert [c["id"] for c in listed] == [first["id"], second["id"]]  # by id, ascending
    assert listed[1]["issue_url"].endswith(f"/issues/{issue['number']}")
    newest = await hub.json("GET", f"{REPO}/issues/comments?sort=created")
    assert [c["id"] for c in newest] == [second["id"], first["id"]]  # `sort` alone: descending
    since = await hub.json("GET", f"{REPO}/issues/comments?since={second['created_at']}")
    assert [c["id"] for c in since] == [second["id"]]
    assert (await hub.api("GET", f"{REPO}/issues/comments?sort=comments")).status == 422
    minted = await hub.json("POST", "/app/installations/1/access_tokens", status=201,
                            json={"permissions": {"pull_requests": "read"}})
    hub.token = f"token {minted['token']}"
    only_pulls = await hub.json("GET", f"{REPO}/issues/comments")
    assert [c["id"] for c in only_pulls] == [first["id"]]


async def test_a_check_run_summary_is_measured_in_utf8_bytes_as_github_does(hub: Hub) -> None:
    head = hub.state()["head_sha"]
    summary = "\u2705" * 30_000  # 30,000 characters, 90,000 bytes
    refused = await hub.api("POST", f"{REPO}/check-runs",
                            json={"name": "x", "head_sha": head, "output": {"title": "t", "summary": summary}})
    assert refused.status == 422
    assert (await refused.json())["message"] == "summary exceeds a maximum bytesize of 65535"
    fits = {"title": "t", "summary": "\u2705" * 21_845}  # 65,535 bytes
    await hub.json("POST", f"{REPO}/check-runs", status=201, json={"name": "x", "head_sha": head, "output": fits})


@pytest.fixture
async def crowded() -> AsyncIterator[Hub]:
    """A configs folder of 1,200 notes before its master config."""
    scenario = small_scenario()
    repo_of(scenario)["files"].update({f"configs/aaa-{number:04d}.md": "notes\n" for number in range(1_200)})
    async for served in serve(Sandbox(scenario)):
        yield served


async def test_a_folder_lists_its_first_1000_entries_and_its_tree_lists_them_all(crowded: Hub) -> None:
    # GitHub: "This API has an upper limit of 1,000 files for a directory. If you need to
    # retrieve more files, use the Git Trees API."
    listed = await crowded.json("GET", f"{REPO}/contents/configs")
    assert len(listed) == 1_000 and "configs/nvidia-master.yaml" not in {e["path"] for e in listed}
    root = await crowded.json("GET", f"{REPO}/git/trees/main")
    [configs] = [e for e in root["tree"] if e["path"] == "configs"]
    assert configs["type"] == "tree"
    folder = await crowded.json("GET", f"{REPO}/git/trees/{configs['sha']}")
    assert folder["sha"] == configs["sha"]
    names = {e["path"] for e in folder["tree"]}
    assert len(names) == 1_202 and "nvidia-master.yaml" in names and "runners.yaml" in names
    assert (await crowded.api("GET", f"{REPO}/git/trees/{'0' * 40}")).status == 404


async def test_a_folder_tree_a_listing_named_is_found_without_hashing_every_commit(
    hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What this catches: each such read hashed every folder of every commit (seconds after a
    # few hundred pushes, on the event loop of `klaud serve --sandbox`).
    from bot.sandbox import rest

    for number in range(30):
        await hub.act(action="push_default", repo="acme/bench", user="bob", files={"docs/n.md": f"{number}\n"})
    root = await hub.json("GET", f"{REPO}/git/trees/main")
    [configs] = [e for e in root["tree"] if e["path"] == "configs"]
    hashed: list[str] = []
    original = rest.folder_sha
    monkeypatch.setattr(rest, "folder_sha", lambda tree, folder: hashed.append(folder) or original(tree, folder))
    folder = await hub.json("GET", f"{REPO}/git/trees/{configs['sha']}")
    assert folder["sha"] == configs["sha"] and "nvidia-master.yaml" in {e["path"] for e in folder["tree"]}
    assert hashed == ["configs"]  # its own id, once: not a search
    assert (await hub.api("GET", f"{REPO}/git/trees/{'0' * 40}")).status == 404
