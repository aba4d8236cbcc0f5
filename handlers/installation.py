"""`installation` and `installation_repositories`: reconcile what is added, forget what is removed."""

from __future__ import annotations

from gidgethub import routing, sansio

from handlers.context import HandlerContext
from handlers.payloads import InstallationEvent, InstallationRepositoriesEvent, Named, check

router = routing.Router()

ADDING = {"created", "new_permissions_accepted", "unsuspend"}
REMOVING = {"deleted", "suspend"}


async def _reconcile(ctx: HandlerContext, installation: int, repositories: list[Named]) -> None:
    for repo in repositories:
        await ctx.klaud.live.reconcile(repo.full_name, installation)


async def _forget(ctx: HandlerContext, repositories: list[Named]) -> None:
    for repo in repositories:
        await ctx.klaud.live.forget(repo.full_name)


@router.register("installation")
async def on_installation(event: sansio.Event, ctx: HandlerContext) -> None:
    payload = check(InstallationEvent, event.data)
    repositories = payload.repositories or []
    if payload.action in ADDING:
        await _reconcile(ctx, payload.installation.id, repositories)
    elif payload.action in REMOVING:
        await _forget(ctx, repositories)


@router.register("installation_repositories")
async def on_installation_repositories(event: sansio.Event, ctx: HandlerContext) -> None:
    payload = check(InstallationRepositoriesEvent, event.data)
    await _reconcile(ctx, payload.installation.id, payload.repositories_added)
    await _forget(ctx, payload.repositories_removed)
