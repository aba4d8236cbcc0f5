"""Planning waves: snapshot the local state, plan, claim and dispatch, store the wave.

A wave reads nothing from GitHub. Its inputs are the live state and one capacity reading;
its only GitHub calls are the writes that claim and dispatch the selected candidates (and
the deletion of claims whose TTL ran out). A dry plan (`klaud plan`, `/plan`,
`/klaud status`) is the same planner call without any write and without consuming a
`/klaud retry` approval.
"""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import datetime

import structlog

from bot.core import dispatching
from bot.core.clock import Clock
from bot.core.domain import CapacityReading, Claim, Decision, Wave, stamp
from bot.core.planner import plan
from bot.github.errors import GitHubError
from bot.metrics import CANDIDATES, WAVE_SECONDS
from bot.services.api import CapacitySource
from bot.services.dispatch import dispatch_candidate, release_claim
from bot.services.live import LiveState
from bot.services.repo_state import RepoState
from bot.store.change import Change

log = structlog.get_logger("klaud.waves")

KEEP_WAVES = 100  # about eight days of stored wave documents at the default cadence


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
        return plan(state.snapshot(state.meta.wave + 1, now), state.policy, reading, now)

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
            if next_wave_at is not None:
                async with self.live.lock(repo):
                    state.meta.next_wave_at = stamp(next_wave_at)
                    await self.live.persist(state.save_meta())
            return None
        started = time.perf_counter()
        reading = await self.capacity.read()
        async with self.live.lock(repo):
            now = self.clock.now()
            change = Change()
            if not self.dry_run:
                await self._release_expired_claims(state, now, change)
            number = state.meta.wave + 1
            wave = await self._plan_and_dispatch(state, number, reading, now, change)
            if not self.dry_run:
                state.meta.wave = number
                change.put(repo, "wave", f"{number:08d}", wave.document())
                # Wave documents are large (one decision per family): keep the recent ones.
                change.delete(repo, "wave", f"{number - KEEP_WAVES:08d}")
            if next_wave_at is not None:
                state.meta.next_wave_at = stamp(next_wave_at)
            state.save_meta(change)
            await self.live.persist(change)
        elapsed = time.perf_counter() - started
        WAVE_SECONDS.observe(elapsed)
        counts: dict[str, int] = {}
        for decision in wave.decisions:
            counts[decision.decision] = counts.get(decision.decision, 0) + 1
            CANDIDATES.labels(decision.decision).inc()
        log.info(
            "wave.done",
            repo=repo,
            wave=number,
            trigger=trigger,
            base=wave.base[:12],
            selected=list(wave.selected),
            decisions=counts,
            ms=round(elapsed * 1000, 1),
            dry_run=self.dry_run,
        )
        # Time moves cooldowns and in-flight states on without any event: each wave lets the
        # check runs of Klaud PRs catch up (only Klaud PRs render, unchanged renders are not sent).
        await self.live.notify(state, {d.family for d in wave.decisions})
        return wave

    async def _release_expired_claims(self, state: RepoState, now: datetime, change: Change) -> None:
        for claim in state.expired_claims(now):
            try:
                await release_claim(self.live.api(state), claim.family)
            except GitHubError as exc:
                # Kept (and the family stays claimed) until a later wave can delete it.
                log.warning("claim.release_failed", family=claim.family, error=str(exc))
                continue
            log.info("claim.expired", family=claim.family, candidate=claim.candidate)
            change.extend(state.drop_claim(claim.family))
            if claim.family in state.dispatches:
                change.extend(state.drop_dispatch(claim.family))

    async def _plan_and_dispatch(
        self, state: RepoState, number: int, reading: CapacityReading, now: datetime, change: Change
    ) -> Wave:
        snapshot = state.snapshot(number, now)
        lost: dict[str, Claim] = {}
        done: set[str] = set()
        overrides: dict[str, Decision] = {}
        stop_reason: str | None = None
        replan = True
        while replan:
            # Claims lost to another wave block their family; re-planning lets the next
            # candidate in priority order take the freed slot. Nothing else changes the
            # planner's input during a wave, so a wave usually plans once.
            wave = plan(replace(snapshot, claims={**snapshot.claims, **lost}), state.policy, reading, now)
            replan = False
            for decision in wave.decisions:
                if decision.decision != "selected" or decision.family in done:
                    continue
                done.add(decision.family)
                if self.dry_run:
                    overrides[decision.family] = dispatching.dry_run(decision, state.policy.candidate_workflow)
                    continue
                family = state.catalog.get(decision.family)
                if family is None:
                    continue  # the planner decides live families only
                try:
                    result = await dispatch_candidate(
                        self.live.api(state),
                        workflow=state.policy.candidate_workflow,
                        branch=state.meta.default_branch,
                        family=family,
                        base=state.meta.head_sha,
                        wave=number,
                        now=now,
                    )
                except GitHubError as exc:
                    log.warning("wave.dispatch_failed", family=decision.family, error=str(exc))
                    overrides[decision.family], stop_reason = dispatching.dispatch_failed(
                        decision, decision.candidate, str(exc)
                    )
                    break
                if result is None:
                    overrides[decision.family], lost[decision.family] = dispatching.claim_lost(decision, now)
                    replan = True
                    break
                claim, dispatch = result
                change.extend(state.add_claim(claim))
                change.extend(state.add_dispatch(dispatch))
                if decision.candidate in state.retries:
                    change.extend(state.consume_retry(decision.candidate))
        return dispatching.settle(wave, overrides, stop_reason)
