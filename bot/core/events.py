"""Typed models of what GitHub sends and answers, holding only the fields Klaud reads.

A webhook payload is parsed once by its handler into one of the `*Event` models below and
that model is passed on; the GitHub client parses its answers into the same models
(`PullRequest` from `GET …/pulls` and from a `pull_request` event are one type), so a
service never sees GitHub's raw JSON. A payload that lacks a field Klaud needs, or holds a
value of the wrong type (`"notatime"` for a time, a list for a name), fails validation,
which the inbox treats as permanent: the delivery is marked failed at once with the reason.
Fields GitHub adds are ignored.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bot.core.domain import TIME_RANGE, UtcTime, parse_time

# GitHub's ids are 64-bit; anything larger is not an id GitHub made.
MAX_ID = 2**63 - 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


GitHubId = Annotated[int, Field(ge=0, le=MAX_ID)]


class Named(_Model):
    full_name: str = Field(pattern=r"^[^/\s]+/[^/\s]+$", max_length=200)
    # What stays when the repository is renamed or transferred (events name it by its
    # name at the time they were sent).
    id: GitHubId | None = None


class Installation(_Model):
    id: GitHubId


class Account(_Model):
    login: str | None = None
    type: str | None = None  # "User", "Bot", "Organization"


class Label(_Model):
    name: str = ""


class RepoEvent(_Model):
    """Every repository event Klaud handles names its repository and installation."""

    repository: Named
    installation: Installation


# -- pull requests ---------------------------------------------------------------------


class HeadOrBase(_Model):
    ref: str
    sha: str
    repo: Named | None = None  # null when the fork was deleted


class PullRequest(_Model):
    number: GitHubId
    state: str = "open"
    title: str = ""
    draft: bool = False
    labels: tuple[Label, ...] = ()
    user: Account
    head: HeadOrBase
    base: HeadOrBase
    created_at: UtcTime
    updated_at: UtcTime

    @field_validator("draft", mode="before")
    @classmethod
    def _null_draft(cls, value: Any) -> Any:
        # Older GitHub Enterprise versions send `draft: null` for a normal PR.
        return False if value is None else value


class PullRequestEvent(RepoEvent):
    action: str
    pull_request: PullRequest


class PullFile(_Model):
    """One entry of `GET …/pulls/{n}/files`; `patch` is absent for large or binary diffs."""

    filename: str
    status: str = "modified"
    patch: str | None = None
    previous_filename: str | None = None


# -- pushes ----------------------------------------------------------------------------


# The first epoch second past the years Klaud plans with (`domain.TIME_RANGE`).
EPOCH_END = datetime(TIME_RANGE[1] + 1, 1, 1, tzinfo=UTC).timestamp()


class PushedRepository(Named):
    # Push payloads give `pushed_at` in epoch seconds (other events, and some servers'
    # pushes, give ISO text): read as epoch seconds either way; anything else is unknown.
    pushed_at: float | None = None

    @field_validator("pushed_at", mode="before")
    @classmethod
    def _epoch_seconds(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                parsed = parse_time(value)
            except ValueError:
                return None
            return None if parsed is None else parsed.timestamp()
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        # Past the years Klaud plans with, the time would be dropped with its family at
        # the next load (`as_utc`), or fail the push: unknown, as a missing one is.
        return value if numeric and 0 <= value < EPOCH_END else None


class PushEvent(RepoEvent):
    repository: PushedRepository
    ref: str
    after: str
    before: str | None = None
    deleted: bool = False
    sender: Account | None = None


# -- workflow runs ---------------------------------------------------------------------


class WorkflowRun(_Model):
    id: GitHubId
    path: str = ""
    head_sha: str = ""
    run_attempt: int = 1
    display_title: str | None = None
    status: str | None = None
    conclusion: str | None = None
    event: str | None = None
    created_at: UtcTime | None = None
    updated_at: UtcTime | None = None
    run_started_at: UtcTime | None = None  # when this attempt of the run started


class WorkflowRunEvent(RepoEvent):
    action: str
    workflow_run: WorkflowRun


class ArtifactRun(_Model):
    id: GitHubId


class Artifact(_Model):
    id: GitHubId
    name: str = ""
    expired: bool = True  # a missing flag counts as expired (domain §4.2)
    archive_download_url: str | None = None
    created_at: UtcTime | None = None
    workflow_run: ArtifactRun | None = None


class Step(_Model):
    name: str = ""
    conclusion: str | None = None


class Job(_Model):
    name: str = ""
    conclusion: str | None = None
    steps: tuple[Step, ...] = ()


# -- comments, issues, check runs -------------------------------------------------------


class Comment(_Model):
    id: GitHubId
    body: str | None = None
    user: Account
    created_at: UtcTime | None = None


class ListedComment(Comment):
    """A comment as the repository's comment listing gives it, naming its issue or PR by URL."""

    issue_url: str = ""
    updated_at: UtcTime | None = None

    @property
    def edited(self) -> bool:
        return self.updated_at is not None and self.created_at is not None and self.updated_at > self.created_at

    @property
    def issue_number(self) -> int | None:
        tail = self.issue_url.rsplit("/", 1)[-1]
        return int(tail) if tail.isascii() and tail.isdigit() else None


class Issue(_Model):
    number: GitHubId
    title: str = ""
    body: str | None = None
    state: str = "open"
    user: Account | None = None


class GraphQLAccount(Account):
    """An account as GitHub's GraphQL names it (`login`, `__typename`), read as its REST
    login: GraphQL names an App by its slug, webhooks and Klaud's settings by the slug and
    "[bot]" (a person whose login is an App's slug is not that App)."""

    @model_validator(mode="before")
    @classmethod
    def _rest_login(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        kind, login = data.get("__typename"), data.get("login")
        if kind == "Bot" and isinstance(login, str) and login and not login.endswith("[bot]"):
            login = f"{login}[bot]"
        return {"login": login, "type": kind}


class ContentEdit(_Model):
    edited_at: UtcTime | None = Field(default=None, alias="editedAt")
    editor: GraphQLAccount | None = None


class ContentEdits(_Model):
    total: int = Field(default=0, alias="totalCount")
    nodes: list[ContentEdit | None] | None = None  # GitHub's schema lets both be null


# Between this host's clock (a render's time) and GitHub's whole seconds (an edit's).
EDIT_CLOCK_SKEW = timedelta(minutes=1)


class EditedIssue(_Model):
    """An issue's body as it is now, who last edited it, and both ends of its edit history
    (GraphQL: GitHub's REST API does not say who edited an issue)."""

    body: str = ""
    editor: GraphQLAccount | None = None
    first_edits: ContentEdits | None = Field(default=None, alias="firstEdits")
    last_edits: ContentEdits | None = Field(default=None, alias="lastEdits")

    def editors_since(self, moment: datetime | None) -> list[str] | None:
        """Who edited the body from about `moment` on (a minute before it, in whole
        seconds: an edit just after it may carry an earlier time), or None when that is
        not known: no history, an edit listed without its time or editor (a deleted
        account), no `moment`, or more edits than the two ends of the history hold where
        some may fall after it."""
        if moment is None or self.first_edits is None or self.last_edits is None:
            return None
        pages: list[list[tuple[datetime, str]]] = []
        for page in (self.first_edits, self.last_edits):
            edits = [(e.edited_at, e.editor.login) for e in page.nodes or () if e and e.edited_at and e.editor and e.editor.login]
            if page.nodes is None or len(edits) < len(page.nodes):
                return None
            pages.append(edits)
        since = moment.replace(microsecond=0) - EDIT_CLOCK_SKEW
        total = max(self.first_edits.total, self.last_edits.total)
        # What the two ends leave out is older than every edit of the newest end: all
        # before `since` once one of those is.
        newest = max(pages, key=lambda page: max((at for at, _ in page), default=since))
        if len(pages[0]) + len(pages[1]) < total and not any(at < since for at, _ in newest):
            return None
        return sorted({login for at, login in pages[0] + pages[1] if at >= since})


class IssueCommentEvent(RepoEvent):
    action: str
    comment: Comment
    issue: Issue


class BodyChange(_Model):
    before: str | None = Field(default=None, alias="from")


class IssueChanges(_Model):
    body: BodyChange | None = None


class IssuesEvent(RepoEvent):
    action: str
    issue: Issue
    sender: Account
    changes: IssueChanges | None = None


class CheckRun(_Model):
    name: str
    head_sha: str


class CheckRunEvent(RepoEvent):
    action: str
    check_run: CheckRun


class CheckSuite(_Model):
    head_sha: str


class CheckSuiteEvent(RepoEvent):
    action: str
    check_suite: CheckSuite


class RepositoryDispatchEvent(RepoEvent):
    action: str


class RepositoryEvent(RepoEvent):
    """`repository`: Klaud reads which repository (its id), what it is called now and, when
    edited, what changed (a new default branch)."""

    action: str
    changes: dict[str, Any] = Field(default_factory=dict)


# -- installations ---------------------------------------------------------------------


class Hook(_Model):
    events: tuple[str, ...] = ()


class PingEvent(_Model):
    """GitHub's check of a hook it just created or edited (an App's ping has no repository)."""

    hook_id: GitHubId | None = None
    hook: Hook | None = None


class InstallationEvent(_Model):
    action: str
    installation: Installation
    repositories: tuple[Named, ...] | None = None


class InstallationRepositoriesEvent(_Model):
    action: str
    installation: Installation
    repositories_added: tuple[Named, ...] = ()
    repositories_removed: tuple[Named, ...] = ()


# -- Klaud's own requests ----------------------------------------------------------------

# An event Klaud stores in its own inbox and GitHub never sends (the webhook listener refuses
# it): a replica that may not reconcile a repository another one holds (DESIGN §6) asks the
# holder to, through the inbox, which hands each repository's deliveries to its owner.
RECONCILE_REQUEST = "klaud_reconcile"


# "ensure": reconcile it only if the holder keeps no state of it (a discovery's request).
RequestAction = Literal["light", "full", "ensure"]


class ReconcileRequest(RepoEvent):
    action: RequestAction


class BlameRange(_Model):
    """Lines `start`..`end` (1-based, inclusive) of a file were last changed by a commit of `committed`."""

    start: int = Field(alias="startingLine")
    end: int = Field(alias="endingLine")
    committed: UtcTime


class RefActivity(_Model):
    """One entry of `GET /repos/{owner}/{repo}/activity`: a ref moved (pushed, force
    pushed, merged into, created or deleted) at `timestamp`."""

    ref: str = ""
    after: str = ""
    timestamp: UtcTime | None = None
    activity_type: str = ""


class Repository(_Model):
    """`GET /repos/{owner}/{repo}` and the entries of `GET /installation/repositories`."""

    full_name: str
    id: GitHubId | None = None
    default_branch: str = "main"
    pushed_at: UtcTime | None = None  # the last push to any branch
