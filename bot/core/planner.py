"""The planning wave: one decision per live family, from local state only (DESIGN §4 "A wave").

`plan` is pure. Everything it needs arrives in a `Snapshot` of plain data and a capacity
reading fetched by the caller; it makes no network call and reads no clock, so a dry plan
(`klaud plan`, `/plan`) is the same function as a real wave, and a wave's inputs can be
stored and replayed. Whether a selected candidate's `/klaud retry` approval is consumed is
the caller's choice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    # Candidate id -> its attempts inside the cooldown window; absent when it has none.
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
    ladder = _Ladder(snapshot, policy, capacity, now)
    decisions = tuple(
        ladder.decide(family, candidate)
        for candidate, family in _in_priority_order(snapshot.families)
    )
    return Wave(
        repo=snapshot.repo,
        at=now,
        base=snapshot.base,
        wave=snapshot.wave,
        decisions=decisions,
        blocked=snapshot.blocked,
    )


def _in_priority_order(families: Sequence[Family]) -> list[tuple[str, Family]]:
    """(candidate id, family) pairs, stalest image first, ties by candidate id.

    An image whose last change is unknown may be the oldest of all, so it goes first. The
    candidate id is computed once here: hashing it is the costliest step per family.
    """
    rows = [(family.candidate, family) for family in families]
    rows.sort(key=lambda row: (row[1].image_changed_at or _UNKNOWN_AGE, row[0], row[1].id))
    return rows


class _Ladder:
    """The rungs of DESIGN §4 "A wave", tried in order for one family at a time.

    It counts the candidates it selects, so families must be decided in priority order.
    """

    def __init__(
        self, snapshot: Snapshot, policy: Policy, capacity: CapacityReading, now: datetime
    ) -> None:
        self.snapshot = snapshot
        self.policy = policy
        self.capacity = capacity
        self.now = now
        self.claim_ttl = timedelta(hours=policy.claim_ttl_hours)
        self.in_flight = len(snapshot.dispatches)
        self.selected = 0  # selections so far, the canary's and paused ones included

    def decide(self, family: Family, candidate: str) -> Decision:
        snapshot, policy = self.snapshot, self.policy

        def decision(
            kind: DecisionKind,
            reason: str,
            until: datetime | None = None,
            pull_requests: tuple[int, ...] = (),
        ) -> Decision:
            return Decision(
                family=family.id,
                candidate=candidate,
                decision=kind,
                reason=reason,
                until=until,
                pull_requests=pull_requests,
                clusters=family.clusters,
            )

        settled = snapshot.settled.get(family.id)
        if settled is not None:
            return settled

        hold = snapshot.holds.get(family.id)
        if hold is not None:
            return decision("held", _hold_reason(hold))

        dispatch = snapshot.dispatches.get(family.id)
        if dispatch is not None:
            # In flight until its outcome arrives, or its run is found finished or gone.
            until = (dispatch.checked_at or dispatch.at) + self.claim_ttl
            return decision("in-flight", _dispatch_reason(dispatch, self.now, until), until=until)

        claim = snapshot.claims.get(family.id)
        if claim is not None and claim.wave == snapshot.wave:
            claim = None  # this wave's own claim does not block it
        klaud_pr = snapshot.klaud_prs.get(family.id)
        if claim is not None or klaud_pr is not None:
            prs = (klaud_pr,) if klaud_pr is not None else ()
            return decision("claimed", _claimed_reason(claim, klaud_pr), pull_requests=prs)

        approval = snapshot.retries.get(candidate)
        state = cooldown(
            snapshot.attempts.get(candidate, ()),
            candidate,
            self.now,
            policy.cooldown_hours,
            retry_approved=approval is not None,
        )
        if not state.eligible:
            return decision("cooldown", state.reason, until=state.until)

        overlaps = snapshot.overlaps.get(family.id, ())
        if overlaps:
            ordered = sorted(overlaps, key=lambda o: (o.pr, o.kind, o.reason))
            blocking = tuple(dict.fromkeys(o.pr for o in ordered))
            return decision("overlap", "; ".join(o.reason for o in ordered), pull_requests=blocking)

        has_capacity, capacity_reason = target_eligibility(
            family.clusters, self.capacity, policy.capacity_rule
        )
        if not has_capacity:
            return decision("capacity", capacity_reason)

        if self.selected >= policy.max_candidates_per_wave:
            return decision(
                "cap",
                f"this wave already has {self.selected} candidates "
                f"(max_candidates_per_wave {policy.max_candidates_per_wave})",
            )
        if self.in_flight + self.selected >= policy.max_in_flight:
            return decision(
                "cap",
                f"{self.in_flight} candidates in flight and {self.selected} selected in this "
                f"wave (max_in_flight {policy.max_in_flight})",
            )

        self.selected += 1
        blocked = snapshot.blocked
        canary = blocked is not None and blocked.code == "dispatch-paused" and snapshot.canary
        if blocked is not None and not (canary and self.selected == 1):
            return decision("paused", blocked.reason)
        parts = [state.reason, "no open PR overlaps this family", capacity_reason]
        if approval is not None:
            parts.append(f"/klaud retry approved by {approval.by}")
        if canary:
            parts.append("the canary of a paused dispatch: its outcome resumes dispatch")
        return decision("selected", "; ".join(parts))


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
