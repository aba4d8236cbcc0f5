"""Planning waves: snapshot the local state, plan, claim and dispatch, store the wave.

A wave reads nothing from GitHub. Its inputs are the live state and one capacity reading;
its only GitHub calls are the writes that claim and dispatch the selected candidates (and
the release of a claim whose dispatch GitHub refused; claims whose TTL ran out are settled
by `bot.services.claims` before the wave). A dry plan (`klaud plan`, `/plan`,
`/klaud status`) is the same planner call without any write and without consuming a
`/klaud retry` approval.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, get_args

import structlog

from bot.core import dispatching
from bot.core.clock import Clock
from bot.core.domain import (
    CapacityReading,
    Claim,
    Decision,
    DecisionKind,
    Dispatch,
    Family,
    RetryApproval,
    Wave,
    claim_ref,
    stamp,
)
from bot.github.errors import (
    BadRequest,
    Conflict,
    GitHubError,
    NotFound,
    Unauthorized,
    Unavailable,
)
from bot.metrics import CANDIDATES, WAVE_SECONDS, show_wave
from bot.services.api import CapacitySource, RepoAPI
from bot.services.dispatch import claim_family, dispatch_run, release_refused_claim
from bot.services.live import LiveState
from bot.services.repo_state import RepoState
from bot.store.change import Change

log = structlog.get_logger("klaud.waves")

KEEP_WAVES = 100  # about eight days of stored wave documents at the default cadence
RETRY_TRIGGER = "retry"
RETRY_WAVE_AFTER = timedelta(minutes=5)


def wave_record(wave: Wave) -> dict[str, Any]:
    """The wave document as stored: its decisions stay dataclasses, which the store's C
    encoder writes with the same keys and times as `Wave.document()` (one pass, no dicts)."""
    document = wave.document_head()
    document["decisions"] = wave.decisions
    return document


class WaveRunner:
    def __init__(self, live: LiveState, capacity: CapacitySource, clock: Clock, *, dry_run: bool = False) -> None:
        self.live = live
        self.capacity = capacity
        self.clock = clock
        self.dry_run = dry_run

    async def preview(self, repo: str, at: datetime | None = None) -> Wave | None:
        """The next wave's decisions, dispatching nothing and consuming nothing."""
        state = self.live.repo(repo)
        if state is None:
            return None
        return await self.preview_state(state, at or self.clock.now())

    async def preview_state(self, state: RepoState, now: datetime) -> Wave:
        reading = await self.capacity.read()
        wave = state.plan(state.meta.wave + 1, now, reading)
        return wave if state.policy.enabled else dispatching.disabled(wave, state.disabled_block(now))

    async def run(self, repo: str, *, trigger: str, next_wave_at: datetime | None = None) -> Wave | None:
        """One real wave: plan, claim and dispatch the selected candidates, store the document.

        `next_wave_at` (from the scheduler) is stored in the same transaction as the wave,
        so a crash can neither lose the wave nor run it twice.
        """
        state = self.live.repo(repo)
        if state is None:
            return None
        if not state.policy.enabled:
            log.info("wave.skipped", repo=repo, reason="disabled by .github/klaud.yml")
            # A retry wave due when the repository was disabled is dropped with it: left,
            # it was due, and skipped with a log line, every second.
            if next_wave_at is not None or state.meta.retry_wave_at is not None:
                async with self.live.lock(repo):
                    if next_wave_at is not None:
                        self._slot_taken(state, next_wave_at)
                    state.meta.retry_wave_at = None
                    await self.live.persist(state.save_meta())
            return None
        started = time.perf_counter()
        async with self.live.lock(repo):
            # Read with the lock held: a reading taken before waiting for it (behind a
            # reconcile) may say free of clusters that filled meanwhile.
            reading = await self.capacity.read()
            now = self.clock.now()
            change = Change()
            number = state.meta.wave + 1
            wave = await self._plan_and_dispatch(state, number, reading, now, change)
            if not self.dry_run:
                self._note(state, wave, trigger, now)
                change.put_wave(state.name, number, wave_record(wave))
                # Wave documents are large (one decision per family): keep the recent ones.
                change.delete_wave(state.name, number - KEEP_WAVES)
            else:
                # Dry run dispatches nothing to retry: a retry wave a real run left due is
                # spent here (left, it was due, and ran, at every tick).
                state.meta.retry_wave_at = None
            if next_wave_at is not None:
                self._slot_taken(state, next_wave_at)
            state.save_meta(change)
            await self.live.persist(change)
        elapsed = time.perf_counter() - started
        counts = Counter(d.decision for d in wave.decisions)
        self._report(wave, counts, trigger, elapsed)
        self._gauge(state, wave, counts)
        # Time moves cooldowns and in-flight states on without any event: each wave lets the
        # check runs of Klaud PRs catch up (only Klaud PRs render, unchanged renders are not sent).
        await self.live.notify(state, {d.family for d in wave.decisions})
        if not self.dry_run:
            for listener in self.live.wave_listeners:
                await listener(state, wave)
        return wave

    def _note(self, state: RepoState, wave: Wave, trigger: str, now: datetime) -> None:
        """What a real wave leaves in the repository's record besides its document."""
        state.meta.wave = wave.wave
        state.note_dispatched(wave.wave, len(wave.selected))
        # A wave whose every dispatch failed (GitHub unwell) is tried again once, soon.
        again = dispatching.retry_soon(wave) and trigger != RETRY_TRIGGER
        state.meta.retry_wave_at = stamp(now + RETRY_WAVE_AFTER) if again else None

    def _gauge(self, state: RepoState, wave: Wave, counts: Counter[DecisionKind]) -> None:
        """What /metrics shows of the repository after a wave (once per wave, not per family event)."""
        # The change times are kept until the catalog changes: no pass over the families
        # here (one cost ~4 ms of the event loop after every wave at 2,000 families).
        show_wave(state.name, wave.at.timestamp(), counts, get_args(DecisionKind), state.image_change_times())

    def _report(self, wave: Wave, counts: Counter[DecisionKind], trigger: str, elapsed: float) -> None:
        WAVE_SECONDS.observe(elapsed)
        for kind, count in counts.items():
            CANDIDATES.labels(kind).inc(count)
        log.info(
            "wave.done",
            repo=wave.repo,
            wave=wave.wave,
            trigger=trigger,
            base=wave.base[:12],
            selected=list(wave.selected),
            decisions=dict(counts),
            blocked=wave.blocked.code if wave.blocked is not None else None,
            ms=round(elapsed * 1000, 1),
            dry_run=self.dry_run,
        )

    async def _plan_and_dispatch(
        self, state: RepoState, number: int, reading: CapacityReading, now: datetime, change: Change
    ) -> Wave:
        """Plan, then claim and dispatch each selection; a lost claim or a failed dispatch
        is settled and the wave planned again, so the next family takes the freed slot."""
        in_flight = state.in_flight()
        settled: dict[str, Decision] = {}
        while True:
            wave = state.plan(number, now, reading, settled=settled, in_flight=in_flight)
            pending = [d for d in wave.decisions if d.decision == "selected" and d.family not in settled]
            if not pending:
                return wave
            if self.dry_run:
                return dispatching.settle(
                    wave, {d.family: dispatching.dry_run(d, state.policy.candidate_workflow) for d in pending}
                )
            for decision in pending:
                # A dispatched family stays selected when the wave is planned again.
                try:
                    outcome = await self._claim_and_dispatch(state, decision, number, now, change)
                except RepositoryRefused as refused:
                    # Every other claim would be refused alike (thousands of requests a wave
                    # with 2,000 families, and GitHub's write limits for the installation).
                    settled[decision.family] = refused.decision
                    wave = state.plan(number, now, reading, settled=settled, in_flight=in_flight)
                    rest = {d.family: dispatching.not_tried(d, str(refused.error))
                            for d in wave.decisions if d.decision == "selected" and d.family not in settled}
                    return dispatching.settle(wave, {**settled, **rest})
                settled[decision.family] = outcome
                if outcome.decision == "claimed":
                    # Someone holds its claim ref: a run of it may be in flight (one of ours
                    # from before a crash, or another planner's). Counted, on the safe side.
                    in_flight += 1
                if outcome.decision != "selected":
                    break  # plan again: the slot goes to the next family
            else:
                return dispatching.settle(wave, settled)  # with what a lost answer added to a reason

    async def _claim_and_dispatch(
        self, state: RepoState, decision: Decision, number: int, now: datetime, change: Change
    ) -> Decision:
        """The decision as GitHub's answers left it: still `selected` when dispatched.

        Claim, then commit what is about to be dispatched (the claim, a dispatch without its
        run yet, the `/klaud retry` it uses, the canary it is, the wave's number), then
        dispatch. A crash after the commit leaves a dispatch the claim keeper links to its
        run by title, or releases when none started; before it, a claim ref no record
        explains, deleted as an orphan. Either way the next wave neither dispatches the
        family again nor spends its slots twice.
        """
        family = state.catalog.get(decision.family)
        if family is None:
            raise RuntimeError(f"the planner selected {decision.family}, which is not a live family")
        api = self.live.api(state)
        base = state.meta.head_sha
        try:
            claimed = await claim_family(api, family, base)
        except GitHubError as exc:
            log.warning("wave.dispatch_failed", family=family.id, error=str(exc))
            refused = dispatching.claim_refused(decision, str(exc))
            if refuses_the_repository(exc):
                raise RepositoryRefused(exc, refused) from exc
            return refused
        if not claimed:
            # Another wave holds the family's claim ref: remembered, so it is resolved (or
            # its orphan deleted) like any claim made elsewhere.
            change.extend(state.add_claim(Claim(family.id, family.candidate, None, claim_ref(family.id), now)))
            return dispatching.claim_lost(decision)
        pending = Dispatch(family.id, family.candidate, number, base, now)
        undo = await self._write_ahead(state, family, pending)
        try:
            run_id = await dispatch_run(
                api,
                workflow=state.policy.candidate_workflow,
                inputs=state.policy.candidate_inputs,
                branch=state.meta.default_branch,
                family=family,
                base=base,
                wave=number,
            )
        except Unavailable as exc:
            if not exc.maybe_applied:
                return await self._refused(state, api, decision, undo, exc, change)
            # GitHub may have started the run: the dispatch stays, without its run, and is
            # linked to its run by the candidate id in the run's title.
            log.warning("dispatch.answer_lost", family=family.id, candidate=family.candidate, error=str(exc))
            return dispatching.answer_lost(decision, str(exc))
        except GitHubError as exc:
            failed = await self._refused(state, api, decision, undo, exc, change)
            if isinstance(exc, BadRequest | NotFound | Unauthorized):
                # The workflow gone (a push whose webhook was lost), the App's Actions access
                # refused: every family's dispatch would get the same. A 422 may be about
                # this family's inputs alone.
                raise RepositoryRefused(exc, failed) from exc
            return failed
        if run_id is not None:
            change.extend(state.add_dispatch(replace(pending, run_id=run_id)))
        return decision

    def _slot_taken(self, state: RepoState, next_wave_at: datetime) -> None:
        """The scheduler's wave of this slot ran: the next one is due at `next_wave_at`."""
        state.meta.next_wave_at = stamp(next_wave_at)
        state.meta.scheduled_wave_at = stamp(self.clock.now())

    async def _write_ahead(self, state: RepoState, family: Family, pending: Dispatch) -> _Ahead:
        """Commit the dispatch about to be made (in a delivery's unit, the GitHub client
        commits it before the dispatch's request); what to take back if GitHub refuses it."""
        ahead = _Ahead(state.retries.get(family.candidate), state.meta.canary if state.canary_armed else None)
        change = state.add_claim(Claim(family.id, family.candidate, pending.wave, claim_ref(family.id), pending.at))
        change.extend(state.add_dispatch(replace(pending, approval=ahead.approval)))
        if ahead.approval is not None:
            change.extend(state.consume_retry(family.candidate))
        if ahead.canary is not None:
            state.canary_dispatched(family.candidate, pending.wave)
        state.meta.wave = pending.wave
        await self.live.persist(state.save_meta(change))
        return ahead

    async def _refused(
        self, state: RepoState, api: RepoAPI, decision: Decision, ahead: _Ahead, error: GitHubError, change: Change
    ) -> Decision:
        """GitHub refused the dispatch: what was committed ahead of it is taken back (the
        retry approval and the canary are still to be used), and its claim is released
        (should that fail too, the claim keeper releases it once it finds no run)."""
        log.warning("wave.dispatch_failed", family=decision.family, error=str(error))
        if ahead.approval is not None:
            change.extend(state.approve_retry(ahead.approval))
        if ahead.canary is not None:
            state.meta.canary = ahead.canary
        if await release_refused_claim(api, decision.family):
            change.extend(state.drop_claim(decision.family))
            change.extend(state.drop_dispatch(decision.family))
        return dispatching.dispatch_failed(decision, str(error))


class RepositoryRefused(Exception):
    """A claim or dispatch GitHub refused for the whole repository, not for the family."""

    def __init__(self, error: GitHubError, decision: Decision) -> None:
        super().__init__(str(error))
        self.error = error
        self.decision = decision  # the refused family's, as the refusal left it


def refuses_the_repository(error: GitHubError) -> bool:
    """A refusal no other family's claim would escape: the repository archived (403 "read
    only"), the App's access to it withdrawn (403, 404), the installation suspended or its
    credentials refused (401), a branch `klaud` leaving no room for any claim ref, a ruleset
    restricting the creation of branches (422: claim refs differ only by a hash, so one rule
    matches them all; "already exists" is no error here); not a rate limit, which waits,
    nor GitHub unwell."""
    return isinstance(error, BadRequest | NotFound | Unauthorized | Conflict)


@dataclass(frozen=True, slots=True)
class _Ahead:
    """What a wave committed before a dispatch besides its claim and dispatch records."""

    approval: RetryApproval | None  # the `/klaud retry` the dispatch uses
    canary: dict[str, Any] | None  # the armed canary it is

