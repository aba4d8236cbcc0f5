"""What services need of GitHub, as Protocols (Kodiak's model: decisions over an interface).

`bot.github.repo.GitHubRepo` implements `RepoAPI` against the real API (or the sandbox);
`tests/services/fakes.py` implements it in memory, so every service is unit-tested without
a server. Answers are the typed models of `bot.core.events`; failures raise the errors of
`bot.github.errors`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import date, datetime
from typing import Any, Protocol

from bot.core.domain import CapacityReading
from bot.core.events import (
    Artifact,
    BlameRange,
    Comment,
    EditedIssue,
    Issue,
    Job,
    ListedComment,
    PullFile,
    PullRequest,
    Repository,
    WorkflowRun,
)


class RepoAPI(Protocol):
    """One repository, as the App's installation sees it."""

    name: str

    async def repository(self) -> Repository: ...

    async def head_sha(self, branch: str) -> str: ...

    async def moved_to_at(self, branch: str, sha: str) -> datetime | None:
        """When `branch` came to point at `sha` (a push, a force push, a merge), from the
        repository's activity; None when GitHub does not say (the move is not among the
        branch's latest, or the activity cannot be read)."""
        ...

    async def file_text(self, path: str, ref: str) -> str | None: ...

    async def directory(self, path: str, ref: str, *, nested: bool = False) -> list[str]:
        """Paths of the files in folder `path` at `ref` ([] when there is none); with
        `nested`, of the files in its folders too, at any depth."""
        ...

    async def changed_paths(self, base: str, head: str) -> set[str] | None: ...

    async def merge_base(self, base: str, head: str) -> str | None:
        """The commit GitHub diffs a pull request's head from (None when it cannot say)."""
        ...

    def open_pulls(self) -> AsyncIterator[PullRequest]: ...

    async def pull(self, number: int) -> PullRequest | None:
        """One pull request, open or not (None: GitHub has none of that number)."""
        ...

    def pull_files(self, number: int) -> AsyncIterator[PullFile]: ...

    def branches(self, prefix: str) -> AsyncIterator[tuple[str, str]]: ...

    async def create_branch(self, branch: str, sha: str) -> bool: ...

    async def delete_branch(self, branch: str) -> bool: ...

    async def dispatch(self, workflow: str, branch: str, inputs: dict[str, str]) -> int | None: ...

    def workflow_runs(
        self, workflow: str, *, created_since: date, active: bool = False
    ) -> AsyncIterator[WorkflowRun]:
        """Runs of `workflow` created since a day: completed ones, or with `active` the others."""
        ...

    async def run(self, run_id: int) -> WorkflowRun | None: ...

    async def run_jobs(self, run_id: int) -> list[Job]: ...

    def run_artifacts(self, run_id: int) -> AsyncIterator[Artifact]: ...

    def artifacts(self) -> AsyncIterator[Artifact]:
        """Every artifact of the repository, newest first."""
        ...

    async def artifact(self, artifact_id: int) -> Artifact | None: ...

    async def download(self, artifact: Artifact, *, max_bytes: int) -> bytes: ...

    async def create_check_run(self, payload: dict[str, Any]) -> int | None: ...

    async def update_check_run(self, check_run_id: int, payload: dict[str, Any]) -> None: ...

    async def check_run_on(self, head_sha: str, name: str) -> int | None:
        """The newest check run called `name` on `head_sha`, if there is one."""
        ...

    async def react(self, comment_id: int, content: str) -> None: ...

    def comments(self, number: int) -> AsyncIterator[Comment]: ...

    def comments_since(self, since: datetime) -> AsyncIterator[ListedComment]: ...

    async def post_comment(self, number: int, body: str) -> None: ...

    async def permission(self, user: str) -> tuple[str | None, str | None]: ...

    async def blame(self, path: str, ref: str) -> list[BlameRange]:
        """Which commit last changed each line of `path` at `ref` (one GraphQL query)."""
        ...

    async def find_issue(self, title: str, creator: str) -> Issue | None:
        """The issue titled `title` that `creator` opened: an open one, else the newest closed
        one, if there is one."""
        ...

    async def create_issue(self, title: str, body: str) -> int | None: ...

    async def edited_issue(self, number: int) -> EditedIssue | None:
        """The issue's body now and its last editor; None when there is no such issue."""
        ...

    async def update_issue(self, number: int, body: str) -> None:
        """Set the body of issue `number`, and open it again if it was closed."""
        ...


class ReposAPI(Protocol):
    """The App's installations and their repositories."""

    async def installations(self) -> list[int]: ...

    async def repositories(self, installation: int) -> list[Repository]: ...

    def repo(self, full_name: str, installation: int) -> RepoAPI: ...

    async def repository_by_id(self, installation: int, repository_id: int) -> Repository | None:
        """The repository with GitHub's id `repository_id` as the installation sees it now
        (renamed, transferred), or None when it sees none."""
        ...

    async def installation_of(self, full_name: str) -> int | None:
        """The installation the App reaches the repository through now, as GitHub says to the
        App itself (None: not installed)."""
        ...

    async def granted(self, full_name: str, installation: int) -> tuple[dict[str, str], list[str]]:
        """The permissions and events the repository's installation granted the App."""
        ...

    def forget_installation(self, installation: int) -> None:
        """Drop what is kept to call GitHub as `installation` (uninstalled, none of its
        repositories kept): its client, cache and token."""
        ...


class CapacitySource(Protocol):
    """Which clusters may take work now (`capacity_feed.CapacityFeed` reads the real feed)."""

    async def read(self) -> CapacityReading: ...
