"""The store: state records, the delivery inbox and leases, on SQLite or PostgreSQL.

`open_stores(url)` picks the engine from `KLAUD_DB`'s URL, takes its lock, migrates the
schema and returns the stores that share it; `Stores.over(engine)` builds them unopened
(the process opens the engine as it starts).
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.store.db import Database
from bot.store.deliveries import DeliveryStore
from bot.store.engine import Engine
from bot.store.errors import SchemaTooNew, StoreError, StoreLocked
from bot.store.leases import LeaseStore
from bot.store.postgres import PostgresDatabase
from bot.store.records import StateStore

__all__ = ["SchemaTooNew", "StoreError", "StoreLocked", "Stores", "engine_for", "open_stores", "sqlite_path"]

SQLITE_PREFIX = "sqlite:///"
POSTGRESQL_PREFIXES = ("postgresql://", "postgres://")


@dataclass(frozen=True)
class Stores:
    engine: Engine
    state: StateStore
    deliveries: DeliveryStore
    leases: LeaseStore

    @classmethod
    def over(cls, engine: Engine) -> Stores:
        """The stores of one engine. The state store writes through the delivery store's
        writer, so a delivery's status commits in the transaction of the state it changed."""
        deliveries = DeliveryStore(engine)
        return cls(engine, StateStore(engine, deliveries.writer), deliveries, LeaseStore(engine))

    async def close(self) -> None:
        """Commit the writes already asked for, then close the engine (and free its lock)."""
        await self.deliveries.flushed()
        await self.engine.close()


def sqlite_path(url: str) -> str | None:
    """The file (or `:memory:`) a `sqlite:///PATH` store URL names; None for another URL."""
    if url.startswith(SQLITE_PREFIX) and len(url) > len(SQLITE_PREFIX):
        return url[len(SQLITE_PREFIX) :]
    return None


def engine_for(url: str) -> Engine:
    """The engine of a store URL: `sqlite:///PATH` or `postgresql://…`."""
    if url.startswith(POSTGRESQL_PREFIXES):
        return PostgresDatabase(url)
    path = sqlite_path(url)
    if path is not None:
        return Database(path)
    raise ValueError(f"not a store URL (sqlite:///PATH or postgresql://…): {url.split('://')[0]}://…")


async def open_stores(url: str) -> Stores:
    """Open the store at `url`, migrated to the latest schema.

    Raises StoreLocked when another process serves the same SQLite file, SchemaTooNew when a
    newer Klaud migrated it, StoreError when PostgreSQL cannot be reached.
    """
    engine = engine_for(url)
    await engine.open()
    return Stores.over(engine)
