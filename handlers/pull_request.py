"""`pull_request` events."""

from __future__ import annotations

from gidgethub import routing, sansio

from handlers.context import HandlerContext

router = routing.Router()


@router.register("pull_request")
async def on_pull_request(event: sansio.Event, ctx: HandlerContext) -> None:
    ctx.log.info("handler.ran", handler="pull_request")

