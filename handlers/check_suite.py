"""`check_suite`: "Re-run all checks" on a Klaud PR re-renders its `Klaud Cold` check run."""

from __future__ import annotations

from gidgethub import routing

from bot.core.events import CheckSuiteEvent
from handlers.context import HandlerContext, WebhookEvent

router = routing.Router()


@router.register("check_suite", action="rerequested")
async def on_rerequested(event: WebhookEvent, ctx: HandlerContext) -> None:
    payload = event.parsed(CheckSuiteEvent)
    state = await ctx.repos.state_for(payload)
    if state is not None:
        await ctx.checks.rerender_head(state, payload.check_suite.head_sha)
