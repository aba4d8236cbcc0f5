"""The replica coordinator on a real PostgreSQL store (replicas exist only there): shares,
takeover of a lost lease, release on stop, admission of a new repository. Rounds are driven
by hand; the end-to-end run with processes and SIGKILL is tests/stack/test_replicas_e2e.py."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from types import SimpleNamespace

import asyncpg
import pytest

from bot.core.clock import ManualClock
from bot.services import replicas as replicas_module
from bot.services.api import ReposAPI
from bot.services.live import LiveState
from bot.services.replicas import INSTALLATIONS, LEASE_TRUST, Replicas
from bot.services.repo_state import RepoState
from bot.store import Stores, open_stores
from bot.store.change import Change
from bot.store.deliveries import Delivery, status_statement
from bot.store.engine import Statement
from bot.store.errors import LeaseTaken
from bot.store.leases import repo_lease
from bot.web.inbox import Inbox
from tests.conftest import fresh_database
from tests.web.test_inbox_batches import Gate, wait_for

REPOS = ["o/a", "o/b", "O/C", "o/d"]


class Node:
    """One replica: its own connection to the store, its LiveState, its Replicas, and a
    record of what it was told to drop."""

    def __init__(
        self, stores: Stores, owner: str, lease_seconds: float = 10.0, github: ReposAPI | None = None,
        now: datetime = datetime(2026, 12, 1, tzinfo=UTC),
    ) -> None:
        self.stores = stores
        self.owner = owner
        self.busy: set[str] = set()
        self.released: list[str] = []  # repositories, and "installations" for those without one
        self.taken: list[str] = []
        self.flushing: set[str] = set()
        self.live = LiveState(stores.state, github, ManualClock(now), ())
        self.replicas = Replicas(
            stores.leases, stores.deliveries, self.live, busy=self.busy.__contains__,
            release=lambda repo: self.released.append(repo or "installations"), publishers=(self,), owner=owner, lease_seconds=lease_seconds,
        )

    # A publisher, as the check runs and the dashboard are.

    def repository_taken(self, state: RepoState) -> None:
        self.taken.append(state.name)

    def publishing(self, repo: str) -> bool:
        return repo in self.flushing


@pytest.fixture
async def database(postgres_server) -> AsyncIterator[str]:
    async with fresh_database(postgres_server) as url:
        first = await open_stores(url)
        for n, repo in enumerate(REPOS):
            body = json.dumps({"n": n}).encode()
            await first.deliveries.put(Delivery(f"d{n}", "push", body, action=None, repo=repo, installation=7,
                                                headers={"X-GitHub-Event": "push"}))
        await first.close()
        yield url


@pytest.fixture
async def nodes(database) -> AsyncIterator[Callable[..., Awaitable[Node]]]:
    opened: list[Node] = []

    async def node(owner: str, lease_seconds: float = 10.0) -> Node:
        opened.append(Node(await open_stores(database), owner, lease_seconds))
        return opened[-1]

    yield node
    for each in opened:
        await each.stores.close()


async def test_a_lone_replica_takes_every_repository_then_shares_with_the_next(nodes):
    a = await nodes("a")
    await a.replicas.round()
    assert a.replicas.repos() == {"o/a", "o/b", "o/c", "o/d"} and a.replicas.leads()
    assert a.replicas.owns("O/C") and a.replicas.owns(None) and not a.replicas.owns("o/elsewhere")
    b = await nodes("b")
    await b.replicas.round()  # b counts two replicas: it may take 2, but every lease is a's
    assert b.replicas.repos() == set() and not b.replicas.leads()
    await a.replicas.round()  # a sees b: above its share of 2, it gives two idle ones up
    assert len(a.replicas.repos()) == 2 and sorted(a.released) == sorted({"o/a", "o/b", "o/c", "o/d"} - a.replicas.repos())
    await b.replicas.round()
    # Both count two live replicas: each spaces its GitHub writes twice as far apart.
    assert (a.replicas.live_replicas, b.replicas.live_replicas) == (2, 2)
    assert a.replicas.repos() | b.replicas.repos() == {"o/a", "o/b", "o/c", "o/d"}
    assert not a.replicas.repos() & b.replicas.repos()
    holders = await a.stores.leases.holders()
    assert {holders[repo_lease(repo)] for repo in a.replicas.repos()} == {"a"}
    assert holders[INSTALLATIONS] == "a"


# Its deliveries in the inbox; or a check run or dashboard creation sent and not answered
# yet (the next owner, finding none, would create a second).
@pytest.mark.parametrize("work", ["busy", "flushing"])
async def test_a_replica_working_on_a_repository_keeps_it_above_its_share_until_done(nodes, work):
    a = await nodes("a")
    await a.replicas.round()
    working = getattr(a, work)
    working.update({"o/a", "o/b", "o/c"})
    await nodes("b")
    c = await nodes("c")
    await c.replicas.round()
    await a.replicas.round()  # share is now 2 of 4; three are worked on, one idle goes
    assert a.replicas.repos() == {"o/a", "o/b", "o/c"} and a.released == ["o/d"]
    working.clear()
    await a.replicas.round()
    assert len(a.replicas.repos()) == 2


async def test_a_repository_given_up_is_let_go_before_its_lease_and_work_begun_meanwhile_keeps_the_next(nodes):
    a = await nodes("a")
    for name in REPOS:
        await stored_repository(a, name, 1)
    await a.replicas.round()
    assert all(a.live.repo(name) is not None for name in REPOS)
    b = await nodes("b")
    await b.replicas.round()
    release, seen = a.stores.leases.release, []

    async def releasing(name: str, owner: str) -> bool:
        # Whatever begins now finds the repository let go here: a flush, no state to publish.
        seen.append((name, [repo_lease(repo) for repo in a.replicas.repos()], a.live.repo(name.partition(":")[2])))
        a.flushing.update(a.replicas.repos())  # meanwhile, a flush of every other one begins
        return await release(name, owner)

    a.stores.leases.release = releasing  # type: ignore[method-assign]
    await a.replicas.round()  # above its share of 2: it would give two up
    [(name, held, state)] = seen
    assert name not in held and state is None
    assert len(a.replicas.repos()) == 3


async def test_a_lapsed_lease_is_taken_over_and_its_old_holder_lets_the_repository_go(nodes):
    a = await nodes("a", lease_seconds=0.3)
    await a.replicas.round()
    b = await nodes("b")
    await asyncio.sleep(0.4)  # a is frozen (a long pause, a lost connection): its leases lapse
    await b.replicas.round()
    assert b.replicas.repos() == {"o/a", "o/b", "o/c", "o/d"}
    await a.replicas.round()  # renewing fails: a learns it lost them and drops them
    assert a.replicas.repos() == set() and sorted(a.released) == ["installations", "o/a", "o/b", "o/c", "o/d"]
    assert not a.replicas.leads() and b.replicas.leads()


@pytest.mark.parametrize("store", ["refusing", "silent"])
async def test_a_replica_whose_renewals_fail_lets_its_repositories_go_before_its_leases_lapse(nodes, store):
    # Cut off from the store (refused, or packets dropped: no answer at all), a replica must
    # stop acting as owner before another may take its leases: two owners of one repository
    # would each run its waves.
    a = await nodes("a", lease_seconds=0.5)
    await stored_repository(a, "o/a", 3)
    a.replicas.round_seconds = 0.05
    await a.replicas.start()
    assert a.replicas.owns("o/a") and a.live.repo("o/a") is not None

    async def unreachable(*args: object) -> bool:
        if store == "silent":
            await asyncio.Event().wait()
        raise ConnectionError("the store is unreachable")

    a.stores.leases.acquire = unreachable  # type: ignore[method-assign]
    b = await nodes("b")
    for _ in range(500):  # b takes the lease once it lapses (0.5 s)
        await b.replicas.round()
        if b.replicas.owns("o/a"):
            break
        await asyncio.sleep(0.01)
    assert b.replicas.owns("o/a"), "the lapsed lease was never taken over"
    assert not a.replicas.owns("o/a"), "two owners: a still acted as owner once b took the lease"
    assert a.replicas.repos() == set() and not a.replicas.leads()
    for _ in range(100):  # the loop's next failed (or timed-out) round drops the states
        if a.live.repo("o/a") is None:
            break
        await asyncio.sleep(0.01)
    assert a.live.repo("o/a") is None and sorted(a.released) == ["installations", "o/a", "o/b", "o/c", "o/d"]
    a.replicas._stopping.set()


async def test_a_stopping_replica_releases_every_lease_and_the_others_take_over_at_once(nodes):
    a, b = await nodes("a"), await nodes("b")
    await a.replicas.round()
    await b.replicas.round()
    await a.replicas.stop()
    assert not any(owner == "a" for owner in (await b.stores.leases.holders()).values())
    await b.replicas.round()
    assert b.replicas.repos() == {"o/a", "o/b", "o/c", "o/d"} and b.replicas.leads()


async def test_a_stopping_replica_keeps_what_it_holds_and_takes_nothing_more(nodes):
    a, b = await nodes("a"), await nodes("b")
    await a.replicas.round()
    await b.replicas.round()
    await a.replicas.round()  # above its share of 2: two go
    await b.replicas.round()
    kept = a.replicas.repos()
    a.replicas.stop_taking()  # its last renders are being published
    await b.replicas.stop()
    await a.replicas.round()
    assert a.replicas.repos() == kept and len(kept) == 2


async def test_a_new_repository_is_admitted_by_one_replica_only(nodes):
    a, b = await nodes("a"), await nodes("b")
    for started in (a, b):  # a replica's first round comes before anything it admits
        await started.replicas.round()
    assert await a.replicas.admit("New/Repo") and await a.replicas.admit("new/repo")
    assert not await b.replicas.admit("new/repo")
    assert "new/repo" in a.replicas.repos() and "new/repo" not in b.replicas.repos()


async def test_taking_a_repository_back_requeues_the_claims_made_before_letting_it_go(nodes):
    a = await nodes("a")
    await a.replicas.round()
    claimed = await a.stores.deliveries.claim_owned("a", {"o/a"}, unrouted=False, limit=9)
    assert [d.id for d in claimed] == ["d0"]
    await a.replicas.stop()
    await a.replicas.round()  # back, as the same process: its old claim is work to do again
    again = await a.stores.deliveries.claim_owned("a", {"o/a"}, unrouted=False, limit=9)
    assert [d.id for d in again] == ["d0"]


async def test_the_leading_replica_clears_the_heartbeat_leases_dead_processes_left(nodes, monkeypatch):
    import bot.services.replicas as replicas_module

    monkeypatch.setattr(replicas_module, "PRUNE_AFTER_SECONDS", 0.1)
    monkeypatch.setattr(replicas_module, "PRUNES_PER_EXPIRY", 1)  # a search at most every 0.1 s
    a = await nodes("a")
    assert await a.stores.leases.acquire("replica:crashed", "crashed", 0.05)
    await asyncio.sleep(0.3)
    await a.replicas.round()  # takes the installations lease
    await a.replicas.round()  # leads: prunes
    rows = await a.stores.engine.fetch("SELECT name FROM leases WHERE name = 'replica:crashed'")
    assert rows == []

    searches: list[float] = []
    prune = a.replicas.leases.prune

    async def counted(*, expired_for_seconds: float) -> int:
        searches.append(expired_for_seconds)
        return await prune(expired_for_seconds=expired_for_seconds)

    monkeypatch.setattr(a.replicas.leases, "prune", counted)
    await a.replicas.round()
    await a.replicas.round()
    assert searches == [], "not at every round: the last search was a moment ago"
    await asyncio.sleep(0.1)
    await a.replicas.round()
    assert searches == [0.1]


async def test_a_repository_whose_state_fails_to_load_at_takeover_is_loaded_by_a_later_round(nodes, monkeypatch):
    a = await nodes("a")
    await stored_repository(a, "o/a", 12)
    load_repo = a.live.load_repo

    async def dropped_connection(name: str) -> RepoState | None:
        if name == "o/a":
            raise ConnectionError("connection was closed in the middle of operation")
        return await load_repo(name)

    monkeypatch.setattr(a.live, "load_repo", dropped_connection)
    await a.replicas.round()
    # Owned without its state, o/a would have had no waves until a delivery came.
    assert not a.replicas.owns("o/a") and repo_lease("o/a") not in await a.stores.leases.holders()
    assert a.replicas.repos() == {"o/b", "o/c", "o/d"} and a.replicas.leads()  # the round went on
    monkeypatch.setattr(a.live, "load_repo", load_repo)
    await a.replicas.round()
    state = a.live.repo("o/a")
    assert a.replicas.owns("o/a") and state is not None and state.meta.wave == 12


async def test_a_stalled_owners_commit_after_the_takeover_fails_its_fence(nodes):
    a = await nodes("a", lease_seconds=0.3)
    await a.replicas.round()
    [claimed] = await a.stores.deliveries.claim_owned("a", {"o/a"}, unrouted=False, limit=9)
    await asyncio.sleep(0.4)  # a stalls past its lease
    b = await nodes("b")
    await b.replicas.round()  # b takes o/a up and reads its state
    assert b.replicas.owns("o/a")
    # a wakes and commits what o/a's delivery changed, fenced by its claim, as its inbox does
    # (its stall came after its own clock said it still held o/a: the store's fences decide)
    a.live.store.owns = lambda repo: True
    writer = a.stores.deliveries.writer
    unit = writer.begin_unit(a.stores.deliveries.claim_fence(claimed.id, "a"))
    await a.stores.state.apply(Change().put("", "repo", "o/a", {"installation": 7, "wave": 99}))
    # Refused by the lease (b holds it) before the claim is even looked at.
    with pytest.raises(LeaseTaken, match=r"repo:o/a \(b\)"):
        await writer.end_unit(unit, [status_statement(claimed.id, "done", 1, None)])
    # Landed after b read the state, b's memory would have missed it and written over it.
    assert await b.stores.state.get("", "repo", "o/a") is None
    [again] = await b.stores.deliveries.claim_owned("b", {"o/a"}, unrouted=False, limit=9)
    assert again.id == claimed.id  # b does that delivery's work itself


async def test_a_stalled_owners_write_outside_a_delivery_is_refused_once_another_holds_the_lease(nodes):
    # A wave or the scheduler writes outside any delivery: no claim fences it, the lease does.
    a = await nodes("a", lease_seconds=0.3)
    await stored_repository(a, "o/a", 3)  # nobody holds o/a yet: anyone may write it
    await a.replicas.round()
    state = a.live.repo("o/a")
    assert state is not None
    state.meta.wave = 4
    await a.live.persist(state.save_meta())  # its own lease
    await asyncio.sleep(0.4)  # a stalls past its lease
    b = await nodes("b")
    await b.replicas.round()
    assert b.replicas.owns("o/a") and b.live.repo("o/a") is not None
    state.meta.wave = 41  # a wakes and finishes the wave it was running

    # Its own clock says its lease lapsed: refused before the store is asked.
    with pytest.raises(LeaseTaken, match="not held by this replica now"):
        await a.live.persist(state.save_meta())
    # Stalled after that check said it still held o/a: the store's lease fence refuses.
    a.live.store.owns = lambda repo: True
    with pytest.raises(LeaseTaken, match=r"repo:o/a \(b\)"):
        await a.live.persist(state.save_meta())

    assert (await b.stores.state.get("", "repo", "o/a") or {})["wave"] == 4
    assert "o/a" in a.live.stale  # its memory is ahead of the store: read back before use
    taken = b.live.repo("o/a")
    assert taken is not None and taken.meta.wave == 4
    taken.meta.wave = 5
    await b.live.persist(taken.save_meta())  # the new owner writes on
    assert (await a.stores.state.get("", "repo", "o/a") or {})["wave"] == 5


async def test_a_repository_uninstalled_at_another_replica_is_not_written_back_by_its_keeper(nodes):
    # The replica leading installation events forgets a repository another one keeps: a
    # wave that keeper was running must not write it back (a ghost, reconciled in vain
    # for good), and the keeper lets it go.
    b = await nodes("b")
    await stored_repository(b, "o/a", 3)
    await b.replicas.round()
    state = b.live.repo("o/a")
    assert state is not None
    a = await nodes("a")

    await a.live.forget("o/a")  # the uninstall, in a delivery of the leader's

    assert "o/a" not in await a.stores.state.repos()
    state.meta.wave = 4  # b's wave ends
    with pytest.raises(LeaseTaken):
        await b.live.persist(state.save_meta())
    assert "o/a" not in await b.stores.state.repos()
    await b.replicas.round()
    assert not b.replicas.owns("o/a") and b.live.repo("o/a") is None


async def test_a_stalled_keepers_forget_is_refused_and_takes_nothing_back(nodes):
    # A replica that stalled past its lease forgets the repository it still keeps in
    # memory (its light reconcile found the name reused elsewhere): that write must fail
    # the fence like any other, not take the lease back and delete the new owner's state.
    a = await nodes("a", lease_seconds=0.3)
    await stored_repository(a, "o/a", 3)
    await a.replicas.round()
    assert a.live.repo("o/a") is not None
    await asyncio.sleep(0.4)  # a stalls past its lease
    b = await nodes("b")
    await b.replicas.round()
    assert b.replicas.owns("o/a")

    with pytest.raises(LeaseTaken):
        await a.live.forget("o/a")

    assert (await b.stores.leases.holders())[repo_lease("o/a")] == "b"
    assert "o/a" in await b.stores.state.repos()
    await a.replicas.round()
    assert b.replicas.owns("o/a") and not a.replicas.owns("o/a")


async def stored_repository(node: Node, name: str, wave: int) -> None:
    """`name` in the store as an earlier process left it (written before this one holds it)."""
    stored = node.live.new_state(name, 7)
    stored.meta.wave = wave
    owns, node.live.store.owns = node.live.store.owns, None
    try:
        await node.live.persist(stored.save_meta())
    finally:
        node.live.store.owns = owns


async def test_a_repository_taken_with_a_stored_state_is_handed_to_the_publishers(nodes):
    # What its last owner had pending for its check runs and dashboard left with it.
    a = await nodes("a")
    await stored_repository(a, "o/a", 3)
    await a.replicas.round()
    assert a.replicas.repos() == {"o/a", "o/b", "o/c", "o/d"}
    assert a.taken == ["o/a"]  # the others have deliveries waiting and no state yet


async def test_a_renamed_repository_moves_to_its_new_name_and_lease(nodes):
    a = await nodes("a")
    await stored_repository(a, "o/a", 12)
    await a.replicas.round()
    assert a.live.repo("o/a") is not None

    moved = await a.live.rename("o/a", "o/renamed")

    assert moved is not None and moved.meta.wave == 12 and a.replicas.owns("o/renamed")
    assert repo_lease("o/renamed") in await a.stores.leases.holders()
    assert "o/renamed" in await a.stores.state.repos() and "o/a" not in await a.stores.state.repos()


async def test_a_renamed_repository_whose_new_name_is_only_leased_elsewhere_takes_the_lease_over(nodes):
    # b leased the new name for the events GitHub queues under it, and keeps nothing of it
    # (it hands them on to the keeper): waiting for b to let go, every later event would
    # keep it leased.
    a, b = await nodes("a"), await nodes("b")
    await stored_repository(a, "o/a", 12)
    await a.replicas.round()
    assert await b.replicas.admit("o/renamed")

    moved = await a.live.rename("o/a", "O/Renamed")

    assert moved is not None and moved.meta.wave == 12 and a.replicas.owns("o/renamed")
    assert (await a.stores.leases.holders())[repo_lease("o/renamed")] == "a"
    await b.replicas.round()  # its renewal fails: b lets the name go
    assert not b.replicas.owns("o/renamed")


async def test_a_renamed_repository_whose_new_name_another_replica_holds_is_dropped_here(nodes):
    a, b = await nodes("a"), await nodes("b")
    await stored_repository(a, "o/a", 12)
    await a.replicas.round()
    assert await b.replicas.admit("o/renamed")  # its events reached b first

    await stored_repository(b, "o/renamed", 1)  # b built it from GitHub

    assert await a.live.rename("o/a", "o/renamed") is None

    # One repository is never planned by two replicas: a keeps nothing of it.
    assert a.live.repo("o/a") is None and a.live.repo("o/renamed") is None
    assert "o/a" not in await a.stores.state.repos() and not a.replicas.owns("o/renamed")


async def test_a_state_kept_in_memory_without_the_lease_leaves_at_the_next_round(nodes):
    # Whatever race left it there, a state this replica does not own would plan waves
    # beside its owner's: the next round drops it.
    a, b = await nodes("a"), await nodes("b")
    await stored_repository(a, "o/a", 3)
    await b.replicas.round()  # b owns every repository
    assert b.replicas.owns("o/a")
    stray = await a.live.load_repo("o/a")  # loaded at a, not owned there
    assert stray is not None and a.live.repo("o/a") is not None

    await a.replicas.round()

    assert a.live.repo("o/a") is None and not a.replicas.owns("o/a")
    assert b.live.repo("o/a") is not None


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def mono(monkeypatch) -> FakeMonotonic:
    """The monotonic clock the coordinator reads (the event loop keeps the real one)."""
    fake = FakeMonotonic()
    monkeypatch.setattr(replicas_module, "time", SimpleNamespace(monotonic=fake.monotonic))
    return fake


async def claimed_by(node, repo: str = "o/a", kept: tuple[str, ...] = ()) -> list[str]:
    """What `node` claims of `repo` now, holding `kept` in memory (its own claims of those, in
    hand, are not claimed again; one reset to nobody is)."""
    return [d.id for d in await node.stores.deliveries.claim_owned(node.owner, {repo}, unrouted=False, limit=9, kept=kept)]


# --- the validity horizon --------------------------------------------------------------


async def test_a_replica_owns_nothing_once_the_trusted_share_of_its_leases_has_passed(nodes, mono) -> None:
    # What this catches: owned up to the very expiry, when another may take it.
    # And: owns() ignored the validity (the inbox kept claiming for lapsed leases).
    # And: owned at the exact end of the horizon.
    a = await nodes("a", lease_seconds=10.0)
    await a.replicas.round()
    mono.now = 1000.0 + 10.0 * LEASE_TRUST - 0.01
    assert a.replicas.owns("o/a") and a.replicas.owns(None) and a.replicas.leads()
    mono.now = 1000.0 + 10.0 * LEASE_TRUST
    assert not a.replicas.owns("o/a") and not a.replicas.owns(None)
    mono.now = 1000.0 + 10.0 * 0.9
    assert a.replicas.repos() == set() and not a.replicas.owns("o/a") and not a.replicas.owns(None)
    assert not a.replicas.leads()


async def test_the_validity_counts_from_when_the_renewal_was_sent(nodes, mono) -> None:
    # What this catches: counted from when the renewal's answer came: a renewal that took 3 s
    # (a slow store) left the replica owner 3 s past the store's expiry of its leases.
    a = await nodes("a", lease_seconds=10.0)
    renew_all = a.stores.leases.renew_all

    async def slow_renewal(*args, **kwargs):
        mono.now += 3.0
        return await renew_all(*args, **kwargs)

    a.stores.leases.renew_all = slow_renewal
    await a.replicas.round()  # sent at 1000, answered at 1003
    mono.now = 1000.0 + 10.0 * LEASE_TRUST + 0.5
    assert not a.replicas.owns("o/a") and not a.replicas.leads()


async def test_a_failed_round_while_the_leases_are_valid_keeps_every_repository(nodes) -> None:
    # What this catches: one failed round (a store hiccup) let every repository go at once, and,
    # their leases still held in the store, none could be taken back until they expired.
    a = await nodes("a", lease_seconds=10.0)
    a.replicas.round_seconds = 0.02
    await a.replicas.start()
    holders = a.stores.leases.holders
    failures = [ConnectionError("connection reset")]
    rounds: list[int] = []

    async def hiccup() -> dict[str, str]:
        rounds.append(1)
        if failures:
            raise failures.pop()
        return await holders()

    a.stores.leases.holders = hiccup
    for _ in range(200):
        if len(rounds) >= 3:
            break
        await asyncio.sleep(0.01)
    await a.replicas.stop()  # (stop clears what is owned; check what was released before)
    assert len(rounds) >= 3 and a.released == []


# --- admission -------------------------------------------------------------------------


async def test_admitting_a_repository_kept_here_leaves_its_claims_in_hand(nodes) -> None:
    # What this catches: admit() of a repository already owned took its lease again and requeued
    # the deliveries this replica had claimed: claimed a second time, run twice.
    a = await nodes("a")
    await a.replicas.round()
    assert await claimed_by(a) == ["d0"]
    assert await a.replicas.admit("O/A")
    assert await claimed_by(a, kept=("d0",)) == []


async def test_admitting_a_repository_requeues_this_replicas_claims_from_before(nodes) -> None:
    # What this catches: admit() did not take claims back (as a round's takeover does):
    # this replica's own claim from before it let the repository go was never worked on.
    a = await nodes("a")
    await a.replicas.round()
    assert await claimed_by(a) == ["d0"]
    await a.replicas.stop()
    assert await a.replicas.admit("o/a")
    assert await claimed_by(a) == ["d0"]


async def test_taking_a_repository_up_keeps_the_claims_the_inbox_works_on(nodes) -> None:
    # What this catches: the claims were requeued even while the inbox worked on the repository:
    # the delivery in hand was claimed (and run) a second time.
    a = await nodes("a")
    a.busy.add("o/a")
    assert await claimed_by(a) == ["d0"]
    assert await a.replicas.admit("o/a")
    assert await claimed_by(a, kept=("d0",)) == []


async def test_a_repository_stored_with_capitals_and_owned_here_is_not_kept_elsewhere(nodes) -> None:
    # What this catches: kept_elsewhere compared the name as stored ("O/C") with the lowercase
    # leases: a repository owned here counted as another replica's.
    a = await nodes("a")
    await a.replicas.round()
    assert a.replicas.owns("o/c")
    assert not a.live.kept_elsewhere("O/C") and a.live.kept_elsewhere("o/elsewhere")


# --- shares ----------------------------------------------------------------------------


async def test_a_replica_takes_no_more_than_its_share_in_the_first_place(nodes) -> None:
    # What this catches: it took every free repository, loaded their states, then gave the ones
    # above its share up in the same round (the inbox told to drop their queues).
    a, b = await nodes("a"), await nodes("b")
    assert await b.stores.leases.acquire("replica:b", "b", 10.0)  # b is alive, holds nothing yet
    await a.replicas.round()
    assert len(a.replicas.repos()) == 2 and a.released == []
    holders = await a.stores.leases.holders()
    assert sorted(name for name, owner in holders.items() if owner == "a" and name.startswith("repo:")) == sorted(
        repo_lease(repo) for repo in a.replicas.repos()
    )


async def test_a_repository_the_inbox_works_on_is_kept_though_nothing_is_stored(nodes) -> None:
    # What this catches: a repository with no state and no waiting delivery was given up even while
    # the inbox worked on it (its first delivery, claimed: not waiting any more).
    a = await nodes("a")
    await a.replicas.round()
    assert await a.replicas.admit("o/new")
    a.busy.add("o/new")
    await a.replicas.round()
    assert a.replicas.owns("o/new") and "o/new" not in a.released


async def test_replicas_prefer_different_orders_of_the_repositories(nodes) -> None:
    # What this catches: every replica reached for the same leases first (starting at once, all
    # but one lost every race).
    firsts = set()
    for owner in ("a", "b", "c", "d"):
        node = await nodes(owner)
        firsts.add(min((repo.lower() for repo in REPOS), key=node.replicas._spread))
    assert len(firsts) > 1


# --- the installations lease, memory, stopping -----------------------------------------


async def test_a_replica_that_let_go_after_a_lapse_leads_again_while_its_lease_stands(nodes, mono) -> None:
    # What this catches: the installations lease still in its own name (not expired in the store)
    # was not taken back: no replica led installation events until it expired.
    a = await nodes("a", lease_seconds=10.0)
    await a.replicas.round()
    mono.now += 10.0  # past the trusted share: the loop's failed round lets go
    a.replicas._let_go_if_lapsed()
    assert not a.replicas.leads()
    assert (await a.stores.leases.holders())[INSTALLATIONS] == "a"  # the store's clock: 10 s not passed
    await a.replicas.round()
    assert a.replicas.leads()


async def test_a_state_a_section_holds_is_not_dropped_by_a_round(nodes) -> None:
    # What this catches: a state in memory without the lease was dropped even while a section
    # (a reconcile admitting the repository) held it.
    a, b = await nodes("a"), await nodes("b")
    await stored_repository(a, "o/a", 3)
    await b.replicas.round()  # b owns every repository
    assert await a.live.load_repo("o/a") is not None  # loaded at a, not owned there
    async with a.live.lock("o/a"):
        await a.replicas.round()
        assert a.live.repo("o/a") is not None
    await a.replicas.round()
    assert a.live.repo("o/a") is None


async def test_a_stopped_replica_owns_nothing(nodes) -> None:
    # What this catches: after stop() it still answered owns()/repos() for the leases it released.
    a = await nodes("a")
    await a.replicas.round()
    await a.replicas.stop()
    assert a.replicas.repos() == set() and not a.replicas.owns("o/a") and not a.replicas.leads()


async def test_stopping_goes_on_whatever_a_release_raises(nodes) -> None:
    # What this catches: only a ConnectionError was caught: any other error of the store ended
    # stop() half way, the remaining leases left to lapse.
    a, b = await nodes("a"), await nodes("b")
    await a.replicas.round()
    release = a.stores.leases.release

    async def refusing_once(name: str, owner: str) -> None:
        if name == repo_lease("o/a"):
            raise RuntimeError("the pool is closing")
        await release(name, owner)

    a.stores.leases.release = refusing_once
    await a.replicas.stop()
    holders = await b.stores.leases.holders()
    assert {name for name, owner in holders.items() if owner == "a"} == {repo_lease("o/a")}


async def test_a_stale_replicas_write_after_the_next_owner_released_is_refused(nodes):
    # What this catches: a stalled replica resumed after its successor wrote the repository
    # and released it (a clean stop in a rolling deploy): its stale memory landed over the
    # successor's state, and the next owner loaded wave 4 where 7 had been.
    a = await nodes("a", lease_seconds=0.3)
    await stored_repository(a, "o/a", 3)
    await a.replicas.round()
    state = a.live.repo("o/a")
    assert state is not None and state.meta.wave == 3
    await asyncio.sleep(0.4)  # a stalls past its lease
    b = await nodes("b")
    await b.replicas.round()
    taken = b.live.repo("o/a")
    assert b.replicas.owns("o/a") and taken is not None
    taken.meta.wave = 7  # b runs waves 4..7
    await b.live.persist(taken.save_meta())
    await b.replicas.stop()  # b stops cleanly (rolling deploy): every lease released

    state.meta.wave = 4  # a resumes and finishes the wave 4 it was running
    # The store's fence lets anyone write a repository nobody holds; a's own clock says its
    # lease lapsed, and the write is refused before the store is asked.
    with pytest.raises(LeaseTaken, match="not held by this replica now"):
        await a.live.persist(state.save_meta())
    assert (await b.stores.state.get("", "repo", "o/a") or {})["wave"] == 7
    c = await nodes("c")
    await c.replicas.round()
    taken_again = c.live.repo("o/a")
    assert taken_again is not None and taken_again.meta.wave == 7

async def test_one_locked_lease_row_does_not_stop_the_round_taking_the_rest(nodes, database):
    # A dead replica's commit still open on the server (its machine froze mid-transaction:
    # PostgreSQL ends it only after idle_in_transaction_session_timeout, 60 s) holds its lease
    # rows FOR SHARE (the lease fence). The round failed at that repository, every round,
    # leaving the others and the installations lease unowned (a found review defect).
    a = await nodes("a")
    await a.replicas.round()
    assert a.replicas.repos() == {"o/a", "o/b", "o/c", "o/d"} and a.replicas.leads()
    # a dies: its leases lapse (at once here, rather than after a sleep) ...
    await a.stores.engine.transaction([Statement("UPDATE leases SET expires_at = 0 WHERE owner = 'a'", ())])
    # ... while its last commit, fenced by o/a's lease, is still open on the server.
    frozen = await asyncpg.connect(database)
    tx = frozen.transaction()
    await tx.start()
    await frozen.fetchval("SELECT klaud_leases_free(ARRAY['repo:o/a'], 'a')")
    try:
        b = await nodes("b")
        error = None
        try:
            await b.replicas.round()
        except Exception as exc:  # noqa: BLE001
            error = exc
        taken = b.replicas.repos()
        leads = b.replicas.leads()
    finally:
        await tx.rollback()
        await frozen.close()
    assert (error, taken >= {"o/b", "o/c", "o/d"}, leads) == (None, True, True), (
        f"round raised {error!r}; took {sorted(taken)}; leads={leads}"
    )

async def test_a_stalled_replicas_take_back_leaves_the_new_owners_claims_alone(nodes, monkeypatch):
    # a stalls inside its take (after the lease acquire answered, before its take-back of the
    # claims) past its lease; b takes the repository and claims its delivery. a's take-back
    # reset b's claims, whose commits its claim fence then refused: b ran them again.
    stall = [0.0]  # seconds a's stall added to its monotonic clock
    monkeypatch.setattr(replicas_module, "time", SimpleNamespace(monotonic=lambda: time.monotonic() + stall[0]))
    a, b = await nodes("a"), await nodes("b")
    acquire = a.stores.leases.acquire
    stalled: list[str] = []

    async def acquire_then_stall(name: str, owner: str, ttl: float) -> bool:
        got = await acquire(name, owner, ttl)
        if got and name == "repo:o/a":
            # a stalls here past its lease: it lapses, b takes o/a and claims its delivery.
            stall[0] += 11.0
            await a.stores.engine.transaction([Statement("UPDATE leases SET expires_at = 0 WHERE owner = 'a'", ())])
            await b.replicas.round()
            assert b.replicas.owns("o/a")
            stalled.extend(d.id for d in await b.stores.deliveries.claim_owned("b", {"o/a"}, unrouted=False, limit=9))
        return got

    a.stores.leases.acquire = acquire_then_stall  # type: ignore[method-assign]
    await a.replicas.round()  # a resumes: its take-back runs on
    assert stalled == ["d0"]
    assert not a.replicas.owns("o/a")
    # b, the owner, commits d0 as its inbox does: fenced by its claim.
    writer = b.stores.deliveries.writer
    unit = writer.begin_unit(b.stores.deliveries.claim_fence("d0", "b"))
    refused = None
    try:
        await writer.end_unit(unit, [status_statement("d0", "done", 1, None)])
    except Exception as exc:  # noqa: BLE001
        refused = exc
    assert refused is None, f"the owner's commit was refused: {refused}"

@pytest.mark.parametrize("batch_size", [1, 32])
async def test_an_old_leader_runs_no_installation_event_after_losing_the_lead(nodes, database, batch_size):
    # A repository's queue was dropped when its lease was lost; the installations' queue
    # never was: both leaders ran the same installation events, in either order. With i2 in
    # i1's batch (32), the batch went on to run it after the lead was lost.
    stores = await open_stores(database)
    gate = Gate(held={"i1"})
    inbox = None
    try:
        inbox = Inbox(stores.deliveries, gate, claim_every=0.01, batch_size=batch_size)
        live = LiveState(stores.state, None, ManualClock(datetime(2026, 12, 1, tzinfo=UTC)), ())
        a = Replicas(stores.leases, stores.deliveries, live, busy=inbox.busy, release=inbox.release, owner="a")
        inbox.ownership = a
        await a.round()
        assert a.leads()
        for n in (1, 2):  # two installation events (no repository), in order
            body = json.dumps({"n": n}).encode()
            assert await stores.deliveries.put(Delivery(f"i{n}", "installation", body, action="created",
                                                        repo=None, installation=9))
        await inbox.open()
        await inbox.start()
        await wait_for(lambda: "i1" in gate.running)
        # a stalls past the installations lease: b takes the lead, and a's next round learns it.
        await stores.engine.transaction([Statement("UPDATE leases SET expires_at = 0 WHERE name = 'installations'", ())])
        b = await nodes("b")
        await b.replicas.round()
        assert b.replicas.leads()
        await a.round()
        assert not a.leads() and not a.owns(None)
        # The new leader claims the unfinished installation events (a's claims included) and runs them.
        claimed_by_b = [d.id for d in await b.stores.deliveries.claim_owned("b", set(), unrouted=True, limit=9)]
        assert claimed_by_b == ["i1", "i2"]
        gate.open.set()  # a's handler of i1 returns (its commit is refused: b holds the claim)
        await wait_for(lambda: not gate.running and inbox.backlog == 0)
        ran_at_a = [run for run in gate.runs if run.startswith("i")]
        assert ran_at_a == ["i1"], f"a, no longer leading, ran {ran_at_a} too while b runs {claimed_by_b}"
    finally:
        if inbox is not None:
            await inbox.stop()
        await stores.close()


async def test_a_replica_taking_a_repository_stored_twice_falls_back_to_the_readable_spelling(nodes):
    # LiveState.load keeps the last *readable* spelling (here ACME/Bench: acme/bench lacks
    # `installation`); a replica's takeover loads only the spelling its name map kept last,
    # finds it unreadable, and owns the repository with no state (its holds, claims lost).
    one, replica = await nodes("one"), await nodes("replica")
    change = Change().put("", "repo", "acme/bench", {"wave": 5})
    await one.stores.state.apply(change.put("", "repo", "ACME/Bench", {"installation": 7, "wave": 1}))
    await one.live.load()
    assert one.live.repo("acme/bench").name == "ACME/Bench"  # what one process keeps
    await replica.replicas.round()
    assert replica.replicas.owns("acme/bench")
    state = replica.live.repo("acme/bench")
    assert state is not None and state.name == "ACME/Bench"
