"""One Klaud process per SQLite file: an exclusive `flock` on `<db>.lock`, holding the pid.

SQLite itself would let two processes share the file, and both would then process the same
deliveries and dispatch the same candidates. The lock lives as long as the open file
description, so it goes away with the process however it ends, and a second `Database`
in the same process is refused like a second process.
"""

from __future__ import annotations

import fcntl
import os
import time

import structlog

from bot.store.errors import StoreLocked

log = structlog.get_logger("klaud.store")

# How often a process holding the lock looks whether its lock file is still in place.
CHECK_EVERY = 2.0


class PidLock:
    def __init__(self, db_path: str) -> None:
        self.db_path = db_path
        self.path = db_path + ".lock"
        self._fd: int | None = None
        self._checked_at = 0.0

    def acquire(self) -> None:
        self._fd = self._locked_file(f"{self.db_path} is in use by another Klaud process")

    def _locked_file(self, refusal: str) -> int:
        # No O_TRUNC: the file may hold the pid of the process that has the lock.
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StoreLocked(f"{refusal} (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def keep(self) -> None:
        """Put the lock file back when it was removed while held (a temporary-files
        cleaner, or someone taking it for a stale pid file): a second process would lock a
        new file and open the store too. Raises StoreLocked when one already has; every
        write then fails here rather than act beside it. Looks at most every 2 s."""
        now = time.monotonic()
        if self._fd is None or now - self._checked_at < CHECK_EVERY:
            return
        self._checked_at = now
        try:
            if os.path.samestat(os.fstat(self._fd), os.stat(self.path)):
                return
        except FileNotFoundError:
            pass
        fd = self._locked_file(f"{self.db_path}: its lock file was replaced, and another Klaud process holds it")
        os.close(self._fd)
        self._fd = fd
        log.warning("store.lock_file_restored", path=self.path)

    def release(self) -> None:
        # The file stays: deleting it would let a process that opened it just before
        # lock an inode no one else can see.
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
