"""One SQLite connection, owned by one thread.

sqlite3 calls block, so every statement runs on a dedicated worker thread and the event
loop only awaits it. WAL lets readers (the HTTP API) proceed while the worker writes, and
`synchronous=FULL` makes a committed transaction survive a crash of the process or the
machine: the inbox acknowledges a delivery only after its commit returns.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class Database:
    def __init__(self, path: str) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="klaud-db")
        self._conn: sqlite3.Connection | None = None

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    async def open(self, schema: str) -> None:
        await self.run_sync(self._open, schema)

    def _open(self, schema: str) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.executescript(schema)
        self._conn = conn

    async def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(conn)` on the database thread."""
        return await self.run_sync(self._call, fn)

    async def transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn(conn)` inside one transaction; it commits, or rolls back on error."""
        return await self.run_sync(self._in_transaction, fn)

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            raise RuntimeError("database is closed")
        return fn(self._conn)

    def _in_transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            raise RuntimeError("database is closed")
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return result

    async def close(self) -> None:
        if self._conn is not None:
            await self.run_sync(self._close)
        self._executor.shutdown(wait=True)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
