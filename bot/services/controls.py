"""What people can do to a family, from a `/klaud` comment or a dashboard box alike."""

from __future__ import annotations

from datetime import datetime

from bot.core.cooldown import CooldownState, began_after
from bot.core.domain import Family, Hold, RetryApproval, parse_time
from bot.services.live import LiveState
from bot.services.repo_state import UNKNOWN_TIME, RepoState


async def approve_retry(
    live: LiveState, state: RepoState, family: Family, by: str, now: datetime, *, asked_at: datetime | None = None
) -> CooldownState:
    """Clear the cooldown of the family's candidate for the next real wave, if it has one
    that began by `asked_at` (when the person asked, for a command found late)."""
    candidate = family.candidate
    cool = state.cooldown_of(candidate, now, with_retry=False)
    if not cool.eligible and not began_after(cool, asked_at):
        async with live.lock(state.name):
            # Dated when asked: it clears the cooldown decided by then (`cooldown`).
            await live.persist(state.approve_retry(RetryApproval(candidate, by, asked_at or now)))
        await live.notify(state, {family.id})
    return cool


def held_after(state: RepoState, family: str, asked_at: datetime | None) -> bool:
    """Whether the family's hold was placed after `asked_at`: an unhold asked before (a
    command or a box found late) is not about this hold, and must not end it."""
    held = state.holds.get(family)
    return asked_at is not None and held is not None and held.at > asked_at


def own_hold(state: RepoState, family: str, by: str, reason: str) -> Hold | None:
    """The family's hold when it is the one `by` asked for with `reason` (a command run
    again, or found late after its reply was lost)."""
    held = state.holds.get(family)
    return held if held is not None and (held.by, held.reason) == (by, hold_reason(reason)) else None


def own_release(state: RepoState, family: str, comment: int) -> Hold | None:
    """The hold the command of `comment` released: that command run again (its reply
    refused by GitHub), found late or not."""
    ended = state.meta.released_holds.get(family)
    if ended is None or ended["comment"] != comment:
        return None
    return Hold(family, ended["by"], ended["reason"], parse_time(ended["at"]) or UNKNOWN_TIME)


def hold_reason(reason: str) -> str:
    return reason or "no reason given"


def released_after(state: RepoState, family: str, asked_at: datetime | None) -> bool:
    """Whether the family's hold was asked to end after `asked_at`: a hold asked before
    (a command found late) must not undo that."""
    released = parse_time(state.meta.released.get(family))
    return asked_at is not None and released is not None and released > asked_at


async def hold(live: LiveState, state: RepoState, family: Family, by: str, reason: str, now: datetime) -> Hold:
    held = Hold(family.id, by, hold_reason(reason), now)
    async with live.lock(state.name):
        await live.persist(state.hold(held))
    await live.notify(state, {family.id})
    return held


async def release(
    live: LiveState, state: RepoState, family: str, asked_at: datetime, comment: int | None = None
) -> Hold | None:
    """Release the family's hold, as asked at `asked_at` (by the command of `comment`); the
    hold that was released, if there was one. The family may have left the configs since:
    its hold would otherwise stay for good, and come back with it."""
    async with live.lock(state.name):
        previous, change = state.unhold(family, asked_at, comment)
        await live.persist(change)
    await live.notify(state, {family})
    return previous
