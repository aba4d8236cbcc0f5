"""The one queue of writes to the store, committed in the order they were made in memory.

Writes that arrive while a transaction is running are committed together in the next one
(group commit), so a burst costs one fsync per batch instead of one per write. A write is a
*group* of statements that commit together or not at all; when a batch fails, each group is
tried again in a transaction of its own, so one row the store refuses fails only its caller.

Some writes come in bursts of one kind (new deliveries): such a kind (`Merge`) has the
items queued while a transaction runs written by a few statements for all of them, so a
burst of N costs a few statement executions rather than N groups (each execution is a
round trip to PostgreSQL, and in SQLite's thread a wait for the interpreter).

A delivery's state changes are not written as they are made: the inbox opens a *unit* for
the delivery, `StateStore.apply` collects the unit's statements, and the unit ends as one
group with the delivery's new status, so the state a delivery changed and "done" commit in
the same transaction and the handlers of a repository's next deliveries do not wait for an
fsync. Two rules keep the store in the order of memory:
- before any other write that touches a repository, the units holding changes of that
  repository hand those changes to the queue first (`enqueue`);
- before Klaud acts on GitHub from inside a unit, the unit's changes are committed and
  awaited (`commit_unit`): a claim is durable before the dispatch it guards.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from bot.core.errors import is_transient
from bot.store.engine import Engine, Result, Statement, coalesced
from bot.store.errors import LeaseTaken

Group = list[Statement]
T = TypeVar("T")
R = TypeVar("R")
T_contra = TypeVar("T_contra", contravariant=True)
R_co = TypeVar("R_co", covariant=True)


class Merge(Protocol[T_contra, R_co]):
    """A kind of write whose items, queued together, are written by one group of statements."""

    @property
    def limit(self) -> int:
        """Items per group at most (statement parameters are bounded)."""
        ...

    def statements(self, items: Sequence[T_contra]) -> Group:
        """The statements that write every item."""
        ...

    def answers(self, items: Sequence[T_contra], results: list[Result]) -> Sequence[R_co]:
        """Each item's answer, in order, from the results of `statements(items)`."""
        ...


class _Entry:
    """A place in the queue: one group of statements, answered once committed or refused."""

    def group(self) -> Group:
        raise NotImplementedError

    def settle(self, results: list[Result]) -> None:
        raise NotImplementedError

    def fail(self, exc: BaseException) -> None:
        raise NotImplementedError

    def alone(self) -> list[_Entry]:
        """The entries to try one by one when a transaction holding this one failed."""
        return [self]

    def blocked(self) -> BaseException | None:
        """Why this entry must not commit: the group it comes after was refused."""
        return None


class _Written(_Entry):
    def __init__(
        self, statements: Group, future: asyncio.Future[list[Result]], after: asyncio.Future[list[Result]] | None
    ) -> None:
        self.statements = statements
        self.future = future
        # The group of the delivery before this one in its repository's queue: committed
        # after it or not at all, so a repository's deliveries land in their order.
        self.after = after

    def blocked(self) -> BaseException | None:
        if self.after is None or not self.after.done():
            return None
        if self.after.cancelled():
            return RuntimeError("the delivery before it was not committed")
        return self.after.exception()

    def group(self) -> Group:
        return self.statements

    def settle(self, results: list[Result]) -> None:
        if not self.future.done():
            self.future.set_result(results)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


class _Merged(_Entry, Generic[T, R]):
    def __init__(self, kind: Merge[T, R]) -> None:
        self.kind = kind
        self.items: list[T] = []
        self.futures: list[asyncio.Future[R]] = []
        self._group: Group | None = None

    def add(self, item: T) -> asyncio.Future[R]:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self.items.append(item)
        self.futures.append(future)
        return future

    @property
    def full(self) -> bool:
        return len(self.items) >= self.kind.limit

    def group(self) -> Group:
        if self._group is None:  # built once: the results are split by its length
            self._group = self.kind.statements(self.items)
        return self._group

    def settle(self, results: list[Result]) -> None:
        try:
            answers = self.kind.answers(self.items, results)
        # A bug of the kind: its callers get the error rather than waiting forever.
        except Exception as exc:  # noqa: BLE001
            self.fail(exc)
            return
        for future, answer in zip(self.futures, answers, strict=True):
            if not future.done():
                future.set_result(answer)

    def fail(self, exc: BaseException) -> None:
        for future in self.futures:
            if not future.done():
                future.set_exception(exc)

    def alone(self) -> list[_Entry]:
        if len(self.items) == 1:
            return [self]
        singles: list[_Entry] = []
        for item, future in zip(self.items, self.futures, strict=True):
            single = _Merged(self.kind)
            single.items, single.futures = [item], [future]
            singles.append(single)
        return singles


@dataclass(eq=False)
class Unit:
    """The state changes of one delivery, not yet handed to the queue."""

    task: asyncio.Task[object] | None
    statements: Group = field(default_factory=list)
    repos: set[str] = field(default_factory=set)
    # Every repository the unit wrote, kept after its statements are taken: when a commit
    # fails, these are the repositories whose memory is ahead of the store.
    touched: set[str] = field(default_factory=set)
    # Fails the transaction unless the delivery is still this process's (replicas' claims):
    # part of every group made of the unit's changes.
    fence: Statement | None = None
    # The commit of the delivery before this one in its repository's queue: every group of
    # the unit's changes commits after it or not at all.
    after: asyncio.Future[list[Result]] | None = None

    def take(self, extra: Sequence[Statement] = ()) -> Group:
        """The changes held so far and `extra`, as one group (fenced), and none held after."""
        statements, self.statements, self.repos = [*self.statements, *extra], [], set()
        if statements and self.fence is not None:
            statements.append(self.fence)
        return statements


_CURRENT: ContextVar[Unit | None] = ContextVar("klaud_unit", default=None)


class Writer:
    def __init__(self, db: Engine) -> None:
        self.db = db
        self._queue: list[_Entry] = []
        self._open: dict[int, _Merged[Any, Any]] = {}  # id(kind) -> its entry still taking items
        self._flusher: asyncio.Task[None] | None = None
        self._units: set[Unit] = set()

    # -- the queue ---------------------------------------------------------------------

    def enqueue(self, statements: Group, repos: Iterable[str] = ()) -> asyncio.Future[list[Result]]:
        """Queue one group; its future gets the statements' results once committed.

        Changes of `repos` still held by units are queued first (in memory they came first).
        """
        for unit in self._holding(repos):
            self._queue_group(unit.take(), unit.after)
        return self._queue_group(statements)

    async def write(self, statements: Group, repos: Iterable[str] = ()) -> list[Result]:
        return await self.enqueue(statements, repos)

    def enqueue_item(self, kind: Merge[T, R], item: T) -> asyncio.Future[R]:
        """Queue one item of `kind`, written with the others of its kind queued before the
        next transaction starts; the future gets the item's answer once committed.

        Only for items no other queued write depends on (a new delivery's rows): the
        group may commit before writes queued earlier in the same transaction.
        """
        entry = self._open.get(id(kind))
        if entry is None or entry.full:
            entry = _Merged(kind)
            self._open[id(kind)] = entry
            self._append(entry)
        return entry.add(item)

    def _queue_group(
        self, statements: Group, after: asyncio.Future[list[Result]] | None = None
    ) -> asyncio.Future[list[Result]]:
        future: asyncio.Future[list[Result]] = asyncio.get_running_loop().create_future()
        self._append(_Written(statements, future, after))
        return future

    def _append(self, entry: _Entry) -> None:
        self._queue.append(entry)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())

    async def flushed(self) -> None:
        """Wait for the writes already queued."""
        if self._flusher is not None:
            await self._flusher

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            self._open.clear()
            batch = self._unblocked(batch)
            if not batch:
                continue
            try:
                groups = [entry.group() for entry in batch]
                results = await self._transaction([statement for group in groups for statement in group])
            # Not swallowed: the batch rolled back (or a merged group could not be built);
            # each group is tried again on its own, and a failing one fails its callers.
            except Exception as exc:  # noqa: BLE001
                alone = [single for entry in batch for single in entry.alone()]
                if len(alone) > 1:
                    await self._one_by_one(alone)
                else:
                    batch[0].fail(exc)
                continue
            start = 0
            for entry, group in zip(batch, groups, strict=True):
                entry.settle(results[start : start + len(group)])
                start += len(group)

    @staticmethod
    def _unblocked(entries: list[_Entry]) -> list[_Entry]:
        """The entries that may commit; those whose group before was refused fail with it."""
        unblocked = []
        for entry in entries:
            if (exc := entry.blocked()) is not None:
                entry.fail(exc)
            else:
                unblocked.append(entry)
        return unblocked

    async def _one_by_one(self, entries: list[_Entry]) -> None:
        for index, entry in enumerate(entries):
            if (blocked := entry.blocked()) is not None:
                entry.fail(blocked)
                continue
            try:
                results = await self._transaction(entry.group())
            except Exception as exc:  # noqa: BLE001 - reaches the caller through its future
                entry.fail(exc)
                if is_transient(exc) and not isinstance(exc, LeaseTaken):
                    # The store is out of reach, not refusing this group: the later ones fail
                    # with it rather than commit ahead of it (a repository's deliveries commit
                    # in their order). A lease refused is this group's repository's alone.
                    for later in entries[index + 1 :]:
                        later.fail(exc)
                    return
            else:
                entry.settle(results)

    async def _transaction(self, statements: Group) -> list[Result]:
        run, positions = coalesced(self.db.dialect, statements)
        results = await self.db.transaction(run)
        return [None if position is None else results[position] for position in positions]

    # -- units -------------------------------------------------------------------------

    def begin_unit(self, fence: Statement | None = None, after: asyncio.Future[list[Result]] | None = None) -> Unit:
        """Collect the current task's state changes until `end_unit`; every group of them
        carries `fence`, and commits after `after` or not at all."""
        unit = Unit(asyncio.current_task(), fence=fence, after=after)
        _CURRENT.set(unit)
        self._units.add(unit)
        return unit

    def end_unit(self, unit: Unit, extra: Sequence[Statement]) -> asyncio.Future[list[Result]]:
        """Queue the unit's changes and `extra` (the delivery's status) as one group."""
        self._units.discard(unit)
        if _CURRENT.get() is unit:
            _CURRENT.set(None)
        return self._queue_group(unit.take(extra), unit.after)

    def current_unit(self) -> Unit | None:
        """The unit of the running task; tasks it started write on their own."""
        unit = _CURRENT.get()
        if unit is None or unit.task is not asyncio.current_task() or unit not in self._units:
            return None
        return unit

    async def apply(self, statements: Group, repos: set[str], fence: Statement | None = None) -> None:
        """Write state changes, with `fence` checked in the transaction that commits them:
        collected by the running unit (whose own fence joins it), else committed now."""
        if fence is not None:
            statements = [*statements, fence]
        unit = self.current_unit()
        if unit is None:
            await self.write(statements, repos)
            return
        for other in self._holding(repos):
            if other is not unit:
                self._queue_group(other.take(), other.after)
        unit.statements.extend(statements)
        unit.repos |= repos
        unit.touched |= repos

    async def commit_holding(self, repos: Iterable[str]) -> None:
        """Commit what units hold of `repos` (before their state is read back from the store)."""
        futures = [self._queue_group(unit.take(), unit.after) for unit in self._holding(repos)]
        if futures:
            await asyncio.gather(*futures)

    async def commit_unit(self) -> None:
        """Commit what the running unit holds, before Klaud acts on GitHub."""
        unit = self.current_unit()
        if unit is not None and unit.statements:
            await self._queue_group(unit.take(), unit.after)

    def _holding(self, repos: Iterable[str]) -> list[Unit]:
        # Units note the repositories they wrote in lowercase (`Change.repos`).
        wanted = {repo.lower() for repo in repos}
        return [unit for unit in self._units if unit.statements and not unit.repos.isdisjoint(wanted)]
