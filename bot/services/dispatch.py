"""Claims and workflow dispatch for the candidates a wave selected (DESIGN §4 "A wave").

The claim ref is the lock that keeps overlapping waves (ours, or another planner's) from
dispatching one family twice: creating `refs/heads/klaud/claim-<fam16>` either succeeds or
answers 422 because someone else holds it. Between the claim and the dispatch the wave
commits what it is about to do (`bot.services.waves`), so a crash at any point leaves a
record the claim keeper resolves.
"""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from bot.core.domain import Family, claim_ref
from bot.core.policy import InputKey
from bot.github.errors import GitHubError
from bot.services.api import RepoAPI

log = structlog.get_logger("klaud.dispatch")


async def claim_family(api: RepoAPI, family: Family, base: str) -> bool:
    """Create the family's claim ref at `base`; False when someone else holds it."""
    return await api.create_branch(claim_ref(family.id), base)


async def delete_claim_ref(api: RepoAPI, ref: str, family: str | None = None) -> bool:
    """Delete a claim ref; False when GitHub refused or failed (logged), never raised.

    A ref left behind is found again by the claim keeper's sweep of claim refs at the next
    light reconcile, and deleted then. Raised, the error failed what released it: an
    outcome was lost with its delivery, and a ruleset forbidding deletions failed every
    light reconcile of the repository, hour after hour.
    """
    try:
        if not await api.delete_branch(ref):
            log.info("claim.already_released", ref=ref, family=family)
    except GitHubError as exc:
        log.warning("claim.release_failed", ref=ref, family=family, error=str(exc))
        return False
    return True


async def release_refused_claim(api: RepoAPI, family: str) -> bool:
    """Release the claim of a dispatch GitHub refused; False when that failed too: then the
    claim stays with its dispatch record, which the claim keeper releases once it finds no
    run of it."""
    return await delete_claim_ref(api, claim_ref(family), family)


async def dispatch_run(
    api: RepoAPI, *, workflow: str, inputs: Mapping[InputKey, str], branch: str, family: Family, base: str, wave: int
) -> int | None:
    """Dispatch the family's candidate with the inputs the policy maps; the run's id when
    GitHub says it (None from a server that answers 204)."""
    values: dict[InputKey, str] = {"candidate": family.candidate, "family": family.id, "base": base, "wave": str(wave)}
    return await api.dispatch(workflow, branch, {name: values[key] for key, name in inputs.items()})
