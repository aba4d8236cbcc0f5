"""The durable delivery inbox and the worker that drains it.

A delivery is committed to SQLite before GitHub gets its 202, because GitHub does not
redeliver on its own. Puts that arrive while a transaction is running are committed
together in the next one (group commit), so a burst of deliveries costs one fsync per
batch instead of one per delivery.

The worker processes the deliveries of one repository strictly in arrival order and
different repositories concurrently. A failing delivery stays at the head of its
repository's queue while it waits for its retry, so later events of that repository never
overtake it; after `max_attempts` (or at once, for a permanent error) it is marked
`failed` with the reason and the queue moves on.
"""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import structlog

from bot.core.errors import is_permanent
from bot.metrics import DELIVERIES, INBOX_BACKLOG, PROCESSING_SECONDS
from bot.store.db import Database

log = structlog.get_logger("klaud.inbox")

INBOX_SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    event TEXT NOT NULL,
    action TEXT,
    repo TEXT,
    installation INTEGER,
    headers TEXT NOT NULL,
    body BLOB NOT NULL,
    status TEXT NOT NULL DEFAULT 'queued',
    attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    received_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS deliveries_open ON deliveries(status)
    WHERE status = 'queued';
"""

# Headers worth keeping for processing and audits; the signature is not among them.
KEPT_HEADERS = (
    "X-GitHub-Event",
    "X-GitHub-Delivery",
    "X-GitHub-Hook-ID",
    "X-GitHub-Hook-Installation-Target-Type",
    "X-GitHub-Hook-Installation-Target-ID",
    "User-Agent",
)


@dataclass(slots=True)
class Delivery:
    id: str
    event: str
    body: bytes
    action: str | None = None
    repo: str | None = None
    installation: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    status: str = "queued"
    attempts: int = 0
    error: str | None = None

    @classmethod
    def from_payload(
        cls, delivery_id: str, event: str, body: bytes, payload: dict[str, Any], headers: dict[str, str]
    ) -> "Delivery":
        repository = payload.get("repository")
        installation = payload.get("installation")
        action = payload.get("action")
        return cls(
            id=delivery_id,
            event=event,
            body=body,
            action=action if isinstance(action, str) else None,
            repo=repository.get("full_name") if isinstance(repository, dict) else None,
            installation=installation.get("id") if isinstance(installation, dict) else None,
            headers=headers,
        )

    def payload(self) -> dict[str, Any]:
        return json.loads(self.body)

    @property
    def ordering_key(self) -> str:
        # Deliveries without a repository (installation events) are ordered per installation.
        if self.repo:
            return f"repo:{self.repo.lower()}"
        return f"installation:{self.installation}"

    def status_document(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "event": self.event,
            "action": self.action,
            "status": self.status,
            "attempts": self.attempts,
            "error": self.error,
        }


Handler = Callable[[Delivery], Awaitable[None]]


class Inbox:
    def __init__(
        self,
        db: Database,
        handler: Handler,
        *,
        max_attempts: int = 8,
        base_delay: float = 2.0,
        max_delay: float = 600.0,
        concurrency: int = 8,
        backlog_limit: int = 10_000,
        handler_timeout: float = 600.0,
    ) -> None:
        self.db = db
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
        self._writes: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._backlog = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # -- storing -----------------------------------------------------------------------

    async def open(self) -> None:
        await self.db.open(INBOX_SCHEMA)

    async def put(self, delivery: Delivery) -> bool:
        """Commit `delivery`; False when its id is already stored (a redelivery)."""
        now = time.time()
        row = (
            delivery.id,
            delivery.event,
            delivery.action,
            delivery.repo,
            delivery.installation,
            json.dumps(delivery.headers),
            delivery.body,
            now,
            now,
        )

        def insert(conn: sqlite3.Connection) -> bool:
            cur = conn.execute(
                "INSERT OR IGNORE INTO deliveries (id, event, action, repo, installation,"
                " headers, body, received_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?)",
                row,
            )
            return cur.rowcount == 1

        stored = await self._write(insert)
        if stored:
            self._enqueue(delivery)
        return stored

    async def get(self, delivery_id: str) -> Delivery | None:
        active = self._running.get(delivery_id)
        if active is not None:
            return active

        def select(conn: sqlite3.Connection) -> Delivery | None:
            row = conn.execute(
                "SELECT id, event, action, repo, installation, headers, body, status,"
                " attempts, error FROM deliveries WHERE id = ?",
                (delivery_id,),
            ).fetchone()
            return _row_to_delivery(row) if row else None

        return await self.db.run(select)

    async def prune(self, *, done_before: float, failed_before: float) -> int:
        """Delete finished deliveries last updated before the given epoch times.

        GitHub redelivers on request for a few days only, so duplicate detection needs
        no older ids; failed deliveries are kept longer for people to inspect.
        """

        def delete(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "DELETE FROM deliveries WHERE (status = 'done' AND updated_at < ?)"
                " OR (status = 'failed' AND updated_at < ?)",
                (done_before, failed_before),
            )
            return cur.rowcount

        return await self._write(delete)

    @property
    def backlog(self) -> int:
        return self._backlog

    @property
    def ready(self) -> bool:
        return self.db.is_open and self._backlog < self.backlog_limit

    async def _write(self, op: Callable[[sqlite3.Connection], Any]) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._writes.append((op, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._flush_writes())
        return await future

    async def _flush_writes(self) -> None:
        while self._writes:
            batch, self._writes = self._writes, []

            def run_batch(conn: sqlite3.Connection) -> list[Any]:
                return [op(conn) for op, _ in batch]

            try:
                results = await self.db.transaction(run_batch)
            except sqlite3.Error as exc:
                # The whole batch rolled back: every caller learns it was not stored.
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)

    # -- draining ----------------------------------------------------------------------

    async def start(self) -> int:
        """Queue every delivery acknowledged but not finished, then start draining."""

        def pending(conn: sqlite3.Connection) -> list[Delivery]:
            rows = conn.execute(
                "SELECT id, event, action, repo, installation, headers, body, status,"
                " attempts, error FROM deliveries"
                " WHERE status = 'queued' ORDER BY seq"
            ).fetchall()
            return [_row_to_delivery(row) for row in rows]

        recovered = await self.db.run(pending)
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
            except asyncio.TimeoutError:
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
                PROCESSING_SECONDS.labels(delivery.event).observe(time.perf_counter() - started)
                delivery.status, delivery.error = "done", None
                await self._save_status(delivery)
                DELIVERIES.labels(delivery.event, "done").inc()
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
            DELIVERIES.labels(delivery.event, "failed").inc()
            log.warning(
                "delivery.failed",
                attempts=delivery.attempts,
                error=delivery.error,
                permanent=is_permanent(exc),
                exc_info=not is_permanent(exc),
            )
            self._finish(key)
            return
        delay = self.retry_delay(delivery.attempts)
        delivery.status = "queued"
        await self._save_status(delivery)
        self._due[key] = asyncio.get_running_loop().time() + delay
        DELIVERIES.labels(delivery.event, "retry").inc()
        log.warning(
            "delivery.retry",
            attempts=delivery.attempts,
            retry_in_s=round(delay, 3),
            error=delivery.error,
            exc_info=True,
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
        values = (delivery.status, delivery.attempts, delivery.error, time.time(), delivery.id)

        def update(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE deliveries SET status = ?, attempts = ?, error = ?, updated_at = ?"
                " WHERE id = ?",
                values,
            )

        await self._write(update)

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
            done, pending = await asyncio.wait(running, timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
                log.warning("inbox.stop.cancelled", deliveries=len(pending))
        if self._writer is not None:
            await self._writer


def _row_to_delivery(row: tuple[Any, ...]) -> Delivery:
    return Delivery(
        id=row[0],
        event=row[1],
        action=row[2],
        repo=row[3],
        installation=row[4],
        headers=json.loads(row[5]),
        body=bytes(row[6]),
        status=row[7],
        attempts=row[8],
        error=row[9],
    )
