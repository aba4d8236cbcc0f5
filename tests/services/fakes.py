"""An in-memory repository implementing `bot.services.api.RepoAPI` (bedevere's FakeGH, typed).

Tests give it files, pull requests, runs and artifacts, run a service, and read back what
was asked (`calls`, one `(operation, *arguments)` per call) and what was written
(`branches`, `dispatched`, `comments`, `check_runs`, …). Failures are injected per
operation with `fail(operation, error, times)`; `dispatches_unanswered` dispatches are
applied and then answered with a timeout, as when GitHub's answer is lost.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from bot.core.doctor import REQUIRED_EVENTS, REQUIRED_PERMISSIONS
from bot.core.events import (
    Account,
    Artifact,
    ArtifactRun,
    BlameRange,
    Comment,
    EditedIssue,
    HeadOrBase,
    Issue,
    Job,
    ListedComment,
    Named,
    PullFile,
    PullRequest,
    PullRequestEvent,
    Repository,
    WorkflowRun,
)
from bot.github.errors import GitHubError, NotFound, Unavailable

DEFAULT_BRANCH = "main"


def sha(n: int) -> str:
    return f"{n:040x}"


def pull(
    number: int,
    *,
    user: str = "bob",
    head_ref: str | None = None,
    head_sha: str | None = None,
    updated_at: datetime,
    repo: str = "acme/bench",
    title: str = "",
    draft: bool = False,
) -> PullRequest:
    return PullRequest(
        number=number,
        title=title or f"PR {number}",
        draft=draft,
        user=Account(login=user, type="Bot" if user.endswith("[bot]") else "User"),
        head=HeadOrBase(ref=head_ref or f"topic-{number}", sha=head_sha or sha(1000 + number), repo=Named(full_name=repo)),
        base=HeadOrBase(ref=DEFAULT_BRANCH, sha=sha(1)),
        created_at=updated_at,
        updated_at=updated_at,
    )


def pull_event(action: str, number: int, *, updated_at: datetime, **changes: Any) -> PullRequestEvent:
    """A `pull_request` event of `pull(number, …)` (closed when the action says so)."""
    data = pull(number, updated_at=updated_at, **changes).model_dump(mode="json")
    if action == "closed":
        data["state"] = "closed"
    return PullRequestEvent.model_validate(
        {"action": action, "pull_request": data, "repository": {"full_name": "acme/bench"}, "installation": {"id": 1}}
    )


def artifact_zip(outcome: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("candidate-diagnostics.json", json.dumps({"candidate-outcome": outcome}))
    return buffer.getvalue()


@dataclass
class FakeRepo:
    name: str = "acme/bench"
    id: int = 4242
    default_branch: str = DEFAULT_BRANCH
    head: str = sha(1)
    pushed_at: datetime | None = None  # GitHub's: the last push to any branch
    files: dict[str, dict[str, str]] = field(default_factory=dict)  # ref -> path -> text
    pulls: dict[int, PullRequest] = field(default_factory=dict)
    merge_bases: dict[tuple[str, str], str] = field(default_factory=dict)  # (base, head) -> another than base
    pull_files_of: dict[int, list[PullFile]] = field(default_factory=dict)
    branches_at: dict[str, str] = field(default_factory=dict)  # branch -> sha
    runs: dict[int, WorkflowRun] = field(default_factory=dict)
    jobs_of: dict[int, list[Job]] = field(default_factory=dict)
    artifacts_of: dict[int, list[Artifact]] = field(default_factory=dict)
    archives: dict[int, bytes] = field(default_factory=dict)  # artifact id -> zip
    comments_on: dict[int, list[Comment]] = field(default_factory=dict)
    edited_at: dict[int, datetime] = field(default_factory=dict)  # comment id -> when last edited
    permissions: dict[str, str] = field(default_factory=dict)
    blames: dict[str, list[BlameRange]] = field(default_factory=dict)  # path -> ranges at any ref
    issues: dict[int, Issue] = field(default_factory=dict)
    editors: dict[int, str] = field(default_factory=dict)  # issue number -> who last edited its body
    moves: dict[str, datetime] = field(default_factory=dict)  # sha -> when the default branch moved to it
    workflows: set[str] = field(default_factory=lambda: {"klaud-candidate.yml"})
    answer_run_ids: bool = True  # False: dispatch answers like an older server (204)
    dispatches_unanswered: int = 0  # the next N dispatches start their run, then time out
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    dispatched: list[dict[str, Any]] = field(default_factory=list)
    check_runs: dict[int, dict[str, Any]] = field(default_factory=dict)
    reactions: list[tuple[int, str]] = field(default_factory=list)
    _failures: dict[str, list[GitHubError]] = field(default_factory=dict)
    _next_id: int = 9000

    # -- test set-up ---------------------------------------------------------------------

    def put_files(self, files: dict[str, str], ref: str | None = None) -> None:
        self.files.setdefault(ref or self.head, {}).update(files)

    def fail(self, operation: str, error: GitHubError, times: int = 1) -> None:
        self._failures.setdefault(operation, []).extend([error] * times)

    def clear_failures(self, operation: str) -> None:
        self._failures.pop(operation, None)

    def reads(self) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] in READS]

    def writes(self) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] not in READS]

    def _call(self, operation: str, *args: Any) -> None:
        self.calls.append((operation, *args))
        pending = self._failures.get(operation)
        if pending:
            raise pending.pop(0)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    # -- RepoAPI -------------------------------------------------------------------------

    async def repository(self) -> Repository:
        self._call("repository")
        return Repository(full_name=self.name, id=self.id, default_branch=self.default_branch, pushed_at=self.pushed_at)

    async def head_sha(self, branch: str) -> str:
        self._call("head_sha", branch)
        return self.head

    async def moved_to_at(self, branch: str, sha: str) -> datetime | None:
        self._call("moved_to_at", branch, sha)
        return self.moves.get(sha) if branch == self.default_branch else None

    async def file_text(self, path: str, ref: str) -> str | None:
        self._call("file_text", path, ref)
        return self.files.get(ref, {}).get(path)

    async def directory(self, path: str, ref: str, *, nested: bool = False) -> list[str]:
        self._call("directory", path, ref)
        prefix = f"{path}/" if path else ""
        return sorted(p for p in self.files.get(ref, {})
                      if p.startswith(prefix) and (nested or "/" not in p[len(prefix):]))

    async def changed_paths(self, base: str, head: str) -> set[str] | None:
        self._call("changed_paths", base, head)
        if base not in self.files:
            return None
        old, new = self.files[base], self.files.get(head, {})
        return {p for p in old.keys() | new.keys() if old.get(p) != new.get(p)}

    async def open_pulls(self) -> AsyncIterator[PullRequest]:
        self._call("open_pulls")
        for number in sorted(self.pulls):
            yield self.pulls[number]

    async def merge_base(self, base: str, head: str) -> str | None:
        self._call("merge_base", base, head)
        return self.merge_bases.get((base, head), base)

    async def pull(self, number: int) -> PullRequest | None:
        self._call("pull", number)
        return self.pulls.get(number)

    async def pull_files(self, number: int) -> AsyncIterator[PullFile]:
        self._call("pull_files", number)
        for item in self.pull_files_of.get(number, []):
            yield item

    async def branches(self, prefix: str) -> AsyncIterator[tuple[str, str]]:
        self._call("branches", prefix)
        for branch, at in sorted(self.branches_at.items()):
            if branch.startswith(prefix):
                yield branch, at

    async def create_branch(self, branch: str, sha: str) -> bool:
        self._call("create_branch", branch, sha)
        if branch in self.branches_at:
            return False
        self.branches_at[branch] = sha
        return True

    async def delete_branch(self, branch: str) -> bool:
        self._call("delete_branch", branch)
        return self.branches_at.pop(branch, None) is not None

    async def dispatch(self, workflow: str, branch: str, inputs: dict[str, str]) -> int | None:
        self._call("dispatch", workflow, branch, inputs.get("candidate"))
        if workflow not in self.workflows:
            raise GitHubError(404, "Not Found")
        run_id = self._new_id()
        self.runs[run_id] = WorkflowRun(
            id=run_id, path=f".github/workflows/{workflow}", head_sha=self.head, status="queued",
            display_title=f"Klaud Cold candidate {inputs.get('candidate')}", event="workflow_dispatch",
        )
        self.dispatched.append({"workflow": workflow, "branch": branch, "inputs": inputs, "run_id": run_id})
        if self.dispatches_unanswered:
            self.dispatches_unanswered -= 1
            raise Unavailable(None, "ServerTimeoutError: answer lost", maybe_applied=True)
        return run_id if self.answer_run_ids else None

    async def workflow_runs(self, workflow: str, *, created_since: date, active: bool = False) -> AsyncIterator[WorkflowRun]:
        self._call("workflow_runs", workflow, "active" if active else "completed")
        for run in self.runs.values():
            # GitHub's `created=>=DATE` filter; a run made here without a time is always listed.
            listed = run.created_at is None or run.created_at.date() >= created_since
            if listed and run.path.endswith(f"/{workflow}") and (run.status != "completed") == active:
                yield run

    async def run(self, run_id: int) -> WorkflowRun | None:
        self._call("run", run_id)
        return self.runs.get(run_id)

    async def run_jobs(self, run_id: int) -> list[Job]:
        self._call("run_jobs", run_id)
        return list(self.jobs_of.get(run_id, []))

    async def run_artifacts(self, run_id: int) -> AsyncIterator[Artifact]:
        self._call("run_artifacts", run_id)
        for item in self.artifacts_of.get(run_id, []):
            yield item

    async def artifacts(self) -> AsyncIterator[Artifact]:
        self._call("artifacts")
        for run_id in sorted(self.artifacts_of, reverse=True):
            for item in self.artifacts_of[run_id]:
                yield item.model_copy(update={"workflow_run": ArtifactRun(id=run_id)})

    async def artifact(self, artifact_id: int) -> Artifact | None:
        self._call("artifact", artifact_id)
        return next((a for items in self.artifacts_of.values() for a in items if a.id == artifact_id), None)

    async def download(self, artifact: Artifact, *, max_bytes: int) -> bytes:
        self._call("download", artifact.id)
        return self.archives[artifact.id]

    async def create_check_run(self, payload: dict[str, Any]) -> int | None:
        self._call("create_check_run", payload["head_sha"])
        check_id = self._new_id()
        self.check_runs[check_id] = dict(payload)
        return check_id

    async def update_check_run(self, check_run_id: int, payload: dict[str, Any]) -> None:
        self._call("update_check_run", check_run_id)
        self.check_runs[check_run_id].update(payload)

    async def check_run_on(self, head_sha: str, name: str) -> int | None:
        self._call("check_run_on", head_sha)
        found = [i for i, run in self.check_runs.items() if run.get("head_sha") == head_sha and run.get("name") == name]
        return max(found, default=None)

    async def react(self, comment_id: int, content: str) -> None:
        self._call("react", comment_id, content)
        self.reactions.append((comment_id, content))

    async def comments(self, number: int) -> AsyncIterator[Comment]:
        self._call("comments", number)
        for comment in self.comments_on.get(number, []):
            yield comment

    async def comments_since(self, since: datetime) -> AsyncIterator[ListedComment]:
        self._call("comments_since", since)
        listed = [
            ListedComment(
                **c.model_dump(), issue_url=f"https://api.github.com/repos/{self.name}/issues/{number}",
                updated_at=self.edited_at.get(c.id, c.created_at),
            )
            for number, comments in self.comments_on.items() for c in comments
        ]
        # By update time, as Klaud asks (`sort=updated&direction=asc`): GitHub filters by it
        # too. A comment made here without a time is always listed, first.
        listed = [c for c in listed if c.updated_at is None or c.updated_at >= since]
        for comment in sorted(listed, key=lambda c: (c.updated_at is not None, c.updated_at or since, c.id)):
            yield comment

    async def post_comment(self, number: int, body: str) -> None:
        self._call("post_comment", number)
        comment = Comment(id=self._new_id(), body=body, user=Account(login="klaud-cold[bot]", type="Bot"))
        self.comments_on.setdefault(number, []).append(comment)

    async def permission(self, user: str) -> tuple[str | None, str | None]:
        self._call("permission", user)
        return self.permissions.get(user, "none"), None

    async def blame(self, path: str, ref: str) -> list[BlameRange]:
        self._call("blame", path, ref)
        return list(self.blames.get(path, []))

    async def find_issue(self, title: str, creator: str) -> Issue | None:
        self._call("find_issue", title, creator)
        return next(
            (i for i in self.issues.values() if i.title == title and i.user is not None and i.user.login == creator),
            None,
        )

    async def create_issue(self, title: str, body: str) -> int:
        self._call("create_issue", title)
        number = self._new_id()
        self.issues[number] = Issue(number=number, title=title, body=body, user=Account(login="klaud-cold[bot]", type="Bot"))
        return number

    async def edited_issue(self, number: int) -> EditedIssue | None:
        self._call("edited_issue", number)
        issue = self.issues.get(number)
        if issue is None:
            return None
        editor = self.editors.get(number)
        # As GitHub's GraphQL names the editor: an App as a Bot, by its slug.
        named = {"__typename": "Bot" if editor.endswith("[bot]") else "User", "login": editor.removesuffix("[bot]")} if editor else None
        return EditedIssue.model_validate({"body": issue.body or "", "editor": named})

    async def update_issue(self, number: int, body: str) -> None:
        self._call("update_issue", number)
        if number not in self.issues:
            raise NotFound(404, "Not Found")
        self.issues[number] = self.issues[number].model_copy(update={"body": body, "state": "open"})


READS = frozenset(
    {
        "repository", "head_sha", "moved_to_at", "file_text", "directory", "changed_paths", "open_pulls", "pull_files",
        "branches", "workflow_runs", "run", "run_jobs", "run_artifacts", "artifacts", "artifact", "download",
        "comments", "comments_since", "edited_issue", "permission", "blame", "find_issue",
    }
)


@dataclass
class FakeRepos:
    """The App with one installation (id 1) holding the given repositories."""

    repos: dict[str, FakeRepo] = field(default_factory=dict)
    forgotten: list[int] = field(default_factory=list)  # installations whose client was dropped
    moved_to: dict[str, int] = field(default_factory=dict)  # repository -> another installation than 1

    async def installations(self) -> list[int]:
        return [1]

    async def repositories(self, installation: int) -> list[Repository]:
        # A renamed repository answers to its old name too (GitHub redirects): listed once.
        unique = {repo.id: repo for repo in self.repos.values()}
        return [Repository(full_name=repo.name, id=repo.id) for repo in sorted(unique.values(), key=lambda r: r.name)]

    def repo(self, full_name: str, installation: int) -> FakeRepo:
        return self.repos[full_name]

    async def repository_by_id(self, installation: int, repository_id: int) -> Repository | None:
        found = next((repo for repo in self.repos.values() if repo.id == repository_id), None)
        return None if found is None else Repository(full_name=found.name, id=found.id)

    async def installation_of(self, full_name: str) -> int | None:
        return self.moved_to.get(full_name.lower(), 1) if full_name in self.repos else None

    async def granted(self, full_name: str, installation: int) -> tuple[dict[str, str], list[str]]:
        return dict(REQUIRED_PERMISSIONS), sorted(REQUIRED_EVENTS)

    def forget_installation(self, installation: int) -> None:
        self.forgotten.append(installation)
