"""`issues`: a person ticking a box of the dashboard issue (retry a candidate, release a hold)."""

from __future__ import annotations

from gidgethub import routing, sansio

from bot.core.events import IssuesEvent
from handlers.context import HandlerContext

router = routing.Router()


@router.register("issues", action="edited")
async def on_issue_edited(event: sansio.Event, ctx: HandlerContext) -> None:
    payload = IssuesEvent.model_validate(event.data)
    state = await ctx.repos.state_for(payload)
    if state is not None:
        await ctx.dashboard.on_issue_edited(state, payload)
