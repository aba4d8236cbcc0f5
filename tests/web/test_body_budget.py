"""The body budget on its own: which bodies may hold bytes, and which wait (bot/web/body.py)."""

from __future__ import annotations

import asyncio
import json

from bot.web.body import BodyBudget
from tests.harness import headers_for, running_klaud
from tests.web.test_hostile_input import MIB, until
from tests.web.test_ingest import PR_PAYLOAD, make_klaud, raw_post


async def test_a_body_that_would_leave_another_unable_to_finish_waits_for_it():
    # What this catches: two bodies that each fit alone but not together holding half each and
    # waiting for one another until both time out.
    budget = BodyBudget(10)
    async with budget.account(7) as second:
        async with budget.account(7) as first:
            assert await first.charge(4) == 4
            assert await second.charge(3) == 3  # the first can still get its last 3
            more = asyncio.create_task(second.charge(1))  # then it could not: this one waits
            await until(lambda: budget.waiting == 1, "the second body waits")
            assert await first.charge(3) == 3
            assert not more.done() and budget.in_use == 10
        assert await more == 1  # the first gave its bytes back
        assert second.held == 4
    assert budget.in_use == 0


async def test_bodies_that_may_all_hold_their_most_at_once_never_wait():
    # What this catches: the check refusing bytes that fit when no body can be left short.
    budget = BodyBudget(10)
    async with budget.account(5) as first, budget.account(5) as second:
        assert await first.charge(4) == 4
        assert await second.charge(5) == 5
        assert budget.waiting == 0 and budget.in_use == 9


async def test_a_body_is_charged_at_most_what_it_announced():
    # What this catches: a body charged past its most, which the check counts on.
    budget = BodyBudget(100)
    async with budget.account(30) as account:
        assert await account.charge(50) == 30
        assert await account.charge(1) == 0
        assert budget.in_use == 30


async def test_a_release_wakes_every_waiting_body_that_now_fits():
    # What this catches: a release that lets one waiting body in while others that fit stay asleep.
    budget = BodyBudget(100)
    hold = asyncio.Event()
    charged: list[int] = []

    async def small() -> None:
        async with budget.account(10) as account:
            charged.append(await account.charge(10))
            await hold.wait()

    async with budget.account(100) as big:
        await big.charge(100)
        tasks = [asyncio.create_task(small()) for _ in range(2)]
        await until(lambda: budget.waiting == 2, "both small bodies wait for room")
    await until(lambda: charged == [10, 10], "both small bodies get their room")
    hold.set()
    await asyncio.gather(*tasks)
    assert budget.in_use == 0


async def test_two_signed_bodies_that_fit_the_budget_one_at_a_time_are_both_stored(tmp_path):
    # What this catches: the same through the webhook: two deliveries of 700 KiB on a 1 MiB
    # budget were both answered 408 (at the default 40 MiB, two of 21 MiB were).
    async with running_klaud(make_klaud(tmp_path), body_budget=MIB, read_timeout=3) as run:
        bodies = [json.dumps(dict(PR_PAYLOAD, number=n, pad="a" * (700 * 1024))).encode() for n in range(2)]
        answers = await asyncio.gather(
            *(raw_post(run, body, headers_for("pull_request", body, delivery=f"big-{n}")) for n, body in enumerate(bodies))
        )
    assert [status for status, _ in answers] == [202, 202]
