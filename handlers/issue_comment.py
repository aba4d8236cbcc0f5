"""`issue_comment` events."""

from __future__ import annotations

from gidgethub import routing, sansio

from handlers.context import HandlerContext

router = routing.Router()


@router.register("issue_comment")
async def on_issue_comment(event: sansio.Event, ctx: HandlerContext) -> None:
    ctx.log.info("handler.ran", handler="issue_comment")

