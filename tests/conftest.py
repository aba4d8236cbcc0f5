"""Shared test helpers: the real-data fixtures folder."""

from __future__ import annotations

import itertools
import logging
import os
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import pytest

from bot.log import configure_logging
from tests.store.postgres_server import PostgresServer, Unavailable
from tests.store.recording import RecordingDatabase

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def debug_logging() -> None:
    """Every test starts with debug logs on stderr (shown for failures), whatever an
    earlier test's in-process `klaud` command configured; stdout stays for what commands print."""
    configure_logging("console", logging.DEBUG)


def fixtures_root() -> Path:
    return Path(os.environ.get("KLAUD_FIXTURES", ROOT.parent / "shared" / "fixtures"))


@pytest.fixture
def fixtures() -> Path:
    """The shared real-data folder; tests that need it skip when it is absent."""
    root = fixtures_root()
    if not root.is_dir():
        pytest.skip(f"real-data fixtures not found at {root} (set KLAUD_FIXTURES)")
    return root


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[RecordingDatabase]:
    """A SQLite store in the test's folder that records what each transaction committed."""
    database = RecordingDatabase(str(tmp_path / "klaud.db"))
    await database.open()
    yield database
    await database.close()


_database_numbers = itertools.count()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    try:
        server = PostgresServer.start()
    except Unavailable as missing:
        pytest.skip(f"PostgreSQL store tests skipped: {missing}")
    yield server
    server.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    # A skip in a `-q` run is one letter: each reason (no PostgreSQL, no Chromium, no real
    # data) is said once at the end, with how many tests it skipped.
    reasons = Counter(_skip_reason(report) for report in terminalreporter.stats.get("skipped", []))
    for reason, count in sorted(reasons.items()):
        terminalreporter.write_line(f"SKIPPED {count} test(s): {reason}", yellow=True, bold=True)


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple):  # (path, line, "Skipped: why") for every skip
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@asynccontextmanager
async def fresh_database(server: PostgresServer) -> AsyncIterator[str]:
    """A new, empty database on the session's server, dropped afterwards: its URL."""
    name = f"klaud_test_{next(_database_numbers)}"
    admin = await asyncpg.connect(server.url("postgres"))
    try:
        # FILE_COPY: on a server without fsync, copying the template's files beats logging them.
        await admin.execute(f"CREATE DATABASE {name} STRATEGY = FILE_COPY")
        yield server.url(name)
        await admin.execute(f"DROP DATABASE {name} WITH (FORCE)")
    finally:
        await admin.close()
