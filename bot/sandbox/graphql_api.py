"""GitHub's GraphQL API (`POST /graphql`), the part that reads git: repositories, refs,
commits, blobs and blame.

A query like
    repository(owner: "acme", name: "bench") {
      object(expression: "main") { ... on Commit { blame(path: "configs/x.yaml") {
        ranges { startingLine endingLine commit { oid committedDate } } } } } }
answers `{"data": {"repository": {"object": {"blame": {"ranges": [...]}}}}}`, the blame
computed from the repository's history (`bot.sandbox.blame`). As on GitHub, the App
needs `metadata: read` to see the repository and `contents: read` for its git objects;
without them the field is null and an error of type FORBIDDEN says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bot.sandbox.blame import BlameRange, blame
from bot.sandbox.gate import ApiError
from bot.sandbox.graphql_engine import FieldDef, GraphQLError, Schema, run
from bot.sandbox.patches import blob_sha
from bot.sandbox.permissions import (
    CONTENTS_READ,
    ISSUES_READ,
    METADATA_READ,
    Needs,
    grants,
)
from bot.sandbox.rest import Call, Reply
from bot.sandbox.shapes import node_id, ts
from bot.sandbox.state import Commit, Issue, RepoState

WEB = "https://github.com"
# GitHub's blame `age`: 1 for the newest change of the file, 10 for the oldest.
AGE_STEPS = 9


class QueryRoot:
    """The value the `Query` type's fields resolve against."""


@dataclass(frozen=True)
class RepoNode:
    repo: RepoState


@dataclass(frozen=True)
class RefNode:
    repo: RepoState
    name: str  # refs/heads/main


@dataclass(frozen=True)
class CommitNode:
    repo: RepoState
    commit: Commit


@dataclass(frozen=True)
class BlobNode:
    repo: RepoState
    commit: Commit
    text: str


@dataclass(frozen=True)
class BlameNode:
    repo: RepoState
    ranges: list[BlameRange]


@dataclass(frozen=True)
class RangeNode:
    repo: RepoState
    range: BlameRange
    age: int


@dataclass(frozen=True)
class ActorNode:
    login: str
    at: datetime


@dataclass(frozen=True)
class UserNode:
    login: str


@dataclass(frozen=True)
class BotNode:
    login: str  # an App's slug


@dataclass(frozen=True)
class IssueNode:
    issue: Issue


@dataclass(frozen=True)
class EditsNode:
    """One page of an issue's body edits, newest first (`userContentEdits(first:|last:)`)."""

    edits: list[tuple[str, datetime]]
    total: int


@dataclass(frozen=True)
class EditNode:
    login: str
    at: datetime


def actor(login: str) -> UserNode | BotNode:
    """An account as GraphQL names it: an App as a Bot named by its slug, without its REST
    login's "[bot]"."""
    if login.endswith("[bot]"):
        return BotNode(login.removesuffix("[bot]"))
    return UserNode(login)


def content_edits(_call: Call, node: IssueNode, args: dict[str, Any]) -> EditsNode:
    first, last = args.get("first"), args.get("last")
    if (first is None) == (last is None):
        raise GraphQLError("You must provide exactly one of `first` or `last` to paginate userContentEdits.")
    count = first if first is not None else last
    if not isinstance(count, int) or not 0 <= count <= 100:
        raise GraphQLError("`first` and `last` must be between 0 and 100.")
    newest_first = list(reversed(node.issue.edits))
    page = newest_first[:count] if first is not None else newest_first[len(newest_first) - count:]
    return EditsNode(page, len(newest_first))


TYPE_NAMES: dict[type, str] = {
    QueryRoot: "Query", RepoNode: "Repository", RefNode: "Ref", CommitNode: "Commit",
    BlobNode: "Blob", BlameNode: "Blame", RangeNode: "BlameRange", ActorNode: "GitActor",
    UserNode: "User", BotNode: "Bot", IssueNode: "Issue", EditsNode: "UserContentEditConnection", EditNode: "UserContentEdit",
}


def type_of(value: Any) -> str:
    return TYPE_NAMES[type(value)]


# --- resolvers -------------------------------------------------------------------------


def forbid_unless(call: Call, repo: RepoState, needs: Needs) -> None:
    if not grants(call.world.permissions_for(call.token, repo), needs):
        raise GraphQLError("Resource not accessible by integration", type="FORBIDDEN")


def repository(call: Call, _root: QueryRoot, args: dict[str, Any]) -> RepoNode:
    full_name = f"{args['owner']}/{args['name']}"
    repo = call.world.repos.get(full_name.lower())
    if repo is None or not call.world.app_sees(repo, call.installation_id):
        raise GraphQLError(f"Could not resolve to a Repository with the name '{full_name}'.",
                           type="NOT_FOUND")
    forbid_unless(call, repo, METADATA_READ)
    return RepoNode(repo)


def git_object(call: Call, node: RepoNode, args: dict[str, Any]) -> CommitNode | BlobNode | None:
    """`object(expression:)`: a commit by ref or sha, or `REV:PATH` for a file's blob."""
    repo = node.repo
    forbid_unless(call, repo, CONTENTS_READ)
    expression = args.get("expression") or args.get("oid")
    if not isinstance(expression, str):
        raise GraphQLError("object needs an expression or an oid")
    revision, has_path, path = expression.partition(":")
    sha = repo.resolve(repo.default_branch if revision in ("HEAD", "") else revision)
    if sha is None:
        return None
    commit = repo.commits[sha]
    if not has_path:
        return CommitNode(repo, commit)
    text = commit.tree.get(path)
    return BlobNode(repo, commit, text) if text is not None else None


def repository_issue(call: Call, node: RepoNode, args: dict[str, Any]) -> IssueNode:
    """`issue(number:)`: a plain issue (a pull request's number is not resolved, as on GitHub)."""
    forbid_unless(call, node.repo, ISSUES_READ)
    issue = node.repo.issues.get(args["number"]) if isinstance(args["number"], int) else None
    if issue is None:
        raise GraphQLError(f"Could not resolve to an Issue with the number of {args['number']}.", type="NOT_FOUND")
    return IssueNode(issue)


def default_branch_ref(_call: Call, node: RepoNode, _args: dict[str, Any]) -> RefNode:
    return RefNode(node.repo, node.repo.default_ref)


def named_ref(_call: Call, node: RepoNode, args: dict[str, Any]) -> RefNode | None:
    name = str(args["qualifiedName"])
    full = name if name.startswith("refs/") else f"refs/heads/{name}"
    return RefNode(node.repo, full) if full in node.repo.refs else None


def ref_target(call: Call, node: RefNode, _args: dict[str, Any]) -> CommitNode:
    forbid_unless(call, node.repo, CONTENTS_READ)
    return CommitNode(node.repo, node.repo.commits[node.repo.refs[node.name]])


def commit_blame(_call: Call, node: CommitNode, args: dict[str, Any]) -> BlameNode:
    path = str(args["path"])
    ranges = blame(node.repo, node.commit.sha, path)
    if ranges is None:
        raise GraphQLError(f"Could not resolve to a file at '{path}'.", type="NOT_FOUND")
    return BlameNode(node.repo, ranges)


def blame_ranges(_call: Call, node: BlameNode, _args: dict[str, Any]) -> list[RangeNode]:
    dates = [r.commit.at for r in node.ranges]
    newest, oldest = (max(dates), min(dates)) if dates else (None, None)

    def age(at: datetime) -> int:
        if newest is None or oldest is None or newest == oldest:
            return 1
        return 1 + round(AGE_STEPS * (newest - at) / (newest - oldest))

    return [RangeNode(node.repo, r, age(r.commit.at)) for r in node.ranges]


def commit_url(node: CommitNode | BlobNode) -> str:
    return f"{WEB}/{node.repo.full_name}/commit/{node.commit.sha}"


def object_oid(node: CommitNode | BlobNode) -> str:
    return node.commit.sha if isinstance(node, CommitNode) else blob_sha(node.text)


def value(getter: Any, scalar: str = "String") -> FieldDef:
    """A scalar field read straight off its parent, taking no arguments."""
    return FieldDef(scalar, lambda _call, parent, _args: getter(parent))


# --- the schema ------------------------------------------------------------------------

GIT_OBJECT: dict[str, FieldDef] = {
    "oid": value(object_oid, "GitObjectID"),
    "abbreviatedOid": value(lambda n: object_oid(n)[:7]),
    "commitUrl": value(commit_url, "URI"),
}
ACTOR_FIELDS: dict[str, FieldDef] = {"login": value(lambda n: n.login)}
ACTOR = FieldDef("GitActor", lambda _c, n, _a: ActorNode(n.commit.author, n.commit.at))
SCHEMA = Schema(
    types={
        "Query": {
            "repository": FieldDef("Repository", repository,
                                   {"owner": True, "name": True, "followRenames": False}),
        },
        "Repository": {
            "id": value(lambda n: node_id("Repository", n.repo.id), "ID"),
            "name": value(lambda n: n.repo.name),
            "nameWithOwner": value(lambda n: n.repo.full_name),
            "isPrivate": value(lambda n: n.repo.private, "Boolean"),
            "url": value(lambda n: f"{WEB}/{n.repo.full_name}", "URI"),
            "object": FieldDef("GitObject", git_object, {"expression": False, "oid": False}),
            "defaultBranchRef": FieldDef("Ref", default_branch_ref),
            "ref": FieldDef("Ref", named_ref, {"qualifiedName": True}),
            "issue": FieldDef("Issue", repository_issue, {"number": True}),
        },
        "Issue": {
            "number": value(lambda n: n.issue.number, "Int"),
            "title": value(lambda n: n.issue.title),
            "body": value(lambda n: n.issue.body or ""),
            "lastEditedAt": value(lambda n: ts(n.issue.last_edited_at) if n.issue.last_edited_at else None, "DateTime"),
            "editor": FieldDef("Actor", lambda _c, n, _a: actor(n.issue.editor) if n.issue.editor else None),
            "userContentEdits": FieldDef("UserContentEditConnection", content_edits, {"first": False, "last": False}),
        },
        "UserContentEditConnection": {
            "totalCount": value(lambda n: n.total, "Int"),
            "nodes": FieldDef("UserContentEdit", lambda _c, n, _a: [EditNode(*e) for e in n.edits], is_list=True),
        },
        "UserContentEdit": {
            "editedAt": value(lambda n: ts(n.at), "DateTime"),
            "editor": FieldDef("Actor", lambda _c, n, _a: actor(n.login)),
        },
        "Ref": {
            "name": value(lambda n: n.name.split("/", 2)[2]),
            "prefix": value(lambda n: "/".join(n.name.split("/", 2)[:2]) + "/"),
            "target": FieldDef("GitObject", ref_target),
        },
        "GitObject": GIT_OBJECT,
        "Commit": {
            **GIT_OBJECT,
            "url": value(commit_url, "URI"),
            "message": value(lambda n: n.commit.message),
            "messageHeadline": value(lambda n: n.commit.message.split("\n", 1)[0]),
            "messageBody": value(lambda n: n.commit.message.partition("\n")[2].strip("\n")),
            "committedDate": value(lambda n: ts(n.commit.at), "DateTime"),
            "authoredDate": value(lambda n: ts(n.commit.at), "DateTime"),
            "author": ACTOR,
            "committer": ACTOR,
            "blame": FieldDef("Blame", commit_blame, {"path": True}, non_null=True),
        },
        "Blob": {
            **GIT_OBJECT,
            "text": value(lambda n: n.text),
            "byteSize": value(lambda n: len(n.text.encode("utf-8")), "Int"),
            "isBinary": value(lambda _n: False, "Boolean"),
            "isTruncated": value(lambda _n: False, "Boolean"),
        },
        "Blame": {
            "ranges": FieldDef("BlameRange", blame_ranges, non_null=True, is_list=True),
        },
        "BlameRange": {
            "startingLine": value(lambda n: n.range.start, "Int"),
            "endingLine": value(lambda n: n.range.end, "Int"),
            "age": value(lambda n: n.age, "Int"),
            "commit": FieldDef("Commit", lambda _c, n, _a: CommitNode(n.repo, n.range.commit),
                               non_null=True),
        },
        "GitActor": {
            "name": value(lambda n: n.login),
            "email": value(lambda n: f"{n.login}@users.noreply.github.com"),
            "date": value(lambda n: ts(n.at), "GitTimestamp"),
            "user": FieldDef("User", lambda _c, n, _a: UserNode(n.login)),
        },
        "Actor": ACTOR_FIELDS,
        "User": ACTOR_FIELDS,
        "Bot": ACTOR_FIELDS,
    },
    interfaces={"GitObject": frozenset({"Commit", "Blob"}), "Actor": frozenset({"User", "Bot"})},
    scalars=frozenset({"String", "Int", "Boolean", "ID", "URI", "DateTime", "GitTimestamp",
                       "GitObjectID"}),
    type_of=type_of,
)


# --- the route -------------------------------------------------------------------------


def graphql_query(call: Call) -> Reply:
    """`POST /graphql` {"query", "variables"?, "operationName"?}; errors answer 200, as
    GitHub's do, except a body that is no request at all."""
    query, variables = call.field("query"), call.field("variables")
    operation = call.field("operationName")
    if not isinstance(query, str):
        raise ApiError(400, "A query attribute must be specified and must be a string.")
    if variables is not None and not isinstance(variables, dict):
        raise ApiError(400, "Variables are invalid JSON.")
    answer = run(SCHEMA, QueryRoot(), query, variables or {},
                 operation if isinstance(operation, str) else None, call)
    return Reply(body=answer, headers={"x-ratelimit-resource": "graphql"})
