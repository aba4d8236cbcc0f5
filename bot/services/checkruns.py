"""Publishing the `Klaud Cold` check run on every open Klaud pull request.

Whenever the live state says a family changed (attempts, cooldown, hold, overlaps, a new
head), the PRs of that family are marked; a coalescer turns a burst of marks into one
render and one write per PR. A render identical to what the check run already shows is
not sent at all.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import structlog

from bot.core.checks import CHECK_NAME, CheckView, render_check
from bot.core.clock import Clock
from bot.core.domain import PullRequest, family_hash
from bot.core.events import CheckRunEvent
from bot.github.errors import GitHubError
from bot.services.coalescer import Coalescer
from bot.services.keyed_locks import KeyedLocks
from bot.services.live import GoneRepository, LiveState
from bot.services.repo_state import RepoState
from bot.store.errors import StoreError

log = structlog.get_logger("klaud.checks")

Key = tuple[str, int]  # (repo, PR number)


class CheckPublisher:
    def __init__(self, live: LiveState, clock: Clock, *, delay_seconds: float = 3.0) -> None:
        self.live = live
        self.clock = clock
        # GitHub's errors and the store's (down a moment, or the repository taken by another
        # replica meanwhile) are logged, and the next change publishes again. So is a write
        # answered once its repository left this process (its lease lapsed meanwhile): the
        # new owner renders it, finding the check run by its head.
        self.coalescer: Coalescer[Key] = Coalescer(
            self.publish, delay_seconds, errors=(GitHubError, StoreError, GoneRepository)
        )
        live.listeners.append(self.families_changed)
        # One publish of a PR at a time: a forced re-render ("Re-run all checks") beside the
        # coalesced publish of a new PR found no check run either, and both created one.
        self._publishing: KeyedLocks[Key] = KeyedLocks()

    async def families_changed(self, state: RepoState, families: set[str], pulls: set[int]) -> None:
        for number in pulls:
            self.coalescer.mark((state.name, number))
        # By the hash the PR's branch names, not through the catalog: a family removed from
        # the configs is in no catalog, and its PR's check run stayed in progress for good.
        hashes = {family_hash(family) for family in families}
        for pull in state.overlap.prs():
            if pull.klaud_own and pull.own_family_hash in hashes:
                self.coalescer.mark((state.name, pull.number))

    def repository_taken(self, state: RepoState) -> None:
        """This replica took the repository over: an update its last owner had pending left
        with it, so every open Klaud PR is rendered again (one its check run already shows
        costs nothing: the render's digest is stored with it)."""
        for pull in state.overlap.prs():
            if pull.klaud_own:
                self.coalescer.mark((state.name, pull.number))

    def publishing(self, repo: str) -> bool:
        return any(name.lower() == repo for name, _number in self.coalescer.running)

    async def settle(self) -> None:
        await self.coalescer.settle()

    async def close(self, grace: float | None = None) -> None:
        await self.coalescer.close(grace)

    def view(self, state: RepoState, pull: PullRequest) -> CheckView:
        now = self.clock.now()
        family = state.family_by_hash(pull.own_family_hash) if pull.own_family_hash else None
        candidate = state.candidate_of_pull(pull)
        attempts = state.ledger.for_candidate(candidate)
        cool = state.cooldown_of(candidate, now)
        overlaps = []
        if family is not None:
            overlaps = [o for o in state.overlap.overlaps(family, now, state.policy.idle_days) if o.pr != pull.number]
        dispatch = state.dispatches.get(family.id) if family else None
        return CheckView(
            repo=state.name,
            family=family,
            candidate=candidate,
            image=family.image if family else None,
            attempts=attempts,
            cooldown_reason=cool.reason,
            cooldown_until=cool.until,
            overlaps=overlaps,
            hold=state.holds.get(family.id) if family else None,
            in_flight=dispatch is not None and dispatch.candidate == candidate,
            policy_error=state.meta.policy_error,
            blocked=state.blocked_now(now),
            config_errors=state.meta.config_errors,
            cooled_by=None if cool.eligible else cool.attempt,
        )

    async def publish(self, key: Key, *, force: bool = False) -> None:
        async with self._publishing.hold((key[0].lower(), key[1])):
            await self._publish(key, force=force)

    async def _publish(self, key: Key, *, force: bool) -> None:
        repo, number = key
        state = self.live.repo(repo)
        pull = state.overlap.get(number) if state else None
        if state is None or pull is None or not pull.klaud_own:
            return
        output = render_check(self.view(state, pull))
        payload = output.payload()
        digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
        known = state.meta.check_runs.get(str(number))
        if known and known.get("head_sha") == pull.head_sha and known.get("digest") == digest and not force:
            return
        api = self.live.api(state)
        on_head = known if known and known.get("head_sha") == pull.head_sha else None
        # Back on a head it had before (pushed back to it): that head's check run, not a second.
        check_id = on_head.get("id") if on_head else (known or {}).get("earlier", {}).get(pull.head_sha)
        if (on_head or (known is None and str(number) in state.meta.closed_pulls)) and not check_id:
            # A creation was sent for this head and its id never stored (its answer lost, a
            # crash after the POST), or the PR was closed (its entry dropped) and reopened:
            # the check run already there is updated, not left stale beside a second.
            check_id = await api.check_run_on(pull.head_sha, CHECK_NAME)
        if check_id:
            await api.update_check_run(int(check_id), payload)
        else:
            # Noted before it is sent, so that a creation whose outcome is unknown is looked
            # for next time instead of made again.
            if not await self._note(state, number, pull.head_sha, {"id": None, "digest": None}):
                return
            check_id = await api.create_check_run(output.payload(pull.head_sha))
        if not await self._note(state, number, pull.head_sha, {"id": check_id, "digest": digest}):
            return
        log.info("check.published", repo=repo, pr=number, status=output.status, conclusion=output.conclusion)

    async def _note(self, state: RepoState, number: int, head_sha: str, check: dict[str, Any]) -> bool:
        """Store what is known of the PR's check run on `head_sha`; False when the PR was
        closed or moved on meanwhile (an entry for it would stay for good)."""
        async with self.live.lock(state.name):
            current = state.overlap.get(number)
            if current is None or current.head_sha != head_sha:
                return False
            state.meta.check_runs[str(number)] = {"head_sha": head_sha, **check, "earlier": _earlier(
                state.meta.check_runs.get(str(number)), head_sha)}
            await self.live.persist(state.save_meta())
        return True

    async def rerequested(self, state: RepoState, event: CheckRunEvent) -> None:
        """A person asked for the check again: re-render it on that head."""
        if event.check_run.name == CHECK_NAME:
            await self.rerender_head(state, event.check_run.head_sha)

    async def rerender_head(self, state: RepoState, head_sha: str) -> None:
        """Re-render the check run of the Klaud PR at `head_sha` ("Re-run all checks" too)."""
        for pull in state.overlap.prs():
            if pull.klaud_own and pull.head_sha == head_sha:
                await self.publish((state.name, pull.number), force=True)


# The check runs of a PR's earlier heads kept with its entry, the newest few.
KEEP_EARLIER_HEADS = 8


def _earlier(known: dict[str, Any] | None, head_sha: str) -> dict[str, int]:
    """Head -> check run id of the PR's earlier heads, once its entry moves to `head_sha`."""
    earlier: dict[str, int] = dict((known or {}).get("earlier") or {})
    if known and known.get("head_sha") != head_sha and known.get("id"):
        earlier[known["head_sha"]] = int(known["id"])
    earlier.pop(head_sha, None)
    return dict(list(earlier.items())[-KEEP_EARLIER_HEADS:])
