"""Installation-wide work with replicas: the leader (holding the installations lease)
handles installation events and discovers, but keeps only its share of the repositories in
memory. What it cannot do itself is done through the store: it forgets repositories another
replica keeps (their lease passes to it), and asks the holder of a repository to reconcile
it with a `klaud_reconcile` delivery, which the inbox hands to that holder.

Each test failed before: the leader looked only at its own memory (a review of handlers
under replicas found them).
"""

from __future__ import annotations

import json
from datetime import timedelta
from types import SimpleNamespace

from bot.core.events import RECONCILE_REQUEST, Named, Repository
from bot.store.engine import Statement
from handlers.context import WebhookEvent
from handlers.installation import on_installation
from handlers.klaud_reconcile import on_reconcile_request
from tests.services.fakes import pull
from tests.services.test_replica_races import (
    NOW,
    Node,
    github,
    in_delivery,
    nodes,
    put_delivery,
    rename_on_github,
)

__all__ = ["github", "nodes"]  # fixtures


async def leader_and_keeper(nodes) -> tuple[Node, Node]:  # type: ignore[no-untyped-def]
    """`a` leads; `b` keeps o/a (id 4242, installation 1)."""
    a = await nodes("a")
    await a.replicas.round()
    b = await nodes("b")
    await b.replicas.round()
    await b.reconciler.reconcile("o/a", 1)
    assert a.replicas.leads() and b.replicas.owns("o/a") and a.live.repo("o/a") is None
    return a, b


async def installation_event(node: Node, action: str, **fields: object) -> None:
    body = json.dumps({"action": action, "installation": {"id": 1}, **fields}).encode()
    await on_installation(WebhookEvent(body, event="installation", delivery_id=action, action=action),
                          SimpleNamespace(repos=node.reconciler))


async def run_requests(node: Node) -> list[str]:
    """Claim what `node` owns and run the reconcile requests among it, as its inbox would."""
    deliveries = node.stores.deliveries
    claimed = await deliveries.claim_owned(node.owner, node.replicas.repos(), unrouted=False, limit=50)
    bodies = await deliveries.bodies([d.id for d in claimed])
    ran = []
    for delivery in claimed:
        if delivery.event == RECONCILE_REQUEST:
            event = WebhookEvent(bodies[delivery.id], event=delivery.event, delivery_id=delivery.id,
                                 action=delivery.action)
            await in_delivery(node, delivery.id,
                              lambda event=event: on_reconcile_request(event, SimpleNamespace(repos=node.reconciler)))
            ran.append(f"{delivery.action} {delivery.repo}")
    return ran


async def test_unsuspend_at_the_leader_has_the_keeper_read_its_repository_again(nodes, github) -> None:
    a, b = await leader_and_keeper(nodes)
    github.repos["o/a"].pulls[12] = pull(12, updated_at=NOW - timedelta(hours=1), repo="o/a")  # while suspended

    await installation_event(a, "unsuspend")

    assert a.live.repo("o/a") is None  # not built at the leader beside b's
    assert await run_requests(b) == ["light o/a"]
    state = b.live.repo("o/a")
    assert state is not None and state.overlap.get(12) is not None


async def test_an_added_repository_leased_elsewhere_for_an_event_that_builds_nothing_is_reconciled_by_its_holder(
    nodes, github
) -> None:
    a = await nodes("a")
    await a.replicas.round()
    b = await nodes("b")
    await put_delivery(b, "s1", "o/a", "check_suite")  # no handler builds state for it
    await b.replicas.round()
    assert b.replicas.owns("o/a") and b.live.repo("o/a") is None

    await installation_event(a, "created", repositories=[{"full_name": "o/a", "id": 4242}])

    assert await run_requests(b) == ["full o/a"]
    state = b.live.repo("o/a")
    assert state is not None and state.catalog and "o/a" in await a.stores.state.repos()


async def test_discovery_at_the_leader_forgets_an_unlisted_repository_another_replica_keeps(nodes, github) -> None:
    a, b = await leader_and_keeper(nodes)
    del github.repos["o/a"]  # no installation has it any more, by name or by id

    await a.reconciler.reconcile_new_installations()

    assert "o/a" not in await a.stores.state.repos()
    await b.replicas.round()  # its lease passed to the leader with the forgetting
    assert b.live.repo("o/a") is None


async def test_a_removal_at_the_leader_finds_by_id_a_repository_another_replica_keeps_under_its_old_name(
    nodes, github
) -> None:
    a, _ = await leader_and_keeper(nodes)
    rename_on_github(github, "o/a", "o/renamed")  # its `repository renamed` lost

    await a.reconciler.forget(1, [Named(full_name="o/renamed", id=4242)])

    assert "o/a" not in await a.stores.state.repos()


async def test_a_late_removal_at_the_leader_keeps_a_new_repository_of_the_name_another_replica_keeps(
    nodes, github
) -> None:
    a, _ = await leader_and_keeper(nodes)

    await a.reconciler.forget(1, [Named(full_name="o/a", id=17)])  # the one deleted before, id 17

    assert "o/a" in await a.stores.state.repos()


async def test_discovery_at_the_leader_has_a_repository_another_replica_keeps_rebuilt_nowhere(nodes, github) -> None:
    a, b = await leader_and_keeper(nodes)
    kept = b.live.repo("o/a")
    github.repos["o/a"].calls.clear()

    assert await a.reconciler.reconcile_new_installations() == []
    assert await run_requests(b) == ["ensure o/a"]  # b keeps it: nothing to do

    assert a.live.repo("o/a") is None and b.live.repo("o/a") is kept and github.repos["o/a"].calls == []


async def test_discovery_at_the_leader_has_the_keeper_follow_a_repository_to_its_new_installation(
        nodes, github, monkeypatch) -> None:
    # The App installed again while its installation events were lost: installation 1, the
    # kept one, reaches the repository no more; GitHub lists it under installation 2.
    a, b = await leader_and_keeper(nodes)
    listed = await github.repositories(1)

    async def only_the_new_installation() -> list[int]:
        return [2]

    async def its_repositories(installation: int) -> list[Repository]:
        return listed if installation == 2 else []

    monkeypatch.setattr(github, "installations", only_the_new_installation)
    monkeypatch.setattr(github, "repositories", its_repositories)
    await a.reconciler.reconcile_new_installations()
    assert await run_requests(b) == ["light o/a"]
    assert b.live.repo("o/a").meta.installation == 2 and a.live.repo("o/a") is None


async def test_discovery_has_a_repository_whose_stored_record_its_holder_could_not_read_rebuilt(nodes, github) -> None:
    a = await nodes("a")
    await a.replicas.round()
    b = await nodes("b")
    meta = '{"installation": 1, "repo_id": 4242, "wave": "not a number"}'  # another version's
    await b.stores.engine.transaction(
        [Statement("INSERT INTO records (repo, kind, key, data) VALUES ('', 'repo', 'o/a', ?::json)", (meta,))]
    )
    await b.replicas.round()
    assert b.replicas.owns("o/a") and b.live.repo("o/a") is None

    await a.reconciler.reconcile_new_installations()
    assert await run_requests(b) == ["ensure o/a"]

    state = b.live.repo("o/a")
    assert state is not None and state.catalog, "o/a has no state anywhere"


async def test_a_request_for_a_new_name_builds_no_second_state_beside_the_keepers(nodes, github) -> None:
    a, b = await leader_and_keeper(nodes)
    rename_on_github(github, "o/a", "o/renamed")  # its `repository renamed` lost
    c = await nodes("c")
    await put_delivery(c, "s1", "o/renamed", "check_suite")
    await c.replicas.round()
    assert c.replicas.owns("o/renamed") and b.replicas.owns("o/a")

    await installation_event(a, "new_permissions_accepted", repositories=[{"full_name": "o/renamed", "id": 4242}])
    assert await run_requests(c) == ["full o/renamed"]  # c finds it kept by b as o/a: asks b
    assert await run_requests(b) == ["light o/a"]  # b follows the rename

    with_id = sorted(repo.name for repo in await a.stores.state.stored_repos() if repo.repo_id == 4242)
    assert with_id == ["o/renamed"] and c.live.repo("o/renamed") is None


async def test_discovery_keeps_what_another_replica_admitted_while_it_listed(nodes, github) -> None:
    a, b = await leader_and_keeper(nodes)
    by_id = github.repository_by_id

    async def repositories(installation: int) -> list[Repository]:
        await b.reconciler.reconcile("o/a", 2)  # moved to installation 2, meanwhile
        return []  # the listing: removed from 1, not yet listed in 2

    async def repository_by_id(installation: int, repository_id: int) -> Repository | None:
        return None if installation == 1 else await by_id(installation, repository_id)

    github.repositories, github.repository_by_id = repositories, repository_by_id
    await a.reconciler.reconcile_new_installations()

    assert "o/a" in await a.stores.state.repos(), "the leader forgot the repository b just admitted"
