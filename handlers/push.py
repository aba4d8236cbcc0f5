"""`push`: the default branch's configs, runners.yaml and policy; claim refs made elsewhere."""

from __future__ import annotations

from gidgethub import routing, sansio

from handlers.context import HandlerContext
from bot.core.events import PushEvent, check

router = routing.Router()


@router.register("push")
async def on_push(event: sansio.Event, ctx: HandlerContext) -> None:
    check(PushEvent, event.data)
    await ctx.klaud.live.on_push(event.data)
