"""Benchmark: GETs per second through Klaud's GitHub client, with and without ETag hits.

Starts the sandbox GitHub on 127.0.0.1 (port 0) and sends `--requests` GETs through one
installation client: the first half to distinct URLs (each a cache miss, answered 200 with
an ETag), the second half to the same URLs again (conditional GETs the sandbox answers 304
and the client serves from its ETag cache). Prints figures per phase; the last line is one
JSON object: {"requests_per_s": ..., "etag_hit_share": ...}.

    .venv/bin/python bench/client.py [--requests N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from aiohttp import web

# Runnable from a checkout that is not installed, like the other benchmarks.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bot.github.client import GitHubApp
from bot.sandbox import Sandbox

PULLS = 50


def scenario() -> dict[str, Any]:
    return {
        "now": "2026-11-30T08:00:00Z",
        # The bench measures the client, not the sandbox's hourly budget.
        "rate_limit": 1_000_000,
        "repositories": [
            {
                "full_name": "acme/bench",
                "installation_id": 1,
                "files": {"configs/nvidia-master.yaml": "fam:\n  image: lmsysorg/sglang:v0.5.3\n"},
                "pulls": [
                    {"number": n, "title": f"Bump {n}", "user": "bob", "head_ref": f"bump-{n}",
                     "files": [{"filename": f"docs/{n}.md", "content": f"change {n}\n"}]}
                    for n in range(1, PULLS + 1)
                ],
            }
        ],
    }


@dataclass
class Phase:
    name: str
    requests: int
    seconds: float

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


async def timed_gets(client: Any, urls: list[str], concurrency: int, name: str) -> Phase:
    limit = asyncio.Semaphore(concurrency)

    async def get(url: str) -> None:
        async with limit:
            await client.getitem(url)

    started = time.perf_counter()
    await asyncio.gather(*(get(url) for url in urls))
    return Phase(name, len(urls), time.perf_counter() - started)


async def run(total: int, concurrency: int) -> dict[str, float]:
    sandbox = Sandbox(scenario(), webhook_secret=None)
    runner = web.AppRunner(sandbox.create_app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as session:
            app = GitHubApp(
                session,
                base_url=f"http://127.0.0.1:{port}/_sandbox/github",
                app_id=1,
                private_key=None,
                clock=sandbox.clock,
            )
            client = app.installation(1)
            await client.getitem("/repos/acme/bench")  # mint the token outside the timing
            sandbox.log.reset()
            # A distinct query string per request makes each first-half URL its own cache entry.
            half = total // 2
            cold_urls = [f"/repos/acme/bench/pulls/{i % PULLS + 1}?probe={i}" for i in range(half)]
            warm_urls = [cold_urls[i % half] for i in range(total - half)]
            cold = await timed_gets(client, cold_urls, concurrency, "distinct URLs (ETag misses)")
            warm = await timed_gets(client, warm_urls, concurrency, "repeated URLs (ETag hits)")
    finally:
        await runner.cleanup()

    statuses = [entry["status"] for entry in sandbox.request_log["requests"]]
    hits = statuses.count(304)
    for phase in (cold, warm):
        print(f"{phase.name:32s} {phase.requests:6d} GETs  {phase.seconds:7.3f} s  {phase.per_second:9.1f} req/s")
    seconds = cold.seconds + warm.seconds
    print(f"{'all':32s} {len(statuses):6d} GETs  {seconds:7.3f} s  {len(statuses) / seconds:9.1f} req/s")
    print(f"answers: {statuses.count(200)} x 200, {hits} x 304, {len(statuses) - statuses.count(200) - hits} other")
    return {
        "requests_per_s": round(len(statuses) / seconds, 1),
        "etag_hit_share": round(hits / len(statuses), 4) if statuses else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="GETs to send (default 2000)")
    parser.add_argument("--concurrency", type=int, default=8, help="GETs in flight at once (default 8)")
    args = parser.parse_args(argv)
    if args.requests < 2 or args.concurrency < 1:
        parser.error("--requests must be at least 2 and --concurrency at least 1")
    # Per-request debug lines would dominate the output and the time measured.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    result = asyncio.run(run(args.requests, args.concurrency))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
