"""`check_run`: re-render ours when a person asks; our own created/completed events are ignored."""

from __future__ import annotations

from gidgethub import routing

from bot.core.events import CheckRunEvent
from handlers.context import HandlerContext, WebhookEvent

router = routing.Router()


@router.register("check_run", action="rerequested")
async def on_rerequested(event: WebhookEvent, ctx: HandlerContext) -> None:
    payload = event.parsed(CheckRunEvent)
    state = await ctx.repos.state_for(payload)
    if state is not None:
        await ctx.checks.rerequested(state, payload)
