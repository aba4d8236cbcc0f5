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
    kept = await ctx.repos.stored_installation_repos(installation)
    if payload.action in ADDING:
        await ctx.repos.reconcile_all(installation, [repo.full_name for repo in payload.repositories or ()])
    elif payload.action == "deleted":
        await ctx.repos.uninstall(installation, payload.repositories or [Named(full_name=name) for name in kept])
    elif payload.action == "suspend":
        # Kept, holds and all: forgotten, they were lost for good. GitHub refuses the
        # App's calls meanwhile, and the scheduler backs off from each repository's.
        log.info("installation.suspended", installation=installation, repositories=kept)
    elif payload.action == "unsuspend":
        # What moved meanwhile is read again; its webhooks were not sent.
        await ctx.repos.reconcile_all(installation, kept, light=True)
