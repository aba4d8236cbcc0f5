"""`push` events."""

from __future__ import annotations

from gidgethub import routing, sansio

from handlers.context import HandlerContext

router = routing.Router()


@router.register("push")
async def on_push(event: sansio.Event, ctx: HandlerContext) -> None:
    ctx.log.info("handler.ran", handler="push")

