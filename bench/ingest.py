"""Ingest benchmark: signed deliveries over loopback into a server with the SQLite inbox.

Starts a Klaud server in a child process (real intake, real durable inbox, real worker; the
handler returns at once so the figures measure intake and the inbox, not GitHub),
sends N realistic `pull_request` deliveries from C concurrent clients, waits for the worker
to drain, then counts what was processed and what was lost.

Last line: {"deliveries_per_s", "p50_ms", "p99_ms", "processed", "lost"} where the
latencies are acknowledgement latencies (request sent to 202 received).
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
from dataclasses import dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness import SECRET, headers_for
from tests.helpers.slow_server import wait_for_urls

# The same server the kill-and-restart test uses, with a handler that returns at once.
SERVER = ROOT / "tests" / "helpers" / "slow_server.py"


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
                             "body": "y" * 4000, "head": {"ref": "bump", "sha": "a" * 40, "repo": repo},
                             "base": {"ref": "main", "sha": "b" * 40, "repo": repo}, "draft": False,
                             "labels": [], "updated_at": "2026-11-30T08:00:00Z"},
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

    @property
    def per_s(self) -> float:
        return len(self.latencies_ms) / self.elapsed_s

    @property
    def p50_ms(self) -> float:
        return statistics.median(self.latencies_ms)

    @property
    def p99_ms(self) -> float:
        return percentile(self.latencies_ms, 0.99)


async def send(webhook_url: str, load: Load, clients: int) -> Sent:
    """POST every delivery of `load` to `webhook_url` from `clients` concurrent clients."""
    latencies: list[float] = []
    accepted: list[str] = []
    pending = iter(range(len(load.bodies)))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:

        async def client() -> None:
            for index in pending:
                headers = load.headers[index]
                started = time.perf_counter()
                async with session.post(webhook_url, data=load.bodies[index], headers=headers) as response:
                    await response.read()
                    if 200 <= response.status < 300:
                        accepted.append(headers["X-GitHub-Delivery"])
                latencies.append((time.perf_counter() - started) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        return Sent(latencies, accepted, time.perf_counter() - started)


async def wait_drained(url: str) -> None:
    """Until Klaud's inbox backlog (on /readyz of either listener) is empty."""
    async with aiohttp.ClientSession() as session:
        for _ in range(60_000):
            async with session.get(f"{url}/readyz") as response:
                if (await response.json())["backlog"] == 0:
                    return
            await asyncio.sleep(0.01)
    raise RuntimeError("the inbox did not drain within 10 minutes")


async def send_and_drain(url: str, load: Load, clients: int) -> Sent:
    sent = await send(f"{url}/webhook", load, clients)
    await wait_drained(url)
    return sent


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deliveries", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args()
    load = make_load(args.deliveries)
    with tempfile.TemporaryDirectory() as tmp:
        db, urls_file = Path(tmp) / "bench.db", Path(tmp) / "urls"
        server = subprocess.Popen(
            [sys.executable, str(SERVER), str(db), str(urls_file), "0"],
            stderr=subprocess.DEVNULL,
        )
        try:
            url, _ = wait_for_urls(urls_file, server)
            sent = asyncio.run(send_and_drain(url, load, args.clients))
        finally:
            server.terminate()
            server.wait()
        with sqlite3.connect(db) as conn:
            done = {row[0] for row in conn.execute("SELECT id FROM deliveries WHERE status = 'done'")}
    processed = len(done)
    lost = len(set(sent.accepted) - done)
    print(f"sent {args.deliveries} deliveries from {args.clients} clients in {sent.elapsed_s:.2f} s; "
          f"accepted {len(sent.accepted)}; processed {processed}")
    print(json.dumps({
        "deliveries_per_s": round(sent.per_s, 1),
        "p50_ms": round(sent.p50_ms, 2),
        "p99_ms": round(sent.p99_ms, 2),
        "processed": processed,
        "lost": lost,
    }))


if __name__ == "__main__":
    main()
