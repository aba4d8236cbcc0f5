"""The durable delivery inbox and the worker that drains it.

A delivery is committed (`bot.store.deliveries`) before GitHub gets its 202, because GitHub
does not redeliver on its own; then it is queued here.

The worker processes the deliveries of one repository strictly in arrival order and
different repositories concurrently. A failing delivery stays at the head of its
repository's queue while it waits for its retry, so later events of that repository never
overtake it; after `max_attempts` (or at once, for a permanent error) it is marked
`failed` with the reason and the queue moves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import itertools
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import structlog
from cachetools import LRUCache

from bot.core.errors import (
    RepositoryMoved,
    is_permanent,
    retry_after,
    says_what_happened,
)
from bot.metrics import DELIVERIES, INBOX_BACKLOG, PROCESSING_SECONDS
from bot.store.deliveries import (
    INSTALLATION_QUEUE,
    Delivery,
    DeliveryStore,
    Progress,
    moved_statement,
    repo_queue,
    status_statement,
)
from bot.store.engine import Result
from bot.store.errors import StoreError
from bot.web.events import event_label

log = structlog.get_logger("klaud.inbox")

PROBE_EVERY = 1.0  # seconds between /readyz's questions to the store
PROBE_SECONDS = 2.0  # how long one may wait for its answer

T = TypeVar("T")
Handler = Callable[[Delivery], Awaitable[None]]
# Replaces a repository's state in memory with what the store holds.
Reload = Callable[[str], Awaitable[None]]
# The delivery whose handler runs in this task (the GitHub write guard asks about it).
_RUNNING: contextvars.ContextVar[Delivery | None] = contextvars.ContextVar("klaud_inbox_running", default=None)


async def _no_state(_repo: str) -> None:
    """An inbox with no state kept in memory has nothing to read back."""


class Ownership(Protocol):
    """What this process may work on when replicas share one inbox (`bot.services.replicas`)."""

    owner: str

    def repos(self) -> set[str]:
        """The repositories (lowercase) whose leases this process holds."""
        ...

    def unrouted(self) -> bool:
        """Whether it takes the deliveries without a repository (installation events)."""
        ...

    def owns(self, repo: str | None) -> bool:
        """Whether deliveries of `repo` (None: without a repository) are this process's."""
        ...


MIB = 1024 * 1024
# The pause after a claim that found work (`Inbox._pause_after_claim`): a burst gathers
# meanwhile, so one claim takes many deliveries rather than a few each. It delays processing,
# never an acknowledgement. Measured with bench/ingest.py (5,000 deliveries, medians of 5
# interleaved rounds, 2 cores): a fixed 0.01 s made claims of ~8 deliveries under three
# replicas (pg_stat_statements: 531 claims and 591 commit fences, 2,976 ms of PostgreSQL
# time), which acknowledged ~0.7x as many deliveries a second as one replica; longer fixed
# pauses brought three replicas to 0.85-1.04x but one replica's p99 from 40 to 63 ms (its
# claims grew to the claim limit and their batches held the event loop). Pausing until about
# CLAIM_BATCH deliveries wait: one replica 1,551/s, p99 44 ms, drained 1,535/s; three 0.89x.
CLAIM_GAP_SECONDS = 0.25  # the longest pause
CLAIM_BATCH = 96


def claim_pause(claimed: int, gathered: float) -> float:
    """How long to pause after a claim took `claimed` deliveries that came in `gathered`
    seconds: until CLAIM_BATCH more are likely waiting at that pace, CLAIM_GAP_SECONDS at most."""
    return min(CLAIM_GAP_SECONDS, CLAIM_BATCH * gathered / claimed)


HOLD_LOOP_SECONDS = 0.002  # a batch's longest run on the event loop between two yields
# Acknowledgements first: while deliveries wait for the commit of their 202, no new batch
# starts, for this long at most; then the queues are worked through (beside the intake)
# until the backlog is empty, and only then may the next hold begin. GitHub gives up on a
# delivery unanswered after 10 s and does not send it again; processing has no deadline
# nearly as short (a wave plans every two hours). Measured with bench/ingest.py's load
# (5,000 deliveries from 32 clients, six interleaved rounds): batches started beside a burst
# took the event loop from its acknowledgements, ~2,170 acknowledged/s; held until the burst
# ended, ~2,740/s, with the same end-to-end drain (~2,100/s). 5 s covers such a burst; a
# longer flood is worked through after one hold, so the backlog stays bounded and /readyz
# true. Only in a single process (SQLite): replicas on PostgreSQL acknowledged up to ~12 %
# more a second with it (beyond their target) and three gained no more than one, while its
# effect on one replica's p99 measured from none to +10 ms (~48 against ~36 ms on
# 2026-12-06), a p99 that moves between 24 and 55 ms from run to run on this machine.
HOLD_FOR_ACKS_SECONDS = 5.0
FREE_SPACE_EVERY = 1.0  # seconds between two looks at the store's free disk space


@dataclass(eq=False)
class Ended:
    """A delivery whose handler returned or raised, and the commit of what it changed."""

    delivery: Delivery
    error: Exception | None
    seconds: float
    status: str  # "done", "failed", "queued" (to retry) or "moved" (handed on to a new name)
    commit: asyncio.Future[list[Result]] = field(init=False)
    error_text: str | None = None
    repos: set[str] = field(default_factory=set)  # the repositories its handler wrote


class Inbox:
    def __init__(
        self,
        store: DeliveryStore,
        handler: Handler,
        *,
        max_attempts: int = 8,
        base_delay: float = 2.0,
        max_delay: float = 600.0,
        concurrency: int = 8,
        batch_size: int = 32,
        backlog_limit: int = 100_000,
        min_free_bytes: int = 256 * MIB,
        body_budget: int = 64 * MIB,
        ownership: Ownership | None = None,
        claim_every: float = 0.25,
        claim_limit: int = 256,
        handler_timeout: float = 600.0,
        reload: Reload = _no_state,
        stale: set[str] | None = None,
    ) -> None:
        self.store = store
        self.handler = handler
        self.reload = reload
        # Repositories (lowercase) whose memory is ahead of the store (a commit it refused, a
        # failed or cancelled section): read back before their queue's next batch. Shared
        # with the live state, which notes its own and reads them back at the next tick.
        self.stale: set[str] = set() if stale is None else stale
        self.max_attempts = max_attempts
        self.base_delay = base_delay
        self.max_delay = max_delay
        self.concurrency = concurrency
        self.batch_size = batch_size
        self.backlog_limit = backlog_limit
        self.min_free_bytes = min_free_bytes
        # Bodies of queued deliveries kept in memory; the rest wait in the store only.
        self.body_budget = body_budget
        self._held: dict[str, int] = {}  # delivery id -> bytes of its body held in memory
        self._held_bytes = 0
        # With replicas a delivery is stored by whichever replica GitHub reached and
        # claimed from the store by the owner of its repository.
        self.ownership = ownership
        # Told the repository of a delivery failed after every retry of a transient error
        # (GitHub down longer than they last): what it would have changed is still due.
        self.gave_up: Callable[[str], None] | None = None
        # Bodies this replica stored for repositories it owns, until its claim takes them
        # (a claim reads deliveries without their bodies): the claim comes within moments,
        # so a quarter of the budget is plenty; the oldest go first past it.
        self._own_bodies: LRUCache[str, bytes] = LRUCache(maxsize=max(1, body_budget // 4), getsizeof=len)
        self.claim_every = claim_every
        self.claim_limit = claim_limit
        self._claim_soon = asyncio.Event()
        self._half_free = asyncio.Event()  # set while half the claim limit or more is free
        self._half_free.set()
        self._claimer: asyncio.Task[None] | None = None
        self._queued: set[str] = set()  # ids of the deliveries in the queues
        self._released: set[str] = set()  # ordering keys whose queues are dropped once idle
        # Ids of deliveries whose handler ran on when their lease went: nothing more of them
        # is written to GitHub, even if the repository comes back here meanwhile.
        self._lost: set[str] = set()
        # How many queues were dropped (`_drop_released`): a claim during which one was may
        # have passed over its deliveries as kept here (they were when it read the store).
        self._drops = 0
        self._free: tuple[float, int | None] = (-1.0, None)  # (when measured, bytes)
        self._unanswered: set[asyncio.Future[bool]] = set()  # puts past their answer's time
        # Deliveries whose last commit raised, by id, until the store says what became of them.
        self._in_doubt: dict[str, Ended] = {}
        # Why the store's last answer (a put, or /readyz's probe) was an error; None once it answers.
        self.store_error: str | None = None
        self._probed_at = -PROBE_EVERY
        self.handler_timeout = handler_timeout
        self._queues: dict[str, deque[Delivery]] = {}
        self._due: dict[str, float] = {}
        self._active: dict[str, asyncio.Task[None]] = {}
        self._running: dict[str, Delivery] = {}
        self._wake = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()  # set by stop(): ends the loops and the claim loop's pause
        self._backlog = 0
        # Replicas: what waits in the store for every replica (this one holds at most
        # `claim_limit` of it in memory), counted at most every FREE_SPACE_EVERY.
        self._stored_backlog: tuple[float, int] = (0.0, 0)
        self._acks_waiting = 0  # deliveries whose 202 waits for their commit (`put_in_time`)
        self._held_since: float | None = None  # when the current hold for them began
        self._idle = asyncio.Event()
        self._idle.set()

    # -- storing -----------------------------------------------------------------------

    async def open(self) -> None:
        await self.store.open()

    async def put(self, delivery: Delivery) -> bool:
        """Commit `delivery` and queue it; False when its id is already stored (a redelivery)."""
        stored = await self.store.put(delivery)
        self._queue_stored(delivery, stored)
        return stored

    def _queue_stored(self, delivery: Delivery, stored: bool) -> None:
        if not stored:
            return
        if self.ownership is None:
            # Committed just before `start` read the pending deliveries, it was queued there
            # (its answer came back after): queued again, it would run twice.
            if delivery.id not in self._queued:
                self._enqueue(delivery)
        elif self.ownership.owns(delivery.repo):
            if delivery.body is not None and len(delivery.body) <= self._own_bodies.maxsize:
                self._own_bodies[delivery.id] = delivery.body
            self._claim_soon.set()  # claimed at once; another owner finds it on its next round

    async def put_in_time(self, delivery: Delivery, seconds: float) -> bool | None:
        """`put`, or None when the store has not answered within `seconds`: the write goes
        on (a delivery it keeps is processed; GitHub's redelivery is then a duplicate), and
        until it ends the store is at risk, so no other request waits on it."""
        # The commit's future, not a task: this runs for every delivery.
        written = self.store.put_soon(delivery)
        self._acks_waiting += 1
        try:
            async with asyncio.timeout(seconds):
                stored = await asyncio.shield(written)
        except TimeoutError:
            self._unanswered.add(written)
            written.add_done_callback(functools.partial(self._answered_late, delivery))
            return None
        except Exception as exc:
            self.store_error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._acks_waiting -= 1
            if not self._acks_waiting:
                self._wake.set()  # a hold for acknowledgements ends (`_hold_for_acks`)
        self.store_error = None
        self._queue_stored(delivery, stored)
        return stored

    async def probe_store(self) -> None:
        """Ask the store whether it answers (at most once a second; for `/readyz`): a
        replica whose database is down or out of reach is taken out of service, and put
        back once it answers again, whether or not a delivery came meanwhile."""
        now = time.monotonic()
        if now - self._probed_at < PROBE_EVERY:
            return
        self._probed_at = now
        try:
            async with asyncio.timeout(PROBE_SECONDS):
                await self.store.db.fetch("SELECT 1")
        # Whatever it raised, the store does not answer: that is all /readyz says.
        except Exception as exc:  # noqa: BLE001
            self.store_error = f"{type(exc).__name__}: {exc}"
        else:
            self.store_error = None

    def _answered_late(self, delivery: Delivery, written: asyncio.Future[bool]) -> None:
        self._unanswered.discard(written)
        if written.cancelled():
            return
        if (exc := written.exception()) is not None:
            log.error("delivery.store_failed", delivery_id=delivery.id, late=True, error=f"{type(exc).__name__}: {exc}")
            return
        log.warning("delivery.stored_late", delivery_id=delivery.id, stored=written.result())
        self._queue_stored(delivery, written.result())

    async def get(self, delivery_id: str) -> Delivery | None:
        return self._running.get(delivery_id) or await self.store.get(delivery_id)

    async def prune(self, *, done_before: float, failed_before: float) -> int:
        return await self.store.prune(done_before=done_before, failed_before=failed_before)

    @property
    def backlog(self) -> int:
        return self._backlog

    @property
    def ready(self) -> bool:
        """Open and not at risk: a backlog being worked through is no reason to take a
        replica out of service, only a store that may not hold the next delivery."""
        return self.store.is_open and self.store_error is None and self.storage_risk() is None

    def storage_risk(self) -> str | None:
        """Why the store should take no more deliveries now, or None."""
        if self._unanswered:
            return f"the store has not answered the writes of {len(self._unanswered)} deliveries in time"
        backlog = max(self._backlog, self._stored_backlog[1])
        if backlog >= self.backlog_limit:
            return f"the inbox holds {backlog} unprocessed deliveries (limit {self.backlog_limit})"
        free = self._free_bytes()
        if free is not None and free < self.min_free_bytes:
            return f"{free // MIB} MiB free where the store writes (needs {self.min_free_bytes // MIB} MiB)"
        return None

    def _free_bytes(self) -> int | None:
        measured_at, free = self._free
        now = time.monotonic()
        if now - measured_at >= FREE_SPACE_EVERY:
            free = self.store.db.free_bytes()
            self._free = (now, free)
        return free

    # -- draining ----------------------------------------------------------------------

    async def start(self) -> int:
        """Queue every delivery acknowledged but not finished, then start draining.

        With replicas, deliveries are claimed from the store instead, as leases allow.
        """
        self._stopping.clear()
        recovered = [] if self.ownership is not None else await self.store.pending()
        # The webhook listener is up while the state loads: what it stored meanwhile is
        # queued already, and queued again it would run twice.
        recovered = [delivery for delivery in recovered if delivery.id not in self._queued]
        for delivery in recovered:
            delivery.status = "queued"
            self._enqueue(delivery)
        self._runner = asyncio.create_task(self._run(), name="klaud-inbox")
        if self.ownership is not None:
            self._claimer = asyncio.create_task(self._claim_loop(self.ownership), name="klaud-inbox-claims")
        if recovered:
            log.info("inbox.recovered", deliveries=len(recovered))
        return len(recovered)

    def busy(self, repo: str) -> bool:
        """Whether deliveries of `repo` wait or run here."""
        return self._busy_queue(repo_queue(repo))

    def _busy_queue(self, key: str) -> bool:
        return bool(self._queues.get(key)) or key in self._active

    def release(self, repo: str | None) -> None:
        """Stop working on `repo` (its lease is gone), or with None on the deliveries without
        a repository (the installations lease is): what waits here is dropped; the claims
        pass to the next owner, who takes over deliveries claimed by anyone else."""
        # The mark drops the queue once its running batch ends (`_launch_ready`). Nothing of
        # an idle repository is here to drop: a mark for it would stay for good, since only
        # that drop or a later claim of the repository clears it, and most releases are of
        # idle repositories (`Replicas._give_up` lets go of no other).
        if repo is None:
            keys = [key for key in self._queues if key.startswith(INSTALLATION_QUEUE)]
        else:
            keys = [repo_queue(repo)]
        for key in keys:
            if self._busy_queue(key):
                self._released.add(key)
                self._lost.update(d.id for d in self._running.values() if d.ordering_key == key)
                self._wake.set()

    def running_lost(self) -> bool:
        """Whether the handler running in this task is of a delivery whose lease went since it began."""
        delivery = _RUNNING.get()
        return delivery is not None and delivery.id in self._lost

    async def _claim_loop(self, ownership: Ownership) -> None:
        loop = asyncio.get_running_loop()
        previous = loop.time() - CLAIM_GAP_SECONDS  # the first claim: as if after the longest pause
        while not self._stopping.is_set():
            self._claim_soon.clear()
            started = loop.time()
            claimed, filled = 0, False
            try:
                claimed, filled = await self._claim(ownership)
                await self._count_stored_backlog()
            # The store is unavailable: logged, and the next round tries again.
            except Exception:
                log.exception("inbox.claim_failed")
            gathered, previous = started - previous, started
            if claimed:  # more may be waiting
                await self._pause_after_claim(filled, claim_pause(claimed, gathered))
                continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._claim_soon.wait(), self.claim_every)

    async def _count_stored_backlog(self) -> None:
        """With replicas the backlog limit is the store's: in memory each holds only what it
        claimed, so the limit never took effect however much waited."""
        counted_at, _ = self._stored_backlog
        now = time.monotonic()
        if now - counted_at >= FREE_SPACE_EVERY:
            self._stored_backlog = (now, await self.store.unfinished())

    async def _pause_after_claim(self, filled: bool, seconds: float) -> None:
        """A moment in which a burst gathers, so the next claim takes many deliveries rather
        than a few each. After a claim that took all the room it had, more surely waits: the
        pause ends once half the room is free, so the handlers never run out of work."""
        ends = [self._stopping, self._half_free] if filled else [self._stopping]
        waits = [asyncio.ensure_future(end.wait()) for end in ends]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _claim(self, ownership: Ownership) -> tuple[int, bool]:
        """Claim what this replica owns, as much as there is room for: how many deliveries
        were new here, and whether the claim took all the room."""
        room = self.claim_limit - self._backlog
        if room <= 0:  # enough work in memory; the rest waits in the store
            return 0, False
        drops = self._drops
        claimed = await self.store.claim_owned(
            ownership.owner, ownership.repos(), unrouted=ownership.unrouted(), limit=room, kept=list(self._queued)
        )
        # Owned still (the lease clock may have lapsed while the claim ran). What is not kept
        # stays claimed here but not in memory, and the next claim takes it again, in order:
        # all of this claim, when a queue was dropped while it ran (it passed over that
        # queue's deliveries as kept here, and took later ones).
        fresh: list[Delivery] = []
        if self._drops == drops:
            owned = ownership.repos()
            unrouted = ownership.unrouted()  # the lead may have gone while the claim ran
            fresh = [d for d in claimed
                     if d.id not in self._queued and (unrouted if d.repo is None else d.repo.lower() in owned)]
        taken = 0
        for delivery in fresh:
            key = delivery.ordering_key
            if key in self._released:
                # Its queue from before the lease went is still here (a batch of it runs):
                # what waits there may have been run by another owner since. The queue is
                # dropped first; the next claim takes this one again, in order.
                if self._busy_queue(key):
                    continue
                self._released.discard(key)
            delivery.body = self._own_bodies.pop(delivery.id, None)
            self._enqueue(delivery)
            taken += 1
        return taken, len(claimed) >= room

    def _drop_released(self, key: str) -> None:
        self._released.discard(key)
        for delivery in self._queues.pop(key, deque()):
            self._queued.discard(delivery.id)
            self._in_doubt.pop(delivery.id, None)
            self._held_bytes -= self._held.pop(delivery.id, 0)
            self._set_backlog(self._backlog - 1)
        self._due.pop(key, None)
        # This replica may own the repository again by now (taken back while a batch of it
        # ran): no longer kept here, what was dropped is claimed again by its owner, fresh.
        self._drops += 1

    def _enqueue(self, delivery: Delivery) -> None:
        size = len(delivery.body or b"")
        if delivery.body is not None and self._held_bytes + size <= self.body_budget:
            self._held[delivery.id] = size
            self._held_bytes += size
        else:
            delivery.body = None  # read from the store when its turn comes
        self._queues.setdefault(delivery.ordering_key, deque()).append(delivery)
        self._queued.add(delivery.id)
        self._set_backlog(self._backlog + 1)
        self._wake.set()

    def _set_backlog(self, value: int) -> None:
        self._backlog = value
        INBOX_BACKLOG.set(value)
        if value <= self.claim_limit // 2:
            self._half_free.set()
        else:
            self._half_free.clear()
        if value == 0:
            self._idle.set()
            self._held_since = None  # the backlog is worked through: the next may be held
        else:
            self._idle.clear()

    async def drained(self) -> None:
        """Wait until every queued delivery is done or failed (tests and benchmarks)."""
        await self._idle.wait()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping.is_set():
            self._wake.clear()
            hold = self._hold_for_acks(loop.time())
            if hold is not None:
                timeout: float | None = hold
            else:
                next_due = self._launch_ready(loop.time())
                timeout = None if next_due is None else max(0.0, next_due - loop.time())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass

    def _hold_for_acks(self, now: float) -> float | None:
        """Seconds left to hold new batches back while deliveries wait for their 202
        (HOLD_FOR_ACKS_SECONDS), or None to start them: a replica (never held), nothing
        waits (no acknowledgement, or no backlog), or the hold has lasted its time. One hold
        per backlog: once spent, the queues are worked through until the backlog is empty
        (`_set_backlog` ends it), so a flood never holds before every batch."""
        if self.ownership is not None or not self._acks_waiting or not self._backlog:
            return None
        if self._held_since is None:
            self._held_since = now
        left = self._held_since + HOLD_FOR_ACKS_SECONDS - now
        return left if left > 0 else None

    def _launch_ready(self, now: float) -> float | None:
        """Start a batch for every idle, due repository queue; return the next due time."""
        next_due: float | None = None
        for key in list(self._queues):
            if key in self._released and key not in self._active:
                self._drop_released(key)
                continue
            queue = self._queues[key]
            if not queue:
                del self._queues[key]
                self._due.pop(key, None)
                continue
            if key in self._active:
                continue
            due = self._due.get(key, 0.0)
            if due > now:
                next_due = due if next_due is None else min(next_due, due)
                continue
            if len(self._active) >= self.concurrency:
                break
            self._active[key] = asyncio.create_task(self._process(key, queue))
        return next_due

    async def _process(self, key: str, queue: deque[Delivery]) -> None:
        """Run up to `batch_size` deliveries of one repository, then commit them together.

        Each delivery's changes and its new status form one group of the store's writer;
        the next delivery's handler runs without waiting for the fsync, and the batch waits
        once, at its end, for all of them.
        """
        ends: list[Ended] = []
        try:
            batch = list(itertools.islice(queue, self.batch_size))
            if (not await self._settle_in_doubt(key, batch) or not await self._reload_stale(key, batch[0])
                    or not await self._read_bodies(key, batch)):
                return
            loop = asyncio.get_running_loop()
            held_since = loop.time()
            for delivery in batch:
                if key in self._released:
                    break  # its lease went meanwhile: the rest are the next owner's to run
                ended = await self._run_one(delivery, ends[-1].commit if ends else None)
                ends.append(ended)
                if ended.status == "queued":  # waits for its retry at the head of the queue
                    break
                # Handlers that never wait keep the loop for the whole batch: past a couple
                # of milliseconds, the webhook's requests get their turn before the next one.
                if loop.time() - held_since > HOLD_LOOP_SECONDS:
                    await asyncio.sleep(0)
                    held_since = loop.time()
            await self._settle(key, ends)
        finally:
            self._active.pop(key, None)
            for ended in ends:
                self._running.pop(ended.delivery.id, None)
                # A release while the batch ran marks its ended deliveries too: not running now.
                self._lost.discard(ended.delivery.id)
            self._wake.set()

    async def _reload_stale(self, key: str, head: Delivery) -> bool:
        """Read back from the store the repositories whose last commit it refused, or whose
        memory a failed section left ahead of it."""
        stale = {repo for repo in self.stale if repo_queue(repo) == key}
        if not stale:
            return True
        try:
            for repo in sorted(stale):
                await self.reload(repo)
        # The store still cannot be read (or a bug, logged with its traceback): the queue
        # waits and tries again, like after a failed commit.
        except Exception as exc:  # noqa: BLE001
            self._wait_for_store(key, head, exc)
            return False
        return True

    async def _read_or_wait(self, key: str, head: Delivery, read: Awaitable[T]) -> T | None:
        """What a read before a batch answers; None when the store could not be read: the
        queue then waits and tries again, like after a failed commit."""
        try:
            return await read
        except Exception as exc:  # noqa: BLE001
            self._wait_for_store(key, head, exc)
            return None

    async def _read_bodies(self, key: str, batch: list[Delivery]) -> bool:
        """Read the bodies the queue did not keep in memory, in one query before the batch
        (a read per delivery would wait behind the commit of the one before)."""
        missing = [delivery.id for delivery in batch if delivery.body is None]
        if not missing:
            return True
        bodies = await self._read_or_wait(key, batch[0], self.store.bodies(missing))
        if bodies is None:
            return False
        for delivery in batch:
            if delivery.body is None:
                # Absent only if deleted behind Klaud's back: an empty body fails its parse.
                delivery.body = bodies.get(delivery.id, b"")
        return True

    async def _run_one(self, delivery: Delivery, after: asyncio.Future[list[Result]] | None) -> Ended:
        self._running[delivery.id] = delivery
        structlog.contextvars.bind_contextvars(
            delivery_id=delivery.id,
            github_event=delivery.event,
            action=delivery.action,
            repository=delivery.repo,
            installation=delivery.installation,
        )
        # `processing` lives in memory only: after a crash an unfinished delivery is still
        # `queued` in the store and runs again, which is all the state must say.
        delivery.attempts += 1
        delivery.status = "processing"
        writer = self.store.writer
        # With replicas what the delivery changed commits only while the claim is still this
        # replica's: after a stall past its lease, the next owner's processing is the one.
        fence = None if self.ownership is None else self.store.claim_fence(delivery.id, self.ownership.owner)
        # Committed after the delivery before it in the batch, or not at all: a store that
        # fails one commit and takes the next must not reorder the repository's deliveries.
        unit = writer.begin_unit(fence, after)
        started = time.perf_counter()
        error: Exception | None = None
        running = _RUNNING.set(delivery)
        try:
            # In this task (not wait_for's): the unit collects the handler's changes.
            async with asyncio.timeout(self.handler_timeout):
                await self.handler(delivery)
        except asyncio.CancelledError:
            writer.end_unit(unit, ())
            raise
        # The worker is the boundary every handler error reaches: it is logged with its
        # traceback and recorded on the delivery, then retried or marked failed.
        except Exception as exc:  # noqa: BLE001
            error = exc
        finally:
            _RUNNING.reset(running)
            self._lost.discard(delivery.id)
            structlog.contextvars.clear_contextvars()
        ended = Ended(delivery, error, time.perf_counter() - started, self._status_after(delivery, error))
        message = f"{type(error).__name__}: {error}"[:2000] if error is not None else None
        if isinstance(error, RepositoryMoved) and ended.status == "moved":
            status = moved_statement(delivery.id, error.to, delivery.attempts, message or "")
        else:
            status = status_statement(delivery.id, ended.status, delivery.attempts, message)
        ended.repos = set(unit.touched)
        ended.commit = writer.end_unit(unit, [status])
        ended.error_text = message
        return ended

    def _status_after(self, delivery: Delivery, error: Exception | None) -> str:
        if error is None:
            return "done"
        # Handed on at most `max_attempts` times: a name that keeps moving is a bug, not work.
        if isinstance(error, RepositoryMoved) and delivery.attempts < self.max_attempts:
            return "moved"
        if is_permanent(error):
            return "failed"
        # A rate limit ends at its reset (within the hour): waiting for it uses no attempt.
        if delivery.attempts >= self.max_attempts and retry_after(error) is None:
            return "failed"
        return "queued"

    async def _settle(self, key: str, ends: list[Ended]) -> None:
        """Wait for the batch's commits; account for each delivery in order."""
        results = await asyncio.gather(*(ended.commit for ended in ends), return_exceptions=True)
        refused = [ended.delivery.id for ended, result in zip(ends, results, strict=True)
                   if isinstance(result, BaseException)]
        progress = await self._stored_progress(refused) if refused else {}
        for index, (ended, result) in enumerate(zip(ends, results, strict=True)):
            if not isinstance(result, BaseException):
                self._ended(key, ended)
            elif not self._accounted_in_store(key, ended, progress.get(ended.delivery.id)):
                # The store refused the commit (or could not say): this delivery and the
                # batch's later ones stay at the head of the queue, asked about again before
                # they run again (handlers are idempotent, but a second commit is a second
                # processing).
                self._store_failed(key, ends[index:], result)
                return

    async def _stored_progress(self, delivery_ids: list[str]) -> dict[str, Progress]:
        """What the store holds of deliveries whose commit raised: the answer of a commit
        that landed can be lost (the connection dropped between COMMIT and its reply)."""
        try:
            return await self.store.progress(delivery_ids)
        # Unreadable as well: they are asked about again before they run again.
        except Exception as exc:  # noqa: BLE001
            log.warning("delivery.progress_unread", deliveries=delivery_ids, error=f"{type(exc).__name__}: {exc}")
            return {}

    def _accounted_in_store(self, key: str, ended: Ended, stored: Progress | None) -> bool:
        """Account for a delivery whose commit raised by what the store shows: its commit
        landed after all, or another replica holds it. False when it has to run again."""
        if self._committed_after_all(ended, stored):
            self._ended(key, ended)
            return True
        if stored is not None and self._claimed_elsewhere(stored):
            self._taken_elsewhere(key, ended, stored)
            return True
        return False

    async def _settle_in_doubt(self, key: str, batch: list[Delivery]) -> bool:
        """Before deliveries whose last commit raised run again, ask the store what became of
        them: those whose commit landed after all are accounted for, not run twice. False
        when this pass ends here: the store could not say, or some turned out finished (the
        queue's next pass starts after them). A delivery's commit comes after the one before
        it or not at all, so from the first that did not land on, none did: they run again."""
        doubtful = [delivery.id for delivery in batch if delivery.id in self._in_doubt]
        if not doubtful:
            return True
        progress = await self._read_or_wait(key, batch[0], self.store.progress(doubtful))
        if progress is None:
            return False
        settled = False
        for delivery in batch:
            ended = self._in_doubt.pop(delivery.id, None)
            if ended is None or not self._accounted_in_store(key, ended, progress.get(delivery.id)):
                break
            settled = True
        for delivery in batch:
            self._in_doubt.pop(delivery.id, None)
        return not settled

    def _committed_after_all(self, ended: Ended, stored: Progress | None) -> bool:
        # A delivery's attempts are written with its status, in the transaction of its
        # changes: the store counting this run means the whole transaction landed.
        return stored is not None and stored.attempts == ended.delivery.attempts and not self._claimed_elsewhere(stored)

    def _claimed_elsewhere(self, stored: Progress) -> bool:
        return self.ownership is not None and stored.claimed_by not in (None, self.ownership.owner)

    def _taken_elsewhere(self, key: str, ended: Ended, stored: Progress) -> None:
        """Another replica holds (or finished) the delivery: its claim fence refused this
        run's commit. It is that replica's to account for; here it leaves the queue, and
        the repository is read back (memory holds this run's changes, the store the other's)."""
        delivery = ended.delivery
        self.stale.update(ended.repos)
        if delivery.repo:
            self.stale.add(delivery.repo.lower())  # the set holds lowercase names
        log.warning("delivery.taken_elsewhere", delivery_id=delivery.id, repository=delivery.repo,
                    by=stored.claimed_by, status=stored.status)
        self._finish(key)

    def _store_failed(self, key: str, unsaved: list[Ended], exc: BaseException) -> None:
        for ended in unsaved:
            ended.delivery.status = "queued"
            self._in_doubt[ended.delivery.id] = ended
            # Memory holds what the store refused: the handlers would find nothing left to
            # write when they run again, so those repositories are read back first.
            self.stale.update(ended.repos)
        self._wait_for_store(key, unsaved[0].delivery, exc, [ended.delivery.id for ended in unsaved])

    def _wait_for_store(self, key: str, head: Delivery, exc: BaseException, ids: list[str] | None = None) -> None:
        delay = self.retry_delay(max(1, head.attempts))
        self._due[key] = asyncio.get_running_loop().time() + delay
        log.error(
            "delivery.store_failed",
            deliveries=ids or [head.id],
            retry_in_s=round(delay, 3),
            error=f"{type(exc).__name__}: {exc}",
            # The store's trouble (a lease another replica took, included) is one line;
            # anything else is a bug, shown whole.
            exc_info=exc if is_permanent(exc) and not isinstance(exc, StoreError) else None,
        )

    def _ended(self, key: str, ended: Ended) -> None:
        delivery, label = ended.delivery, event_label(ended.delivery.event)
        delivery.status, delivery.error = ended.status, ended.error_text
        context = {"delivery_id": delivery.id, "github_event": delivery.event, "repository": delivery.repo,
                   "action": delivery.action, "attempts": delivery.attempts}
        if ended.error is None:
            PROCESSING_SECONDS.labels(label).observe(ended.seconds)
            DELIVERIES.labels(label, "done").inc()
            log.info("delivery.processed", **context)
            self._finish(key)
        elif isinstance(ended.error, RepositoryMoved) and ended.status == "moved":
            self._moved(key, delivery, ended.error.to, label, context)
        elif ended.status == "failed":
            DELIVERIES.labels(label, "failed").inc()
            permanent = is_permanent(ended.error)
            log.warning("delivery.failed", error=delivery.error, permanent=permanent,
                        exc_info=None if permanent else ended.error, **context)
            if not permanent and delivery.repo is not None and self.gave_up is not None:
                self.gave_up(delivery.repo)
            self._finish(key)
        else:
            delay = max(self.retry_delay(delivery.attempts), retry_after(ended.error) or 0.0)
            self._due[key] = asyncio.get_running_loop().time() + delay
            DELIVERIES.labels(label, "retry").inc()
            # A GitHub outage or a lapsed lease retries every delivery it meets: one line each,
            # not a traceback; an error from elsewhere (a bug's, a library's) is shown whole.
            log.warning("delivery.retry", retry_in_s=round(delay, 3), error=delivery.error,
                        exc_info=None if says_what_happened(ended.error) else ended.error, **context)

    def _moved(self, key: str, delivery: Delivery, to: str, label: str, context: Mapping[str, object]) -> None:
        DELIVERIES.labels(label, "moved").inc()
        log.info("delivery.moved", to=to, **context)
        delivery.repo, delivery.status = to, "queued"
        # With replicas the owner of the new name claims it from the store.
        if self.ownership is not None:
            self._finish(key)
            return
        # Alone, this process owns every name: the delivery moves to the new name's queue
        # and stays in the backlog (and its body in memory).
        self._queues[key].popleft()
        self._due.pop(key, None)
        self._queues.setdefault(delivery.ordering_key, deque()).append(delivery)
        self._wake.set()

    def retry_delay(self, attempts: int) -> float:
        """Exponential backoff with full jitter in its upper half."""
        # The exponent is bounded: a store refusing commits for days counts a delivery's
        # runs on (its status cannot be written) and must not overflow the doubling.
        ceiling = min(self.max_delay, self.base_delay * 2 ** min(max(attempts - 1, 0), 32))
        return random.uniform(ceiling / 2, ceiling)

    def _finish(self, key: str) -> None:
        queue = self._queues.get(key)
        if queue:
            finished = queue.popleft()
            self._queued.discard(finished.id)
            self._held_bytes -= self._held.pop(finished.id, 0)
        self._due.pop(key, None)
        self._set_backlog(self._backlog - 1)

    async def stop(self, grace: float = 10.0) -> None:
        """Stop taking work, let running handlers finish within `grace` seconds.

        Handlers still running after that are cancelled; their deliveries stay
        `queued` in the store and run again at the next start.
        """
        self._stopping.set()
        self._wake.set()
        self._claim_soon.set()
        if self._claimer is not None:
            await self._claimer
        if self._runner is not None:
            await self._runner
        running = list(self._active.values())
        if running:
            _, pending = await asyncio.wait(running, timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)
                log.warning("inbox.stop.cancelled", deliveries=len(pending))
        await self.store.flushed()
