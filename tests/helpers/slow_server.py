"""A Klaud server whose pull_request handler only waits, for the kill-and-restart test
and (with 0 seconds) the benchmarks: real listeners, inbox and worker, no GitHub.

Usage: python slow_server.py DB_PATH URLS_FILE SECONDS_PER_DELIVERY
Once ready, writes {"url": webhook listener, "admin_url": admin listener} to URLS_FILE
(`wait_for_urls` reads it), then serves until killed.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from gidgethub import routing

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bot.app import Klaud
from bot.core.events import PullRequestEvent
from bot.log import configure_logging
from bot.web.admin import create_admin_app
from bot.web.server import bind, start_listeners
from bot.web.webhook import create_webhook_app
from handlers.context import WebhookEvent
from tests.harness import make_settings

SCRIPT = Path(__file__)


async def main(db: str, urls_file: str, seconds: float) -> None:
    router = routing.Router()

    @router.register("pull_request")
    async def slow(event: WebhookEvent, ctx: object) -> None:
        # The real handler's one parse of the body, then the wait in place of its work.
        event.parsed(PullRequestEvent)
        await asyncio.sleep(seconds)

    configure_logging("json")
    klaud = Klaud(make_settings(Path(db)), router=router)
    await klaud.start()
    await serve_until_terminated(klaud, urls_file)


async def serve_until_terminated(klaud: Klaud, urls_file: str, **extra: object) -> None:
    """Serve started `klaud` on both listeners (free ports of 127.0.0.1), write
    {"url", "admin_url", **extra} to `urls_file` for `wait_for_urls`, then serve until
    SIGTERM, which stops it cleanly (SIGKILL is a crash)."""
    listeners = await start_listeners(
        (create_webhook_app(klaud), bind("127.0.0.1", 0, "webhook")),
        (create_admin_app(klaud), bind("127.0.0.1", 0, "admin")),
        shutdown_timeout=0.5,
    )
    # Renamed into place, so a reader never sees half of it.
    partial = Path(urls_file + ".partial")
    partial.write_text(json.dumps({"url": listeners.url, "admin_url": listeners.admin_url, **extra}))
    partial.replace(urls_file)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await listeners.stop()
    await klaud.stop()


def wait_for_urls(urls_file: Path, server: subprocess.Popen, timeout: float = 30.0) -> tuple[str, str]:
    """(webhook URL, admin URL) of a started slow_server, once it serves."""
    deadline = time.monotonic() + timeout
    while not (urls_file.exists() and urls_file.read_text()):
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start (exit status {server.returncode})")
        time.sleep(0.05)
    urls = json.loads(urls_file.read_text())
    return urls["url"], urls["admin_url"]


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
