"""Timers: scheduled waves, light reconciles and artifact retries, all read off the Clock.

Each repository's next wave time is persisted with the repository, so a restart neither
skips a wave that fell due while the process was down (it runs once, at start-up) nor
runs one twice (the time moves on only when a wave has been stored). Waves fire on the
UTC boundaries of `wave_every_minutes` plus up to 60 s of jitter, so many installations
do not hit GitHub in the same second.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog

from bot.core.clock import Clock, retry_due
from bot.core.cooldown import ATTEMPT_MEMORY
from bot.core.domain import parse_time, stamp
from bot.github.errors import GitHubError
from bot.services.live import LiveState
from bot.services.missed_comments import GRACE as COMMENT_GRACE
from bot.services.outcomes import OutcomeRecorder
from bot.services.reconcile import Reconciler, retry_delay
from bot.services.repo_state import RepoState
from bot.services.waves import RETRY_TRIGGER, WaveRunner
from bot.store.errors import LeaseTaken, StoreError

log = structlog.get_logger("klaud.scheduler")

LIGHT_RECONCILE_EVERY = timedelta(hours=6)
MAX_JITTER_SECONDS = 60.0
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def next_boundary(now: datetime, every_minutes: int, jitter_seconds: float) -> datetime:
    """The next UTC multiple of `every_minutes` strictly after `now`, plus jitter."""
    interval = timedelta(minutes=every_minutes)
    elapsed = now - EPOCH
    boundary = EPOCH + (elapsed // interval + 1) * interval
    return boundary + timedelta(seconds=jitter_seconds)


def on_cadence(slot: datetime, every_minutes: int) -> bool:
    """Whether `slot` is one `next_boundary` gives for this cadence: a boundary plus jitter."""
    return (slot - EPOCH) % timedelta(minutes=every_minutes) <= timedelta(seconds=MAX_JITTER_SECONDS)


class Scheduler:
    def __init__(
        self,
        live: LiveState,
        waves: WaveRunner,
        reconciler: Reconciler,
        outcomes: OutcomeRecorder,
        clock: Clock,
        *,
        prune: Callable[[], Awaitable[Any]] | None = None,
        leads: Callable[[], bool] = lambda: True,
        owns: Callable[[str], bool] = lambda repo: True,
        given_up: Callable[[float], Awaitable[dict[str, float]]] | None = None,
        poll_seconds: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        self.live = live
        self.reconciler = reconciler
        self.claims = reconciler.claims
        self.outcomes = outcomes
        self.prune = prune
        self.leads = leads  # with replicas, one does the housekeeping
        # With replicas, whether this one holds a repository now: after a stall past its
        # lease the timer may fire before the lease round lets the repository go.
        self.owns = owns
        # Discovery is done at start-up; retention is not: were it first due 6 h after a
        # start, a process restarted more often (deploys, a rolling replica set) never pruned.
        self._discovered_at = clock.now()
        self._pruned_at: datetime | None = None
        self._trimmed_at = clock.now()
        self.waves = waves
        self.clock = clock
        self.poll_seconds = poll_seconds
        self.rng = rng or random.Random()
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        # (repository, kind of work) -> failures in a row and when to try again: a 404 for
        # a repository the App lost, or a refused read, must not be asked every second.
        self._failing: dict[tuple[str, str], tuple[int, datetime]] = {}
        # Repository (lowercase) -> when its light reconcile is due ahead of its cadence (`catch_up`).
        self._catch_up: dict[str, datetime] = {}
        # Where the deliveries given up on are stored (`DeliveryStore.given_up_within`), and
        # the repositories (lowercase) looked up there since this process took them up.
        self.given_up = given_up
        self._looked_up: set[str] = set()

    def catch_up(self, repo: str) -> None:
        """A delivery of `repo` failed after every retry (GitHub down longer than they last,
        about 4 minutes): what it would have changed (a PR opened, a command written) is
        caught up by a light reconcile once GitHub answers, not at the 6-hourly one. Due
        once the comment sweep's grace has passed (a command younger than that is left to
        its own delivery), and backed off from while GitHub still fails."""
        # The later of two: a second delivery given up meanwhile carries a younger comment.
        self._catch_up[repo.lower()] = self.clock.now() + COMMENT_GRACE

    async def _catch_up_stored(self) -> None:
        """The catch-ups of repositories this process took up since the last tick (at its
        start, or from a replica that stopped): the process that gave up on their deliveries
        kept them in memory only, so they are read again from the failed deliveries."""
        self._looked_up &= self.live.repos.keys()
        taken_up = self.live.repos.keys() - self._looked_up
        if not taken_up or self.given_up is None:
            return
        now = self.clock.now()
        try:
            ages = await self.given_up(LIGHT_RECONCILE_EVERY.total_seconds())
        except StoreError as exc:
            log.warning("scheduler.given_up_unread", error=str(exc))  # read again next tick
            return
        self._looked_up |= taken_up
        for name in taken_up & ages.keys():
            given_up_at = now - timedelta(seconds=ages[name])
            due = given_up_at + COMMENT_GRACE
            meta = self.live.repos[name].meta
            reconciled, swept = parse_time(meta.reconciled_at), parse_time(meta.comments_swept_at)
            if reconciled is not None and reconciled >= due:
                if swept is not None and swept >= given_up_at:
                    continue  # a light reconcile after the grace caught it up
                # That reconcile left comments (GitHub still refused a reply): the sweep's
                # mark stayed before them, and the catch-up was due again a grace later.
                due = reconciled + COMMENT_GRACE
            self._catch_up[name] = max(due, self._catch_up.get(name, due))

    def start(self) -> None:
        self._stopping.clear()
        self._task = asyncio.create_task(self._loop(), name="klaud-scheduler")

    async def stop(self, grace: float = 10.0) -> None:
        """Stop ticking; a tick in progress gets `grace` seconds to end, then is cancelled.

        A tick waiting on a slow GitHub (30 s per request, and retries) held the process
        past any container's stop grace, which then killed it mid-write. What a cancelled
        tick had not stored, the next start does again: waves and reconciles are repeatable.
        """
        self._stopping.set()
        if self._task is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), grace)
        except TimeoutError:
            log.warning("scheduler.tick_cancelled", grace_s=grace)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                await self.tick()
            # A timer that dies silently loses every later wave: whatever went wrong is
            # logged with its traceback and the next tick tries again.
            except Exception:
                log.exception("scheduler.tick_failed")
            try:
                await asyncio.wait_for(self._stopping.wait(), self.poll_seconds)
            except TimeoutError:
                pass

    async def tick(self) -> list[str]:
        """Run whatever is due now; returns the repositories that got a wave."""
        waved = []
        await self.live.reload_stale()
        for key in [key for key in self._failing if key[0] not in self.live.repos]:
            del self._failing[key]  # a repository given up or removed: nothing left to back off from
        for name in self._catch_up.keys() - self.live.repos.keys():
            del self._catch_up[name]
        await self._catch_up_stored()
        for name, state in list(self.live.repos.items()):
            if not self.owns(name):
                continue
            # Claims and runs whose time came are settled first, so the wave sees what is
            # free; when that fails the wave still runs (their families stay in flight).
            await self._guarded(name, "claims", self._check_claims, state)
            # A light reconcile due with the wave goes first: the wave then plans on what
            # it caught up (a PR or a push whose webhook was lost).
            await self._guarded(name, "reconcile", self._light_reconcile_if_due, name, state)
            if await self._guarded(name, "wave", self._wave_if_due, name, state):
                waved.append(name)
            await self._guarded(name, "artifacts", self._retry_artifacts, state)
        await self.reconciler.retry_failed()
        await self._housekeeping()
        return waved

    async def _housekeeping(self) -> None:
        """On the light-reconcile cadence: attempts past what any rule reads leave memory
        (each replica, its repositories); with replicas, the leader alone looks for new
        installations and applies retention to the store."""
        now = self.clock.now()
        elapsed = now - self._trimmed_at
        if _due(elapsed):
            self._trimmed_at = now
            # Only on a clock that moved as ticks move it: one that jumped ahead (and will
            # be set back) would drop attempts whose cooldowns are still running.
            if LIGHT_RECONCILE_EVERY <= elapsed < 2 * LIGHT_RECONCILE_EVERY:
                for state in self.live.repos.values():
                    state.forget_attempts_before(now - ATTEMPT_MEMORY)
        if not self.leads():
            return
        if _due(now - self._discovered_at):
            self._discovered_at = now
            await self.reconciler.reconcile_new_installations()
        if self.prune is not None and (self._pruned_at is None or _due(now - self._pruned_at)):
            self._pruned_at = now
            await self.prune()

    async def _guarded(self, name: str, kind: str, work: Callable[..., Awaitable[bool]], *args: Any) -> bool:
        """Run one repository's `work` unless it is backing off; its GitHub trouble is logged
        and backed off from, and holds up neither its other work nor other repositories'."""
        key = (name, kind)
        failing = self._failing.get(key)
        if failing is not None and not retry_due(failing[1], self.clock.now(), retry_delay(failing[0])):
            return False
        attempts = failing[0] + 1 if failing is not None else 1
        try:
            done = await work(*args)
        except GitHubError as exc:
            retry_at = self._back_off(key, attempts)
            log.warning(
                "scheduler.repo_failed", repo=name, work=kind, error=str(exc), transient=exc.transient,
                attempts=attempts, retry_at=stamp(retry_at),
            )
            return False
        except LeaseTaken as exc:
            # Another replica took the repository while this one worked on it (it stalled
            # past its lease): the store refused the write, the new owner finds on GitHub
            # whatever this work did there, and the next lease round lets the repository go.
            log.warning("scheduler.lease_taken", repo=name, work=kind, error=str(exc))
            return False
        # A bug in one repository's work (its traceback logged) must not stop every later
        # repository's waves tick after tick: it is backed off from like GitHub trouble.
        except Exception:
            retry_at = self._back_off(key, attempts)
            log.exception("scheduler.repo_failed", repo=name, work=kind, attempts=attempts, retry_at=stamp(retry_at))
            return False
        self._failing.pop(key, None)
        return done

    def _back_off(self, key: tuple[str, str], attempts: int) -> datetime:
        retry_at = self.clock.now() + retry_delay(attempts)
        self._failing[key] = (attempts, retry_at)
        return retry_at

    async def _retry_artifacts(self, state: RepoState) -> bool:
        return await self.outcomes.retry_artifacts_of(state) > 0

    async def _check_claims(self, state: RepoState) -> bool:
        await self.claims.check_due(state)
        return True

    async def _wave_if_due(self, name: str, state: RepoState) -> bool:
        now = self.clock.now()
        retry_at = parse_time(state.meta.retry_wave_at)
        due = parse_time(state.meta.next_wave_at)
        # A scheduled wave due as well (both overdue after a stall) stands for the retry:
        # run apart, the two dispatched twice a wave's candidates one tick after the other.
        if retry_at is not None and retry_at <= now and not (due is not None and due <= now):
            return await self.waves.run(name, trigger=RETRY_TRIGGER) is not None
        every = state.policy.wave_every_minutes
        # Later than the cadence allows: set under a longer `wave_every_minutes` (shortened
        # since, it waited for the old slot, up to a week), or while the clock ran ahead.
        # Or to come, but off the cadence: set under another (a push lengthening it kept
        # the old, earlier slot, and one wave ran off the new cadence).
        if due is None or due - now > timedelta(minutes=every, seconds=MAX_JITTER_SECONDS) or (
            due > now and not on_cadence(due, every)
        ):
            # Not the slot of the last wave: a clock set back a few seconds after a wave at
            # 10:00 gave the 10:00 slot again, and a second wave ran. A wave further ahead
            # than one slot ran while the clock was wrong (a year ahead): not waited for.
            ran = parse_time(state.meta.scheduled_wave_at)
            since = ran if ran is not None and now < ran <= now + timedelta(minutes=every) else now
            await self._set_next(name, since)
            return False
        if due > now:
            return False
        upcoming = self._upcoming(state.policy.wave_every_minutes, now)
        return await self.waves.run(name, trigger="schedule", next_wave_at=upcoming) is not None

    async def _light_reconcile_if_due(self, name: str, state: RepoState) -> bool:
        reconciled = parse_time(state.meta.reconciled_at)
        since = None if reconciled is None else self.clock.now() - reconciled
        # A time ahead of the clock (written while it ran ahead) is no reason to wait.
        recent = since is not None and timedelta(0) <= since < LIGHT_RECONCILE_EVERY
        catch_up_at = self._catch_up.get(name.lower())
        caught_up = catch_up_at is not None and self.clock.now() >= catch_up_at
        if recent and not caught_up:
            return False
        report = await self.reconciler.reconcile(name, state.meta.installation, light=True)
        if caught_up and report.get("comments_left"):
            # GitHub still refused a command's reply (the reconcile itself went through):
            # caught up again a grace later, not at the 6-hourly reconcile.
            self._catch_up[name.lower()] = self.clock.now() + COMMENT_GRACE
        elif caught_up:
            del self._catch_up[name.lower()]
        return True

    def _upcoming(self, every_minutes: int, now: datetime) -> datetime:
        return next_boundary(now, every_minutes, self.rng.uniform(0, MAX_JITTER_SECONDS))

    async def _set_next(self, name: str, now: datetime) -> None:
        state = self.live.repo(name)
        if state is None:
            return
        upcoming = self._upcoming(state.policy.wave_every_minutes, now)
        async with self.live.lock(name):
            state.meta.next_wave_at = stamp(upcoming)
            await self.live.persist(state.save_meta())
        log.info("scheduler.next_wave", repo=name, at=state.meta.next_wave_at)


def _due(elapsed: timedelta) -> bool:
    """Housekeeping's cadence has passed, or the clock went back past when it last ran (set
    back after a jump ahead, it would otherwise wait as long as the jump)."""
    return elapsed < timedelta(0) or elapsed >= LIGHT_RECONCILE_EVERY
