"""SQLite's write-ahead log is copied back into the database file by a thread of its own,
never inside a commit that deliveries wait for (`bot.store.db.Checkpointer`)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from bot.store import db as sqlite_engine
from bot.store.db import CHECKPOINT_EVERY, Database
from bot.store.engine import Statement

# 40 pages a row: CHECKPOINT_EVERY - 1 commits take the log past the 1,000 pages at which
# SQLite would checkpoint inside a commit.
ROW_PAGES = 40
ROW = b"x" * (4096 * ROW_PAGES)


async def write(database: Database, transactions: int) -> None:
    for _ in range(transactions):
        await database.transaction([Statement("INSERT INTO t (body) VALUES (?)", (ROW,))])


async def settled(database: Database) -> None:
    """Until the checkpoint started by the last commits (if any) has ended."""
    running = database._checkpoints._running  # type: ignore[union-attr]
    if running is not None:
        await asyncio.wait([running])


async def opened(path: Path) -> Database:
    database = Database(str(path))
    await database.open("CREATE TABLE IF NOT EXISTS t (body BLOB)")
    return database


def file_pages(path: Path) -> int:
    return path.stat().st_size // 4096


async def test_commits_leave_the_log_to_the_checkpoint_thread_which_copies_it_back(tmp_path: Path) -> None:
    path = tmp_path / "klaud.db"
    database = await opened(path)
    try:
        before = file_pages(path)
        await write(database, CHECKPOINT_EVERY - 1)
        await settled(database)
        assert file_pages(path) == before  # the commits did not checkpoint: all in the log

        await write(database, 1)
        await settled(database)
        assert file_pages(path) >= before + ROW_PAGES * CHECKPOINT_EVERY  # every row copied back
    finally:
        await database.close()
    assert not Path(f"{path}-wal").exists()  # the last connection closed checkpoints the rest
    assert sqlite3.connect(path).execute("SELECT count(*) FROM t").fetchone() == (CHECKPOINT_EVERY,)


async def test_a_failed_checkpoint_is_reported_and_tried_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "klaud.db"
    database = await opened(path)
    real = sqlite_engine.Checkpointer._checkpoint
    failures = iter([sqlite3.OperationalError("disk I/O error")])

    def fails_once(self: sqlite_engine.Checkpointer) -> None:
        for failure in failures:
            raise failure
        real(self)

    monkeypatch.setattr(sqlite_engine.Checkpointer, "_checkpoint", fails_once)
    try:
        before = file_pages(path)
        with capture_logs() as logs:
            await write(database, CHECKPOINT_EVERY)
            await settled(database)
        assert [(e["event"], e["error"]) for e in logs] == [("store.checkpoint_failed", "disk I/O error")]
        assert file_pages(path) == before

        await write(database, CHECKPOINT_EVERY)
        await settled(database)
        assert file_pages(path) >= before + ROW_PAGES * 2 * CHECKPOINT_EVERY
    finally:
        await database.close()


async def test_closing_twice_and_committing_while_closing_start_no_checkpoint(tmp_path: Path) -> None:
    database = await opened(tmp_path / "klaud.db")
    await write(database, CHECKPOINT_EVERY - 1)
    last = asyncio.ensure_future(write(database, 1))  # its commit is counted after close began
    await asyncio.sleep(0)
    await asyncio.gather(database.close(), last)
    await database.close()
    assert database._checkpoints._running is None  # type: ignore[union-attr]
