"""`installation_repositories`: repositories added to or removed from an installation."""

from __future__ import annotations

from gidgethub import routing

from bot.core.events import InstallationRepositoriesEvent
from handlers.context import HandlerContext, WebhookEvent
from handlers.installation import forget_all, reconcile_all

router = routing.Router()


@router.register("installation_repositories")
async def on_installation_repositories(event: WebhookEvent, ctx: HandlerContext) -> None:
    payload = event.parsed(InstallationRepositoriesEvent)
    await reconcile_all(ctx, payload.installation.id, [repo.full_name for repo in payload.repositories_added])
    await forget_all(ctx, payload.installation.id, payload.repositories_removed)
