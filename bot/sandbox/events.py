"""Webhook payloads, shaped like GitHub's own (octokit-webhooks examples).

Every payload an App receives carries `repository`, `sender` and `installation`, plus
`organization` when the repository belongs to one.
"""

from __future__ import annotations

from typing import Any

from bot.sandbox.shapes import Shapes
from bot.sandbox.state import (
    CheckRun,
    Commit,
    IssueComment,
    PullRequest,
    RepoState,
    WorkflowRun,
)
from bot.sandbox.world import Event, World


class Payloads:
    def __init__(self, world: World) -> None:
        self.world = world
        self.shapes: Shapes = world.shapes()

    def envelope(
        self, repo: RepoState, sender: str, fields: dict[str, Any], push: bool = False
    ) -> dict[str, Any]:
        payload = dict(fields)
        payload["repository"] = (
            self.shapes.push_repository(repo) if push else self.shapes.repository(repo)
        )
        if repo.owner_type == "Organization":
            payload["organization"] = self.shapes.organization(repo)
        payload["sender"] = self.shapes.user(sender)
        payload["installation"] = self.shapes.installation_ref(repo.installation_id)
        return payload

    def pull_request(
        self, repo: RepoState, pull: PullRequest, action: str, sender: str, **extra: Any
    ) -> Event:
        fields = {
            "action": action,
            "number": pull.number,
            "pull_request": self.shapes.pull_request(repo, pull),
            **extra,
        }
        return Event("pull_request", self.envelope(repo, sender, fields))

    def push(
        self, repo: RepoState, before: Commit | None, after: Commit | None, pusher: str, *, ref: str | None = None
    ) -> Event:
        """A push to `ref` (the default branch unless named). A ref created (`before` None)
        or deleted (`after` None) through the API, as Klaud does with its claim refs, brings
        no new commits."""
        zero = "0" * 40
        listed: list[dict[str, Any]] = []
        forced = False
        head_commit = None
        if before is not None and after is not None:
            after_line = repo.ancestors(after.sha)
            known = set(repo.ancestors(before.sha))
            commits = sorted((repo.commits[sha] for sha in after_line if sha not in known), key=lambda c: c.seq)
            listed = [self.shapes.push_commit(repo, c, repo.commit_changes(c)) for c in commits]
            forced = before.sha not in after_line
            head_commit = listed[-1] if listed else None
        elif after is not None:
            head_commit = self.shapes.push_commit(repo, after, [])
        before_sha, after_sha = before.sha if before else zero, after.sha if after else zero
        fields = {
            "ref": ref or repo.default_ref,
            "before": before_sha,
            "after": after_sha,
            "created": before is None,
            "deleted": after is None,
            "forced": forced,
            "base_ref": None,
            "compare": f"{self.shapes.web}/{repo.full_name}/compare/{before_sha[:12]}...{after_sha[:12]}",
            "commits": listed,
            "head_commit": head_commit,
            "pusher": {"name": pusher, "email": f"{pusher}@users.noreply.github.com"},
        }
        return Event("push", self.envelope(repo, pusher, fields, push=True))

    def issue_comment(self, repo: RepoState, comment: IssueComment, action: str = "created") -> Event:
        fields = {
            "action": action,
            "issue": self.shapes.issue(repo, comment.issue_number),
            "comment": self.shapes.comment(repo, comment),
        }
        return Event("issue_comment", self.envelope(repo, comment.user, fields))

    def issues(self, repo: RepoState, number: int, action: str, sender: str,
               **extra: Any) -> Event:
        fields = {"action": action, "issue": self.shapes.issue(repo, number), **extra}
        return Event("issues", self.envelope(repo, sender, fields))

    def workflow_run(self, repo: RepoState, run: WorkflowRun, action: str) -> Event:
        fields = {
            "action": action,
            "workflow_run": self.shapes.workflow_run(repo, run),
            "workflow": self.shapes.workflow(repo, run.workflow),
        }
        return Event("workflow_run", self.envelope(repo, run.actor, fields))

    def check_run(self, repo: RepoState, check: CheckRun, action: str, sender: str) -> Event:
        fields = {"action": action, "check_run": self.shapes.check_run(repo, check)}
        return Event("check_run", self.envelope(repo, sender, fields))

    def check_suite(self, repo: RepoState, checks: list[CheckRun], action: str,
                    sender: str) -> Event:
        fields = {"action": action, "check_suite": self.shapes.check_suite(repo, checks)}
        return Event("check_suite", self.envelope(repo, sender, fields))

    def repository(self, repo: RepoState, action: str, sender: str, **extra: Any) -> Event:
        """`repository` (renamed: `changes.repository.name.from` holds the old name)."""
        return Event("repository", self.envelope(repo, sender, {"action": action, **extra}))

    def listed(self, repo: RepoState) -> dict[str, Any]:
        """A repository as installation events list it."""
        return {key: self.shapes.minimal_repository(repo)[key]
                for key in ("id", "node_id", "name", "full_name", "private")}

    def installation(self, repo: RepoState, action: str, sender: str,
                     repos: list[RepoState] | None = None) -> Event:
        """`installation` (created, deleted: with the repositories; suspend, unsuspend:
        without), on the installation of `repo`. No `repository`, as on GitHub."""
        payload: dict[str, Any] = {"action": action,
                                   "installation": self.world.installation_shape(self.shapes, repo)}
        if repos is not None:
            payload["repositories"] = [self.listed(r) for r in repos]
        payload["sender"] = self.shapes.user(sender)
        return Event("installation", payload)

    def installation_repositories(self, action: str, sender: str, added: list[RepoState],
                                  removed: list[RepoState]) -> Event:
        """`installation_repositories` added or removed, on the installation of the
        repositories it names (it carries no `repository` of its own, as on GitHub)."""
        payload = {
            "action": action,
            "installation": self.world.installation_shape(self.shapes, (added + removed)[0]),
            "repository_selection": "selected",
            "repositories_added": [self.listed(r) for r in added],
            "repositories_removed": [self.listed(r) for r in removed],
            "requester": None,
            "sender": self.shapes.user(sender),
        }
        return Event("installation_repositories", payload)

    def repository_dispatch(
        self, repo: RepoState, event_type: str, client_payload: dict[str, Any], sender: str
    ) -> Event:
        fields = {
            "action": event_type,
            "branch": repo.default_branch,
            "client_payload": client_payload,
        }
        return Event("repository_dispatch", self.envelope(repo, sender, fields))
