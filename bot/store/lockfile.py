"""One Klaud process per SQLite file: an exclusive `flock` on the database file itself.

SQLite itself would let two processes share the file, and both would then process the same
deliveries and dispatch the same candidates. The lock is taken on the database file, not on
a file beside it: a lock file can be removed while held (a temporary-files cleaner, someone
taking it for a stale pid file), and a second process would then lock a new one. SQLite's
own locks are POSIX record locks, which on Linux never conflict with `flock`, and closing
SQLite's descriptors does not release ours. The lock lives as long as our open file
description, so it goes away with the process however it ends, and a second `Database` in
the same process is refused like a second process. `<db>.lock` only names the holder's pid.
"""

from __future__ import annotations

import fcntl
import os

from bot.store.errors import StoreError, StoreLocked


class PidLock:
    def __init__(self, db_path: str) -> None:
        self.db_path = db_path
        self.pid_path = db_path + ".lock"
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            # O_CREAT: an empty file is what SQLite makes of a new database too.
            fd = os.open(self.db_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise _cannot("open", self.db_path, exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreLocked(f"{self.db_path} is in use by another Klaud process (pid {self._holder()})") from None
        except OSError as exc:  # a file system without flock (some network ones: ENOLCK)
            os.close(fd)
            raise _cannot("lock", self.db_path, exc) from exc
        self._fd = fd
        try:
            with open(self.pid_path, "w", encoding="ascii") as pid_file:
                pid_file.write(f"{os.getpid()}\n")
        except OSError as exc:
            self.release()  # the caller never gets a lock to release
            raise _cannot("write", self.pid_path, exc) from exc

    def _holder(self) -> str:
        try:
            with open(self.pid_path, encoding="ascii", errors="replace") as pid_file:
                return pid_file.read(32).strip() or "unknown"
        except OSError:  # removed, or something else in its place: the refusal names no pid
            return "unknown"

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _cannot(doing: str, path: str, exc: OSError) -> StoreError:
    """`exc` as the store's one line naming the path and the reason (permission denied, a
    read-only file system, a folder in the way): the CLI reports a StoreError so, where a
    bare OSError is a bug's traceback."""
    return StoreError(f"cannot {doing} {path}: {exc.strerror or exc}")
