"""The inbox when a commit raises, on both engines: a commit that landed although its answer
was lost is not run again, and a delivery another replica holds leaves the queue rather
than block it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from types import SimpleNamespace

import asyncpg
import pytest
from structlog.testing import capture_logs

from bot.store import Stores, open_stores
from bot.store.change import Change
from bot.store.deliveries import Delivery, DeliveryStore
from bot.store.engine import Result, Statement
from bot.store.records import StateStore
from bot.web import inbox as inbox_module
from bot.web.inbox import Inbox
from tests.conftest import fresh_database
from tests.helpers.waiting import until
from tests.store.recording import RecordingDatabase
from tests.web.test_inbox_batches import OwnerOf

POSTGRESQL_ONLY = pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)
BODY = json.dumps({"repository": {"full_name": "acme/bench"}}).encode()


OWNER = OwnerOf("replica-a", "acme/bench")  # the replica holding the lease of acme/bench


def delivery(n: int, repo: str = "acme/bench") -> Delivery:
    return Delivery(f"d{n}", "pull_request", BODY, action="synchronize", repo=repo, installation=1)


def losing_the_first_status_answer(
    stores: Stores, answers: int = 1
) -> Callable[[Sequence[Statement]], Awaitable[list[Result]]]:
    """The engine's transaction, except that the first `answers` writing a delivery's status
    commit and then raise, as when the connection drops between COMMIT and its reply (the
    writer tries a failed batch's groups again one by one: each of those is one more)."""
    commit = stores.engine.transaction
    lost: list[bool] = []

    async def transaction(statements: Sequence[Statement]) -> list[Result]:
        results = await commit(statements)
        if len(lost) < answers and any("attempts =" in statement.sql for statement in statements):
            lost.append(True)
            raise asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation")
        return results

    return transaction


async def test_a_commit_whose_answer_was_lost_is_not_run_again(stores: Stores, store_url: str) -> None:
    runs: list[str] = []

    async def handler(item: Delivery) -> None:
        runs.append(item.id)

    stores.engine.transaction = losing_the_first_status_answer(stores)  # type: ignore[method-assign]
    replicas = store_url.startswith("postgresql")
    inbox = Inbox(stores.deliveries, handler, ownership=OWNER if replicas else None, base_delay=0.05, claim_every=0.02)
    await inbox.open()
    await inbox.start()
    assert await inbox.put(delivery(1))
    await until(lambda: bool(runs) and inbox.backlog == 0)
    await asyncio.sleep(0.2)  # a run again would come after a 50 ms backoff
    await inbox.stop()

    assert runs == ["d1"]
    stored = await stores.deliveries.get("d1")
    assert stored is not None and (stored.status, stored.attempts) == ("done", 1)


async def test_a_commit_whose_answer_was_lost_is_asked_about_again_before_it_would_run_again(
    stores: Stores, store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The connection storm that lost the answer also fails the first question about it.
    runs: list[str] = []

    async def handler(item: Delivery) -> None:
        runs.append(item.id)

    stores.engine.transaction = losing_the_first_status_answer(stores, answers=3)  # type: ignore[method-assign]
    progress = stores.deliveries.progress
    asked: list[list[str]] = []

    async def unreadable_once(ids: list[str]) -> dict:
        asked.append(ids)
        if len(asked) == 1:
            raise ConnectionError("the connection was closed")
        return await progress(ids)

    monkeypatch.setattr(stores.deliveries, "progress", unreadable_once)
    replicas = store_url.startswith("postgresql")
    inbox = Inbox(stores.deliveries, handler, ownership=OWNER if replicas else None, base_delay=0.05,
                  max_delay=0.1, claim_every=0.02)
    await inbox.open()
    await inbox.start()
    for n in (1, 2):
        assert await inbox.put(delivery(n))
    await until(lambda: "d2" in runs and inbox.backlog == 0)
    await inbox.stop()

    assert len(asked) >= 2, "asked again once the store could answer"
    assert runs.count("d1") == 1 and runs.count("d2") == 1
    for n in (1, 2):
        stored = await stores.deliveries.get(f"d{n}")
        assert stored is not None and (stored.status, stored.attempts) == ("done", 1)


async def test_a_refused_commit_holds_back_the_commits_of_the_deliveries_after_it(stores: Stores, store_url: str) -> None:
    # d2 ran before d1's commit was refused; the store then takes d2's transaction. It must
    # not land ahead of d1: a repository's deliveries are committed in their order.
    runs: list[str] = []
    d1_ran = asyncio.Event()

    async def handler(item: Delivery) -> None:
        runs.append(item.id)
        if item.id == "d1" and runs.count("d1") == 1:
            await d1_ran.wait()

    commit = stores.engine.transaction
    refusals: list[bool] = []
    committed: list[str] = []

    async def refusing_d1_once(statements: Sequence[Statement]) -> list[Result]:
        written = [n for n in ("d1", "d2") if any("attempts =" in s.sql and f"'{n}'" in repr(s.args) for s in statements)]
        if not refusals and "d1" in written:
            refusals.append(True)
            raise ConnectionError("the connection was closed")
        results = await commit(statements)
        committed.extend(written)
        return results

    stores.engine.transaction = refusing_d1_once  # type: ignore[method-assign]
    replicas = store_url.startswith("postgresql")
    inbox = Inbox(stores.deliveries, handler, ownership=OWNER if replicas else None, base_delay=0.05,
                  max_delay=0.1, claim_every=0.02)
    await inbox.open()
    for n in (1, 2):
        assert await inbox.put(delivery(n))
    await inbox.start()
    await until(lambda: "d1" in runs)
    d1_ran.set()
    await until(lambda: "d2" in committed and inbox.backlog == 0)
    await inbox.stop()

    assert refusals and committed.index("d1") < committed.index("d2")
    assert runs == ["d1", "d2", "d1", "d2"], "both ran again, in their order"


@POSTGRESQL_ONLY
async def test_a_delivery_another_replica_finished_leaves_the_queue_and_the_next_one_runs(stores: Stores) -> None:
    runs: list[str] = []
    reloaded: list[str] = []
    finished_elsewhere = asyncio.Event()

    async def handler(item: Delivery) -> None:
        runs.append(item.id)
        if item.id == "d1":
            await finished_elsewhere.wait()

    async def reload(repo: str) -> None:
        reloaded.append(repo)

    inbox = Inbox(stores.deliveries, handler, ownership=OWNER, base_delay=0.05, claim_every=0.02, batch_size=1,
                  reload=reload)
    await inbox.open()
    for n in (1, 2):
        assert await inbox.put(delivery(n, "Acme/Bench"))  # as GitHub spells it
    await inbox.start()
    await until(lambda: "d1" in runs)
    # Meanwhile the repository's former owner claimed d1 back and committed it done.
    await stores.engine.transaction(
        [Statement("UPDATE deliveries SET claimed_by = 'replica-b', status = 'done' WHERE id = 'd1'", ())])
    finished_elsewhere.set()
    await until(lambda: "d2" in runs)
    await inbox.stop()

    assert runs == ["d1", "d2"], "d1 is not run again, and does not hold d2 back"
    assert reloaded == ["acme/bench"], "the other replica's changes are read back before d2"
    assert inbox.stale == {"acme/bench"}, "noted in lowercase, as the live state clears it"
    stored = await stores.deliveries.get("d2")
    assert stored is not None and stored.status == "done"


async def test_a_commit_whose_answer_was_lost_is_accounted_at_once_without_a_backoff(db: RecordingDatabase) -> None:
    # What this catches: asked about only before it would run again, the delivery held its queue for a
    # whole backoff (here 5-10 s) and logged a store failure that was not one.
    runs: list[str] = []

    async def handler(item: Delivery) -> None:
        runs.append(item.id)

    db.transaction = losing_the_first_status_answer(SimpleNamespace(engine=db))
    inbox = Inbox(DeliveryStore(db), handler, base_delay=10.0, max_delay=10.0)
    await inbox.open()
    with capture_logs() as logs:
        await inbox.start()
        assert await inbox.put(delivery(1))
        await until(lambda: runs == ["d1"] and inbox.backlog == 0)
        await inbox.stop()
    assert not [e for e in logs if e["event"] == "delivery.store_failed"]
    stored = await inbox.store.get("d1")
    assert stored is not None and (stored.status, stored.attempts) == ("done", 1)


async def test_a_refused_commit_holds_back_the_rest_of_its_batch_in_one_store_failure(
    db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What this catches: only d1 was held in doubt, and d2's other repository was not noted stale (its
    # memory stays ahead of the store). And: one store failure logged per later delivery.
    monkeypatch.setattr(inbox_module, "HOLD_LOOP_SECONDS", 60.0)  # one batch, one transaction
    store = DeliveryStore(db)
    state = StateStore(db, store.writer)

    async def handler(item: Delivery) -> None:
        change = Change().put(item.repo or "", "wave", item.id, {"by": item.id})
        if item.id == "d2":
            change.put("o/x", "wave", item.id, {"by": item.id})  # e.g. an installation-wide write
        await state.apply(change)

    async def reload(repo: str) -> None:
        pass

    stale: set[str] = set()
    inbox = Inbox(store, handler, base_delay=0.5, max_delay=0.5, reload=reload, stale=stale)
    await inbox.open()
    for n in range(3):
        await store.put(delivery(n))
    db.refuse = "'d1'"
    with capture_logs() as logs:
        await inbox.start()
        await until(lambda: any(e["event"] == "delivery.store_failed" for e in logs))
        db.refuse = None
        noted = set(stale)
        await inbox.drained()
        await inbox.stop()
    failures = [e["deliveries"] for e in logs if e["event"] == "delivery.store_failed"]
    assert failures == [["d1", "d2"]]
    assert {"acme/bench", "o/x"} <= noted
    assert [(await store.get(f"d{n}")).status for n in range(3)] == ["done"] * 3


# -- replicas (PostgreSQL: claim fences exist only there) ------------------------------


@pytest.fixture
async def pg(postgres_server) -> AsyncIterator[Stores]:
    async with fresh_database(postgres_server) as url:
        stores = await open_stores(url)
        yield stores
        await stores.close()


async def test_a_delivery_another_replica_processed_is_read_back_with_every_repository_it_wrote(pg: Stores) -> None:
    # What this catches: the store's attempts matching this run's made the other replica's commit pass for
    # this one's: nothing read back. And: the other repository d1 wrote was not read back.
    runs: list[str] = []
    reloaded: list[str] = []
    finished_elsewhere = asyncio.Event()

    async def handler(item: Delivery) -> None:
        runs.append(item.id)
        await pg.state.apply(Change().put("acme/other", "wave", item.id, {"by": item.id}))
        if item.id == "d1":
            await finished_elsewhere.wait()

    async def reload(repo: str) -> None:
        reloaded.append(repo)

    owner = OwnerOf("replica-a", "acme/bench")
    inbox = Inbox(pg.deliveries, handler, ownership=owner, base_delay=0.05, claim_every=0.02, batch_size=1,
                  reload=reload)
    await inbox.open()
    for n in (1, 2):
        assert await inbox.put(delivery(n))
    await inbox.start()
    await until(lambda: "d1" in runs)
    # The former owner claimed d1 back and processed it once: the store counts one attempt.
    await pg.engine.transaction([Statement(
        "UPDATE deliveries SET claimed_by = 'replica-b', status = 'done', attempts = 1 WHERE id = 'd1'", ())])
    finished_elsewhere.set()
    await until(lambda: "d2" in runs and inbox.backlog == 0)
    await inbox.stop()
    assert runs == ["d1", "d2"]
    assert reloaded == ["acme/bench"]
    assert {"acme/bench", "acme/other"} <= inbox.stale


async def test_a_delivery_put_back_in_the_queue_under_its_run_is_run_again_here_not_taken_elsewhere(
    pg: Stores,
) -> None:
    # What this catches: a claim reset to nobody (the repository taken up again requeues its claims) is
    # not another replica's: no read-back, no "taken elsewhere".
    # The replica holds no lease until its commit is refused: its claim loop would otherwise take d1
    # back before the commit, which then lands at the first run.
    runs: list[str] = []
    reloaded: list[str] = []
    requeued = asyncio.Event()

    async def handler(item: Delivery) -> None:
        runs.append(item.id)
        if len(runs) == 1:
            await requeued.wait()

    async def reload(repo: str) -> None:
        reloaded.append(repo)

    ownership = OwnerOf("replica-a", "acme/bench")
    inbox = Inbox(pg.deliveries, handler, ownership=ownership, base_delay=0.05, claim_every=0.02, reload=reload)
    await inbox.open()
    with capture_logs() as logs:
        await inbox.start()
        assert await inbox.put(delivery(1))
        await until(lambda: bool(runs))
        ownership.repo = "acme/nothing"
        await pg.engine.transaction([Statement(
            "UPDATE deliveries SET claimed_by = NULL, status = 'queued' WHERE id = 'd1'", ())])
        requeued.set()
        await until(lambda: any(e["event"] == "delivery.store_failed" for e in logs))
        ownership.repo = "acme/bench"
        # Its retries fail the same way until the claim loop's next claim takes it back.
        await until(lambda: len(runs) >= 2 and inbox.backlog == 0)
        await inbox.stop()
    assert not [e for e in logs if e["event"] == "delivery.taken_elsewhere"]
    assert reloaded == []
    stored = await pg.deliveries.get("d1")
    assert stored is not None and stored.status == "done"


