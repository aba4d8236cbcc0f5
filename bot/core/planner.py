"""The planning wave: one decision per live family, from local state only (DESIGN §4 "A wave").

`plan` is pure. Everything it needs arrives in a `Snapshot` of plain data and a capacity
reading fetched by the caller; it makes no network call and reads no clock, so a dry plan
(`klaud plan`, `/plan`) is the same function as a real wave, and a wave's inputs can be
stored and replayed. Whether a selected candidate's `/klaud retry` approval is consumed is
the caller's choice.

A plan is two steps, so a live repository can plan incrementally: `verdict` applies the
rungs that depend on one family alone (held, in flight, claimed, cooldown, overlap) and
says until when its answer holds; `finish` walks the families in priority order and
applies what depends on the whole wave (capacity, the caps, a pause). Verdicts of families
no event touched since are reused (`bot.services.repo_state`); `plan` computes them all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from bot.core.capacity import target_eligibility
from bot.core.cooldown import cooldown, human_time
from bot.core.domain import (
    Attempt,
    Blocked,
    CapacityReading,
    Claim,
    Decision,
    DecisionKind,
    Dispatch,
    Family,
    Hold,
    Overlap,
    RetryApproval,
    Wave,
)
from bot.core.policy import Policy

_UNKNOWN_AGE = datetime.min.replace(tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The local state one wave decides from, as plain data taken at the wave's time."""

    repo: str
    base: str
    wave: int
    families: Sequence[Family]
    # Family id -> the open PRs that block it now (idle PRs and Klaud-own rules applied);
    # a family no PR blocks is absent.
    overlaps: Mapping[str, Sequence[Overlap]]
    # Candidate id -> its attempts of the last two cooldown windows (a run failure counts
    # with the one before it); absent when it has none.
    attempts: Mapping[str, Sequence[Attempt]]
    holds: Mapping[str, Hold]  # by family id
    retries: Mapping[str, RetryApproval]  # by candidate id
    claims: Mapping[str, Claim]  # by family id
    dispatches: Mapping[str, Dispatch]  # in-flight, by family id
    klaud_prs: Mapping[str, int]  # family id -> open Klaud PR number
    # Why the repository may dispatch nothing (a pause or a setup error), and whether the
    # one-candidate canary of a pause is armed.
    blocked: Blocked | None = None
    canary: bool = False
    # Decisions this wave already settled against GitHub (a claim lost to another wave, a
    # failed dispatch): planning again keeps them and gives their slots to later families.
    settled: Mapping[str, Decision] = field(default_factory=dict)


def plan(snapshot: Snapshot, policy: Policy, capacity: CapacityReading, now: datetime) -> Wave:
    """Decide every live family in priority order (stalest image first)."""
    order = priority_order(snapshot.families)
    verdicts = {
        family.id: verdict(family, candidate, _facts(snapshot, family, candidate), policy, snapshot.wave, now)
        for candidate, family in order
        if family.id not in snapshot.settled
    }
    return finish(
        Finishing(
            repo=snapshot.repo,
            base=snapshot.base,
            wave=snapshot.wave,
            in_flight=in_flight_count(snapshot.claims, snapshot.dispatches),
            blocked=snapshot.blocked,
            canary=snapshot.canary,
            settled=snapshot.settled,
        ),
        order,
        verdicts,
        policy,
        capacity,
        now,
    )


def priority_order(families: Iterable[Family]) -> list[tuple[str, Family]]:
    """(candidate id, family) pairs, stalest image first, ties by candidate id.

    An image whose last change is unknown may be the oldest of all, so it goes first. The
    candidate id is computed once here: hashing it is the costliest step per family.
    """
    rows = [(family.candidate, family) for family in families]
    rows.sort(key=lambda row: (row[1].image_changed_at or _UNKNOWN_AGE, row[0], row[1].id))
    return rows


def _facts(snapshot: Snapshot, family: Family, candidate: str) -> Facts:
    return Facts(
        hold=snapshot.holds.get(family.id),
        dispatch=snapshot.dispatches.get(family.id),
        claim=snapshot.claims.get(family.id),
        klaud_pr=snapshot.klaud_prs.get(family.id),
        attempts=snapshot.attempts.get(candidate, ()),
        retry=snapshot.retries.get(candidate),
        overlaps=snapshot.overlaps.get(family.id, ()),
    )


# ---------------------------------------------------------------------------------------
# One family


@dataclass(frozen=True, slots=True)
class Facts:
    """What the first rungs read of one family."""

    hold: Hold | None
    dispatch: Dispatch | None
    claim: Claim | None
    klaud_pr: int | None
    attempts: Sequence[Attempt]  # the candidate's, of the last two cooldown windows
    retry: RetryApproval | None
    overlaps: Sequence[Overlap]
    # When the first human PR of `overlaps` goes idle (then it stops blocking); None: never.
    overlaps_until: datetime | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the rungs before capacity decide for one family, and until when it holds.

    `decision` is None when the family may be selected; `reason` then says why (the
    cooldown rung's words) and `retry_by` who approved a retry. `valid_until` is the time
    at which time alone may change the verdict (a cooldown ending, an attempt leaving the
    window, an overlapping PR going idle); None when only an event can.
    """

    decision: Decision | None
    reason: str = ""
    retry_by: str | None = None
    valid_until: datetime | None = None
    wave_bound: bool = False  # depends on the wave's number: never reused by another wave


def verdict(family: Family, candidate: str, facts: Facts, policy: Policy, wave: int, now: datetime) -> Verdict:
    """Held, in flight, claimed, cooling down, overlapped, or eligible: one family's rungs."""

    def decided(kind: DecisionKind, reason: str, until: datetime | None = None, prs: tuple[int, ...] = ()) -> Decision:
        return Decision(family.id, candidate, kind, reason, until, prs, family.clusters)

    if facts.hold is not None:
        return Verdict(decided("held", _hold_reason(facts.hold)))
    if facts.dispatch is not None:
        # In flight until its outcome arrives, or its run is found finished or gone.
        next_check = (facts.dispatch.checked_at or facts.dispatch.at) + timedelta(hours=policy.claim_ttl_hours)
        reason = _dispatch_reason(facts.dispatch, now, next_check)
        return Verdict(decided("in-flight", reason, next_check), valid_until=next_check if now < next_check else None)
    own_claim = facts.claim is not None and facts.claim.wave == wave
    claim = None if own_claim else facts.claim  # this wave's own claim does not block it
    if claim is not None or facts.klaud_pr is not None:
        prs = (facts.klaud_pr,) if facts.klaud_pr is not None else ()
        return Verdict(decided("claimed", _claimed_reason(claim, facts.klaud_pr), prs=prs), wave_bound=own_claim)
    state = cooldown(facts.attempts, candidate, now, policy.cooldown_hours, retry_approved_at=facts.retry.at if facts.retry else None)
    if not state.eligible:
        return Verdict(decided("cooldown", state.reason, state.until), valid_until=state.until, wave_bound=own_claim)
    if facts.overlaps:
        ordered = sorted(facts.overlaps, key=lambda o: (o.pr, o.kind, o.reason))
        blocking = tuple(dict.fromkeys(o.pr for o in ordered))
        reason = "; ".join(o.reason for o in ordered)
        return Verdict(decided("overlap", reason, prs=blocking), valid_until=facts.overlaps_until, wave_bound=own_claim)
    window = timedelta(hours=policy.cooldown_hours)
    leaves = min((a.completed_at + window for a in facts.attempts if a.completed_at + window > now), default=None)
    return Verdict(
        None,
        state.reason,
        facts.retry.by if facts.retry is not None else None,
        valid_until=leaves,
        wave_bound=own_claim,
    )


# ---------------------------------------------------------------------------------------
# The whole wave


def in_flight_count(claims: Mapping[str, Claim], dispatches: Mapping[str, Dispatch]) -> int:
    """Families in flight, for the `max_in_flight` cap: dispatched by this Klaud, or claimed
    without a dispatch it knows of (dispatched by a replica that died before storing it, or
    a crash between claim and dispatch) until reconcile settles the claim. Counting those
    errs on the safe side: the cap is a limit on GPU work, not a target."""
    return len(claims.keys() | dispatches.keys())


@dataclass(frozen=True, slots=True)
class Finishing:
    """What the last rungs share across the wave."""

    repo: str
    base: str
    wave: int
    in_flight: int  # families in flight when the wave began (`in_flight_count`)
    blocked: Blocked | None = None
    canary: bool = False
    # Decisions this wave already settled against GitHub (dispatched, a claim lost to
    # another wave, a failed dispatch): kept as they are; a dispatched one counts as selected.
    settled: Mapping[str, Decision] = field(default_factory=dict)


def finish(
    wave: Finishing,
    order: Sequence[tuple[str, Family]],
    verdicts: Mapping[str, Verdict],
    policy: Policy,
    capacity: CapacityReading,
    now: datetime,
) -> Wave:
    """Capacity, the caps and a pause, over every family in priority order."""
    canary = wave.blocked is not None and wave.blocked.code == "dispatch-paused" and wave.canary
    capacity_of: dict[tuple[tuple[str, ...], str, tuple[str, ...]], tuple[bool, str]] = {}
    selected = 0  # selections so far, the canary's and paused ones included
    decisions: list[Decision] = []
    kind: DecisionKind
    for candidate, family in order:
        settled = wave.settled.get(family.id)
        if settled is not None:
            selected += settled.decision == "selected"
            decisions.append(settled)
            continue
        found = verdicts[family.id]
        if found.decision is not None:
            decisions.append(found.decision)
            continue
        # Families share a few distinct targets: each is checked against the feed once.
        target = (family.clusters, family.runner, family.unresolved)
        if target not in capacity_of:
            capacity_of[target] = target_eligibility(
                family.clusters, capacity, policy.capacity_rule, runner=family.runner, unresolved=family.unresolved
            )
        has_capacity, capacity_reason = capacity_of[target]
        if not has_capacity:
            kind, reason = "capacity", capacity_reason
        elif selected >= policy.max_candidates_per_wave:
            kind, reason = "cap", _wave_cap_reason(selected, policy)
        elif wave.in_flight + selected >= policy.max_in_flight:
            kind, reason = "cap", _in_flight_cap_reason(wave.in_flight, selected, policy)
        else:
            selected += 1
            if wave.blocked is not None and not (canary and selected == 1):
                kind, reason = "paused", wave.blocked.reason
            else:
                kind, reason = "selected", _selected_reason(found, capacity_reason, canary)
        decisions.append(Decision(family.id, candidate, kind, reason, None, (), family.clusters))
    return Wave(repo=wave.repo, at=now, base=wave.base, wave=wave.wave, decisions=tuple(decisions), blocked=wave.blocked)


def _wave_cap_reason(selected: int, policy: Policy) -> str:
    return f"this wave already has {selected} candidates (max_candidates_per_wave {policy.max_candidates_per_wave})"


def _in_flight_cap_reason(in_flight: int, selected: int, policy: Policy) -> str:
    return (
        f"{in_flight} candidates in flight and {selected} selected in this "
        f"wave (max_in_flight {policy.max_in_flight})"
    )


def _selected_reason(found: Verdict, capacity_reason: str, canary: bool) -> str:
    parts = [found.reason, "no open PR overlaps this family", capacity_reason]
    if found.retry_by is not None:
        parts.append(f"/klaud retry approved by {found.retry_by}")
    if canary:
        parts.append("the canary of a paused dispatch: its outcome resumes dispatch")
    return "; ".join(parts)


def _hold_reason(hold: Hold) -> str:
    why = hold.reason.strip() or "no reason given"
    return f"held by {hold.by} since {human_time(hold.at)}: {why}"


def _dispatch_reason(dispatch: Dispatch, now: datetime, next_check: datetime) -> str:
    run = f", run {dispatch.run_id}" if dispatch.run_id is not None else ""
    done = f"dispatched by wave {dispatch.wave} at {human_time(dispatch.at)}{run}"
    if dispatch.checked_at is not None and dispatch.run_status is not None:
        done += f"; still {dispatch.run_status.replace('_', ' ')} at {human_time(dispatch.checked_at)}"
    if now >= next_check:
        return f"{done}; its claim TTL passed: Klaud reads the run before the next wave"
    return f"{done}; waiting for its outcome"


def _claimed_reason(claim: Claim | None, klaud_pr: int | None) -> str:
    parts = []
    if klaud_pr is not None:
        parts.append(f"Klaud PR #{klaud_pr} is open for this family")
    if claim is not None:
        made_by = f"wave {claim.wave}" if claim.wave is not None else "no Klaud wave"
        parts.append(f"claim ref {claim.ref} exists since {human_time(claim.at)} ({made_by})")
    return "; ".join(parts)
