"""`pull_request`: keep the overlap index current (Klaud PRs get their check run refreshed)."""

from __future__ import annotations

from gidgethub import routing

from bot.core.events import PullRequestEvent
from handlers.context import HandlerContext, WebhookEvent

router = routing.Router()


@router.register("pull_request")
async def on_pull_request(event: WebhookEvent, ctx: HandlerContext) -> None:
    payload = event.parsed(PullRequestEvent)
    state = await ctx.repos.state_for(payload)
    if state is not None:
        await ctx.pulls.on_pull_request(state, payload)
