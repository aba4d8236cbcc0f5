"""A replica asks another to reconcile a repository it holds (`klaud_reconcile`), end to end:
two replicas on one PostgreSQL and one sandbox GitHub, as in test_replica_handover.py.

The App is suspended and then unsuspended; the `installation` events reach the leader, A, and
one of the repositories is kept by B. A pull request opened while the installation was
suspended sent no webhook: B must read it again. Before, the leader read again only the
repositories in its own memory, and B's missed the PR until the next light reconcile, hours
later.
"""

from __future__ import annotations

from pathlib import Path

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
        await run.sandbox.act({"action": "suspend_app", "installation_id": 1})
        opened = await run.sandbox.act({"action": "open_pull", "repo": moving, "pull": sc.image_bump(12)})
        assert opened["deliveries"] == []  # GitHub sends a suspended installation no webhook
        await processed(run)

        await run.sandbox.act({"action": "unsuspend_app", "installation_id": 1})  # A leads: A handles it
        await processed(run)
        await settle_both(run, b)

        assert run.klaud.live.repo(moving) is None, "the leader built a second state of B's repository"
        assert b.live.repo(moving).overlap.get(12) is not None, "B never read again what moved while suspended"
