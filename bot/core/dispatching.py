"""What a wave's decisions become when claiming or dispatching a selected candidate fails.

The planner decides from local state; the claim ref on GitHub is the lock that settles a
race between waves, and the dispatch can fail. These rules turn what GitHub answered into
the decisions the stored wave document shows, so the document says what really happened.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime

from bot.core.domain import Claim, Decision, Wave, claim_ref

CLAIM_LOST_REASON = "another wave claimed this family first"


def claim_lost(decision: Decision, now: datetime) -> tuple[Decision, Claim]:
    """Another wave created the family's claim ref first.

    The family is `claimed`; planning again with the returned claim lets the next candidate
    in priority order take the freed slot.
    """
    claimed = replace(decision, decision="claimed", reason=CLAIM_LOST_REASON)
    return claimed, Claim(decision.family, decision.candidate, None, claim_ref(decision.family), now)


def dispatch_failed(decision: Decision, candidate: str, error: str) -> tuple[Decision, str]:
    """The dispatch of a selected candidate failed (its claim was released).

    The wave dispatches nothing more: the failed candidate and every later selection are
    decided `cap` with the returned reason.
    """
    reason = f"dispatch of {candidate} failed ({error}); claim released, no more dispatches this wave"
    return replace(decision, decision="cap", reason=reason), reason


def dry_run(decision: Decision, workflow: str) -> Decision:
    return replace(decision, reason=f"{decision.reason} (dry run: would claim the family and dispatch {workflow})")


def settle(wave: Wave, overrides: Mapping[str, Decision], stop_reason: str | None) -> Wave:
    """The wave as it happened: overridden decisions, and selections after a stop as `cap`."""
    decisions = []
    for decision in wave.decisions:
        if decision.family in overrides:
            decisions.append(overrides[decision.family])
        elif stop_reason and decision.decision == "selected":
            decisions.append(replace(decision, decision="cap", reason=stop_reason))
        else:
            decisions.append(decision)
    return replace(wave, decisions=tuple(decisions))
