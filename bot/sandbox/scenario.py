"""The scenario file: the sandbox's starting state (DESIGN §5 "Scenario file").

A scenario crosses a boundary (a file written by people, or a dict from a test), so it is
validated with pydantic and a mistake is reported with the path of the offending key.
`load_scenario` answers the plain dict; `Sandbox` parses it again into these models.
"""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

BUNDLED_SCENARIO = Path(__file__).resolve().parent / "scenarios" / "demo.json"

SHA_PATTERN = r"^[0-9a-f]{40}$"
REPO_PATTERN = r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$"


def owner_of(full_name: str) -> str:
    """The account of a repository named `owner/name`."""
    return full_name.split("/")[0]


Permission = Literal["admin", "maintain", "write", "triage", "read", "none"]
# The head commit's age: just after a history, else a long-settled repository.
HEAD_AGE_AFTER_HISTORY = timedelta(minutes=1)
HEAD_AGE_WITHOUT_HISTORY = timedelta(days=365)
AppPermission = Literal["read", "write", "admin"]


class ScenarioError(ValueError):
    """The scenario file is unreadable or invalid; the message says where and why."""


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Cluster(Model):
    id: str
    status: str = "operational"
    stale: bool = False
    total: int
    allocated: int = 0
    mixed: int = 0
    idle: int = 0
    down: int = 0
    other: int = 0


class Capacity(Model):
    available: bool = True
    clusters: list[Cluster] = Field(default_factory=list)


class PullFile(Model):
    """One changed file of a pull request.

    `patch` absent: computed from `content` like `git diff` does. `patch: null`: GitHub
    omitted it (too large), the bot must fall back to the contents API.
    """

    filename: str
    status: Literal["added", "removed", "modified", "renamed", "copied", "changed"] = "modified"
    patch: str | None = None
    content: str | None = None
    previous_filename: str | None = None

    @property
    def patch_given(self) -> bool:
        return "patch" in self.model_fields_set


class Pull(Model):
    number: int | None = Field(default=None, gt=0)
    title: str
    user: str
    head_ref: str
    # A fork's full name when the head branch lives there (another account's copy of the
    # repository); without it the branch is the repository's own.
    head_repo: str | None = Field(default=None, pattern=REPO_PATTERN)
    head_sha: str | None = Field(default=None, pattern=SHA_PATTERN)
    base_ref: str | None = None
    body: str | None = None
    draft: bool = False
    labels: list[str] = Field(default_factory=list)
    created_at: AwareDatetime | None = None
    updated_at: AwareDatetime | None = None
    files: list[PullFile] = Field(default_factory=list)


class Artifact(Model):
    name: str
    expired: bool = False
    files: dict[str, Any] = Field(default_factory=dict)
    raw_zip_base64: str | None = None


RunStatus = Literal["queued", "in_progress", "completed"]
# GitHub's conclusions of a workflow run and of its jobs.
RunConclusion = Literal["action_required", "cancelled", "failure", "neutral", "skipped",
                        "stale", "success", "timed_out", "startup_failure"]
JobConclusion = Literal["action_required", "cancelled", "failure", "neutral", "skipped",
                        "success", "timed_out"]


class JobStep(Model):
    name: str
    conclusion: JobConclusion | None = None  # the job's when not given


class Job(Model):
    """One job of a run; without `status` it follows the run (completed when it is)."""

    name: str
    status: RunStatus | None = None
    conclusion: JobConclusion | None = None  # the run's when not given
    steps: list[JobStep] = Field(default_factory=list)


class RunFields(Model):
    id: int | None = Field(default=None, gt=0)
    head_sha: str | None = Field(default=None, pattern=SHA_PATTERN)
    head_branch: str | None = None
    # The fork a `pull_request` run's head comes from (its full name); the repository itself
    # when not given.
    head_repository: str | None = Field(default=None, pattern=REPO_PATTERN)
    event: str = "workflow_dispatch"
    conclusion: RunConclusion | None = None
    run_attempt: int = Field(default=1, ge=1)
    actor: str | None = None
    display_title: str | None = None
    pull_requests: list[int] = Field(default_factory=list)
    created_at: AwareDatetime | None = None
    completed_at: AwareDatetime | None = None
    artifacts: list[Artifact] = Field(default_factory=list)
    jobs: list[Job] = Field(default_factory=list)


class Run(RunFields):
    """A run of the scenario, or a new run finished by `complete_run`."""

    workflow: str
    status: RunStatus = "completed"


class FinishedRun(RunFields):
    """`complete_run`'s run: an existing run needs only its `id` (its workflow, title and
    head stay); a new one also needs `workflow`."""

    workflow: str | None = None


class RunRef(Model):
    id: int = Field(gt=0)


class Comment(Model):
    """A comment present before the scenario starts (no webhook is sent for it)."""

    number: int = Field(gt=0)
    user: str
    body: str
    created_at: AwareDatetime | None = None


class IssueSpec(Model):
    """A plain issue present before the scenario starts; it shares numbers with pulls."""

    number: int | None = Field(default=None, gt=0)
    title: str
    user: str
    body: str | None = None
    state: Literal["open", "closed"] = "open"
    labels: list[str] = Field(default_factory=list)
    created_at: AwareDatetime | None = None


class HistoryCommit(Model):
    """One commit before the scenario's head: the files it adds, changes or (null) deletes."""

    at: AwareDatetime
    message: str
    files: dict[str, str | None]
    author: str | None = None  # the first admin collaborator when not given


class Repository(Model):
    full_name: str = Field(pattern=REPO_PATTERN)
    installation_id: int = Field(gt=0)
    # False: the App is not installed on it (yet); `install_app` or `add_repositories` does.
    installed: bool = True
    owner_type: Literal["Organization", "User"] = "Organization"
    default_branch: str = "main"
    private: bool = True
    files: dict[str, str] = Field(default_factory=dict)
    # Commits applied in order before the head commit, which applies `files` on top.
    history: list[HistoryCommit] = Field(default_factory=list)
    collaborators: dict[str, Permission] = Field(default_factory=dict)
    # The installation's; without them, app.yaml's default_permissions / default_events.
    permissions: dict[str, AppPermission] | None = None
    events: list[str] | None = None
    pulls: list[Pull] = Field(default_factory=list)
    runs: list[Run] = Field(default_factory=list)
    issues: list[IssueSpec] = Field(default_factory=list)
    comments: list[Comment] = Field(default_factory=list)

    @model_validator(mode="after")
    def _history_in_order(self) -> Repository:
        times = [commit.at for commit in self.history]
        if times != sorted(times):
            raise ValueError("history commits must be in the order of their `at` times")
        return self


# --- control actions (also the scenario's timeline) -------------------------------------


class OpenPull(Model):
    action: Literal["open_pull"]
    repo: str
    pull: Pull


class PushPull(Model):
    action: Literal["push_pull"]
    repo: str
    number: int
    files: list[PullFile]
    head_sha: str | None = Field(default=None, pattern=SHA_PATTERN)


class EditPull(Model):
    action: Literal["edit_pull"]
    repo: str
    number: int
    title: str | None = None
    body: str | None = None
    draft: bool | None = None
    labels: list[str] | None = None
    # Another branch of the repository to merge into (GitHub's "Edit" next to the title).
    base: str | None = Field(default=None, min_length=1)
    user: str | None = None


class ClosePull(Model):
    action: Literal["close_pull"]
    repo: str
    number: int
    merged: bool = False
    user: str | None = None


class AddComment(Model):
    action: Literal["comment"]
    repo: str
    number: int = Field(gt=0)
    user: str
    body: str


class CompleteRun(Model):
    action: Literal["complete_run"]
    repo: str
    run: FinishedRun


class StartRun(Model):
    action: Literal["start_run"]
    repo: str
    run: RunRef


class EditIssue(Model):
    """A person edits a plain issue (`issues` edited)."""

    action: Literal["edit_issue"]
    repo: str
    number: int = Field(gt=0)
    user: str
    body: str | None = None
    title: str | None = None


class RerequestCheck(Model):
    """A person asks to re-run one check run (`check_run` rerequested)."""

    action: Literal["rerequest_check"]
    repo: str
    check_run_id: int = Field(gt=0)
    user: str


class RerequestSuite(Model):
    """A person asks to re-run every check of a commit (`check_suite` rerequested)."""

    action: Literal["rerequest_suite"]
    repo: str
    head_sha: str = Field(pattern=SHA_PATTERN)
    user: str


class PushDefault(Model):
    action: Literal["push_default"]
    repo: str
    files: dict[str, str | None]
    user: str | None = None
    message: str | None = None
    # A force-push: the new commit goes on top of this earlier commit, and what the default
    # branch had after it is dropped (the push event says `forced: true`).
    onto: str | None = Field(default=None, pattern=SHA_PATTERN)


class RenameRepository(Model):
    """An admin renames the repository (its owner stays): GitHub answers the old name's
    API routes with a redirect from then on and sends `repository` renamed."""

    action: Literal["rename_repository"]
    repo: str
    name: str = Field(pattern=r"^[A-Za-z0-9._-]{1,100}$")
    user: str | None = None


class DeleteRepository(Model):
    """An admin deletes the repository: its API routes (and its old names') answer 404, no
    installation lists it, and GitHub sends `repository` deleted and, to an installation
    on selected repositories, `installation_repositories` removed."""

    action: Literal["delete_repository"]
    repo: str
    user: str | None = None


class InstallApp(Model):
    """An account's owner installs the App on some of its repositories (one installation's,
    none installed yet): `installation` created. The App uninstalled from the account
    before comes back under a new installation id, as on GitHub."""

    action: Literal["install_app"]
    repos: list[str] = Field(min_length=1)
    user: str | None = None


class AddRepositories(Model):
    """The owner gives an installed App more of the account's repositories:
    `installation_repositories` added."""

    action: Literal["add_repositories"]
    repos: list[str] = Field(min_length=1)
    user: str | None = None


class RemoveRepositories(Model):
    """The owner takes repositories away from the App (it keeps at least one):
    `installation_repositories` removed."""

    action: Literal["remove_repositories"]
    repos: list[str] = Field(min_length=1)
    user: str | None = None


class UninstallApp(Model):
    """The owner uninstalls the App: `installation` deleted; its tokens stop working."""

    action: Literal["uninstall_app"]
    installation_id: int = Field(gt=0)
    user: str | None = None


class SuspendApp(Model):
    """The App is suspended on the account (`installation` suspend) or that is lifted
    (`unsuspend`); meanwhile GitHub refuses its tokens and sends it no other webhook."""

    action: Literal["suspend_app", "unsuspend_app"]
    installation_id: int = Field(gt=0)
    user: str | None = None


class RepositoryDispatch(Model):
    action: Literal["dispatch"]
    repo: str
    event_type: str = Field(min_length=1)
    client_payload: dict[str, Any] = Field(default_factory=dict)
    user: str | None = None


class SetCapacity(Model):
    action: Literal["set_capacity"]
    capacity: Capacity


class AdvanceClock(Model):
    action: Literal["advance_clock"]
    seconds: float = Field(ge=0)


Action = Annotated[
    OpenPull
    | PushPull
    | EditPull
    | ClosePull
    | AddComment
    | EditIssue
    | RerequestCheck
    | RerequestSuite
    | CompleteRun
    | StartRun
    | PushDefault
    | RepositoryDispatch
    | RenameRepository
    | DeleteRepository
    | InstallApp
    | AddRepositories
    | RemoveRepositories
    | UninstallApp
    | SuspendApp
    | SetCapacity
    | AdvanceClock,
    Field(discriminator="action"),
]


class ActionEnvelope(Model):
    step: Action


class Scenario(Model):
    now: AwareDatetime
    seed: int = 0
    rate_limit: int = Field(default=5000, ge=1)
    capacity: Capacity = Field(default_factory=Capacity)
    repositories: list[Repository] = Field(default_factory=list)
    timeline: list[Action] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_installation_per_account(self) -> Scenario:
        # A GitHub App has one installation per account, and an installation is one
        # account's: the sandbox's install and add checks go by installation id.
        owners: dict[int, str] = {}
        ids: dict[str, int] = {}
        for repository in self.repositories:
            owner = owner_of(repository.full_name).lower()
            if owners.setdefault(repository.installation_id, owner) != owner:
                raise ValueError(f"{repository.full_name}: installation {repository.installation_id} is"
                                 f" another account's ({owners[repository.installation_id]})")
            if ids.setdefault(owner, repository.installation_id) != repository.installation_id:
                raise ValueError(f"{repository.full_name}: its account is installation {ids[owner]}'s;"
                                 " an account has one installation")
        return self

    @model_validator(mode="after")
    def _history_before_the_head(self) -> Scenario:
        head = self.now - HEAD_AGE_AFTER_HISTORY
        for repository in self.repositories:
            if repository.history and repository.history[-1].at >= head:
                raise ValueError(f"{repository.full_name}: history must end before its head "
                                 f"commit, one minute before now")
        return self


def describe(exc: ValidationError) -> str:
    """One line per problem, each naming the key path (`repositories.0.pulls.1.title`)."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or '(top level)'}: {err['msg']}"
        for err in exc.errors()
    )


def parse_scenario(data: Any, source: str = "scenario") -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: expected a JSON object at the top level")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(f"{source}: {describe(exc)}") from None


def parse_action(data: Any) -> Action:
    try:
        return ActionEnvelope.model_validate({"step": data}).step
    except ValidationError as exc:
        raise ScenarioError(describe(exc).replace("step.", "")) from None


# The bundled scenario is about 150 KB. Read no further: a file without end (/dev/zero, a
# pipe) or a huge one named by mistake would take all the memory there is.
MAX_SCENARIO_BYTES = 64 * 1024 * 1024


def load_scenario(path: str | Path | None = None) -> dict[str, Any]:
    """Read and validate a scenario file; None means the bundled demo scenario."""
    source = Path(path) if path is not None else BUNDLED_SCENARIO
    try:
        with source.open("rb") as file:
            raw = file.read(MAX_SCENARIO_BYTES + 1)
    except OSError as exc:
        raise ScenarioError(f"{source}: cannot read: {exc.strerror}") from None
    if len(raw) > MAX_SCENARIO_BYTES:  # before decoding: the cut may split a character
        raise ScenarioError(f"{source}: over {MAX_SCENARIO_BYTES} bytes (a scenario is a JSON file)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ScenarioError(f"{source}: not UTF-8 text (a scenario is a JSON file)") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScenarioError(
            f"{source}: not valid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise ScenarioError(f"{source}: JSON nested too deep") from None
    parse_scenario(data, str(source))
    return data
