"""`workflow_run`: outcomes of candidate runs enter the ledger."""

from __future__ import annotations

from gidgethub import routing

from bot.core.events import WorkflowRunEvent
from handlers.context import HandlerContext, WebhookEvent

router = routing.Router()


@router.register("workflow_run")
async def on_workflow_run(event: WebhookEvent, ctx: HandlerContext) -> None:
    payload = event.parsed(WorkflowRunEvent)
    state = await ctx.repos.state_for(payload)
    if state is not None:
        await ctx.outcomes.on_workflow_run(state, payload)
