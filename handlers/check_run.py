"""`check_run`: re-render ours when a person asks; our own created/completed events are ignored."""

from __future__ import annotations

from gidgethub import routing, sansio

from bot.core.events import CheckRunEvent
from handlers.context import HandlerContext

router = routing.Router()


@router.register("check_run", action="rerequested")
async def on_rerequested(event: sansio.Event, ctx: HandlerContext) -> None:
    payload = CheckRunEvent.model_validate(event.data)
    state = await ctx.repos.state_for(payload)
    if state is not None:
        await ctx.checks.rerequested(state, payload)
