"""`push`: the default branch's configs, runners.yaml and policy; claim refs made elsewhere."""

from __future__ import annotations

from gidgethub import routing, sansio

from bot.core.events import PushEvent
from handlers.context import HandlerContext

router = routing.Router()


@router.register("push")
async def on_push(event: sansio.Event, ctx: HandlerContext) -> None:
    payload = PushEvent.model_validate(event.data)
    state = await ctx.repos.state_for(payload)
    if state is not None:
        await ctx.catalog.on_push(state, payload)
