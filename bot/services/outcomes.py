"""Keeps each repository's outcome ledger current: runs, their artifacts, and receipts.

A completed run of an `outcome_workflows` workflow has its `klaud-candidate-<id>` artifacts
read through the safe reader of `bot.core.outcomes`; each becomes an attempt. An artifact
that cannot be read is an unverified attempt with its error code, never a failure, and a
transient read error is retried in the background while the artifact can still exist. A
recorded attempt ends its candidate's dispatch and releases its claim.
"""

from __future__ import annotations

import asyncio
import posixpath
import random
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import structlog

from bot.core.clock import retry_due
from bot.core.domain import (
    ARTIFACT_RE,
    RUN_FAILED_CONCLUSIONS,
    Attempt,
    Dispatch,
    claim_ref,
    parse_time,
    stamp,
)
from bot.core.events import Artifact, Comment, WorkflowRun, WorkflowRunEvent
from bot.core.outcomes import (
    MAX_ARCHIVE_BYTES,
    RETRY_MAX_DELAY,
    UNREADABLE_CONTENT,
    ArtifactError,
    ReceiptError,
    RunInfo,
    attempt_from_outcome,
    first_failure,
    next_retry_at,
    parse_receipt,
    read_outcome_artifact,
    run_failed_attempt,
    unverified_attempt,
)
from bot.github.errors import GitHubError, NotFound, TooLarge
from bot.services.api import RepoAPI
from bot.services.dispatch import delete_claim_ref
from bot.services.live import LiveState
from bot.services.repo_state import RepoState
from bot.store.change import Change
from bot.store.codec import RETRIED_RUN_FIELDS

log = structlog.get_logger("klaud.outcomes")

# Completed runs this recent are read at reconcile (artifacts live 14 days, and a run
# older than this has long been seen by a light reconcile or its webhook).
RECENT_RUNS = timedelta(days=3)
# Artifacts per page of the repository's list: the break-even against one request per run.
PER_RUN_BREAK_EVEN = 100


@dataclass(frozen=True, slots=True)
class ArtifactRead:
    attempt: Attempt
    transient: bool  # the read failed in a way a later retry may fix
    artifact_id: int | None


def run_info(run: WorkflowRun, now: datetime) -> RunInfo:
    return RunInfo(
        run_id=run.id,
        run_attempt=run.run_attempt,
        head_sha=run.head_sha or None,
        completed_at=run.updated_at or run.created_at or now,
    )


def download_error(exc: GitHubError) -> tuple[str, bool]:
    """The artifact error code for a failed lookup or download, and whether to retry it."""
    if isinstance(exc, NotFound):
        return "artifact-not-found", False
    return ("download-failed", True) if exc.transient else ("download-refused", False)


# Between this host's clock and the times GitHub gives (runs, pull requests).
CLOCK_SKEW = timedelta(minutes=1)
# How much earlier (by our clock) than its unlinked dispatch a run titled with the candidate
# may say it was created: generous, as a host clock minutes ahead of GitHub's lost such a
# run's failure; an earlier run of the candidate is told apart by its recorded outcome.
UNLINKED_SKEW = timedelta(minutes=10)


def _of_this_attempt(artifacts: list[Artifact], run: WorkflowRun) -> list[Artifact]:
    """The artifacts of this attempt of the run: GitHub lists every attempt's, and those made
    before a re-run started are an earlier attempt's, read as its own already (read again,
    a re-run that uploaded nothing restarted attempt 1's cooldown)."""
    started = run.run_started_at
    if run.run_attempt <= 1 or started is None:
        return artifacts
    return [artifact for artifact in artifacts if artifact.created_at is None or artifact.created_at >= started]


# What the reference workflow uploads when its session step failed without an outcome.
FALLBACK_OUTCOME = ("unexpected-error", "unknown")


async def _where_a_fallback_failed(api: RepoAPI, run: WorkflowRun, attempt: Attempt) -> Attempt:
    """A failed run's fallback outcome, with where the run failed: it keeps its cooldown, and
    counts toward the pause rule like a run that left no outcome. A session that fails at
    once for every candidate (a missing secret) otherwise cooled five candidates a wave down
    and never paused dispatch: the 65-family pattern."""
    if not attempt.verified or (attempt.outcome, attempt.phase) != FALLBACK_OUTCOME:
        return attempt
    job, step = first_failure(await api.run_jobs(run.id))
    return replace(attempt, failed_job=job or "an unknown job", failed_step=step)


async def _where_it_failed(api: RepoAPI, run: WorkflowRun, info: RunInfo, attempt: Attempt, *, dispatched: bool) -> Attempt:
    """A failed run's attempt read late (a retried download): its dispatched candidate's
    broken archive is `run-failed` as when read at once (`_without_outcome`), a fallback
    outcome says where the run failed."""
    if dispatched and attempt.error in UNREADABLE_CONTENT:
        return run_failed_attempt(attempt.candidate, attempt.family, info, await api.run_jobs(run.id))
    return await _where_a_fallback_failed(api, run, attempt)


def _turned(state: RepoState, turn: str | None) -> set[str]:
    """The families to re-render when dispatch paused or resumed (`turn`): all of them, as
    every Klaud check run shows a pause (and LiveState.notify, which follows every recorded
    attempt, sets klaud_dispatch_paused)."""
    if turn is None:
        return set()
    log.warning("dispatch." + turn, repo=state.name, reason=state.meta.pause["reason"] if state.meta.pause else None)
    return {f.id for f in state.catalog}


def _failed_wave(run: WorkflowRun, dispatch: Dispatch | None, read: ArtifactRead) -> int | None:
    """The wave of the dispatch a failed `run` ended, when `read` is of its candidate."""
    if dispatch is None or run.conclusion not in RUN_FAILED_CONCLUSIONS or read.attempt.candidate != dispatch.candidate:
        return None
    return dispatch.wave


def _dispatch_of(state: RepoState, run: WorkflowRun) -> Dispatch | None:
    """The dispatch `run` is the run of, linked or (unlinked) told by its title."""
    for dispatch in state.dispatches.values():
        if dispatch.run_id == run.id or (dispatch.run_id is None and may_be_its_run(state, dispatch, run)):
            return dispatch
    return None


def _unlinked_dispatch_of(state: RepoState, run: WorkflowRun) -> Dispatch | None:
    """The dispatch no answer or event linked to a run yet that `run` may be the run of."""
    return next((d for d in state.dispatches.values() if d.run_id is None and may_be_its_run(state, d, run)), None)


def may_be_dispatched(run: WorkflowRun) -> bool:
    """Whether `run` may be one a dispatch started: a pull request's, whatever its title
    says, is none of Klaud's (a fork may rewrite the workflow it runs)."""
    return run.event in (None, "workflow_dispatch")


def may_be_its_run(state: RepoState, dispatch: Dispatch, run: WorkflowRun) -> bool:
    """Whether `run` may be the run of `dispatch`, which no answer linked to one: titled with
    its candidate, not a run whose outcome is recorded already, and created after it. A late
    event of an earlier run of the same candidate must not stand for the new dispatch (its
    outcome would be the old one's)."""
    created = run.created_at
    return (
        may_be_dispatched(run)
        and dispatch.candidate in (run.display_title or "")
        and not state.ledger.knows_run(dispatch.candidate, run.id)
        and (created is None or created >= dispatch.at - UNLINKED_SKEW)
    )


# Events whose runs use the workflow as a pull request's head has it: a contributor's fork
# may rewrite an outcome workflow to run on its own pull request and upload
# `klaud-candidate-<any id>` saying "failed" (a 24 h cooldown for every family it names).
# Outcome workflows are dispatched or scheduled (domain: WF-PLAN).
PULL_REQUEST_EVENTS = frozenset({"pull_request", "pull_request_review", "pull_request_review_comment"})


def is_outcome_workflow(state: RepoState, run: WorkflowRun) -> bool:
    return posixpath.basename(run.path) in state.policy.outcome_workflows and run.event not in PULL_REQUEST_EVENTS


class OutcomeRecorder:
    def __init__(self, live: LiveState, *, rng: random.Random | None = None) -> None:
        self.live = live
        self._rng = rng or random.Random()

    # -- events --------------------------------------------------------------------------

    async def on_workflow_run(self, state: RepoState, event: WorkflowRunEvent) -> None:
        run = event.workflow_run
        if not is_outcome_workflow(state, run):
            return
        if event.action != "completed":
            await self._note_run_started(state, run)
            return
        async with self.live.lock(state.name):
            change = Change()
            families = await self.record_run(state, self.live.api(state), run, change)
            await self.live.persist(change)
        await self.live.notify(state, families)

    async def on_receipt(self, state: RepoState, comment: Comment) -> bool:
        """A completion receipt posted by the bot counts like the run's artifact; True when
        it was news to the ledger.

        Only an account GitHub marks as a Bot counts: a person who named their account
        like the bot must not be able to put a family into cooldown.
        """
        if comment.user.type != "Bot" or not self.live.is_bot(comment.user.login):
            return False
        try:
            receipt = parse_receipt(comment.body or "")
        except ReceiptError as exc:
            log.warning("outcome.receipt_invalid", comment_id=comment.id, error=str(exc))
            return False
        if receipt is None:
            return False
        completed = comment.created_at or self.live.clock.now()
        family = state.family_of_candidate(receipt.candidate)
        attempt = attempt_from_outcome(
            receipt.candidate, family, RunInfo(receipt.parent_run_id, 1, None, completed), receipt.outcome, "receipt"
        )
        async with self.live.lock(state.name):
            news = state.ledger.would_change(attempt)
            change = Change()
            families = await self.apply_attempt(state, self.live.api(state), attempt, change)
            await self.live.persist(change)
        await self.live.notify(state, families)
        return news

    async def _note_run_started(self, state: RepoState, run: WorkflowRun) -> None:
        """Link a run of a dispatched candidate to its dispatch (so TTL release can see it).

        The dispatch is looked for under the lock: while this waited for it, the claim
        keeper may have settled the dispatch (released, its run's failure recorded) or
        linked it to its run, and a late event must leave either as it is.
        """
        # Most runs are no dispatch's: their event does not wait for the lock (a wave holds
        # it through its GitHub calls).
        if _unlinked_dispatch_of(state, run) is None:
            return
        async with self.live.lock(state.name):
            dispatch = _unlinked_dispatch_of(state, run)
            if dispatch is not None:
                await self.live.persist(state.link_run(dispatch.family, run.id))

    # -- reading runs --------------------------------------------------------------------

    async def record_run(
        self, state: RepoState, api: RepoAPI, run: WorkflowRun, change: Change, artifacts: list[Artifact] | None = None
    ) -> set[str]:
        """Record every attempt a completed run left; returns the families they concern.

        `artifacts` are the run's, when the caller listed them already (a reconcile lists
        the repository's at once instead of one request per run).
        """
        info = run_info(run, self.live.clock.now())
        if artifacts is None:
            artifacts = [artifact async for artifact in api.run_artifacts(run.id)]
        reads = []
        for artifact in _of_this_attempt(artifacts, run):
            match = ARTIFACT_RE.match(artifact.name)
            if match:
                reads.append(await self.read_artifact(state, api, match.group(1), artifact, info))
        attempts = [read.attempt for read in reads]
        dispatch = _dispatch_of(state, run)
        for read in reads:
            if read.transient:
                self._schedule_retry(state, run, read, change, wave=_failed_wave(run, dispatch, read))
        if dispatch is not None:
            without = await self._without_outcome(api, run, info, dispatch, reads)
            if without is not None:
                attempts = [a for a in attempts if a.candidate != dispatch.candidate] + [without]
            elif run.conclusion in RUN_FAILED_CONCLUSIONS:
                attempts = [await _where_a_fallback_failed(api, run, a) if a.candidate == dispatch.candidate else a
                            for a in attempts]
        families: set[str] = set()
        for attempt in attempts:
            families |= await self.apply_attempt(state, api, attempt, change)
        return families

    async def recent_runs(self, state: RepoState, api: RepoAPI, change: Change) -> None:
        """Every completed run of the last days not yet in the ledger (reconcile)."""
        cutoff = self.live.clock.now() - RECENT_RUNS
        known_runs = {a.run_id for a in state.ledger.all() if a.verified}
        runs = [
            run
            for workflow in state.policy.outcome_workflows
            async for run in api.workflow_runs(workflow, created_since=cutoff.date())
            if run.created_at is not None and run.created_at >= cutoff and run.id not in known_runs
            and is_outcome_workflow(state, run)
        ]
        listed = await self._artifacts_of(api, {run.id for run in runs}, cutoff)
        for run in runs:
            await self.record_run(state, api, run, change, listed.get(run.id, []) if listed is not None else None)

    @staticmethod
    async def _artifacts_of(api: RepoAPI, run_ids: set[int], cutoff: datetime) -> dict[int, list[Artifact]] | None:
        """The artifacts of `run_ids` from the repository's list, newest first, down to `cutoff`.

        One page holds 100 artifacts, so the list is cheaper than one request per run until
        it grows past 100 artifacts per run; then None says: list them per run instead.
        """
        found: dict[int, list[Artifact]] = {}
        if not run_ids:
            return found
        seen = 0
        async for artifact in api.artifacts():
            if artifact.created_at is not None and artifact.created_at < cutoff:
                break
            seen += 1
            if seen > PER_RUN_BREAK_EVEN * len(run_ids):
                return None
            if artifact.workflow_run is not None and artifact.workflow_run.id in run_ids:
                found.setdefault(artifact.workflow_run.id, []).append(artifact)
        return found

    @staticmethod
    async def _without_outcome(
        api: RepoAPI, run: WorkflowRun, info: RunInfo, dispatch: Dispatch, reads: list[ArtifactRead]
    ) -> Attempt | None:
        """The attempt of the dispatched candidate's run when it gave no outcome through its
        own doing (None when its artifact gave one, may still give one, or could not be
        downloaded, which says nothing of the run).

        A run that failed (or was cancelled) without a readable outcome got nowhere near one,
        whether it left no artifact or a broken one (a diagnostics step that crashed half-way,
        its upload still run): its jobs say where it stopped, which is what people need to fix
        it and what the pause rule counts. A run that finished without any artifact is
        `artifact-missing`; one that answered for other candidates only has none of its own.
        """
        own = [read for read in reads if read.attempt.candidate == dispatch.candidate]
        if (reads and not own) or any(read.attempt.error not in UNREADABLE_CONTENT for read in own):
            return None
        if run.conclusion in RUN_FAILED_CONCLUSIONS:
            jobs = await api.run_jobs(run.id)
            return run_failed_attempt(dispatch.candidate, dispatch.family, info, jobs)
        if not own:
            return unverified_attempt(dispatch.candidate, dispatch.family, info, "artifact-missing")
        return None

    async def read_artifact(
        self, state: RepoState, api: RepoAPI, candidate: str, artifact: Artifact, info: RunInfo
    ) -> ArtifactRead:
        family = state.family_of_candidate(candidate)

        def unverified(code: str, transient: bool = False) -> ArtifactRead:
            return ArtifactRead(unverified_attempt(candidate, family, info, code), transient, artifact.id)

        if artifact.expired:
            return unverified("artifact-expired")
        try:
            data = await api.download(artifact, max_bytes=MAX_ARCHIVE_BYTES)
        except TooLarge:
            return unverified("download-too-large")
        except GitHubError as exc:
            # A refusal is recorded too: re-raised, it failed the delivery and, from the
            # claim TTL on, every scheduler tick of this repository, and its wave with it.
            log.warning("outcome.download_failed", candidate=candidate, run_id=info.run_id, error=str(exc))
            return unverified(*download_error(exc))
        try:
            # Off the event loop: a hostile archive must not stall every other delivery.
            outcome = await asyncio.to_thread(read_outcome_artifact, data)
        except ArtifactError as exc:
            log.warning(
                "outcome.artifact_invalid", candidate=candidate, run_id=info.run_id, code=exc.code, detail=exc.detail
            )
            return unverified(exc.code)
        return ArtifactRead(attempt_from_outcome(candidate, family, info, outcome, "artifact"), False, artifact.id)

    async def apply_attempt(self, state: RepoState, api: RepoAPI, attempt: Attempt, change: Change) -> set[str]:
        run_known = state.ledger.knows_run(attempt.candidate, attempt.run_id)
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
        released, ended, release_change = state.release_for(attempt, run_known=run_known)
        change.extend(release_change)
        if released is not None:
            # A delete GitHub refuses must not lose the outcome: the ref is swept later.
            await delete_claim_ref(api, claim_ref(released.family), released.family)
        family = attempt.family or state.family_of_candidate(attempt.candidate)
        families = {family} if family else set()
        canary = state.is_canary(attempt)
        if ended is not None:
            turn = state.note_finished(ended, attempt, self.live.clock.now())
        else:
            # A retried read of the canary's artifact ends the canary after its dispatch did.
            turn = state.note_canary_attempt(attempt)
        families |= _turned(state, turn)
        if ended is not None or canary:
            change.extend(state.save_meta())
        return families

    # -- retrying transient artifact reads -----------------------------------------------

    def _schedule_retry(
        self, state: RepoState, run: WorkflowRun, read: ArtifactRead, change: Change, wave: int | None = None
    ) -> None:
        """`wave`: the wave whose dispatch `run` failed, when the read is its candidate's (its
        dispatch ended with this read's failure: the retried read counts toward the pause)."""
        # Per run attempt: a re-run's failed read must not take the slot of attempt 1's.
        key = f"{run.id}:{run.run_attempt}:{read.attempt.candidate}"
        now = self.live.clock.now()
        entry: dict[str, Any] = state.pending_artifacts.get(key) or {
            "run": run.model_dump(mode="json", include=set(RETRIED_RUN_FIELDS)),
            "candidate": read.attempt.candidate,
            "artifact_id": read.artifact_id,
            "first_failure_at": stamp(now),
            "failures": 0,
        }
        if wave is not None:
            entry["wave"] = wave
        entry["failures"] += 1
        first = parse_time(entry["first_failure_at"]) or now
        due = next_retry_at(first, entry["failures"], now, rng=self._rng)
        if due is None:
            log.warning("outcome.retry_given_up", candidate=read.attempt.candidate, run_id=run.id)
            change.extend(state.drop_artifact_retry(key))
            return
        entry["next_at"] = stamp(due)
        change.extend(state.put_artifact_retry(key, entry))

    async def retry_artifacts_of(self, state: RepoState) -> int:
        """Re-read the repository's transiently failed artifacts that are due; how many were
        tried (the scheduler runs this per repository, backing off from one whose retries raise)."""
        now = self.live.clock.now()
        due = [(key, entry) for key, entry in state.pending_artifacts.items()
               if retry_due(parse_time(entry.get("next_at")) or now, now, RETRY_MAX_DELAY)]
        for key, entry in due:
            await self._retry_artifact(state, key, entry)
        return len(due)

    async def _retry_artifact(self, state: RepoState, key: str, entry: dict[str, Any]) -> None:
        api = self.live.api(state)
        run = WorkflowRun.model_validate(entry["run"])
        candidate, artifact_id = entry["candidate"], entry["artifact_id"]
        info = run_info(run, self.live.clock.now())

        def unread(code: str, transient: bool) -> ArtifactRead:
            attempt = unverified_attempt(candidate, state.family_of_candidate(candidate), info, code)
            return ArtifactRead(attempt, transient, artifact_id)

        try:
            artifact = await api.artifact(artifact_id)
        except GitHubError as exc:
            log.warning("outcome.artifact_lookup_failed", candidate=candidate, run_id=run.id, error=str(exc))
            read = unread(*download_error(exc))
        else:
            if artifact is None:
                read = unread("artifact-not-found", False)
            else:
                read = await self.read_artifact(state, api, candidate, artifact, info)
                if run.conclusion in RUN_FAILED_CONCLUSIONS:
                    read = replace(read, attempt=await _where_it_failed(api, run, info, read.attempt, dispatched="wave" in entry))
        async with self.live.lock(state.name):
            change = Change()
            if read.transient:
                self._schedule_retry(state, run, read, change)
            else:
                change.extend(state.drop_artifact_retry(key))
            families = await self.apply_attempt(state, api, read.attempt, change)
            if "wave" in entry and not read.transient:
                families |= self._note_read_late(state, entry["wave"], read.attempt, change)
            await self.live.persist(change)
        await self.live.notify(state, families)

    def _note_read_late(self, state: RepoState, wave: int, attempt: Attempt, change: Change) -> set[str]:
        """The families to re-render after a late read of a dispatched run that failed: all of
        them when it paused dispatch (every Klaud check run shows the pause)."""
        turn = state.note_read_late(wave, attempt, self.live.clock.now())
        change.extend(state.save_meta())  # the failure it counted, paused or not
        return _turned(state, turn)
