"""The durable delivery inbox's storage: one row per webhook delivery.

A delivery is committed before GitHub gets its 202, because GitHub does not redeliver on
its own. Writes that arrive while a transaction is running are committed together in the
next one (group commit), so a burst of deliveries costs one fsync per batch instead of one
per delivery.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from bot.store.db import Database

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
    ) -> Delivery:
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


class DeliveryStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self._writes: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]] = []
        self._writer: asyncio.Task[None] | None = None

    @property
    def is_open(self) -> bool:
        return self.db.is_open

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

        return bool(await self._write(insert))

    async def get(self, delivery_id: str) -> Delivery | None:
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

    async def pending(self) -> list[Delivery]:
        """Every delivery acknowledged but not finished, in arrival order."""

        def pending(conn: sqlite3.Connection) -> list[Delivery]:
            rows = conn.execute(
                "SELECT id, event, action, repo, installation, headers, body, status,"
                " attempts, error FROM deliveries"
                " WHERE status = 'queued' ORDER BY seq"
            ).fetchall()
            return [_row_to_delivery(row) for row in rows]

        return await self.db.run(pending)

    async def save_status(self, delivery: Delivery) -> None:
        values = (delivery.status, delivery.attempts, delivery.error, time.time(), delivery.id)

        def update(conn: sqlite3.Connection) -> None:
            conn.execute(
                "UPDATE deliveries SET status = ?, attempts = ?, error = ?, updated_at = ?"
                " WHERE id = ?",
                values,
            )

        await self._write(update)

    async def flushed(self) -> None:
        """Wait for the writes already asked for."""
        if self._writer is not None:
            await self._writer

    async def _write(self, op: Callable[[sqlite3.Connection], Any]) -> Any:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._writes.append((op, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._flush_writes())
        return await future

    async def _flush_writes(self) -> None:
        while self._writes:
            batch, self._writes = self._writes, []
            ops = [op for op, _ in batch]
            try:
                results = await self.db.transaction(partial(_run_all, ops))
            except sqlite3.Error as exc:
                # The whole batch rolled back: every caller learns it was not stored.
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), result in zip(batch, results):
                if not future.done():
                    future.set_result(result)


def _run_all(ops: list[Callable[[sqlite3.Connection], Any]], conn: sqlite3.Connection) -> list[Any]:
    return [op(conn) for op in ops]


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
