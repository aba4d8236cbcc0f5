"""`installation`: reconcile the repositories of a new installation, forget a removed one."""

from __future__ import annotations

import structlog
from gidgethub import routing

from bot.core.events import InstallationEvent, Named
from handlers.context import HandlerContext, WebhookEvent

router = routing.Router()
log = structlog.get_logger("klaud.installation")

ADDING = {"created", "new_permissions_accepted"}


@router.register("installation")
async def on_installation(event: WebhookEvent, ctx: HandlerContext) -> None:
    payload = event.parsed(InstallationEvent)
    installation = payload.installation.id
    if payload.action in ADDING:
        await ctx.repos.reconcile_all(installation, [repo.full_name for repo in payload.repositories or ()])
    elif payload.action == "deleted":
        kept = payload.repositories or [Named(full_name=name) for name in await ctx.repos.stored_installation_repos(installation)]
        await ctx.repos.uninstall(installation, kept)
    elif payload.action == "suspend":
        # Kept, holds and all: forgotten, they were lost for good. GitHub refuses the
        # App's calls meanwhile, and the scheduler backs off from each repository's.
        log.info("installation.suspended", installation=installation,
                 repositories=await ctx.repos.stored_installation_repos(installation))
    elif payload.action == "unsuspend":
        # What moved meanwhile is read again; its webhooks were not sent.
        await ctx.repos.reconcile_all(installation, await ctx.repos.stored_installation_repos(installation), light=True)
