"""The live state of every installed repository, kept current by events.

`LiveState` owns the `RepoState`s, the store that persists them and the per-repository
locks that keep handlers, waves, reconciles and background retries from interleaving
their changes. Handlers call the `on_*` methods; each reads at most what its event needs
from GitHub (bot.services.sync) and persists the change before returning.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any, Awaitable, Callable

import structlog

from bot.core.clock import Clock
from bot.core.catalog import is_master_config
from bot.services.dispatch import release_claim
from bot.core.domain import Attempt, Claim, parse_time, stamp
from bot.github.client import GitHubApp, GitHubError, InstallationClient, NotFound
from bot.core.outcomes import (
    ReceiptError,
    RunInfo,
    attempt_from_outcome,
    next_retry_at,
    parse_receipt,
    unverified_attempt,
)
from bot.core.policy import POLICY_PATH
from bot.settings import Settings
from bot.services.repo_state import RepoMeta, RepoState
from bot.store.records import Change, StateStore
from bot.services.sync import (
    ArtifactRead,
    config_paths,
    is_outcome_workflow,
    load_catalog,
    pull_changes,
    pull_from_payload,
    read_artifact,
    read_run_outcomes,
    recent_cutoff,
    refresh_config,
    refresh_policy,
    refresh_runners,
    run_info,
    split_repo,
)

log = structlog.get_logger("klaud.live")

CLAIM_PREFIX = "refs/heads/klaud/claim-"
ATTEMPT_MEMORY = timedelta(days=14)
ZERO_SHA = "0" * 40

# Called with (repo, reason) whenever something a check run shows may have changed.
Listener = Callable[[RepoState, set[str]], Awaitable[None]]


class LiveState:
    def __init__(self, store: StateStore, github: GitHubApp | None, settings: Settings, clock: Clock) -> None:
        self.store = store
        self.github = github
        self.settings = settings
        self.clock = clock
        self.repos: dict[str, RepoState] = {}
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.listeners: list[Listener] = []
        self._rng = random.Random()

    def lock(self, repo: str) -> asyncio.Lock:
        return self._locks[repo.lower()]

    def repo(self, name: str) -> RepoState | None:
        return self.repos.get(name)

    def client(self, state: RepoState) -> InstallationClient:
        if self.github is None:
            raise RuntimeError("no GitHub client configured (KLAUD_APP_ID and a private key, or --sandbox)")
        return self.github.installation(state.meta.installation)

    async def load(self) -> None:
        """Rebuild every repository's in-memory state from the store (no GitHub call).

        Attempts older than ATTEMPT_MEMORY stay in the store only: cooldowns look back at
        most 168 hours and artifacts live 14 days.
        """
        since = stamp(self.clock.now() - ATTEMPT_MEMORY)
        for name in await self.store.repos():
            records = await self.store.load(name, attempts_since=since)
            meta = await self.store.get("", "repo", name)
            self.repos[name] = RepoState.from_records(name, records, meta)
        log.info("live.loaded", repositories=len(self.repos))

    async def persist(self, change: Change) -> None:
        await self.store.apply(change)

    async def notify(self, state: RepoState, families: set[str]) -> None:
        """Tell listeners (check runs) which families' state changed."""
        if families:
            for listener in self.listeners:
                await listener(state, families)

    # -- reconcile ---------------------------------------------------------------------

    async def reconcile(self, name: str, installation: int, *, light: bool = False) -> dict[str, Any]:
        """Rebuild a repository from GitHub; `light` re-reads only the open PRs' heads."""
        async with self.lock(name):
            state = self.repos.get(name) or RepoState(name, RepoMeta(installation=installation))
            state.meta.installation = installation
            gh = self.client(state)
            before = _counts(state)
            change = Change()
            if light:
                await self._catch_up_default_branch(state, gh, change)
            else:
                await self._reconcile_default_branch(state, gh, change)
            pulls = await self._reconcile_pulls(state, gh, change)
            if not light:
                await self._reconcile_claims(state, gh, change)
                await self._reconcile_runs(state, gh, change)
            state.meta.reconciled_at = stamp(self.clock.now())
            state.save_meta(change)
            self.repos[name] = state
            await self.persist(change)
        report = {"repo": name, "light": light, "before": before, "after": _counts(state), **pulls}
        log.info("live.reconciled", **report)
        await self.notify(state, {f.id for f in state.catalog})
        return report

    async def _reconcile_default_branch(self, state: RepoState, gh: InstallationClient, change: Change) -> None:
        repo = await gh.getitem("/repos/{owner}/{repo}", split_repo(state.name))
        state.meta.default_branch = repo.get("default_branch") or "main"
        commit = await gh.getitem(
            "/repos/{owner}/{repo}/commits/{ref}", {**split_repo(state.name), "ref": state.meta.default_branch}
        )
        state.meta.head_sha = commit["sha"]
        _, policy_change = await refresh_policy(state, gh, state.meta.head_sha)
        change.extend(policy_change)
        change.extend(await load_catalog(state, gh, state.meta.head_sha))
        state.retouch()

    async def _catch_up_default_branch(self, state: RepoState, gh: InstallationClient, change: Change) -> None:
        """A missed push shows as a moved head: re-read configs and policy at the new one."""
        commit = await gh.getitem(
            "/repos/{owner}/{repo}/commits/{ref}", {**split_repo(state.name), "ref": state.meta.default_branch}
        )
        if commit["sha"] == state.meta.head_sha:
            return
        log.info("catalog.missed_push", old=state.meta.head_sha[:12], new=commit["sha"][:12])
        state.meta.head_sha = commit["sha"]
        # When the push happened is unknown; changed images are dated when we noticed.
        await self._apply_default_branch_change(state, gh, None, commit["sha"], self.clock.now(), change)

    async def _reconcile_pulls(self, state: RepoState, gh: InstallationClient, change: Change) -> dict[str, int]:
        seen: set[int] = set()
        fetched = 0
        async for data in gh.getiter(
            "/repos/{owner}/{repo}/pulls?state=open&per_page=100", split_repo(state.name)
        ):
            number = int(data["number"])
            seen.add(number)
            fetched += await self._refresh_pull(state, gh, data, change)
        closed = [p.number for p in state.overlap.prs() if p.number not in seen]
        for number in closed:
            change.extend(state.remove_pull(number))
        return {"open_pulls": len(seen), "files_fetched": fetched, "pulls_removed": len(closed)}

    async def _refresh_pull(
        self, state: RepoState, gh: InstallationClient, data: dict[str, Any], change: Change, *, fetch: bool = True
    ) -> int:
        """Upsert one open PR; read its files only when its head is new to us."""
        known = state.overlap.get(int(data["number"]))
        head_sha = (data.get("head") or {}).get("sha")
        if known is not None and (known.files_sha == head_sha or not fetch):
            changes, complete, files_sha, fetched = known.changes, known.files_complete, known.files_sha, 0
        else:
            changes, complete = await pull_changes(state, gh, data)
            files_sha, fetched = head_sha, 1
        pull = pull_from_payload(
            state.name, data, self.settings.bot_logins,
            changes=changes, files_complete=complete, files_sha=files_sha,
        )
        change.extend(state.upsert_pull(pull))
        return fetched

    async def _reconcile_claims(self, state: RepoState, gh: InstallationClient, change: Change) -> None:
        found: dict[str, str] = {}
        async for ref in gh.getiter(
            "/repos/{owner}/{repo}/git/matching-refs/heads/klaud/claim-", split_repo(state.name)
        ):
            fam16 = ref["ref"][len(CLAIM_PREFIX):]
            family = state.family_by_hash(fam16)
            if family is not None:
                found[family.id] = ref["ref"]
        for family_id in list(state.claims):
            if family_id not in found:
                change.extend(state.drop_claim(family_id))
        for family_id, ref in found.items():
            if family_id not in state.claims:
                family = state.catalog.get(family_id)
                change.extend(state.add_claim(Claim(family_id, family.candidate, None, ref.removeprefix("refs/heads/"), self.clock.now())))

    async def _reconcile_runs(self, state: RepoState, gh: InstallationClient, change: Change) -> None:
        cutoff = recent_cutoff(self.clock.now())
        known_runs = {a.run_id for a in state.ledger.all() if a.verified}
        for workflow in state.policy.outcome_workflows:
            try:
                runs = [
                    run
                    async for run in gh.getiter(
                        "/repos/{owner}/{repo}/actions/workflows/{workflow}/runs?status=completed&per_page=100"
                        f"&created=>={cutoff.date().isoformat()}",
                        {**split_repo(state.name), "workflow": workflow},
                        iterable_key="workflow_runs",
                    )
                ]
            except NotFound:
                continue  # the workflow does not exist in this repository
            for run in runs:
                created = parse_time(run.get("created_at"))
                if created is None or created < cutoff or int(run["id"]) in known_runs:
                    continue
                await self._record_run(state, gh, run, change)

    # -- push --------------------------------------------------------------------------

    async def on_push(self, payload: dict[str, Any]) -> None:
        name = payload["repository"]["full_name"]
        state = await self.state_for(payload)
        if state is None:
            return
        ref = payload.get("ref") or ""
        if ref.startswith(CLAIM_PREFIX):
            await self._on_claim_push(state, ref, payload)
            return
        if ref != f"refs/heads/{state.meta.default_branch}" or payload.get("deleted"):
            return
        before, after = payload.get("before") or ZERO_SHA, payload["after"]
        async with self.lock(name):
            gh = self.client(state)
            changed = await self._changed_files(gh, name, before, after)
            pushed_at = _push_time(payload) or self.clock.now()
            state.meta.head_sha = after
            change = Change()
            touched = await self._apply_default_branch_change(state, gh, changed, after, pushed_at, change)
            state.save_meta(change)
            await self.persist(change)
        log.info("catalog.updated", head=after[:12], files=sorted(changed) if changed is not None else "all", families=len(touched))
        await self.notify(state, touched)

    async def _changed_files(self, gh: InstallationClient, repo: str, before: str, after: str) -> set[str] | None:
        """Paths a push changed, from one compare call; None when everything must be re-read."""
        if before == ZERO_SHA:
            return None  # a new default branch
        try:
            compare = await gh.getitem(
                "/repos/{owner}/{repo}/compare/{base}...{head}", {**split_repo(repo), "base": before, "head": after}
            )
        except NotFound:
            # A force-push can leave `before` unknown to GitHub: re-read every config.
            log.info("catalog.compare_unavailable", before=before[:12], after=after[:12])
            return None
        changed = set()
        for item in compare.get("files") or []:
            changed.add(item["filename"])
            if item.get("previous_filename"):
                changed.add(item["previous_filename"])
        return changed

    async def _apply_default_branch_change(
        self,
        state: RepoState,
        gh: InstallationClient,
        changed: set[str] | None,
        ref: str,
        pushed_at: datetime,
        change: Change,
    ) -> set[str]:
        before = {f.id: f.image for f in state.catalog}
        reload_all = changed is None
        if changed is None or POLICY_PATH in changed:
            old_policy = state.policy
            policy_changed, policy_change = await refresh_policy(state, gh, ref)
            change.extend(policy_change)
            if policy_changed and (
                old_policy.config_globs != state.policy.config_globs
                or old_policy.runners_file != state.policy.runners_file
            ):
                reload_all = True
        if changed is None or state.policy.runners_file in changed:
            if await refresh_runners(state, gh, ref):
                reload_all = True
        if reload_all:
            paths = {f.path for f in state.catalog} | set(await config_paths(state, gh, ref))
        else:
            paths = {p for p in changed or () if is_master_config(p, state.policy.config_globs)}
        for path in sorted(paths):
            change.extend(await refresh_config(state, gh, path, ref, pushed_at))
        state.retouch()
        after = {f.id: f.image for f in state.catalog}
        return {fid for fid in before.keys() | after.keys() if before.get(fid) != after.get(fid)}

    async def _on_claim_push(self, state: RepoState, ref: str, payload: dict[str, Any]) -> None:
        """Claim refs made or released elsewhere (another wave, a person) reach us as pushes."""
        family = state.family_by_hash(ref[len(CLAIM_PREFIX):])
        if family is None:
            return
        async with self.lock(state.name):
            if payload.get("deleted"):
                change = state.drop_claim(family.id)
            elif family.id not in state.claims:
                change = state.add_claim(
                    Claim(family.id, family.candidate, None, ref.removeprefix("refs/heads/"), self.clock.now())
                )
            else:
                return
            await self.persist(change)

    # -- pull requests -----------------------------------------------------------------

    async def on_pull_request(self, payload: dict[str, Any]) -> set[str]:
        """Keep the overlap index current; returns the families whose overlaps changed."""
        state = await self.state_for(payload)
        if state is None:
            return set()
        data = payload["pull_request"]
        number = int(data["number"])
        action = payload.get("action")
        async with self.lock(state.name):
            before = set(state.overlap.touches(number))
            if action == "closed" or data.get("state") == "closed":
                change = state.remove_pull(number)
            else:
                change = Change()
                # Files are read when the head is new to us (opened, reopened, synchronize,
                # or any event for a PR we missed); other actions only update metadata.
                await self._refresh_pull(state, self.client(state), data, change)
            await self.persist(change)
            after = set(state.overlap.touches(number))
        pull = state.overlap.get(number)
        families = before | after
        if pull is not None and pull.klaud_own and pull.own_family_hash:
            own = state.family_by_hash(pull.own_family_hash)
            if own is not None:
                families.add(own.id)
        await self.notify(state, families)
        return families

    # -- outcomes ----------------------------------------------------------------------

    async def on_workflow_run(self, payload: dict[str, Any]) -> None:
        state = await self.state_for(payload)
        run = payload["workflow_run"]
        if state is None or not is_outcome_workflow(state, run):
            return
        if payload.get("action") != "completed":
            await self._note_run_started(state, run)
            return
        async with self.lock(state.name):
            change = Change()
            families = await self._record_run(state, self.client(state), run, change)
            await self.persist(change)
        await self.notify(state, families)

    async def _note_run_started(self, state: RepoState, run: dict[str, Any]) -> None:
        """Link a run of a dispatched candidate to its dispatch (so TTL release can see it)."""
        for family, dispatch in list(state.dispatches.items()):
            if dispatch.candidate in (run.get("display_title") or "") and dispatch.run_id is None:
                async with self.lock(state.name):
                    await self.persist(state.add_dispatch(replace(dispatch, run_id=int(run["id"]))))
                return

    async def _record_run(self, state: RepoState, gh: InstallationClient, run: dict[str, Any], change: Change) -> set[str]:
        reads = await read_run_outcomes(state, gh, run)
        attempts = [read.attempt for read in reads]
        for read in reads:
            if read.transient:
                self._schedule_artifact_retry(state, run, read, change)
        if not reads:
            missing = self._dispatched_without_artifact(state, run)
            if missing is not None:
                attempts.append(missing)
        families: set[str] = set()
        for attempt in attempts:
            families |= await self._apply_attempt(state, gh, attempt, change)
        return families

    def _dispatched_without_artifact(self, state: RepoState, run: dict[str, Any]) -> Attempt | None:
        """A run Klaud dispatched for a known candidate that left no artifact."""
        title = run.get("display_title") or ""
        for dispatch in state.dispatches.values():
            if dispatch.run_id == int(run["id"]) or dispatch.candidate in title:
                return unverified_attempt(dispatch.candidate, dispatch.family, run_info(run), "artifact-missing")
        return None

    async def _apply_attempt(self, state: RepoState, gh: InstallationClient, attempt: Attempt, change: Change) -> set[str]:
        recorded, attempt_change = state.record_attempt(attempt)
        change.extend(attempt_change)
        if not recorded:
            return set()
        log.info(
            "outcome.recorded",
            candidate=attempt.candidate,
            run_id=attempt.run_id,
            verified=attempt.verified,
            outcome=attempt.outcome,
            error=attempt.error,
        )
        released, release_change = state.release_for(attempt)
        change.extend(release_change)
        if released is not None:
            await release_claim(gh, state.name, released.family)
        family = attempt.family or state.family_of_candidate(attempt.candidate)
        return {family} if family else set()

    def _schedule_artifact_retry(self, state: RepoState, run: dict[str, Any], read: Any, change: Change) -> None:
        key = f"{run['id']}:{read.attempt.candidate}"
        now = self.clock.now()
        entry = state.pending_artifacts.get(key) or {
            "run": {k: run.get(k) for k in ("id", "run_attempt", "head_sha", "updated_at", "created_at")},
            "candidate": read.attempt.candidate,
            "artifact_id": read.artifact_id,
            "first_failure_at": stamp(now),
            "failures": 0,
        }
        entry["failures"] += 1
        first = parse_time(entry["first_failure_at"])
        assert first is not None
        due = next_retry_at(first, entry["failures"], now, rng=self._rng)
        if due is None:
            log.warning("outcome.retry_given_up", candidate=read.attempt.candidate, run_id=run["id"])
            state.pending_artifacts.pop(key, None)
            change.delete(state.name, "artifact-retry", key)
            return
        entry["next_at"] = stamp(due)
        state.pending_artifacts[key] = entry
        change.put(state.name, "artifact-retry", key, entry)

    async def retry_artifacts(self) -> int:
        """Re-read every transiently failed artifact that is due; returns how many were tried."""
        tried = 0
        now = self.clock.now()
        for state in list(self.repos.values()):
            due = [
                (key, entry) for key, entry in state.pending_artifacts.items()
                if (parse_time(entry.get("next_at")) or now) <= now
            ]
            for key, entry in due:
                tried += 1
                await self._retry_artifact(state, key, entry)
        return tried

    async def _retry_artifact(self, state: RepoState, key: str, entry: dict[str, Any]) -> None:
        gh = self.client(state)
        run, candidate, artifact_id = entry["run"], entry["candidate"], entry["artifact_id"]
        info = run_info(run)

        def unread(code: str, transient: bool) -> ArtifactRead:
            attempt = unverified_attempt(candidate, state.family_of_candidate(candidate), info, code)
            return ArtifactRead(attempt, transient, artifact_id)

        try:
            artifact = await gh.getitem(
                "/repos/{owner}/{repo}/actions/artifacts/{artifact_id}",
                {**split_repo(state.name), "artifact_id": artifact_id},
            )
        except NotFound:
            read = unread("artifact-not-found", False)
        except GitHubError as exc:
            if not exc.transient:
                raise
            read = unread("download-failed", True)
        else:
            read = await read_artifact(state, gh, candidate, artifact, info)
        async with self.lock(state.name):
            change = Change()
            if read.transient:
                self._schedule_artifact_retry(state, run, read, change)
            else:
                state.pending_artifacts.pop(key, None)
                change.delete(state.name, "artifact-retry", key)
            families = await self._apply_attempt(state, gh, read.attempt, change)
            await self.persist(change)
        await self.notify(state, families)

    async def on_receipt(self, payload: dict[str, Any]) -> bool:
        """A completion receipt posted by the bot counts like the run's artifact."""
        state = await self.state_for(payload)
        comment = payload["comment"]
        if state is None or not self.settings.is_bot((comment.get("user") or {}).get("login")):
            return False
        try:
            receipt = parse_receipt(comment.get("body") or "")
        except ReceiptError as exc:
            log.warning("outcome.receipt_invalid", comment_id=comment.get("id"), error=str(exc))
            return False
        if receipt is None:
            return False
        completed = parse_time(comment.get("created_at")) or self.clock.now()
        family = state.family_of_candidate(receipt.candidate)
        attempt = attempt_from_outcome(
            receipt.candidate, family, RunInfo(receipt.parent_run_id, 1, None, completed), receipt.outcome, "receipt"
        )
        async with self.lock(state.name):
            change = Change()
            families = await self._apply_attempt(state, self.client(state), attempt, change)
            await self.persist(change)
        await self.notify(state, families)
        return True

    # -- installations -----------------------------------------------------------------

    async def state_for(self, payload: dict[str, Any]) -> RepoState | None:
        """The repository's state, reconciled first if this is the first we hear of it."""
        repository = payload.get("repository") or {}
        name = repository.get("full_name")
        installation = (payload.get("installation") or {}).get("id")
        if not name or installation is None:
            return None
        state = self.repos.get(name)
        if state is None:
            await self.reconcile(name, int(installation))
            state = self.repos.get(name)
        return state

    async def forget(self, name: str) -> None:
        async with self.lock(name):
            self.repos.pop(name, None)
            change = Change().clear(name, "family").clear(name, "pull").clear(name, "attempt")
            for kind in ("hold", "retry", "claim", "dispatch", "artifact-retry", "wave"):
                change.clear(name, kind)
            change.delete("", "repo", name)
            await self.persist(change)
        log.info("live.forgotten", repo=name)


def _push_time(payload: dict[str, Any]) -> datetime | None:
    """When the push happened: push payloads carry `repository.pushed_at` in epoch seconds.

    The head commit's timestamp is its author date, which a rebase can leave days old.
    """
    pushed_at = (payload.get("repository") or {}).get("pushed_at")
    if isinstance(pushed_at, (int, float)) and not isinstance(pushed_at, bool):
        return datetime.fromtimestamp(pushed_at, timezone.utc)
    return None


def _counts(state: RepoState) -> dict[str, int]:
    return {
        "families": len(state.catalog),
        "pulls": len(state.overlap.prs()),
        "attempts": len(state.ledger),
        "claims": len(state.claims),
    }
