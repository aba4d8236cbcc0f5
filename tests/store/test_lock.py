"""One Klaud process per SQLite file: a second opener is refused with the holder's pid."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import os
import sys

import pytest

from bot.store import StoreError, StoreLocked, engine_for, open_stores

REFUSED = 3
TRY_TO_OPEN = f"""
import asyncio, sys
from bot.store import StoreLocked, open_stores
try:
    asyncio.run(open_stores(sys.argv[1]))
except StoreLocked as locked:
    print(locked)
    sys.exit({REFUSED})
"""


async def test_a_second_database_on_the_same_file_is_refused_until_the_first_closes(tmp_path):
    path = tmp_path / "klaud.db"
    first = await open_stores(f"sqlite:///{path}")
    with pytest.raises(StoreLocked) as refused:
        await open_stores(f"sqlite:///{path}")
    assert str(refused.value) == f"{path} is in use by another Klaud process (pid {os.getpid()})"
    assert (tmp_path / "klaud.db.lock").read_text() == f"{os.getpid()}\n"
    await first.close()
    again = await open_stores(f"sqlite:///{path}")
    await again.close()


async def test_the_stores_sharing_one_database_may_open_it_at_once(tmp_path):
    db = engine_for(f"sqlite:///{tmp_path / 'klaud.db'}")
    await asyncio.gather(db.open(), db.open())
    await db.close()


async def test_a_second_process_is_refused_in_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'klaud.db'}"
    first = await open_stores(url)
    try:
        other = await asyncio.create_subprocess_exec(
            sys.executable, "-c", TRY_TO_OPEN, url, stdout=asyncio.subprocess.PIPE
        )
        out, _ = await other.communicate()
    finally:
        await first.close()
    assert other.returncode == REFUSED
    assert out.decode() == f"{tmp_path / 'klaud.db'} is in use by another Klaud process (pid {os.getpid()})\n"


async def test_a_removed_pid_file_lets_no_second_process_take_the_store(tmp_path):
    # A temporary-files cleaner, or someone taking it for a stale pid file: the lock is on
    # the database file, so the second process is refused all the same, naming no pid.
    url = f"sqlite:///{tmp_path / 'klaud.db'}"
    first = await open_stores(url)
    try:
        (tmp_path / "klaud.db.lock").unlink()
        other = await asyncio.create_subprocess_exec(sys.executable, "-c", TRY_TO_OPEN, url,
                                                     stdout=asyncio.subprocess.PIPE)
        out, _ = await other.communicate()
        await first.state.repos()  # and the first goes on
    finally:
        await first.close()
    assert other.returncode == REFUSED
    assert out.decode() == f"{tmp_path / 'klaud.db'} is in use by another Klaud process (pid unknown)\n"


async def test_in_memory_stores_take_no_lock():
    stores = [await open_stores("sqlite:///:memory:") for _ in range(2)]
    for opened in stores:
        await opened.close()


def test_a_url_of_no_known_engine_is_refused():
    with pytest.raises(ValueError, match="not a store URL"):
        engine_for("mysql://klaud@db/klaud")


async def test_a_pid_file_that_cannot_be_written_leaves_the_database_unlocked(tmp_path):
    path = tmp_path / "klaud.db"
    (tmp_path / "klaud.db.lock").mkdir()  # in the way of the pid file
    with pytest.raises(StoreError) as refused:
        await open_stores(f"sqlite:///{path}")
    # One line naming the file and the reason, which the CLI prints (a bare OSError was a traceback).
    assert str(refused.value) == f"cannot write {path}.lock: Is a directory"
    (tmp_path / "klaud.db.lock").rmdir()
    again = await open_stores(f"sqlite:///{path}")
    await again.close()


async def test_a_database_file_that_cannot_be_opened_is_one_line_naming_it(tmp_path):
    # What this catches (a review found it): the lock's OSError (here a folder where the file
    # should be; permission denied, a read-only file system alike) escaped as a traceback.
    (tmp_path / "klaud.db").mkdir()
    with pytest.raises(StoreError) as refused:
        await open_stores(f"sqlite:///{tmp_path / 'klaud.db'}")
    assert str(refused.value) == f"cannot open {tmp_path / 'klaud.db'}: Is a directory"


async def test_a_file_system_without_flock_is_one_line_and_leaves_nothing_open(tmp_path, monkeypatch):
    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(StoreError) as refused:
        await open_stores(f"sqlite:///{tmp_path / 'klaud.db'}")
    assert str(refused.value) == f"cannot lock {tmp_path / 'klaud.db'}: {os.strerror(errno.ENOLCK)}"
    assert sorted(os.listdir("/proc/self/fd")) == before


async def test_a_pid_file_that_cannot_be_read_names_no_holder(tmp_path):
    path = tmp_path / "klaud.db"
    first = await open_stores(f"sqlite:///{path}")
    try:
        (tmp_path / "klaud.db.lock").unlink()
        (tmp_path / "klaud.db.lock").mkdir()  # something else in its place
        with pytest.raises(StoreLocked) as refused:
            await open_stores(f"sqlite:///{path}")
    finally:
        await first.close()
    assert str(refused.value) == f"{path} is in use by another Klaud process (pid unknown)"
