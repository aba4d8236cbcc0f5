"""The SQLite engine: one connection, owned by one thread, on a file only this process uses
(and a second one on a thread of its own that only checkpoints the write-ahead log).

sqlite3 calls block, so every statement runs on a dedicated worker thread and the event
loop only awaits it. WAL lets readers (the HTTP API) proceed while the worker writes, and
`synchronous=FULL` makes a committed transaction survive a crash of the process or the
machine: the inbox acknowledges a delivery only after its commit returns.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar

import structlog

from bot.store.engine import (
    Compressed,
    Dialect,
    Result,
    Row,
    Statement,
    compress,
)
from bot.store.lockfile import PidLock
from bot.store.migrations import (
    CURRENT_VERSION,
    LATEST,
    RECORD_VERSION,
    VERSION_TABLE,
    Migration,
    failed,
    report_left,
    to_apply,
)

T = TypeVar("T")

sqlite3.register_adapter(Compressed, compress)
log = structlog.get_logger("klaud.store")

MEMORY = ":memory:"
# Transactions between two checkpoints of the write-ahead log (`Checkpointer`). Every 8 or
# every 128 acknowledged no more a second (16 interleaved rounds of bench/ingest.py's load
# each, geometric means 0.97x and 0.98x of 32).
CHECKPOINT_EVERY = 32


class Checkpointer:
    """Copies the write-ahead log back into the database file on a thread of its own.

    SQLite's own checkpoint runs inside the COMMIT that takes the log past 1,000 pages: that
    commit then writes and fsyncs ~4 MB while every delivery of its burst waits for its 202
    (5-6 ms instead of 0.7 with bench/ingest.py's bursts). A PASSIVE checkpoint on a second
    connection runs beside the writer and never blocks it; the log restarts from its
    beginning at the first commit after a checkpoint that copied it all."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="klaud-db-checkpoint")
        self._conn: sqlite3.Connection | None = None
        self._commits = 0
        self._running: asyncio.Future[None] | None = None
        self._closed = False

    def committed(self) -> None:
        """Count a commit; every CHECKPOINT_EVERY of them, start a checkpoint unless one runs."""
        self._commits += 1
        if self._closed or self._commits < CHECKPOINT_EVERY:
            return
        if self._running is not None and not self._running.done():
            return
        self._commits = 0
        self._running = asyncio.get_running_loop().run_in_executor(self._executor, self._checkpoint)
        self._running.add_done_callback(_report_failed_checkpoint)

    def _checkpoint(self) -> None:
        if self._conn is None:
            self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    async def close(self) -> None:
        """Wait for a running checkpoint and close; commits after this start none (a
        transaction that ends while the database closes still answers)."""
        self._closed = True
        if self._running is not None:
            await asyncio.wait([self._running])
        if self._conn is not None:  # no checkpoint runs: its thread is done with it
            await asyncio.get_running_loop().run_in_executor(self._executor, self._close)
        self._executor.shutdown(wait=True)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _report_failed_checkpoint(done: asyncio.Future[None]) -> None:
    # The log then grows until a later checkpoint succeeds (every CHECKPOINT_EVERY commits).
    if not done.cancelled() and isinstance(done.exception(), sqlite3.Error):
        log.warning("store.checkpoint_failed", error=str(done.exception()))


class Database:
    dialect: Dialect = "sqlite"
    now_sql = "((julianday('now') - 2440587.5) * 86400.0)"

    def __init__(self, path: str) -> None:
        self.path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="klaud-db")
        self._conn: sqlite3.Connection | None = None
        self._lock = None if path == MEMORY else PidLock(path)
        self._checkpoints = None if path == MEMORY else Checkpointer(path)

    @property
    def is_open(self) -> bool:
        return self._conn is not None

    async def open(self, schema: str = "") -> None:
        """Take the file's lock and bring its schema to the latest version.

        Raises StoreLocked when another process (or `Database`) has the file. `schema` is
        DDL run afterwards, for callers written before migrations, which pass the records
        table's DDL (`records.STATE_SCHEMA`) that migration 1 has already created.
        """
        if self._conn is None:
            await self._run_sync(self._open)
        if schema:
            await self._run_sync(self._connection().executescript, schema)

    def _open(self) -> None:
        if self._conn is not None:  # opened by a call queued before this one (the stores share it)
            return
        with ExitStack() as undo:
            if self._lock is not None:
                self._lock.acquire()
                undo.callback(self._lock.release)
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            undo.callback(conn.close)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA busy_timeout=5000")
            if self._checkpoints is not None:
                conn.execute("PRAGMA wal_autocheckpoint=0")  # the Checkpointer's thread does it
            self._migrate(conn)
            undo.pop_all()
        self._conn = conn

    def _migrate(self, conn: sqlite3.Connection) -> None:
        with _transaction(conn, "BEGIN EXCLUSIVE"):
            unversioned = not _has_table(conn, "schema_version") and (
                _has_table(conn, "records") or _has_table(conn, "deliveries")
            )
            conn.execute(VERSION_TABLE["sqlite"])
            current = conn.execute(CURRENT_VERSION).fetchone()[0]
            migrations = to_apply(current, self.path)
            left = [(migration, self._apply(conn, migration)) for migration in migrations]
        if migrations:
            log.info(
                "store.migrated", engine="sqlite", path=self.path, from_version=current, to_version=LATEST,
                adopted_unversioned=unversioned,
            )
        for migration, rows in left:  # said once the upgrade is committed
            report_left(migration, self.path, rows)

    def _apply(self, conn: sqlite3.Connection, migration: Migration) -> list[Row]:
        """Run `migration` in the open transaction; the records it left behind."""
        try:
            for sql in migration.sqlite:
                conn.execute(sql)
            conn.execute(RECORD_VERSION, (migration.version, migration.name, time.time()))
            return conn.execute(migration.left).fetchall() if migration.left else []
        except sqlite3.Error as exc:
            raise failed(migration, self.path, exc) from exc

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        return await self._run_sync(self._fetch, sql, args)

    def _fetch(self, sql: str, args: Sequence[Any]) -> list[Row]:
        return self._connection().execute(sql, args).fetchall()

    async def transaction(self, statements: Sequence[Statement]) -> list[Result]:
        results = await self._run_sync(self._transaction, statements)
        if self._checkpoints is not None:
            self._checkpoints.committed()
        return results

    def _transaction(self, statements: Sequence[Statement]) -> list[Result]:
        conn = self._connection()
        with _transaction(conn, "BEGIN IMMEDIATE"):
            return [_execute(conn, statement) for statement in statements]

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError("database is closed")
        return self._conn

    async def _run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    def free_bytes(self) -> int | None:
        if self.path == MEMORY:
            return None
        return shutil.disk_usage(os.path.dirname(os.path.abspath(self.path))).free

    async def close(self) -> None:
        if self._checkpoints is not None:
            await self._checkpoints.close()
        if self._conn is not None:
            await self._run_sync(self._close)
        self._executor.shutdown(wait=True)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
            if self._lock is not None:
                self._lock.release()


@contextmanager
def _transaction(conn: sqlite3.Connection, begin: str) -> Iterator[None]:
    conn.execute(begin)
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


def _execute(conn: sqlite3.Connection, statement: Statement) -> Result:
    if statement.many:
        conn.executemany(statement.sql, statement.args)
        return None
    cursor = conn.execute(statement.sql, statement.args)
    return cursor.fetchall() if statement.rows else cursor.rowcount
