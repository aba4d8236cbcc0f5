"""The inbox drains a repository's deliveries in small batches: each delivery's state change
and its status commit in one transaction, and a batch waits for the disk once."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from bot.core.clock import Clock
from bot.core.domain import Attempt
from bot.core.errors import RepositoryMoved
from bot.github.errors import RateLimited, Unavailable
from bot.services.live import LiveState
from bot.services.outcomes import OutcomeRecorder
from bot.services.repo_state import RepoMeta, RepoState
from bot.store import open_stores
from bot.store.change import Change
from bot.store.deliveries import Delivery, DeliveryStore
from bot.store.engine import Statement
from bot.store.errors import LeaseTaken, StoreUnavailable
from bot.store.records import StateStore
from bot.web import inbox as inbox_module
from bot.web.inbox import Inbox
from tests.store.recording import RecordingDatabase

ATTEMPT = Attempt("c" * 33, None, 7, 1, None, datetime(2030, 1, 1, tzinfo=UTC), False, None, None, None, None,
                  "artifact-expired", source="run")


def delivery(number: int, repo: str = "acme/bench") -> Delivery:
    return Delivery(f"d{number}", "pull_request", b"{}", action="synchronize", repo=repo, installation=1)


class Handler:
    """Records one state change per delivery, as the pull request handler does."""

    def __init__(self, state: StateStore, fail: set[str] | None = None) -> None:
        self.state = state
        self.fail = fail or set()
        self.seen: list[str] = []

    async def __call__(self, item: Delivery) -> None:
        self.seen.append(item.id)
        await self.state.apply(Change().put(item.repo or "", "wave", item.id, {"by": item.id}))
        if item.id in self.fail:
            raise ConnectionError(f"{item.id} failed")  # transient: retried


async def run(db: RecordingDatabase, deliveries: list[Delivery], **options: object) -> tuple[Inbox, Handler]:
    store = DeliveryStore(db)
    handler = Handler(StateStore(db, store.writer), options.pop("fail", None))  # type: ignore[arg-type]
    gave_up = options.pop("gave_up", None)
    inbox = Inbox(store, handler, base_delay=0.01, max_delay=0.02, **options)  # type: ignore[arg-type]
    inbox.gave_up = gave_up  # type: ignore[assignment]
    await inbox.open()
    for item in deliveries:  # stored while the worker is down, found by `start`
        assert await inbox.store.put(item)
    db.committed.clear()
    db.transactions.clear()
    await inbox.start()
    await inbox.drained()
    await inbox.stop()
    return inbox, handler


def written_in(statements: list[Statement]) -> tuple[set[str], set[str]]:
    """(keys of the state records put, ids of the deliveries whose status was written)."""
    changed = {row[2] for statement in statements if statement.sql.startswith("INSERT INTO records")
               for row in statement.args}
    # SQLite's statuses statement: (status, attempts, error, updated_at, id) per delivery.
    statuses = {arg for statement in statements if statement.sql.startswith("UPDATE deliveries")
                for arg in statement.args[4::5]}
    return changed, statuses


async def test_each_delivery_commits_its_change_and_its_status_together(
    db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A batch past a couple of milliseconds gives the loop a turn, and its commits so far
    # may start: on a loaded machine, more transactions. That is timing, not grouping.
    monkeypatch.setattr(inbox_module, "HOLD_LOOP_SECONDS", 60.0)
    await run(db, [delivery(n) for n in range(20)], batch_size=8)

    # Each delivery's state change commits in the same transaction as its status (the
    # statuses of a transaction are one UPDATE); 20 deliveries in batches of 8 take at most
    # 3 waits for the disk.
    written = [written_in(statements) for statements in db.transactions]
    assert all(changed == statuses for changed, statuses in written)
    assert sorted(id for _, statuses in written for id in statuses) == sorted(f"d{n}" for n in range(20))
    assert len(db.transactions) <= 3
    assert all(statements.count("UPDATE") == 1 for statements in db.committed)
    store = StateStore(db)
    for n in range(20):
        assert (await DeliveryStore(db).get(f"d{n}")).status == "done"  # type: ignore[union-attr]
        assert await store.get("acme/bench", "wave", f"d{n}") == {"by": f"d{n}"}


async def test_a_failing_delivery_ends_its_batch_and_keeps_its_place(db: RecordingDatabase) -> None:
    _, handler = await run(db, [delivery(n) for n in range(4)], fail={"d1"}, max_attempts=2)

    # d1 failed, waited for its retry at the head (d2 did not overtake it), failed again.
    assert handler.seen == ["d0", "d1", "d1", "d2", "d3"]
    stored = {n: await DeliveryStore(db).get(f"d{n}") for n in range(4)}
    assert [item.status for item in stored.values()] == ["done", "failed", "done", "done"]  # type: ignore[union-attr]
    assert stored[1].attempts == 2 and "d1 failed" in (stored[1].error or "")  # type: ignore[union-attr]


async def test_a_delivery_given_up_after_its_retries_names_its_repository_to_catch_up(db: RecordingDatabase) -> None:
    # What this catches: a command or a PR event lost to a GitHub outage longer than the
    # retries, caught up only by the 6-hourly reconcile.
    given_up: list[str] = []
    await run(db, [delivery(0), delivery(1, repo="acme/other")], fail={"d1"}, max_attempts=2, gave_up=given_up.append)
    assert given_up == ["acme/other"]


async def test_a_delivery_failed_for_good_at_once_is_not_caught_up(db: RecordingDatabase) -> None:
    # A permanent error (a payload no handler can read, a bug) would fail the reconcile's
    # catch-up as well, at every scheduler tick: only a transient error's outlasted retries count.
    store = DeliveryStore(db)

    async def unreadable(item: Delivery) -> None:
        raise ValueError(f"{item.id}: not a payload Klaud reads")

    inbox = Inbox(store, unreadable, base_delay=0.01, max_delay=0.02)
    given_up: list[str] = []
    inbox.gave_up = given_up.append
    await inbox.open()
    assert await store.put(delivery(0))
    await inbox.start()
    await inbox.drained()
    await inbox.stop()
    assert (await store.get("d0")).status == "failed" and given_up == []  # type: ignore[union-attr]


async def test_a_commit_the_store_refuses_runs_the_deliveries_again(db: RecordingDatabase) -> None:
    store = DeliveryStore(db)
    handler = Handler(StateStore(db, store.writer))
    inbox = Inbox(store, handler, base_delay=0.01, max_delay=0.02)
    await inbox.open()
    for n in range(3):
        await store.put(delivery(n))
    db.refuse = "'d1'"  # any transaction writing d1's change or status
    await inbox.start()
    while handler.seen.count("d1") < 2:  # d1 ran, its commit failed, it runs again
        await inbox.get("d1")
        await asyncio.sleep(0.01)
    db.refuse = None
    await inbox.drained()
    await inbox.stop()

    assert [(await store.get(f"d{n}")).status for n in range(3)] == ["done"] * 3  # type: ignore[union-attr]
    assert handler.seen[:2] == ["d0", "d1"] and handler.seen.count("d0") == 1


async def test_a_delivery_acknowledged_while_the_state_loads_runs_once(db: RecordingDatabase) -> None:
    store = DeliveryStore(db)
    handler = Handler(StateStore(db, store.writer))
    inbox = Inbox(store, handler)
    await inbox.open()
    assert await store.put(delivery(0))  # left from before a restart
    assert await inbox.put(delivery(1))  # the webhook listener serves before `start`
    await inbox.start()
    await inbox.drained()
    await inbox.stop()
    assert sorted(handler.seen) == ["d0", "d1"]


async def test_a_long_queue_keeps_few_bodies_in_memory_and_reads_the_others_at_their_turn(
    db: RecordingDatabase,
) -> None:
    store = DeliveryStore(db)
    seen: list[bytes] = []

    async def handler(item: Delivery) -> None:
        seen.append(msgspec.json.decode(item.body or b"")["n"].to_bytes(1, "big"))

    inbox = Inbox(store, handler, body_budget=100)  # room for about three 30-byte bodies
    await inbox.open()
    for n in range(3):  # stored before the start: recovered without their bodies
        await store.put(Delivery(f"old-{n}", "push", b'{"n": %d, "pad": "..........."}' % n, repo="o/r"))
    await inbox.start()
    await inbox.stop()  # nothing runs yet: look at what start queued
    assert all(item.body is None for queue in inbox._queues.values() for item in queue)

    inbox = Inbox(store, handler, body_budget=100)
    await inbox.open()
    await inbox.start()
    for n in range(3, 10):
        await inbox.put(Delivery(f"new-{n}", "push", b'{"n": %d, "pad": "..........."}' % n, repo="o/r"))
    held = inbox._held_bytes
    await inbox.drained()
    await inbox.stop()

    assert held <= 100
    assert seen == [n.to_bytes(1, "big") for n in range(10)], "every body was read, in order"
    assert inbox._held_bytes == 0 and not inbox._held


class Owner:
    """The `Ownership` of a replica holding the lease of one repository."""

    owner = "replica-a"

    def repos(self) -> set[str]:
        return {"acme/bench"}

    def unrouted(self) -> bool:
        return False

    def owns(self, repo: str | None) -> bool:
        return repo == "acme/bench"


async def test_a_replica_claims_what_it_stored_itself_without_reading_the_body_back(
    db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = DeliveryStore(db)
    read_back: list[str] = []
    read_bodies = store.bodies

    async def bodies(ids: list[str]) -> dict[str, bytes]:
        read_back.extend(ids)
        return await read_bodies(ids)

    monkeypatch.setattr(store, "bodies", bodies)
    seen: dict[str, bytes] = {}

    async def handler(item: Delivery) -> None:
        seen[item.id] = item.body or b""

    inbox = Inbox(store, handler, ownership=Owner(), claim_every=0.01)
    await inbox.open()
    await inbox.start()
    mine = Delivery("mine", "pull_request", b'{"n": 1}', repo="acme/bench", installation=1)
    assert await inbox.put(mine)
    # Stored by another replica: this one finds it in the store, body and all.
    other = Delivery("other", "pull_request", b'{"n": 2}', repo="acme/bench", installation=1)
    assert await store.put(other)
    for _ in range(200):
        if len(seen) == 2:
            break
        await asyncio.sleep(0.01)
    await inbox.stop()
    assert seen == {"mine": b'{"n": 1}', "other": b'{"n": 2}'}
    assert read_back == ["other"]


async def kept_repository(db: RecordingDatabase) -> tuple[DeliveryStore, StateStore, LiveState, OutcomeRecorder]:
    """The stores over `db`, and a live state keeping repository o/r, stored."""
    deliveries = DeliveryStore(db)
    store = StateStore(db, deliveries.writer)
    live = LiveState(store, None, Clock(), ())
    live.put(RepoState("o/r", RepoMeta(installation=1)))
    await store.apply(Change().put("", "repo", "o/r", RepoMeta(installation=1)))
    return deliveries, store, live, OutcomeRecorder(live)


def recording_attempt(
    live: LiveState, outcomes: OutcomeRecorder, runs: list[str], before_commit: Callable[[], Awaitable[None]] | None = None
) -> Callable[[Delivery], Awaitable[None]]:
    """A handler that records ATTEMPT in o/r as OutcomeRecorder.on_receipt does (memory first,
    then the commit), noting each delivery it runs."""

    async def handler(item: Delivery) -> None:
        runs.append(item.id)
        state = live.repo("o/r")
        assert state is not None
        async with live.lock(state.name):
            change = Change()
            await outcomes.apply_attempt(state, None, ATTEMPT, change)  # type: ignore[arg-type]
            if before_commit is not None:
                await before_commit()
            await live.persist(change)

    return handler


async def test_a_delivery_whose_commit_was_refused_writes_its_change_when_it_runs_again(db: RecordingDatabase) -> None:
    # A real handler writes only what differs from memory. Run again on the memory of its
    # refused first run, it found the attempt there, wrote nothing, and the store lost it.
    deliveries, store, live, outcomes = await kept_repository(db)
    runs: list[str] = []
    handler = recording_attempt(live, outcomes, runs)

    inbox = Inbox(deliveries, handler, base_delay=0.01, max_delay=0.02, reload=live.reload)
    await inbox.open()
    await deliveries.put(Delivery("d1", "issue_comment", b"{}", action="created", repo="o/r", installation=1))
    db.refuse = "'d1'"
    await inbox.start()
    while not runs:
        await asyncio.sleep(0.005)
    db.refuse = None
    await inbox.drained()
    await inbox.stop()
    assert runs == ["d1", "d1"] and (await deliveries.get("d1")).status == "done"  # type: ignore[union-attr]
    assert f"{ATTEMPT.candidate}:7:1" in (await store.load("o/r")).get("attempt", {})


async def test_a_change_the_store_refused_outside_a_delivery_is_read_back_from_the_store(db: RecordingDatabase) -> None:
    store = StateStore(db, DeliveryStore(db).writer)
    live = LiveState(store, None, Clock(), ())
    await store.apply(Change().put("", "repo", "o/r", RepoMeta(installation=1, wave=3)))
    state = await live.load_repo("o/r")
    assert state is not None
    state.meta.wave = 4  # a wave's record, refused by the store
    db.refuse = "o/r"
    with pytest.raises(Exception, match="refused"):
        await live.persist(state.save_meta())
    db.refuse = None
    assert live.stale == {"o/r"}
    await live.reload_stale()  # the scheduler's next tick
    reloaded = live.repo("o/r")
    assert reloaded is not None and reloaded.meta.wave == 3 and live.stale == set()


async def test_a_handler_cut_by_its_timeout_runs_again_on_memory_read_back(db: RecordingDatabase) -> None:
    # Cut between changing memory and committing, the handler left memory ahead of the
    # store; run again on that memory, it found the attempt there and wrote nothing.
    deliveries, store, live, outcomes = await kept_repository(db)
    runs: list[str] = []

    async def never_answers() -> None:  # a GitHub call on the first run only
        if len(runs) == 1:
            await asyncio.Event().wait()

    handler = recording_attempt(live, outcomes, runs, before_commit=never_answers)

    inbox = Inbox(deliveries, handler, base_delay=0.01, max_delay=0.02, handler_timeout=0.05,
                  reload=live.reload, stale=live.stale)
    await inbox.open()
    await deliveries.put(Delivery("d1", "workflow_run", b"{}", action="completed", repo="o/r", installation=1))
    await inbox.start()
    while len(runs) < 2 or inbox.backlog:
        await asyncio.sleep(0.005)
    await inbox.drained()
    await inbox.stop()
    assert runs == ["d1", "d1"] and (await deliveries.get("d1")).status == "done"  # type: ignore[union-attr]
    assert f"{ATTEMPT.candidate}:7:1" in (await store.load("o/r")).get("attempt", {})


async def test_a_rate_limited_delivery_waits_for_the_reset_without_using_up_its_attempts(db: RecordingDatabase) -> None:
    store = DeliveryStore(db)
    runs: list[float] = []

    async def handler(item: Delivery) -> None:
        runs.append(asyncio.get_running_loop().time())
        if len(runs) <= 4:  # more than max_attempts: GitHub's quota resets later
            raise RateLimited(403, "API rate limit exceeded", retry_after=0.05)

    inbox = Inbox(store, handler, base_delay=0.001, max_delay=0.002, max_attempts=2)
    await inbox.open()
    await store.put(delivery(1))
    await inbox.start()
    await inbox.drained()
    await inbox.stop()
    assert (await store.get("d1")).status == "done"  # type: ignore[union-attr]
    assert len(runs) == 5 and all(later - earlier >= 0.05 for earlier, later in itertools.pairwise(runs))


class OwnerOf:
    """The `Ownership` of a replica holding the lease of `repo` only."""

    def __init__(self, owner: str, repo: str) -> None:
        self.owner, self.repo = owner, repo

    def repos(self) -> set[str]:
        return {self.repo}

    def unrouted(self) -> bool:
        return False

    def owns(self, repo: str | None) -> bool:
        return repo is not None and repo.lower() == self.repo


def moved_to(new: str, ran: list[tuple[str, str | None]]) -> Callable[[Delivery], Awaitable[None]]:
    """A handler that finds deliveries named acme/bench kept under `new` by another replica."""

    async def handler(item: Delivery) -> None:
        ran.append((item.id, item.repo))
        if item.repo == "acme/bench":
            raise RepositoryMoved(new)

    return handler


async def wait_for(condition: Callable[[], bool]) -> None:
    for _ in range(300):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not reached in 3 s")


async def test_a_delivery_whose_repository_another_replica_keeps_under_its_new_name_is_processed_there(
    db: RecordingDatabase,
) -> None:
    store = DeliveryStore(db)
    ran: list[tuple[str, str | None]] = []
    old = Inbox(store, moved_to("acme/next", ran), ownership=OwnerOf("replica-a", "acme/bench"), claim_every=0.01)
    new = Inbox(store, moved_to("acme/next", ran), ownership=OwnerOf("replica-b", "acme/next"), claim_every=0.01)
    for inbox in (old, new):
        await inbox.open()
        await inbox.start()
    assert await old.put(delivery(1))

    await wait_for(lambda: ("d1", "acme/next") in ran)
    for inbox in (old, new):
        await inbox.stop()

    assert ran == [("d1", "acme/bench"), ("d1", "acme/next")]
    stored = await store.get("d1")
    assert stored is not None and stored.repo == "acme/next" and stored.status == "done"


async def test_alone_a_handed_on_delivery_is_queued_again_under_its_new_name(db: RecordingDatabase) -> None:
    ran: list[tuple[str, str | None]] = []
    inbox, _ = await run(db, [delivery(1), delivery(2, "acme/next")])
    inbox.handler = moved_to("acme/next", ran)
    await inbox.start()
    assert await inbox.put(delivery(3))
    await wait_for(lambda: ("d3", "acme/next") in ran)
    await inbox.drained()
    await inbox.stop()

    assert ran == [("d3", "acme/bench"), ("d3", "acme/next")]
    stored = await inbox.store.get("d3")
    assert stored is not None and stored.repo == "acme/next" and stored.status == "done"


async def test_a_delivery_handed_on_again_and_again_fails_after_its_attempts(db: RecordingDatabase) -> None:
    async def always_moved(item: Delivery) -> None:
        raise RepositoryMoved("acme/bench")  # a bug: the new name is the old one

    inbox = Inbox(DeliveryStore(db), always_moved, max_attempts=3)
    await inbox.open()
    await inbox.start()
    assert await inbox.put(delivery(1))
    await inbox.drained()
    await inbox.stop()

    stored = await inbox.store.get("d1")
    assert stored is not None and stored.status == "failed" and stored.attempts == 3
    assert stored.error is not None and "RepositoryMoved" in stored.error


async def logs_of_one_delivery(inbox: Inbox) -> list[dict[str, Any]]:
    """What `inbox` logs running one delivery, d1, to its end."""
    await inbox.open()
    await inbox.store.put(delivery(1))
    with capture_logs() as logs:
        await inbox.start()
        await inbox.drained()
        await inbox.stop()
    return logs


@pytest.mark.parametrize(("error", "traceback"), [(StoreUnavailable("the store restarts"), False),
                                                  (LeaseTaken("leases repo:acme/bench (b) are held"), False),
                                                  (TypeError("a bug in reading back"), True)])
async def test_a_failed_read_back_waits_and_shows_a_bug_whole(db: RecordingDatabase, error: Exception,
                                                              traceback: bool) -> None:
    # Reading a repository back is more than a read of the store: a bug there must not pass
    # for the store's trouble, one line retried for ever.
    store = DeliveryStore(db)
    handler = Handler(StateStore(db, store.writer))
    failures = [error]
    reloaded: list[str] = []

    async def reload(repo: str) -> None:
        if failures:
            raise failures.pop()
        reloaded.append(repo)
        stale.discard(repo)

    stale = {"acme/bench"}
    logs = await logs_of_one_delivery(Inbox(store, handler, base_delay=0.01, max_delay=0.02, reload=reload, stale=stale))
    [failed] = [e for e in logs if e["event"] == "delivery.store_failed"]
    assert failed["error"] == f"{type(error).__name__}: {error}"
    assert (failed.get("exc_info") is error) is traceback
    assert reloaded == ["acme/bench"] and handler.seen == ["d1"]  # read back, then run


@pytest.mark.parametrize(("error", "traceback"), [(LeaseTaken("leases repo:acme/bench (b) are held"), False),
                                                  (Unavailable(502, "Bad Gateway"), False),
                                                  (ConnectionError("reset by peer"), True)])
async def test_a_retry_is_one_line_when_klaud_says_what_happened(db: RecordingDatabase, error: Exception,
                                                                 traceback: bool) -> None:
    # A GitHub outage or a lapsed lease retries every delivery it meets, each several times:
    # a traceback each would bury the log. An error Klaud did not name is shown whole.
    store = DeliveryStore(db)
    failures = [error]

    async def handler(item: Delivery) -> None:
        if failures:
            raise failures.pop()

    logs = await logs_of_one_delivery(Inbox(store, handler, base_delay=0.01, max_delay=0.02))
    [retry] = [e for e in logs if e["event"] == "delivery.retry"]
    assert retry["error"].endswith(str(error))
    assert (retry.get("exc_info") is error) is traceback
    assert [e["delivery_id"] for e in logs if e["event"] == "delivery.processed"] == ["d1"]


class Leases(OwnerOf):
    """An `OwnerOf` whose lease the test takes away or gives back."""

    def __init__(self, owner: str, repo: str) -> None:
        super().__init__(owner, repo)
        self.held = True

    def repos(self) -> set[str]:
        return {self.repo} if self.held else set()

    def owns(self, repo: str | None) -> bool:
        return self.held and super().owns(repo)


class Gate:
    """A handler that records each run and holds the deliveries named in `held` until opened."""

    def __init__(self, held: set[str] | None = None) -> None:
        self.held = held
        self.open = asyncio.Event()
        self.runs: list[str] = []
        self.running: set[str] = set()

    async def __call__(self, item: Delivery) -> None:
        self.runs.append(item.id)
        self.running.add(item.id)
        try:
            if self.held is None or item.id in self.held:
                await self.open.wait()
        finally:
            self.running.discard(item.id)


# -- storing ---------------------------------------------------------------------------


async def test_a_replica_claims_a_delivery_it_stored_at_once_not_at_its_next_round(db: RecordingDatabase) -> None:
    # What this catches: without the nudge, the delivery waits for the claim loop's next round (here 30 s).
    gate = Gate(held=set())
    inbox = Inbox(DeliveryStore(db), gate, ownership=Owner(), claim_every=30.0)
    await inbox.open()
    await inbox.start()
    await asyncio.sleep(0.05)  # the first round found nothing and waits
    assert await inbox.put(delivery(1))
    await wait_for(lambda: gate.runs == ["d1"] and inbox.backlog == 0)
    await inbox.stop()


async def test_a_store_that_answers_a_put_again_makes_the_replica_ready_again(
    db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What this catches: a put that raised set store_error; the next put that the store answers must clear
    # it, not leave /readyz at 503 until its next probe.
    store = DeliveryStore(db)
    inbox = Inbox(store, Handler(StateStore(db, store.writer)))
    await inbox.open()
    put_soon = store.put_soon

    def failing(item: Delivery) -> asyncio.Future[bool]:
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        future.set_exception(ConnectionRefusedError("connection refused"))
        return future

    monkeypatch.setattr(store, "put_soon", failing)
    with pytest.raises(ConnectionRefusedError):
        await inbox.put_in_time(delivery(1), 1.0)
    assert not inbox.ready and "ConnectionRefusedError" in (inbox.store_error or "")
    monkeypatch.setattr(store, "put_soon", put_soon)
    assert await inbox.put_in_time(delivery(2), 1.0) is True
    assert inbox.store_error is None and inbox.ready


# -- acknowledgements first -------------------------------------------------------------


AckWaiting = tuple[Inbox, Handler, asyncio.Future[bool], asyncio.Task[bool | None]]


async def inbox_with_only_an_unanswered_ack(db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch,
                                            **options: object) -> AckWaiting:
    """A started inbox where delivery d2's 202 waits for a commit the test answers (`commit`)."""
    store = DeliveryStore(db)
    handler = Handler(StateStore(db, store.writer))
    inbox = Inbox(store, handler, **options)  # type: ignore[arg-type]
    await inbox.open()
    await inbox.start()
    commit: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
    put_soon = store.put_soon
    monkeypatch.setattr(store, "put_soon", lambda item: commit if item.id == "d2" else put_soon(item))
    waiting = asyncio.create_task(inbox.put_in_time(delivery(2), 30.0))
    await asyncio.sleep(0)
    return inbox, handler, commit, waiting


async def inbox_with_an_unanswered_ack(db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch,
                                       **options: object) -> AckWaiting:
    """`inbox_with_only_an_unanswered_ack`, and d1 stored (and queued) meanwhile."""
    inbox, handler, commit, waiting = await inbox_with_only_an_unanswered_ack(db, monkeypatch, **options)
    assert await inbox.put_in_time(delivery(1), 30.0) is True
    return inbox, handler, commit, waiting


@pytest.mark.parametrize("stored", [True, False], ids=["new", "redelivery"])
async def test_no_batch_starts_while_an_acknowledgement_waits_for_its_commit(
    db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch, stored: bool
) -> None:
    # What this catches: batches started beside a burst take the event loop from its 202s; and a
    # last answer that queues nothing (a redelivery) not ending the hold at once.
    inbox, handler, commit, waiting = await inbox_with_an_unanswered_ack(db, monkeypatch)
    await asyncio.sleep(0.2)
    assert handler.seen == [] and inbox.backlog == 1

    commit.set_result(stored)
    assert await waiting is stored
    expected = ["d1", "d2"] if stored else ["d1"]
    await wait_for(lambda: sorted(handler.seen) == expected and inbox.backlog == 0)
    await inbox.stop()


async def test_a_hold_for_acknowledgements_ends_after_its_time(
    db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What this catches: acknowledgements that never stop waiting (a flood, a stuck commit) holding
    # the processing back for ever.
    monkeypatch.setattr(inbox_module, "HOLD_FOR_ACKS_SECONDS", 0.1)
    inbox, handler, commit, waiting = await inbox_with_an_unanswered_ack(db, monkeypatch)
    await wait_for(lambda: handler.seen == ["d1"] and inbox.backlog == 0)
    assert not waiting.done()
    commit.set_result(True)
    await wait_for(lambda: handler.seen == ["d1", "d2"])
    await inbox.stop()


async def test_a_hold_begins_with_the_backlog_not_with_an_acknowledgement_waiting_alone(
    db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What this catches: a hold counted from a moment with nothing queued, already spent when
    # the burst's deliveries come.
    monkeypatch.setattr(inbox_module, "HOLD_FOR_ACKS_SECONDS", 0.3)
    inbox, handler, commit, waiting = await inbox_with_only_an_unanswered_ack(db, monkeypatch)
    inbox._wake.set()  # the worker looks while only that acknowledgement waits, nothing queued
    await asyncio.sleep(0.4)

    assert await inbox.put_in_time(delivery(1), 30.0) is True
    await asyncio.sleep(0.1)
    assert handler.seen == []  # held: the hold began with d1, not 0.4 s before
    await wait_for(lambda: handler.seen == ["d1"])
    commit.set_result(False)
    await waiting
    await inbox.stop()


async def test_after_a_hold_the_whole_backlog_is_worked_through_while_acknowledgements_still_wait(
    db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What this catches: a new hold after every batch under a flood (acknowledgements always
    # waiting), which processed one batch per hold: a backlog growing without bound.
    monkeypatch.setattr(inbox_module, "HOLD_FOR_ACKS_SECONDS", 1.0)
    inbox, handler, commit, waiting = await inbox_with_an_unanswered_ack(db, monkeypatch, batch_size=2)

    async def slowly(item: Delivery) -> None:  # batches long enough for deliveries to arrive meanwhile
        await asyncio.sleep(0.02)
        await handler(item)

    inbox.handler = slowly
    for number in range(3, 10):
        assert await inbox.put_in_time(delivery(number), 30.0) is True

    async def flood() -> None:  # more deliveries all along, as in a burst that goes on
        for number in itertools.count(100):
            assert await inbox.put_in_time(delivery(number), 30.0) is True
            await asyncio.sleep(0.01)

    flooding = asyncio.create_task(flood())
    first = {f"d{number}" for number in (1, *range(3, 10))}
    # One hold (1 s), then the first eight in four batches: well within wait_for's 3 s, where
    # a hold before each batch would take 4 s.
    await wait_for(lambda: first <= set(handler.seen))
    flooding.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await flooding  # a delivery the flood could not store fails the test here
    commit.set_result(False)
    await waiting
    await inbox.stop()


async def test_a_replica_processes_while_acknowledgements_wait(
    db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What this catches: the hold on replicas, where it was measured to raise PostgreSQL's p99
    # acknowledgement latency (one replica: ~36 to ~48 ms, medians of six rounds).
    inbox, handler, commit, waiting = await inbox_with_an_unanswered_ack(
        db, monkeypatch, ownership=Owner(), claim_every=0.01)
    await wait_for(lambda: handler.seen == ["d1"] and inbox.backlog == 0)
    assert not waiting.done()
    commit.set_result(False)
    assert await waiting is False
    await inbox.stop()


# -- replicas' claims ------------------------------------------------------------------


async def test_a_released_repositorys_waiting_deliveries_leave_this_replica(db: RecordingDatabase) -> None:
    # What this catches: nothing dropped; the backlog keeping them; or, dropped under the running
    # batch, its end counting the backlog below zero.
    gate = Gate(held={"d1"})
    lease = Leases("replica-a", "acme/bench")
    inbox = Inbox(DeliveryStore(db), gate, ownership=lease, claim_every=0.01, batch_size=1)
    await inbox.open()
    for n in (1, 2):
        assert await inbox.store.put(delivery(n))  # stored by another replica
    await inbox.start()
    await wait_for(lambda: gate.runs == ["d1"] and inbox.backlog == 2)
    lease.held = False  # the lease went to another replica
    inbox.release("acme/bench")
    await asyncio.sleep(0.05)
    gate.open.set()
    await wait_for(lambda: not gate.running)
    await asyncio.sleep(0.1)
    assert gate.runs == ["d1"], "d2 is the next owner's"
    assert inbox.backlog == 0 and not inbox.busy("acme/bench")
    await inbox.stop()


async def test_a_repository_released_while_idle_and_taken_back_runs_its_deliveries(db: RecordingDatabase) -> None:
    # What this catches: the release mark outlived the lease's return and dropped the claimed delivery.
    gate = Gate(held=set())
    inbox = Inbox(DeliveryStore(db), gate, ownership=OwnerOf("replica-a", "acme/bench"), claim_every=0.01)
    await inbox.open()
    await inbox.start()
    inbox.release("acme/bench")  # the lease went while nothing of it waited here ...
    await asyncio.sleep(0.05)
    assert await inbox.put(delivery(1))  # ... and came back
    await wait_for(lambda: gate.runs == ["d1"] and inbox.backlog == 0)
    await inbox.stop()
    stored = await inbox.store.get("d1")
    assert stored is not None and stored.status == "done"


async def test_repositories_released_while_idle_leave_no_release_mark(db: RecordingDatabase) -> None:
    # What this catches: a mark kept for each idle repository released (all `Replicas._give_up`
    # lets go of: the uninstalled, and those above the share, round after round as replicas come
    # and go); nothing of it queued, no drop ever cleared it, for as long as the process ran.
    inbox = Inbox(DeliveryStore(db), Gate(held=set()), ownership=Owner(), claim_every=0.01)
    await inbox.open()
    await inbox.start()
    for n in range(50):
        inbox.release(f"acme/given-up-{n}")
    await asyncio.sleep(0.05)  # a few rounds of the worker and the claim loop
    assert not inbox._released, f"{len(inbox._released)} release marks of queues that do not exist"
    await inbox.stop()


def count_claims(store: DeliveryStore, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many deliveries each of `store`'s claims took, in order."""
    claim_owned = store.claim_owned
    claims: list[int] = []

    async def counted(*args: object, **kwargs: object) -> list[Delivery]:
        claimed = await claim_owned(*args, **kwargs)
        claims.append(len(claimed))
        return claimed

    monkeypatch.setattr(store, "claim_owned", counted)
    return claims


async def test_after_a_claim_that_found_work_the_replica_claims_again_after_a_short_pause(
    db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What this catches: without claiming again, the rest of a burst other replicas stored waits claim_every.
    store = DeliveryStore(db)
    claims = count_claims(store, monkeypatch)
    gate = Gate(held=set())
    inbox = Inbox(store, gate, ownership=Owner(), claim_every=30.0)
    await inbox.open()
    assert await store.put(delivery(1))  # stored by another replica
    await inbox.start()
    await wait_for(lambda: len(claims) >= 2)
    assert claims[:2] == [1, 0]
    await inbox.stop()


@pytest.mark.parametrize("restarted", [False, True])
async def test_the_pause_after_a_claim_that_found_work_gathers_a_burst_into_the_next_claim(
    db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch, restarted: bool
) -> None:
    # What this catches: claiming again at once took a few deliveries a claim under load, a claim
    # and a commit fence each (531 claims for 5,000 deliveries under three replicas); and a stop
    # that ended every pause after the inbox was started again.
    monkeypatch.setattr(inbox_module, "CLAIM_GAP_SECONDS", 0.5)
    store = DeliveryStore(db)
    claims = count_claims(store, monkeypatch)
    gate = Gate(held=set())
    inbox = Inbox(store, gate, ownership=Owner(), claim_every=30.0)
    await inbox.open()
    if restarted:
        await inbox.start()
        await inbox.stop()
        claims.clear()
    assert await store.put(delivery(1))  # stored by other replicas, one after the other
    await inbox.start()
    await wait_for(lambda: gate.runs == ["d1"])
    for n in range(2, 5):
        assert await store.put(delivery(n))
    await wait_for(lambda: len(gate.runs) == 4)
    await inbox.stop()
    assert claims[:2] == [1, 3]


def test_the_pause_after_a_claim_lasts_until_a_batch_likely_waits_and_never_past_its_longest() -> None:
    # What this catches: a fixed pause let one replica's claims grow to the claim limit under load
    # (its p99 went from 40 to 63 ms), or a slow trickle wait without bound.
    batch, longest = inbox_module.CLAIM_BATCH, inbox_module.CLAIM_GAP_SECONDS
    assert inbox_module.claim_pause(batch * 10, 0.1) == pytest.approx(0.01)  # 10x a batch in 0.1 s
    assert inbox_module.claim_pause(batch, 0.05) == pytest.approx(0.05)
    assert inbox_module.claim_pause(1, 10.0) == longest


async def test_after_a_claim_that_took_all_its_room_the_next_one_comes_once_half_is_free(
    db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What this catches: the pause alone capped a replica's drain at claim_limit deliveries per pause
    # (measured 934/s against 1,320/s), its handlers idle while the store held more.
    monkeypatch.setattr(inbox_module, "CLAIM_GAP_SECONDS", 30.0)
    gate = Gate(held=set())
    inbox = Inbox(DeliveryStore(db), gate, ownership=Owner(), claim_every=30.0, claim_limit=4)
    await inbox.open()
    for n in range(10):
        assert await inbox.store.put(delivery(n))  # stored by other replicas
    await inbox.start()
    await wait_for(lambda: len(gate.runs) == 10)
    await inbox.stop()
    assert gate.runs == [f"d{n}" for n in range(10)]


async def test_a_stop_does_not_wait_for_the_pause_after_a_claim(
    db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What this catches: the claim loop sat out its pause before it saw the stop (a rolling restart's
    # drain waited that long).
    monkeypatch.setattr(inbox_module, "CLAIM_GAP_SECONDS", 30.0)
    gate = Gate(held=set())
    inbox = Inbox(DeliveryStore(db), gate, ownership=Owner(), claim_every=30.0)
    await inbox.open()
    assert await inbox.store.put(delivery(1))
    await inbox.start()
    await wait_for(lambda: gate.runs == ["d1"])
    async with asyncio.timeout(5):
        await inbox.stop()


async def test_a_replica_keeps_at_most_claim_limit_deliveries_in_memory(db: RecordingDatabase) -> None:
    # What this catches: the claim ignored what waits here already; the rest must wait in the store.
    gate = Gate()
    inbox = Inbox(DeliveryStore(db), gate, ownership=Owner(), claim_every=0.01, claim_limit=2)
    await inbox.open()
    for n in range(5):
        assert await inbox.store.put(delivery(n))  # stored by another replica
    await inbox.start()
    await wait_for(lambda: bool(gate.runs))
    await asyncio.sleep(0.1)  # several rounds
    assert inbox.backlog == 2
    gate.open.set()
    await wait_for(lambda: len(gate.runs) == 5 and inbox.backlog == 0)
    await inbox.stop()
    assert gate.runs == [f"d{n}" for n in range(5)]


async def test_a_delivery_waiting_for_its_retry_is_not_claimed_a_second_time(db: RecordingDatabase) -> None:
    # What this catches: waiting for its retry, the delivery is `queued` in the store; the claim finds it
    # again, and queued twice here it ran three times.
    runs: list[str] = []

    async def handler(item: Delivery) -> None:
        runs.append(item.id)
        if len(runs) == 1:
            raise ConnectionError("transient")

    inbox = Inbox(DeliveryStore(db), handler, ownership=Owner(), claim_every=0.01, base_delay=0.3, max_delay=0.3)
    await inbox.open()
    await inbox.start()
    assert await inbox.put(delivery(1))
    await wait_for(lambda: len(runs) == 2 and inbox.backlog == 0)
    await asyncio.sleep(0.2)
    await inbox.stop()
    assert runs == ["d1", "d1"]
    stored = await inbox.store.get("d1")
    assert stored is not None and (stored.status, stored.attempts) == ("done", 2)


async def test_a_delivery_whose_lease_went_during_the_claim_is_left_to_the_next_owner(db: RecordingDatabase) -> None:
    # What this catches: the claim's answer came after the lease went; run here it would race the new owner.
    class LeaseGoesDuringTheClaim(OwnerOf):
        calls = 0

        def repos(self) -> set[str]:
            self.calls += 1
            return {self.repo} if self.calls == 1 else set()

    gate = Gate(held=set())
    inbox = Inbox(DeliveryStore(db), gate, ownership=LeaseGoesDuringTheClaim("replica-a", "acme/bench"),
                  claim_every=0.01)
    await inbox.open()
    assert await inbox.store.put(delivery(1))
    await inbox.start()
    await asyncio.sleep(0.2)
    await inbox.stop()
    assert gate.runs == [] and inbox.backlog == 0


# -- memory ----------------------------------------------------------------------------


async def test_bodies_past_the_budget_are_not_kept_and_are_read_back_at_their_turn(
    db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What this catches: a body past the budget stayed in memory (the budget only counted).
    store = DeliveryStore(db)
    read_bodies = store.bodies
    read_back: list[str] = []

    async def bodies(ids: list[str]) -> dict[str, bytes]:
        read_back.extend(ids)
        return await read_bodies(ids)

    monkeypatch.setattr(store, "bodies", bodies)
    gate = Gate(held={"new-0"})
    inbox = Inbox(store, gate, body_budget=100)  # room for three 30-byte bodies
    await inbox.open()
    await inbox.start()
    for n in range(6):
        await inbox.put(Delivery(f"new-{n}", "push", b'{"n": %d, "pad": "..........."}' % n, repo="o/r"))
    kept = sum(len(item.body) for queue in inbox._queues.values() for item in queue if item.body is not None)
    gate.open.set()
    await inbox.drained()
    await inbox.stop()
    assert kept <= 100
    assert read_back == ["new-3", "new-4", "new-5"]


# -- scheduling ------------------------------------------------------------------------


async def test_a_retry_due_soon_is_not_held_behind_another_repositorys_later_retry(db: RecordingDatabase) -> None:
    # What this catches: the worker slept until the latest due time, not the earliest (here
    # an hour away: d1's retry, due in 50 ms, would not come within the wait).
    runs: list[str] = []

    async def handler(item: Delivery) -> None:
        runs.append(item.id)
        if runs.count(item.id) == 1:
            raise RateLimited(403, "API rate limit exceeded", retry_after=0.05 if item.id == "d1" else 3600.0)

    inbox = Inbox(DeliveryStore(db), handler, base_delay=0.001, max_delay=0.002)
    await inbox.open()
    await inbox.store.put(delivery(1, "acme/soon"))
    await inbox.store.put(delivery(2, "acme/later"))
    await inbox.start()
    await wait_for(lambda: runs.count("d1") == 2)
    await inbox.stop(grace=0)
    assert runs.count("d2") == 1


async def test_no_more_repositories_run_at_once_than_the_concurrency(db: RecordingDatabase) -> None:
    # What this catches: one batch past the limit.
    gate = Gate()
    inbox = Inbox(DeliveryStore(db), gate, concurrency=2)
    await inbox.open()
    for n in range(3):
        await inbox.store.put(delivery(n, f"acme/r{n}"))
    await inbox.start()
    await wait_for(lambda: len(gate.running) == 2)
    await asyncio.sleep(0.1)
    assert len(gate.running) == 2
    gate.open.set()
    await inbox.drained()
    await inbox.stop()
    assert sorted(gate.runs) == ["d0", "d1", "d2"]


# -- stale repositories ----------------------------------------------------------------


async def test_a_batch_reads_back_only_its_own_repositorys_stale_state(db: RecordingDatabase) -> None:
    # What this catches: another queue's repository read back under its running batch would replace the
    # memory its handler works on.
    store = DeliveryStore(db)
    reloaded: list[str] = []

    async def reload(repo: str) -> None:
        reloaded.append(repo)
        stale.discard(repo)

    stale = {"acme/other"}
    inbox = Inbox(store, Handler(StateStore(db, store.writer)), reload=reload, stale=stale)
    await inbox.open()
    await store.put(delivery(1))
    await inbox.start()
    await inbox.drained()
    await inbox.stop()
    assert reloaded == [] and stale == {"acme/other"}


# -- backoff ---------------------------------------------------------------------------


async def test_a_retry_waits_at_least_half_its_backoff(db: RecordingDatabase) -> None:
    # What this catches: full jitter down to 0 would retry a failing delivery (or a refusing store) at once.
    store = DeliveryStore(db)
    inbox = Inbox(store, Handler(StateStore(db, store.writer)), base_delay=2.0, max_delay=600.0)
    assert all(1.0 <= inbox.retry_delay(1) <= 2.0 for _ in range(200))
    assert all(8.0 <= inbox.retry_delay(4) <= 16.0 for _ in range(200))
    assert all(300.0 <= inbox.retry_delay(40) <= 600.0 for _ in range(200))


# -- bodies read back ------------------------------------------------------------------


async def test_a_batch_whose_bodies_cannot_be_read_waits_rather_than_running_without_them(
    db: RecordingDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What this catches: run without their bodies, the deliveries fail their parse: lost for good.
    store = DeliveryStore(db)
    read_bodies = store.bodies
    failures = [ConnectionError("the connection was closed")]

    async def bodies(ids: list[str]) -> dict[str, bytes]:
        if failures:
            raise failures.pop()
        return await read_bodies(ids)

    monkeypatch.setattr(store, "bodies", bodies)
    seen: list[bytes | None] = []

    async def handler(item: Delivery) -> None:
        seen.append(item.body)

    inbox = Inbox(store, handler, base_delay=0.01, max_delay=0.02)
    await inbox.open()
    await store.put(Delivery("d1", "push", b'{"n": 1}', repo="o/r"))  # recovered without its body
    await inbox.start()
    await inbox.drained()
    await inbox.stop()
    assert seen == [b'{"n": 1}'] and not failures
    stored = await store.get("d1")
    assert stored is not None and stored.status == "done"


# -- handed on to a new name -----------------------------------------------------------


async def test_a_replica_hands_a_delivery_on_and_leaves_it_to_the_new_names_owner(db: RecordingDatabase) -> None:
    # What this catches: the old owner kept the delivery at its queue's head and ran it again itself.
    old_ran: list[tuple[str, str | None]] = []
    new_ran: list[tuple[str, str | None]] = []
    old = Inbox(DeliveryStore(db), moved_to("acme/next", old_ran), ownership=OwnerOf("replica-a", "acme/bench"),
                claim_every=0.01)
    new = Inbox(DeliveryStore(db), moved_to("acme/next", new_ran), ownership=OwnerOf("replica-b", "acme/next"),
                claim_every=0.01)
    for inbox in (old, new):
        await inbox.open()
        await inbox.start()
    assert await old.put(delivery(1))
    await wait_for(lambda: bool(new_ran) and old.backlog == 0 and new.backlog == 0)
    await asyncio.sleep(0.1)
    for inbox in (old, new):
        await inbox.stop()
    assert old_ran == [("d1", "acme/bench")] and new_ran == [("d1", "acme/next")]


async def test_a_replica_owning_both_names_claims_the_delivery_it_handed_on(db: RecordingDatabase) -> None:
    # What this catches: the finished delivery's id stayed among the queued ones, and the claim of it under
    # its new name was taken for a duplicate: claimed by this replica, run by none.
    class BothNames(OwnerOf):
        def repos(self) -> set[str]:
            return {"acme/bench", "acme/next"}

        def owns(self, repo: str | None) -> bool:
            return repo is not None and repo.lower() in self.repos()

    ran: list[tuple[str, str | None]] = []
    inbox = Inbox(DeliveryStore(db), moved_to("acme/next", ran), ownership=BothNames("replica-a", "acme/bench"),
                  claim_every=0.01)
    await inbox.open()
    await inbox.start()
    assert await inbox.put(delivery(1))
    await wait_for(lambda: ("d1", "acme/next") in ran and inbox.backlog == 0)
    await inbox.stop()
    assert ran == [("d1", "acme/bench"), ("d1", "acme/next")]
    stored = await inbox.store.get("d1")
    assert stored is not None and (stored.repo, stored.status) == ("acme/next", "done")


async def test_with_replicas_the_backlog_limit_counts_what_waits_in_the_store(db: RecordingDatabase) -> None:
    # What this catches: a replica holds in memory only what it claimed (claim_limit), so
    # its backlog never reached the limit however much waited in the store: /readyz and
    # /webhook kept accepting (on PostgreSQL, the only store-side backpressure).
    gate = asyncio.Event()

    async def blocked(_item: Delivery) -> None:
        await gate.wait()

    inbox = Inbox(DeliveryStore(db), blocked, ownership=OwnerOf("replica-a", "acme/bench"),
                  backlog_limit=20, claim_limit=8)
    await inbox.open()
    await inbox.start()
    try:
        for n in range(30):
            assert await inbox.put(delivery(n))
        for _ in range(1000):  # the store is counted at most once a second
            if inbox.storage_risk() is not None:
                break
            await asyncio.sleep(0.01)
        assert inbox.backlog <= 8
        assert inbox.storage_risk() == "the inbox holds 30 unprocessed deliveries (limit 20)" and not inbox.ready
    finally:
        gate.set()
        await inbox.stop(grace=1)


async def test_a_delivery_stored_as_the_inbox_starts_runs_once(tmp_path) -> None:
    # The webhook listener is up while Klaud starts: a put whose commit lands just before
    # `start` reads the pending deliveries is queued there, and its own answer, handled
    # after, queued it again (the handler ran twice). The order is forced, not timed: the
    # event loop is kept busy (as under load) while the store's thread does both.
    stores = await open_stores(f"sqlite:///{tmp_path / 'klaud.db'}")
    gate = Gate(held=set())
    inbox = Inbox(stores.deliveries, gate)
    await inbox.open()
    try:
        d1 = Delivery("d1", "pull_request", b"{}", action="opened", repo="acme/bench", installation=1)
        ack = asyncio.create_task(inbox.put_in_time(d1, 30.0))
        await asyncio.sleep(0)  # its put is queued for the store's writer
        starting = asyncio.create_task(inbox.start())
        await asyncio.sleep(0)  # the commit, then start's read, go to the store's thread
        stores.engine._executor.submit(lambda: None).result(timeout=10)  # type: ignore[attr-defined]
        assert await ack is True
        await starting
        await wait_for(lambda: inbox.backlog == 0)
        assert gate.runs == ["d1"]
    finally:
        await inbox.stop()
        await stores.close()


async def test_a_batch_released_before_its_first_delivery_runs_none(db: RecordingDatabase, monkeypatch) -> None:
    # 853d39d: "a batch went on running the deliveries after its queue was released; it stops
    # at the release". Released while the batch read its bodies: its first delivery ran too.
    gate = Gate(held=set())
    lease = Leases("replica-a", "acme/bench")
    store = DeliveryStore(db)
    inbox = Inbox(store, gate, ownership=lease, claim_every=0.01, batch_size=4)
    await inbox.open()
    for n in (1, 2):
        assert await store.put(delivery(n))  # stored by another replica: bodies read before the batch
    reading, answer = asyncio.Event(), asyncio.Event()
    bodies = store.bodies

    async def slow_bodies(ids):
        reading.set()
        await answer.wait()
        return await bodies(ids)
    monkeypatch.setattr(store, "bodies", slow_bodies)
    await inbox.start()
    await asyncio.wait_for(reading.wait(), 3)
    lease.held = False  # the lease goes while the batch reads its bodies
    inbox.release("acme/bench")
    answer.set()
    await wait_for(lambda: not inbox.busy("acme/bench"))
    await asyncio.sleep(0.1)
    await inbox.stop()
    assert gate.runs == [], "the next owner's to run"


async def test_a_release_during_a_batch_leaves_no_lost_mark_of_a_delivery_that_had_ended(db: RecordingDatabase) -> None:
    # d1 ran and ended (its commit waits with the batch's), d2's handler runs, when the lease
    # goes: `release` marks every delivery of the batch in `_running` as lost, d1 included.
    # Only a delivery's own run (`_run_one`'s finally) clears its mark: d1's never will.
    # Each release under a batch of more than one delivery leaves such ids, for as long as
    # the process runs (rolling deploys, lease moves); and a delivery so marked that runs
    # here again later (its repository taken back) has its GitHub writes refused.
    gate = Gate(held={"d2"})
    lease = Leases("replica-a", "acme/bench")
    inbox = Inbox(DeliveryStore(db), gate, ownership=lease, claim_every=0.01, batch_size=8)
    await inbox.open()
    for n in (1, 2):
        assert await inbox.store.put(delivery(n))
    await inbox.start()
    await wait_for(lambda: gate.runs == ["d1", "d2"] and "d2" in gate.running)
    lease.held = False
    inbox.release("acme/bench")
    gate.open.set()
    await wait_for(lambda: not gate.running and not inbox.busy("acme/bench"))
    await inbox.stop()
    assert not inbox._lost, f"lost marks left behind for good: {sorted(inbox._lost)}"
