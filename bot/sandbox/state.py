"""The sandbox's repositories, held in memory.

Plain mutable records and the few git-like operations the REST routes and the control
actions share (commits, refs, ancestry, tree diffs, pull-request files). Nothing here
knows about HTTP or JSON shapes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import re
import zipfile
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, ClassVar

import yaml

from bot.sandbox import scenario as sc
from bot.sandbox.patches import (
    PatchError,
    apply_patch,
    blob_sha,
    compute_patch,
    count_changes,
)

# libyaml's loader when the wheel has it; the pure-Python one otherwise.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

ARTIFACT_RETENTION = timedelta(days=14)
SHA_RE = re.compile(r"^[0-9a-f]{40}$")
SHORT_SHA_RE = re.compile(r"^[0-9a-f]{7,39}$")


class SandboxError(ValueError):
    """A control action that cannot apply to the current state."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class Ids:
    """Deterministic id counters, one range per kind so ids never collide across kinds."""

    STARTS: ClassVar[dict[str, int]] = {
        "pull": 600_000_001,
        "comment": 1_000_000_001,
        "check_run": 2_000_000_001,
        "artifact": 3_000_000_001,
        "reaction": 4_000_000_001,
        "run": 5_000_000_001,
        "commit": 1,
        "workflow": 70_000_001,
        "check_suite": 8_000_000_001,
        "job": 6_000_000_001,
        "activity": 9_000_000_001,
    }

    def __init__(self) -> None:
        self._next = dict(self.STARTS)

    def next(self, kind: str) -> int:
        value = self._next[kind]
        self._next[kind] = value + 1
        return value

    def reserve(self, kind: str, used: int) -> None:
        """Make sure ids handed out later never repeat one a scenario fixed."""
        self._next[kind] = max(self._next[kind], used + 1)


@dataclass(frozen=True)
class RefMove:
    """A branch moved, as GitHub's repository activity lists it."""

    id: int
    ref: str
    before: str
    after: str
    kind: str  # "push", "force_push", "pr_merge"
    actor: str
    at: datetime


@dataclass
class Commit:
    sha: str
    tree: dict[str, str]
    parents: tuple[str, ...]
    message: str
    author: str
    at: datetime
    seq: int  # creation order, to pick the nearest merge base


@dataclass
class ChangedFile:
    filename: str
    status: str
    patch: str | None
    previous_filename: str | None
    additions: int
    deletions: int
    sha: str | None


@dataclass
class PullRequest:
    number: int
    id: int
    title: str
    body: str | None
    user: str
    head_ref: str
    head_sha: str
    base_ref: str
    base_sha: str
    draft: bool
    labels: list[str]
    created_at: datetime
    updated_at: datetime
    files: list[ChangedFile]
    state: str = "open"
    merged: bool = False
    merged_at: datetime | None = None
    merged_by: str | None = None
    merge_commit_sha: str | None = None
    closed_at: datetime | None = None
    head_shas: list[str] = field(default_factory=list)
    head_repo: str | None = None  # a fork's full name; None: the repository's own branch

    @property
    def head_owner(self) -> str | None:
        """The account whose fork holds the head branch (None: the repository's owner)."""
        return sc.owner_of(self.head_repo) if self.head_repo else None


@dataclass
class Issue:
    """A plain issue: from the scenario, made through the API, or made when a comment
    names a number that is neither a pull request nor an issue yet."""

    number: int
    id: int
    title: str
    user: str
    created_at: datetime
    body: str | None = None
    state: str = "open"
    labels: list[str] = field(default_factory=list)
    updated_at: datetime | None = None
    closed_at: datetime | None = None
    # Who last edited the body, and when (GraphQL's `editor` and `lastEditedAt`), and every
    # edit, oldest first (GraphQL's `userContentEdits`).
    editor: str | None = None
    last_edited_at: datetime | None = None
    edits: list[tuple[str, datetime]] = field(default_factory=list)

    @property
    def last_change(self) -> datetime:
        return self.updated_at or self.created_at


@dataclass
class Artifact:
    id: int
    name: str
    data: bytes
    expired_flag: bool
    created_at: datetime
    run_id: int

    def expired(self, now: datetime) -> bool:
        return self.expired_flag or now >= self.expires_at

    @property
    def expires_at(self) -> datetime:
        return self.created_at + ARTIFACT_RETENTION


@dataclass
class JobStep:
    name: str
    number: int
    status: str
    conclusion: str | None


@dataclass
class Job:
    id: int
    name: str
    status: str
    conclusion: str | None
    started_at: datetime
    completed_at: datetime | None
    steps: list[JobStep]


@dataclass
class WorkflowRun:
    id: int
    workflow: str  # file name under .github/workflows
    name: str
    head_sha: str
    head_branch: str | None
    event: str
    status: str
    conclusion: str | None
    run_attempt: int
    run_number: int
    actor: str
    display_title: str
    pull_requests: list[int]
    created_at: datetime
    updated_at: datetime
    run_started_at: datetime
    artifacts: list[Artifact] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)
    head_repository: str | None = None  # a fork's full name; None: the repository itself


@dataclass
class CheckRun:
    id: int
    name: str
    head_sha: str
    status: str
    conclusion: str | None
    started_at: datetime
    completed_at: datetime | None
    output: dict[str, Any]
    details_url: str | None
    external_id: str
    check_suite_id: int


@dataclass
class IssueComment:
    id: int
    issue_number: int
    user: str
    body: str
    created_at: datetime
    updated_at: datetime
    via_app: bool


@dataclass
class Reaction:
    id: int
    comment_id: int
    content: str
    user: str
    created_at: datetime


@dataclass
class Dispatch:
    workflow: str
    ref: str
    inputs: dict[str, Any]
    at: datetime
    run_id: int


def apply_files(tree: dict[str, str], files: dict[str, str | None]) -> dict[str, str]:
    """`tree` with `files` written over it; a None deletes its path."""
    changed = dict(tree)
    for path, text in files.items():
        if text is None:
            changed.pop(path, None)
        else:
            changed[path] = text
    return changed


def finish_jobs(run: WorkflowRun, at: datetime) -> None:
    """Jobs still open when their run completes end with the run's conclusion."""
    for job in run.jobs:
        if job.status != "completed":
            job.status, job.conclusion, job.completed_at = "completed", run.conclusion, at
            for step in job.steps:
                step.status, step.conclusion = "completed", run.conclusion


def _again(job: Job) -> sc.Job:
    """`job` as a re-run runs it: its name and steps, their conclusions the new attempt's."""
    return sc.Job(name=job.name, steps=[sc.JobStep(name=step.name) for step in job.steps])


def build_zip(files: dict[str, Any]) -> bytes:
    """An artifact archive; a JSON value is serialised, a string is stored as is."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, value in files.items():
            text = value if isinstance(value, str) else json.dumps(value, indent=2)
            archive.writestr(name, text)
    return buffer.getvalue()


@lru_cache(maxsize=256)
def _workflow(text: str) -> dict[Any, Any] | None:
    """A workflow file parsed once (every dispatch reads it several times).

    Keys are not all strings: YAML 1.1 reads the bare key `on` as the boolean True.
    """
    try:
        data = yaml.load(text, Loader=_YAML_LOADER)
    except yaml.YAMLError:
        return None
    return data if isinstance(data, dict) else None


def workflow_trigger(text: str | None) -> dict[str, Any] | None:
    """The `workflow_dispatch` block of a workflow file ({} when it takes no inputs).

    None when the file is missing, unparsable or has no such trigger.
    """
    data = _workflow(text) if text is not None else None
    if data is None:
        return None
    triggers = data.get("on", data.get(True))
    if triggers == "workflow_dispatch" or (
        isinstance(triggers, list) and "workflow_dispatch" in triggers
    ):
        return {}
    if isinstance(triggers, dict) and "workflow_dispatch" in triggers:
        return triggers["workflow_dispatch"] or {}
    return None


def workflow_display_name(file: str, text: str | None) -> str:
    data = _workflow(text) if text else None
    if data is not None and isinstance(data.get("name"), str):
        return data["name"]
    return f".github/workflows/{file}"


_INPUT_EXPRESSION = re.compile(r"\$\{\{\s*(?:github\.event\.)?inputs\.([A-Za-z0-9_-]+)\s*\}\}")


def workflow_run_title(file: str, text: str | None, inputs: dict[str, Any]) -> str:
    """A dispatched run's display title: its `run-name` with `${{ inputs.x }}` filled in,
    else the workflow's name, as GitHub shows it."""
    data = _workflow(text) if text else None
    run_name = data.get("run-name") if data is not None else None
    if not isinstance(run_name, str):
        return workflow_display_name(file, text)
    return _INPUT_EXPRESSION.sub(lambda m: str(inputs.get(m.group(1), "")), run_name)


class RepoState:
    def __init__(self, spec: sc.Repository, repo_id: int, ids: Ids, now: datetime) -> None:
        self.full_name = spec.full_name
        self.owner, self.name = spec.full_name.split("/")
        self.id = repo_id
        self.installation_id = spec.installation_id
        self.installed = spec.installed
        self.owner_type = spec.owner_type
        self.default_branch = spec.default_branch
        self.private = spec.private
        self.created_at = now - timedelta(days=365)
        self.collaborators = dict(spec.collaborators)
        self.ids = ids
        self.commits: dict[str, Commit] = {}
        self.refs: dict[str, str] = {}
        self.pulls: dict[int, PullRequest] = {}
        self.issues: dict[int, Issue] = {}
        self.runs: dict[int, WorkflowRun] = {}
        self.check_runs: dict[int, CheckRun] = {}
        self.comments: dict[int, IssueComment] = {}
        self.reactions: list[Reaction] = []
        self.dispatches: list[Dispatch] = []
        self.workflow_ids: dict[str, int] = {}
        # GitHub's `pushed_at`: the last push to any branch (the default branch's head
        # until something is pushed here).
        self.pushed_at: datetime | None = None
        self.moves: list[RefMove] = []  # oldest first
        # The folder trees the API has named (tree id -> commit, folder), so a tree asked for
        # by its id is found without hashing every folder of every commit.
        self.trees: dict[str, tuple[str, str]] = {}
        head = self.commit_history(spec.history)
        tree = {**(head.tree if head else {}), **spec.files}
        if head is None:
            made = self.commit(tree, (), "Initial commit", self.first_admin(),
                               now - sc.HEAD_AGE_WITHOUT_HISTORY)
        else:
            made = self.commit(tree, (head.sha,), "Scenario files", self.first_admin(),
                               now - sc.HEAD_AGE_AFTER_HISTORY)
        self.refs[self.default_ref] = made.sha

    def commit_history(self, history: list[sc.HistoryCommit]) -> Commit | None:
        """The scenario's history as a line of commits; answers the last one."""
        last: Commit | None = None
        for spec in history:
            tree = apply_files(last.tree if last else {}, spec.files)
            parents = (last.sha,) if last else ()
            last = self.commit(tree, parents, spec.message, spec.author or self.first_admin(),
                               spec.at)
        return last

    # --- git ----------------------------------------------------------------------------

    @property
    def default_ref(self) -> str:
        return f"refs/heads/{self.default_branch}"

    @property
    def head_sha(self) -> str:
        return self.refs[self.default_ref]

    @property
    def head(self) -> Commit:
        return self.commits[self.head_sha]

    def first_admin(self) -> str:
        admins = [user for user, level in self.collaborators.items() if level == "admin"]
        return admins[0] if admins else self.owner

    def commit(
        self,
        tree: dict[str, str],
        parents: tuple[str, ...],
        message: str,
        author: str,
        at: datetime,
        sha: str | None = None,
    ) -> Commit:
        seq = self.ids.next("commit")
        if sha is None:
            material = json.dumps([self.full_name, seq, parents, message, tree], sort_keys=True)
            sha = hashlib.sha1(material.encode("utf-8")).hexdigest()
        made = Commit(sha, tree, parents, message, author, at, seq)
        self.commits[sha] = made
        return made

    def advance_default(self, tree: dict[str, str], message: str, author: str, at: datetime,
                        extra_parent: str | None = None, onto: str | None = None,
                        kind: str = "push") -> tuple[Commit, Commit]:
        """A new commit on the default branch (on `onto` for a force-push); answers
        (previous head, new head)."""
        before = self.head
        parents = (onto or before.sha,) + ((extra_parent,) if extra_parent else ())
        after = self.commit(tree, parents, message, author, at)
        self.move(self.default_ref, after.sha, "force_push" if onto is not None else kind, author, at)
        return before, after

    def move(self, ref: str, sha: str, kind: str, actor: str, at: datetime) -> None:
        """Point `ref` at `sha`, noted in the repository's activity and its `pushed_at`."""
        self.moves.append(RefMove(self.ids.next("activity"), ref, self.refs.get(ref, "0" * 40), sha, kind, actor, at))
        self.refs[ref] = sha
        self.pushed_at = at

    def resolve(self, ref: str) -> str | None:
        """The commit sha a ref, branch, tag or (short) sha names."""
        if SHA_RE.match(ref) and ref in self.commits:
            return ref
        for name in (ref, f"refs/{ref}", f"refs/heads/{ref}", f"refs/tags/{ref}"):
            if name in self.refs:
                return self.refs[name]
        if SHORT_SHA_RE.match(ref):
            found = [sha for sha in self.commits if sha.startswith(ref)]
            if len(found) == 1:
                return found[0]
        return None

    def ancestors(self, sha: str) -> list[str]:
        """`sha` and every commit reachable from it, nearest first."""
        order: list[str] = []
        seen: set[str] = set()
        queue = deque([sha])
        while queue:
            current = queue.popleft()
            if current in seen or current not in self.commits:
                continue
            seen.add(current)
            order.append(current)
            queue.extend(self.commits[current].parents)
        return order

    def merge_base(self, base: str, head: str) -> str | None:
        common = set(self.ancestors(base)) & set(self.ancestors(head))
        if not common:
            return None
        return max(common, key=lambda sha: self.commits[sha].seq)

    @staticmethod
    def changed_paths(old: dict[str, str], new: dict[str, str]) -> list[tuple[str, str]]:
        """(path, added|removed|modified) for every file that differs between two trees."""
        changes = []
        for path in sorted(set(old) | set(new)):
            before, after = old.get(path), new.get(path)
            if before != after:
                status = "added" if before is None else "removed" if after is None else "modified"
                changes.append((path, status))
        return changes

    def commit_changes(self, commit: Commit) -> list[tuple[str, str]]:
        parent = self.commits.get(commit.parents[0]) if commit.parents else None
        return self.changed_paths(parent.tree if parent else {}, commit.tree)

    def diff_trees(self, old: dict[str, str], new: dict[str, str]) -> list[ChangedFile]:
        changes = []
        for path, status in self.changed_paths(old, new):
            before, after = old.get(path), new.get(path)
            patch = compute_patch(before or "", after or "")
            additions, deletions = count_changes(patch)
            sha = blob_sha(after) if after is not None else None
            changes.append(ChangedFile(path, status, patch, None, additions, deletions, sha))
        return changes

    # --- pull requests ------------------------------------------------------------------

    def pull_files(
        self, base_tree: dict[str, str], specs: list[sc.PullFile]
    ) -> tuple[dict[str, str], list[ChangedFile]]:
        """The head tree and GitHub's file list for a pull request's changes."""
        tree = dict(base_tree)
        files = []
        for spec in specs:
            old_name = spec.previous_filename or spec.filename
            old_text = base_tree.get(old_name)
            new_text = self._head_text(spec, old_text)
            if spec.previous_filename:
                tree.pop(spec.previous_filename, None)
            if spec.status == "removed":
                tree.pop(spec.filename, None)
            elif new_text is not None:
                tree[spec.filename] = new_text
            else:
                # The head text is unknowable (patch does not apply, or omitted without
                # content): the contents API answers 404 for it at the head.
                tree.pop(spec.filename, None)
            patch = spec.patch if spec.patch_given else self._diff(spec, old_text, new_text)
            counted = patch if patch is not None else self._diff(spec, old_text, new_text)
            additions, deletions = count_changes(counted)
            sha = blob_sha(new_text) if new_text is not None else None
            files.append(
                ChangedFile(spec.filename, spec.status, patch, spec.previous_filename,
                            additions, deletions, sha)
            )
        return tree, files

    @staticmethod
    def _diff(spec: sc.PullFile, old_text: str | None, new_text: str | None) -> str | None:
        if new_text is None and spec.status != "removed":
            return None
        return compute_patch(old_text or "", new_text or "")

    @staticmethod
    def _head_text(spec: sc.PullFile, old_text: str | None) -> str | None:
        if spec.status == "removed":
            return None
        if spec.content is not None:
            return spec.content
        if spec.patch is not None:
            try:
                return apply_patch(old_text or "", spec.patch)
            except PatchError:
                return None
        return old_text if spec.status == "renamed" else None

    def add_pull(self, spec: sc.Pull, now: datetime) -> PullRequest:
        number = spec.number or self.next_issue_number()
        if number in self.pulls or number in self.issues:
            raise SandboxError(f"{self.full_name}#{number} already exists", 409)
        base_ref = spec.base_ref or self.default_branch
        base_sha = self.resolve(base_ref)
        if base_sha is None:
            raise SandboxError(f"{self.full_name}: no branch {base_ref!r} to open a pull against")
        created = spec.created_at or now
        self.check_fork(spec.head_repo)
        tree, files = self.pull_files(self.commits[base_sha].tree, spec.files)
        head = self.commit(tree, (base_sha,), spec.title, spec.user, created, spec.head_sha)
        if spec.head_repo is None:
            # A fork's branch is the fork's: the head commit is reachable here by its sha
            # alone, as on GitHub (through the pull request), and no branch of ours moves.
            self.refs[f"refs/heads/{spec.head_ref}"] = head.sha
        pull = PullRequest(
            number=number,
            id=self.ids.next("pull"),
            title=spec.title,
            body=spec.body,
            user=spec.user,
            head_ref=spec.head_ref,
            head_sha=head.sha,
            base_ref=base_ref,
            base_sha=base_sha,
            draft=spec.draft,
            labels=list(spec.labels),
            created_at=created,
            updated_at=spec.updated_at or created,
            files=files,
            head_shas=[head.sha],
            head_repo=spec.head_repo,
        )
        self.pulls[number] = pull
        return pull

    def check_fork(self, fork: str | None) -> None:
        """GitHub forks a repository into another account only."""
        if fork is not None and sc.owner_of(fork).lower() == self.owner.lower():
            raise SandboxError(f"{fork} cannot be a fork of {self.full_name}: a fork belongs to another "
                               "account", 422)

    def push_pull(
        self, pull: PullRequest, specs: list[sc.PullFile], sha: str | None, now: datetime
    ) -> str:
        """A new head commit whose changes against the base are exactly `specs`."""
        if pull.state != "open":
            raise SandboxError(f"{self.full_name}#{pull.number} is closed", 409)
        before = pull.head_sha
        tree, files = self.pull_files(self.commits[pull.base_sha].tree, specs)
        head = self.commit(tree, (before,), f"Update {pull.head_ref}", pull.user, now, sha)
        if pull.head_repo is None:  # a push to a fork moves nothing of ours
            self.move(f"refs/heads/{pull.head_ref}", head.sha, "push", pull.user, now)
        pull.head_sha = head.sha
        pull.head_shas.append(head.sha)
        pull.files = files
        pull.updated_at = now
        return before

    def retarget(self, pull: PullRequest, base: str) -> None:
        """Point an open pull request at another branch, refused as GitHub refuses it: its
        changes become the head's against its merge base with that branch."""
        if pull.state != "open":
            raise SandboxError("Cannot change the base branch of a closed pull request.", 422)
        base_sha = self.refs.get(f"refs/heads/{base}")
        if base_sha is None:
            raise SandboxError(f"Proposed base branch '{base}' was not found", 422)
        if pull.head_sha in self.ancestors(base_sha):
            raise SandboxError(f"There are no new commits between base branch '{base}' and head "
                               f"branch '{pull.head_ref}'", 422)
        merge_base = self.merge_base(base_sha, pull.head_sha)
        old_tree = self.commits[merge_base].tree if merge_base else {}
        pull.base_ref, pull.base_sha = base, base_sha
        pull.files = self.diff_trees(old_tree, self.commits[pull.head_sha].tree)

    def merge_pull(self, pull: PullRequest, by: str, now: datetime) -> tuple[Commit, Commit]:
        """Apply the pull request's changes to the default branch as a merge commit."""
        if pull.base_ref != self.default_branch:
            # GitHub would merge into that branch; the sandbox models the default one only.
            raise SandboxError(f"cannot merge #{pull.number}: the sandbox merges into "
                               f"{self.default_branch} only, not {pull.base_ref}", 422)
        tree = dict(self.head.tree)
        head_tree = self.commits[pull.head_sha].tree
        for changed in pull.files:
            if changed.previous_filename:
                tree.pop(changed.previous_filename, None)
            if changed.status == "removed":
                tree.pop(changed.filename, None)
            elif changed.filename in head_tree:
                tree[changed.filename] = head_tree[changed.filename]
            else:
                raise SandboxError(
                    f"cannot merge #{pull.number}: the head text of {changed.filename} is "
                    "unknown (give its content in the scenario)", 409
                )
        message = f"Merge pull request #{pull.number} from {pull.head_ref}\n\n{pull.title}"
        before, after = self.advance_default(tree, message, by, now, extra_parent=pull.head_sha, kind="pr_merge")
        pull.merged, pull.merged_at, pull.merged_by = True, now, by
        pull.merge_commit_sha = after.sha
        return before, after

    def add_run(self, spec: sc.Run, now: datetime) -> WorkflowRun:
        self.check_fork(spec.head_repository)
        run_id = spec.id or self.ids.next("run")
        self.ids.reserve("run", run_id)
        if run_id in self.runs:
            raise SandboxError(f"{self.full_name}: run {run_id} already exists", 409)
        created = spec.created_at or now
        finished = spec.completed_at or created
        name = workflow_display_name(spec.workflow, self.workflow_text(spec.workflow))
        completed = spec.status == "completed"
        run = WorkflowRun(
            id=run_id,
            workflow=spec.workflow,
            name=name,
            head_sha=spec.head_sha or self.head_sha,
            head_branch=spec.head_branch or self.default_branch,
            event=spec.event,
            status=spec.status,
            conclusion=(spec.conclusion or "success") if completed else None,
            run_attempt=spec.run_attempt,
            run_number=self.next_run_number(spec.workflow),
            actor=spec.actor or self.first_admin(),
            display_title=spec.display_title or name,
            pull_requests=list(spec.pull_requests),
            created_at=created,
            updated_at=finished if completed else created,
            run_started_at=created,
            head_repository=spec.head_repository,
        )
        self.runs[run_id] = run
        self.attach_artifacts(run, spec.artifacts, finished)
        run.jobs = self.build_jobs(run, spec.jobs, finished)
        return run

    def complete_run(self, spec: sc.FinishedRun, now: datetime) -> WorkflowRun:
        """Finish a queued or running run (a dispatched one) or record a new finished run."""
        run = self.runs.get(spec.id) if spec.id else None
        finished = spec.completed_at or now
        if run is None:
            if spec.workflow is None:
                raise SandboxError(f"{self.full_name}: no run {spec.id}; a new run needs "
                                   "`workflow`", 404)
            fields = spec.model_dump(exclude_unset=True)
            new = sc.Run.model_validate({**fields, "status": "completed", "completed_at": finished})
            return self.add_run(new, now)
        if spec.workflow is not None and spec.workflow != run.workflow:
            raise SandboxError(f"run {run.id} is a run of {run.workflow}, not {spec.workflow}", 409)
        if run.status == "completed" and spec.run_attempt <= run.run_attempt:
            raise SandboxError(
                f"run {run.id} already completed; give a higher run_attempt to re-run it", 409
            )
        rerun = spec.run_attempt > run.run_attempt
        if rerun:
            # GitHub: `run_started_at` is the latest attempt's ("resets on re-run").
            run.run_started_at = min(now, finished)
        run.status = "completed"
        run.conclusion = spec.conclusion or "success"
        run.run_attempt = max(run.run_attempt, spec.run_attempt)
        run.updated_at = finished
        if spec.head_sha:
            run.head_sha = spec.head_sha
        if spec.pull_requests:
            run.pull_requests = list(spec.pull_requests)
        self.attach_artifacts(run, spec.artifacts, finished)
        if spec.jobs:
            run.jobs = self.build_jobs(run, spec.jobs, finished)
        elif rerun:  # the jobs GitHub lists are the latest attempt's: the same ones, run again
            run.jobs = self.build_jobs(run, [_again(job) for job in run.jobs], finished)
        else:
            finish_jobs(run, finished)
        return run

    def start_run(self, run_id: int, now: datetime) -> WorkflowRun:
        """A queued run is picked up by a runner: it and its jobs are in progress."""
        run = self.runs.get(run_id)
        if run is None:
            raise SandboxError(f"{self.full_name} has no run {run_id}", 404)
        if run.status != "queued":
            raise SandboxError(f"run {run_id} is {run.status}, not queued", 409)
        run.status = "in_progress"
        run.run_started_at = run.updated_at = now
        for job in run.jobs:
            if job.status == "queued":
                job.status, job.started_at = "in_progress", now
        return run

    def build_jobs(self, run: WorkflowRun, specs: list[sc.Job], finished: datetime) -> list[Job]:
        return [self.build_job(run, spec, finished) for spec in specs]

    def build_job(self, run: WorkflowRun, spec: sc.Job, finished: datetime) -> Job:
        status = spec.status or ("completed" if spec.conclusion else run.status)
        done = status == "completed"
        conclusion = (spec.conclusion or run.conclusion or "success") if done else None
        steps = [
            JobStep(step.name, number, status, (step.conclusion or conclusion) if done else None)
            for number, step in enumerate(spec.steps, start=1)
        ]
        return Job(self.ids.next("job"), spec.name, status, conclusion, run.run_started_at,
                   finished if done else None, steps)

    def attach_artifacts(
        self, run: WorkflowRun, specs: list[sc.Artifact], at: datetime
    ) -> None:
        for spec in specs:
            if spec.raw_zip_base64 is not None:
                try:
                    data = base64.b64decode(spec.raw_zip_base64, validate=True)
                except binascii.Error:
                    raise SandboxError(f"artifact {spec.name}: raw_zip_base64 is not base64")
            else:
                data = build_zip(spec.files)
            artifact = Artifact(self.ids.next("artifact"), spec.name, data, spec.expired, at, run.id)
            run.artifacts = [a for a in run.artifacts if a.name != spec.name] + [artifact]

    def add_issue(self, number: int | None, issue_id: int, title: str, user: str,
                  at: datetime) -> Issue:
        """A new plain issue; issues and pull requests share one sequence of numbers."""
        number = number or self.next_issue_number()
        if number in self.pulls or number in self.issues:
            raise SandboxError(f"{self.full_name}#{number} already exists", 409)
        made = Issue(number, issue_id, title, user, at)
        self.issues[number] = made
        return made

    def next_issue_number(self) -> int:
        used = list(self.pulls) + list(self.issues)
        return max(used, default=0) + 1

    def find_pull_by_sha(self, sha: str) -> list[PullRequest]:
        """The open pull requests a check on `sha` belongs to: GitHub lists none whose head
        is in a fork."""
        return [p for p in self.pulls.values()
                if p.state == "open" and p.head_sha == sha and p.head_repo is None]

    # --- actions ------------------------------------------------------------------------

    def workflow_text(self, workflow: str) -> str | None:
        return self.head.tree.get(f".github/workflows/{workflow}")

    def workflow_id(self, workflow: str) -> int:
        if workflow not in self.workflow_ids:
            self.workflow_ids[workflow] = self.ids.next("workflow")
        return self.workflow_ids[workflow]

    def workflow_files(self) -> list[str]:
        prefix = ".github/workflows/"
        names = {p[len(prefix):] for p in self.head.tree if p.startswith(prefix) and "/" not in p[len(prefix):]}
        return sorted(names | {run.workflow for run in self.runs.values()})

    def workflow_by_id_or_name(self, key: str) -> str | None:
        for name in self.workflow_files():
            if key == name or key == str(self.workflow_id(name)):
                return name
        return None

    def next_run_number(self, workflow: str) -> int:
        return 1 + sum(1 for run in self.runs.values() if run.workflow == workflow)

    def artifacts(self) -> Iterator[Artifact]:
        for run in self.runs.values():
            yield from run.artifacts

    def artifact(self, artifact_id: int) -> Artifact | None:
        return next((a for a in self.artifacts() if a.id == artifact_id), None)

    def comment_reactions(self, comment_id: int) -> list[Reaction]:
        return [r for r in self.reactions if r.comment_id == comment_id]
