"""`issue_comment`: completion receipts from the bot, `/klaud` commands from people."""

from __future__ import annotations

from gidgethub import routing, sansio

from handlers.context import HandlerContext
from bot.core.events import IssueCommentEvent, check

router = routing.Router()


@router.register("issue_comment", action="created")
async def on_comment_created(event: sansio.Event, ctx: HandlerContext) -> None:
    author = check(IssueCommentEvent, event.data).comment.user.login
    if ctx.klaud.settings.is_bot(author):
        # The bot's own comments: a receipt counts as an outcome, anything else is ignored.
        await ctx.klaud.live.on_receipt(event.data)
        return
    await ctx.klaud.commands.handle(event.data)
