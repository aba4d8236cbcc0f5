"""Claims and workflow dispatch for the candidates a wave selected (DESIGN §4 "A wave").

The claim ref is the lock that keeps overlapping waves (ours, or another planner's) from
dispatching one family twice: creating `refs/heads/klaud/claim-<fam16>` either succeeds or
answers 422 because someone else holds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

import structlog

from bot.core.domain import Claim, Dispatch, Family, claim_ref
from bot.core.policy import InputKey
from bot.github.errors import GitHubError, Unavailable
from bot.services.api import RepoAPI

log = structlog.get_logger("klaud.dispatch")


async def release_claim(api: RepoAPI, family: str) -> None:
    if not await api.delete_branch(claim_ref(family)):
        log.info("claim.already_released", family=family)


@dataclass(frozen=True, slots=True)
class Dispatched:
    claim: Claim
    dispatch: Dispatch
    # Why GitHub's answer is unknown, when the dispatch may have started a run unseen.
    answer_lost: str | None = None


async def dispatch_candidate(
    api: RepoAPI,
    *,
    workflow: str,
    inputs: Mapping[InputKey, str],
    branch: str,
    family: Family,
    base: str,
    wave: int,
    now: datetime,
) -> Dispatched | None:
    """Claim the family, then dispatch its candidate; None when the claim was lost.

    A refused dispatch releases the claim it made and re-raises, so no claim is left
    behind for work that never started. One whose answer was lost (a timeout, a 502) may
    have started a run: released, its family would be dispatched again by a later wave, so
    it is kept as a dispatch without a run id, which the claim keeper links to its run by
    the candidate id in the run's title, or releases when no run started.
    """
    if not await api.create_branch(claim_ref(family.id), base):
        return None
    values: dict[InputKey, str] = {"candidate": family.candidate, "family": family.id, "base": base, "wave": str(wave)}
    claim = Claim(family.id, family.candidate, wave, claim_ref(family.id), now)
    try:
        run_id = await api.dispatch(workflow, branch, {name: values[key] for key, name in inputs.items()})
    except Unavailable as exc:
        if not exc.maybe_applied:
            await release_claim(api, family.id)
            raise
        log.warning("dispatch.answer_lost", family=family.id, candidate=family.candidate, error=str(exc))
        return Dispatched(claim, Dispatch(family.id, family.candidate, wave, base, now), answer_lost=str(exc))
    except GitHubError:
        await release_claim(api, family.id)
        raise
    return Dispatched(claim, Dispatch(family.id, family.candidate, wave, base, now, run_id=run_id))
