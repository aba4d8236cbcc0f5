"""Nothing stays claimed or in flight forever (DESIGN §4 "Claims and runs never get stuck").

Every claim and dispatch has an end that does not depend on a webhook arriving:
- a dispatch whose claim TTL passed has its run read once: a run still queued or running
  keeps the family in flight until the next check (it is never dispatched again meanwhile);
  a completed run is recorded as if its `workflow_run` event had arrived; a run GitHub no
  longer knows releases the claim;
- a dispatch not linked to its run (an older server's 204, or an answer lost to a timeout)
  whose `workflow_run` events did not link it either is looked up by the candidate id in
  run titles UNLINKED_CHECK_AFTER after it was made, among the runs in flight and the
  completed ones: found, it is linked (or its outcome recorded); absent, the claim goes;
- a claim ref without a dispatch (a crash between claim and dispatch, a failed delete,
  another planner's leftover) is deleted once it is older than one wave and no run of its
  candidate is in flight; a run in flight is adopted as the family's dispatch instead; a
  ref naming a family no config names any more is deleted the same way (its run, if any,
  ends on its own);
- the light reconcile reads the runs of every in-flight dispatch, so a lost `workflow_run`
  delivery is recovered within one light reconcile, and lists the claim refs on GitHub.

`check_due` makes no GitHub call when nothing is due, so the scheduler calls it every tick.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import structlog

from bot.core.domain import (
    ACTIVE_RUN_STATUSES,
    CLAIM_BRANCH_PREFIX,
    Claim,
    Dispatch,
    claim_ref,
    family_hash,
    parse_time,
    stamp,
)
from bot.core.events import WorkflowRun
from bot.services.api import RepoAPI
from bot.services.dispatch import delete_claim_ref
from bot.services.live import LiveState
from bot.services.outcomes import UNLINKED_SKEW, OutcomeRecorder, may_be_dispatched
from bot.services.repo_state import RepoState
from bot.store.change import Change

log = structlog.get_logger("klaud.claims")

# GitHub lists a dispatched run within seconds; until then an unlinked dispatch is kept.
UNLINKED_CHECK_AFTER = timedelta(minutes=10)
# How far back a run may have been created and still be in flight: GitHub keeps a job queued
# up to 24 hours and lets it run up to 5 days on a self-hosted runner. A claim found on GitHub
# (another planner's, or after the store was lost) is as new as its listing, while its run
# may have started days before: a shorter window would miss that run and delete its claim.
IN_FLIGHT_WINDOW = timedelta(days=7)
CANDIDATE_IN_TEXT = re.compile(r"\b[0-9a-f]{16}-[0-9a-f]{16}\b")


class ClaimKeeper:
    def __init__(self, live: LiveState, outcomes: OutcomeRecorder) -> None:
        self.live = live
        self.outcomes = outcomes

    async def check_due(self, state: RepoState) -> None:
        """Resolve the dispatches past their claim TTL and the orphan claims older than a wave."""
        now = self.live.clock.now()
        if not (self._due_dispatches(state, now) or self._orphans(state, now)):
            return
        async with self.live.lock(state.name):
            change = Change()
            families = await self._resolve(state, self.live.api(state), now, change, every_run=False)
            await self.live.persist(change)
        await self.live.notify(state, families)

    async def light(self, state: RepoState, api: RepoAPI, change: Change) -> set[str]:
        """The light reconcile's part: every in-flight run read, claim refs listed, due ones resolved."""
        now = self.live.clock.now()
        await self.sync_refs(state, api, change, now)
        return await self._resolve(state, api, now, change, every_run=True)

    async def sync_refs(self, state: RepoState, api: RepoAPI, change: Change, now: datetime) -> None:
        """Local claims follow the claim refs on GitHub (a new ref is a claim made elsewhere)."""
        # A family removed from the configs keeps its claim until the claim is settled (an
        # orphan deleted, a run's outcome): its ref must still count as found.
        claimed = {family_hash(family_id): family_id for family_id in state.claims}
        found: dict[str, str] = {}
        strays: set[str] = set()
        async for branch, _sha in api.branches(CLAIM_BRANCH_PREFIX):
            fam16 = branch[len(CLAIM_BRANCH_PREFIX):]
            family = state.family_by_hash(fam16)
            family_id = family.id if family is not None else claimed.get(fam16)
            if family_id is not None:
                found[family_id] = branch
            else:
                strays.add(fam16)
        listed = {fam16: state.meta.stray_refs.get(fam16) or stamp(now) or "" for fam16 in strays}
        if listed != state.meta.stray_refs:
            state.meta.stray_refs = listed
            state.save_meta(change)
        for family_id in list(state.claims):
            # A dispatch keeps its family in flight even if someone deleted the ref.
            if family_id not in found and family_id not in state.dispatches:
                change.extend(state.drop_claim(family_id))
        for family_id, branch in found.items():
            family = state.catalog.get(family_id)
            if family_id not in state.claims and family is not None:
                change.extend(state.add_claim(Claim(family_id, family.candidate, None, branch, now)))

    # -- resolving ------------------------------------------------------------------------

    def _due_dispatches(self, state: RepoState, now: datetime) -> list[Dispatch]:
        ttl = timedelta(hours=state.policy.claim_ttl_hours)
        return [
            d for d in state.dispatches.values()
            if now - (d.checked_at or d.at) >= (ttl if d.run_id is not None else UNLINKED_CHECK_AFTER)
        ]

    def _orphans(self, state: RepoState, now: datetime) -> list[Claim]:
        one_wave = timedelta(minutes=state.policy.wave_every_minutes)
        return [c for c in state.claims.values() if c.family not in state.dispatches and now - c.at >= one_wave]

    def _old_strays(self, state: RepoState, now: datetime, change: Change) -> list[str]:
        """The strays noted a wave ago or more that still name no family and no claim (the
        list is as old as the last listing: a push may have brought a family back since,
        and its ref is then a claim like any other)."""
        strays = state.meta.stray_refs
        claimed = {family_hash(family_id) for family_id in state.claims}
        back = [fam16 for fam16 in strays if fam16 in claimed or state.family_by_hash(fam16)]
        for fam16 in back:
            del strays[fam16]
        if back:
            state.save_meta(change)
        noted = {fam16: parse_time(seen) or now for fam16, seen in strays.items()}
        one_wave = timedelta(minutes=state.policy.wave_every_minutes)
        return [fam16 for fam16, seen in noted.items() if now - seen >= one_wave]

    async def _resolve(self, state: RepoState, api: RepoAPI, now: datetime, change: Change, *, every_run: bool) -> set[str]:
        dispatches = list(state.dispatches.values()) if every_run else self._due_dispatches(state, now)
        orphans = self._orphans(state, now)
        strays = self._old_strays(state, now, change)
        families: set[str] = set()
        unlinked = [d for d in dispatches if d.run_id is None]
        since = min((d.at for d in unlinked), default=now)
        wanted = unlinked or orphans or strays
        in_flight = await self._runs_in_flight(state, api, now) if wanted else {}
        titled = in_flight
        if any(d.candidate not in in_flight for d in unlinked):
            # Its run may have finished with every `workflow_run` delivery lost.
            titled = await self._runs_completed_since(state, api, since) | in_flight
        for dispatch in dispatches:
            run = await self._run_of(api, dispatch, titled)
            families |= await self._settle_dispatch(state, api, dispatch, run, now, change)
        for claim in orphans:
            families |= await self._settle_orphan(state, api, claim, in_flight.get(claim.candidate), change)
        for fam16 in strays:
            await self._settle_stray(state, api, fam16, in_flight, change)
        return families

    async def _run_of(self, api: RepoAPI, dispatch: Dispatch, titled: dict[str, WorkflowRun]) -> WorkflowRun | None:
        if dispatch.run_id is not None:
            return await api.run(dispatch.run_id)
        # No answer named the run and no `workflow_run` event did since: only a run titled
        # with the candidate can be found.
        return titled.get(dispatch.candidate)

    async def _settle_dispatch(
        self, state: RepoState, api: RepoAPI, dispatch: Dispatch, run: WorkflowRun | None, now: datetime, change: Change
    ) -> set[str]:
        if run is None:
            if dispatch.run_id is None and now - dispatch.at < UNLINKED_CHECK_AFTER:
                return set()  # a light reconcile right after the dispatch: GitHub may not list it yet
            log.info("claim.released", family=dispatch.family, reason="its run does not exist", run_id=dispatch.run_id)
            if dispatch.run_id is None:
                # It started no run (a run linked and then deleted did start): what it used
                # is given back.
                if state.rearm_canary_of(dispatch.candidate):
                    state.save_meta(change)
                if dispatch.approval is not None:
                    change.extend(state.give_back_retry(dispatch.approval))
            return await self._release(state, api, dispatch.family, change)
        if run.status in ACTIVE_RUN_STATUSES:
            checked = Dispatch(
                dispatch.family, dispatch.candidate, dispatch.wave, dispatch.base, dispatch.at,
                run_id=run.id, run_status=run.status, checked_at=now,
            )
            change.extend(state.add_dispatch(checked))
            return set()
        log.info("claim.run_finished_unseen", family=dispatch.family, run_id=run.id)
        families = await self.outcomes.record_run(state, api, run, change)
        if dispatch.family in state.dispatches:
            # The run left nothing this candidate's outcome could be read from.
            families |= await self._release(state, api, dispatch.family, change)
        return families

    async def _settle_orphan(
        self, state: RepoState, api: RepoAPI, claim: Claim, run: WorkflowRun | None, change: Change
    ) -> set[str]:
        if run is not None:
            # Dispatched before a crash lost the record of it: follow that run.
            adopted = Dispatch(
                claim.family, claim.candidate, claim.wave or 0, run.head_sha, run.created_at or claim.at,
                run_id=run.id, run_status=run.status,
            )
            change.extend(state.add_dispatch(adopted))
            log.info("claim.adopted", family=claim.family, run_id=run.id)
            return {claim.family}
        log.info("claim.orphan_deleted", family=claim.family, since=claim.at.isoformat())
        return await self._release(state, api, claim.family, change)

    async def _settle_stray(
        self, state: RepoState, api: RepoAPI, fam16: str, in_flight: dict[str, WorkflowRun], change: Change
    ) -> None:
        """A claim ref of a family no config names (removed while another planner held it,
        or with the store lost): no wave will ever settle it, so its age does."""
        if any(candidate.startswith(f"{fam16}-") for candidate in in_flight):
            return  # its run ends first; the ref is looked at again at the next light reconcile
        if not await delete_claim_ref(api, CLAIM_BRANCH_PREFIX + fam16):
            return  # listed again at the next light reconcile, and tried again then
        del state.meta.stray_refs[fam16]
        state.save_meta(change)
        log.info("claim.stray_deleted", ref=CLAIM_BRANCH_PREFIX + fam16)

    async def _release(self, state: RepoState, api: RepoAPI, family: str, change: Change) -> set[str]:
        # Dropped here even when the ref stays on GitHub: it is then an orphan ref, which
        # this keeper's next light reconcile finds and deletes.
        await delete_claim_ref(api, claim_ref(family), family)
        change.extend(state.drop_claim(family))
        change.extend(state.drop_dispatch(family))
        return {family}

    async def _runs_in_flight(self, state: RepoState, api: RepoAPI, now: datetime) -> dict[str, WorkflowRun]:
        """Candidate id -> its newest run of the candidate workflow that is queued or running."""
        runs = api.workflow_runs(state.policy.candidate_workflow, created_since=(now - IN_FLIGHT_WINDOW).date(), active=True)
        return await self._by_candidate(state, runs)

    async def _runs_completed_since(self, state: RepoState, api: RepoAPI, since: datetime) -> dict[str, WorkflowRun]:
        """Candidate id -> its newest completed run created since `since` (an older one is an
        earlier attempt's)."""
        # GitHub filters by date only: the day before is listed too, the time checked here.
        runs = api.workflow_runs(
            state.policy.candidate_workflow, created_since=(since - timedelta(days=1)).date(), active=False
        )
        return await self._by_candidate(
            state, (run async for run in runs if run.created_at is None or run.created_at >= since - UNLINKED_SKEW)
        )

    @staticmethod
    async def _by_candidate(state: RepoState, runs: AsyncIterator[WorkflowRun]) -> dict[str, WorkflowRun]:
        found: dict[str, WorkflowRun] = {}
        async for run in runs:
            if not may_be_dispatched(run):
                continue
            for candidate in CANDIDATE_IN_TEXT.findall(run.display_title or ""):
                if not state.ledger.knows_run(candidate, run.id):  # an earlier attempt's run
                    found.setdefault(candidate, run)
        return found
