"""A Klaud replica as `klaud serve` runs it on a PostgreSQL store (the real handlers, the
scheduler, start-up reconcile), whose GitHub is a sandbox served by another process (the
test's): for the replica tests that need real waves, claims and dispatches.

Usage: python sandbox_replica_server.py STORE_URL SANDBOX_URL KEY_FILE URLS_FILE CLOCK_OFFSET
SANDBOX_URL is the origin serving `/_sandbox/` (GitHub API at `/_sandbox/github`, capacity
feed at `/_sandbox/capacity`); KEY_FILE the App's private key (PEM) the sandbox checks
JWTs against; CLOCK_OFFSET the seconds from the wall clock to the sandbox's time line (see
`ShiftedClock`). Leases and rounds keep the product's defaults, so a takeover takes as
long as in production. Once ready, writes {"url", "admin_url", "owner"} to URLS_FILE;
SIGTERM stops it cleanly, SIGKILL is a crash.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bot.app import Klaud
from bot.core.clock import ManualClock
from bot.log import configure_logging
from bot.runtime import SANDBOX_APP_ID
from tests.harness import make_settings
from tests.helpers.slow_server import serve_until_terminated

SCRIPT = Path(__file__)


class ShiftedClock(ManualClock):
    """The wall clock moved onto a scenario's time line: it runs in real time.

    In `serve --sandbox` the bot shares the sandbox's clock object; processes cannot, so the
    sandbox and every replica use this clock with one offset and agree on "now" (capacity
    freshness, JWT times, cooldowns) while the scenario keeps its dates whatever the day.
    """

    def __init__(self, offset_seconds: float) -> None:
        super().__init__()
        self.offset = timedelta(seconds=offset_seconds)

    def now(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def set(self, when: datetime) -> None:
        self.offset = when.astimezone(UTC) - datetime.now(UTC)

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)

    async def sleep(self, seconds: float) -> None:
        # The waits of the GitHub client (one second between an installation's writes,
        # retry backoff) pass at once, as with the sandbox's clock in `serve --sandbox`;
        # unlike there, they do not move the time line, which every process must share.
        await asyncio.sleep(0)


async def main(store_url: str, sandbox_url: str, key_file: str, urls_file: str, offset: float) -> None:
    configure_logging("json", "info")
    with tempfile.TemporaryDirectory() as unused:
        settings = make_settings(
            Path(unused) / "unused.db",
            KLAUD_DB=store_url,
            KLAUD_GITHUB_URL=f"{sandbox_url}/_sandbox/github",
            KLAUD_CAPACITY_URL=f"{sandbox_url}/_sandbox/capacity",
            KLAUD_APP_ID=str(SANDBOX_APP_ID),
            KLAUD_PRIVATE_KEY=Path(key_file).read_text(),
        )
    klaud = Klaud(settings, clock=ShiftedClock(offset))
    assert klaud.replicas is not None, "a replica needs a PostgreSQL store"
    # As `klaud serve` starts: the replica that leads reconciles the installations.
    await klaud.start(drain=True, schedule=True, reconcile=True)
    await serve_until_terminated(klaud, urls_file, owner=klaud.replicas.owner)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])))
