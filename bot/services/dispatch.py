"""Claims and workflow dispatch for the candidates a wave selected (DESIGN §4 "A wave").

The claim ref is the lock that keeps overlapping waves (ours, or another planner's) from
dispatching one family twice: creating `refs/heads/klaud/claim-<fam16>` either succeeds or
answers 422 because someone else holds it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import structlog

from bot.core.domain import Claim, Dispatch, Family, claim_ref
from bot.github.client import Conflict, GitHubError, InstallationClient, NotFound
from bot.services.sync import split_repo

log = structlog.get_logger("klaud.dispatch")


async def create_claim(gh: InstallationClient, repo: str, family: Family, base: str) -> bool:
    """Create the family's claim ref at `base`; False when another wave holds it."""
    ref = f"refs/heads/{claim_ref(family.id)}"

    async def claim_exists() -> Any:
        found = await gh.getitem("/repos/{owner}/{repo}/git/ref/{+ref}", {**split_repo(repo), "ref": ref[5:]})
        # Ours only if it points at our base; otherwise another wave won the race.
        return found if found.get("object", {}).get("sha") == base else None

    try:
        await gh.post("/repos/{owner}/{repo}/git/refs", split_repo(repo), data={"ref": ref, "sha": base}, verify=claim_exists)
    except Conflict:
        return False
    return True


async def release_claim(gh: InstallationClient, repo: str, family: str) -> None:
    try:
        await gh.delete("/repos/{owner}/{repo}/git/refs/{+ref}", {**split_repo(repo), "ref": f"heads/{claim_ref(family)}"})
    except (NotFound, Conflict):
        log.info("claim.already_released", family=family)


async def dispatch_candidate(
    gh: InstallationClient,
    repo: str,
    *,
    workflow: str,
    branch: str,
    family: Family,
    base: str,
    wave: int,
    now: datetime,
) -> tuple[Claim, Dispatch] | None:
    """Claim the family, then dispatch its candidate; None when the claim was lost.

    A failed dispatch releases the claim it made and re-raises, so no claim is left
    behind for work that never started.
    """
    if not await create_claim(gh, repo, family, base):
        return None
    inputs = {"candidate": family.candidate, "family": family.id, "base": base, "wave": str(wave)}
    try:
        await gh.post(
            "/repos/{owner}/{repo}/actions/workflows/{workflow}/dispatches",
            {**split_repo(repo), "workflow": workflow},
            data={"ref": branch, "inputs": inputs},
        )
    except GitHubError:
        await release_claim(gh, repo, family.id)
        raise
    claim = Claim(family.id, family.candidate, wave, claim_ref(family.id), now)
    return claim, Dispatch(family.id, family.candidate, wave, base, now)
