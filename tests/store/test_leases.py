"""Leases, on both engines: one holder at a time, renewed by it, taken by another after expiry."""

from __future__ import annotations

import asyncio

NAME = "repo:o/r"


async def test_a_lease_is_held_by_one_owner_until_it_expires_then_another_may_take_it(stores):
    leases = stores.leases
    assert await leases.acquire(NAME, "a", 0.4)
    assert not await leases.acquire(NAME, "b", 30)
    assert await leases.acquire(NAME, "a", 0.4)  # its own: extended
    assert await leases.renew_all({NAME}, "a", 0.4) == {NAME}
    assert await leases.renew_all({NAME}, "b", 30) == set()
    assert await leases.holders() == {NAME: "a"}
    await asyncio.sleep(0.5)
    assert await leases.holders() == {}
    assert await leases.acquire(NAME, "b", 30)  # expired: taken over
    assert await leases.renew_all({NAME}, "a", 30) == set()  # the old owner learns it lost the lease
    await leases.release(NAME, "a")  # not a's any more: nothing happens
    assert await leases.holders() == {NAME: "b"}
    await leases.release(NAME, "b")
    assert await leases.holders() == {}
    assert await leases.acquire(NAME, "a", 30)


async def test_of_many_concurrent_acquirers_of_a_free_lease_exactly_one_wins(stores):
    won = await asyncio.gather(*(stores.leases.acquire(NAME, f"replica-{n}", 30) for n in range(10)))
    assert won.count(True) == 1
    assert await stores.leases.holders() == {NAME: f"replica-{won.index(True)}"}


async def test_renewing_many_leases_answers_those_the_owner_still_holds(stores):
    leases = stores.leases
    assert await leases.acquire("repo:o/a", "a", 30) and await leases.acquire("repo:o/b", "a", 0.2)
    assert await leases.acquire("repo:o/c", "b", 30)
    await asyncio.sleep(0.25)
    assert await leases.acquire("repo:o/b", "b", 30)  # expired: b took it over
    renewed = await leases.renew_all({"repo:o/a", "repo:o/b", "repo:o/c"}, "a", 30)
    assert renewed == {"repo:o/a"}
    assert await leases.renew_all(set(), "a", 30) == set()
    assert await leases.holders() == {"repo:o/a": "a", "repo:o/b": "b", "repo:o/c": "b"}


async def test_leases_expired_long_enough_are_pruned_and_live_ones_kept(stores):
    leases = stores.leases
    assert await leases.acquire("replica:dead", "dead", 0.1) and await leases.acquire("replica:alive", "alive", 30)
    await asyncio.sleep(0.3)
    assert await leases.prune(expired_for_seconds=10) == 0  # expired, but only just
    assert await leases.prune(expired_for_seconds=0.1) == 1
    assert await leases.holders() == {"replica:alive": "alive"}
    assert await leases.acquire("replica:dead", "other", 30)  # the name is free again
