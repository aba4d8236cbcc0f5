"""Replicas whose own lease clock lapsed (a stall past LEASE_TRUST of the lease, but not past
the lease: nobody else could take the repository) lose no delivery and keep each
repository's order (a seeded chaos review of three replicas on PostgreSQL: SIGSTOP for 0.8
to 1 lease, slow claims)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg
from gidgethub import routing

from bot.app import Klaud
from bot.store.change import Change
from bot.store.errors import StoreUnavailable
from bot.store.leases import repo_lease
from tests.harness import make_settings, running_klaud
from tests.helpers.waiting import until

LAPSE, STALL, BUSY = "acme/lapse", "acme/stall", "acme/busy"


def replica_handling(tmp_path: Path, store_url: str, handler) -> Klaud:  # type: ignore[no-untyped-def]
    """A replica whose `pull_request` handler is `handler`; its lease rounds are run by hand."""
    router = routing.Router()
    router.add(handler, "pull_request")
    klaud = Klaud(make_settings(tmp_path / "unused.db", KLAUD_DB=store_url), router=router)
    assert klaud.replicas is not None
    klaud.replicas.round_seconds = 3600.0
    return klaud


async def note_seen(services, repo: str, event) -> int:  # type: ignore[no-untyped-def]
    """Record the delivery as processed (committed with its status); its number."""
    number = json.loads(event.body)["number"]
    await services.live.persist(Change().put(repo, "seen", event.delivery_id, {"n": number, "at": time.monotonic_ns()}))
    return number


def after_the_first_claim(klaud: Klaud, then: Callable[[], None]) -> asyncio.Event:
    """Run `then` (it may raise: the claim's answer lost) once, after the first claim that
    took something has committed; the event says it ran."""
    claim_owned, ran = klaud.inbox.store.claim_owned, asyncio.Event()

    async def claim(owner, repos, **options):  # type: ignore[no-untyped-def]
        claimed = await claim_owned(owner, repos, **options)
        if claimed and not ran.is_set():
            ran.set()
            then()
        return claimed

    klaud.inbox.store.claim_owned = claim  # type: ignore[method-assign]
    return ran


async def statuses_when(
    conn: asyncpg.Connection, done: Callable[[dict[str, str]], bool], *, seconds: float = 5.0, rounds: Any = None
) -> dict[str, str]:
    """The deliveries' statuses once `done` says so, or after `seconds` (the test's assertion
    then says what was left); with `rounds` (the replicas), their lease rounds go on by hand."""
    for _ in range(int(seconds * 10)):
        if rounds is not None:
            await rounds.round()
        statuses = dict(await conn.fetch("SELECT id, status FROM deliveries"))
        if done(statuses):
            break
        await asyncio.sleep(0.1)
    return statuses


def all_done(statuses: dict[str, str]) -> bool:
    return set(statuses.values()) == {"done"}


def pr(repo: str, number: int) -> dict:
    return {"action": "synchronize", "number": number, "repository": {"full_name": repo}, "installation": {"id": 1}}


async def test_a_write_refused_by_the_replicas_own_lapsed_clock_does_not_fail_the_delivery(
    store_url, tmp_path: Path
) -> None:
    # What this catches: the write refused by the replica's own clock (LeaseTaken) was a
    # permanent error, so the delivery was committed `failed` (its claim was still this
    # replica's) and never processed, though the same replica renewed the lease a moment later.
    started, go = asyncio.Event(), asyncio.Event()

    async def record(event, services) -> None:  # type: ignore[no-untyped-def]
        started.set()
        await go.wait()  # a handler that awaits (GitHub, the store) across the stall
        await note_seen(services, LAPSE, event)

    klaud = replica_handling(tmp_path, store_url, record)
    async with running_klaud(klaud) as run:
        assert (await run.post("pull_request", pr(LAPSE, 1), delivery="d-1"))[0] == 202
        await klaud.replicas.round()  # takes the repository (its delivery waits)
        assert klaud.replicas.owns(LAPSE)
        await asyncio.wait_for(started.wait(), 10)

        # The process stalls for longer than LEASE_TRUST x lease but less than the lease:
        # by its own clock it holds nothing; in the store its lease is unexpired, its claim
        # its own, and no other replica could have taken anything.
        klaud.replicas._valid_until = 0.0
        go.set()
        await asyncio.sleep(0.5)
        await klaud.replicas.round()  # the next round renews: nobody else ever held the repository

        conn = await asyncpg.connect(store_url)
        try:  # 10 s for the delivery to be processed after all
            await statuses_when(conn, lambda now: now.get("d-1") in ("done", "failed"), seconds=10)
            row = await conn.fetchrow("SELECT status, error FROM deliveries WHERE id = 'd-1'")
            seen = await conn.fetchval("SELECT count(*) FROM records WHERE kind = 'seen'")
        finally:
            await conn.close()
        assert (row["status"], seen) == ("done", 1), f"acknowledged delivery lost: {dict(row)}, {seen} records"


async def test_a_claim_returning_after_the_lease_clock_lapsed_keeps_order_and_loses_nothing(
    store_url, tmp_path: Path
) -> None:
    # What this catches: the claim's rows were filtered by the repositories the replica
    # holds by its clock (none, lapsed), so they stayed claimed by it but not in its memory;
    # its claims pass over its own fresh claims for 30 s, and the repository's next
    # delivery was processed first.
    order: list[int] = []

    async def record(event, services) -> None:  # type: ignore[no-untyped-def]
        order.append(await note_seen(services, STALL, event))

    klaud = replica_handling(tmp_path, store_url, record)
    replicas = klaud.replicas
    assert replicas is not None
    # The process was stopped while the claim's query ran.
    stalled = after_the_first_claim(klaud, lambda: setattr(replicas, "_valid_until", 0.0))
    async with running_klaud(klaud) as run:
        assert (await run.post("pull_request", pr(STALL, 1), delivery="d-1"))[0] == 202
        await replicas.round()  # takes the repository; the claim loop claims d-1 across the stall
        await asyncio.wait_for(stalled.wait(), 5)
        await replicas.round()  # back from the stall: the lease was never lost, it is renewed
        assert replicas.owns(STALL)
        assert (await run.post("pull_request", pr(STALL, 2), delivery="d-2"))[0] == 202

        conn = await asyncpg.connect(store_url)
        try:
            # Both are processed within moments when nothing is lost.
            statuses = await statuses_when(conn, lambda now: now.get("d-1") == now.get("d-2") == "done")
            assert statuses == {"d-1": "done", "d-2": "done"}, f"after 5 s: {statuses}, handlers ran for {order}"
            committed = await conn.fetch("SELECT data FROM records WHERE kind = 'seen'")
        finally:
            await conn.close()
        runs = sorted((json.loads(row["data"])["at"], json.loads(row["data"])["n"]) for row in committed)
        assert [n for _, n in runs] == [1, 2], f"committed in the order {runs}"


async def test_a_repository_taken_back_while_its_batch_runs_keeps_its_queue(store_url, tmp_path: Path) -> None:
    # What this catches: let go when its rounds failed (its queue to be dropped once the
    # running batch ends) and taken back before that, the repository's queue was dropped
    # while its deliveries stayed claimed by this replica: the next one went first, and the
    # dropped ones waited 30 s. What is dropped is claimed again fresh, in order.
    order: list[int] = []
    first_started, first_go = asyncio.Event(), asyncio.Event()

    async def record(event, services) -> None:  # type: ignore[no-untyped-def]
        if json.loads(event.body)["number"] == 1:
            first_started.set()
            await first_go.wait()  # a slow handler (a GitHub call) across the store's outage
        order.append(await note_seen(services, BUSY, event))

    klaud = replica_handling(tmp_path, store_url, record)
    replicas = klaud.replicas
    conn = await asyncpg.connect(store_url)
    try:
        async with running_klaud(klaud) as run:
            assert (await run.post("pull_request", pr(BUSY, 1), delivery="d-1"))[0] == 202
            await replicas.round()
            await asyncio.wait_for(first_started.wait(), 10)
            assert (await run.post("pull_request", pr(BUSY, 2), delivery="d-2"))[0] == 202
            await until(lambda: klaud.inbox.backlog == 2, seconds=2.5)  # d-2 queued behind d-1's batch

            # Rounds fail past LEASE_TRUST x lease (the store out of reach): the loop lets go.
            replicas._valid_until = 0.0
            replicas._let_go_if_lapsed()
            assert not replicas.owns(BUSY)
            # The lease then expires in the store, nobody else takes it, the store answers
            # again: the next round takes the repository back, d-1's handler still running.
            await replicas.leases.release(repo_lease(BUSY.lower()), replicas.owner)
            await replicas.round()
            assert replicas.owns(BUSY)
            first_go.set()

            await statuses_when(conn, all_done, seconds=3, rounds=replicas)  # d-1 then d-2, within moments
            assert (await run.post("pull_request", pr(BUSY, 3), delivery="d-3"))[0] == 202
            statuses = await statuses_when(conn, lambda now: now.get("d-3") == "done", seconds=3, rounds=replicas)
            assert statuses == {"d-1": "done", "d-2": "done", "d-3": "done"}, f"{statuses}, processed {order}"
            committed = await conn.fetch("SELECT data FROM records WHERE kind = 'seen'")
            runs = sorted((json.loads(row["data"])["at"], json.loads(row["data"])["n"]) for row in committed)
            assert [n for _, n in runs] == [1, 2, 3], f"committed in the order {runs}"
    finally:
        await conn.close()


async def committed_order(conn: asyncpg.Connection, repo: str) -> list[int]:
    rows = await conn.fetch("SELECT data FROM records WHERE kind = 'seen' AND repo = $1", repo)
    return [n for _, n in sorted((json.loads(row["data"])["at"], json.loads(row["data"])["n"]) for row in rows)]


async def test_a_claim_whose_answer_was_lost_keeps_order(store_url, tmp_path: Path) -> None:
    # What this catches (a review of the fixes above): a claim committed but whose answer
    # was lost (the connection dropped after its COMMIT) left d-1 claimed here but not in
    # memory; the claims passed over this replica's own claims for 30 s, and d-2 went first.
    async def record(event, services) -> None:  # type: ignore[no-untyped-def]
        await note_seen(services, STALL, event)

    klaud = replica_handling(tmp_path, store_url, record)
    replicas = klaud.replicas
    assert replicas is not None

    def answer_lost() -> None:
        raise StoreUnavailable("connection lost after COMMIT")

    lost = after_the_first_claim(klaud, answer_lost)
    conn = await asyncpg.connect(store_url)
    try:
        async with running_klaud(klaud) as run:
            assert (await run.post("pull_request", pr(STALL, 1), delivery="d-1"))[0] == 202
            await replicas.round()
            await asyncio.wait_for(lost.wait(), 5)
            assert (await run.post("pull_request", pr(STALL, 2), delivery="d-2"))[0] == 202
            statuses = await statuses_when(conn, all_done)
            assert statuses == {"d-1": "done", "d-2": "done"}, f"after 5 s: {statuses}"
            assert await committed_order(conn, STALL) == [1, 2]
    finally:
        await conn.close()


async def test_a_claim_in_flight_while_the_queue_is_dropped_keeps_order(store_url, tmp_path: Path) -> None:
    # What this catches (the chaos soak again, seed 32): a claim in flight (slow: many rows)
    # passed over d-1, kept here then, and took d-2; meanwhile the rounds failed past the
    # lease clock, d-1's queue was dropped, and the repository taken back: the claim's d-2
    # was kept and went first, d-1, claimed again, after it.
    other_go = asyncio.Event()

    async def record(event, services) -> None:  # type: ignore[no-untyped-def]
        repo = json.loads(event.body)["repository"]["full_name"]
        if repo == LAPSE:
            await other_go.wait()  # another repository's handler keeps BUSY's queue waiting
        await note_seen(services, repo, event)

    klaud = replica_handling(tmp_path, store_url, record)
    replicas, store = klaud.replicas, klaud.inbox.store
    assert replicas is not None
    klaud.inbox.concurrency = 1
    claim_owned = store.claim_owned
    claiming, in_flight, answer = False, asyncio.Event(), asyncio.Event()

    async def claim_held_in_flight(owner, repos, **options):  # type: ignore[no-untyped-def]
        if not claiming:
            return []
        claimed = await claim_owned(owner, repos, **options)
        if any(delivery.id == "d-2" for delivery in claimed) and not answer.is_set():
            in_flight.set()
            await answer.wait()  # the claim's answer comes late (its rows claimed meanwhile)
        return claimed

    store.claim_owned = claim_held_in_flight  # type: ignore[method-assign]
    conn = await asyncpg.connect(store_url)
    try:
        async with running_klaud(klaud) as run:
            assert (await run.post("pull_request", pr(LAPSE, 1), delivery="o-1"))[0] == 202
            assert (await run.post("pull_request", pr(BUSY, 1), delivery="d-1"))[0] == 202
            await replicas.round()
            assert replicas.owns(BUSY) and replicas.owns(LAPSE)
            claiming = True
            await until(lambda: klaud.inbox.backlog == 2, seconds=2.5)  # o-1 runs (held), d-1 waits behind it
            assert (await run.post("pull_request", pr(BUSY, 2), delivery="d-2"))[0] == 202
            await asyncio.wait_for(in_flight.wait(), 5)  # d-2 claimed; the answer not back yet
            replicas._valid_until = 0.0  # rounds failing past the lease clock: it lets go
            replicas._let_go_if_lapsed()
            await until(lambda: klaud.inbox.backlog == 1, seconds=2.5)  # d-1's queue dropped, o-1 still runs
            for repo in (BUSY, LAPSE):  # the leases expire, nobody else takes them
                await replicas.leases.release(repo_lease(repo.lower()), replicas.owner)
            await replicas.round()  # taken back
            assert replicas.owns(BUSY)
            answer.set()  # the claim in flight answers now
            await asyncio.sleep(0.5)
            other_go.set()
            statuses = await statuses_when(conn, all_done, rounds=replicas)
            assert statuses == {"o-1": "done", "d-1": "done", "d-2": "done"}, f"after 5 s: {statuses}"
            assert await committed_order(conn, BUSY) == [1, 2]
    finally:
        await conn.close()
