"""Coalescing bursts of changes into one flush per key (check runs, the dashboard).

A reconcile or a wave touching many candidates marks many keys within milliseconds; each
key is flushed once per burst, so a check run costs one PATCH however many changes led to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

import structlog

log = structlog.get_logger(__name__)

K = TypeVar("K", bound=Hashable)


class Coalescer(Generic[K]):
    """Runs `flush(key)` once per burst of `mark(key)` calls.

    The first mark of a key starts a `delay_seconds` window; marks inside it add nothing.
    A mark while that key's flush runs asks for exactly one more flush, a window after the
    running one ends, so the last change is never lost. Exceptions listed in `errors` are
    logged with the key and the key stays usable; any other exception (a bug) ends that
    key's task and is logged at once with its traceback: nobody awaits these tasks, so
    asyncio would report it only when the task is collected, or never.
    """

    def __init__(
        self,
        flush: Callable[[K], Awaitable[None]],
        delay_seconds: float = 3.0,
        *,
        errors: tuple[type[BaseException], ...] = (),
    ) -> None:
        self._flush = flush
        self._delay = delay_seconds
        self._errors = errors
        self._tasks: dict[K, asyncio.Task[None]] = {}
        self._running: set[K] = set()
        self._again: set[K] = set()
        self._hurry = asyncio.Event()  # set while settling: windows end at once
        self._closed = False

    @property
    def pending(self) -> frozenset[K]:
        """Keys with a flush scheduled or running."""
        return frozenset(self._tasks)

    @property
    def running(self) -> frozenset[K]:
        """Keys whose flush runs now (their window is over)."""
        return frozenset(self._running)

    def mark(self, key: K) -> None:
        if self._closed:
            raise RuntimeError("Coalescer is closed")
        if key not in self._tasks:
            task = asyncio.get_running_loop().create_task(self._run(key), name=f"check-flush:{key}")
            task.add_done_callback(_report_crash)
            self._tasks[key] = task
        elif key in self._running:
            self._again.add(key)

    async def settle(self) -> None:
        """Flush every pending key now and wait until none is left."""
        self._hurry.set()
        try:
            while self._tasks:
                await asyncio.wait(list(self._tasks.values()))
        finally:
            if not self._closed:
                self._hurry.clear()

    async def close(self, grace: float | None = None) -> None:
        """For shutdown: flush what is pending, then refuse new marks. Flushes still running
        after `grace` seconds (GitHub slow to answer, each request retried) are cancelled:
        a stop must end before the container's grace is out and it is killed mid-write.
        What they did not publish, the next change or light reconcile renders again."""
        self._closed = True
        try:
            async with asyncio.timeout(grace):
                await self.settle()
        except TimeoutError:
            unfinished = list(self._tasks.values())
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)
            log.warning("coalescer.flushes_cancelled", count=len(unfinished), grace_s=grace)

    async def _run(self, key: K) -> None:
        try:
            while True:
                await self._window()
                self._running.add(key)
                try:
                    await self._flush(key)
                except self._errors as exc:
                    log.warning("check_flush_failed", key=str(key), error=repr(exc))
                finally:
                    self._running.discard(key)
                if key not in self._again:
                    return
                self._again.discard(key)
        finally:
            self._tasks.pop(key, None)
            self._again.discard(key)

    async def _window(self) -> None:
        if self._hurry.is_set():
            return
        try:
            async with asyncio.timeout(self._delay):
                await self._hurry.wait()
        except TimeoutError:
            pass  # the window ended normally


def _report_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("flush_crashed", task=task.get_name(), exc_info=exc)
