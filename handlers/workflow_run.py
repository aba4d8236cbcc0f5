"""`workflow_run`: outcomes of candidate runs enter the ledger."""

from __future__ import annotations

from gidgethub import routing, sansio

from handlers.context import HandlerContext
from bot.core.events import WorkflowRunEvent, check

router = routing.Router()


@router.register("workflow_run")
async def on_workflow_run(event: sansio.Event, ctx: HandlerContext) -> None:
    check(WorkflowRunEvent, event.data)
    await ctx.klaud.live.on_workflow_run(event.data)
