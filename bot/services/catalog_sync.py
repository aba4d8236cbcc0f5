"""Keeps each repository's catalog current: families, runners and policy of the default branch.

A push to the default branch costs one compare plus a read of each changed file; a push to
a claim ref records a claim made or released elsewhere. At install and reconcile the whole
catalog is read at the default branch's head.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import structlog

from bot.core.catalog import (
    Catalog,
    CatalogError,
    Runners,
    image_dates,
    is_master_config,
    parse_runners,
    read_master,
)
from bot.core.domain import (
    CLAIM_BRANCH_PREFIX,
    Claim,
    Family,
    code_span,
    parse_time,
    stamp,
)
from bot.core.events import PushEvent, Repository
from bot.core.policy import POLICY_PATH
from bot.core.setup import workflow_path, workflow_setup_errors
from bot.github.errors import GitHubError
from bot.services.api import RepoAPI
from bot.services.live import LiveState
from bot.services.outcomes import CLOCK_SKEW
from bot.services.repo_state import RepoState
from bot.store.change import Change

log = structlog.get_logger("klaud.catalog")

CLAIM_PREFIX = "refs/heads/" + CLAIM_BRANCH_PREFIX
ZERO_SHA = "0" * 40


def glob_directory(pattern: str) -> str:
    """The fixed folder part of a glob (`configs/*-master.yaml` -> `configs`)."""
    head = pattern.split("*", 1)[0].split("?", 1)[0].split("[", 1)[0]
    return posixpath.dirname(head)


def spans_folders(pattern: str) -> bool:
    """Whether a glob matches files below its fixed folder's own (`configs/**/x.yaml`,
    `configs/*/x.yaml`): that folder's files alone would miss them."""
    folder = glob_directory(pattern)
    rest = pattern[len(folder) + 1 if folder else 0 :]
    return "/" in rest or "**" in rest  # `configs/**-master.yaml`: `**` alone spans folders too


def _health(state: RepoState) -> tuple[object, ...]:
    """What every Klaud check run shows of the repository's set-up."""
    return (state.meta.policy_error, dict(state.meta.config_errors), list(state.meta.setup_errors))


def drop_unlisted_configs(state: RepoState, listed: set[str]) -> Change:
    """Forget the master configs a full listing no longer shows (deleted, or no longer
    matched by `config_globs`): their families and their errors."""
    change = Change()
    for path in {family.path for family in state.catalog} - listed:
        change.extend(state.remove_config(path))
    # A file that never parsed has no families to remove, only its error, which stayed in the
    # state, check runs and dashboard for good. `config_errors` holds master configs and the
    # runners file.
    for path in set(state.meta.config_errors) - listed - {state.policy.runners_file, POLICY_PATH}:
        del state.meta.config_errors[path]
    # Globs that match no file leave no family to plan: said where config errors show (the
    # previous planner refused to plan, `live-configs-unavailable`), not silently.
    if listed:
        state.meta.config_errors.pop(POLICY_PATH, None)
    else:
        globs = ", ".join(code_span(glob) for glob in state.policy.config_globs)  # a person's text
        state.meta.config_errors[POLICY_PATH] = (
            f"config_globs ({globs}) match no file on the default branch: no family is planned"
        )
    return change


def push_time(event: PushEvent) -> datetime | None:
    """When the push happened: `repository.pushed_at`, in epoch seconds.

    The head commit's timestamp is its author date, which a rebase can leave days old.
    """
    pushed_at = event.repository.pushed_at
    return None if pushed_at is None else datetime.fromtimestamp(pushed_at, UTC)


# How far ahead of our clock a push's time is still taken as one (clocks differ by seconds).
PUSH_CLOCK_SKEW = timedelta(hours=1)


def _moved_ages(earlier: Iterable[Family], catalog: Catalog) -> dict[str, datetime]:
    """The image ages of families that moved to another file unchanged (a config renamed):
    GitHub's blame follows a rename, and so does the age, rather than restart at the push."""
    gone: dict[tuple[str, str], datetime | None] = {}
    ambiguous: set[tuple[str, str]] = set()
    for family in earlier:
        if catalog.get(family.id) is None:
            moved = (family.key, family.normalized_image)
            # Two files' families alike, of different ages (one unknown), gone at once: whose
            # is whose is unknown, and neither age is carried.
            if moved in gone and gone[moved] != family.image_changed_at:
                ambiguous.add(moved)
            gone[moved] = family.image_changed_at
    for moved in ambiguous:
        gone[moved] = None
    if not gone:
        return {}
    known = {family.id for family in earlier}
    return {family.id: age for family in catalog
            if family.id not in known and (age := gone.get((family.key, family.normalized_image))) is not None}


class CatalogSync:
    def __init__(self, live: LiveState) -> None:
        self.live = live

    # -- events --------------------------------------------------------------------------

    async def on_push(self, state: RepoState, event: PushEvent) -> None:
        if event.ref.startswith(CLAIM_PREFIX):
            await self._on_claim_push(state, event)
            return
        if event.ref != f"refs/heads/{state.meta.default_branch}" or event.deleted:
            return
        before, after = event.before or ZERO_SHA, event.after
        async with self.live.lock(state.name):
            api = self.live.api(state)
            github_time = push_time(event)
            pushed_at = github_time or self.live.clock.now()
            known = state.meta.head_sha
            if known and (before != known or self._not_after_the_last(state, github_time)):
                # Not the push after the one applied: delivered late (applied, it took the
                # catalog back to an older commit for hours; a branch's creation, its before
                # zero, too), or one before it was lost; or a push from the known head older
                # than the last one seen (a force-push back to that head came first). The
                # branch is read where it is now, from the head applied.
                after = await api.head_sha(state.meta.default_branch)
                log.info("catalog.push_out_of_order", before=before[:12], after=event.after[:12],
                         known=known[:12], head=after[:12])
                if after == known:
                    self._note_push(state, github_time)
                    await self.live.persist(state.save_meta())
                    return
                before, pushed_at = known, pushed_at if after == event.after else self.live.clock.now()
            # A new default branch (before is zero) re-reads everything.
            changed = None if before == ZERO_SHA else await api.changed_paths(before, after)
            if changed is None:
                log.info("catalog.compare_unavailable", before=before[:12], after=after[:12])
            change = Change()
            health = _health(state)
            touched = await self.apply_change(state, api, changed, after, pushed_at, change)
            # Only once read: a push that failed halfway leaves the old head, so the light
            # reconcile sees it moved and reads everything again.
            state.meta.head_sha = after
            self._note_push(state, github_time)
            self._arm_canary(state, after, "push")
            if _health(state) != health or state.canary_armed:
                # Every Klaud check run shows the policy, config and setup state, and a pause.
                touched |= {f.id for f in state.catalog}
            state.save_meta(change)
            await self.live.persist(change)
        log.info(
            "catalog.updated",
            head=after[:12],
            files=sorted(changed) if changed is not None else "all",
            families=len(touched),
        )
        await self.live.notify(state, touched)

    def _not_after_the_last(self, state: RepoState, pushed_at: datetime | None) -> bool:
        """Whether a push is no later than the last one handled (to the second: GitHub's
        `pushed_at`; one in the same second is checked against the branch, one request)."""
        last = self._last_push(state)
        return pushed_at is not None and last is not None and pushed_at <= last

    def _note_push(self, state: RepoState, pushed_at: datetime | None) -> None:
        last = self._last_push(state)
        if pushed_at is not None and pushed_at <= self.live.clock.now() + PUSH_CLOCK_SKEW and (
                last is None or pushed_at > last):
            state.meta.last_push_at = stamp(pushed_at)

    def _last_push(self, state: RepoState) -> datetime | None:
        # One dated far ahead (a server's clock a year off) is no order: every later push
        # would have been checked against the branch, one request each, for good.
        last = parse_time(state.meta.last_push_at)
        return last if last is not None and last <= self.live.clock.now() + PUSH_CLOCK_SKEW else None

    async def _on_claim_push(self, state: RepoState, event: PushEvent) -> None:
        """Claim refs made or released elsewhere (another planner, a person) reach us as pushes.

        Klaud's own are skipped: it knows its claims when it makes and releases them, and
        their pushes may come late (a created one after the claim was released made a claim
        nobody holds; a deleted one dropped the claim the next wave had just made).
        """
        family = state.family_by_hash(event.ref[len(CLAIM_PREFIX):])
        if family is None or (event.sender is not None and self.live.is_bot(event.sender.login)):
            return
        async with self.live.lock(state.name):
            if event.deleted:
                change = state.drop_claim(family.id)
            elif family.id not in state.claims:
                ref = event.ref.removeprefix("refs/heads/")
                change = state.add_claim(Claim(family.id, family.candidate, None, ref, self.live.clock.now()))
            else:
                return
            await self.live.persist(change)

    # -- reading the default branch ------------------------------------------------------

    async def load(self, state: RepoState, api: RepoAPI, change: Change, repository: Repository) -> None:
        """The whole catalog at the default branch's head (install and full reconcile), with
        `repository` as GitHub describes it now."""
        note_repository(state, repository)
        state.meta.head_sha = await api.head_sha(state.meta.default_branch)
        ref = state.meta.head_sha
        _, policy_change = await self.refresh_policy(state, api, ref)
        change.extend(policy_change)
        await self.refresh_setup(state, api, ref)
        await self.refresh_runners(state, api, ref)
        paths = await self.config_paths(state, api, ref)
        for path in paths:
            change.extend(await self.refresh_config(state, api, path, ref, None))
        change.extend(drop_unlisted_configs(state, set(paths)))
        state.retouch()
        await self.date_images(state, api, change)

    async def date_images(self, state: RepoState, api: RepoAPI, change: Change) -> None:
        """Image ages still unknown come from the history: one blame per master config.

        GitHub may not answer (a timeout, a file too big to blame): the ages stay unknown
        and the next light reconcile asks again.
        """
        for path in sorted({f.path for f in state.catalog if f.image_changed_at is None}):
            try:
                ranges = await api.blame(path, state.meta.head_sha)
            except GitHubError as exc:
                log.warning("catalog.blame_failed", path=path, error=str(exc))
                continue
            dates = image_dates(state.catalog.families_of(path), [(r.start, r.end, r.committed) for r in ranges])
            change.extend(state.date_images(dates))

    async def catch_up(self, state: RepoState, api: RepoAPI, change: Change, repository: Repository) -> None:
        """A missed push shows as a moved head: re-read configs and policy at the new one
        (and a default branch changed since shows as a moved head too)."""
        note_repository(state, repository)
        head = await api.head_sha(state.meta.default_branch)
        if head == state.meta.head_sha:
            await self.date_images(state, api, change)  # asks again for what GitHub did not answer
            return
        # When the branch moved to it, from the repository's activity: the images it changed
        # are dated then (else when we noticed: an older GitHub Enterprise Server says not).
        moved_at = await api.moved_to_at(state.meta.default_branch, head)
        log.info("catalog.missed_push", old=state.meta.head_sha[:12], new=head[:12], moved_at=stamp(moved_at))
        await self.apply_change(state, api, None, head, moved_at or self.live.clock.now(), change)
        state.meta.head_sha = head
        await self.date_images(state, api, change)  # asks again for what GitHub did not answer
        # The push that moved it arms the canary of a paused repository; its webhook lost (or
        # the process dead before its commit), dispatch stayed paused until a person acted.
        # Only a push after the pause began may fix what paused it: one made before it, found
        # late, is no more a fix than a `/klaud resume` written before it.
        if await self._moved_since_pause(state, api, repository, moved_at):
            self._arm_canary(state, head, "missed push")  # stored with the reconcile's meta
        else:
            log.info("dispatch.canary_not_armed", repo=state.name, head=head[:12], moved_at=stamp(moved_at),
                     pushed_at=stamp(repository.pushed_at))

    @staticmethod
    async def _moved_since_pause(state: RepoState, api: RepoAPI, repository: Repository, moved_at: datetime | None) -> bool:
        """Whether the missed move of the default branch may have come after the pause:
        when the activity does not date it, the repository's last push (to any branch)
        came before the pause, so did this one. Read again before it is refused: the head
        may have moved after the repository was read."""
        if moved_at is not None:
            return pushed_since_pause(state, moved_at)
        return pushed_since_pause(state, repository.pushed_at) or pushed_since_pause(state, (await api.repository()).pushed_at)

    @staticmethod
    def _arm_canary(state: RepoState, head: str, by: str) -> None:
        if state.arm_canary():
            # A push may fix what paused dispatch: the next wave tries one candidate.
            log.info("dispatch.canary_armed", repo=state.name, by=by, head=head[:12])

    async def apply_change(
        self,
        state: RepoState,
        api: RepoAPI,
        changed: set[str] | None,
        ref: str,
        pushed_at: datetime,
        change: Change,
    ) -> set[str]:
        """Re-read what `changed` names (None: everything) at `ref`; the families whose image moved."""
        earlier = list(state.catalog)
        before = {f.id: f.image for f in earlier}
        reload_all = changed is None
        runners_moved = False
        workflow_changed = changed is None or workflow_path(state.policy.candidate_workflow) in changed
        if changed is None or POLICY_PATH in changed:
            old_policy = state.policy
            policy_changed, policy_change = await self.refresh_policy(state, api, ref)
            change.extend(policy_change)
            runners_moved = policy_changed and old_policy.runners_file != state.policy.runners_file
            if runners_moved:
                # The old file's problems are no longer the repository's.
                state.meta.config_errors.pop(old_policy.runners_file, None)
            if policy_changed and (old_policy.config_globs != state.policy.config_globs or runners_moved):
                reload_all = True
            workflow_changed = workflow_changed or policy_changed
        if workflow_changed:
            await self.refresh_setup(state, api, ref)
        # A policy naming another runners file reads it though the push did not change it.
        reread_runners = changed is None or runners_moved or state.policy.runners_file in changed
        if reread_runners and await self.refresh_runners(state, api, ref):
            reload_all = True
        if reload_all:
            paths = set(await self.config_paths(state, api, ref))
            # Deleted, or no longer matched by `config_globs`: read again, a file the globs
            # dropped kept all its families live and planned until a full reconcile.
            change.extend(drop_unlisted_configs(state, paths))
        else:
            paths = {p for p in changed or () if is_master_config(p, state.policy.config_globs)}
        for path in sorted(paths):
            # A file the push did not change (read again because the globs or runners moved)
            # changed no image line: a family new to the catalog there is a backfill, dated by
            # its history (the next light reconcile's blame), not by this push.
            dated = pushed_at if changed is None or path in changed else None
            change.extend(await self.refresh_config(state, api, path, ref, dated))
        if not reload_all and paths and (POLICY_PATH in state.meta.config_errors or not state.catalog):
            # The first master config pushed (or the last deleted): whether the globs match a
            # file is the listing's to say, not the last full reconcile's.
            change.extend(drop_unlisted_configs(state, set(await self.config_paths(state, api, ref))))
        change.extend(state.date_images(_moved_ages(earlier, state.catalog), unknown_only=False))
        state.retouch()
        after = {f.id: f.image for f in state.catalog}
        return {fid for fid in before.keys() | after.keys() if before.get(fid) != after.get(fid)}

    async def config_paths(self, state: RepoState, api: RepoAPI, ref: str) -> list[str]:
        paths: set[str] = set()
        folders = {(glob_directory(p), spans_folders(p)) for p in state.policy.config_globs}
        for folder, nested in sorted(folders):
            for path in await api.directory(folder, ref, nested=nested):
                if is_master_config(path, state.policy.config_globs):
                    paths.add(path)
        return sorted(paths)

    async def refresh_runners(self, state: RepoState, api: RepoAPI, ref: str) -> bool:
        """Re-read runners.yaml; False keeps the last good runners (and records why).

        Runner names that resolve to no declared cluster are recorded as its configuration
        errors, one a line (`config_errors` holds path -> problems, one per line).
        """
        path = state.policy.runners_file
        text = await api.file_text(path, ref)
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
        state.meta.runners = runners.document()
        if runners.problems:
            state.meta.config_errors[path] = "\n".join(runners.problems)
            log.warning("catalog.runners_unresolved", path=path, problems=list(runners.problems))
        else:
            state.meta.config_errors.pop(path, None)
        return True

    async def refresh_config(
        self, state: RepoState, api: RepoAPI, path: str, ref: str, changed_at: datetime | None
    ) -> Change:
        """Re-parse one master config; unparseable text keeps the last good families of the file.

        Blocks left out and runner labels that name no declared cluster are recorded as the
        file's configuration errors, one a line.
        """
        text = await api.file_text(path, ref)
        if text is None:
            return state.remove_config(path)
        runners = Runners.from_document(state.meta.runners)
        if runners is None and state.meta.runners:
            # Label -> cluster ids, as an older version stored them: read runners.yaml again.
            await self.refresh_runners(state, api, ref)
            runners = Runners.from_document(state.meta.runners)
        try:
            parsed = read_master(path, text, runners)
        except CatalogError as exc:
            state.meta.config_errors[path] = str(exc)
            log.warning("catalog.config_invalid", path=path, error=str(exc))
            return Change()
        # An unchanged image keeps its date; a changed or new one is dated by the push that
        # brought it (a backfill passes None: it does not know).
        change = state.replace_families(path, list(parsed.families), changed_at)
        if parsed.problems:
            state.meta.config_errors[path] = "\n".join(parsed.problems)
            log.warning("catalog.config_problems", path=path, problems=list(parsed.problems))
        return change

    async def refresh_setup(self, state: RepoState, api: RepoAPI, ref: str) -> None:
        """Check the candidate workflow at `ref` (DESIGN §4 "Setup errors")."""
        workflow = state.policy.candidate_workflow
        text = await api.file_text(workflow_path(workflow), ref)
        errors = workflow_setup_errors(workflow, text, state.policy.candidate_inputs.values())
        if not state.set_setup_errors(errors, self.live.clock.now()):
            return
        if errors:
            log.warning("setup.error", repo=state.name, errors=[e.detail for e in errors])
        else:
            log.info("setup.fixed", repo=state.name)

    async def refresh_policy(self, state: RepoState, api: RepoAPI, ref: str) -> tuple[bool, Change]:
        text = await api.file_text(POLICY_PATH, ref)
        changed, change = state.set_policy_text(text, self.live.clock.now())
        if state.meta.policy_error:
            log.warning("policy.invalid", error=state.meta.policy_error)
        return changed, change


def note_repository(state: RepoState, repository: Repository) -> None:
    """What of the repository itself the state keeps: its default branch and its id."""
    state.meta.default_branch = repository.default_branch
    if repository.id is not None:
        state.meta.repo_id = repository.id


def pushed_since_pause(state: RepoState, last_push: datetime | None) -> bool:
    """Whether a push missed may have come after dispatch paused, it or a later one being
    at `last_push`: when GitHub does not say, it may; GitHub's times are whole seconds, and
    its clock and this host's a little apart."""
    since = parse_time(state.meta.pause["since"]) if state.meta.pause else None
    return since is None or last_push is None or last_push >= since.replace(microsecond=0) - CLOCK_SKEW
