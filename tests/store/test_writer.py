"""The store's one writer: groups commit whole, in the order memory made them, and a unit's
changes commit with the status of the delivery that made them; a caller that stopped
waiting, a merge kind's bound and a merge kind's bug leave the rest of the queue answered."""

from __future__ import annotations

import asyncio

import pytest

from bot.store.change import Change
from bot.store.deliveries import Delivery, DeliveryStore, status_statement
from bot.store.engine import Statement
from bot.store.errors import LeaseTaken
from bot.store.records import StateStore
from bot.store.writer import Writer
from tests.store.recording import RecordingDatabase


def put(repo: str, key: str, value: object) -> Change:
    return Change().put(repo, "wave", key, {"value": value})


async def delivery_changing(
    state: StateStore, key: str, value: str, after: asyncio.Future | None = None
) -> asyncio.Future:
    """A delivery's unit that puts `key` of o/r, ended: the future of its commit."""
    unit = state.writer.begin_unit(after=after)
    await state.apply(put("o/r", key, value))
    return state.writer.end_unit(unit, [])


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


async def test_a_group_its_lease_refuses_fails_alone_though_the_refusal_is_transient(
    db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What this catches: LeaseTaken is transient (a replica's lapsed clock: its delivery is
    # tried again), and the writer took every transient error for a store out of reach,
    # failing the batch's later groups with it: other repositories' deliveries run again.
    state = StateStore(db)
    transaction = db.transaction

    async def lease_fence(statements):  # the fence of migration 7, refusing o/b only
        if any("taken" in str(statement.args) for statement in statements):
            raise LeaseTaken("o/b: another replica holds its lease")
        return await transaction(statements)

    monkeypatch.setattr(db, "transaction", lease_fence)
    results = await asyncio.gather(
        state.apply(put("o/a", "f", 1)), state.apply(put("o/b", "f", "taken")), state.apply(put("o/c", "f", 1)),
        return_exceptions=True,
    )
    assert [type(result).__name__ for result in results] == ["NoneType", "LeaseTaken", "NoneType"]
    assert await state.get("o/c", "wave", "f") is not None


async def test_a_group_that_comes_after_a_refused_one_is_not_committed(db: RecordingDatabase) -> None:
    # The next delivery of a repository ran before the one before it was committed: when that
    # commit is refused (and the store takes the next transaction), it must not land alone.
    state = StateStore(db)

    db.refuse = "first"
    first = await delivery_changing(state, "f", "first")
    await asyncio.gather(first, return_exceptions=True)
    db.refuse = None  # the store takes the next transaction
    second = await delivery_changing(state, "g", "second", after=first)
    other = await delivery_changing(state, "h", "unrelated")
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


class Counted:
    """A merge kind that notes the size of each group it builds and answers each item's index."""

    def __init__(self, limit: int = 10, broken_answers: bool = False) -> None:
        self.limit = limit
        self.sizes: list[int] = []
        self.broken_answers = broken_answers

    def statements(self, items):
        self.sizes.append(len(items))
        return [Statement("SELECT 1", rows=True)]

    def answers(self, items, results):
        if self.broken_answers:
            raise ValueError("a bug in the kind's answers")
        return list(items)


async def test_a_group_that_comes_after_a_cancelled_commit_is_not_committed(db: RecordingDatabase) -> None:
    # What this catches: a predecessor whose commit was cancelled did not block: the next delivery's changes landed alone.
    state = StateStore(db)
    before = asyncio.get_running_loop().create_future()
    before.cancel()
    unit = state.writer.begin_unit(after=before)
    await state.apply(put("o/r", "g", "second"))
    with pytest.raises(RuntimeError, match="not committed"):
        await state.writer.end_unit(unit, [])
    assert await state.get("o/r", "wave", "g") is None


async def test_a_caller_that_stopped_waiting_does_not_stop_the_writes_queued_with_it(db: RecordingDatabase) -> None:
    # What this catches: settling a group whose caller cancelled its future raised in the flusher: later writes of the batch never answered.
    writer = Writer(db)
    gone = writer.enqueue([Statement("SELECT 1", rows=True)])
    waiting = writer.enqueue([Statement("SELECT 2", rows=True)])
    gone.cancel()
    assert await asyncio.wait_for(waiting, 5) is not None
    await asyncio.wait_for(writer.flushed(), 5)


async def test_a_merged_item_whose_caller_stopped_waiting_leaves_the_others_answered(db: RecordingDatabase) -> None:
    # What this catches: answering an item whose future was cancelled raised in the flusher: the other items of the burst never answered.
    writer = Writer(db)
    kind = Counted()
    first = writer.enqueue_item(kind, "a")
    second = writer.enqueue_item(kind, "b")
    first.cancel()
    assert await asyncio.wait_for(second, 5) == "b"


async def test_a_burst_of_a_merge_kind_is_split_into_groups_of_at_most_its_limit(db: RecordingDatabase) -> None:
    # What this catches: a full group still took one more item: groups of limit + 1 (statement parameters past their bound).
    writer = Writer(db)
    kind = Counted(limit=2)
    futures = [writer.enqueue_item(kind, item) for item in "abcde"]
    assert await asyncio.wait_for(asyncio.gather(*futures), 5) == list("abcde")
    assert kind.sizes == [2, 2, 1]


async def test_a_merge_kind_whose_answers_fail_fails_its_callers_and_the_writer_goes_on(db: RecordingDatabase) -> None:
    # What this catches: an error of the kind's answers escaped into the flusher: its callers and the writes after it waited forever.
    writer = Writer(db)
    broken = writer.enqueue_item(Counted(broken_answers=True), "x")
    after = writer.enqueue([Statement("SELECT 2", rows=True)])
    with pytest.raises(ValueError, match="answers"):
        await asyncio.wait_for(broken, 5)
    assert await asyncio.wait_for(after, 5) is not None


async def test_each_write_of_a_batch_gets_the_results_of_its_own_statements_only(db: RecordingDatabase) -> None:
    # What this catches: a write's results ran on into the next group's: a caller got the results of statements it never made.
    writer = Writer(db)
    first = writer.enqueue([Statement("SELECT 1", rows=True)])
    second = writer.enqueue([Statement("SELECT 2", rows=True), Statement("SELECT 3", rows=True)])
    one, two = await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert len(one) == 1 and len(two) == 2
    assert [next(iter(rows))[0] for rows in one + two] == [1, 2, 3]


async def test_a_units_changes_handed_over_for_another_write_still_come_after_its_predecessor(db: RecordingDatabase) -> None:
    # What this catches: changes handed to the queue ahead of another task's write lost their predecessor: they landed though the delivery before was refused.
    state = StateStore(db)
    before = asyncio.get_running_loop().create_future()
    before.set_exception(RuntimeError("the delivery before was refused"))
    unit = state.writer.begin_unit(after=before)
    await state.apply(put("o/r", "g", "second"))

    async def wave() -> None:  # another task's write to the repository hands the unit's changes first
        await state.apply(put("o/r", "h", 3))

    await asyncio.create_task(wave())
    assert await state.get("o/r", "wave", "g") is None, "committed ahead of the refused delivery before it"
    with pytest.raises(RuntimeError, match="refused"):
        await state.writer.end_unit(unit, [])


async def test_a_unit_that_wrote_a_repository_earlier_keeps_its_later_changes_from_a_write_to_that_repository(
    db: RecordingDatabase,
) -> None:
    # What this catches: the repositories of changes already committed stayed noted on the unit: a write to one of them handed over the unit's later changes of another.
    state = StateStore(db)
    unit = state.writer.begin_unit()
    await state.apply(put("o/a", "f", 1))
    await state.writer.commit_unit()  # before an action on GitHub: o/a's change is committed
    await state.apply(put("o/b", "f", 2))
    await asyncio.create_task(state.apply(put("o/a", "g", 3)))
    assert unit.statements, "o/b's change still waits for the delivery's status"
    await state.writer.end_unit(unit, [])


async def test_a_group_after_a_refused_one_in_the_same_batch_is_not_committed_alone(db: RecordingDatabase) -> None:
    # What this catches: tried one by one after the batch failed, the next delivery's group was committed though the one before it was just refused.
    state = StateStore(db)
    db.refuse = "poison"
    # No wait between the two: both groups are in the flusher's next batch.
    first = await delivery_changing(state, "f", "poison")
    second = await delivery_changing(state, "g", "second", after=first)
    results = await asyncio.gather(first, second, return_exceptions=True)

    assert [type(result).__name__ for result in results] == ["RuntimeError", "RuntimeError"]
    assert await state.get("o/r", "wave", "g") is None


async def test_a_units_change_made_after_another_units_change_of_the_repository_commits_after_it(db: RecordingDatabase) -> None:
    # What this catches: a unit's change was held without handing over the other unit's earlier change of the repository: the later delivery ending first put the older value last.
    state = StateStore(db)
    writer = state.writer
    first_changed, second_ended = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        unit = writer.begin_unit()
        await state.apply(put("o/r", "f", "older"))
        first_changed.set()
        await second_ended.wait()
        await writer.end_unit(unit, [])

    async def second() -> None:
        await first_changed.wait()
        unit = writer.begin_unit()
        await state.apply(put("o/r", "f", "newer"))  # made after the first unit's, in memory
        await writer.end_unit(unit, [])
        second_ended.set()

    await asyncio.wait_for(asyncio.gather(first(), second()), 5)
    stored = await state.get("o/r", "wave", "f")
    assert stored == {"value": "newer"}, stored


async def test_commit_holding_returns_once_what_units_held_of_the_repository_is_committed(db: RecordingDatabase) -> None:
    # What this catches: commit_holding only queued the units' changes: a read back that followed read the store without them.
    state = StateStore(db)
    unit = state.writer.begin_unit()
    await state.apply(put("o/r", "f", 1))

    async def read_back() -> None:  # another task (a section's read back after an error)
        await state.writer.commit_holding({"O/R"})
        assert db.committed == [["INSERT"]]

    await asyncio.create_task(read_back())
    assert not unit.statements
    await state.writer.end_unit(unit, [])
