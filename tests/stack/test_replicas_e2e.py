"""Replicas on one PostgreSQL store (DESIGN §6), as separate processes: deliveries spread over
them, one killed with SIGKILL mid-stream, a rolling restart under load, every connection to
the store killed again and again.

Each replica's handler leaves one record per processing, committed with the delivery's
status, so the store itself tells whether a delivery was processed once, and in which order.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import asyncpg

from tests.harness import headers_for
from tests.helpers import replica_server
from tests.helpers.slow_server import wait_for_urls
from tests.store.postgres_server import PostgresServer

LEASE_SECONDS = 3.0


@dataclass
class Replica:
    process: subprocess.Popen[bytes]
    url: str
    owner: str


def start_replica(store_url: str, folder: Path) -> Replica:
    folder.mkdir(parents=True, exist_ok=True)
    urls = folder / f"urls-{uuid.uuid4().hex}"
    process = subprocess.Popen(
        [sys.executable, str(replica_server.SCRIPT), store_url, str(urls), str(LEASE_SECONDS)],
        stderr=(folder / "stderr").open("ab"),
    )
    url, _ = wait_for_urls(urls, process)
    return Replica(process, url, json.loads(urls.read_text())["owner"])


@dataclass
class Sender:
    """Sends each repository's deliveries in order, to whichever replica answers."""

    replicas: list[Replica]
    acknowledged: dict[str, tuple[str, int]] = field(default_factory=dict)  # id -> (repo, n)
    refused: int = 0

    async def send_repo(self, session: aiohttp.ClientSession, repo: str, count: int, start: int) -> None:
        turn = itertools.count(start)
        for number in range(count):
            delivery = str(uuid.uuid4())
            body = json.dumps({"action": "synchronize", "number": number, "repository": {"full_name": repo},
                               "installation": {"id": 1}}).encode()
            headers = headers_for("pull_request", body, delivery=delivery)
            while True:  # GitHub's redelivery: the same delivery to the next replica
                replica = self.replicas[next(turn) % len(self.replicas)]
                try:
                    async with session.post(f"{replica.url}/webhook", data=body, headers=headers) as answer:
                        if answer.status in (200, 202):
                            self.acknowledged[delivery] = (repo, number)
                            break
                        self.refused += 1
                except aiohttp.ClientError:
                    self.refused += 1
                await asyncio.sleep(0.01)


async def wait_processed(store_url: str, ids: set[str], timeout: float = 90.0) -> None:
    conn = await asyncpg.connect(store_url)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = {row["id"] for row in await conn.fetch("SELECT id FROM deliveries WHERE status = 'done'")}
            if ids <= done:
                return
            await asyncio.sleep(0.2)
        raise AssertionError(f"{len(ids - done)} acknowledged deliveries not processed within {timeout} s")
    finally:
        await conn.close()


async def processings(store_url: str) -> dict[str, list[dict[str, object]]]:
    """delivery id -> what each processing of it recorded."""
    conn = await asyncpg.connect(store_url)
    try:
        rows = await conn.fetch("SELECT repo, key, data FROM records WHERE kind = 'seen'")
    finally:
        await conn.close()
    found: dict[str, list[dict[str, object]]] = defaultdict(list)
    for row in rows:
        found[row["key"].split("/")[0]].append({"repo": row["repo"], **json.loads(row["data"])})
    return found


def assert_once_and_in_order(acknowledged: dict[str, tuple[str, int]], seen: dict[str, list[dict[str, object]]]) -> None:
    twice = {delivery: len(runs) for delivery, runs in seen.items() if len(runs) > 1}
    assert not twice, f"processed more than once: {twice}"
    missing = set(acknowledged) - set(seen)
    assert not missing, f"{len(missing)} acknowledged deliveries never processed"
    by_repo: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for delivery, (repo, number) in acknowledged.items():
        by_repo[repo].append((int(seen[delivery][0]["at"]), number))  # type: ignore[call-overload]
    for repo, runs in by_repo.items():
        numbers = [number for _, number in sorted(runs)]
        assert numbers == sorted(numbers), f"{repo}: processed out of order"


async def processed_by(store_url: str, owner: str) -> bool:
    runs = await processings(store_url)
    return any(run["by"] == owner for each in runs.values() for run in each)


async def owners(store_url: str) -> dict[str, str]:
    conn = await asyncpg.connect(store_url)
    try:
        rows = await conn.fetch("SELECT name, owner FROM leases WHERE name LIKE 'repo:%' AND expires_at > "
                                "extract(epoch from clock_timestamp())")
    finally:
        await conn.close()
    return {row["name"]: row["owner"] for row in rows}


def stop_all(replicas: list[Replica]) -> None:
    for replica in replicas:
        if replica.process.poll() is None:
            replica.process.send_signal(signal.SIGTERM)
    for replica in replicas:
        replica.process.wait(timeout=30)


async def test_three_replicas_survive_a_sigkill_mid_stream(store_url: str, tmp_path: Path) -> None:
    replicas = [start_replica(store_url, tmp_path / f"replica-{n}") for n in range(3)]
    try:
        sender = Sender(list(replicas))
        repos = [f"acme/bench-{n}" for n in range(20)]
        async with aiohttp.ClientSession() as session:
            streams = [asyncio.create_task(sender.send_repo(session, repo, 150, n)) for n, repo in enumerate(repos)]
            victim = replicas[0]
            # Mid-stream, and once the victim has done some of the work (a replica takes its
            # share of new repositories at its next lease round, which a fast intake can
            # outrun) and owns repositories (these have no state: one whose queue the victim
            # has emptied is given up, "nothing to keep", until deliveries come again): the
            # kill then interrupts work in progress.
            deadline = time.monotonic() + 30
            orphaned: set[str] = set()
            while len(sender.acknowledged) < 1000 or not orphaned or not await processed_by(store_url, victim.owner):
                assert time.monotonic() < deadline, "the victim processed nothing, or owned nothing, within 30 s"
                await asyncio.sleep(0.05)
                before = await owners(store_url)
                orphaned = {name for name, owner in before.items() if owner == victim.owner}
            os.kill(victim.process.pid, signal.SIGKILL)
            killed_at = time.time_ns()
            sender.replicas = replicas[1:]
            await asyncio.gather(*streams)
        await wait_processed(store_url, set(sender.acknowledged))
    finally:
        stop_all(replicas)

    assert len(sender.acknowledged) == 3000
    assert orphaned, "the killed replica owned repositories"
    seen = await processings(store_url)
    # Carried on: each of its repositories' first processing by another replica after the
    # kill (once all is processed a repository may rightly have no owner: nothing to keep).
    resumed = {}
    for runs in seen.values():
        run = runs[0]
        name = f"repo:{str(run['repo']).lower()}"
        if name in orphaned and run["by"] != victim.owner and int(run["at"]) > killed_at:  # type: ignore[call-overload]
            resumed[name] = min(resumed.get(name, int(run["at"])), int(run["at"]))  # type: ignore[call-overload]
    assert set(resumed) == orphaned, f"repositories never carried on: {orphaned - set(resumed)}"
    taken_over_after = (max(resumed.values()) - killed_at) / 1e9
    assert taken_over_after < 30, f"its repositories were carried on after {taken_over_after:.1f} s"
    assert_once_and_in_order(sender.acknowledged, seen)
    by_replica = {replica.owner: 0 for replica in replicas}
    for runs in seen.values():
        by_replica[str(runs[0]["by"])] += 1
    assert all(by_replica.values()), f"every replica did part of the work: {by_replica}"
    print(f"processed per replica {by_replica}; the killed one's {len(orphaned)} repositories owned again "
          f"after {taken_over_after:.1f} s; {sender.refused} sends refused and sent again")


async def test_a_rolling_restart_of_two_replicas_loses_no_delivery(store_url: str, tmp_path: Path) -> None:
    replicas = [start_replica(store_url, tmp_path / f"replica-{n}") for n in range(2)]
    try:
        sender = Sender(list(replicas))
        async with aiohttp.ClientSession() as session:
            streams = [asyncio.create_task(sender.send_repo(session, f"acme/roll-{n}", 120, n)) for n in range(6)]
            for index in range(2):  # replace each replica in turn while deliveries keep coming
                while len(sender.acknowledged) < 150 * (index + 1):
                    await asyncio.sleep(0.05)
                old = replicas[index]
                sender.replicas = [replica for replica in replicas if replica is not old]
                old.process.send_signal(signal.SIGTERM)
                await asyncio.to_thread(old.process.wait, 30)
                replicas[index] = await asyncio.to_thread(start_replica, store_url, tmp_path / f"replica-{index}")
                sender.replicas = list(replicas)
            await asyncio.gather(*streams)
        await wait_processed(store_url, set(sender.acknowledged))
    finally:
        stop_all(replicas)

    assert len(sender.acknowledged) == 720, "every delivery was acknowledged by some replica"
    assert_once_and_in_order(sender.acknowledged, await processings(store_url))


async def test_connections_terminated_mid_transaction_lose_nothing_and_repeat_nothing(
    store_url: str, postgres_server: PostgresServer, tmp_path: Path
) -> None:
    # Every backend of the store killed 40 times under load: commits whose answer is lost,
    # transactions cut in the middle, questions about them cut too.
    replicas = [start_replica(store_url, tmp_path / f"replica-{n}") for n in range(2)]
    database = store_url.rsplit("/", 1)[1]
    try:
        sender = Sender(list(replicas))
        async with aiohttp.ClientSession() as session:
            streams = [asyncio.create_task(sender.send_repo(session, f"acme/t-{n}", 150, n)) for n in range(6)]
            while len(sender.acknowledged) < 150:
                await asyncio.sleep(0.05)
            admin = await asyncpg.connect(postgres_server.url("postgres"))
            try:
                for _ in range(40):
                    await admin.fetch("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                                      " WHERE datname = $1 AND pid <> pg_backend_pid()", database)
                    await asyncio.sleep(0.15)
            finally:
                await admin.close()
            await asyncio.wait_for(asyncio.gather(*streams), 120)
        await wait_processed(store_url, set(sender.acknowledged))
    finally:
        stop_all(replicas)

    assert len(sender.acknowledged) == 900
    assert_once_and_in_order(sender.acknowledged, await processings(store_url))
