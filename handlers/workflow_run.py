"""`workflow_run` events."""

from __future__ import annotations

from gidgethub import routing, sansio

from handlers.context import HandlerContext

router = routing.Router()


@router.register("workflow_run")
async def on_workflow_run(event: sansio.Event, ctx: HandlerContext) -> None:
    ctx.log.info("handler.ran", handler="workflow_run")

