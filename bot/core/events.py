"""Minimal models of the webhook payloads Klaud reads, holding only the fields it uses.

A payload that lacks one of them fails validation, which the inbox treats as permanent: the
delivery is marked failed at once with the reason instead of being retried. Fields GitHub
adds are ignored.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore")


class Named(_Model):
    full_name: str


class Installation(_Model):
    id: int


class Login(_Model):
    login: str | None = None


class RepoEvent(_Model):
    """Every repository event Klaud handles names its repository and installation."""

    repository: Named
    installation: Installation


class HeadOrBase(_Model):
    ref: str
    sha: str
    repo: Named | None = None  # null when the fork was deleted


class PullRequest(_Model):
    number: int
    state: str
    head: HeadOrBase
    base: HeadOrBase
    user: Login
    updated_at: str | None = None


class PullRequestEvent(RepoEvent):
    action: str
    pull_request: PullRequest


class PushEvent(RepoEvent):
    ref: str
    after: str
    before: str | None = None
    deleted: bool = False


class WorkflowRun(_Model):
    id: int
    path: str
    head_sha: str
    run_attempt: int = 1
    display_title: str | None = None


class WorkflowRunEvent(RepoEvent):
    action: str
    workflow_run: WorkflowRun


class Comment(_Model):
    id: int
    body: str | None = None
    user: Login


class Issue(_Model):
    number: int


class IssueCommentEvent(RepoEvent):
    action: str
    comment: Comment
    issue: Issue


class CheckRun(_Model):
    name: str
    head_sha: str


class CheckRunEvent(RepoEvent):
    action: str
    check_run: CheckRun


class InstallationEvent(_Model):
    action: str
    installation: Installation
    repositories: list[Named] | None = None


class InstallationRepositoriesEvent(_Model):
    action: str
    installation: Installation
    repositories_added: list[Named] = []
    repositories_removed: list[Named] = []


def check(model: type[_Model], data: dict[str, Any]) -> Any:
    """Validate `data` against `model` (raises pydantic.ValidationError: a permanent error)."""
    return model.model_validate(data)
