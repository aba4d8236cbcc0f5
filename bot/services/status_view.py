"""What the status page shows (DESIGN §3.3), as plain data built from a repository's live state.

Three views: every repository at a glance (`overview`), one repository's families with the
next wave's decisions, its image freshness and its wave history (`repository`), and one
family with its attempts (`family`). The web layer only renders them.

The next wave's decisions come from the same dry plan as `/plan` (incremental, so cheap).
The wave history reads the last stored wave documents; those never change once written, so
each is summarised once and the summaries are kept as long as the repository's state lives.
"""

from __future__ import annotations

import math
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, NamedTuple, get_args

from bot.core.catalog import config_problems
from bot.core.clock import Clock
from bot.core.commands import with_until
from bot.core.domain import (
    NEUTRAL_OUTCOMES,
    Attempt,
    Blocked,
    Claim,
    Decision,
    DecisionKind,
    Dispatch,
    Family,
    Hold,
    Overlap,
    Wave,
    image_age_days,
    parse_time,
)
from bot.services.live import LiveState
from bot.services.repo_state import RepoState
from bot.services.waves import KEEP_WAVES, WaveRunner

DECISION_KINDS: tuple[str, ...] = get_args(DecisionKind)
# How a run of a candidate ended, for colours and counts: a verified outcome is validated,
# neutral (capacity-deferred, handoff, …) or failed; `unverified` covers unreadable artifacts
# and runs that failed before an outcome; `pending` is a dispatch with no attempt yet.
OutcomeKind = Literal["validated", "neutral", "failed", "unverified", "pending"]
OUTCOME_KINDS: tuple[str, ...] = get_args(OutcomeKind)
# Stalest first is what people look for; every other column reads best ascending.
DESCENDING_BY_DEFAULT = frozenset({"age"})
# Histogram bin widths in days, the smallest that keeps the oldest image within MAX_BINS.
BIN_WIDTHS = (1, 2, 5, 7, 14, 30, 60, 90, 180, 365)
MAX_BINS = 30


# -- the views --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Freshness:
    """Image ages of a repository's families, in days."""

    ages: tuple[float, ...]  # the known ages, ascending
    unknown: int

    @property
    def p50(self) -> float | None:
        return percentile(self.ages, 0.5)

    @property
    def p90(self) -> float | None:
        return percentile(self.ages, 0.9)

    @property
    def oldest(self) -> float | None:
        return self.ages[-1] if self.ages else None


@dataclass(frozen=True, slots=True)
class Histogram:
    width: int  # days per bin; bin i holds ages in [i * width, (i + 1) * width)
    counts: tuple[int, ...]


# (kind, count) pairs in their kinds' order, counts above zero: hashable, so the page can
# keep what it drew from a wave history until that history changes.
Counts = tuple[tuple[str, int], ...]


@dataclass(frozen=True, slots=True)
class WaveSummary:
    """What the page needs of one stored wave document."""

    number: int
    at: datetime
    selected: tuple[str, ...]  # the candidates it dispatched
    decisions: Counts  # families per decision kind
    blocked: str | None  # the block code, when the wave was paused or had a setup error


@dataclass(frozen=True, slots=True)
class WavePoint:
    """A wave with how the runs it dispatched ended, as far as the ledger knows."""

    wave: WaveSummary
    outcomes: Counts  # dispatched candidates per OutcomeKind


class LastOutcome(NamedTuple):
    text: str
    kind: OutcomeKind


class FamilyRow(NamedTuple):
    """Tuples, not dataclasses: the page caches each row's HTML by value, so every row of
    every render is hashed, which a tuple does in C."""

    id: str
    path: str
    key: str
    priority: int  # the family's place in the next wave's order
    decision: str
    reason: str  # with its "until" when the reason does not say it already
    image: str
    age_days: float | None
    outcome: LastOutcome | None  # the current candidate's latest attempt
    pulls: tuple[int, ...]  # open PRs that overlap the family now
    hold: Hold | None


def _by_decision(row: FamilyRow) -> int:
    return DECISION_KINDS.index(row.decision) if row.decision in DECISION_KINDS else len(DECISION_KINDS)


def _by_age(row: FamilyRow) -> float:
    # An unknown age counts as the stalest, as the wave orders it.
    return math.inf if row.age_days is None else row.age_days


# The columns that sort the families table, each with its key. Rows come in the wave's order
# and Python's sort is stable (reversed too), so rows that tie stay in the wave's order.
ROW_ORDERS: dict[str, Callable[[FamilyRow], Any]] = {
    "priority": lambda row: row.priority,
    "family": lambda row: row.id,
    "decision": _by_decision,
    "age": _by_age,
    "image": lambda row: row.image,
    "outcome": lambda row: row.outcome.text if row.outcome else "",
}


@dataclass(frozen=True, slots=True)
class RepoSummary:
    name: str
    enabled: bool
    last_wave: WaveSummary | None
    next_wave_at: datetime | None
    blocked: Blocked | None
    decisions: Counts  # of the next wave
    freshness: Freshness
    families: int
    policy_error: str | None
    config_errors: tuple[tuple[str, str], ...]  # (path, problem)


@dataclass(frozen=True, slots=True)
class RowQuery:
    """How the families table is sorted and filtered (the page's query parameters)."""

    sort: str = "priority"
    descending: bool = False
    decision: str | None = None
    text: str = ""

    @classmethod
    def parse(cls, sort: str | None, direction: str | None, decision: str | None, text: str | None) -> RowQuery:
        """From untrusted parameters; an unknown sort key or direction falls back to the default."""
        key = sort if sort in ROW_ORDERS else "priority"
        descending = direction == "desc" if direction in ("asc", "desc") else key in DESCENDING_BY_DEFAULT
        return cls(key, descending, decision or None, (text or "").strip())


@dataclass(frozen=True, slots=True)
class RepoPage:
    summary: RepoSummary
    rows: tuple[FamilyRow, ...]  # the ones the query keeps, in its order
    query: RowQuery
    histogram: Histogram
    history: tuple[WavePoint, ...]  # oldest first
    now: datetime


@dataclass(frozen=True, slots=True)
class AttemptRow:
    attempt: Attempt
    outcome: LastOutcome
    current: bool  # of the family's current candidate (an older image's otherwise)


@dataclass(frozen=True, slots=True)
class FamilyPage:
    repo: str
    family: Family
    row: FamilyRow
    overlaps: tuple[Overlap, ...]
    klaud_pr: int | None
    claim: Claim | None
    dispatch: Dispatch | None
    attempts: tuple[AttemptRow, ...]  # newest first, every candidate of the family
    now: datetime


# -- building them ----------------------------------------------------------------------


class StatusViews:
    def __init__(self, live: LiveState, waves: WaveRunner, clock: Clock) -> None:
        self.live = live
        self.waves = waves
        self.clock = clock
        # Per live RepoState (a repository installed again gets a new one, numbering its
        # waves from 1 again): wave number -> summary of its stored document.
        self._summaries: weakref.WeakKeyDictionary[RepoState, dict[int, WaveSummary]] = weakref.WeakKeyDictionary()

    def repo_name(self, repo: str) -> str | None:
        """The installed repository's own spelling of `repo` (names are case-insensitive)."""
        state = self.live.repo(repo)
        return None if state is None else state.name

    async def overview(self) -> list[RepoSummary]:
        summaries = []
        for state in sorted(self.live.repos.values(), key=lambda s: s.name.lower()):
            now = self.clock.now()
            plan = await self.waves.preview_state(state, now)
            ages = [image_age_days(family, now) for family in state.catalog]
            summaries.append(repo_summary(state, plan, await self._waves(state, 1), ages))
        return summaries

    async def repository(self, repo: str, query: RowQuery) -> RepoPage | None:
        state = self.live.repo(repo)
        if state is None:
            return None
        now = self.clock.now()
        plan = await self.waves.preview_state(state, now)
        history = await self._waves(state, KEEP_WAVES)
        rows = family_rows(state, plan, now)
        summary = repo_summary(state, plan, history, [row.age_days for row in rows])
        return RepoPage(
            summary=summary,
            rows=tuple(select_rows(rows, query)),
            query=query,
            histogram=histogram(summary.freshness.ages),
            history=tuple(WavePoint(wave, dispatch_outcomes(state, wave)) for wave in history),
            now=now,
        )

    async def family(self, repo: str, family_id: str) -> FamilyPage | None:
        state = self.live.repo(repo)
        if state is None or family_id not in state.catalog:
            return None  # at once, without waiting on the capacity feed
        now = self.clock.now()
        plan = await self.waves.preview_state(state, now)
        # Deliveries go on while the capacity feed is read: a push may have removed or
        # changed the family. The plan was made from the catalog after the read; so is this.
        family = state.catalog.get(family_id)
        if family is None:
            return None
        [(priority, decision)] = ((n, d) for n, d in enumerate(plan.decisions, start=1) if d.family == family.id)
        overlaps = tuple(state.overlap.overlaps(family, now, state.policy.idle_days))
        return FamilyPage(
            repo=state.name,
            family=family,
            row=family_row(state, family, decision, priority, overlaps, now),
            overlaps=overlaps,
            klaud_pr=state.overlap.klaud_pr(family),
            claim=state.claims.get(family.id),
            dispatch=state.dispatches.get(family.id),
            attempts=tuple(attempt_rows(state, family)),
            now=now,
        )

    async def _waves(self, state: RepoState, count: int) -> list[WaveSummary]:
        """Summaries of the last `count` stored waves, oldest first."""
        known = self._summaries.setdefault(state, {})
        for number in [n for n in known if n <= state.meta.wave - KEEP_WAVES]:
            del known[number]  # the store no longer keeps it either
        first = max(1, state.meta.wave - count + 1)
        found = []
        for number in range(first, state.meta.wave + 1):
            if number not in known:
                # A miss is not remembered: the wave being stored right now may be it.
                wave = await self.live.stored_wave(state.name, number)
                if wave is None:
                    continue
                known[number] = summarize_wave(wave)
            found.append(known[number])
        return found


def repo_summary(
    state: RepoState, plan: Wave, history: Sequence[WaveSummary], ages: Sequence[float | None]
) -> RepoSummary:
    """`history`: the last stored waves, oldest first; `ages`: every family's image age."""
    return RepoSummary(
        name=state.name,
        enabled=state.policy.enabled,
        last_wave=history[-1] if history and history[-1].number == state.meta.wave else None,
        next_wave_at=parse_time(state.meta.next_wave_at),
        blocked=plan.blocked,
        decisions=ordered_counts(Counter(d.decision for d in plan.decisions), DECISION_KINDS),
        freshness=freshness(ages),
        families=len(state.catalog),
        policy_error=state.meta.policy_error,
        config_errors=tuple(config_problems(state.meta.config_errors)),
    )


def summarize_wave(wave: Wave) -> WaveSummary:
    return WaveSummary(
        number=wave.wave,
        at=wave.at,
        selected=wave.selected,
        decisions=ordered_counts(Counter(d.decision for d in wave.decisions), DECISION_KINDS),
        blocked=wave.blocked.code if wave.blocked else None,
    )


def family_rows(state: RepoState, plan: Wave, now: datetime) -> list[FamilyRow]:
    """One row per live family, in the plan's priority order."""
    overlaps = state.overlap.blocking(now, state.policy.idle_days)
    return [
        family_row(state, family, decision, priority, overlaps.get(family.id, ()), now)
        for priority, decision in enumerate(plan.decisions, start=1)
        if (family := state.catalog.get(decision.family)) is not None
    ]


def family_row(
    state: RepoState, family: Family, decision: Decision, priority: int, overlaps: Iterable[Overlap], now: datetime
) -> FamilyRow:
    latest = state.ledger.for_candidate(decision.candidate)
    return FamilyRow(
        id=family.id,
        path=family.path,
        key=family.key,
        priority=priority,
        decision=decision.decision,
        reason=with_until(decision.reason, decision.until),
        image=family.image,
        age_days=image_age_days(family, now),
        outcome=describe_outcome(latest[0]) if latest else None,
        pulls=tuple([o.pr for o in overlaps]),
        hold=state.holds.get(family.id),
    )


def select_rows(rows: Iterable[FamilyRow], query: RowQuery) -> list[FamilyRow]:
    """The rows `query` keeps, in its order; `rows` come in the wave's order."""
    text = query.text.lower()
    kept = [
        row
        for row in rows
        if (query.decision is None or row.decision == query.decision)
        and (not text or text in row.id.lower() or text in row.image.lower() or text in row.reason.lower())
    ]
    kept.sort(key=ROW_ORDERS[query.sort], reverse=query.descending)
    return kept


def describe_outcome(attempt: Attempt) -> LastOutcome:
    if attempt.verified and attempt.outcome is not None:
        if attempt.outcome == "validated":
            return LastOutcome("validated", "validated")
        return LastOutcome(attempt.outcome, "neutral" if attempt.outcome in NEUTRAL_OUTCOMES else "failed")
    if attempt.error == "run-failed":
        where = " / ".join(part for part in (attempt.failed_job, attempt.failed_step) if part)
        return LastOutcome(f"run failed ({where})" if where else "run failed", "unverified")
    return LastOutcome(f"unverified ({attempt.error or 'no outcome'})", "unverified")


def attempt_rows(state: RepoState, family: Family) -> list[AttemptRow]:
    """Every attempt the live ledger holds for the family, whatever image it was of."""
    return [
        AttemptRow(attempt, describe_outcome(attempt), attempt.candidate == family.candidate)
        for attempt in state.ledger.all()
        if attempt.family == family.id or attempt.candidate.startswith(family.family_hash + "-")
    ]


def ordered_counts(counts: Counter[str], kinds: Sequence[str]) -> Counts:
    """`counts` in the order of `kinds`; a kind it does not know (a document written by
    another version of Klaud) comes last rather than not at all."""
    known = [(kind, counts[kind]) for kind in kinds if counts[kind]]
    return (*known, *sorted((kind, n) for kind, n in counts.items() if kind not in kinds and n))


def dispatch_outcomes(state: RepoState, wave: WaveSummary) -> Counts:
    """How the wave's dispatched candidates ended: each one's first attempt after the wave
    (a candidate in flight is never dispatched again, so that attempt is this dispatch's)."""
    counts: Counter[str] = Counter()
    for candidate in wave.selected:
        after = [a for a in state.ledger.for_candidate(candidate) if a.completed_at >= wave.at]
        counts[describe_outcome(after[-1]).kind if after else "pending"] += 1
    return ordered_counts(counts, OUTCOME_KINDS)


def freshness(ages: Sequence[float | None]) -> Freshness:
    """From every family's image age in days (None: unknown)."""
    known = sorted(age for age in ages if age is not None)
    return Freshness(tuple(known), len(ages) - len(known))


def percentile(ascending: Sequence[float], share: float) -> float | None:
    """Nearest-rank percentile: the smallest value with at least `share` of them at or below it."""
    if not ascending:
        return None
    return ascending[max(0, math.ceil(share * len(ascending)) - 1)]


def histogram(ascending: Sequence[float]) -> Histogram:
    oldest = ascending[-1] if ascending else 0.0
    width = next((w for w in BIN_WIDTHS if oldest / w < MAX_BINS), BIN_WIDTHS[-1])
    counts = [0] * (int(oldest // width) + 1)
    for age in ascending:
        counts[int(max(age, 0.0) // width)] += 1
    return Histogram(width, tuple(counts))
