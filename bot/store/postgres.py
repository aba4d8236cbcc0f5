"""The PostgreSQL engine: an asyncpg pool, shared by any number of Klaud replicas.

Statements arrive in SQLite's `?` style (`engine.py`) and are numbered here once each.
Unlike SQLite, PostgreSQL serves many processes at once: the schema is migrated under an
advisory lock, so replicas that start together migrate it once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

# asyncpg ships no type information (no py.typed); its values are Any here.
import asyncpg  # type: ignore[import-untyped]
import structlog

from bot.store.engine import Dialect, Result, Row, Statement
from bot.store.errors import (
    LEASE_TAKEN_SQLSTATE,
    LeaseTaken,
    StoreError,
    StoreUnavailable,
)
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

log = structlog.get_logger("klaud.store")

# The advisory lock key every Klaud replica takes to migrate: an arbitrary constant.
MIGRATION_LOCK = int.from_bytes(b"klaud/db", "big")
# Every wait on the server is bounded: a table someone locked, a link that drops packets or
# a server that stops answering must not hold a webhook's answer or a lease round for the
# minutes TCP takes to give up. Klaud's statements take milliseconds.
CONNECT_SECONDS = 10.0
COMMAND_SECONDS = 30.0
ACQUIRE_SECONDS = 10.0
SERVER_SETTINGS = {"lock_timeout": "5s", "idle_in_transaction_session_timeout": "60s"}
# A migration may rewrite a table, and replicas starting meanwhile wait for its lock.
MIGRATION_SECONDS = 3600.0
# What the server or the connection raises when a later try can succeed.
TRANSIENT = (
    asyncpg.PostgresConnectionError,  # connection lost or refused
    asyncpg.InterfaceError,  # the connection closed under a call
    asyncpg.InternalClientError,  # a call on a connection still reading a fatal error
    asyncpg.exceptions.OperatorInterventionError,  # restarting, shutting down, statement cancelled
    asyncpg.exceptions.LockNotAvailableError,  # lock_timeout
    asyncpg.exceptions.TransactionRollbackError,  # deadlock, serialization failure
    asyncpg.exceptions.InsufficientResourcesError,  # too many connections, disk full
    # No connection free within ACQUIRE_SECONDS (the pool's wait; asyncio's TimeoutError):
    # the store's trouble, named as such, never taken for a network error of someone else's.
    TimeoutError,
)


class PostgresDatabase:
    dialect: Dialect = "postgresql"
    now_sql = "extract(epoch from clock_timestamp())::double precision"

    def __init__(self, url: str, *, max_connections: int = 10) -> None:
        self.url = url
        self.max_connections = max_connections
        self._pool: Any = None

    @property
    def where(self) -> str:
        """The server and database, for messages: the URL may carry a password."""
        # Read after the last `@`: a password with a `/` or `#` that is not percent-encoded
        # would otherwise be read as the port or the path.
        parts = urlsplit("postgresql://" + self.url.split("://", 1)[-1].rsplit("@", 1)[-1])
        port: int | str
        try:
            port = parts.port or 5432
        except ValueError:
            port = "?"
        return f"PostgreSQL {parts.hostname or 'localhost'}:{port}{parts.path}"

    @property
    def is_open(self) -> bool:
        return self._pool is not None

    async def open(self) -> None:
        if self._pool is not None:
            return
        try:
            pool = await asyncpg.create_pool(
                self.url, min_size=1, max_size=self.max_connections, reset=_keep_session,
                timeout=CONNECT_SECONDS, command_timeout=COMMAND_SECONDS, server_settings=SERVER_SETTINGS,
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreError(f"cannot connect to {self.where}: {exc}") from exc
        try:
            await self._migrate(pool)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            # Refused before the migrations themselves (on PostgreSQL 15 a role that does not
            # own the database may not create the version table in `public`), or the
            # connection lost: one line, as a refused migration says it.
            await pool.close()
            reason = " ".join(str(exc).split())
            raise StoreError(f"{self.where}: cannot read or create the schema: {type(exc).__name__}: {reason}") from exc
        except BaseException:
            await pool.close()
            raise
        self._pool = pool

    async def _migrate(self, pool: Any) -> None:
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("SET LOCAL lock_timeout = 0")
            # Held until this transaction ends: a replica starting meanwhile waits here,
            # then finds the schema current.
            await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK, timeout=MIGRATION_SECONDS)
            await conn.execute(VERSION_TABLE["postgresql"])
            current = await conn.fetchval(CURRENT_VERSION)
            migrations = to_apply(current, self.where)
            left = [(migration, await self._apply(conn, migration)) for migration in migrations]
        if migrations:
            log.info("store.migrated", engine="postgresql", where=self.where, from_version=current, to_version=LATEST)
        for migration, rows in left:  # said once the upgrade is committed
            report_left(migration, self.where, rows)

    async def _apply(self, conn: Any, migration: Migration) -> list[Row]:
        """Run `migration` in the open transaction; the records it left behind."""
        try:
            for sql in migration.postgresql:
                await conn.execute(sql, timeout=MIGRATION_SECONDS)
            await conn.execute(numbered(RECORD_VERSION), migration.version, migration.name, time.time())
            return list(await conn.fetch(migration.left)) if migration.left else []
        except (asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            # The transaction rolls back: the store keeps its version, and the next start
            # meets the same refusal, said in one line rather than an asyncpg traceback.
            raise failed(migration, self.where, exc) from exc

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        with self._errors_named():
            async with self._open_pool().acquire(timeout=ACQUIRE_SECONDS) as conn:
                rows: list[Row] = await conn.fetch(numbered(sql), *args)
                return rows

    async def transaction(self, statements: Sequence[Statement]) -> list[Result]:
        with self._errors_named():
            async with self._open_pool().acquire(timeout=ACQUIRE_SECONDS) as conn:
                if len(statements) == 1:
                    # One statement is a transaction of its own: one round trip, not three
                    # (BEGIN, it, COMMIT). A burst of new deliveries is one (`NewDeliveries`).
                    return [await _execute(conn, statements[0])]
                async with conn.transaction():
                    return [await _execute(conn, statement) for statement in statements]

    @contextmanager
    def _errors_named(self) -> Iterator[None]:
        """asyncpg's errors that a later try can get past, as `StoreUnavailable`: a handler
        whose read met a restarting server retries its delivery instead of failing it.
        The lease fence's refusal as `LeaseTaken`: the repository is another replica's."""
        try:
            yield
        except TRANSIENT as exc:
            raise StoreUnavailable(f"{self.where}: {type(exc).__name__}: {exc}") from exc
        except asyncpg.PostgresError as exc:
            if exc.sqlstate == LEASE_TAKEN_SQLSTATE:
                raise LeaseTaken(str(exc)) from exc
            raise

    def _open_pool(self) -> Any:
        if self._pool is None:
            raise RuntimeError("database is closed")
        return self._pool

    def free_bytes(self) -> int | None:
        return None  # the server's disk: its operator watches it

    async def close(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await pool.close()


async def _keep_session(conn: Any) -> None:
    """What the pool does to a connection handed back, instead of asyncpg's `RESET ALL`,
    `pg_advisory_unlock_all()` and friends (a round trip per transaction): Klaud sets no
    session state, listens to nothing and takes only transaction-scoped advisory locks, so
    there is nothing to reset (asyncpg still rolls back a transaction left open)."""


@lru_cache(maxsize=256)
def numbered(sql: str) -> str:
    """`?` placeholders as `$1`, `$2`, …; Klaud's statements hold no `?` in a literal."""
    first, *rest = sql.split("?")
    return first + "".join(f"${n}{part}" for n, part in enumerate(rest, start=1))


async def _execute(conn: Any, statement: Statement) -> Result:
    sql = numbered(statement.sql)
    if statement.many:
        await conn.executemany(sql, statement.args)
        return None
    if statement.rows:
        rows: list[Row] = await conn.fetch(sql, *statement.args)
        return rows
    status: str = await conn.execute(sql, *statement.args)
    # The command tag ends with the count of rows: "INSERT 0 1", "UPDATE 3", "DELETE 0".
    return int(status.rsplit(" ", 1)[-1])
