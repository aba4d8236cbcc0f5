"""The durable delivery inbox's storage: one row per webhook delivery, on either engine.

A delivery is committed before GitHub gets its 202, because GitHub does not redeliver on
its own. Writes that arrive while a transaction is running are committed together in the
next one (group commit), so a burst of deliveries costs one fsync per batch instead of one
per delivery.

With several replicas on one PostgreSQL database, any replica stores a delivery and a
replica takes work with `claim_deliveries`: the delivery becomes `processing` with its
owner and the time of the claim, so the deliveries of a replica that dies are claimed
again once that claim is old.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from bot.store.engine import Dialect, Engine, Result, Row, Statement, as_count, as_rows

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
        # orjson, as at the ack: one parser and one depth limit for a delivery's body.
        document: dict[str, Any] = orjson.loads(self.body)
        return document

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


COLUMNS = "id, event, action, repo, installation, headers, body, status, attempts, error"
INSERT = (
    "INSERT INTO deliveries (id, event, action, repo, installation, headers, body, received_at, updated_at)"
    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING"
)
SELECT_ONE = f"SELECT {COLUMNS} FROM deliveries WHERE id = ?"
SELECT_PENDING = f"SELECT {COLUMNS} FROM deliveries WHERE status = 'queued' ORDER BY seq"
UPDATE_STATUS = "UPDATE deliveries SET status = ?, attempts = ?, error = ?, updated_at = ? WHERE id = ?"
PRUNE = (
    "DELETE FROM deliveries WHERE (status = 'done' AND updated_at < ?)"
    " OR (status = 'failed' AND updated_at < ?)"
)
# The oldest unclaimed deliveries, and those whose claim is older than the reclaim time (its
# owner died); `?` 2 and 3 are a JSON array of lowercase repository names, or NULL for any.
# PostgreSQL locks the rows it picks and skips those another claimer has locked, so
# concurrent claimers never pick the same delivery and never wait for each other.
CLAIM: dict[Dialect, str] = {
    "sqlite": """
        WITH picked AS (
            SELECT seq FROM deliveries
            WHERE (status = 'queued' OR (status = 'processing' AND claimed_at < {now} - ?))
              AND (? IS NULL OR lower(repo) IN (SELECT value FROM json_each(?)))
            ORDER BY seq LIMIT ?
        )
        UPDATE deliveries SET status = 'processing', claimed_by = ?, claimed_at = {now}
        WHERE seq IN (SELECT seq FROM picked)
        RETURNING {columns}, seq""",
    "postgresql": """
        WITH picked AS MATERIALIZED (
            SELECT seq FROM deliveries
            WHERE (status = 'queued' OR (status = 'processing' AND claimed_at < {now} - ?))
              AND (?::text IS NULL OR lower(repo) IN (SELECT json_array_elements_text(?::json)))
            ORDER BY seq LIMIT ?
            FOR UPDATE SKIP LOCKED
        )
        UPDATE deliveries SET status = 'processing', claimed_by = ?, claimed_at = {now}
        WHERE seq IN (SELECT seq FROM picked)
        RETURNING {columns}, seq""",
}


class DeliveryStore:
    def __init__(self, db: Engine) -> None:
        self.db = db
        self._claim = CLAIM[db.dialect].format(now=db.now_sql, columns=COLUMNS)
        self._writes: list[tuple[Statement, asyncio.Future[Result]]] = []
        self._writer: asyncio.Task[None] | None = None

    @property
    def is_open(self) -> bool:
        return self.db.is_open

    async def open(self) -> None:
        await self.db.open()

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
        return as_count(await self._write(Statement(INSERT, row))) == 1

    async def get(self, delivery_id: str) -> Delivery | None:
        rows = await self.db.fetch(SELECT_ONE, delivery_id)
        return _row_to_delivery(rows[0]) if rows else None

    async def prune(self, *, done_before: float, failed_before: float) -> int:
        """Delete finished deliveries last updated before the given epoch times.

        GitHub redelivers on request for a few days only, so duplicate detection needs
        no older ids; failed deliveries are kept longer for people to inspect.
        """
        return as_count(await self._write(Statement(PRUNE, (done_before, failed_before))))

    async def pending(self) -> list[Delivery]:
        """Every delivery acknowledged but not finished (nor claimed), in arrival order."""
        return [_row_to_delivery(row) for row in await self.db.fetch(SELECT_PENDING)]

    async def save_status(self, delivery: Delivery) -> None:
        values = (delivery.status, delivery.attempts, delivery.error, time.time(), delivery.id)
        await self._write(Statement(UPDATE_STATUS, values))

    async def claim_deliveries(
        self, owner: str, repos: set[str] | None, limit: int, *, reclaim_after_seconds: float = 300.0
    ) -> list[Delivery]:
        """Mark up to `limit` deliveries `processing` for `owner` and return them, oldest first.

        Takes queued deliveries, and deliveries whose claim is older than
        `reclaim_after_seconds` (their owner crashed). `repos` limits the claim to those
        repositories (any case); None claims any delivery, with or without a repository.
        """
        wanted = None if repos is None else json.dumps(sorted(repo.lower() for repo in repos))
        args = (reclaim_after_seconds, wanted, wanted, limit, owner)
        results = await self.db.transaction([Statement(self._claim, args, rows=True)])
        rows = sorted(as_rows(results[0]), key=lambda row: row[-1])
        return [_row_to_delivery(row) for row in rows]

    async def flushed(self) -> None:
        """Wait for the writes already asked for."""
        if self._writer is not None:
            await self._writer

    async def _write(self, statement: Statement) -> Result:
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._writes.append((statement, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._flush_writes())
        return await future

    async def _flush_writes(self) -> None:
        while self._writes:
            batch, self._writes = self._writes, []
            try:
                results = await self.db.transaction([statement for statement, _ in batch])
            # Not swallowed: the batch rolled back; each write is tried again on its own, so
            # one row the store refuses fails only its caller, as "not stored".
            except Exception as exc:  # noqa: BLE001
                if len(batch) > 1:
                    await self._one_by_one(batch)
                elif not batch[0][1].done():
                    batch[0][1].set_exception(exc)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)

    async def _one_by_one(self, batch: list[tuple[Statement, asyncio.Future[Result]]]) -> None:
        for statement, future in batch:
            try:
                [result] = await self.db.transaction([statement])
            except Exception as exc:  # noqa: BLE001 - reaches the caller through its future
                if not future.done():
                    future.set_exception(exc)
            else:
                if not future.done():
                    future.set_result(result)


def _row_to_delivery(row: Row) -> Delivery:
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
