"""A Klaud replica on a PostgreSQL store whose pull_request handler records what it processed,
for the replica tests and `bench/ingest.py --replicas`: real listeners, shared inbox,
leases and claims; no GitHub.

Each processed delivery leaves a record `seen/<delivery id>/<random>` in the state store,
committed with the delivery's status (one transaction): two records for one delivery would
mean it was processed twice.

Usage: python replica_server.py STORE_URL URLS_FILE [LEASE_SECONDS [record|parse]]
With `parse` the handler does the real pull_request handler's one parse of the body and
returns (the ingest benchmark measures intake and the inbox, like slow_server's).
Once ready, writes {"url", "admin_url", "owner"} to URLS_FILE; SIGTERM stops it cleanly
(running handlers finish, leases are released), SIGKILL is a crash.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

import msgspec
from gidgethub import routing

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bot.app import Klaud
from bot.core.events import PullRequestEvent
from bot.log import configure_logging
from bot.services.replicas import replica_id
from bot.store.change import Change
from handlers.context import WebhookEvent
from tests.harness import make_settings
from tests.helpers.slow_server import serve_until_terminated

SCRIPT = Path(__file__)


async def main(store_url: str, urls_file: str, lease_seconds: float, handler: str) -> None:
    owner = replica_id()
    router = routing.Router()

    async def record(event, services) -> None:  # type: ignore[no-untyped-def]
        payload = msgspec.json.decode(event.body)
        repo = payload["repository"]["full_name"]
        seen = {"n": payload["number"], "at": time.time_ns(), "by": owner}
        await services.live.persist(Change().put(repo, "seen", f"{event.delivery_id}/{uuid.uuid4().hex}", seen))

    async def parse(event: WebhookEvent, services: object) -> None:
        event.parsed(PullRequestEvent)

    router.add({"record": record, "parse": parse}[handler], "pull_request")

    configure_logging("json")
    with tempfile.TemporaryDirectory() as unused:
        settings = make_settings(Path(unused) / "unused.db", KLAUD_DB=store_url)
    klaud = Klaud(settings, router=router)
    assert klaud.replicas is not None, "a replica needs a PostgreSQL store"
    klaud.replicas.owner = owner
    klaud.replicas.lease_seconds = lease_seconds
    klaud.replicas.round_seconds = max(0.2, lease_seconds / 5)
    await klaud.start()
    await serve_until_terminated(klaud, urls_file, owner=owner)


if __name__ == "__main__":
    lease = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
    asyncio.run(main(sys.argv[1], sys.argv[2], lease, sys.argv[4] if len(sys.argv) > 4 else "record"))
