"""A delivery given up on after every retry (GitHub down longer than they last) leaves what
it would have changed due: its repository's light reconcile runs at the next scheduler tick
once GitHub answers, not at the 6-hourly one (a lost event's known limit: hours)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from bot.services.scheduler import Scheduler
from tests import scenarios as sc
from tests.harness import SandboxRun, sandbox_stack
from tests.stack.test_people_e2e import GPTOSS, comment, replies

OUTAGE = {"rules": [{"method": "POST", "route": "/comments$", "status": 502}]}  # every reply refused
INBOX = {"base_delay": 0.005, "max_delay": 0.02, "max_attempts": 2}  # retries given up at once


@asynccontextmanager
async def a_hold_written_in_an_outage(tmp_path: Path) -> AsyncIterator[SandboxRun]:
    """Klaud on the sandbox, GitHub refusing every reply, and a `/klaud hold` written: its
    delivery given up on."""
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)]),
                             klaud_options={"inbox_options": INBOX}) as run:
        await run.klaud.scheduler.tick()  # the first wave is scheduled; nothing is due
        run.sandbox.set_faults(OUTAGE)
        await comment(run, 12, "bob", f"/klaud hold {GPTOSS} waiting for new weights")
        yield run


async def test_a_command_whose_delivery_failed_through_an_outage_is_answered_once_github_is_back(tmp_path):
    async with a_hold_written_in_an_outage(tmp_path) as run:
        assert replies(run, 12) == []
        run.sandbox.set_faults({"rules": []})  # GitHub is back
        await run.klaud.scheduler.tick()  # the command is younger than the sweep's grace: left
        assert replies(run, 12) == []

        await run.act({"action": "advance_clock", "seconds": 11 * 60})
        await run.klaud.scheduler.tick()
        await run.settle()

        [reply] = replies(run, 12)
        # The hold its delivery placed before the reply failed is this command's own: done.
        assert "waiting for new weights" in reply and "Not done" not in reply and "write it again" not in reply
        assert GPTOSS in run.klaud.live.repo("acme/bench").holds


async def ticks_for_half_an_hour(run) -> None:  # type: ignore[no-untyped-def]
    """Well short of the 6-hourly reconcile."""
    for _ in range(6):
        await run.act({"action": "advance_clock", "seconds": 5 * 60})
        await run.klaud.scheduler.tick()
        await run.settle()


# The light reconcile goes through while GitHub still refuses the command's reply, or still
# fails the sweep's listing of comments: the catch-up must not be spent on it.
COMMENTS_DOWN = {"rules": [*OUTAGE["rules"], {"method": "GET", "route": "/issues/comments$", "status": 502}]}


@pytest.mark.parametrize("still_down", [OUTAGE, COMMENTS_DOWN], ids=["reply-refused", "listing-failed"])
async def test_a_catch_up_github_still_failed_in_part_is_tried_again(tmp_path, still_down):
    async with a_hold_written_in_an_outage(tmp_path) as run:
        run.sandbox.set_faults(still_down)
        await run.act({"action": "advance_clock", "seconds": 11 * 60})
        await run.klaud.scheduler.tick()  # due: GitHub still fails part of it
        await run.settle()
        assert replies(run, 12) == []

        run.sandbox.set_faults({"rules": []})
        await ticks_for_half_an_hour(run)
        assert len(replies(run, 12)) == 1


async def test_a_second_delivery_given_up_while_a_catch_up_waits_is_caught_up_too(tmp_path):
    async with a_hold_written_in_an_outage(tmp_path) as run:
        await run.act({"action": "advance_clock", "seconds": 9 * 60})
        await comment(run, 12, "bob", "/klaud status")  # given up on 9 minutes later
        run.sandbox.set_faults({"rules": []})

        await ticks_for_half_an_hour(run)
        assert len(replies(run, 12)) == 2


async def test_a_catch_up_left_by_a_process_that_stopped_is_done_by_the_next(tmp_path):
    async with a_hold_written_in_an_outage(tmp_path) as run:
        run.sandbox.set_faults({"rules": []})
        klaud = run.klaud
        # The process that gave up on the hold's delivery stops; the next one's scheduler
        # starts with no catch-up in memory, on the same store.
        klaud.scheduler = Scheduler(klaud.live, klaud.waves, klaud.reconciler, klaud.outcomes, klaud.clock,
                                    given_up=klaud.scheduler.given_up)
        await ticks_for_half_an_hour(run)
        [reply] = replies(run, 12)
        assert "waiting for new weights" in reply and "Not done" not in reply


async def test_a_catch_up_github_still_failed_in_part_survives_a_restart(tmp_path):
    async with a_hold_written_in_an_outage(tmp_path) as run:
        klaud = run.klaud
        given_up_at = klaud.clock.now()  # the hold's delivery was given up on just now
        stored = klaud.scheduler.given_up

        async def given_up_on_klauds_clock(seconds: float) -> dict[str, float]:
            # In production Klaud's clock is the wall clock the store's ages are read on;
            # the sandbox's moves by `advance_clock`: ages are given on Klaud's clock here.
            assert stored is not None
            return {repo: (klaud.clock.now() - given_up_at).total_seconds() for repo in await stored(seconds)}

        await run.act({"action": "advance_clock", "seconds": 11 * 60})
        await klaud.scheduler.tick()  # due: GitHub still refuses replies (comments_left)
        await run.settle()
        assert replies(run, 12) == []

        run.sandbox.set_faults({"rules": []})
        # The process stops; the next one starts on the same store with no catch-up in memory.
        klaud.scheduler = Scheduler(klaud.live, klaud.waves, klaud.reconciler, klaud.outcomes, klaud.clock,
                                    given_up=given_up_on_klauds_clock)
        await ticks_for_half_an_hour(run)
        assert len(replies(run, 12)) == 1

