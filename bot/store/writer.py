"""The one queue of writes to the store, committed in the order they were made in memory.

Writes that arrive while a transaction is running are committed together in the next one
(group commit), so a burst costs one fsync per batch instead of one per write. A write is a
*group* of statements that commit together or not at all; when a batch fails, each group is
tried again in a transaction of its own, so one row the store refuses fails only its caller.

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

from bot.store.engine import Engine, Result, Statement

Group = list[Statement]


@dataclass(eq=False)
class Unit:
    """The state changes of one delivery, not yet handed to the queue."""

    task: asyncio.Task[object] | None
    statements: Group = field(default_factory=list)
    repos: set[str] = field(default_factory=set)

    def take(self) -> Group:
        statements, self.statements, self.repos = self.statements, [], set()
        return statements


_CURRENT: ContextVar[Unit | None] = ContextVar("klaud_unit", default=None)


class Writer:
    def __init__(self, db: Engine) -> None:
        self.db = db
        self._queue: list[tuple[Group, asyncio.Future[list[Result]]]] = []
        self._flusher: asyncio.Task[None] | None = None
        self._units: set[Unit] = set()

    # -- the queue ---------------------------------------------------------------------

    def enqueue(self, statements: Group, repos: Iterable[str] = ()) -> asyncio.Future[list[Result]]:
        """Queue one group; its future gets the statements' results once committed.

        Changes of `repos` still held by units are queued first (in memory they came first).
        """
        for unit in self._holding(repos):
            self._queue_group(unit.take())
        return self._queue_group(statements)

    async def write(self, statements: Group, repos: Iterable[str] = ()) -> list[Result]:
        return await self.enqueue(statements, repos)

    def _queue_group(self, statements: Group) -> asyncio.Future[list[Result]]:
        future: asyncio.Future[list[Result]] = asyncio.get_running_loop().create_future()
        self._queue.append((statements, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        return future

    def queued(self) -> int:
        """Groups waiting for the next transaction, plus one while a transaction runs."""
        return len(self._queue) + (self._flusher is not None and not self._flusher.done())

    async def flushed(self) -> None:
        """Wait for the writes already queued."""
        if self._flusher is not None:
            await self._flusher

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue, []
            statements = [statement for group, _ in batch for statement in group]
            try:
                results = await self.db.transaction(statements)
            # Not swallowed: the batch rolled back; each group is tried again on its own.
            except Exception as exc:  # noqa: BLE001
                if len(batch) > 1:
                    await self._one_by_one(batch)
                elif not batch[0][1].done():
                    batch[0][1].set_exception(exc)
                continue
            start = 0
            for group, future in batch:
                if not future.done():
                    future.set_result(results[start : start + len(group)])
                start += len(group)

    async def _one_by_one(self, batch: list[tuple[Group, asyncio.Future[list[Result]]]]) -> None:
        for group, future in batch:
            try:
                results = await self.db.transaction(group)
            except Exception as exc:  # noqa: BLE001 - reaches the caller through its future
                if not future.done():
                    future.set_exception(exc)
            else:
                if not future.done():
                    future.set_result(results)

    # -- units -------------------------------------------------------------------------

    def begin_unit(self) -> Unit:
        """Collect the current task's state changes until `end_unit`."""
        unit = Unit(asyncio.current_task())
        _CURRENT.set(unit)
        self._units.add(unit)
        return unit

    def end_unit(self, unit: Unit, extra: Sequence[Statement]) -> asyncio.Future[list[Result]]:
        """Queue the unit's changes and `extra` (the delivery's status) as one group."""
        self._units.discard(unit)
        if _CURRENT.get() is unit:
            _CURRENT.set(None)
        return self._queue_group([*unit.take(), *extra])

    def current_unit(self) -> Unit | None:
        """The unit of the running task; tasks it started write on their own."""
        unit = _CURRENT.get()
        if unit is None or unit.task is not asyncio.current_task() or unit not in self._units:
            return None
        return unit

    async def apply(self, statements: Group, repos: set[str]) -> None:
        """Write state changes: collected by the running unit, else committed now."""
        unit = self.current_unit()
        if unit is None:
            await self.write(statements, repos)
            return
        for other in self._holding(repos):
            if other is not unit:
                self._queue_group(other.take())
        unit.statements.extend(statements)
        unit.repos |= repos

    async def commit_unit(self) -> None:
        """Commit what the running unit holds, before Klaud acts on GitHub."""
        unit = self.current_unit()
        if unit is not None and unit.statements:
            await self._queue_group(unit.take())

    def _holding(self, repos: Iterable[str]) -> list[Unit]:
        wanted = set(repos)
        return [unit for unit in self._units if unit.statements and not unit.repos.isdisjoint(wanted)]
