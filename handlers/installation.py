"""`installation` events."""

from __future__ import annotations

from gidgethub import routing, sansio

from handlers.context import HandlerContext

router = routing.Router()


@router.register("installation")
async def on_installation(event: sansio.Event, ctx: HandlerContext) -> None:
    ctx.log.info("handler.ran", handler="installation")


@router.register("installation_repositories")
async def on_installation_repositories(event: sansio.Event, ctx: HandlerContext) -> None:
    ctx.log.info("handler.ran", handler="installation_repositories")
