"""Races between replicas around a repository's identity: an uninstall at the replica
leading installation events while the owner works on the repository, a removal and a
re-addition, a stalled owner's rename, a lease round during an admitting reconcile.

Two or three replicas over one throwaway PostgreSQL, driven by hand as in
test_replicas.py; a delivery's work runs in a writer unit fenced by its claim, as the
inbox runs it. Found by a race audit (each failed before the lease fence reached
delivery units, renames and admissions).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

import pytest

from bot.core.domain import Hold, stamp
from bot.core.errors import RepositoryMoved
from bot.core.events import Named
from bot.github.errors import NotFound
from bot.services.catalog_sync import CatalogSync
from bot.services.claims import ClaimKeeper
from bot.services.outcomes import OutcomeRecorder
from bot.services.pulls import PullSync
from bot.services.reconcile import Reconciler
from bot.services.scheduler import Scheduler
from bot.services.waves import WaveRunner
from bot.store import Stores, open_stores
from bot.store.deliveries import Delivery, moved_statement, status_statement
from bot.store.engine import Statement
from bot.store.errors import LeaseTaken
from tests.conftest import fresh_database
from tests.services.conftest import FixedCapacity, scenario_repo
from tests.services.fakes import FakeRepos
from tests.services.test_rename import event
from tests.services.test_replicas import Node as ReplicaNode

H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


class Node(ReplicaNode):
    """A replica of test_replicas.py with a Reconciler over GitHub, which all share."""

    def __init__(self, stores: Stores, owner: str, github: FakeRepos, lease_seconds: float) -> None:
        super().__init__(stores, owner, lease_seconds, github, NOW)
        catalog, pulls, outcomes = CatalogSync(self.live), PullSync(self.live), OutcomeRecorder(self.live)
        self.reconciler = Reconciler(self.live, catalog, pulls, outcomes, ClaimKeeper(self.live, outcomes))
        self.reconciler.requests = stores.deliveries  # as `Klaud` wires it with replicas


@pytest.fixture
def github() -> FakeRepos:
    repo = scenario_repo()
    repo.name = "o/a"
    return FakeRepos({"o/a": repo})


@pytest.fixture
async def nodes(postgres_server, github) -> AsyncIterator[Callable[..., Awaitable[Node]]]:
    async with fresh_database(postgres_server) as url:
        opened: list[Node] = []

        async def node(owner: str, lease_seconds: float = 10.0) -> Node:
            opened.append(Node(await open_stores(url), owner, github, lease_seconds))
            return opened[-1]

        yield node
        for each in opened:
            await each.stores.close()


async def put_delivery(node: Node, delivery_id: str, repo: str | None, event_name: str = "issue_comment") -> None:
    body = json.dumps({"id": delivery_id}).encode()
    assert await node.stores.deliveries.put(
        Delivery(delivery_id, event_name, body, repo=repo, installation=1, headers={"X-GitHub-Event": event_name})
    )


async def in_delivery(node: Node, delivery_id: str, work: Callable[[], Awaitable[object]]) -> None:
    """Run `work` as the inbox runs a handler: its state changes commit with the delivery's
    status in one transaction fenced by the delivery's claim (raises when the fence fails)."""
    writer = node.stores.deliveries.writer
    unit = writer.begin_unit(node.stores.deliveries.claim_fence(delivery_id, node.owner))
    try:
        await work()
    finally:
        commit = writer.end_unit(unit, [status_statement(delivery_id, "done", 1, None)])
    await commit


async def claim(node: Node, *, unrouted: bool = False) -> list[str]:
    claimed = await node.stores.deliveries.claim_owned(
        node.owner, node.replicas.repos(), unrouted=unrouted or node.replicas.unrouted(), limit=50
    )
    return [d.id for d in claimed]


def rename_on_github(github, old: str, new: str) -> None:  # type: ignore[no-untyped-def]
    repo = github.repos[old]
    repo.name = new
    github.repos[new] = repo  # the old name redirects (answers) too


async def test_an_uninstall_at_the_leader_while_the_owner_runs_a_delivery_leaves_no_ghost(nodes, github):
    b = await nodes("b")  # keeps o/a
    await b.replicas.round()
    await b.reconciler.reconcile("o/a", 1)
    assert b.replicas.owns("o/a") and "o/a" in await b.stores.state.repos()
    a = await nodes("a")  # the replica handling installation events
    await put_delivery(b, "c1", "o/a")  # a `/klaud hold` comment, queued at b
    assert await claim(b) == ["c1"]

    # The installation_repositories 'removed' runs at the leader (a delivery without repository).
    await put_delivery(a, "i1", None, "installation_repositories")
    assert await claim(a, unrouted=True) == ["i1"]
    await in_delivery(a, "i1", lambda: a.reconciler.forget(1, [Named(full_name="o/a", id=4242)]))
    assert "o/a" not in await a.stores.state.repos()
    github.repos["o/a"].fail("repository", NotFound(404, "Not Found"), times=1000)  # GitHub: gone

    async def hold() -> None:  # b's handler: its state is still in memory, b still "owns" it
        state = await b.reconciler.state_for(event("o/a"))
        assert state is not None
        await b.live.persist(state.hold(Hold(H200, "alice", "driver bug", NOW)))
        await b.live.persist(state.save_meta())

    refused = None
    try:
        await in_delivery(b, "c1", hold)
    except Exception as exc:  # noqa: BLE001 - what a refused commit raises
        refused = exc
    ghost_after_delivery = "o/a" in await a.stores.state.repos()

    await b.replicas.round()  # b's renewal fails (the forget took the lease): b lets o/a go
    # The taken-over lease keeps b's expiry, and nobody renews it: it lapses (here at once; a
    # short lease and a sleep made the steps before it race the lease on a busy machine).
    await b.stores.engine.transaction([Statement("UPDATE leases SET expires_at = 0 WHERE name = 'repo:o/a'", ())])
    c = await nodes("c")
    await c.replicas.round()
    kept_by_c = c.live.repo("o/a") is not None
    failing_reconcile = None
    if kept_by_c:
        try:
            await c.reconciler.reconcile("o/a", 1, light=True)  # the scheduler's, every hour for good
        except NotFound as exc:
            failing_reconcile = str(exc)

    assert (refused is not None, ghost_after_delivery, kept_by_c, failing_reconcile) == (True, False, False, None)


async def test_removed_then_added_at_the_leader_while_the_old_owner_still_claims(nodes, github):
    # 'removed' then 'added' (the same installation queue, in order, at the leader): the
    # re-admission at the leader requeues b's claims; b, which has not had its round yet,
    # claims them again and commits from its old memory. Two replicas work on one
    # repository, and the leader's memory misses what b wrote.
    b = await nodes("b")
    await b.replicas.round()
    await b.reconciler.reconcile("o/a", 1)
    a = await nodes("a")
    await a.replicas.round()
    await put_delivery(b, "c1", "o/a")
    assert await claim(b) == ["c1"]

    await put_delivery(a, "i1", None, "installation_repositories")
    await put_delivery(a, "i2", None, "installation_repositories")
    assert await claim(a, unrouted=True) == ["i1", "i2"]
    await in_delivery(a, "i1", lambda: a.reconciler.forget(1, [Named(full_name="o/a", id=4242)]))
    await in_delivery(a, "i2", lambda: a.reconciler.reconcile_all(1, ["o/a"]))
    assert a.replicas.owns("o/a") and a.live.repo("o/a") is not None

    again = await claim(b)  # b's claim loop, before b's next round

    async def hold() -> None:
        state = await b.reconciler.state_for(event("o/a"))
        assert state is not None
        await b.live.persist(state.hold(Hold(H200, "alice", "driver bug", NOW)))

    if again == ["c1"]:
        with pytest.raises(LeaseTaken):  # the leader holds the repository now
            await in_delivery(b, "c1", hold)
    stored = await a.stores.state.load("o/a")
    a_state = a.live.repo("o/a")
    assert a_state is not None
    assert H200 not in stored.get("hold", {}) and H200 not in a_state.holds


async def test_a_stalled_owners_rename_is_fenced_by_the_lease(nodes, github):
    a = await nodes("a", lease_seconds=0.3)
    await a.replicas.round()
    await a.reconciler.reconcile("o/a", 1)
    assert a.live.repo("o/a") is not None
    await asyncio.sleep(0.4)  # a stalls past its lease
    b = await nodes("b")
    await b.replicas.round()
    b_state = b.live.repo("o/a")
    assert b.replicas.owns("o/a") and b_state is not None
    rename_on_github(github, "o/a", "o/new")

    refused = None
    try:  # a wakes inside its scheduler's light reconcile, which follows the rename
        await a.reconciler.reconcile("o/a", 1, light=True)
    except LeaseTaken as exc:
        refused = exc
    moved_under_b = sorted(await a.stores.state.repos())
    b_state.meta.wave = 5  # b, the owner, ends a wave of o/a
    await b.live.persist(b_state.save_meta())

    assert (refused is not None, moved_under_b) == (True, ["o/a"])
    assert sorted(await b.stores.state.repos()) in (["o/a"], ["o/new"]), "one repository, one stored state"


async def test_a_round_during_the_admitting_reconcile_does_not_leave_an_unowned_state(nodes, github):
    a = await nodes("a")
    await a.replicas.round()  # a leads
    repo = github.repos["o/a"]
    entered, gate = asyncio.Event(), asyncio.Event()
    original = repo.repository

    async def slow():  # type: ignore[no-untyped-def]
        entered.set()
        await gate.wait()
        return await original()

    repo.repository = slow  # type: ignore[method-assign]
    # installation 'created' (a delivery of the leader): reconcile admits o/a, then reads GitHub
    reconcile = asyncio.create_task(a.reconciler.reconcile_all(1, ["o/a"]))
    await entered.wait()
    await a.replicas.round()  # GitHub is slow: the next lease round comes meanwhile
    gate.set()
    await reconcile

    owned_after_reconcile = a.replicas.owns("o/a")
    b = await nodes("b")
    await b.replicas.round()
    await a.replicas.round()
    await a.replicas.round()
    both = a.live.repo("o/a") is not None and b.live.repo("o/a") is not None
    a_state = a.live.repo("o/a")
    wave_refused = False
    if a_state is not None:  # a's scheduler still iterates it: every tick, refused
        try:
            await a.live.persist(a_state.save_meta())
        except LeaseTaken:
            wave_refused = True

    assert (owned_after_reconcile, both, wave_refused) == (True, False, False)


async def test_a_rename_event_taken_by_another_replica_is_handed_to_the_repositorys_keeper(nodes, github):
    # The `renamed` event is queued under the new name, whose lease another replica takes.
    # Built there from GitHub, it was a second state of one repository beside the keeper's,
    # until a light reconcile up to 6 h later lost its hold and wave counter.
    a = await nodes("a")
    await a.replicas.round()
    await a.reconciler.reconcile("o/a", 1)
    state = a.live.repo("o/a")
    assert state is not None
    await a.live.persist(state.hold(Hold(H200, "alice", "driver bug", NOW)))
    state.meta.wave = 17
    await a.live.persist(state.save_meta())
    rename_on_github(github, "o/a", "o/new")
    await put_delivery(a, "r1", "o/new", "repository")
    b = await nodes("b")
    await b.replicas.round()  # b takes the free o/new for its delivery
    await a.replicas.round()
    assert b.replicas.owns("o/new") and a.replicas.owns("o/a")
    assert await claim(b) == ["r1"]

    with pytest.raises(RepositoryMoved) as moved:  # the inbox hands the delivery on
        await b.reconciler.state_for(event("o/new"))
    assert moved.value.to == "o/a" and b.live.repo("o/new") is None
    await b.stores.deliveries.writer.write([moved_statement("r1", moved.value.to, 1, str(moved.value))])

    assert await claim(a) == ["r1"]
    followed = await a.reconciler.state_for(event("o/new"))  # o/new's lease taken over from b

    assert followed is not None and followed.name == "o/new" and followed.meta.wave == 17
    assert H200 in followed.holds and await a.stores.state.repos() == ["o/new"]
    await b.replicas.round()
    assert b.live.repo("o/new") is None and a.replicas.owns("o/new") and not b.replicas.owns("o/new")


async def test_the_leaders_discovery_builds_no_second_state_of_a_repository_renamed_elsewhere(nodes, github):
    # Discovery lists installed repositories under their current names. One renamed while
    # another replica keeps it under its old name (that replica has not followed yet) was
    # built afresh under the new name: the keeper then dropped its own state on following.
    b = await nodes("b")
    await b.replicas.round()  # b leads installation events and discovery
    a = await nodes("a")
    await a.replicas.round()
    await a.reconciler.reconcile("o/a", 1)  # a keeps o/a
    assert b.replicas.leads() and a.replicas.owns("o/a")
    rename_on_github(github, "o/a", "o/new")
    github.repos.pop("o/a")  # listed once, under the new name

    assert await b.reconciler.reconcile_new_installations() == []

    assert await b.stores.state.repos() == ["o/a"] and b.live.repo("o/new") is None


def scheduler_of(node) -> tuple[Scheduler, WaveRunner]:  # type: ignore[no-untyped-def]
    waves = WaveRunner(node.live, FixedCapacity(node.live.clock), node.live.clock)
    scheduler = Scheduler(node.live, waves, node.reconciler, node.reconciler.outcomes, node.live.clock,
                          owns=node.replicas.owns)
    return scheduler, waves


async def test_a_stalled_replica_runs_no_wave_of_a_repository_it_no_longer_owns(nodes, github):
    # What this catches: resumed after a stall, a replica's scheduler timer fired before its
    # lease round and ran the wave of a repository another replica had taken: it made a
    # claim ref (refused in the store only after), and the owner's wave skipped the family.
    a = await nodes("a", lease_seconds=0.3)
    await a.replicas.round()  # a leads
    await a.reconciler.reconcile_all(1, ["o/a"])  # admits o/a, reconciles it from GitHub
    assert a.replicas.owns("o/a") and a.live.repo("o/a") is not None
    a_scheduler, _ = scheduler_of(a)
    state = a.live.repo("o/a")
    # The repository's wave falls due while a is stopped (SIGSTOP, a VM pause, a long GC).
    state.meta.next_wave_at = stamp(NOW - timedelta(seconds=1))
    await asyncio.sleep(0.4)  # a stalls past its lease
    b = await nodes("b")
    await b.replicas.round()
    assert b.replicas.owns("o/a") and not a.replicas.owns("o/a")

    before = set(github.repos["o/a"].branches_at)
    # a resumes: its scheduler's timer fires before its lease round's.
    await a_scheduler.tick()
    made_by_a = set(github.repos["o/a"].branches_at) - before

    # The owner's wave, right after.
    _, b_waves = scheduler_of(b)
    wave = await b_waves.run("o/a", trigger="schedule")
    assert wave is not None
    claimed = [d.family for d in wave.decisions if d.decision == "claimed"]
    assert not made_by_a, f"a replica that owns nothing created claim refs on GitHub: {made_by_a}"
    assert not claimed
