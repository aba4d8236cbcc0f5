"""`pull_request`: keep the overlap index current; Klaud PRs get their check run refreshed."""

from __future__ import annotations

from gidgethub import routing, sansio

from handlers.context import HandlerContext
from bot.core.events import PullRequestEvent, check

router = routing.Router()


@router.register("pull_request")
async def on_pull_request(event: sansio.Event, ctx: HandlerContext) -> None:
    check(PullRequestEvent, event.data)
    await ctx.klaud.live.on_pull_request(event.data)
    if event.data.get("action") in ("opened", "reopened", "synchronize"):
        # A new head needs its own check run even when no family state changed.
        ctx.klaud.checks.mark(event.data["repository"]["full_name"], int(event.data["pull_request"]["number"]))
