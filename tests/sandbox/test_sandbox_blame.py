"""Repository history, blame computed from it, and the GraphQL API that answers it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from bot.sandbox import Sandbox, ScenarioError
from bot.sandbox.blame import blame
from bot.sandbox.gitdiff import kept_lines
from tests.sandbox.test_sandbox_support import (
    MASTER,
    Hub,
    repo_of,
    serve,
    small_scenario,
)

REPO = "/repos/acme/bench"
CONFIG = "configs/runners.yaml"
MASTER_LINES = len(MASTER.splitlines())
HISTORY: list[dict[str, Any]] = [
    {"at": "2026-01-01T00:00:00Z", "message": "Add runners",
     "files": {CONFIG: "labels:\n  b200:\n    - b200-nb_0\n", "old.txt": "old\n"}},
    {"at": "2026-02-01T00:00:00Z", "message": "Add h100", "author": "bob",
     "files": {CONFIG: "labels:\n  b200:\n    - b200-nb_0\n  h100:\n    - h100-cw_0\n",
               "old.txt": None}},
]
BLAME = """
query Blame($owner: String!, $name: String!, $ref: String!, $path: String!) {
  repository(owner: $owner, name: $name) {
    object(expression: $ref) {
      ... on Commit {
        blame(path: $path) { ranges { startingLine endingLine commit { oid committedDate } } }
      }
    }
  }
}
"""


def history_scenario(**settings: Any) -> dict[str, Any]:
    """The small scenario whose runners file has two commits of history; the head commit
    (its `files`) changes nothing in it."""
    scenario = small_scenario()
    repo = repo_of(scenario)
    repo["files"][CONFIG] = HISTORY[1]["files"][CONFIG]
    repo.update(history=HISTORY, **settings)
    return scenario


async def graphql(hub: Hub, query: str, **variables: Any) -> dict[str, Any]:
    answer: dict[str, Any] = await hub.json(
        "POST", "/graphql", json={"query": query, "variables": variables})
    return answer


async def ranges(hub: Hub, ref: str = "main", path: str = CONFIG) -> list[tuple[int, int, str]]:
    answer = await graphql(hub, BLAME, owner="acme", name="bench", ref=ref, path=path)
    assert "errors" not in answer, answer
    found = answer["data"]["repository"]["object"]["blame"]["ranges"]
    return [(r["startingLine"], r["endingLine"], r["commit"]["committedDate"]) for r in found]


@pytest.fixture
async def history() -> AsyncIterator[Hub]:
    async for hub in serve(Sandbox(history_scenario())):
        yield hub


def test_kept_lines_are_the_lines_git_leaves_alone() -> None:
    assert kept_lines("a\nb\nc\n", "a\nx\nc\nd\n") == [(0, 0), (2, 2)]
    assert kept_lines("", "a\n") == [] and kept_lines("a\n", "") == []
    assert kept_lines("a\nb", "a\nb\n") == [(0, 0)]  # a new final newline changes that line


async def test_history_commits_come_before_the_head(history: Hub) -> None:
    head = await history.json("GET", f"{REPO}/commits/main")
    assert head["commit"]["author"]["date"] == "2026-11-30T07:59:00Z"  # a minute before now
    second = await history.json("GET", f"{REPO}/commits/{head['parents'][0]['sha']}")
    assert (second["commit"]["message"], second["commit"]["author"]["name"]) == ("Add h100", "bob")
    assert {(f["filename"], f["status"]) for f in second["files"]} == {
        (CONFIG, "modified"), ("old.txt", "removed")}
    first = await history.json("GET", f"{REPO}/commits/{second['parents'][0]['sha']}")
    assert (first["commit"]["author"]["date"], first["parents"]) == ("2026-01-01T00:00:00Z", [])
    assert first["commit"]["author"]["name"] == "alice"  # the first admin
    assert (await history.api("GET", f"{REPO}/contents/old.txt")).status == 404


async def test_without_history_the_head_is_a_year_old(hub: Hub) -> None:
    head = await hub.json("GET", f"{REPO}/commits/main")
    assert head["commit"]["author"]["date"] == "2025-11-30T08:00:00Z"
    assert head["parents"] == []


async def test_blame_carries_each_line_to_the_commit_that_wrote_it(history: Hub) -> None:
    assert await ranges(history) == [(1, 3, "2026-01-01T00:00:00Z"),
                                     (4, 5, "2026-02-01T00:00:00Z")]
    # The head commit's own files are its lines.
    assert await ranges(history, path="configs/nvidia-master.yaml") == [
        (1, MASTER_LINES, "2026-11-30T07:59:00Z")]


async def test_pushes_during_a_test_are_history_dated_by_the_clock(history: Hub) -> None:
    before = history.state()["head_sha"]
    history.sandbox.clock.advance(3600)
    text = HISTORY[1]["files"][CONFIG].replace("b200-nb_0", "b200-nb_1")
    await history.act(action="push_default", repo="acme/bench", files={CONFIG: text})
    assert await ranges(history) == [(1, 2, "2026-01-01T00:00:00Z"),
                                     (3, 3, "2026-11-30T09:00:00Z"),
                                     (4, 5, "2026-02-01T00:00:00Z")]
    assert await ranges(history, ref=before) == [(1, 3, "2026-01-01T00:00:00Z"),
                                                 (4, 5, "2026-02-01T00:00:00Z")]


async def test_merged_lines_belong_to_the_pull_requests_commit_not_the_merge() -> None:
    async for hub in serve(Sandbox(small_scenario())):
        hub.sandbox.clock.advance(600)
        await hub.act(action="close_pull", repo="acme/bench", number=12, merged=True)
        found = await ranges(hub, path="configs/nvidia-master.yaml")
        assert found == [(1, 1, "2025-11-30T08:00:00Z"),
                         (2, 2, "2026-11-29T10:00:00Z"),  # the pull request's head commit
                         (3, MASTER_LINES, "2025-11-30T08:00:00Z")]


def test_blame_of_an_absent_file_is_none() -> None:
    sandbox = Sandbox(history_scenario())
    repo = sandbox.world.repo("acme/bench")
    assert blame(repo, repo.head_sha, "old.txt") is None
    first = repo.commits[repo.head.parents[0]].parents[0]
    [only] = blame(repo, first, "old.txt") or []
    assert (only.start, only.end, only.commit.message) == (1, 1, "Add runners")


@pytest.mark.parametrize(
    ("history", "complaint"),
    [
        (list(reversed(HISTORY)), "in the order of their `at` times"),
        ([{"at": "2026-11-30T07:59:30Z", "message": "late", "files": {}}],
         "history must end before its head commit"),
    ],
)
def test_history_must_be_in_order_and_before_the_head(
    history: list[dict[str, Any]], complaint: str
) -> None:
    scenario = small_scenario()
    repo_of(scenario)["history"] = history
    with pytest.raises(ScenarioError, match=complaint):
        Sandbox(scenario)


# --- the GraphQL language ------------------------------------------------------------


async def test_aliases_fragments_typename_and_directives(history: Hub) -> None:
    query = """
    # A comment, commas, a named fragment, an alias and @skip.
    query ($skipTitle: Boolean = true) {
      repo: repository(owner: "acme", name: "bench") {
        nameWithOwner, __typename
        head: object(expression: "main") { __typename ...Who }
        file: object(expression: "main:configs/runners.yaml") {
          ... on Blob { byteSize text @skip(if: $skipTitle) }
        }
        missing: object(expression: "no-such-branch") { oid }
      }
    }
    fragment Who on Commit { abbreviatedOid author { name user { login } } }
    """
    answer = await graphql(history, query)
    repo = answer["data"]["repo"]
    assert (repo["nameWithOwner"], repo["__typename"]) == ("acme/bench", "Repository")
    assert repo["head"]["__typename"] == "Commit" and len(repo["head"]["abbreviatedOid"]) == 7
    assert repo["head"]["author"] == {"name": "alice", "user": {"login": "alice"}}
    assert repo["file"] == {"byteSize": len(HISTORY[1]["files"][CONFIG])}
    assert repo["missing"] is None and "errors" not in answer


@pytest.mark.parametrize(
    ("query", "variables", "message"),
    [
        ("{ repository(owner: \"acme\", name: \"bench\") { nope } }", {},
         "Field 'nope' doesn't exist on type 'Repository'"),
        ("{ repository(owner: \"acme\", name: \"bench\") { object(expression: \"main\") "
         + "{ blame(path: \"x\") { ranges { age } } } } }", {},
         "Field 'blame' doesn't exist on type 'GitObject'"),
        ("{ repository(owner: \"acme\") { name } }", {},
         "Field 'repository' is missing required arguments: name"),
        ("{ repository(owner: \"acme\", name: \"bench\", colour: 1) { name } }", {},
         "Field 'repository' doesn't accept argument 'colour'"),
        ("{ repository(owner: \"acme\", name: \"bench\") { name { x } } }", {},
         "Selections can't be made on scalars"),
        ("{ repository(owner: \"acme\", name: \"bench\") { object(expression: \"main\") } }",
         {}, "Field must have selections"),
        ("query { repository(owner: $o, name: \"bench\") { name } }", {},
         "Variable $o is used by anonymous query but not declared"),
        ("query Q($o: String!) { repository(owner: $o, name: \"bench\") { name } }", {},
         "Variable $o of type String! was provided invalid value"),
        ("{ repository(owner: \"acme\", name: \"bench\") { ...Gone } }", {},
         "Fragment Gone was used, but not defined"),
        ("{ repository(owner: \"acme\", name: \"bench\") { ... on Commit { oid } } }", {},
         "Fragment on Commit can't be spread inside Repository"),
        ("{ repository(owner: \"acme\" name: \"bench\") { name }", {},
         'Parse error on "end of file" at [1, 51]'),
        ("mutation { addStar { x } }", {}, "The sandbox answers queries, not mutations"),
    ],
)
async def test_invalid_queries_are_refused_before_running(
    history: Hub, query: str, variables: dict[str, Any], message: str
) -> None:
    answer = await graphql(history, query, **variables)
    assert "data" not in answer
    assert any(message in error["message"] for error in answer["errors"]), answer


async def test_unknown_repositories_and_paths_are_graphql_errors(history: Hub) -> None:
    nowhere = await graphql(history, BLAME, owner="acme", name="nope", ref="main", path=CONFIG)
    assert nowhere["data"] == {"repository": None}
    [error] = nowhere["errors"]
    assert (error["type"], error["path"]) == ("NOT_FOUND", ["repository"])
    assert error["message"] == "Could not resolve to a Repository with the name 'acme/nope'."
    no_file = await graphql(history, BLAME, owner="acme", name="bench", ref="main",
                            path="old.txt")
    # blame is non-null, so the commit holding it is null instead.
    assert no_file["data"] == {"repository": {"object": None}}
    assert no_file["errors"][0]["path"] == ["repository", "object", "blame"]
    assert no_file["errors"][0]["type"] == "NOT_FOUND"


async def test_blame_needs_contents_read() -> None:
    async for hub in serve(Sandbox(history_scenario(permissions={"pull_requests": "read"}))):
        answer = await graphql(hub, BLAME, owner="acme", name="bench", ref="main", path=CONFIG)
        assert answer["data"] == {"repository": {"object": None}}
        [error] = answer["errors"]
        assert (error["type"], error["message"]) == (
            "FORBIDDEN", "Resource not accessible by integration")


async def test_a_request_that_is_no_graphql_request_is_400(history: Hub) -> None:
    assert (await history.api("POST", "/graphql", json={"variables": {}})).status == 400
    refused = await history.api("POST", "/graphql", json={"query": "{ x }", "variables": [1]})
    assert refused.status == 400
    answer = await history.api("POST", "/graphql", json={"query": BLAME, "variables": {
        "owner": "acme", "name": "bench", "ref": "main", "path": CONFIG}})
    assert answer.headers["x-ratelimit-resource"] == "graphql"


ISSUE_EDIT = "query($owner: String!, $name: String!, $number: Int!) { repository(owner: $owner, name: $name) " \
    "{ issue(number: $number) { number body lastEditedAt editor { login } } } }"


async def test_an_issue_says_who_last_edited_its_body(history: Hub) -> None:
    made = await history.json("POST", f"{REPO}/issues", status=201, json={"title": "t", "body": "b"})
    fresh = await graphql(history, ISSUE_EDIT, owner="acme", name="bench", number=made["number"])
    assert fresh["data"]["repository"]["issue"] == {"number": made["number"], "body": "b", "lastEditedAt": None,
                                                    "editor": None}
    await history.act(action="edit_issue", repo="acme/bench", number=made["number"], user="alice", body="- [x] ticked")
    edited = await graphql(history, ISSUE_EDIT, owner="acme", name="bench", number=made["number"])
    issue = edited["data"]["repository"]["issue"]
    assert (issue["body"], issue["editor"]) == ("- [x] ticked", {"login": "alice"}) and issue["lastEditedAt"]
    # A pull request's number is no issue here, as on GitHub.
    pull = await graphql(history, ISSUE_EDIT, owner="acme", name="bench", number=12)
    assert pull["data"] == {"repository": {"issue": None}} and pull["errors"][0]["type"] == "NOT_FOUND"


EDITOR_KIND = "query($owner: String!, $name: String!, $number: Int!) { repository(owner: $owner, name: $name) " \
    "{ issue(number: $number) { editor { __typename login } " \
    "userContentEdits(first: 5) { nodes { editor { __typename login } } } } } }"


async def test_an_app_edits_as_a_bot_named_by_its_slug_and_a_person_as_a_user(history: Hub) -> None:
    # As GitHub's GraphQL: an App is a Bot whose login is its slug (its REST login without
    # "[bot]"); Klaud reads it back as its REST login (`GraphQLAccount`).
    made = await history.json("POST", f"{REPO}/issues", status=201, json={"title": "t", "body": "b"})
    await history.json("PATCH", f"{REPO}/issues/{made['number']}", json={"body": "by the app"})
    await history.act(action="edit_issue", repo="acme/bench", number=made["number"], user="alice", body="by alice")
    issue = (await graphql(history, EDITOR_KIND, owner="acme", name="bench", number=made["number"]))["data"]["repository"]["issue"]
    alice, app = {"__typename": "User", "login": "alice"}, {"__typename": "Bot", "login": "klaud-cold"}
    assert issue["editor"] == alice
    assert issue["userContentEdits"]["nodes"] == [{"editor": alice}, {"editor": app}]


EDITS = "query($owner: String!, $name: String!, $number: Int!) { repository(owner: $owner, name: $name) " \
    "{ issue(number: $number) { newest: userContentEdits(first: 1) { totalCount nodes { editor { login } } } " \
    "oldest: userContentEdits(last: 1) { nodes { editor { login } } } } } }"


async def test_an_issue_lists_its_body_edits_newest_first_and_refuses_an_unbounded_page(history: Hub) -> None:
    made = await history.json("POST", f"{REPO}/issues", status=201, json={"title": "t", "body": "b"})
    for user, body in (("alice", "one"), ("bob", "two")):
        await history.act(action="edit_issue", repo="acme/bench", number=made["number"], user=user, body=body)
    answer = await graphql(history, EDITS, owner="acme", name="bench", number=made["number"])
    issue = answer["data"]["repository"]["issue"]
    assert issue["newest"] == {"totalCount": 2, "nodes": [{"editor": {"login": "bob"}}]}
    assert issue["oldest"] == {"nodes": [{"editor": {"login": "alice"}}]}
    unbounded = EDITS.replace("userContentEdits(first: 1)", "userContentEdits")
    refused = await graphql(history, unbounded, owner="acme", name="bench", number=made["number"])
    assert "exactly one of `first` or `last`" in refused["errors"][0]["message"]


async def test_blame_follows_a_master_config_renamed_unchanged_as_git_and_github_do() -> None:
    # `git mv configs/nvidia-master.yaml configs/nv-master.yaml`, nothing else. git blame
    # ("the origin of lines is automatically followed across whole-file renames") and
    # GitHub's blame date the lines by the commits that wrote them, not by the rename.
    scenario = small_scenario()
    repo = repo_of(scenario)
    master = repo["files"].pop("configs/nvidia-master.yaml")
    repo["files"]["configs/nv-master.yaml"] = master
    repo["history"] = [
        {"at": "2026-01-01T00:00:00Z", "message": "Add configs",
         "files": {"configs/nvidia-master.yaml": master}},
        {"at": "2026-02-01T00:00:00Z", "message": "Rename the config",
         "files": {"configs/nvidia-master.yaml": None, "configs/nv-master.yaml": master}},
    ]
    async for hub in serve(Sandbox(scenario)):
        assert await ranges(hub, path="configs/nv-master.yaml") == [
            (1, MASTER_LINES, "2026-01-01T00:00:00Z")]
