"""`repository_dispatch` events."""

from __future__ import annotations

from gidgethub import routing, sansio

from handlers.context import HandlerContext

router = routing.Router()


@router.register("repository_dispatch")
async def on_repository_dispatch(event: sansio.Event, ctx: HandlerContext) -> None:
    ctx.log.info("handler.ran", handler="repository_dispatch")

