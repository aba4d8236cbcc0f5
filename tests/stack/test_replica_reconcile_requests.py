"""A replica asks another to reconcile a repository it holds (`klaud_reconcile`), end to end:
two replicas on one PostgreSQL and one sandbox GitHub, as in test_replica_handover.py.

`installation` unsuspend (its payload names no repository) reaches the leader, A; one of the
repositories is kept by B. A pull request opened while the installation was suspended sent
no webhook: B must read it again. Before, the leader read again only the repositories in
its own memory, and B's missed the PR until the next light reconcile, hours later.
"""

from __future__ import annotations

import json
from pathlib import Path

from handlers.context import WebhookEvent
from handlers.installation import on_installation
from tests import scenarios as sc
from tests.stack.test_replica_handover import (
    moving_repository,
    processed,
    rebalance,
    settle_both,
    two_replicas,
    two_repositories,
)


async def test_unsuspend_at_the_leader_has_the_other_replica_read_its_repository_again(
    tmp_path: Path, store_url: str
) -> None:
    async with two_replicas(tmp_path, store_url, two_repositories([])) as (run, b):
        moving = moving_repository(run)
        await rebalance(run, b, moving)
        run.sandbox.set_faults({"rules": [{"webhook": "pull_request", "count": 1}]})  # suspended: not sent
        await run.sandbox.act({"action": "open_pull", "repo": moving, "pull": sc.image_bump(12)})
        await processed(run)
        assert b.live.repo(moving).overlap.get(12) is None

        body = json.dumps({"action": "unsuspend", "installation": {"id": 1}}).encode()
        event = WebhookEvent(body, event="installation", delivery_id="unsuspend", action="unsuspend")
        await on_installation(event, run.klaud.services)  # as A's inbox runs it (A leads)
        await processed(run)
        await settle_both(run, b)

        assert run.klaud.live.repo(moving) is None, "the leader built a second state of B's repository"
        assert b.live.repo(moving).overlap.get(12) is not None, "B never read again what moved while suspended"
