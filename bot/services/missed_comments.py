"""Comments whose `issue_comment` webhook never came, found at each reconcile.

GitHub does not redeliver: a `/klaud` command whose delivery was lost got no 👀 and no reply
(the person had to notice and comment again), and a completion receipt posted as a comment
was never counted. Each reconcile lists the repository's comments made since the previous
one (one request per 100 comments), answers the commands that have no reply yet, and counts
the receipts (one counted twice is recorded once).
"""

from __future__ import annotations

from datetime import datetime, timedelta

import structlog

from bot.core.commands import answered_comments, parse_commands
from bot.core.domain import parse_time, stamp
from bot.core.events import ListedComment
from bot.github.errors import GitHubError
from bot.services.live import LiveState
from bot.services.outcomes import CLOCK_SKEW, OutcomeRecorder
from bot.services.repo_state import RepoState
from bot.services.responder import CommandResponder

log = structlog.get_logger("klaud.comments")

# A comment younger than this may still wait in the inbox: it is left to its own webhook.
GRACE = timedelta(minutes=10)
# After a longer outage, older commands are not answered: their moment has passed.
MAX_LOOKBACK = timedelta(days=7)


class MissedComments:
    def __init__(self, live: LiveState, commands: CommandResponder, outcomes: OutcomeRecorder) -> None:
        self.live = live
        self.commands = commands
        self.outcomes = outcomes

    async def sweep(self, state: RepoState) -> dict[str, int]:
        """Answer the commands and count the receipts of the comments made since the last
        sweep and more than GRACE ago. The first sweep of a repository only starts the count:
        comments from before Klaud knew it are not answered."""
        now = self.live.clock.now()
        cutoff = now - GRACE
        swept = parse_time(state.meta.comments_swept_at)
        if swept is None:
            await self._swept_until(state, now)
            return {}
        # min(): a clock set back since the last sweep must not skip what it had not seen.
        start = max(min(swept, cutoff), now - MAX_LOOKBACK) - CLOCK_SKEW
        try:
            found = await self._found(state, start, cutoff)
        except GitHubError as exc:
            # The watermark stays: the next reconcile looks at the same comments again.
            log.warning("comments.sweep_failed", repo=state.name, error=str(exc))
            return {}
        await self._swept_until(state, cutoff)
        if found:
            log.info("comments.missed_found", repo=state.name, **found)
        return found

    async def _found(self, state: RepoState, start: datetime, cutoff: datetime) -> dict[str, int]:
        listed = [c async for c in self.live.api(state).comments_since(start)]
        answered = answered_comments(c.body or "" for c in listed if self.live.is_bot(c.user.login))
        in_window = [
            (number, c) for c in listed if _made_between(c, start, cutoff) and (number := c.issue_number) is not None
        ]
        receipts = commands = 0
        for number, comment in in_window:
            if self.live.is_bot(comment.user.login):
                receipts += await self.outcomes.on_receipt(state, comment)
            # An edited comment is ignored, as its `edited` webhook is (DESIGN §4 "Commands").
            elif comment.id not in answered and not comment.edited and parse_commands(comment.body or ""):
                commands += await self.commands.answer(state, number, comment)
        return {key: n for key, n in (("commands_answered", commands), ("receipts_read", receipts)) if n}

    async def _swept_until(self, state: RepoState, until: datetime) -> None:
        async with self.live.lock(state.name):
            state.meta.comments_swept_at = stamp(until)
            await self.live.persist(state.save_meta())


def _made_between(comment: ListedComment, start: datetime, cutoff: datetime) -> bool:
    return comment.created_at is not None and start <= comment.created_at < cutoff
