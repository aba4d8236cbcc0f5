"""`repository_dispatch` with action `klaud-plan`: run a wave now."""

from __future__ import annotations

from gidgethub import routing, sansio

from handlers.context import HandlerContext
from bot.core.events import RepoEvent, check

router = routing.Router()


@router.register("repository_dispatch", action="klaud-plan")
async def on_plan_requested(event: sansio.Event, ctx: HandlerContext) -> None:
    check(RepoEvent, event.data)
    state = await ctx.klaud.live.state_for(event.data)
    if state is not None:
        await ctx.klaud.waves.run(state.name, trigger="repository_dispatch")
