"""`installation` and `installation_repositories`: reconcile what is added, forget what is removed."""

from __future__ import annotations

from typing import Any

from gidgethub import routing, sansio

from handlers.context import HandlerContext

router = routing.Router()

ADDING = {"created", "new_permissions_accepted", "unsuspend"}
REMOVING = {"deleted", "suspend"}


async def _reconcile(ctx: HandlerContext, installation: int, repositories: list[dict[str, Any]]) -> None:
    for repo in repositories:
        await ctx.klaud.live.reconcile(repo["full_name"], installation)


async def _forget(ctx: HandlerContext, repositories: list[dict[str, Any]]) -> None:
    for repo in repositories:
        await ctx.klaud.live.forget(repo["full_name"])


@router.register("installation")
async def on_installation(event: sansio.Event, ctx: HandlerContext) -> None:
    installation = int(event.data["installation"]["id"])
    repositories = event.data.get("repositories") or []
    if event.data.get("action") in ADDING:
        await _reconcile(ctx, installation, repositories)
    elif event.data.get("action") in REMOVING:
        await _forget(ctx, repositories)


@router.register("installation_repositories")
async def on_installation_repositories(event: sansio.Event, ctx: HandlerContext) -> None:
    installation = int(event.data["installation"]["id"])
    await _reconcile(ctx, installation, event.data.get("repositories_added") or [])
    await _forget(ctx, event.data.get("repositories_removed") or [])
