"""Keeps each repository's overlap index current from `pull_request` events and reconciles.

A PR's files are read once per head SHA: metadata-only actions (edited, labeled, …) update
the record without a read. A master config whose patch GitHub omitted is compared from its
base and head contents; when even those cannot be had, the PR overlaps every family of the
file as `patch-unavailable` until a later refresh succeeds. A PR whose file list GitHub
refuses overlaps every family until a later refresh lists it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import structlog

from bot.core import events
from bot.core.catalog import is_master_config
from bot.core.domain import FileChange, stamp
from bot.core.overlap import (
    family_indents,
    file_change_from_contents,
    file_change_from_patch,
    hunk_headers_name,
    pull_record,
)
from bot.github.errors import GitHubError, RateLimited
from bot.services.api import RepoAPI
from bot.services.live import LiveState
from bot.services.repo_state import RepoState
from bot.store.change import Change

YAML_SUFFIXES = (".yaml", ".yml")

log = structlog.get_logger("klaud.pulls")

MAX_PR_FILES = 3000  # GitHub lists at most 3,000 files of a pull request
NEW_HEAD_ACTIONS = frozenset({"opened", "reopened", "synchronize"})


class PullSync:
    def __init__(self, live: LiveState) -> None:
        self.live = live

    async def on_pull_request(self, state: RepoState, event: events.PullRequestEvent) -> set[str]:
        """Keep the overlap index current; returns the families whose overlaps changed."""
        pull = event.pull_request
        number = pull.number
        async with self.live.lock(state.name):
            if state.is_stale_pull_event(number, pull.updated_at, event.action):
                log.info("pulls.late_event_ignored", pr=number, action=event.action, updated_at=stamp(pull.updated_at))
                return set()
            before = set(state.overlap.touches(number))
            earlier = state.overlap.get(number)
            if event.action == "closed" or pull.state == "closed":
                change = state.remove_pull(number, pull.updated_at)
            else:
                change = Change()
                # Files are read when the head is new to us (opened, reopened, synchronize,
                # or any event for a PR we missed); other actions only update metadata.
                await self.refresh(state, self.live.api(state), pull, change)
            await self.live.persist(change)
            after = set(state.overlap.touches(number))
        # Closed, it is gone from the index: what it was says whose overlaps it leaves (its
        # own family's too, where another Klaud PR's check run listed it).
        record = state.overlap.get(number) or earlier
        families = before | after
        moved: set[int] = set()
        if record is not None and record.klaud_own:
            own = state.family_by_hash(record.own_family_hash) if record.own_family_hash else None
            if own is not None:
                families.add(own.id)
            if event.action in NEW_HEAD_ACTIONS:
                # A new head needs its own check run even when no family state changed.
                moved.add(number)
        await self.live.notify(state, families, moved)
        return families

    async def on_comment(self, state: RepoState, number: int, at: datetime) -> None:
        """A comment on PR `number` at `at` (no `pull_request` event says so): a human PR idle
        for `idle_days` becomes active again, as GitHub's `updated_at` does (DESIGN §4)."""
        known = state.overlap.get(number)
        if known is None or at <= known.last_active:
            return  # an issue, a PR not open, or older news: most comments wait for no lock
        async with self.live.lock(state.name):
            known = state.overlap.get(number)
            if known is None or at <= known.last_active:
                return
            await self.live.persist(state.upsert_pull(replace(known, active_at=at)))
            families = set(state.overlap.touches(number))
        await self.live.notify(state, families)

    async def refresh(self, state: RepoState, api: RepoAPI, pull: events.PullRequest, change: Change) -> int:
        """Upsert one open PR; read its files only when its head or base is new to us (returns reads)."""
        known = state.overlap.get(pull.number)
        # The diff is the head's against the base: retargeted to another base, the same head
        # changes other lines (it kept the old base's overlaps, or none where it now has some).
        files_sha: str | None
        if (
            known is not None and known.files_sha == pull.head.sha and known.base_ref == pull.base.ref
            and not _diff_missing(state, known.changes)
        ):
            changes, complete, files_sha, fetched = known.changes, known.files_complete, known.files_sha, 0
        else:
            listed = await self._changes(state, api, pull)
            # Unlisted, the PR may touch any family (like one of over 3,000 files), and its
            # files are asked again at its next refresh (an event, a light reconcile).
            changes, complete = listed or ((), False)
            files_sha, fetched = (pull.head.sha if listed is not None else None), 1
        record = pull_record(
            state.name, pull, self.live.bot_logins, changes=changes, files_complete=complete, files_sha=files_sha
        )
        if known is not None and known.active_at is not None and known.active_at > record.updated_at:
            record = replace(record, active_at=known.active_at)  # a comment after what this says
        change.extend(state.upsert_pull(record))
        candidate = state.candidate_of_pull(record) if record.klaud_own else ""
        if candidate and (known is None or state.candidate_of_pull(known) != candidate):
            # New to the index (opened, reopened, found by a reconcile): its candidate's
            # attempts past memory's 14 days come back, as a restart loads them.
            await self.live.recall_attempts(state, [candidate])
        return fetched

    async def _changes(
        self, state: RepoState, api: RepoAPI, pull: events.PullRequest
    ) -> tuple[tuple[FileChange, ...], bool] | None:
        """Every changed file of a PR with what it touches, and whether GitHub listed them all;
        None when GitHub refuses to list them (a diff it gives up generating). Raised, that
        refusal failed the PR's every event and every light reconcile of the repository for
        as long as the PR stayed open, and no lost event of it was caught up meanwhile."""
        changes: list[FileChange] = []
        diff_base = _DiffBase(api, pull.base.sha, pull.head.sha)
        try:
            async for item in api.pull_files(pull.number):
                changes.append(await self._file_change(state, api, item, diff_base))
        except GitHubError as exc:
            if exc.transient:
                raise
            log.warning("overlap.files_unavailable", pr=pull.number, error=str(exc))
            return None
        return tuple(changes), len(changes) < MAX_PR_FILES

    async def _file_change(self, state: RepoState, api: RepoAPI, item: events.PullFile, diff_base: _DiffBase) -> FileChange:
        # A copy leaves its source untouched; only a rename changes two paths.
        previous = item.previous_filename if item.status == "renamed" else None
        globs = state.policy.config_globs
        paths = (item.filename, previous) if previous else (item.filename,)
        if not any(is_master_config(path, globs) for path in paths):
            # Files are read once per head. A YAML file's keys are kept anyway: should a push
            # widen `config_globs` to it, the PR must overlap its families without a re-read
            # (else it blocks nothing until its next push).
            if not any(path.endswith(YAML_SUFFIXES) for path in paths):
                return FileChange(filename=item.filename, previous_filename=previous)
            if item.patch is None:
                return FileChange(filename=item.filename, previous_filename=previous, unavailable=True)
        if item.patch is not None:
            families = [family for path in paths for family in state.catalog.families_of(path)]
            change = file_change_from_patch(item.filename, item.patch, previous, item.status,
                                            known_keys=family_indents(families), headed=hunk_headers_name(families))
            if not change.diff_missing:
                return change
        # GitHub omits the patch of a large diff, and a hunk header may name a key git cut
        # short that no family key completes: compare the base and head contents here.
        try:
            base = await api.file_text(previous or item.filename, await diff_base.sha())
            head = await api.file_text(item.filename, diff_base.head)
        except GitHubError as exc:
            if exc.transient:
                raise
            base = head = None
        if base is None and head is None:
            log.warning("overlap.patch_unavailable", file=item.filename)
            return FileChange(filename=item.filename, previous_filename=previous, unavailable=True)
        return file_change_from_contents(item.filename, base, head, previous, item.status)


class _DiffBase:
    """The commit a PR's files are diffed from when that is done here: the merge base of its
    base and head, as GitHub's file list is (its `base.sha`, the base branch's tip when the
    PR was opened, would charge it with what the branch got since). Asked once a read, and
    only when a file needs it."""

    def __init__(self, api: RepoAPI, base: str, head: str) -> None:
        self.api, self.base, self.head = api, base, head
        self._sha: str | None = None

    async def sha(self) -> str:
        if self._sha is None:
            try:
                found = await self.api.merge_base(self.base, self.head)
            except GitHubError as exc:
                # A blip (a timeout, a 502, the token service, a rate limit) is retried: the
                # fallback is kept for good (files are read once per head). Only the 500 a
                # comparison too long to generate answers every time falls back.
                if isinstance(exc, RateLimited) or (exc.transient and exc.status != 500):
                    raise
                # A comparison GitHub cannot generate in time answers 500 every time it is
                # asked (the large diffs whose patches it omits): the base it was opened on.
                log.info("pulls.merge_base_unread", base=self.base, head=self.head, error=str(exc))
                found = None
            self._sha = found or self.base
        return self._sha


def _diff_missing(state: RepoState, changes: tuple[FileChange, ...]) -> bool:
    """A master config of the PR whose diff could not be had: it overlaps every family of
    the file (`patch-unavailable`) until a later read succeeds, so the head is read again at
    the next event or reconcile instead of blocking those families until its next push. A
    diff too large to keep is the same at every read: it waits for the next push."""
    return any(c.diff_missing and is_master_config(c.filename, state.policy.config_globs) for c in changes)
