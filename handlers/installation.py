"""`installation`: reconcile the repositories of a new installation, forget a removed one."""

from __future__ import annotations

from gidgethub import routing, sansio

from handlers.context import HandlerContext
from bot.core.events import InstallationEvent, Named, check

router = routing.Router()

ADDING = {"created", "new_permissions_accepted", "unsuspend"}
REMOVING = {"deleted", "suspend"}


async def reconcile_all(ctx: HandlerContext, installation: int, repositories: list[Named]) -> None:
    for repo in repositories:
        await ctx.klaud.live.reconcile(repo.full_name, installation)


async def forget_all(ctx: HandlerContext, repositories: list[Named]) -> None:
    for repo in repositories:
        await ctx.klaud.live.forget(repo.full_name)


@router.register("installation")
async def on_installation(event: sansio.Event, ctx: HandlerContext) -> None:
    payload = check(InstallationEvent, event.data)
    repositories = payload.repositories or []
    if payload.action in ADDING:
        await reconcile_all(ctx, payload.installation.id, repositories)
    elif payload.action in REMOVING:
        await forget_all(ctx, repositories)
