"""One Klaud process per SQLite file: an exclusive `flock` on `<db>.lock`, holding the pid.

SQLite itself would let two processes share the file, and both would then process the same
deliveries and dispatch the same candidates. The lock lives as long as the open file
description, so it goes away with the process however it ends, and a second `Database`
in the same process is refused like a second process.
"""

from __future__ import annotations

import fcntl
import os

from bot.store.errors import StoreLocked


class PidLock:
    def __init__(self, db_path: str) -> None:
        self.db_path = db_path
        self.path = db_path + ".lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        # No O_TRUNC: the file may hold the pid of the process that has the lock.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreLocked(f"{self.db_path} is in use by another Klaud process (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        # The file stays: deleting it would let a process that opened it just before
        # lock an inode no one else can see.
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
