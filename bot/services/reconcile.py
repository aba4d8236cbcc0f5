"""Rebuilding local state from GitHub: at install, for a repository first heard of, and as a
light pass every few hours that catches missed events.

Local state is a cache of GitHub that can always be rebuilt. A full reconcile reads the
default branch's catalog and policy, the open PRs with their files, the claim refs and the
completed runs of the last days; a light one reads the default branch's head (configs and
policy only when it moved) and the open PRs' heads (files only for heads that moved).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import msgspec
import structlog

from bot.core.clock import retry_due
from bot.core.domain import stamp
from bot.core.errors import ReconcileFailed, RepositoryMoved
from bot.core.events import (
    RECONCILE_REQUEST,
    Named,
    ReconcileRequest,
    RepoEvent,
    Repository,
    RequestAction,
)
from bot.github.errors import GitHubError, NotFound
from bot.services.api import RepoAPI, ReposAPI
from bot.services.catalog_sync import CatalogSync
from bot.services.claims import ClaimKeeper
from bot.services.dashboard import DashboardKeeper
from bot.services.live import LiveState
from bot.services.missed_comments import MissedComments
from bot.services.outcomes import CLOCK_SKEW, OutcomeRecorder
from bot.services.pulls import PullSync
from bot.services.repo_state import RepoState
from bot.store.change import Change
from bot.store.deliveries import Delivery, DeliveryStore
from bot.store.records import StoredRepo

log = structlog.get_logger("klaud.reconcile")


# Backoff of a failed reconcile: a minute, doubling up to an hour.
FIRST_RETRY = timedelta(minutes=1)
MAX_RETRY = timedelta(hours=1)
DOUBLINGS = 16  # past MAX_RETRY long before: only keeps the power finite
DISCOVERY = "installations"


def retry_delay(attempts: int) -> timedelta:
    """How long to wait before trying again work that failed `attempts` times in a row
    (defined for any count: failing for days must not overflow the doubling)."""
    return min(FIRST_RETRY * 2 ** min(max(attempts - 1, 0), DOUBLINGS), MAX_RETRY)


@dataclass(frozen=True, slots=True)
class ReconcileFailure:
    installation: int
    error: str
    attempts: int
    next_at: datetime
    since: datetime  # the first failure of this run of failures

    def document(self) -> dict[str, object]:
        return {"error": self.error, "attempts": self.attempts, "retry_at": stamp(self.next_at)}


class Reconciler:
    def __init__(
        self,
        live: LiveState,
        catalog: CatalogSync,
        pulls: PullSync,
        outcomes: OutcomeRecorder,
        claims: ClaimKeeper,
        dashboard: DashboardKeeper | None = None,
        comments: MissedComments | None = None,
    ) -> None:
        self.live = live
        self.dashboard = dashboard
        self.catalog = catalog
        self.pulls = pulls
        self.outcomes = outcomes
        self.claims = claims
        self.comments = comments
        # Repository (or "installations") -> its last failed reconcile, until one succeeds
        # or the repository is gone (uninstalled: retried, it would fail every hour for good).
        self.failures: dict[str, ReconcileFailure] = {}
        # With replicas, the inbox through which a repository another replica holds is
        # reconciled by that one (`reconcile_request`).
        self.requests: DeliveryStore | None = None
        live.gone_listeners.append(self._gone)

    def _gone(self, repo: str) -> None:
        self.failures.pop(repo, None)

    async def state_for(self, event: RepoEvent) -> RepoState | None:
        """The event's repository, reconciled first if this is the first we hear of it.

        Events name a repository as it was called when they were sent: one renamed since
        (or before, the event queued behind the rename) is found by its id. One another
        replica keeps under its new name raises `RepositoryMoved`: that replica processes it
        (a command in it would otherwise go unanswered, and its change unseen until the
        owner's next reconcile).
        """
        name, installation = event.repository.full_name, event.installation.id
        state = self._kept_as(name, event.repository.id) or await self._same_repository(event)
        if state is not None and state.meta.installation != installation:
            state = await self._through_installation(state, event)
        if state is None:
            kept_as = await self._kept_elsewhere_by_id(event.repository.id, name)
            if kept_as is not None:
                raise RepositoryMoved(kept_as)
            try:
                report = await self.reconcile(name, installation)
            except GitHubError as exc:
                if exc.transient:
                    # Tried again with backoff (not only at the next event or discovery), and
                    # remembered as when Klaud first heard of it (`_rebuild`).
                    self._note_failure(name, installation, str(exc))
                raise
            state = self._kept_as(name, event.repository.id)
            if state is not None:
                self.failures.pop(name, None)  # reconciled: no longer failing, nothing to retry
            if state is None and "moved_from" in report and "skipped" in report:
                raise RepositoryMoved(report["repo"])
        return state

    async def _through_installation(self, state: RepoState, event: RepoEvent) -> RepoState | None:
        """The repository of an event sent through another installation than the kept one:
        the App installed again (or the repository moved to another account's installation)
        while the installation events were lost, the kept one reaching it no more; or a late
        event of the old installation. GitHub tells which, asked as the App (a public
        repository reads through any installation: a read alone cannot): a new one is
        adopted with a light reconcile, which catches up what was lost meanwhile. GitHub
        unwell fails the delivery, tried again."""
        kept, github = state.meta.installation, self.live.github
        try:
            current = await github.installation_of(state.name) if github is not None else None
            if current is not None and current != kept:
                await self.reconcile(state.name, current, light=True)
        except GitHubError as exc:
            if exc.transient:
                raise
            log.info("live.installation_kept", repo=state.name, installation=kept, error=str(exc))
        else:
            if current is None or current == kept:  # a late event of an installation it left
                log.info("live.installation_kept", repo=state.name, installation=kept, sent_by=event.installation.id)
        return self._kept_as(event.repository.full_name, event.repository.id)

    async def _kept_elsewhere_by_id(self, repo_id: int | None, name: str) -> str | None:
        """The other name than `name` that `repo_id` is stored under, when another process
        may keep it. A renamed repository's events (and discovery) come under the new name,
        whose lease this replica may hold: built here from GitHub, it would be a second
        state beside the keeper's (its holds and wave counter lost when the two meet); the
        keeper follows the rename instead."""
        if repo_id is None:
            return None
        stored = await self.live.store.name_of(repo_id)
        if stored is None or stored.lower() == name.lower() or self.live.repo(stored):
            return None
        # Stored under a name this process owns but could not load: handed on, it would
        # come back here; rebuilt from GitHub instead, as before replicas.
        return stored if self.live.kept_elsewhere(stored) else None

    def _kept_as(self, name: str, repo_id: int | None) -> RepoState | None:
        """The state kept under `name`, or under the name a repository once called so moved
        to, when it is that repository: a name freed by a rename may be another's now."""
        for state in (self.live.repo(name), self.live.renamed(name)):
            if state is not None and (repo_id is None or state.meta.repo_id in (None, repo_id)):
                return state
        return None

    async def _same_repository(self, event: RepoEvent) -> RepoState | None:
        """The event's repository kept here under another name: GitHub says which name is
        the current one (a light reconcile follows a rename), and the other is remembered."""
        same = self.live.by_id(event.repository.id)
        if same is None:
            return None
        kept = same.name
        await self.reconcile(kept, event.installation.id, light=True)
        name = event.repository.full_name
        if self.live.repo(kept) is same:  # not renamed: the event's name is the older one
            self.live.former[name.lower()] = kept
        return self._kept_as(name, event.repository.id)

    async def reconcile(self, name: str, installation: int, *, light: bool = False) -> dict[str, Any]:
        """Rebuild a repository from GitHub; `light` re-reads only what may have moved.

        A repository GitHub now calls by another name (renamed or transferred; its API
        answers the old name with a redirect) moves to that name, and is reconciled there.
        """
        async with self.live.lock(name):
            known = self.live.repo(name)
            if known is None and not await self.live.admit(name):
                # Skipped without a word, the reconcile an installation event or a discovery
                # asked for was lost: the holder may keep the repository (an unsuspend must
                # read it again) or hold it for an event that builds no state (it lets go
                # once done, and the repository had no state anywhere for hours).
                asked = await self._ask_holder(name, installation, action="light" if light else "full")
                log.info("live.reconcile_skipped", repo=name, reason="another replica owns the repository", asked=asked)
                return {"repo": name, "light": light, "skipped": "another replica owns the repository", "asked": asked}
            # A repository just taken over may have stored state that is not in memory yet:
            # rebuilt from GitHub alone, its wave counter, pause and dispatches would be lost.
            stored = known or await self.live.load_repo(name)
            state = stored or self.live.new_state(name, installation)
            # Through an installation that cannot reach it (a late event of one removed since),
            # GitHub's refusal leaves the section: memory is read back, the kept one stays.
            state.meta.installation = installation
            api = self.live.api(state)
            repository = await api.repository()
            moved = repository.full_name if repository.full_name.lower() != name.lower() else None
            # The name is another repository's now (the kept one's rename was missed and
            # the name reused), or the repository is kept under an earlier name.
            replaced = stored if moved is None and _another(stored, repository) else None
            earlier = self.live.by_id(repository.id) if moved is None and stored is None else None
            keeper = None
            if moved is None and stored is None and earlier is None:
                # Kept by another replica under an earlier name (its rename not seen yet): built
                # here too, it would be a second state of the repository; its keeper follows.
                keeper = await self._kept_elsewhere_by_id(repository.id, name)
            if keeper is not None:
                asked = await self._ask_holder(keeper, installation, action="light")
                log.info("live.reconcile_skipped", repo=name, reason=f"kept by another replica as {keeper}", asked=asked)
                return {"repo": name, "light": light, "skipped": f"kept by another replica as {keeper}", "asked": asked}
            if moved is None and replaced is None and earlier is None:
                # With no state kept, a light reconcile has nothing to catch up from.
                report = await self._rebuild(state, stored is None, api, repository, light=light and stored is not None)
        if moved is not None:
            return await self._follow(name, moved, installation, light=light)
        if earlier is not None:
            return await self._follow(earlier.name, name, installation, light=light)
        if replaced is not None:
            return await self._name_reused(replaced, installation)
        if self.comments is not None:
            # Outside the lock: answering a command takes it.
            report.update(await self.comments.sweep(state))
        log.info("live.reconciled", **report)
        await self.live.notify(state, {f.id for f in state.catalog})
        return report

    async def _ask_holder(self, name: str, installation: int, *, action: RequestAction) -> bool:
        if self.requests is None:
            return False
        await self.requests.put(reconcile_request(name, installation, action))
        return True

    async def requested(self, request: ReconcileRequest) -> None:
        """Another replica's request (`klaud_reconcile`) for a repository this one holds;
        ReconcileFailed when GitHub failed it (tried again here with backoff)."""
        name, installation = request.repository.full_name, request.installation.id
        if request.action == "ensure" and self.live.repo(name) is not None:
            return
        problem = await self._reconcile_noting_failure(name, installation, light=request.action == "light")
        if problem is not None:
            raise ReconcileFailed(f"{name}: {problem}")

    async def _follow(self, old: str, new: str, installation: int, *, light: bool) -> dict[str, Any]:
        log.info("live.repository_moved", repo=old, to=new)
        kept = await self.live.rename(old, new)
        # What moved is complete already: a light reconcile catches up at the new name.
        report = await self.reconcile(new, installation, light=light and kept is not None)
        return {**report, "moved_from": old}

    async def _name_reused(self, kept: RepoState, installation: int) -> dict[str, Any]:
        """GitHub gives the kept state's name to another repository: the kept one is followed
        to its name now (by its id), or forgotten when the installation no longer sees it;
        then the name is reconciled as the repository it is now."""
        name, github = kept.name, self.live.github
        current = None
        if github is not None and kept.meta.repo_id is not None:
            current = await github.repository_by_id(installation, kept.meta.repo_id)
        log.warning("live.name_reused", repo=name, kept_id=kept.meta.repo_id, now=current.full_name if current else None)
        if current is not None and current.full_name.lower() != name.lower():
            await self._follow(name, current.full_name, installation, light=True)
        else:
            await self.live.forget(name)
        return await self.reconcile(name, installation)

    async def _rebuild(
        self, state: RepoState, new: bool, api: RepoAPI, repository: Repository, *, light: bool
    ) -> dict[str, Any]:
        before = _counts(state)
        change = Change()
        if light:
            await self.catalog.catch_up(state, api, change, repository)
        else:
            await self.catalog.load(state, api, change, repository)
        pulls = await self._pulls(state, api, change)
        if light:
            await self.claims.light(state, api, change)
        else:
            await self.claims.sync_refs(state, api, change, self.live.clock.now())
            await self.outcomes.recent_runs(state, api, change)
            if new and self.dashboard is not None:
                # No local state: holds and retries come back from the dashboard issue.
                await self.dashboard.restore(state, api, change)
        failed = self.failures.get(state.name)
        if new and failed is not None and state.meta.comments_swept_at is None:
            # Heard of before GitHub let it be read: the comments made since (whose deliveries
            # failed with the reconcile they needed) are looked at by the first sweep.
            state.meta.comments_swept_at = stamp(failed.since)
        state.meta.reconciled_at = stamp(self.live.clock.now())
        state.save_meta(change)
        self.live.put(state)
        await self.live.persist(change)
        return {"repo": state.name, "light": light, "before": before, "after": _counts(state), **pulls}

    # -- installations ------------------------------------------------------------------

    def installation_repos(self, installation: int) -> list[str]:
        """The repositories this process keeps for `installation`."""
        return sorted(state.name for state in self.live.repos.values() if state.meta.installation == installation)

    async def stored_installation_repos(self, installation: int) -> list[str]:
        """The repositories kept for `installation` by any replica (GitHub names none in
        the payloads of `suspend` and `unsuspend`): the leader, which handles them, keeps
        only its share in memory."""
        return sorted(repo.name for repo in await self.live.store.stored_repos() if repo.installation == installation)

    async def reconcile_all(self, installation: int, names: Iterable[str], *, light: bool = False) -> None:
        """Reconcile each repository an installation event names. One GitHub fails on must not
        leave the others unreconciled (nor, after it, the removed ones remembered): it is
        retried with backoff like a failed discovery, or skipped when GitHub no longer has it
        (the next discovery finds it, should it come back)."""
        for name in names:
            await self._reconcile_noting_failure(name, installation, light=light)

    async def _reconcile_noting_failure(self, name: str, installation: int, *, light: bool) -> str | None:
        """Reconcile `name`: what went wrong on GitHub, if anything (a failure is remembered
        and tried again with backoff; a repository GitHub no longer has is left to discovery)."""
        try:
            await self.reconcile(name, installation, light=light)
        except NotFound as exc:
            log.warning("reconcile.gone", repo=name, installation=installation, error=str(exc))
            return f"GitHub no longer has it ({exc})"
        except GitHubError as exc:
            self._note_failure(name, installation, str(exc))
            return f"{exc} (tried again with backoff)"
        self.failures.pop(name, None)
        return None

    async def forget(self, installation: int, repositories: Iterable[Named]) -> None:
        """Forget the repositories `installation` no longer has, found by id or by name (one
        renamed while its event was lost), here or in the store (kept by another replica),
        and only while this installation keeps them: after an uninstall and a re-install,
        the old installation's `deleted` may come last."""
        stored: _Stored | None = None
        for repo in repositories:
            state = self.live.by_id(repo.id) or self.live.repo(repo.full_name)
            kept = _as_stored(state) if state is not None else None
            if kept is None:
                stored = _Stored(await self.live.store.stored_repos()) if stored is None else stored
                kept = stored.find(repo)
            if kept is not None and None not in (repo.id, kept.repo_id) and kept.repo_id != repo.id:
                # A repository deleted, then created again under its name: the late event of
                # the old one would forget the new one.
                log.info("installation.forget_skipped", repo=kept.name, gone_id=repo.id, kept_id=kept.repo_id)
                continue
            if kept is not None and kept.installation not in (None, installation):
                log.info("installation.forget_skipped", repo=kept.name, installation=installation,
                         kept_for=kept.installation)
                continue
            # Stored nowhere: forgotten by its name all the same, whose lease passes here, so
            # that a replica admitting it right now stops writing it.
            await self.live.forget(kept.name if kept is not None else repo.full_name)

    async def uninstall(self, installation: int, repositories: Iterable[Named]) -> None:
        """The App was uninstalled from an account: its repositories are forgotten, a failed
        listing of the installation is not tried again, and once no kept repository uses
        it (one re-installed since keeps it), its GitHub client goes too."""
        await self.forget(installation, repositories)
        self.failures.pop(_listing(installation), None)
        if self.live.github is not None and not self.installation_repos(installation):
            self.live.github.forget_installation(installation)

    async def reconcile_new_installations(self) -> list[str]:
        """Reconcile every installed repository that has no local state yet, and forget the
        kept ones GitHub no longer lists (deleted, or their installation removed while the
        event was lost).

        GitHub trouble never stops Klaud from serving: a repository whose reconcile fails is
        remembered with its error and tried again with backoff (`retry_failed`), and the
        failures show in the admin API (`GET /api/v1/repos`, `failing`).
        """
        github = self.live.github
        done: list[str] = []
        if github is None:
            return done
        # Taken before listing: a repository an event adds meanwhile is not in the listing.
        # The store has those the other replicas keep too (the leader alone discovers).
        kept = dict(self.live.repos)
        stored = _Stored(await self.live.store.stored_repos())
        try:
            installations = await github.installations()
        except GitHubError as exc:
            self._note_failure(DISCOVERY, 0, str(exc))
            return done
        self.failures.pop(DISCOVERY, None)
        self._drop_listings_of_uninstalled(set(installations))
        listed: list[Repository] = []
        complete = True
        for installation in installations:
            try:
                repositories = await github.repositories(installation)
            except GitHubError as exc:
                self._note_failure(_listing(installation), installation, str(exc))
                complete = False
                continue
            self.failures.pop(_listing(installation), None)
            listed.extend(repositories)
            for repo in repositories:
                # One kept under an earlier name is followed by its own reconciles and events,
                # here or at the replica keeping it (built here, it would be a second state).
                known = self.live.repo(repo.full_name) or self.live.by_id(repo.id)
                if known is not None and known.meta.installation != installation:
                    # Installed again (or moved to another account's installation) while its
                    # events were lost: the kept installation reaches it no more.
                    await self._reconcile_noting_failure(known.name, installation, light=True)
                    continue
                if known is None and await self._kept_elsewhere_by_id(repo.id, repo.full_name):
                    continue
                # Kept by another replica under this name: its own reconciles keep it current.
                # Its holder is only asked to make sure it has a state (one whose stored record
                # it could not read has none): asked to reconcile, it would rebuild the
                # repository at every discovery. Kept for another installation, it is asked
                # to follow this one, as above.
                found = stored.find(repo) if known is None else None
                if found is not None and self.live.kept_elsewhere(repo.full_name):
                    moved = found.installation is not None and found.installation != installation
                    await self._ask_holder(repo.full_name, installation, action="light" if moved else "ensure")
                    continue
                if known is None and await self._try_reconcile(repo.full_name, installation):
                    done.append(repo.full_name)
        if complete:
            # A failed listing may hide any repository (one moved to that installation too):
            # only a discovery that listed every installation forgets.
            await self._forget_unlisted(github, kept, stored.repos, listed)
            self._forget_clients_of_uninstalled(github, kept, set(installations))
        return done

    def _forget_clients_of_uninstalled(
        self, github: ReposAPI, kept: dict[str, RepoState], installations: set[int]
    ) -> None:
        """The GitHub clients of installations removed while their event was lost, once no
        kept repository uses them."""
        for installation in {state.meta.installation for state in kept.values()} - installations:
            if not self.installation_repos(installation):
                github.forget_installation(installation)

    async def _forget_unlisted(
        self, github: ReposAPI, kept: dict[str, RepoState], stored: list[StoredRepo], listed: list[Repository]
    ) -> None:
        """Forget the repositories kept before the listing (here, or by another replica: in
        the store) that no installation lists, once GitHub confirms it has none with their id
        (a listing may lag behind an install)."""
        ids = {repo.id for repo in listed}
        names = {repo.full_name.lower() for repo in listed}
        # Memory comes last: what this process keeps is newer than its stored record.
        snapshot: dict[str, tuple[StoredRepo, RepoState | None]] = {repo.name.lower(): (repo, None) for repo in stored}
        snapshot.update({key: (_as_stored(state), state) for key, state in kept.items()})
        for key, (repo, state) in snapshot.items():
            # Without an id (stored by an older version) GitHub cannot confirm: its next
            # reconcile stores one.
            if repo.repo_id is None or repo.installation is None or repo.repo_id in ids or key in names:
                continue
            try:
                if await github.repository_by_id(repo.installation, repo.repo_id) is not None:
                    continue
            except GitHubError as exc:
                log.warning("discovery.unlisted_unconfirmed", repo=repo.name, error=str(exc))
                continue
            if await self._unchanged_since_listing(key, repo, state):
                log.info("discovery.repository_unlisted", repo=repo.name, installation=repo.installation)
                await self.live.forget(repo.name)

    async def _unchanged_since_listing(self, key: str, repo: StoredRepo, state: RepoState | None) -> bool:
        """Whether the repository is kept as it was before the listing: not removed, re-added
        (for another installation) or handed over meanwhile, here or at another replica."""
        if state is not None:
            return self.live.repo(key) is state
        if self.live.repo(key) is not None:
            return False
        return _Stored(await self.live.store.stored_repos()).find(Named(full_name=repo.name, id=repo.repo_id)) == repo

    def _drop_listings_of_uninstalled(self, installations: set[int]) -> None:
        """Failed listings of installations GitHub no longer lists: there is nothing left to
        list (retried, each would be due again at every tick)."""
        for name, failure in list(self.failures.items()):
            if _is_listing(name) and failure.installation not in installations:
                del self.failures[name]

    async def retry_failed(self) -> None:
        """Try again every failed reconcile whose backoff has passed."""
        now = self.live.clock.now()
        due = [(name, f) for name, f in self.failures.items() if retry_due(f.next_at, now, retry_delay(f.attempts))]
        listings = [(name, f) for name, f in due if name == DISCOVERY or _is_listing(name)]
        if listings:
            await self.reconcile_new_installations()  # one discovery retries them all
        for name, failure in listings:
            if self.failures.get(name) is failure:
                # Neither cleared nor failed again (the installations' own listing failed
                # first): backed off from all the same, else due at every tick.
                self._note_failure(name, failure.installation, failure.error)
        for name, failure in due:
            if name != DISCOVERY and not _is_listing(name):
                await self._try_reconcile(name, failure.installation)

    async def _try_reconcile(self, name: str, installation: int) -> bool:
        try:
            await self.reconcile(name, installation)
        except NotFound as exc:
            # GitHub no longer has it (deleted, or the App's access removed with its webhook
            # lost): left to discovery, as `_reconcile_noting_failure` does. Noted, it was
            # asked of GitHub every hour for as long as the process ran.
            log.warning("reconcile.gone", repo=name, installation=installation, error=str(exc))
            self.failures.pop(name, None)
            return False
        except GitHubError as exc:
            self._note_failure(name, installation, str(exc))
            return False
        # The store refusing writes, or a bug: backed off from too (its traceback logged),
        # else the retry stayed due and called GitHub at every tick while it lasted.
        except Exception as exc:
            log.exception("reconcile.failed_unexpectedly", repo=name)
            self._note_failure(name, installation, str(exc))
            return False
        self.failures.pop(name, None)
        return True

    def _note_failure(self, name: str, installation: int, error: str) -> None:
        previous = self.failures.get(name)
        attempts = previous.attempts + 1 if previous is not None else 1
        now = self.live.clock.now()
        since = previous.since if previous is not None else now
        failure = ReconcileFailure(installation, error, attempts, now + retry_delay(attempts), since)
        self.failures[name] = failure
        log.warning("reconcile.failed", repo=name, error=failure.error, attempts=attempts, retry_at=stamp(failure.next_at))

    async def _pulls(self, state: RepoState, api: RepoAPI, change: Change) -> dict[str, int]:
        seen: set[int] = set()
        fetched = 0
        async for pull in api.open_pulls():
            seen.add(pull.number)
            fetched += await self.pulls.refresh(state, api, pull, change)
        closed = []
        for number in [p.number for p in state.overlap.prs() if p.number not in seen]:
            # GitHub pages the listing by offset: a PR closed while the pages were read moves
            # another onto a page already read, never listed. Unlisted is not closed until
            # GitHub says so (one request per PR a listing leaves out, a lost close mostly).
            found = await api.pull(number)
            if found is not None and found.state == "open":
                seen.add(number)
                fetched += await self.pulls.refresh(state, api, found, change)
            else:
                closed.append(number)
        for number in closed:
            # Closed before this listing: an event of it delivered later and older than that
            # is ignored. A minute's margin for GitHub's clock against ours: a reopen just
            # after the listing must not be taken for old (then it stays out of the index).
            change.extend(state.remove_pull(number, self.live.clock.now() - CLOCK_SKEW))
        return {"open_pulls": len(seen), "files_fetched": fetched, "pulls_removed": len(closed)}


def reconcile_request(name: str, installation: int, action: RequestAction) -> Delivery:
    """The delivery asking the replica holding `name` to reconcile it (`RECONCILE_REQUEST`)."""
    body = {"action": action, "repository": {"full_name": name}, "installation": {"id": installation}}
    return Delivery(
        id=f"klaud-{uuid.uuid4()}", event=RECONCILE_REQUEST, body=msgspec.json.encode(body), action=action,
        repo=name, installation=installation, headers={"X-GitHub-Event": RECONCILE_REQUEST},
    )


def _as_stored(state: RepoState) -> StoredRepo:
    return StoredRepo(state.name, state.meta.installation, state.meta.repo_id)


class _Stored:
    """The repositories in the store, found by id or by name (a discovery looks up each
    listed repository: a scan of the list for each was quadratic in an installation's size)."""

    def __init__(self, repos: list[StoredRepo]) -> None:
        self.repos = repos
        self._by_id = {repo.repo_id: repo for repo in reversed(repos) if repo.repo_id is not None}
        self._by_name = {repo.name.lower(): repo for repo in reversed(repos)}

    def find(self, repo: Named | Repository) -> StoredRepo | None:
        """The stored repository `repo` is: the one with its id, else the one of its name."""
        by_id = self._by_id.get(repo.id) if repo.id is not None else None
        return by_id or self._by_name.get(repo.full_name.lower())


def _listing(installation: int) -> str:
    """The failure's key when listing `installation`'s repositories failed."""
    return f"installation {installation}"


def _is_listing(name: str) -> bool:
    return name.startswith("installation ")


def _another(kept: RepoState | None, repository: Repository) -> bool:
    """Whether GitHub answers the kept state's name with a repository that is not it."""
    return (
        kept is not None and kept.meta.repo_id is not None and repository.id is not None
        and repository.id != kept.meta.repo_id
    )


def _counts(state: RepoState) -> dict[str, int]:
    return {
        "families": len(state.catalog),
        "pulls": len(state.overlap.prs()),
        "attempts": len(state.ledger),
        "claims": len(state.claims),
    }
