"""The delivery inbox's storage, on both engines: group commit, duplicates, prune, claims."""

from __future__ import annotations

import asyncio
import json
import time
import zlib

import asyncpg
import pytest
from structlog.testing import capture_logs

from bot.core.errors import is_transient
from bot.store import Stores, open_stores, postgres
from bot.store.deliveries import Delivery, moved_statement, status_statement
from bot.store.engine import (
    COMPRESS_NOW_LIMIT,
    Compressed,
    Statement,
    compressed_now,
    inflate,
)
from bot.store.errors import StoreUnavailable

POSTGRESQL_ONLY = pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)


def delivery(n: int, repo: str | None = "o/r") -> Delivery:
    return Delivery(f"d{n}", "push", json.dumps({"n": n}).encode(), action=None, repo=repo, installation=7,
                    headers={"X-GitHub-Event": "push"})


async def save_status(stores: Stores, delivery: Delivery) -> None:
    """Write a delivery's status on its own, as the inbox does with its unit's changes."""
    await stores.deliveries.writer.write([status_statement(delivery.id, delivery.status, delivery.attempts, delivery.error)])


async def test_a_delivery_round_trips_and_its_status_is_saved(stores):
    assert await stores.deliveries.put(delivery(1))
    stored = await stores.deliveries.get("d1")
    assert stored == delivery(1)
    stored.status, stored.attempts, stored.error = "failed", 2, "boom"
    await save_status(stores, stored)
    assert (await stores.deliveries.get("d1")).status_document() == {
        "id": "d1", "event": "push", "action": None, "status": "failed", "attempts": 2, "error": "boom"}
    assert await stores.deliveries.pending() == [] and await stores.deliveries.get("d2") is None


def transaction_sizes(stores: Stores, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The count of statements of each transaction the store runs from now on."""
    sizes: list[int] = []
    run_transaction = stores.engine.transaction

    async def counted(statements):  # type: ignore[no-untyped-def]
        sizes.append(len(statements))
        return await run_transaction(statements)

    monkeypatch.setattr(stores.engine, "transaction", counted)
    return sizes


async def test_concurrent_puts_share_transactions_all_commit_and_duplicates_are_detected(store_url, monkeypatch):
    stores = await open_stores(store_url)
    transactions = transaction_sizes(stores, monkeypatch)
    puts = [stores.deliveries.put(delivery(n)) for n in range(100)]
    redeliveries = [stores.deliveries.put(delivery(n)) for n in range(100)]  # the same ids again
    acknowledged = await asyncio.gather(*puts, *redeliveries)
    assert acknowledged == [True] * 100 + [False] * 100
    assert len(transactions) <= 3  # group commit: not one transaction per delivery
    await stores.close()
    # Acknowledged means committed: a new process finds every one. Concurrent deliveries
    # have no order; one acknowledged before the next is sent comes first.
    reopened = await open_stores(store_url)
    try:
        assert {d.id for d in await reopened.deliveries.pending()} == {f"d{n}" for n in range(100)}
        for n in (100, 101, 102):
            assert await reopened.deliveries.put(delivery(n))
        assert [d.id for d in await reopened.deliveries.pending()][-3:] == ["d100", "d101", "d102"]
    finally:
        await reopened.close()


async def test_a_burst_is_written_by_a_few_statements_and_a_row_the_store_refuses_fails_alone(stores, monkeypatch):
    sizes = transaction_sizes(stores, monkeypatch)
    unstorable = Delivery("bad", None, b"{}", headers={})  # type: ignore[arg-type]  # NOT NULL refuses it
    answers = await asyncio.gather(*(stores.deliveries.put(delivery(n)) for n in range(50)),
                                   stores.deliveries.put(unstorable), return_exceptions=True)
    assert answers[:50] == [True] * 50
    assert isinstance(answers[50], Exception) and "bad" not in {d.id for d in await stores.deliveries.pending()}
    # The burst went as one transaction of a few statements (SQLite: stored ids, rows,
    # bodies; PostgreSQL: one), then its deliveries one by one once it failed.
    assert sizes[0] <= 3 and len(sizes) == 1 + 51
    assert {d.id for d in await stores.deliveries.pending()} == {f"d{n}" for n in range(50)}


async def test_the_statuses_of_a_transaction_are_one_statement_and_a_deliverys_last_one_wins(stores, monkeypatch):
    for n in (1, 2):
        assert await stores.deliveries.put(delivery(n))
    sizes = transaction_sizes(stores, monkeypatch)
    results = await stores.deliveries.writer.write([
        status_statement("d1", "queued", 1, "ConnectionError: boom"),
        status_statement("d2", "done", 1, None),
        status_statement("d1", "done", 2, None),
    ])
    assert sizes == [1] and results == [None, None, None]
    one, two = await stores.deliveries.get("d1"), await stores.deliveries.get("d2")
    assert (one.status, one.attempts, one.error) == ("done", 2, None)
    assert (two.status, two.attempts) == ("done", 1)


async def test_prune_deletes_finished_deliveries_by_age_failed_ones_later(stores):
    for n in (1, 2, 3):
        await stores.deliveries.put(delivery(n))
    for n, status in ((1, "done"), (2, "failed")):
        finished = delivery(n)
        finished.status = status
        await save_status(stores, finished)
    now = time.time()
    assert await stores.deliveries.prune(done_before=now + 1, failed_before=now - 3600) == 1
    assert await stores.deliveries.get("d1") is None and await stores.deliveries.get("d2") is not None
    assert await stores.deliveries.prune(done_before=now + 1, failed_before=now + 1) == 1
    assert [d.id for d in await stores.deliveries.pending()] == ["d3"]


@POSTGRESQL_ONLY
async def test_replicas_claiming_at_once_get_exactly_the_deliveries_of_the_repositories_they_own(stores, store_url):
    for n in range(200):
        await stores.deliveries.put(delivery(n, f"o/r{n % 7}"))
    other = await open_stores(store_url)  # a second replica: its own pool of connections
    leases = {"a": {"o/r0", "o/r1", "o/r2"}, "b": {"o/r3", "o/r4", "o/r5", "o/r6"}}

    async def drain(replica, owner):
        got = []
        while batch := await replica.deliveries.claim_owned(owner, leases[owner], unrouted=False, limit=7, kept=got):
            got.extend(d.id for d in batch)
        return got

    try:
        first, second = await asyncio.gather(drain(stores, "a"), drain(other, "b"))
    finally:
        await other.close()
    assert sorted(first) == sorted(f"d{n}" for n in range(200) if n % 7 < 3)
    assert sorted(second) == sorted(f"d{n}" for n in range(200) if n % 7 >= 3)


@POSTGRESQL_ONLY
async def test_a_claim_skips_deliveries_another_transaction_holds_without_waiting(stores, store_url):
    for n in range(3):
        await stores.deliveries.put(delivery(n))
    for n in range(3, 5):
        await stores.deliveries.put(delivery(n, "o/s"))
    holder = await asyncpg.connect(store_url)
    try:
        async with holder.transaction():
            await holder.execute("SELECT seq FROM deliveries WHERE id = 'd1' FOR UPDATE")
            claimed = await asyncio.wait_for(
                stores.deliveries.claim_owned("b", {"o/r", "o/s"}, unrouted=False, limit=5), 5)
    finally:
        await holder.close()
    # o/r's d2 waits with the d1 passed over, or it would run before it; o/s's are free.
    assert [d.id for d in claimed] == ["d0", "d3", "d4"]
    again = await stores.deliveries.claim_owned("b", {"o/r", "o/s"}, unrouted=False, limit=5, kept={"d0", "d3", "d4"})
    assert [d.id for d in again] == ["d1", "d2"]


@POSTGRESQL_ONLY
async def test_installation_events_passed_over_hold_back_their_installations_later_ones(stores, store_url):
    # What this catches: deliveries of no repository were matched by repository alone, so
    # one passed over (its last owner's commit in flight) let its installation's later
    # events be claimed, and run, before it.
    for n in range(3):
        await stores.deliveries.put(Delivery(f"u{n}", "installation", b"{}", action="created", installation=7))
    await stores.deliveries.put(Delivery("v0", "installation", b"{}", action="created", installation=8))
    holder = await asyncpg.connect(store_url)
    try:
        async with holder.transaction():
            await holder.execute("SELECT seq FROM deliveries WHERE id = 'u1' FOR UPDATE")
            claimed = await asyncio.wait_for(stores.deliveries.claim_owned("b", set(), unrouted=True, limit=10), 5)
    finally:
        await holder.close()
    assert [d.id for d in claimed] == ["u0", "v0"]  # u2 waits behind u1; installation 8 is free
    again = await stores.deliveries.claim_owned("b", set(), unrouted=True, limit=10, kept={"u0", "v0"})
    assert [d.id for d in again] == ["u1", "u2"]


@POSTGRESQL_ONLY
async def test_a_commit_fenced_by_a_claim_that_passed_to_another_replica_fails_and_changes_nothing(
    stores, store_url, monkeypatch
):
    await stores.deliveries.put(delivery(1))
    await stores.deliveries.put(delivery(2, "o/s"))
    claimed = await stores.deliveries.claim_owned("a", {"o/r", "o/s"}, unrouted=False, limit=5)
    assert [d.id for d in claimed] == ["d1", "d2"]
    other = await open_stores(store_url)  # o/r's next owner, after replica a stalled past its lease
    try:
        assert [d.id for d in await other.deliveries.claim_owned("b", {"o/r"}, unrouted=False, limit=5)] == ["d1"]
        sizes = transaction_sizes(stores, monkeypatch)
        late = [stores.deliveries.claim_fence(n, "a") for n in ("d1", "d2")]
        late += [status_statement(n, "done", 1, None) for n in ("d1", "d2")]
        with pytest.raises(asyncpg.PostgresError, match="deliveries d1 are no longer claimed by a"):
            await stores.deliveries.writer.write(late)  # type: ignore[arg-type]
        assert sizes == [2], "the fences of a transaction are one statement, its statuses another"
        assert [(await stores.deliveries.get(n)).status for n in ("d1", "d2")] == ["processing", "processing"]
        # Run on its own, a fence is the same check for its one delivery.
        await stores.engine.transaction([stores.deliveries.claim_fence("d2", "a")])  # type: ignore[list-item]
        with pytest.raises(asyncpg.PostgresError, match="deliveries d1 are no longer claimed by a"):
            await stores.engine.transaction([stores.deliveries.claim_fence("d1", "a")])  # type: ignore[list-item]
        await stores.deliveries.writer.write([stores.deliveries.claim_fence("d2", "a"), late[3]])  # type: ignore[list-item]
        assert (await stores.deliveries.get("d2")).status == "done"
        current = [other.deliveries.claim_fence("d1", "b"), status_statement("d1", "done", 1, None)]
        await other.deliveries.writer.write(current)  # type: ignore[arg-type]
        assert (await stores.deliveries.get("d1")).status == "done"
    finally:
        await other.close()


async def test_a_body_is_stored_apart_compressed_on_sqlite_and_read_back_whole(stores: Stores) -> None:
    body = b'{"action": "synchronize", "pad": "' + b"x" * 20_000 + b'"}'
    await stores.deliveries.put(Delivery("big", "pull_request", body, repo="o/r"))
    await save_status(stores, Delivery("big", "pull_request", None, status="done", attempts=1))

    assert (await stores.deliveries.get("big")).body == body  # type: ignore[union-attr]
    assert await stores.deliveries.bodies(["big", "absent"]) == {"big": body}
    [(encoding, size)] = await stores.engine.fetch("SELECT encoding, length(body) FROM delivery_bodies")
    if stores.engine.dialect == "sqlite":
        assert encoding == "zstd" and size < 1_000
    else:
        assert encoding is None and size == len(body)


async def test_the_bodies_of_one_burst_are_stored_compressed_and_each_reads_back_whole(stores: Stores) -> None:
    bodies = {f"b{n}": b'{"action": "synchronize", "n": %d, "pad": "' % n + bytes([97 + n]) * 20_000 + b'"}'
              for n in range(5)}
    puts = [stores.deliveries.put_soon(Delivery(key, "pull_request", body, repo="o/r")) for key, body in bodies.items()]
    assert await asyncio.gather(*puts) == [True] * 5  # one group commit: one statement of bodies

    assert await stores.deliveries.bodies(list(bodies)) == bodies
    stored = await stores.engine.fetch("SELECT id, encoding, length(body) FROM delivery_bodies")
    if stores.engine.dialect == "sqlite":
        assert sorted((key, encoding) for key, encoding, size in stored if size < 1_000) == [(key, "zstd") for key in bodies]


async def test_bodies_and_progress_read_any_number_of_ids_with_one_postgresql_statement(stores: Stores, monkeypatch) -> None:
    stored = [delivery(n) for n in range(1, 6)]
    for each in stored:
        assert await stores.deliveries.put(each)
    texts: set[str] = set()
    fetch = stores.engine.fetch

    async def recording(sql: str, *args: object) -> list:
        texts.add(sql)
        return await fetch(sql, *args)

    monkeypatch.setattr(stores.engine, "fetch", recording)
    for count in (1, 2, 5):
        ids = [each.id for each in stored[:count]] + ["absent"]
        assert set(await stores.deliveries.bodies(ids)) == set(ids[:count])
        assert {key: progress.status for key, progress in (await stores.deliveries.progress(ids)).items()} == dict.fromkeys(
            ids[:count], "queued")
    # asyncpg prepares each distinct text on the server: one per query, whatever the count.
    assert len(texts) == (2 if stores.engine.dialect == "postgresql" else 6)


def test_a_body_is_compressed_at_once_unless_it_is_large() -> None:
    small, large = b"s" * COMPRESS_NOW_LIMIT, b"l" * (COMPRESS_NOW_LIMIT + 1)
    encoding, value = compressed_now("sqlite", small)
    assert encoding == "zstd" and isinstance(value, bytes) and inflate("zstd", value) == small
    # A large one (up to 25 MB) would hold the event loop: the store's thread compresses it.
    assert compressed_now("sqlite", large) == ("zstd", Compressed(large))
    assert compressed_now("postgresql", small) == (None, small)  # PostgreSQL compresses itself


async def test_a_large_body_is_stored_compressed_and_reads_back_whole(stores: Stores) -> None:
    body = b'{"action": "synchronize", "pad": "' + b"z" * COMPRESS_NOW_LIMIT + b'"}'
    assert await stores.deliveries.put(Delivery("large", "pull_request", body, repo="o/r"))
    assert await stores.deliveries.bodies(["large"]) == {"large": body}
    [(encoding, size)] = await stores.engine.fetch("SELECT encoding, length(body) FROM delivery_bodies")
    if stores.engine.dialect == "sqlite":
        assert encoding == "zstd" and size < 1_000


async def test_a_body_compressed_by_an_earlier_version_reads_back(stores: Stores) -> None:
    body = b'{"action": "opened", "pad": "' + b"y" * 5_000 + b'"}'
    await stores.deliveries.put(Delivery("old", "pull_request", body, repo="o/r"))
    await stores.engine.transaction([Statement("UPDATE delivery_bodies SET encoding = ?, body = ? WHERE id = ?",
                                               ("zlib", zlib.compress(body), "old"))])

    assert (await stores.deliveries.get("old")).body == body  # type: ignore[union-attr]
    assert await stores.deliveries.bodies(["old"]) == {"old": body}


async def test_a_body_that_does_not_decompress_reads_as_absent_and_is_reported(stores: Stores) -> None:
    await stores.deliveries.put(Delivery("bad", "pull_request", b'{"action": "opened"}', repo="o/r"))
    await stores.engine.transaction([Statement("UPDATE delivery_bodies SET encoding = ?, body = ? WHERE id = ?",
                                               ("zstd", b"not zstd at all", "bad"))])
    with capture_logs() as logs:
        assert (await stores.deliveries.get("bad")).body is None  # type: ignore[union-attr]
        assert await stores.deliveries.bodies(["bad"]) == {}
    reports = [(e["kind"], e["key"]) for e in logs if e["event"] == "store.record_unreadable"]
    assert reports == [("delivery-body", "bad")] * 2


async def test_unreadable_stored_headers_read_as_none_and_are_reported(stores: Stores) -> None:
    # What this catches: a queued delivery whose headers do not decode stopped the server at
    # start-up with a traceback (the inbox loads the queued ones), and made its API read a 500.
    await stores.deliveries.put(Delivery("odd", "pull_request", b'{"action": "opened"}', repo="o/r"))
    await stores.engine.transaction([Statement("UPDATE deliveries SET headers = ? WHERE id = ?", ("garbage", "odd"))])
    with capture_logs() as logs:
        assert [d.id for d in await stores.deliveries.pending()] == ["odd"]
        assert (await stores.deliveries.get("odd")).headers == {}  # type: ignore[union-attr]
    reports = [(e["kind"], e["key"]) for e in logs if e["event"] == "store.record_unreadable"]
    assert reports == [("delivery-headers", "odd")] * 2


async def test_an_error_text_holding_u0000_is_stored_without_it_on_both_engines(stores: Stores) -> None:
    # What this catches: SQLite kept the text and PostgreSQL refused the status write.
    await stores.deliveries.put(Delivery("nul", "push", b"{}", repo="o/r"))
    await save_status(stores, Delivery("nul", "push", None, status="failed", attempts=1, error="bad \x00 thing"))
    assert (await stores.deliveries.get("nul")).error == "bad  thing"  # type: ignore[union-attr]


async def test_pruning_a_delivery_prunes_its_body(stores: Stores) -> None:
    await stores.deliveries.put(Delivery("old", "push", b"{}", repo="o/r"))
    await save_status(stores, Delivery("old", "push", None, status="done", attempts=1))
    assert await stores.deliveries.prune(done_before=time.time() + 1, failed_before=0) == 1
    assert await stores.engine.fetch("SELECT id FROM delivery_bodies") == []


async def test_the_owner_of_a_repository_claims_its_queued_deliveries_and_those_others_claimed(stores):
    """A repository's lease holder is the only one working on it: it takes its queued
    deliveries, those a replica that lost the lease had claimed, and not other repositories'."""
    for n, repo in ((1, "o/a"), (2, "o/b"), (3, "O/A"), (4, None), (5, "o/a")):
        await stores.deliveries.put(delivery(n, repo))
    assert [d.id for d in await stores.deliveries.claim_owned("dead", {"o/a"}, unrouted=False, limit=1)] == ["d1"]
    claimed = await stores.deliveries.claim_owned("w1", {"O/a"}, unrouted=False, limit=2)
    assert [(d.id, d.status) for d in claimed] == [("d1", "processing"), ("d3", "processing")]
    assert [d.id for d in await stores.deliveries.claim_owned("w1", {"o/a"}, unrouted=False, limit=9, kept={"d1", "d3"})] == ["d5"]
    # its own claims it keeps in memory are work in hand, not taken twice
    assert await stores.deliveries.claim_owned("w1", {"o/a"}, unrouted=False, limit=9, kept={"d1", "d3", "d5"}) == []
    assert await stores.deliveries.claim_owned("w1", set(), unrouted=False, limit=9) == []
    assert [d.id for d in await stores.deliveries.claim_owned("w2", set(), unrouted=True, limit=9)] == ["d4"]
    assert await stores.deliveries.waiting_repos() == {"o/a", "o/b"}


async def test_a_claimed_delivery_handed_on_to_a_new_name_is_claimed_by_that_names_owner(stores):
    await stores.deliveries.put(delivery(1, "o/old"))
    [claimed] = await stores.deliveries.claim_owned("w1", {"o/old"}, unrouted=False, limit=9)
    fence = stores.deliveries.claim_fence("d1", "w1")
    moved = moved_statement("d1", "o/new", 1, "RepositoryMoved: …")
    await stores.deliveries.writer.write([moved] if fence is None else [moved, fence])  # the inbox's order

    assert await stores.deliveries.claim_owned("w1", {"o/old"}, unrouted=False, limit=9) == []
    [handed] = await stores.deliveries.claim_owned("w2", {"o/new"}, unrouted=False, limit=9)
    assert (handed.id, handed.repo, handed.status, handed.attempts) == ("d1", "o/new", "processing", 1)
    assert await stores.deliveries.bodies(["d1"]) == {"d1": claimed.body or json.dumps({"n": 1}).encode()}


async def test_taking_a_repository_up_requeues_its_unfinished_claims_whoever_made_them(stores):
    for n in (1, 2):
        await stores.deliveries.put(delivery(n, "o/a"))
    await stores.deliveries.put(delivery(3, "o/b"))
    assert len(await stores.deliveries.claim_owned("w1", {"o/a", "o/b"}, unrouted=False, limit=9)) == 3
    assert await stores.deliveries.unclaim("O/A") == 2  # w1's, taken up by w2 (or by w1 again)
    assert await stores.deliveries.unclaim("o/a") == 0
    assert [d.id for d in await stores.deliveries.claim_owned("w1", {"o/a"}, unrouted=False, limit=9)] == ["d1", "d2"]
    # a claim of its own it does not keep in memory is taken again (it lost and retook the
    # lease, the claim's answer was lost); one it keeps is not
    assert await stores.deliveries.claim_owned("w1", {"o/a", "o/b"}, unrouted=False, limit=9, kept={"d1", "d2", "d3"}) == []
    again = await stores.deliveries.claim_owned("w1", {"o/b"}, unrouted=False, limit=9, kept={"d1", "d2"})
    assert [d.id for d in again] == ["d3"]
    for finished in again:
        finished.status = "done"
        await save_status(stores, finished)
    assert await stores.deliveries.waiting_repos() == {"o/a"}


@POSTGRESQL_ONLY
async def test_a_table_locked_by_another_session_is_a_transient_error_in_moments_not_a_hang(store_url, monkeypatch):
    monkeypatch.setattr(postgres, "SERVER_SETTINGS", {**postgres.SERVER_SETTINGS, "lock_timeout": "200ms"})
    opened = await open_stores(store_url)
    other = await asyncpg.connect(store_url)
    try:
        locked = other.transaction()
        await locked.start()
        await other.execute("LOCK TABLE deliveries IN ACCESS EXCLUSIVE MODE")
        with pytest.raises(StoreUnavailable, match="LockNotAvailableError") as refused:
            await asyncio.wait_for(opened.deliveries.put(delivery(1)), 5)
        assert is_transient(refused.value), "a delivery whose handler met it is retried, not failed"
        await locked.rollback()
        assert await opened.deliveries.put(delivery(1))
    finally:
        await other.close()
        await opened.close()


@POSTGRESQL_ONLY
async def test_a_pool_with_no_connection_free_in_time_is_the_stores_trouble_named_as_such(store_url, monkeypatch):
    # What this catches: the pool's wait ended in asyncio's bare TimeoutError, which the GitHub
    # client, committing a write's cause right before sending it, took for GitHub not answering.
    monkeypatch.setattr(postgres, "ACQUIRE_SECONDS", 0.05)
    opened = await open_stores(store_url)
    pool = opened.deliveries.db._pool  # type: ignore[attr-defined]
    held = [await pool.acquire() for _ in range(pool.get_max_size())]
    try:
        with pytest.raises(StoreUnavailable, match="TimeoutError") as refused:
            await opened.deliveries.put(delivery(1))
        assert is_transient(refused.value)
    finally:
        for connection in held:
            await pool.release(connection)
        await opened.close()


async def test_the_repositories_of_deliveries_given_up_on_are_read_with_the_time_of_the_last(stores):
    now = time.time()
    # (number, repository, status, seconds ago it was last updated)
    for n, repo, status, ago in [(1, "O/R", "failed", 200), (2, "o/r", "failed", 100), (3, "x/y", "done", 10),
                                 (4, None, "failed", 10), (5, "q/r", "queued", 10)]:
        assert await stores.deliveries.put(delivery(n, repo))
        await save_status(stores, Delivery(f"d{n}", "push", b"", action=None, repo=repo, installation=7,
                                           headers={}, status=status, attempts=8, error="GitHub: 502"))
        await stores.engine.transaction([Statement("UPDATE deliveries SET updated_at = ? WHERE id = ?",
                                                   (now - ago, f"d{n}"))])
    ages = await stores.deliveries.given_up_within(3600)
    assert list(ages) == ["o/r"]  # any case of the name; done, queued and unrouted ones are not
    assert 100 <= ages["o/r"] < 200  # the later of the two
    assert await stores.deliveries.given_up_within(50) == {}  # both given up on before the window
