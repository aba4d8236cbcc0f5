"""A Klaud server whose pull_request handler only waits, for the kill-and-restart test
and (with 0 seconds) the ingest benchmark: real intake, inbox and worker, no GitHub.

Usage: python slow_server.py DB_PATH PORT_FILE SECONDS_PER_DELIVERY
Writes the port it listens on to PORT_FILE once ready, then serves until killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aiohttp import web
from gidgethub import routing

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bot.app import Klaud
from bot.log import configure_logging
from bot.web.server import create_app
from tests.harness import make_settings


async def main(db: str, port_file: str, seconds: float) -> None:
    router = routing.Router()

    @router.register("pull_request")
    async def slow(event, ctx) -> None:
        await asyncio.sleep(seconds)

    configure_logging("json")
    klaud = Klaud(make_settings(Path(db)), router=router)
    await klaud.start()
    runner = web.AppRunner(create_app(klaud), access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    Path(port_file).write_text(str(port))
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
