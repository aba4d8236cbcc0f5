"""`issues`: a person ticking a box of the dashboard issue (retry a candidate, release a hold)."""

from __future__ import annotations

from gidgethub import routing

from bot.core.events import IssuesEvent
from handlers.context import HandlerContext, WebhookEvent

router = routing.Router()


@router.register("issues", action="edited")
async def on_issue_edited(event: WebhookEvent, ctx: HandlerContext) -> None:
    payload = event.parsed(IssuesEvent)
    state = await ctx.repos.state_for(payload)
    if state is not None:
        await ctx.dashboard.on_issue_edited(state, payload)
