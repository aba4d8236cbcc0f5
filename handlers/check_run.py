"""`check_run` events."""

from __future__ import annotations

from gidgethub import routing, sansio

from handlers.context import HandlerContext

router = routing.Router()


@router.register("check_run")
async def on_check_run(event: sansio.Event, ctx: HandlerContext) -> None:
    ctx.log.info("handler.ran", handler="check_run")

