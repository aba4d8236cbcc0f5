"""`installation`: reconcile the repositories of a new installation, forget a removed one."""

from __future__ import annotations

from collections.abc import Iterable

import structlog
from gidgethub import routing

from bot.core.events import InstallationEvent
from handlers.context import HandlerContext, WebhookEvent

router = routing.Router()
log = structlog.get_logger("klaud.installation")

ADDING = {"created", "new_permissions_accepted"}


def known_repositories(ctx: HandlerContext, installation: int) -> list[str]:
    """The repositories Klaud keeps for `installation`: GitHub names none in the payloads
    of `suspend` and `unsuspend`."""
    return sorted(state.name for state in ctx.repos.live.repos.values() if state.meta.installation == installation)


async def reconcile_all(ctx: HandlerContext, installation: int, names: Iterable[str], *, light: bool = False) -> None:
    for name in names:
        await ctx.repos.reconcile(name, installation, light=light)


async def forget_all(ctx: HandlerContext, names: Iterable[str]) -> None:
    for name in names:
        await ctx.repos.live.forget(name)


@router.register("installation")
async def on_installation(event: WebhookEvent, ctx: HandlerContext) -> None:
    payload = event.parsed(InstallationEvent)
    installation = payload.installation.id
    named = [repo.full_name for repo in payload.repositories or ()]
    if payload.action in ADDING:
        await reconcile_all(ctx, installation, named)
    elif payload.action == "deleted":
        await forget_all(ctx, named or known_repositories(ctx, installation))
    elif payload.action == "suspend":
        # Kept, holds and all: forgotten, they were lost for good. GitHub refuses the
        # App's calls meanwhile, and the scheduler backs off from each repository's.
        log.info("installation.suspended", installation=installation, repositories=known_repositories(ctx, installation))
    elif payload.action == "unsuspend":
        # What moved meanwhile is read again; its webhooks were not sent.
        await reconcile_all(ctx, installation, known_repositories(ctx, installation), light=True)
