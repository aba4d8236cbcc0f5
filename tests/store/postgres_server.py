"""A throwaway PostgreSQL server for the store tests: `initdb` + `pg_ctl` in a temporary
folder, listening on 127.0.0.1 only, on a free port, stopped and deleted at the end.

PostgreSQL refuses to run as root, so as root it runs as the `postgres` user (which the
Debian package creates), in a folder given to that user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.ports import free_port

PROGRAMS = ("initdb", "pg_ctl", "postgres")
# Settings of a server whose data is thrown away: durability against a machine crash buys
# nothing here and costs seconds; a commit is still a commit for every client. Minimal WAL
# makes the CREATE DATABASE of every test cheaper.
THROWAWAY = (
    "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c wal_level=minimal -c max_wal_senders=0"
)


class Unavailable(Exception):
    """No server can be run here; the message says what is missing."""


def find_bindir() -> Path:
    """The folder holding initdb, pg_ctl and postgres: Debian's, pg_config's, or PATH's."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_major, reverse=True)
    pg_config = shutil.which("pg_config")
    if pg_config:
        candidates.append(subprocess.run([pg_config, "--bindir"], check=False, capture_output=True, text=True).stdout.strip())
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).resolve().parent))
    for folder in candidates:
        if folder and all((Path(folder) / program).is_file() for program in PROGRAMS):
            return Path(folder)
    raise Unavailable(
        "no PostgreSQL server binaries (initdb, pg_ctl, postgres) in /usr/lib/postgresql/*/bin,"
        " `pg_config --bindir` or PATH: install the `postgresql` package (.ci/run does)"
    )


def _major(folder: str) -> int:
    name = Path(folder).parent.name
    return int(name) if name.isdigit() else 0


@dataclass
class PostgresServer:
    bindir: Path
    root: Path
    port: int
    run_as: str | None  # a user to run the server as (when we are root), else None

    @classmethod
    def start(cls, *, durable: bool = False) -> PostgresServer:
        """A server in a new temporary folder; `durable` keeps PostgreSQL's default fsync'd
        commits (for benchmarks that compare it with SQLite's), else the throwaway settings."""
        bindir = find_bindir()
        run_as = _server_user()
        root = Path(tempfile.mkdtemp(prefix="klaud-pg-"))
        if run_as is not None:
            user = pwd.getpwnam(run_as)
            os.chown(root, user.pw_uid, user.pw_gid)
        server = cls(bindir, root, free_port(), run_as)
        try:
            server._run("initdb", "-D", str(server.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                        "--no-sync")
            server._run("pg_ctl", "-D", str(server.data), "-l", str(server.log), "-w", "-t", "60",
                        "-o", f"-c listen_addresses=127.0.0.1 -p {server.port} -k {root} {'' if durable else THROWAWAY}", "start")
        except BaseException:
            server.stop()
            raise
        return server

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def _run(self, program: str, *args: str) -> None:
        command = [str(self.bindir / program), *args]
        if self.run_as is not None:
            command = ["runuser", "-u", self.run_as, "--", *command]
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.log.read_text() if self.log.exists() else ""
            raise RuntimeError(f"{program} failed ({done.returncode}):\n{done.stdout}{done.stderr}{log}")


def _server_user() -> str | None:
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise Unavailable("running as root and there is no `postgres` user to run the server as") from None
    if shutil.which("runuser") is None:
        raise Unavailable("running as root and `runuser` is missing to run the server as `postgres`")
    return "postgres"
