"""The store's one writer: groups commit whole, in the order memory made them, and a unit's
changes commit with the status of the delivery that made them."""

from __future__ import annotations

import asyncio

import pytest

from bot.store.change import Change
from bot.store.deliveries import Delivery, DeliveryStore, status_statement
from bot.store.engine import Statement
from bot.store.records import StateStore
from tests.store.recording import RecordingDatabase


def put(repo: str, key: str, value: object) -> Change:
    return Change().put(repo, "wave", key, {"value": value})


async def test_a_units_changes_commit_with_its_status_in_one_transaction(db: RecordingDatabase) -> None:
    deliveries = DeliveryStore(db)
    state = StateStore(db, deliveries.writer)
    await deliveries.put(Delivery("d1", "push", b"{}", repo="o/r"))
    db.committed.clear()

    unit = deliveries.writer.begin_unit()
    await state.apply(put("o/r", "f", 1))
    await state.apply(put("o/r", "g", 2))
    assert db.committed == [], "the unit holds its changes until it ends"
    await deliveries.writer.end_unit(unit, [status_statement("d1", "done", 1, None)])

    assert db.committed == [["INSERT", "INSERT", "UPDATE"]]  # both changes and the status, one transaction
    assert (await deliveries.get("d1")).status == "done"  # type: ignore[union-attr]
    assert await state.get("o/r", "wave", "g") is not None


async def test_another_tasks_write_to_the_same_repository_goes_after_the_units_changes(db: RecordingDatabase) -> None:
    state = StateStore(db)
    unit = state.writer.begin_unit()
    await state.apply(put("o/r", "f", "from the delivery"))

    async def wave() -> None:  # another task: writes at once, after what memory did first
        await state.apply(Change().delete("o/r", "wave", "f"))

    await asyncio.create_task(wave())
    await state.writer.end_unit(unit, [])

    assert await state.get("o/r", "wave", "f") is None, "the delete came last in memory, so last on disk"


async def test_a_write_to_another_repository_leaves_the_unit_alone(db: RecordingDatabase) -> None:
    state = StateStore(db)
    unit = state.writer.begin_unit()
    await state.apply(put("o/r", "f", 1))
    await asyncio.create_task(state.apply(put("o/other", "f", 1)))
    assert unit.statements, "o/r's change still waits for its status"
    await state.writer.end_unit(unit, [])


async def test_commit_unit_makes_the_changes_durable_before_an_action_on_github(db: RecordingDatabase) -> None:
    state = StateStore(db)
    unit = state.writer.begin_unit()
    await state.apply(put("o/r", "claim", 1))
    await state.writer.commit_unit()  # what the GitHub client awaits before a write
    assert db.committed == [["INSERT"]]
    assert not unit.statements
    await state.writer.end_unit(unit, [])


async def test_a_task_started_inside_a_unit_writes_on_its_own(db: RecordingDatabase) -> None:
    state = StateStore(db)
    unit = state.writer.begin_unit()
    await asyncio.create_task(state.apply(put("o/x", "f", 1)))  # inherits the context, not the unit
    assert db.committed == [["INSERT"]]
    assert not unit.statements
    await state.writer.end_unit(unit, [])


async def test_a_refused_group_fails_alone_and_its_neighbours_commit(db: RecordingDatabase) -> None:
    state = StateStore(db)
    db.refuse = "poison"
    results = await asyncio.gather(
        state.apply(put("o/a", "f", 1)),
        state.apply(put("o/b", "f", "poison")),
        state.apply(put("o/c", "f", 1)),
        return_exceptions=True,
    )
    assert [type(result).__name__ for result in results] == ["NoneType", "RuntimeError", "NoneType"]
    assert await state.get("o/a", "wave", "f") is not None
    assert await state.get("o/c", "wave", "f") is not None
    assert await state.get("o/b", "wave", "f") is None


async def test_a_store_out_of_reach_fails_the_later_groups_too_rather_than_commit_them_ahead(
    db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Tried one by one after a failed batch, a later group committing while an earlier one of
    # the same repository could not would reorder that repository's deliveries.
    state = StateStore(db)
    transaction = db.transaction
    tried: list[int] = []

    async def out_of_reach_once_batched(statements):  # the batch, then the first group alone
        tried.append(len(statements))
        if len(tried) <= 2:
            raise ConnectionError("the connection was closed")
        return await transaction(statements)

    monkeypatch.setattr(db, "transaction", out_of_reach_once_batched)
    results = await asyncio.gather(
        state.apply(put("o/a", "f", 1)), state.apply(put("o/a", "g", 2)), return_exceptions=True
    )
    assert [type(result).__name__ for result in results] == ["ConnectionError", "ConnectionError"]
    assert len(tried) == 2, "the second group was not tried alone"
    assert await state.get("o/a", "wave", "g") is None


async def test_a_group_that_comes_after_a_refused_one_is_not_committed(db: RecordingDatabase) -> None:
    # The next delivery of a repository ran before the one before it was committed: when that
    # commit is refused (and the store takes the next transaction), it must not land alone.
    state = StateStore(db)
    writer = state.writer

    async def delivery_changing(key: str, value: str, after: asyncio.Future | None = None) -> asyncio.Future:
        unit = writer.begin_unit(after=after)
        await state.apply(put("o/r", key, value))
        return writer.end_unit(unit, [])

    db.refuse = "first"
    first = await delivery_changing("f", "first")
    await asyncio.gather(first, return_exceptions=True)
    db.refuse = None  # the store takes the next transaction
    second = await delivery_changing("g", "second", after=first)
    other = await delivery_changing("h", "unrelated")
    results = await asyncio.gather(second, other, return_exceptions=True)

    assert isinstance(results[0], RuntimeError) and not isinstance(results[1], BaseException)
    assert await state.get("o/r", "wave", "g") is None and await state.get("o/r", "wave", "h") is not None


async def test_a_meta_record_counts_as_its_repositorys_change() -> None:
    change = Change().put("", "repo", "Acme/Bench", {"installation": 1}).clear("o/r", "pull")
    assert change.repos() == {"acme/bench", "o/r"}


class Broken:
    """A merge kind with a bug: its statements cannot be built."""

    limit = 10

    def statements(self, items: object) -> list[object]:
        raise ValueError("a bug in the kind")

    def answers(self, items: object, results: object) -> list[bool]:
        return []


async def test_a_merge_kind_that_fails_to_build_fails_its_callers_and_the_writer_goes_on(db: RecordingDatabase) -> None:
    deliveries = DeliveryStore(db)
    broken = deliveries.writer.enqueue_item(Broken(), "x")  # type: ignore[arg-type]
    stored = asyncio.ensure_future(deliveries.put(Delivery("d1", "push", b"{}", repo="o/r")))
    with pytest.raises(ValueError, match="a bug in the kind"):
        await broken
    assert await stored, "the delivery queued with it is committed on its own"
    assert await deliveries.put(Delivery("d2", "push", b"{}", repo="o/r"))


async def test_every_group_of_a_fenced_units_changes_carries_its_fence(db: RecordingDatabase) -> None:
    deliveries = DeliveryStore(db)
    state = StateStore(db, deliveries.writer)
    await deliveries.put(Delivery("d1", "push", b"{}", repo="o/r"))
    fence = Statement("SELECT 'the claim holds'", rows=True)  # PostgreSQL's is klaud_claims_held
    db.transactions.clear()

    unit = deliveries.writer.begin_unit(fence)
    await state.apply(put("o/r", "f", 1))
    await deliveries.writer.commit_unit()  # before an action on GitHub
    await state.apply(put("o/r", "g", 2))

    async def wave() -> None:  # another task's write to the repository hands the unit's changes first
        await state.apply(put("o/r", "h", 3))

    await asyncio.create_task(wave())
    await deliveries.writer.end_unit(unit, [status_statement("d1", "done", 1, None)])

    # Three groups of the unit's (at commit_unit, handed over, at its end), each fenced; the
    # other task's write shares the second transaction, unfenced.
    assert [statements.count(fence) for statements in db.transactions] == [1, 1, 1]
    assert db.committed[-2] == ["INSERT", "SELECT", "INSERT"]  # g and its fence, then the wave's h
