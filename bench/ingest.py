"""Ingest benchmark: signed deliveries over loopback into Klaud servers, per store.

For each configuration it starts Klaud in child processes (real intake, real durable inbox,
real worker; the handler parses the body into its model as the real one does, then returns,
so the figures measure intake and the inbox, not GitHub), sends a warm-up of 300 deliveries
and waits until they are processed, then sends N realistic `pull_request` deliveries
(measured) from C concurrent clients spread over the replicas, waits until every stored
delivery is done, then counts what was processed and what was lost. The configurations,
side by side in one run:

- SQLite, one process (always: the reference figure);
- with `--db postgresql` (a throwaway server this benchmark starts, with PostgreSQL's default
  fsync'd commits) or `--db postgresql://URL` (a database is created on it and dropped
  after), one configuration per `--replicas` count (default 1 and 3).

With `--rounds N` every configuration runs N times, interleaved (this machine's speed moves
by 20–30 % from one minute to the next), and the round with the median throughput is
reported.

Last line: {"deliveries_per_s", "p50_ms", "p99_ms", "processed", "lost"} of SQLite, then per
PostgreSQL configuration `postgresql_<n>_…` with the same figures, and `postgresql_<n>_to_1`:
its deliveries a second against one replica's in the same round, the median of the rounds.
Latencies are acknowledgement latencies (request sent to 202 received); `lost` counts every
round's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Protocol, TypeVar
from urllib.parse import urlsplit

import aiohttp
import asyncpg

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness import SECRET, headers_for
from tests.helpers import replica_server
from tests.helpers.slow_server import wait_for_urls
from tests.store.postgres_server import PostgresServer

# The same server the kill-and-restart test uses, with a handler that returns at once.
SERVER = ROOT / "tests" / "helpers" / "slow_server.py"
URLS = "URLS"
LEASE_SECONDS = 10.0
# Deliveries sent, and processed, before the measured ones (as bench/peers.py does): the
# imports, connections and prepared statements settle. With three replicas not all of it:
# their pools still open 4-8 connections during the measured phase, and the repositories'
# leases are still being spread (a replica takes a new repository at a lease round, when it
# has work). Pools opened full beforehand, or a warm-up of 2,000, did not move the 3:1 ratio
# beyond this machine's round-to-round noise (measured 2026-12-07), so the warm-up stays.
WARM_UP = 300


def realistic_payload(number: int) -> dict:
    """A pull_request payload shaped like GitHub's (about 20 KB, like real ones)."""
    fixture = Path(os.environ.get("KLAUD_FIXTURES", ROOT.parent / "shared" / "fixtures"))
    example = fixture / "octokit-webhooks" / "pull_request" / "synchronize.payload.json"
    if example.exists():
        payload = json.loads(example.read_text())
    else:
        user = {"login": "bob", "id": 2, "type": "User", "site_admin": False}
        repo = {"id": 1, "name": "bench", "full_name": "acme/bench", "private": False, "owner": user,
                "default_branch": "main", "description": "x" * 200}
        payload = {
            "action": "synchronize",
            "pull_request": {"number": 1, "state": "open", "title": "Bump image", "user": user,
                             "body": "y" * 18_000, "head": {"ref": "bump", "sha": "a" * 40, "repo": repo},
                             "base": {"ref": "main", "sha": "b" * 40, "repo": repo}, "draft": False,
                             "labels": [], "created_at": "2026-11-29T08:00:00Z",
                             "updated_at": "2026-11-30T08:00:00Z"},
            "repository": repo,
            "sender": user,
        }
    payload["number"] = number
    payload["installation"] = {"id": 1, "node_id": "MDIzOkludGVncmF0aW9uSW5zdGFsbGF0aW9uMQ=="}
    payload["repository"]["full_name"] = f"acme/bench-{number % 8}"
    return payload


@dataclass
class Load:
    """Signed deliveries ready to send, signed up front so the clients only send."""

    bodies: list[bytes]
    headers: list[dict[str, str]]

    @property
    def ids(self) -> list[str]:
        return [headers["X-GitHub-Delivery"] for headers in self.headers]


def make_load(deliveries: int, secret: str = SECRET) -> Load:
    bodies = [json.dumps(realistic_payload(n)).encode() for n in range(deliveries)]
    return Load(bodies, [headers_for("pull_request", body, delivery=str(uuid.uuid4()), secret=secret) for body in bodies])


@dataclass
class Sent:
    latencies_ms: list[float]
    accepted: list[str]  # delivery ids answered 2xx
    elapsed_s: float
    client_cpu_ms: float  # the load generator's CPU per request

    @property
    def per_s(self) -> float:
        return len(self.latencies_ms) / self.elapsed_s

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies_ms)

    @property
    def p99_ms(self) -> float:
        return percentile(self.latencies_ms, 0.99)


async def send(webhook_urls: list[str], load: Load, clients: int) -> Sent:
    """POST every delivery of `load` from `clients` concurrent clients, the n-th one to the
    n-th of `webhook_urls` in turn (a load balancer's round robin).

    Each client keeps one HTTP/1.1 connection per URL and writes requests whose bytes were
    built before the clock starts, as wrk does: an aiohttp client spent ~0.37 ms of CPU per
    request, as much as the servers measured, on the same two cores."""
    heads = [[request_head(url, load.headers[index], len(load.bodies[index])) for url in webhook_urls]
             for index in range(len(load.bodies))]
    latencies: list[float] = []
    accepted: list[str] = []
    pending = iter(range(len(load.bodies)))

    async def client() -> None:
        connections: dict[int, Connection] = {}
        try:
            for index in pending:
                target = index % len(webhook_urls)
                started = time.perf_counter()
                connection = connections.get(target)
                if connection is None:
                    connection = connections[target] = await Connection.open(webhook_urls[target])
                status, keep_alive = await connection.post(heads[index][target], load.bodies[index])
                if not keep_alive:
                    connection.close()
                    del connections[target]
                if 200 <= status < 300:
                    accepted.append(load.headers[index]["X-GitHub-Delivery"])
                latencies.append((time.perf_counter() - started) * 1000)
        finally:
            for connection in connections.values():
                connection.close()

    cpu, started = time.process_time(), time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - started
    return Sent(latencies, accepted, elapsed, (time.process_time() - cpu) * 1000 / max(1, len(latencies)))


def request_head(url: str, headers: dict[str, str], length: int) -> bytes:
    """The request line and headers of a POST of `length` bytes to `url`."""
    parts = urlsplit(url)
    lines = [f"POST {parts.path or '/'} HTTP/1.1", f"Host: {parts.netloc}", f"Content-Length: {length}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@dataclass
class Connection:
    """One keep-alive HTTP/1.1 connection of the load generator: writes a request, reads
    the answer's status and body (Content-Length or chunked)."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    @classmethod
    async def open(cls, url: str) -> Connection:
        parts = urlsplit(url)
        reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        return cls(reader, writer)

    async def post(self, head: bytes, body: bytes) -> tuple[int, bool]:
        """(status, whether the connection stays open) of one request."""
        self.writer.writelines((head, body))
        status_line, _, header_block = (await self.reader.readuntil(b"\r\n\r\n")).partition(b"\r\n")
        headers = {}
        for line in header_block.split(b"\r\n"):
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip().lower()
        if headers.get(b"transfer-encoding") == b"chunked":
            await self._read_chunks()
        else:
            await self.reader.readexactly(int(headers.get(b"content-length", b"0")))
        return int(status_line.split()[1]), headers.get(b"connection") != b"close"

    async def _read_chunks(self) -> None:
        while True:
            size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await self.reader.readexactly(size + 2)  # the chunk and its CRLF
            if size == 0:
                return

    def close(self) -> None:
        self.writer.close()


async def wait_drained(url: str) -> None:
    """Until the inbox backlog one Klaud process reports on /readyz (of either listener) is 0."""
    async with aiohttp.ClientSession() as session:
        for _ in range(60_000):
            async with session.get(f"{url}/readyz") as response:
                if (await response.json())["backlog"] == 0:
                    return
            await asyncio.sleep(0.01)
    raise RuntimeError("the inbox did not drain within 10 minutes")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


@dataclass
class Result:
    sent: Sent
    done: set[str]

    def figures(self) -> dict[str, float | int]:
        return {
            "deliveries_per_s": round(self.sent.per_s, 1),
            "p50_ms": round(self.sent.p50_ms, 2),
            "p99_ms": round(self.sent.p99_ms, 2),
            "processed": len(self.done & set(self.sent.accepted)),
            "lost": len(set(self.sent.accepted) - self.done),
        }


@contextmanager
def servers(commands: list[list[str]], folder: Path) -> Iterator[list[str]]:
    """Start one server per command (URLS stands for the file it writes its URLs to); their
    webhook URLs; stopped with SIGTERM on the way out."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        urls = []
        for number, command in enumerate(commands):
            urls_file = folder / f"urls-{number}"
            argv = [str(urls_file) if part == URLS else part for part in command]
            started.append(subprocess.Popen(argv, stderr=subprocess.DEVNULL))
            urls.append(wait_for_urls(urls_file, started[-1])[0])
        yield urls
    finally:
        for server in started:
            server.terminate()
        for server in started:
            server.wait()


def run_sqlite(load: Load, clients: int) -> Result:
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"

        def done_ids() -> set[str]:
            with sqlite3.connect(db) as conn:
                return {row[0] for row in conn.execute("SELECT id FROM deliveries WHERE status = 'done'")}

        async def drained() -> bool:
            with sqlite3.connect(db) as conn:
                return conn.execute("SELECT count(*) FROM deliveries WHERE status <> 'done'").fetchone()[0] == 0

        with servers([[sys.executable, str(SERVER), str(db), URLS, "0"]], Path(tmp)) as urls:
            sent = asyncio.run(send_and_drain(urls, load, clients, drained, make_load(WARM_UP)))
        return Result(sent, done_ids())


def run_postgresql(server_url: str, replicas: int, load: Load, clients: int) -> Result:
    """`replicas` replica processes on a new database of the server at `server_url`."""
    name = f"klaud_bench_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(server_url, f"CREATE DATABASE {name}"))
    url = f"{server_url.rsplit('/', 1)[0]}/{name}"
    try:
        async def drained() -> bool:
            conn = await asyncpg.connect(url)
            try:
                return await conn.fetchval("SELECT count(*) FROM deliveries WHERE status <> 'done'") == 0
            finally:
                await conn.close()

        command = [sys.executable, str(replica_server.SCRIPT), url, URLS, str(LEASE_SECONDS), "parse"]
        with tempfile.TemporaryDirectory() as tmp, servers([command] * replicas, Path(tmp)) as urls:
            sent = asyncio.run(send_and_drain(urls, load, clients, drained, make_load(WARM_UP)))
        done = asyncio.run(_fetch_done(url))
    finally:
        asyncio.run(_admin(server_url, f"DROP DATABASE {name} WITH (FORCE)"))
    return Result(sent, done)


async def _admin(server_url: str, sql: str) -> None:
    conn = await asyncpg.connect(server_url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _fetch_done(url: str) -> set[str]:
    conn = await asyncpg.connect(url)
    try:
        return {row[0] for row in await conn.fetch("SELECT id FROM deliveries WHERE status = 'done'")}
    finally:
        await conn.close()


async def send_and_drain(urls: list[str], load: Load, clients: int, drained, warm_up: Load | None = None) -> Sent:  # type: ignore[no-untyped-def]
    """Send `warm_up` and wait until it is processed, then send `load` (measured) and wait again."""
    webhooks = [f"{url}/webhook" for url in urls]
    if warm_up is not None:
        await send(webhooks, warm_up, clients)
        await until_drained(drained)
    sent = await send(webhooks, load, clients)
    await until_drained(drained)
    return sent


async def until_drained(drained) -> None:  # type: ignore[no-untyped-def]
    for _ in range(60_000):
        if await drained():
            return
        await asyncio.sleep(0.01)
    raise RuntimeError("the inbox did not drain within 10 minutes")


@contextmanager
def postgresql(db: str) -> Iterator[str]:
    """The URL of a server's maintenance database: the one given, or a throwaway server's."""
    if db != "postgresql":
        yield db
        return
    server = PostgresServer.start(durable=True)
    try:
        yield server.url("postgres")
    finally:
        server.stop()


def report(label: str, result: Result, clients: int, deliveries: int) -> None:
    figures = result.figures()
    print(f"{label}: {deliveries} deliveries from {clients} clients: {figures['deliveries_per_s']}/s, "
          f"p50 {figures['p50_ms']} ms, p99 {figures['p99_ms']} ms; accepted {len(result.sent.accepted)},"
          f" processed {figures['processed']}, lost {figures['lost']}; load generator CPU"
          f" {result.sent.client_cpu_ms:.3f} ms per request")


class Round(Protocol):
    sent: Sent


RoundT = TypeVar("RoundT", bound=Round)


def median_round(rounds: Sequence[RoundT]) -> RoundT:
    """The round with the median throughput: its latencies (and other figures) come with it."""
    return sorted(rounds, key=lambda each: each.sent.per_s)[len(rounds) // 2]


def median_figures(rounds: list[Result]) -> dict[str, float | int]:
    """The median round's figures; `lost` counts every round's, so one lost delivery shows."""
    return median_round(rounds).figures() | {"lost": sum(result.figures()["lost"] for result in rounds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--deliveries", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--db", default="sqlite",
                        help="sqlite (only), postgresql (a throwaway server) or a postgresql:// URL")
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--rounds", type=int, default=1,
                        help="interleaved rounds of every configuration; the median round is reported")
    args = parser.parse_args()
    load = make_load(args.deliveries)
    with ExitStack() as stack:
        server_url = None if args.db == "sqlite" else stack.enter_context(postgresql(args.db))
        runs: dict[str, Callable[[], Result]] = {"sqlite": lambda: run_sqlite(load, args.clients)}
        if server_url is not None:
            for replicas in args.replicas:
                runs[f"postgresql_{replicas}"] = partial(run_postgresql, server_url, replicas, load, args.clients)
        # Interleaved, so a machine that slows down for a while slows every configuration.
        results: dict[str, list[Result]] = {name: [] for name in runs}
        for number in range(args.rounds):
            for name, run in runs.items():
                results[name].append(run())
                report(f"round {number + 1}, {name}", results[name][-1], args.clients, args.deliveries)
    line = median_figures(results.pop("sqlite"))
    for name, rounds in results.items():
        line |= {f"{name}_{key}": value for key, value in median_figures(rounds).items()}
    line |= paired_ratios(results)
    print(json.dumps(line))


def paired_ratios(results: dict[str, list[Result]]) -> dict[str, float]:
    """Each PostgreSQL configuration against one replica, round by round (the two ran minutes
    apart, on a machine whose speed drifts more than that between rounds), median of the
    rounds: `postgresql_<n>_to_1`."""
    one = results.get("postgresql_1")
    if not one:
        return {}
    ratios = {}
    for name, rounds in results.items():
        if name != "postgresql_1":
            paired = [each.sent.per_s / single.sent.per_s for each, single in zip(rounds, one, strict=True)]
            ratios[f"{name}_to_1"] = round(statistics.median(paired), 2)
    return ratios


if __name__ == "__main__":
    main()
