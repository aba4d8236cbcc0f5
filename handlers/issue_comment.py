"""`issue_comment`: completion receipts from the bot, `/klaud` commands from people."""

from __future__ import annotations

from gidgethub import routing

from bot.core.events import IssueCommentEvent
from handlers.context import HandlerContext, WebhookEvent

router = routing.Router()


@router.register("issue_comment", action="created")
async def on_comment_created(event: WebhookEvent, ctx: HandlerContext) -> None:
    payload = event.parsed(IssueCommentEvent)
    state = await ctx.repos.state_for(payload)
    if state is None:
        return
    if payload.comment.created_at is not None:
        # Any comment, the bot's too, moves a PR's `updated_at` on GitHub (a reconcile sees it).
        await ctx.pulls.on_comment(state, payload.issue.number, payload.comment.created_at)
    if ctx.is_bot(payload.comment.user.login):
        # The bot's own comments: a receipt counts as an outcome, anything else is ignored.
        await ctx.outcomes.on_receipt(state, payload.comment)
        return
    await ctx.commands.handle(state, payload)
