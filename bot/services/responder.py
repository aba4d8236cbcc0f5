"""Carrying out `/klaud` commands from comments (DESIGN §4 "Commands").

The bot reacts 👀 at once, then answers each command with one reply carrying the
`klaud-command:<comment id>` marker. Before answering it counts the replies already
posted for that comment, so a redelivered event answers only what is still unanswered.
"""

from __future__ import annotations

from datetime import datetime

import structlog

from bot.core.clock import Clock
from bot.core.commands import (
    MAX_COMMANDS_PER_COMMENT,
    MAX_STATUS_FAMILIES,
    Command,
    StatusView,
    answered_comments,
    compose_reply,
    parse_commands,
    render_help,
    render_hold,
    render_idle_pull,
    render_more_families,
    render_refusal,
    render_resume,
    render_resume_disabled,
    render_resume_late,
    render_retry,
    render_retry_late,
    render_status,
    render_unhold,
    resolve_command,
)
from bot.core.cooldown import began_after
from bot.core.domain import Family, Wave, parse_time
from bot.core.events import Comment, IssueCommentEvent
from bot.core.overlap import is_idle
from bot.services import controls
from bot.services.api import RepoAPI
from bot.services.live import LiveState
from bot.services.permissions import Permissions
from bot.services.repo_state import RepoState
from bot.services.waves import WaveRunner

log = structlog.get_logger("klaud.commands")


RELEASED_AFTER = ("not run: this comment reached Klaud late, and the family's hold was released after it was "
                  "written; write it again if it still holds")
HELD_AFTER = ("not run: this comment reached Klaud late, and the family was held after it was written; "
              "write it again if it still holds")


class CommandResponder:
    def __init__(self, live: LiveState, waves: WaveRunner, permissions: Permissions, clock: Clock) -> None:
        self.live = live
        self.waves = waves
        self.permissions = permissions
        self.clock = clock
        self._answering: set[int] = set()  # comment ids being answered now

    async def handle(self, state: RepoState, event: IssueCommentEvent) -> int:
        """Answer the commands of a new comment in one reply; returns how many were posted (0 or 1)."""
        return await self.answer(state, event.issue.number, event.comment)

    async def answer(
        self, state: RepoState, number: int, comment: Comment, asked_at: datetime | None = None
    ) -> int:
        """Answer the commands of `comment` on issue or PR `number`, unless answered already
        (its webhook, and the reconcile that finds comments whose webhook was lost).

        `asked_at`: when a comment answered late (its webhook lost) was written. What changed
        since is not undone by it, as the state records when each thing changed: a cooldown,
        a pause or a hold begun since is not the one it asked to end, and a release or a
        hold asked since is a later word than its hold.
        """
        commands = parse_commands(comment.body or "")
        if not commands or comment.id in self._answering:
            return 0
        # While one answer is being made, the other finder of the comment must not post a
        # second (the reply it would look for is not there yet).
        self._answering.add(comment.id)
        try:
            return await self._answer_once(state, number, comment, commands, asked_at)
        finally:
            self._answering.discard(comment.id)

    async def _answer_once(
        self, state: RepoState, number: int, comment: Comment, commands: list[Command], asked_at: datetime | None
    ) -> int:
        api = self.live.api(state)
        await api.react(comment.id, "eyes")
        if comment.id in await self._answered(api, number):
            log.info("commands.already_answered", comment_id=comment.id)
            return 0
        author = comment.user.login or ""
        run = commands[:MAX_COMMANDS_PER_COMMENT]
        answers = [
            (command, await self._answer(api, state, command, author, number, asked_at, comment.id))
            for command in run
        ]
        await api.post_comment(number, compose_reply(comment.id, answers, not_run=len(commands) - len(run)))
        log.info("commands.answered", comment_id=comment.id, commands=len(commands))
        return 1

    async def _answered(self, api: RepoAPI, number: int) -> set[int]:
        bodies = [c.body or "" async for c in api.comments(number) if self.live.is_bot(c.user.login)]
        return answered_comments(bodies)

    async def _answer(
        self, api: RepoAPI, state: RepoState, command: Command, author: str, number: int,
        asked_at: datetime | None, comment: int,
    ) -> str:
        spec = command.spec
        if spec is None or command.verb == "help":
            return render_help(unknown_verb=command.verb if spec is None else None)
        if spec.needs_write and not await self.permissions.allows(api, state, author, command.verb):
            return render_refusal(command, f"`{command.verb}` needs write, maintain or admin permission on {state.name}")
        if command.verb == "resume":
            return await self._resume(state, author, asked_at)
        families = {f.id: f for f in state.catalog}
        if command.verb == "unhold" and command.target in state.holds and command.target not in families:
            # A family gone from the configs keeps its hold until someone releases it.
            if controls.held_after(state, command.target, asked_at):
                return render_refusal(command, HELD_AFTER)
            return await self._unhold(state, command.target, author, asked_at or self.clock.now(), comment)
        if command.verb == "status" and command.target is None and not command.text:
            pull = state.overlap.get(number)
            now = self.clock.now()
            if pull is not None and state.overlap.touches(number) and is_idle(pull, now, state.policy.idle_days):
                # DESIGN §4: an idle PR overlaps nothing, so it has no families to answer for.
                return render_idle_pull(number, pull.last_active, state.policy.idle_days)
            overlapped = self._overlapped(state, number)
            if overlapped:
                # On another PR, status answers for the families that PR overlaps, from one
                # plan: a plan per family held the event loop for seconds on a large PR.
                wave = await self.waves.preview_state(state, now)
                answers = [self._status(state, families[f], wave) for f in overlapped[:MAX_STATUS_FAMILIES]]
                if len(overlapped) > MAX_STATUS_FAMILIES:
                    answers.append(render_more_families(number, len(overlapped) - MAX_STATUS_FAMILIES))
                return "\n\n".join(answers)
        resolved = resolve_command(command, families=families, default_family=self._pr_family(state, number))
        family = families.get(resolved.family or "")
        if family is None:
            return render_refusal(command, resolved.error or "no target")
        now = self.clock.now()
        if command.verb == "retry":
            return await self._retry(state, family, author, now, asked_at)
        if command.verb == "hold":
            reason = resolved.text if resolved.text is not None else command.text
            own = controls.own_hold(state, family.id, author, reason)
            if own is not None:
                # Placed by this very command, whose reply GitHub refused (an outage, the
                # delivery given up on): answered as done, found late or not.
                return render_hold(own)
            if controls.released_after(state, family.id, asked_at):
                return render_refusal(command, RELEASED_AFTER)
            if controls.held_after(state, family.id, asked_at):
                return render_refusal(command, HELD_AFTER)
            # Held as of when it was asked: a later unhold, also found late, must release it.
            return render_hold(await controls.hold(self.live, state, family, author, reason, asked_at or now))
        if command.verb == "unhold":
            if controls.held_after(state, family.id, asked_at):
                return render_refusal(command, HELD_AFTER)
            return await self._unhold(state, family.id, author, asked_at or now, comment)
        return self._status(state, family, await self.waves.preview_state(state, now))

    @staticmethod
    def _overlapped(state: RepoState, number: int) -> list[str]:
        pull = state.overlap.get(number)
        if pull is None or pull.klaud_own:
            return []
        return sorted(f for f in state.overlap.touches(number) if f in state.catalog)

    async def _unhold(self, state: RepoState, family: str, author: str, at: datetime, comment: int) -> str:
        released = await controls.release(self.live, state, family, at, comment)
        # Released already by this very command, whose reply GitHub refused: answered as done.
        return render_unhold(family, released or controls.own_release(state, family, comment), author)

    async def _resume(self, state: RepoState, author: str, asked_at: datetime | None) -> str:
        disabled = None if state.policy.enabled else state.blocked_now(self.clock.now())
        if disabled is not None:
            # Nothing to arm: no wave runs, and the push that turns the policy on arms a
            # canary of its own if dispatch was paused as well.
            return render_resume_disabled(disabled.reason, state.meta.pause["reason"] if state.meta.pause else None)
        pause = state.meta.pause["reason"] if state.meta.pause else None
        since = parse_time(state.meta.pause["since"]) if state.meta.pause else None
        if asked_at is not None and since is not None and since > asked_at:
            # Asked before this pause began (found late): not the pause the person meant.
            return render_resume_late(pause or "", since)
        async with self.live.lock(state.name):
            running = state.canary_running()
            armed = state.arm_canary()
            if armed:
                await self.live.persist(state.save_meta())
        if armed:
            log.info("dispatch.canary_armed", repo=state.name, by=author)
            await self.live.notify(state, {f.id for f in state.catalog})
        return render_resume(armed, pause, running)

    async def _retry(
        self, state: RepoState, family: Family, author: str, now: datetime, asked_at: datetime | None
    ) -> str:
        cool = await controls.approve_retry(self.live, state, family, author, now, asked_at=asked_at)
        if began_after(cool, asked_at):
            return render_retry_late(family.id, family.candidate, cool.reason)
        return render_retry(
            family.id, family.candidate, not cool.eligible, cool.reason,
            parse_time(state.meta.next_wave_at),
        )

    def _status(self, state: RepoState, family: Family, wave: Wave) -> str:
        """The status of `family` as `wave`, a preview of the next one, decides it."""
        now = self.clock.now()
        decision = next(d for d in wave.decisions if d.family == family.id)
        attempts = state.ledger.for_candidate(family.candidate)
        cool = state.cooldown_of(family.candidate, now)
        view = StatusView(
            family=family,
            staleness=family.image_changed_at,
            attempts=attempts,
            cooldown_reason=cool.reason,
            cooldown_until=cool.until,
            overlaps=state.overlap.overlaps(family, now, state.policy.idle_days),
            hold=state.holds.get(family.id),
            next_decision=decision,
            next_wave_at=parse_time(state.meta.next_wave_at),
            repo=state.name,
            blocked=state.blocked_now(now),
        )
        return render_status(view)

    @staticmethod
    def _pr_family(state: RepoState, number: int) -> str | None:
        pull = state.overlap.get(number)
        if pull is None or not pull.klaud_own or not pull.own_family_hash:
            return None
        family = state.family_by_hash(pull.own_family_hash)
        return family.id if family else None
