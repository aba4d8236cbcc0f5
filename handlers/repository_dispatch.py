"""`repository_dispatch` with action `klaud-plan`: run a wave now."""

from __future__ import annotations

from gidgethub import routing

from bot.core.events import RepositoryDispatchEvent
from handlers.context import HandlerContext, WebhookEvent

router = routing.Router()


@router.register("repository_dispatch", action="klaud-plan")
async def on_plan_requested(event: WebhookEvent, ctx: HandlerContext) -> None:
    payload = event.parsed(RepositoryDispatchEvent)
    state = await ctx.repos.state_for(payload)
    if state is not None:
        await ctx.waves.run(state.name, trigger="repository_dispatch")
