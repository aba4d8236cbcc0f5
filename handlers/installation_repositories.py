"""`installation_repositories`: repositories added to or removed from an installation."""

from __future__ import annotations

from gidgethub import routing

from bot.core.events import InstallationRepositoriesEvent
from handlers.context import HandlerContext, WebhookEvent

router = routing.Router()


@router.register("installation_repositories")
async def on_installation_repositories(event: WebhookEvent, ctx: HandlerContext) -> None:
    payload = event.parsed(InstallationRepositoriesEvent)
    installation = payload.installation.id
    await ctx.repos.reconcile_all(installation, [repo.full_name for repo in payload.repositories_added])
    await ctx.repos.forget(installation, payload.repositories_removed)
