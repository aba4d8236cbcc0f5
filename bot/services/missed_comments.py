"""Comments whose `issue_comment` webhook never came, found at each reconcile.

GitHub does not redeliver: a `/klaud` command whose delivery was lost got no 👀 and no reply
(the person had to notice and comment again), and a completion receipt posted as a comment
was never counted. Each reconcile lists the repository's comments made since the previous
one (one request per 100 comments), answers the commands that have no reply yet, and counts
the receipts (one counted twice is recorded once).
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import structlog

from bot.core.commands import answered_comments, parse_commands
from bot.core.domain import parse_time, stamp
from bot.core.events import ListedComment
from bot.github.errors import GitHubError
from bot.services.live import LiveState
from bot.services.outcomes import OutcomeRecorder
from bot.services.repo_state import RepoState
from bot.services.responder import CommandResponder

log = structlog.get_logger("klaud.comments")

# A comment younger than this may still wait in the inbox: it is left to its own webhook.
GRACE = timedelta(minutes=10)
# After a longer outage, older commands are not answered: their moment has passed.
MAX_LOOKBACK = timedelta(days=7)
# Each sweep looks this far behind the last one: the window's ends come from Klaud's clock,
# the comments' times from GitHub's, and a comment made just after a sweep, by a clock this
# much behind, must still fall in the next window. Seen twice, a comment is answered once.
OVERLAP = timedelta(minutes=30)
# Comments one sweep reads (10 requests); a flood (spam, a busy week after an outage) is read
# over several sweeps, each going on from the last comment the one before read: listed
# whole, 20,000 made the listing fail at every sweep and no lost command was answered again.
MAX_SWEPT = 1_000


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
        start = max(min(swept, cutoff), now - MAX_LOOKBACK) - OVERLAP
        try:
            listed, resume_at = await self._listed(state, start)
        except GitHubError as exc:
            # The watermark stays: the next reconcile looks at the same comments again, and
            # a catch-up (a command's delivery given up on) is not spent on GitHub's outage.
            log.warning("comments.sweep_failed", repo=state.name, error=str(exc))
            return {"comments_left": 1} if exc.transient else {}
        found = Found(cutoff)
        if resume_at is not None:
            # Listed by update time: the next sweep starts at the last comment read (a time
            # on GitHub's clock, so without OVERLAP's allowance for this host's).
            found.until = min(found.until, resume_at + OVERLAP)
        await self._handle(state, listed, start, found)
        await self._swept_until(state, found.until)
        left = found.until < found.cutoff  # a comment's work failed on GitHub: tried again next time
        counts = {key: n for key, n in (("commands_answered", found.commands), ("receipts_read", found.receipts),
                                        ("comments_left", int(left))) if n}
        if counts:
            log.info("comments.missed_found", repo=state.name, **counts)
        return counts

    async def _listed(self, state: RepoState, start: datetime) -> tuple[list[ListedComment], datetime | None]:
        """Of up to MAX_SWEPT comments updated since `start`, oldest update first, Klaud's
        own and people's unedited commands (a flood of others is not held); and, when more
        were left unread, when the last one read was updated."""
        kept: list[ListedComment] = []
        read = 0
        async for comment in self.live.api(state).comments_since(start):
            read += 1
            # An edited comment is ignored, as its `edited` webhook is (DESIGN §4 "Commands").
            if self.live.is_bot(comment.user.login) or (not comment.edited and parse_commands(comment.body or "")):
                kept.append(comment)
            if read == MAX_SWEPT:
                return kept, comment.updated_at or comment.created_at or start
        return kept, None

    async def _handle(self, state: RepoState, listed: list[ListedComment], start: datetime, found: Found) -> None:
        bot = [c for c in listed if self.live.is_bot(c.user.login)]
        answered = answered_comments(c.body or "" for c in bot)
        people = [(n, c) for c in listed if not self.live.is_bot(c.user.login) and (n := c.issue_number) is not None]
        for comment in bot:
            if _made_between(comment, start, found.cutoff):
                await self._one(state, comment, found, self._receipt(state, comment, found))
        for number, comment in people:
            if comment.id not in answered and _made_between(comment, start, found.cutoff):
                await self._one(state, comment, found, self._command(state, number, comment, found))

    async def _receipt(self, state: RepoState, comment: ListedComment, found: Found) -> None:
        found.receipts += await self.outcomes.on_receipt(state, comment)

    async def _command(self, state: RepoState, number: int, comment: ListedComment, found: Found) -> None:
        # Answered as of when it was written: what changed since (a release, a hold, a
        # cooldown or a pause begun after it) is not undone by it (`CommandResponder.answer`).
        found.commands += await self.commands.answer(state, number, comment, comment.created_at)

    async def _one(self, state: RepoState, comment: ListedComment, found: Found, work: Awaitable[None]) -> None:
        """One comment's work: a failure costs that comment alone. A transient one holds the
        watermark before it (tried again next time); one GitHub refuses for good (a reply
        to a locked issue) is logged and passed."""
        try:
            await work
        except GitHubError as exc:
            log.warning("comments.missed_failed", repo=state.name, comment_id=comment.id, error=str(exc),
                        transient=exc.transient)
            if exc.transient and comment.created_at is not None:
                found.until = min(found.until, comment.created_at)

    async def _swept_until(self, state: RepoState, until: datetime) -> None:
        async with self.live.lock(state.name):
            state.meta.comments_swept_at = stamp(until)
            await self.live.persist(state.save_meta())


@dataclass
class Found:
    """What a sweep found, and the time its watermark may move to: its cutoff, or before a
    comment whose work failed transiently."""

    cutoff: datetime
    commands: int = 0
    receipts: int = 0
    until: datetime = field(init=False)

    def __post_init__(self) -> None:
        self.until = self.cutoff


def _made_between(comment: ListedComment, start: datetime, cutoff: datetime) -> bool:
    return comment.created_at is not None and start <= comment.created_at < cutoff
