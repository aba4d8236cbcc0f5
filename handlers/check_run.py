"""`check_run`: re-render ours when a person asks; our own created/completed events are ignored."""

from __future__ import annotations

from gidgethub import routing, sansio

from handlers.context import HandlerContext
from bot.core.events import CheckRunEvent, check

router = routing.Router()


@router.register("check_run", action="rerequested")
async def on_rerequested(event: sansio.Event, ctx: HandlerContext) -> None:
    check(CheckRunEvent, event.data)
    await ctx.klaud.checks.rerequested(event.data)
