"""One store suite, two engines: every test that takes `stores` or `store_url` runs on SQLite
and on a real PostgreSQL server that the session starts itself (one per session, one fresh
database per test)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.store import Stores, open_stores
from tests.conftest import fresh_database
from tests.store.postgres_server import PostgresServer


@pytest.fixture(params=["sqlite", "postgresql"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A store nobody has opened yet: a fresh SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'klaud.db'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    async with fresh_database(server) as url:
        yield url


@pytest.fixture
async def stores(store_url: str) -> AsyncIterator[Stores]:
    opened = await open_stores(store_url)
    yield opened
    await opened.close()
