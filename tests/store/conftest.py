"""One store suite, two engines: every test that takes `stores` or `store_url` runs on SQLite
and on a real PostgreSQL server that the session starts itself (one per session, one fresh
database per test)."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from bot.store import Stores, open_stores
from tests.store.postgres_server import PostgresServer, Unavailable

_database_numbers = itertools.count()
_unavailable: list[str] = []  # why the PostgreSQL tests were skipped, for the summary


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    try:
        server = PostgresServer.start()
    except Unavailable as missing:
        _unavailable.append(str(missing))
        pytest.skip(f"PostgreSQL store tests skipped: {missing}")
    yield server
    server.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # A skip in a `-q` run is one letter; this one must be seen.
    for reason in _unavailable[:1]:
        terminalreporter.write_line(f"PostgreSQL store tests SKIPPED: {reason}", yellow=True, bold=True)


@pytest.fixture(params=["sqlite", "postgresql"])
async def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    """A store nobody has opened yet: a fresh SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'klaud.db'}"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    name = f"klaud_test_{next(_database_numbers)}"
    admin = await asyncpg.connect(server.url("postgres"))
    try:
        # FILE_COPY: on a server without fsync, copying the template's files beats logging them.
        await admin.execute(f"CREATE DATABASE {name} STRATEGY = FILE_COPY")
        yield server.url(name)
        await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
    finally:
        await admin.close()


@pytest.fixture
async def stores(store_url: str) -> AsyncIterator[Stores]:
    opened = await open_stores(store_url)
    yield opened
    await opened.close()
