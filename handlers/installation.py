"""`installation`: reconcile the repositories of a new installation, forget a removed one."""

from __future__ import annotations

from collections.abc import Iterable

from gidgethub import routing

from bot.core.events import InstallationEvent, Named
from handlers.context import HandlerContext, WebhookEvent

router = routing.Router()

ADDING = {"created", "new_permissions_accepted", "unsuspend"}
REMOVING = {"deleted", "suspend"}


async def reconcile_all(ctx: HandlerContext, installation: int, repositories: Iterable[Named]) -> None:
    for repo in repositories:
        await ctx.repos.reconcile(repo.full_name, installation)


async def forget_all(ctx: HandlerContext, repositories: Iterable[Named]) -> None:
    for repo in repositories:
        await ctx.repos.live.forget(repo.full_name)


@router.register("installation")
async def on_installation(event: WebhookEvent, ctx: HandlerContext) -> None:
    payload = event.parsed(InstallationEvent)
    repositories = payload.repositories or ()
    if payload.action in ADDING:
        await reconcile_all(ctx, payload.installation.id, repositories)
    elif payload.action in REMOVING:
        await forget_all(ctx, repositories)
