"""`repository_dispatch` with action `klaud-plan`: run a wave now."""

from __future__ import annotations

from gidgethub import routing, sansio

from bot.core.events import RepositoryDispatchEvent
from handlers.context import HandlerContext

router = routing.Router()


@router.register("repository_dispatch", action="klaud-plan")
async def on_plan_requested(event: sansio.Event, ctx: HandlerContext) -> None:
    payload = RepositoryDispatchEvent.model_validate(event.data)
    state = await ctx.repos.state_for(payload)
    if state is not None:
        await ctx.waves.run(state.name, trigger="repository_dispatch")
