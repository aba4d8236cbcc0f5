"""The live state of one repository: catalog, overlap index, outcome ledger and controls.

A `RepoState` is the in-memory form of everything the store holds for a repository. It is
rebuilt from the store at start-up with no GitHub call, changed by handlers through the
methods below (each returns the store `Change` that persists it), and read by planning
waves through `snapshot()`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypedDict

import msgspec

from bot.core.catalog import Catalog, config_problems
from bot.core.cooldown import ATTEMPT_MEMORY, CooldownState, cooldown
from bot.core.dispatching import (
    PauseDocument,
    WaveRuns,
    WaveRunsDocument,
    count_failure,
    count_finished,
    disabled_block,
    pause_reason,
)
from bot.core.domain import (
    BRANCH_CANDIDATE_RE,
    Attempt,
    Blocked,
    CapacityReading,
    Claim,
    Decision,
    Dispatch,
    Family,
    Hold,
    PullRequest,
    RetryApproval,
    Wave,
    image_age_days,
    parse_time,
    stamp,
)
from bot.core.outcomes import OutcomeLedger
from bot.core.overlap import OverlapIndex
from bot.core.planner import (
    Facts,
    Finishing,
    Snapshot,
    Verdict,
    finish,
    in_flight_count,
    priority_order,
    verdict,
)
from bot.core.policy import Policy, PolicyError, parse_policy
from bot.core.setup import SetupError, SetupErrorDocument
from bot.store.change import Change

# How many waves' run endings are kept for the pause rule.
KEEP_WAVE_RUNS = 20
KEEP_CLOSED_PULLS = 1000  # closed PRs remembered, for events delivered late
# How long a release is remembered: commands found late are answered up to a week after.
RELEASES_KEPT = timedelta(days=8)
# A time for records that lost theirs (stored by an older version).
UNKNOWN_TIME = datetime.fromtimestamp(0, UTC)


class ReleasedHold(TypedDict):
    """A hold a command released: which comment, and when (every key required when read)."""

    by: str
    reason: str
    at: str
    comment: int
    released_at: str


@dataclass
class RepoMeta:
    """Per-repository facts that are not collections (persisted as one record)."""

    installation: int
    # GitHub's id of the repository: what stays when it is renamed or transferred.
    repo_id: int | None = None
    default_branch: str = "main"
    head_sha: str = ""
    policy_text: str | None = None
    policy_error: str | None = None
    # runners.yaml as `catalog.Runners.document()`: {"declared": [cluster ids], "labels":
    # {label: [runner names]}}. An older version stored label -> cluster ids; that is read
    # as "not known yet" and runners.yaml is read again (CatalogSync.refresh_config).
    runners: dict[str, Any] = field(default_factory=dict)
    config_errors: dict[str, str] = field(default_factory=dict)
    wave: int = 0
    next_wave_at: str | None = None
    # When the scheduler's last wave ran: a slot is never given again after a clock step back.
    scheduled_wave_at: str | None = None
    # A wave whose every dispatch failed is tried again once, at this time.
    retry_wave_at: str | None = None
    reconciled_at: str | None = None
    # When the last push to the default branch that was handled happened (GitHub's
    # `pushed_at`): one delivered after a later one is checked against the branch.
    last_push_at: str | None = None
    # Comments made before this were looked at for commands and receipts whose webhook was
    # lost (services.missed_comments); None until the first reconcile.
    comments_swept_at: str | None = None
    check_runs: dict[str, dict[str, Any]] = field(default_factory=dict)  # PR number -> {head_sha, id, digest, earlier}
    # What keeps the candidate workflow from taking dispatches ({code, detail} each), since when.
    setup_errors: list[SetupErrorDocument] = field(default_factory=list)
    setup_since: str | None = None
    # When Klaud first saw `.github/klaud.yml` turn dispatch off (`enabled: false`).
    disabled_since: str | None = None
    # A dispatch pause ({reason, since}) and its canary ({armed, candidate, wave}).
    pause: PauseDocument | None = None
    canary: dict[str, Any] | None = None
    # The wave of the canary that last resumed dispatch: runs of earlier waves, ending late,
    # no longer count toward a pause.
    pause_counts_from: int | None = None
    # Wave number -> how the runs it dispatched ended so far (dispatching.WaveRuns).
    wave_runs: dict[str, WaveRunsDocument] = field(default_factory=dict)
    # The dashboard issue: {issue: number, digest: of its last render}.
    dashboard: dict[str, Any] = field(default_factory=dict)
    # PR number -> when it was last seen closed (its `updated_at`), the newest few: a
    # `pull_request` event delivered late for it must not bring it back into the index.
    closed_pulls: dict[str, str] = field(default_factory=dict)
    # Claim refs on GitHub naming no family known here (fam16 -> when first listed):
    # deleted once older than a wave with no run of theirs in flight. Stored, so that
    # restarts and owners that change more often than a wave cannot keep one forever.
    stray_refs: dict[str, str] = field(default_factory=dict)
    # Family -> when its hold was last asked to end (a week of them): a hold asked before
    # that and found late (its webhook lost) is not placed again.
    released: dict[str, str] = field(default_factory=dict)
    # Family -> the hold its last release by a command ended ({by, reason, at, comment,
    # released_at}; a week of them, as `released`): the command run again (GitHub refused
    # its reply) answers what it did, not "was not held".
    released_holds: dict[str, ReleasedHold] = field(default_factory=dict)


def _another_run(dispatch: Dispatch, attempt: Attempt) -> bool:
    """Whether `attempt` is of a run other than the one `dispatch` is linked to (a receipt
    speaks for the dispatch's candidate, whichever run it names)."""
    return (dispatch.run_id is not None and attempt.run_id is not None and attempt.source != "receipt"
            and dispatch.run_id != attempt.run_id)


def _readable_times(meta: RepoMeta) -> RepoMeta:
    """`meta`, once each of its times reads as one; else ValueError naming the field (kept as
    text, a bad one raised later: at start-up, on the status page or at every scheduler tick)."""
    fields: dict[str, str | None] = {
        "next_wave_at": meta.next_wave_at, "retry_wave_at": meta.retry_wave_at, "reconciled_at": meta.reconciled_at,
        "last_push_at": meta.last_push_at, "scheduled_wave_at": meta.scheduled_wave_at,
        "comments_swept_at": meta.comments_swept_at, "setup_since": meta.setup_since,
        "disabled_since": meta.disabled_since,
        "pause.since": meta.pause["since"] if meta.pause else None, "dashboard.rendered_at": meta.dashboard.get("rendered_at"),
    }
    for name, mapping in (("closed_pulls", meta.closed_pulls), ("stray_refs", meta.stray_refs), ("released", meta.released)):
        fields |= {f"{name}.{key}": value for key, value in mapping.items()}
    for family, ended in meta.released_holds.items():
        fields |= {f"released_holds.{family}.at": ended["at"], f"released_holds.{family}.released_at": ended["released_at"]}
    for name, value in fields.items():
        try:
            parse_time(value)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{name}: {exc}") from None
    return meta


class RepoState:
    def __init__(self, name: str, meta: RepoMeta) -> None:
        self.name = name
        self.meta = meta
        self.policy = self._policy_from(meta.policy_text)
        self.catalog = Catalog()
        self.overlap = OverlapIndex(self.catalog, self.policy.family_files)
        self._by_hash: dict[str, Family] = {}
        self.ledger = OutcomeLedger()
        self.holds: dict[str, Hold] = {}
        self.retries: dict[str, RetryApproval] = {}
        self.claims: dict[str, Claim] = {}
        self.dispatches: dict[str, Dispatch] = {}
        self.pending_artifacts: dict[str, dict[str, Any]] = {}
        # Incremental planning: each family's verdict (with the candidate and the time it
        # was made for), dropped when an event touches the family; the priority order,
        # dropped when the catalog changes; so are the times of the images' last changes.
        self._verdicts: dict[str, tuple[str, datetime, Verdict]] = {}
        self._order: list[tuple[str, Family]] | None = None
        self._image_times: list[float] | None = None

    # -- loading -----------------------------------------------------------------------

    def _policy_from(self, text: str | None) -> Policy:
        """The stored policy: the last good one (an invalid file never replaces it)."""
        try:
            return parse_policy(text)
        except PolicyError as exc:
            # Good for the version of Klaud that stored it, refused by this one: it stays in
            # force as that version read it (its defaults, `enabled: false` among them, would
            # start waves nobody asked for), and its file is reported invalid (check runs,
            # status page, state document) until it is fixed. An error stored already is the
            # file's own now (edited since), and stays.
            self.meta.policy_error = self.meta.policy_error or str(exc)
        try:
            return parse_policy(text, stored=True)
        except PolicyError:
            # Not a policy any version stored (a record edited by hand): nothing dispatches.
            self.meta.policy_error = f"{self.meta.policy_error}; the stored policy cannot be read: no wave dispatches"
            return Policy(enabled=False)

    @classmethod
    def from_records(cls, name: str, records: dict[str, dict[str, Any]], meta: Any) -> RepoState:
        """The state the store holds; ValueError when the repository's record cannot be read
        (a field missing or of the wrong type; fields a newer version added are ignored)."""
        state = cls(name, _readable_times(msgspec.convert(meta, RepoMeta)))
        state.catalog = Catalog(records.get("family", {}).values())
        state.overlap = OverlapIndex(state.catalog, state.policy.family_files)
        state._index_families()
        for pull in records.get("pull", {}).values():
            state.overlap.upsert(pull)
        state.ledger = OutcomeLedger(records.get("attempt", {}).values())
        state.holds = {hold.family: hold for hold in records.get("hold", {}).values()}
        state.retries = {retry.candidate: retry for retry in records.get("retry", {}).values()}
        state.claims = {claim.family: claim for claim in records.get("claim", {}).values()}
        state.dispatches = {d.family: d for d in records.get("dispatch", {}).values()}
        state.pending_artifacts = dict(records.get("artifact-retry", {}))
        return state

    def take_contents(self, other: RepoState) -> None:
        """Become `other` (the same repository read back from the store) in place: every
        holder of this object (a handler waiting for the lock) then sees the store's state."""
        vars(self).update(vars(other))

    def save_meta(self, change: Change | None = None) -> Change:
        # `is None`, not `or`: an empty Change is falsy, and the caller's change must get the put.
        change = Change() if change is None else change
        # Encoded as it is put (msgspec writes the dataclass in C): the stored record is
        # this moment's, and no deep copy is made (asdict took 1.5 ms with 70 Klaud PRs).
        return change.put("", "repo", self.name, self.meta)

    # -- policy ------------------------------------------------------------------------

    def set_policy_text(self, text: str | None, now: datetime | None = None) -> tuple[bool, Change]:
        """Adopt a new `.github/klaud.yml`; an invalid one keeps the last good policy. `now`:
        when it was read (a policy turning dispatch off is dated then)."""
        try:
            policy = parse_policy(text)
        except PolicyError as exc:
            self.meta.policy_error = str(exc)
            return False, self.save_meta()
        changed = policy != self.policy
        self.policy = policy
        self.meta.policy_text = text
        self.meta.policy_error = None
        if policy.enabled:
            self.meta.disabled_since = None
        elif self.meta.disabled_since is None and now is not None:
            self.meta.disabled_since = stamp(now)  # stored with the policy: the same after a restart
        change = self.save_meta()
        if changed:
            self.retouch()  # every verdict depends on the policy: retouch drops them all
        return changed, change

    # -- catalog -----------------------------------------------------------------------

    def replace_families(self, path: str, families: list[Family], changed_at: datetime | None) -> Change:
        """Make `families` the content of `path`; a new or changed image is dated `changed_at`."""
        change = Change()
        for old in self.catalog.families_of(path):
            change.delete(self.name, "family", old.id)
        self.catalog.replace_file(path, families, changed_at)
        for family in self.catalog.families_of(path):
            change.put(self.name, "family", family.id, family)
        self.meta.config_errors.pop(path, None)
        self._index_families()
        return change.extend(self._drop_stale_retries())

    def date_images(self, dates: Mapping[str, datetime], *, unknown_only: bool = True) -> Change:
        """Image ages found in the history (a blame) for families that had none (`unknown_only`)."""
        change = Change()
        for family in self.catalog.date_images(dates, unknown_only=unknown_only):
            change.put(self.name, "family", family.id, family)
        if change:
            self._index_families()  # ages order the families
        return change

    def remove_config(self, path: str) -> Change:
        change = Change()
        for old in self.catalog.remove_file(path):
            change.delete(self.name, "family", old.id)
        self.meta.config_errors.pop(path, None)
        self._index_families()
        return change.extend(self._drop_stale_retries())

    def _drop_stale_retries(self) -> Change:
        """`/klaud retry` approvals of candidates no family has any more (its image changed,
        or it left the configs): never used, they were kept for good."""
        current = {family.candidate for family in self.catalog}
        change = Change()
        for candidate in [candidate for candidate in self.retries if candidate not in current]:
            change.extend(self.consume_retry(candidate))
        return change

    def _index_families(self) -> None:
        self._by_hash = {family.family_hash: family for family in self.catalog}
        self._forget_every_verdict()

    def retouch(self) -> None:
        """Recompute every PR's touches after the catalog or policy changed (no API call)."""
        self.overlap.retouch(self.catalog, self.policy.family_files)
        self._forget_every_verdict()

    def family_by_hash(self, fam16: str) -> Family | None:
        return self._by_hash.get(fam16)

    def cooldown_of(self, candidate: str, now: datetime, *, with_retry: bool = True) -> CooldownState:
        """The candidate's cooldown from its attempts, cleared by its pending `/klaud retry`
        (if it has one and `with_retry`) as `cooldown` says."""
        approval = self.retries.get(candidate) if with_retry else None
        return cooldown(
            self.ledger.for_candidate(candidate), candidate, now, self.policy.cooldown_hours,
            approval.at if approval else None,
        )

    def family_of_candidate(self, candidate: str) -> str | None:
        family = self.family_by_hash(candidate[:16])
        if family is not None:
            return family.id
        for dispatch in self.dispatches.values():
            if dispatch.candidate == candidate:
                return dispatch.family
        return None

    # -- pull requests -----------------------------------------------------------------

    def upsert_pull(self, pull: PullRequest) -> Change:
        before = self._families_of_pull(pull.number)
        self.overlap.upsert(pull)
        self._forget_verdicts(before | self._families_of_pull(pull.number))
        return Change().put(self.name, "pull", pull.number, pull)

    def remove_pull(self, number: int, closed_at: datetime) -> Change:
        self._forget_verdicts(self._families_of_pull(number))
        self.overlap.remove(number)
        self.meta.check_runs.pop(str(number), None)
        self.meta.closed_pulls[str(number)] = stamp(closed_at) or ""
        for old in sorted(self.meta.closed_pulls, key=self.meta.closed_pulls.__getitem__)[:-KEEP_CLOSED_PULLS]:
            del self.meta.closed_pulls[old]
        return self.save_meta(Change().delete(self.name, "pull", number))

    def is_stale_pull_event(self, number: int, updated_at: datetime, action: str) -> bool:
        """Whether a `pull_request` event is older than what is known of its PR: GitHub
        does not deliver in order, and the last to arrive is not always the newest."""
        known = self.overlap.get(number)
        if known is not None:
            return updated_at < known.updated_at
        closed = parse_time(self.meta.closed_pulls.get(str(number)))
        # A reopen in the same second as its close is news; anything else then is not.
        return closed is not None and (updated_at < closed or (updated_at == closed and action != "reopened"))

    # -- outcomes ----------------------------------------------------------------------

    def record_attempt(self, attempt: Attempt) -> tuple[bool, Change]:
        change = Change()
        if not self.ledger.add(attempt):
            return False, change
        key = f"{attempt.candidate}:{attempt.run_id}:{attempt.run_attempt}"
        change.put(self.name, "attempt", key, attempt)
        self._forget_verdicts({self.family_of_candidate(attempt.candidate)})
        return True, change

    def forget_attempts_before(self, cutoff: datetime) -> None:
        """Attempts older than any rule reads leave memory (the store keeps them longer):
        a process running for months holds what a restart would load, no more."""
        if self.ledger.forget_before(cutoff, keep=self.klaud_pr_candidates()):
            self._forget_every_verdict()

    def klaud_pr_candidates(self) -> set[str]:
        """The candidates open Klaud PRs work on. Their attempts stay in memory however old:
        each PR's check run shows them (without them it turned neutral, "No attempts yet.",
        whatever its runs had ended with)."""
        return {self.candidate_of_pull(pull) for pull in self.overlap.prs() if pull.klaud_own} - {""}

    def candidate_of_pull(self, pull: PullRequest) -> str:
        """The candidate a Klaud PR works on: the one its branch names, even if the family
        moved on since; else its family's current one ("" when it has no live family)."""
        match = BRANCH_CANDIDATE_RE.match(pull.head_ref)
        if match:
            return match.group(1)
        family = self.family_by_hash(pull.own_family_hash) if pull.own_family_hash else None
        return family.candidate if family else ""

    def release_for(self, attempt: Attempt, *, run_known: bool) -> tuple[Claim | None, Dispatch | None, Change]:
        """An outcome arrived: the candidate is no longer in flight and its claim is released.

        `run_known`: an attempt of the same run was recorded before (a retried artifact read,
        a re-run, a reconcile's re-read). Its first record ended what it had to; a dispatch
        made since is a newer run's, still in flight, and only news of that very run ends it.
        Returns the claim to delete on GitHub and the dispatch that ended, when there were.
        """
        change = Change()
        family = attempt.family or self.family_of_candidate(attempt.candidate)
        if family is None:
            return None, None, change
        ended = self.dispatches.get(family)
        if run_known and (ended is None or ended.run_id != attempt.run_id):
            return None, None, change
        if ended is not None and _another_run(ended, attempt):
            # Another run of the candidate (a person's dispatch, another planner's) ended:
            # this dispatch's own run is still to report, queued or running. Ended here, the
            # next wave dispatched the candidate again while that run still waited.
            return None, None, change
        if ended is not None and ended.candidate == attempt.candidate:
            change.extend(self.drop_dispatch(family))
        else:
            ended = None
        claim = self.claims.get(family)
        # Any recorded attempt means the run is over, even if its outcome could not be read.
        if claim is not None and claim.candidate == attempt.candidate:
            change.extend(self.drop_claim(family))
            return claim, ended, change
        return None, ended, change

    # -- pause, canary and setup -------------------------------------------------------

    def blocked(self) -> Blocked | None:
        """What keeps waves from dispatching: a setup error first, then a pause."""
        if self.meta.setup_errors:
            reason = "setup error: " + "; ".join(e["detail"] for e in self.meta.setup_errors)
            return Blocked("setup-error", reason, parse_time(self.meta.setup_since) or UNKNOWN_TIME)
        if self.meta.pause is not None:
            reason = self.meta.pause["reason"]
            if self.canary_armed:
                reason += " (a canary is armed: the next wave dispatches one candidate)"
            return Blocked("dispatch-paused", reason, parse_time(self.meta.pause["since"]) or UNKNOWN_TIME)
        return None

    def blocked_now(self, now: datetime) -> Blocked | None:
        """`blocked()`, or first `enabled: false`, as the plan says it (`dispatching.disabled`)."""
        return self.blocked() if self.policy.enabled else self.disabled_block(now)

    def disabled_block(self, now: datetime) -> Blocked:
        """What `enabled: false` blocks with, dated when Klaud first saw the file say so:
        dated `now`, the check runs and the dashboard changed every minute, and each render
        was sent again though nothing had changed. (A record stored before that date was
        kept gets it here, in memory, until the policy is read again.)"""
        if self.meta.disabled_since is None:
            self.meta.disabled_since = stamp(now)
        return disabled_block(parse_time(self.meta.disabled_since) or now)

    @property
    def canary_armed(self) -> bool:
        return self.meta.pause is not None and bool((self.meta.canary or {}).get("armed"))

    def canary_running(self) -> str | None:
        """The candidate of a canary dispatched whose run has not ended yet."""
        candidate = (self.meta.canary or {}).get("candidate")
        if self.meta.pause is None or candidate is None:
            return None
        # Its dispatch ends with its outcome, or is released without one (then it is over).
        return candidate if any(d.candidate == candidate for d in self.dispatches.values()) else None

    def arm_canary(self) -> bool:
        """A push or /klaud resume: the next wave of a paused repository dispatches one.

        A canary already running is left alone: re-armed, its outcome would no longer be
        recognised, dispatch would stay paused, and a second canary would go out.
        """
        if self.meta.pause is None or self.canary_running() is not None:
            return False
        self.meta.canary = {"armed": True, "candidate": None, "wave": None}
        return True

    def canary_dispatched(self, candidate: str, wave: int) -> None:
        self.meta.canary = {"armed": False, "candidate": candidate, "wave": wave}

    def rearm_canary_of(self, candidate: str) -> bool:
        """The canary dispatched for `candidate` started no run (GitHub lost the dispatch,
        or the process stopped before sending it): armed again, as a refused one is, so the
        next wave sends one. Without a run there is no outcome to end the pause with."""
        if self.meta.pause is None or (self.meta.canary or {}).get("candidate") != candidate:
            return False
        self.meta.canary = {"armed": True, "candidate": None, "wave": None}
        return True

    def set_setup_errors(self, errors: list[SetupError], now: datetime) -> bool:
        """Adopt the candidate workflow's setup errors; True when they changed."""
        documents = [e.document() for e in errors]
        if documents == self.meta.setup_errors:
            return False
        self.meta.setup_since = stamp(now) if documents and not self.meta.setup_errors else self.meta.setup_since
        self.meta.setup_errors = documents
        if not documents:
            self.meta.setup_since = None
        return True

    def note_dispatched(self, wave: int, count: int) -> None:
        if count:
            self.meta.wave_runs[str(wave)] = WaveRuns(dispatched=count).document()
            for old in sorted(self.meta.wave_runs, key=int)[:-KEEP_WAVE_RUNS]:
                del self.meta.wave_runs[old]

    def note_finished(self, dispatch: Dispatch, attempt: Attempt, now: datetime) -> str | None:
        """A dispatched run ended with `attempt`: "paused" or "resumed" when that changed."""
        if dispatch.wave < (self.meta.pause_counts_from or 0) and not self.is_canary(attempt):
            return None  # a run of a wave before the last canary's: its breakage was fixed since
        stats = self.meta.wave_runs.get(str(dispatch.wave))
        runs = WaveRuns(**stats) if stats is not None else WaveRuns(dispatched=0)
        count_finished(runs, attempt)
        self.meta.wave_runs[str(dispatch.wave)] = runs.document()
        if self.is_canary(attempt):
            if self.meta.canary is not None and not _another_run(dispatch, attempt):
                # Its own run, from now on told apart from a person's run of the candidate.
                self.meta.canary["run"] = attempt.run_id
            return self.note_canary_attempt(attempt)
        return self._pause_if_due(dispatch.wave, runs, now)

    def note_read_late(self, wave: int, attempt: Attempt, now: datetime) -> str | None:
        """A dispatched run of `wave`, counted finished when its artifact could not be
        downloaded, read at last: a failure before an outcome counts toward the pause rule as
        it would have, read at once. "paused" when that pauses."""
        stats = self.meta.wave_runs.get(str(wave))
        if stats is None or wave < (self.meta.pause_counts_from or 0) or self.is_canary(attempt):
            return None  # a wave too old to count, or one before the last canary's
        runs = WaveRuns(**stats)
        if not count_failure(runs, attempt):
            return None
        self.meta.wave_runs[str(wave)] = runs.document()
        return self._pause_if_due(wave, runs, now)

    def _pause_if_due(self, wave: int, runs: WaveRuns, now: datetime) -> str | None:
        if self.meta.pause is None:
            reason = pause_reason(wave, runs)
            if reason is not None:
                self.meta.pause = {"reason": reason, "since": stamp(now) or ""}
                self.meta.canary = None
                return "paused"
        return None

    def is_canary(self, attempt: Attempt) -> bool:
        return self.meta.pause is not None and (self.meta.canary or {}).get("candidate") == attempt.candidate

    def note_canary_attempt(self, attempt: Attempt) -> str | None:
        """An attempt of the paused repository's canary: "resumed" when it is an outcome.

        Without one the repository stays paused until the next push or /klaud resume,
        unless the read of its artifact failed transiently and is retried: the canary then
        waits for that read, whose outcome arrives after its dispatch has ended.
        """
        if not self.is_canary(attempt):
            return None
        family = attempt.family or self.family_of_candidate(attempt.candidate)
        dispatch = self.dispatches.get(family) if family else None
        own = (self.meta.canary or {}).get("run")
        if (dispatch is not None and _another_run(dispatch, attempt)) or (
                own is not None and attempt.source != "receipt" and attempt.run_id != own):
            return None  # a person's run of the canary's candidate: the canary's own counts
        if attempt.verified and attempt.failed_job is None:  # not the fallback of a failed session
            # The waves before the canary's broke before the fix: a late run of theirs that
            # ends now must not pause dispatch again (`note_finished` passes them over).
            since = (self.meta.canary or {}).get("wave")
            if isinstance(since, int):
                self.meta.pause_counts_from = since
            self.meta.pause = None
            self.meta.canary = None
            return "resumed"
        if not self.artifact_read_pending(attempt.candidate, attempt.run_id):
            self.meta.canary = None
        return None

    # -- controls ----------------------------------------------------------------------

    def hold(self, hold: Hold) -> Change:
        self.holds[hold.family] = hold
        self._forget_verdicts({hold.family})
        return Change().put(self.name, "hold", hold.family, hold)

    def unhold(self, family: str, asked_at: datetime, comment: int | None = None) -> tuple[Hold | None, Change]:
        """End the family's hold, as asked at `asked_at` (by the command of `comment`)."""
        previous = self.holds.pop(family, None)
        self._forget_verdicts({family})
        # Remembered even when nothing was held: "unhold" is the person's word either way.
        kept_from = asked_at - RELEASES_KEPT
        self.meta.released = {f: at for f, at in self.meta.released.items() if (parse_time(at) or UNKNOWN_TIME) >= kept_from}
        self.meta.released_holds = {f: ended for f, ended in self.meta.released_holds.items()
                                    if (parse_time(ended["released_at"]) or UNKNOWN_TIME) >= kept_from}
        if previous is not None and comment is not None:
            self.meta.released_holds[family] = {
                "by": previous.by, "reason": previous.reason, "at": stamp(previous.at) or "",
                "comment": comment, "released_at": stamp(asked_at) or "",
            }
        newer = parse_time(self.meta.released.get(family))
        if newer is None or newer < asked_at:  # an older unhold found late is not a later word
            self.meta.released[family] = stamp(asked_at) or ""
        change = self.save_meta(Change().delete(self.name, "hold", family))
        return previous, change

    def approve_retry(self, approval: RetryApproval) -> Change:
        self.retries[approval.candidate] = approval
        self._forget_verdicts({self.family_of_candidate(approval.candidate)})
        return Change().put(self.name, "retry", approval.candidate, approval)

    def give_back_retry(self, approval: RetryApproval) -> Change:
        """A `/klaud retry` used by a dispatch that started no run: pending again, unless its
        candidate is no family's any more (its image changed meanwhile)."""
        family = self.family_by_hash(approval.candidate[:16])
        if family is None or family.candidate != approval.candidate:
            return Change()
        return self.approve_retry(approval)

    def consume_retry(self, candidate: str) -> Change:
        self.retries.pop(candidate, None)
        self._forget_verdicts({self.family_of_candidate(candidate)})
        return Change().delete(self.name, "retry", candidate)

    def in_flight(self) -> int:
        return in_flight_count(self.claims, self.dispatches)

    def add_claim(self, claim: Claim) -> Change:
        self.claims[claim.family] = claim
        self._forget_verdicts({claim.family})
        return Change().put(self.name, "claim", claim.family, claim)

    def drop_claim(self, family: str) -> Change:
        self.claims.pop(family, None)
        self._forget_verdicts({family})
        return Change().delete(self.name, "claim", family)

    def add_dispatch(self, dispatch: Dispatch) -> Change:
        self.dispatches[dispatch.family] = dispatch
        self._forget_verdicts({dispatch.family})
        return Change().put(self.name, "dispatch", dispatch.family, dispatch)

    def drop_dispatch(self, family: str) -> Change:
        self.dispatches.pop(family, None)
        self._forget_verdicts({family})
        return Change().delete(self.name, "dispatch", family)

    def link_run(self, family: str, run_id: int) -> Change:
        """The run GitHub started for the family's dispatch is known now."""
        dispatch = self.dispatches[family]
        # A run started: what the dispatch used (a `/klaud retry`) is spent for good.
        return self.add_dispatch(replace(dispatch, run_id=run_id, approval=None))

    def put_artifact_retry(self, key: str, entry: dict[str, Any]) -> Change:
        self.pending_artifacts[key] = entry
        return Change().put(self.name, "artifact-retry", key, entry)

    def artifact_read_pending(self, candidate: str, run_id: int) -> bool:
        """A transiently failed read of `candidate`'s artifact in run `run_id` is to be retried."""
        return any(
            entry["candidate"] == candidate and entry["run"]["id"] == run_id for entry in self.pending_artifacts.values()
        )

    def drop_artifact_retry(self, key: str) -> Change:
        self.pending_artifacts.pop(key, None)
        return Change().delete(self.name, "artifact-retry", key)

    # -- planning ----------------------------------------------------------------------

    def plan(
        self,
        wave: int,
        now: datetime,
        capacity: CapacityReading,
        *,
        settled: Mapping[str, Decision] | None = None,
        in_flight: int | None = None,
    ) -> Wave:
        """The wave `planner.plan(self.snapshot(wave, now), …)` would decide, reusing the
        verdicts of families no event touched since they were made.

        `settled` and `in_flight` are for planning again inside a wave: the decisions GitHub
        already settled, and the dispatches in flight when the wave began.
        """
        settled = settled or {}
        order = self._priority_order()
        since = self._attempts_since(now)
        verdicts = {
            family.id: self._verdict(family, candidate, wave, now, since)
            for candidate, family in order
            if family.id not in settled
        }
        finishing = Finishing(
            repo=self.name,
            base=self.meta.head_sha,
            wave=wave,
            in_flight=self.in_flight() if in_flight is None else in_flight,
            blocked=self.blocked(),
            canary=self.canary_armed,
            settled=settled,
        )
        return finish(finishing, order, verdicts, self.policy, capacity, now)

    def _attempts_since(self, now: datetime) -> datetime:
        """The oldest attempt that can decide anything at `now`: one inside the cooldown
        window, or the run failure before it that makes it the second in a row, days before
        it (a candidate capacity kept waiting): every one remembered."""
        return now - ATTEMPT_MEMORY

    def _verdict(self, family: Family, candidate: str, wave: int, now: datetime, since: datetime) -> Verdict:
        cached = self._verdicts.get(family.id)
        if cached is not None:
            made_for, at, found = cached
            if made_for == candidate and at <= now and (found.valid_until is None or now < found.valid_until):
                return found
        facts = Facts(
            hold=self.holds.get(family.id),
            dispatch=self.dispatches.get(family.id),
            claim=self.claims.get(family.id),
            klaud_pr=self.overlap.klaud_pr(family),
            attempts=self.ledger.recent(candidate, since),
            retry=self.retries.get(candidate),
            overlaps=self.overlap.overlaps(family, now, self.policy.idle_days),
            overlaps_until=self.overlap.overlaps_until(family, now, self.policy.idle_days),
        )
        found = verdict(family, candidate, facts, self.policy, wave, now)
        if not found.wave_bound:
            self._verdicts[family.id] = (candidate, now, found)
        return found

    def _priority_order(self) -> list[tuple[str, Family]]:
        if self._order is None:
            self._order = priority_order(self.catalog)
        return self._order

    def image_change_times(self) -> list[float]:
        """When each family of known image age last changed its image (epoch seconds,
        ascending): ages at any moment without a pass over the families."""
        if self._image_times is None:
            self._image_times = sorted(
                changed.timestamp() for family in self.catalog if (changed := family.image_changed_at) is not None
            )
        return self._image_times

    def _families_of_pull(self, number: int) -> set[str | None]:
        touched, own_hash = self.overlap.families_of(number)
        own = self.family_by_hash(own_hash) if own_hash else None
        return {*touched, own.id if own is not None else None}

    def _forget_verdicts(self, families: Iterable[str | None]) -> None:
        for family in families:
            if family is not None:
                self._verdicts.pop(family, None)

    def _forget_every_verdict(self) -> None:
        self._verdicts.clear()
        self._order = None
        self._image_times = None

    # -- reading -----------------------------------------------------------------------

    def snapshot(self, wave: int, now: datetime) -> Snapshot:
        """The plain data a wave at `now` decides from (copies: a wave changes claims as it goes)."""
        since = self._attempts_since(now)
        families = tuple(self.catalog)
        return Snapshot(
            repo=self.name,
            base=self.meta.head_sha,
            wave=wave,
            families=families,
            overlaps=self.overlap.blocking(now, self.policy.idle_days),
            attempts=self.ledger.recent_for((f.candidate for f in families), since),
            holds=dict(self.holds),
            retries=dict(self.retries),
            claims=dict(self.claims),
            dispatches=dict(self.dispatches),
            klaud_prs=self.overlap.klaud_prs(),
            blocked=self.blocked(),
            canary=self.canary_armed,
        )

    def state_document(self, now: datetime) -> dict[str, Any]:
        """DESIGN §3.5."""
        idle_before = now - timedelta(days=self.policy.idle_days)
        return {
            "repo": self.name,
            "head_sha": self.meta.head_sha,
            "policy": self.policy.model_dump(mode="json"),
            "families": [
                {
                    "family": f.id,
                    "candidate": f.candidate,
                    "image": f.image,
                    "runner": f.runner,
                    "clusters": list(f.clusters),
                    "unresolved_runners": list(f.unresolved),
                    "image_changed_at": stamp(f.image_changed_at),
                    "image_age_days": image_age_days(f, now),
                }
                for f in self.catalog
            ],
            "policy_error": self.meta.policy_error,
            "config_errors": [
                {"path": path, "detail": detail} for path, detail in config_problems(self.meta.config_errors)
            ],
            "setup_errors": list(self.meta.setup_errors),
            "blocked": blocked.document() if (blocked := self.blocked_now(now)) is not None else None,
            "pulls": [
                {
                    "number": p.number,
                    "author": p.author,
                    "head_ref": p.head_ref,
                    "head_sha": p.head_sha,
                    "draft": p.draft,
                    "updated_at": stamp(p.last_active),
                    "klaud_own": p.klaud_own,
                    "idle": not p.klaud_own and p.last_active <= idle_before,
                    "files_complete": p.files_complete,
                    "touches": dict(sorted(self.overlap.touches(p.number).items())),
                }
                for p in sorted(self.overlap.prs(), key=lambda p: p.number)
            ],
            "attempts": [_attempt_document(a) for a in self.ledger.all()],
            "holds": [
                {"family": h.family, "by": h.by, "reason": h.reason, "at": stamp(h.at)}
                for h in sorted(self.holds.values(), key=lambda h: h.family)
            ],
            "retries": [
                {"candidate": r.candidate, "by": r.by, "at": stamp(r.at)}
                for r in sorted(self.retries.values(), key=lambda r: r.candidate)
            ],
            "claims": [
                {"family": c.family, "candidate": c.candidate, "wave": c.wave, "ref": c.ref, "at": stamp(c.at)}
                for c in sorted(self.claims.values(), key=lambda c: c.family)
            ],
            "dispatches": [
                {
                    "family": d.family, "candidate": d.candidate, "wave": d.wave, "at": stamp(d.at),
                    "run_id": d.run_id, "run_status": d.run_status, "checked_at": stamp(d.checked_at),
                }
                for d in sorted(self.dispatches.values(), key=lambda d: d.family)
            ],
        }


def _attempt_document(attempt: Attempt) -> dict[str, Any]:
    return {
        "candidate": attempt.candidate,
        "family": attempt.family,
        "run_id": attempt.run_id,
        "run_attempt": attempt.run_attempt,
        "base": attempt.base,
        "completed_at": stamp(attempt.completed_at),
        "verified": attempt.verified,
        "outcome": attempt.outcome,
        "phase": attempt.phase,
        "pull_request": attempt.pull_request,
        "reason_code": attempt.reason_code,
        "error": attempt.error,
        "failed_job": attempt.failed_job,
        "failed_step": attempt.failed_step,
    }
