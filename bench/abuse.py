"""Abuse benchmark (issue 11): what hostile senders cost the real server, in memory and labels.

Starts a Klaud server in a child process (tests/helpers/slow_server.py: real listeners,
durable inbox and worker, handlers stubbed) and runs three rows against its /webhook:

- stalled: N connections announce a 25 MiB unsigned body, send 24 MiB of it, then stall;
- gzip: connections send a 24 KB gzip body that inflates to 23 MiB (unsigned), and one that
  inflates past 25 MiB;
- labels: 20,000 unsigned requests, each with a random X-GitHub-Event.

Memory is the server's peak RSS (VmHWM of /proc/<pid>/status), reset between rows through
/proc/<pid>/clear_refs where the kernel allows it. Only 127.0.0.1 is contacted.

Last line: {"peak_rss_mib", "baseline_rss_mib", "stalled_peak_rss_mib", "gzip_peak_rss_mib",
"labels_peak_rss_mib", "metrics_bytes", "rejected_per_s"}.
Targets: peak RSS < 150 MiB with 50 stalled 25 MiB uploads; /metrics < 64 KB after 20,000
rejected requests.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.slow_server import SCRIPT as SERVER
from tests.helpers.slow_server import wait_for_urls

MIB = 1024 * 1024
T = TypeVar("T")
BOGUS_SIGNATURE = "sha256=" + "0" * 64  # well formed, so the body is read before it is refused


class Server:
    """The server process's memory, from /proc."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def status_mib(self, field: str) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"no {field} in /proc/{self.pid}/status")

    def reset_peak(self) -> bool:
        """Start a new VmHWM (Linux ≥ 4.0, own processes); False when the kernel refuses."""
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        except OSError:
            return False
        return True


def upload_head(url: str, length: int, *, encoding: str | None = None) -> bytes:
    lines = [
        "POST /webhook HTTP/1.1",
        f"Host: {urlsplit(url).netloc}",
        "Content-Type: application/json",
        f"Content-Length: {length}",
        "X-GitHub-Event: pull_request",
        f"X-GitHub-Delivery: abuse-{secrets.token_hex(8)}",
        f"X-Hub-Signature-256: {BOGUS_SIGNATURE}",
    ]
    if encoding:
        lines.append(f"Content-Encoding: {encoding}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def stalled_upload(url: str, announced: int, sent: int, progress: list[int], index: int) -> asyncio.StreamWriter:
    """Announce `announced` bytes, send `sent` of them (as fast as the server reads), stall."""
    where = urlsplit(url)
    _, writer = await asyncio.open_connection(where.hostname, where.port)
    writer.write(upload_head(url, announced))
    piece = b" " * MIB
    for _ in range(sent // MIB):
        writer.write(piece)
        await writer.drain()  # blocks while the server leaves this body unread
        progress[index] += MIB
    return writer


async def stalled_row(url: str, uploads: int, seconds: float) -> int:
    """Returns how many bodies were fully sent (that is, read by the server) before the stall."""
    progress = [0] * uploads
    tasks = [asyncio.create_task(stalled_upload(url, 25 * MIB, 24 * MIB, progress, n)) for n in range(uploads)]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        await asyncio.sleep(0.25)
    finished = sum(1 for sent in progress if sent >= 24 * MIB)
    for task in tasks:
        if task.done() and not task.exception():
            task.result().close()
        else:
            task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return finished


async def gzip_row(url: str, connections: int, rounds: int) -> dict[str, int]:
    """Unsigned 24 KB gzip bodies inflating to 23 MiB, then one inflating past 25 MiB."""
    inflating = gzip.compress(b'{"pad": "' + b"a" * (23 * MIB) + b'"}')
    bomb = gzip.compress(b'{"pad": "' + b"a" * (26 * MIB) + b'"}')
    statuses: dict[str, int] = {}
    async with aiohttp.ClientSession() as session:

        async def post(body: bytes) -> int:
            headers = {"Content-Type": "application/json", "Content-Encoding": "gzip",
                       "X-GitHub-Event": "pull_request", "X-GitHub-Delivery": f"gz-{secrets.token_hex(8)}",
                       "X-Hub-Signature-256": BOGUS_SIGNATURE}
            async with session.post(f"{url}/webhook", data=body, headers=headers) as response:
                await response.read()
                return response.status

        for _ in range(rounds):
            for status in await asyncio.gather(*(post(inflating) for _ in range(connections))):
                statuses[f"23MiB:{status}"] = statuses.get(f"23MiB:{status}", 0) + 1
        statuses[f"26MiB:{await post(bomb)}"] = 1
    print(f"  gzip: {len(inflating)} B -> 23 MiB x {connections} x {rounds}, bomb {len(bomb)} B; answers {statuses}")
    return statuses


async def labels_row(url: str, admin_url: str, requests: int, clients: int) -> tuple[int, float]:
    """Unsigned requests with random event names; returns (/metrics bytes, requests/s)."""
    names = [f"evt_{secrets.token_hex(6)}" for _ in range(requests)]
    queue = iter(names)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:

        async def client() -> None:
            for name in queue:
                headers = {"Content-Type": "application/json", "X-GitHub-Event": name, "X-GitHub-Delivery": name}
                async with session.post(f"{url}/webhook", data=b"{}", headers=headers) as response:
                    await response.read()

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.perf_counter() - started
        async with session.get(f"{admin_url}/metrics") as response:
            text = await response.text()
    leaked = sum(1 for name in names[:1000] if name in text)
    print(f"  labels: {requests} rejected in {elapsed:.1f} s; /metrics {len(text.encode())} B; names leaked {leaked}")
    return len(text.encode()), requests / elapsed


def measured(server: Server, label: str, run: Coroutine[Any, Any, T]) -> tuple[T, float]:
    reset = server.reset_peak()
    result = asyncio.run(run)
    peak = server.status_mib("VmHWM")
    print(f"{label}: peak RSS {peak:.1f} MiB{'' if reset else ' (since start: clear_refs refused)'}")
    return result, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--uploads", type=int, default=50, help="stalled 25 MiB uploads")
    parser.add_argument("--stall-seconds", type=float, default=8.0, help="how long the uploads are held")
    parser.add_argument("--gzip-connections", type=int, default=8)
    parser.add_argument("--gzip-rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=20_000, help="rejected requests with random event names")
    parser.add_argument("--clients", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        urls_file = Path(tmp) / "urls"
        process = subprocess.Popen([sys.executable, str(SERVER), str(Path(tmp) / "abuse.db"), str(urls_file), "0"],
                                   stderr=subprocess.DEVNULL)
        try:
            url, admin_url = wait_for_urls(urls_file, process)
            server = Server(process.pid)
            baseline = server.status_mib("VmRSS")
            print(f"server pid {process.pid}: RSS {baseline:.1f} MiB at start")
            finished, stalled_peak = measured(server, f"stalled: {args.uploads} x 25 MiB unsigned",
                                              stalled_row(url, args.uploads, args.stall_seconds))
            print(f"  stalled: {finished} of {args.uploads} bodies were read whole before the stall (the rest waited)")
            _, gzip_peak = measured(server, "gzip", gzip_row(url, args.gzip_connections, args.gzip_rounds))
            (metrics_bytes, rate), labels_peak = measured(
                server, "labels", labels_row(url, admin_url, args.requests, args.clients)
            )
        finally:
            process.terminate()
            process.wait()
    print(json.dumps({
        "peak_rss_mib": round(max(stalled_peak, gzip_peak, labels_peak), 1),
        "baseline_rss_mib": round(baseline, 1),
        "stalled_peak_rss_mib": round(stalled_peak, 1),
        "gzip_peak_rss_mib": round(gzip_peak, 1),
        "labels_peak_rss_mib": round(labels_peak, 1),
        "metrics_bytes": metrics_bytes,
        "rejected_per_s": round(rate, 1),
    }))


if __name__ == "__main__":
    main()
