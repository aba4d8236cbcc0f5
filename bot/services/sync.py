"""Reading GitHub into the live state: the I/O edge of catalog, overlap index and ledger.

Each function reads what one event (or a reconcile) needs, turns it into plain data with
the pure modules, and applies it to a `RepoState`, returning the store `Change` that
persists it. Nothing here decides anything a wave decides.
"""

from __future__ import annotations

import base64
import posixpath
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, AsyncIterator

import structlog

from bot.core.catalog import CatalogError, is_master_config, parse_master, parse_runners
from bot.core.domain import (
    ARTIFACT_RE,
    Attempt,
    FileChange,
    PullRequest,
    parse_time,
)
from bot.github.client import GitHubError, InstallationClient, NotFound, TooLarge
from bot.core.outcomes import (
    MAX_ARCHIVE_BYTES,
    ArtifactError,
    RunInfo,
    attempt_from_outcome,
    read_outcome_artifact,
    unverified_attempt,
)
from bot.core.overlap import file_change_from_contents, file_change_from_patch, is_klaud_own
from bot.core.policy import POLICY_PATH
from bot.services.repo_state import RepoState
from bot.store.records import Change

log = structlog.get_logger("klaud.sync")

MAX_PR_FILES = 3000  # GitHub lists at most 3,000 files of a pull request


def split_repo(full_name: str) -> dict[str, str]:
    owner, _, name = full_name.partition("/")
    return {"owner": owner, "repo": name}


# -- contents -------------------------------------------------------------------------


async def read_text(gh: InstallationClient, repo: str, path: str, ref: str) -> str | None:
    """A file's text at `ref`, or None when it does not exist there."""
    try:
        item = await gh.getitem(
            "/repos/{owner}/{repo}/contents/{+path}", {**split_repo(repo), "path": path}, params={"ref": ref}
        )
    except NotFound:
        return None
    if not isinstance(item, dict) or item.get("type") != "file":
        return None
    if item.get("encoding") == "none":
        # GitHub leaves the content of files over 1 MB out of the JSON; the raw media type
        # still returns it (up to 100 MB).
        raw = await gh.getitem(
            "/repos/{owner}/{repo}/contents/{+path}",
            {**split_repo(repo), "path": path},
            params={"ref": ref},
            accept="application/vnd.github.raw",
        )
        return raw or ""
    # Undecodable bytes become U+FFFD: the YAML parser then reports the file as invalid
    # (keeping the last good state) instead of the delivery failing over and over.
    return base64.b64decode(item.get("content") or "").decode("utf-8", errors="replace")


async def list_directory(gh: InstallationClient, repo: str, directory: str, ref: str) -> list[str]:
    try:
        items = await gh.getitem(
            "/repos/{owner}/{repo}/contents/{+path}", {**split_repo(repo), "path": directory}, params={"ref": ref}
        )
    except NotFound:
        return []
    if not isinstance(items, list):
        return []
    return [item["path"] for item in items if item.get("type") == "file"]


def glob_directory(pattern: str) -> str:
    """The fixed folder part of a glob (`configs/*-master.yaml` -> `configs`)."""
    head = pattern.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0]
    return posixpath.dirname(head)


async def config_paths(state: RepoState, gh: InstallationClient, ref: str) -> list[str]:
    paths: set[str] = set()
    for directory in sorted({glob_directory(p) for p in state.policy.config_globs}):
        for path in await list_directory(gh, state.name, directory, ref):
            if is_master_config(path, state.policy.config_globs):
                paths.add(path)
    return sorted(paths)


# -- catalog --------------------------------------------------------------------------


async def refresh_runners(state: RepoState, gh: InstallationClient, ref: str) -> bool:
    """Re-read runners.yaml; False keeps the last good mapping (and records why)."""
    path = state.policy.runners_file
    text = await read_text(gh, state.name, path, ref)
    if text is None:
        state.meta.config_errors[path] = f"{path} not found on {ref[:12]}"
        log.warning("catalog.runners_missing", path=path)
        return False
    try:
        runners = parse_runners(text)
    except CatalogError as exc:
        state.meta.config_errors[path] = str(exc)
        log.warning("catalog.runners_invalid", path=path, error=str(exc))
        return False
    state.meta.runners = {label: list(clusters) for label, clusters in runners.items()}
    state.meta.config_errors.pop(path, None)
    return True


async def refresh_config(
    state: RepoState, gh: InstallationClient, path: str, ref: str, changed_at: datetime | None
) -> Change:
    """Re-parse one master config; unparseable text keeps the last good families of the file."""
    text = await read_text(gh, state.name, path, ref)
    if text is None:
        return state.remove_config(path)
    runners = {label: tuple(clusters) for label, clusters in state.meta.runners.items()}
    try:
        parsed = parse_master(path, text, runners)
    except CatalogError as exc:
        state.meta.config_errors[path] = str(exc)
        log.warning("catalog.config_invalid", path=path, error=str(exc))
        return Change()
    # An unchanged image keeps its date; a changed or new one is dated by the push that
    # brought it (a backfill passes None: it does not know).
    return state.replace_families(path, parsed, changed_at)


async def load_catalog(state: RepoState, gh: InstallationClient, ref: str) -> Change:
    """Read runners.yaml and every config_globs file at `ref` (install and reconcile)."""
    change = Change()
    await refresh_runners(state, gh, ref)
    paths = await config_paths(state, gh, ref)
    for path in paths:
        change.extend(await refresh_config(state, gh, path, ref, None))
    for path in {family.path for family in state.catalog} - set(paths):
        change.extend(state.remove_config(path))
    return change


async def refresh_policy(state: RepoState, gh: InstallationClient, ref: str) -> tuple[bool, Change]:
    text = await read_text(gh, state.name, POLICY_PATH, ref)
    changed, change = state.set_policy_text(text)
    if state.meta.policy_error:
        log.warning("policy.invalid", error=state.meta.policy_error)
    return changed, change


# -- pull requests --------------------------------------------------------------------


def pull_from_payload(
    repo: str,
    data: dict[str, Any],
    bot_logins: tuple[str, ...],
    *,
    changes: tuple[FileChange, ...],
    files_complete: bool,
    files_sha: str | None,
) -> PullRequest:
    head = data.get("head") or {}
    head_repo = (head.get("repo") or {}).get("full_name")
    author = (data.get("user") or {}).get("login") or ""
    own, fam16 = is_klaud_own(head.get("ref") or "", author, head_repo == repo, bot_logins)
    return PullRequest(
        number=int(data["number"]),
        title=data.get("title") or "",
        author=author,
        head_ref=head.get("ref") or "",
        head_sha=head.get("sha") or "",
        base_ref=(data.get("base") or {}).get("ref") or "",
        draft=bool(data.get("draft")),
        labels=tuple(sorted(label.get("name", "") for label in data.get("labels") or [])),
        created_at=parse_time(data.get("created_at")),
        updated_at=parse_time(data.get("updated_at")) or parse_time(data.get("created_at")),  # type: ignore[arg-type]
        klaud_own=own,
        own_family_hash=fam16,
        changes=changes,
        files_complete=files_complete,
        files_sha=files_sha,
    )


async def pull_changes(
    state: RepoState, gh: InstallationClient, data: dict[str, Any]
) -> tuple[tuple[FileChange, ...], bool]:
    """Every changed file of a PR with what it touches (files read once per head SHA)."""
    number = data["number"]
    base_sha = (data.get("base") or {}).get("sha") or ""
    head_sha = (data.get("head") or {}).get("sha") or ""
    changes: list[FileChange] = []
    count = 0
    async for item in _pull_files(gh, state.name, number):
        count += 1
        changes.append(await _file_change(state, gh, item, base_sha, head_sha))
    return tuple(changes), count < MAX_PR_FILES


async def _pull_files(gh: InstallationClient, repo: str, number: int) -> AsyncIterator[dict[str, Any]]:
    async for item in gh.getiter(
        "/repos/{owner}/{repo}/pulls/{number}/files?per_page=100", {**split_repo(repo), "number": number}
    ):
        yield item


async def _file_change(
    state: RepoState, gh: InstallationClient, item: dict[str, Any], base_sha: str, head_sha: str
) -> FileChange:
    filename = item["filename"]
    # A copy leaves its source untouched; only a rename changes two paths.
    previous = item.get("previous_filename") if item.get("status") == "renamed" else None
    globs = state.policy.config_globs
    if not (is_master_config(filename, globs) or (previous and is_master_config(previous, globs))):
        return FileChange(filename=filename, previous_filename=previous)
    status = item.get("status", "modified")
    patch = item.get("patch")
    if patch is not None:
        return file_change_from_patch(filename, patch, previous, status)
    # GitHub omits the patch of a large diff: diff the base and head contents here.
    try:
        base = await read_text(gh, state.name, previous or filename, base_sha)
        head = await read_text(gh, state.name, filename, head_sha)
    except GitHubError as exc:
        if exc.transient:
            raise
        base = head = None
    if base is None and head is None:
        log.warning("overlap.patch_unavailable", file=filename)
        return FileChange(filename=filename, previous_filename=previous, unavailable=True)
    return file_change_from_contents(filename, base, head, previous, status)


# -- outcomes -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ArtifactRead:
    attempt: Attempt
    transient: bool  # the read failed in a way a later retry may fix
    artifact_id: int | None


def run_info(run: dict[str, Any]) -> RunInfo:
    completed = parse_time(run.get("updated_at")) or parse_time(run.get("created_at"))
    assert completed is not None
    return RunInfo(
        run_id=int(run["id"]),
        run_attempt=int(run.get("run_attempt") or 1),
        head_sha=run.get("head_sha"),
        completed_at=completed,
    )


def is_outcome_workflow(state: RepoState, run: dict[str, Any]) -> bool:
    name = posixpath.basename(run.get("path") or "")
    return name in state.policy.outcome_workflows


async def read_run_outcomes(state: RepoState, gh: InstallationClient, run: dict[str, Any]) -> list[ArtifactRead]:
    """One attempt per `klaud-candidate-<id>` artifact of a completed run."""
    info = run_info(run)
    reads = []
    async for artifact in gh.getiter(
        "/repos/{owner}/{repo}/actions/runs/{run_id}/artifacts?per_page=100",
        {**split_repo(state.name), "run_id": info.run_id},
        iterable_key="artifacts",
    ):
        match = ARTIFACT_RE.match(artifact.get("name") or "")
        if match:
            reads.append(await read_artifact(state, gh, match.group(1), artifact, info))
    return reads


async def read_artifact(
    state: RepoState, gh: InstallationClient, candidate: str, artifact: dict[str, Any], info: RunInfo
) -> ArtifactRead:
    family = state.family_of_candidate(candidate)
    artifact_id = artifact.get("id")

    def unverified(code: str, transient: bool = False) -> ArtifactRead:
        return ArtifactRead(unverified_attempt(candidate, family, info, code), transient, artifact_id)

    if artifact.get("expired", True):
        return unverified("artifact-expired")
    try:
        data = await gh.download(artifact["archive_download_url"], max_bytes=MAX_ARCHIVE_BYTES)
    except TooLarge:
        return unverified("download-too-large")
    except NotFound:
        return unverified("artifact-not-found")
    except GitHubError as exc:
        if not exc.transient:
            raise
        log.warning("outcome.download_failed", candidate=candidate, run_id=info.run_id, error=str(exc))
        return unverified("download-failed", transient=True)
    try:
        outcome = read_outcome_artifact(data)
    except ArtifactError as exc:
        log.warning("outcome.artifact_invalid", candidate=candidate, run_id=info.run_id, code=exc.code, detail=exc.detail)
        return unverified(exc.code)
    return ArtifactRead(attempt_from_outcome(candidate, family, info, outcome, "artifact"), False, artifact_id)


def recent_cutoff(now: datetime) -> datetime:
    return now - timedelta(days=3)
