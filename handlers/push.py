"""`push`: the default branch's configs, runners.yaml and policy; claim refs made elsewhere."""

from __future__ import annotations

from gidgethub import routing

from bot.core.events import PushEvent
from handlers.context import HandlerContext, WebhookEvent

router = routing.Router()


@router.register("push")
async def on_push(event: WebhookEvent, ctx: HandlerContext) -> None:
    payload = event.parsed(PushEvent)
    state = await ctx.repos.state_for(payload)
    if state is not None:
        await ctx.catalog.on_push(state, payload)
