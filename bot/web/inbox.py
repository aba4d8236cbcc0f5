"""The durable delivery inbox and the worker that drains it.

A delivery is committed (`bot.store.deliveries`) before GitHub gets its 202, because GitHub
does not redeliver on its own; then it is queued here.

The worker processes the deliveries of one repository strictly in arrival order and
different repositories concurrently. A failing delivery stays at the head of its
repository's queue while it waits for its retry, so later events of that repository never
overtake it; after `max_attempts` (or at once, for a permanent error) it is marked
`failed` with the reason and the queue moves on.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable

import structlog

from bot.core.errors import is_permanent
from bot.metrics import DELIVERIES, INBOX_BACKLOG, PROCESSING_SECONDS
from bot.store.deliveries import Delivery, DeliveryStore
from bot.web.events import event_label

log = structlog.get_logger("klaud.inbox")

Handler = Callable[[Delivery], Awaitable[None]]


class Inbox:
    def __init__(
        self,
        store: DeliveryStore,
        handler: Handler,
        *,
        max_attempts: int = 8,
        base_delay: float = 2.0,
        max_delay: float = 600.0,
        concurrency: int = 8,
        backlog_limit: int = 10_000,
        handler_timeout: float = 600.0,
    ) -> None:
        self.store = store
        self.handler = handler
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.concurrency = concurrency
        self.backlog_limit = backlog_limit
        self.handler_timeout = handler_timeout
        self._queues: dict[str, deque[Delivery]] = {}
        self._due: dict[str, float] = {}
        self._active: dict[str, asyncio.Task[None]] = {}
        self._running: dict[str, Delivery] = {}
        self._wake = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._stopping = False
        self._backlog = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # -- storing -----------------------------------------------------------------------

    async def open(self) -> None:
        await self.store.open()

    async def put(self, delivery: Delivery) -> bool:
        """Commit `delivery` and queue it; False when its id is already stored (a redelivery)."""
        stored = await self.store.put(delivery)
        if stored:
            self._enqueue(delivery)
        return stored

    async def get(self, delivery_id: str) -> Delivery | None:
        return self._running.get(delivery_id) or await self.store.get(delivery_id)

    async def prune(self, *, done_before: float, failed_before: float) -> int:
        return await self.store.prune(done_before=done_before, failed_before=failed_before)

    @property
    def backlog(self) -> int:
        return self._backlog

    @property
    def ready(self) -> bool:
        return self.store.is_open and self._backlog < self.backlog_limit

    # -- draining ----------------------------------------------------------------------

    async def start(self) -> int:
        """Queue every delivery acknowledged but not finished, then start draining."""

        recovered = await self.store.pending()
        for delivery in recovered:
            delivery.status = "queued"
            self._enqueue(delivery)
        self._stopping = False
        self._runner = asyncio.create_task(self._run(), name="klaud-inbox")
        if recovered:
            log.info("inbox.recovered", deliveries=len(recovered))
        return len(recovered)

    def _enqueue(self, delivery: Delivery) -> None:
        self._queues.setdefault(delivery.ordering_key, deque()).append(delivery)
        self._set_backlog(self._backlog + 1)
        self._wake.set()

    def _set_backlog(self, value: int) -> None:
        self._backlog = value
        INBOX_BACKLOG.set(value)
        if value == 0:
            self._idle.set()
        else:
            self._idle.clear()

    async def drained(self) -> None:
        """Wait until every queued delivery is done or failed (tests and benchmarks)."""
        await self._idle.wait()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            self._wake.clear()
            next_due = self._launch_ready(loop.time())
            timeout = None if next_due is None else max(0.0, next_due - loop.time())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass

    def _launch_ready(self, now: float) -> float | None:
        """Start the head delivery of every idle, due repository queue; return the next due time."""
        next_due: float | None = None
        for key in list(self._queues):
            queue = self._queues[key]
            if not queue:
                del self._queues[key]
                self._due.pop(key, None)
                continue
            if key in self._active:
                continue
            due = self._due.get(key, 0.0)
            if due > now:
                next_due = due if next_due is None else min(next_due, due)
                continue
            if len(self._active) >= self.concurrency:
                break
            task = asyncio.create_task(self._process(key, queue[0]))
            self._active[key] = task
            self._running[queue[0].id] = queue[0]
        return next_due

    async def _process(self, key: str, delivery: Delivery) -> None:
        structlog.contextvars.bind_contextvars(
            delivery_id=delivery.id,
            github_event=delivery.event,
            action=delivery.action,
            repository=delivery.repo,
            installation=delivery.installation,
        )
        try:
            # `processing` lives in memory only: after a crash an unfinished delivery is
            # still `queued` in the store and runs again, which is all the state must say.
            delivery.attempts += 1
            delivery.status = "processing"
            started = time.perf_counter()
            try:
                await asyncio.wait_for(self.handler(delivery), self.handler_timeout)
            except asyncio.CancelledError:
                raise
            # The worker is the boundary every handler error reaches: it is logged with its
            # traceback and recorded on the delivery, then retried or marked failed.
            except Exception as exc:  # noqa: BLE001
                await self._handle_error(key, delivery, exc)
            else:
                PROCESSING_SECONDS.labels(event_label(delivery.event)).observe(time.perf_counter() - started)
                delivery.status, delivery.error = "done", None
                await self._save_status(delivery)
                DELIVERIES.labels(event_label(delivery.event), "done").inc()
                log.info("delivery.processed", attempts=delivery.attempts)
                self._finish(key)
        finally:
            self._active.pop(key, None)
            self._running.pop(delivery.id, None)
            structlog.contextvars.clear_contextvars()
            self._wake.set()

    async def _handle_error(self, key: str, delivery: Delivery, exc: Exception) -> None:
        delivery.error = f"{type(exc).__name__}: {exc}"[:2000]
        if is_permanent(exc) or delivery.attempts >= self.max_attempts:
            delivery.status = "failed"
            await self._save_status(delivery)
            DELIVERIES.labels(event_label(delivery.event), "failed").inc()
            log.warning(
                "delivery.failed",
                attempts=delivery.attempts,
                error=delivery.error,
                permanent=is_permanent(exc),
                exc_info=None if is_permanent(exc) else exc,
            )
            self._finish(key)
            return
        delay = self.retry_delay(delivery.attempts)
        delivery.status = "queued"
        await self._save_status(delivery)
        self._due[key] = asyncio.get_running_loop().time() + delay
        DELIVERIES.labels(event_label(delivery.event), "retry").inc()
        log.warning(
            "delivery.retry",
            attempts=delivery.attempts,
            retry_in_s=round(delay, 3),
            error=delivery.error,
            exc_info=exc,
        )

    def retry_delay(self, attempts: int) -> float:
        """Exponential backoff with full jitter in its upper half."""
        ceiling = min(self.max_delay, self.base_delay * 2 ** (attempts - 1))
        return random.uniform(ceiling / 2, ceiling)

    def _finish(self, key: str) -> None:
        queue = self._queues.get(key)
        if queue:
            queue.popleft()
        self._due.pop(key, None)
        self._set_backlog(self._backlog - 1)

    async def _save_status(self, delivery: Delivery) -> None:
        await self.store.save_status(delivery)

    async def stop(self, grace: float = 10.0) -> None:
        """Stop taking work, let running handlers finish within `grace` seconds.

        Handlers still running after that are cancelled; their deliveries stay
        `queued` in the store and run again at the next start.
        """
        self._stopping = True
        self._wake.set()
        if self._runner is not None:
            await self._runner
        running = list(self._active.values())
        if running:
            _, pending = await asyncio.wait(running, timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
                log.warning("inbox.stop.cancelled", deliveries=len(pending))
        await self.store.flushed()
