"""The composition root: builds the store, the GitHub client, the services and the inbox."""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import aiohttp
import structlog
from gidgethub import routing

from bot.core.clock import Clock
from bot.core.domain import stamp
from bot.github.client import GitHubApp, repository_of
from bot.github.repo import GitHubRepos
from bot.services.capacity_feed import CapacityFeed
from bot.services.catalog_sync import CatalogSync
from bot.services.checkruns import CheckPublisher
from bot.services.claims import ClaimKeeper
from bot.services.dashboard import DashboardKeeper
from bot.services.live import LiveState
from bot.services.missed_comments import MissedComments
from bot.services.outcomes import OutcomeRecorder
from bot.services.permissions import Permissions
from bot.services.pulls import PullSync
from bot.services.reconcile import Reconciler
from bot.services.replicas import Replicas
from bot.services.responder import CommandResponder
from bot.services.scheduler import Scheduler
from bot.services.status_view import StatusViews
from bot.services.waves import WaveRunner
from bot.settings import Settings
from bot.store import Stores, engine_for
from bot.store.deliveries import Delivery
from bot.store.errors import LeaseTaken
from bot.web.inbox import Inbox
from handlers import router as default_router
from handlers.context import WebhookEvent

log = structlog.get_logger("klaud.app")

DELIVERY_RETENTION = timedelta(days=7)
FAILED_DELIVERY_RETENTION = timedelta(days=30)
ATTEMPT_RETENTION = timedelta(days=90)
# How long the event loop's thread may keep the interpreter while another thread waits for
# it (Python's default is 5 ms). The SQLite store's thread gives the interpreter up at
# every statement and needs it back to go on: behind a busy event loop a transaction of five
# statements (BEGIN, three writes, COMMIT) waited up to 25 ms, in waits of 5.2 and 10.4 ms;
# at 1 ms a wave's commit took 17-20 ms instead of 25-28 on the wave benchmark.
SWITCH_INTERVAL_SECONDS = 0.001
# What a stop leaves the check runs and the dashboard to publish, however long the rest took.
MIN_FLUSH_SECONDS = 1.0


@dataclass(frozen=True)
class Services:
    """What handlers are given (it satisfies `handlers.context.HandlerContext`)."""

    live: LiveState
    repos: Reconciler
    catalog: CatalogSync
    pulls: PullSync
    outcomes: OutcomeRecorder
    commands: CommandResponder
    checks: CheckPublisher
    waves: WaveRunner
    dashboard: DashboardKeeper

    def is_bot(self, login: str | None) -> bool:
        return self.live.is_bot(login)


class Klaud:
    """Everything one process runs. Construct it inside a running event loop."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock | None = None,
        router: routing.Router | None = None,
        inbox_options: dict[str, Any] | None = None,
        check_delay_seconds: float = 3.0,
    ) -> None:
        self.settings = settings
        self.clock = clock or Clock()
        self.router = router or default_router
        stores = Stores.over(engine_for(settings.db))
        self.db = stores.engine
        self.inbox = Inbox(stores.deliveries, self.handle, **(inbox_options or {}))
        self.store = stores.state
        self.session = aiohttp.ClientSession()
        self.github = GitHubApp(
            self.session,
            base_url=settings.github_url,
            app_id=settings.app_id,
            private_key=settings.private_key.get_secret_value() if settings.private_key else None,
            clock=self.clock,
            dry_run=settings.dry_run,
            before_write=self._before_github_write,
            # Replicas share an installation's pace of writes, each taking its part.
            writers=lambda: self.replicas.live_replicas if self.replicas is not None else 1,
        )
        self.live = LiveState(self.store, GitHubRepos(self.github), self.clock, settings.bot_logins)
        self.inbox.reload = self.live.reload
        self.inbox.stale = self.live.stale
        self.capacity = CapacityFeed(
            self.session,
            settings.capacity_url,
            settings.capacity_token.get_secret_value() if settings.capacity_token else None,
            self.clock,
        )
        self.waves = WaveRunner(self.live, self.capacity, self.clock, dry_run=settings.dry_run)
        self.status = StatusViews(self.live, self.waves, self.clock)
        pulls = PullSync(self.live)
        self.outcomes = OutcomeRecorder(self.live)
        catalog = CatalogSync(self.live)
        self.permissions = Permissions(self.clock)
        # The check runs and the dashboard coalesce bursts of changes over the same delay.
        self.dashboard = DashboardKeeper(self.live, self.permissions, self.clock, delay_seconds=check_delay_seconds)
        self.live.wave_listeners.append(self.dashboard.wave_done)
        claims = ClaimKeeper(self.live, self.outcomes)
        self.commands = CommandResponder(self.live, self.waves, self.permissions, self.clock)
        self.reconciler = Reconciler(
            self.live, catalog, pulls, self.outcomes, claims, self.dashboard,
            MissedComments(self.live, self.commands, self.outcomes),
        )
        self.checks = CheckPublisher(self.live, self.clock, delay_seconds=check_delay_seconds)
        # PostgreSQL: any number of replicas, each owning some repositories (DESIGN §6).
        self.replicas: Replicas | None = None
        if self.db.dialect == "postgresql":
            self.replicas = Replicas(
                stores.leases, stores.deliveries, self.live, busy=self.inbox.busy, release=self.inbox.release,
                publishers=(self.checks, self.dashboard),
            )
            self.reconciler.requests = stores.deliveries
        self.scheduler = Scheduler(
            self.live, self.waves, self.reconciler, self.outcomes, self.clock, prune=self.prune,
            leads=self.replicas.leads if self.replicas is not None else lambda: True,
            owns=self.replicas.owns if self.replicas is not None else lambda repo: True,
            given_up=stores.deliveries.given_up_within,
        )
        # A delivery given up on (GitHub down past its retries): its repository is caught up
        # by a light reconcile once GitHub answers again.
        self.inbox.gave_up = self.scheduler.catch_up
        self.services = Services(
            self.live, self.reconciler, catalog, pulls, self.outcomes, self.commands, self.checks, self.waves,
            self.dashboard,
        )
        self.started = False  # set once start-up (store, state, first reconcile) is done

    async def _before_github_write(self, url: str) -> None:
        """Right before each send of a request that changes GitHub. What the running delivery
        changed is committed, so the write follows its cause. Then, with replicas, a
        repository this one does not hold now (it stalled past its lease, or waited out a rate
        limit meanwhile, and another took it) is not written: the new owner acts on it, and a
        second reply or claim ref from here would be one too many. Asked last, so that
        nothing waits between the answer and the send."""
        await self.store.writer.commit_unit()
        repo, owns = repository_of(url), self.store.owns
        if owns is not None and repo is not None and not owns(repo):
            raise LeaseTaken(f"{repo} is not held by this replica now: GitHub is not written for it")
        if self.inbox.running_lost():
            raise LeaseTaken("the lease of this delivery's repository went while it ran: GitHub is not written for it")

    async def start(self, *, drain: bool = True, schedule: bool = False, reconcile: bool = False) -> None:
        try:
            await self._start(drain=drain, schedule=schedule, reconcile=reconcile)
        except BaseException:
            # A store that cannot be opened (locked, corrupted) must not leave the HTTP
            # session and the store's thread behind.
            await self.session.close()
            await self.db.close()
            raise

    async def _start(self, *, drain: bool, schedule: bool, reconcile: bool) -> None:
        await self.inbox.open()
        await self.store.open()
        if self.replicas is not None and drain:
            # A serving replica loads the repositories whose leases it takes, and claims
            # their deliveries from the shared inbox.
            self.inbox.ownership = self.replicas
            await self.replicas.start()
            first_ever = not await self.store.repos()
            if reconcile and self.replicas.leads() and first_ever:
                await self.reconciler.reconcile_new_installations()
        else:
            await self.live.load()
            # With local state a restart makes no GitHub call: installations added while the
            # process was down are found by the scheduler's periodic discovery instead.
            if reconcile and not self.live.repos:
                await self.reconciler.reconcile_new_installations()
        # What is loaded by now (the modules, the state of the repositories held) lives as
        # long as the process: keep the collector from walking it on every full collection
        # (each cost a wave ~250 ms at four times today's state, and a replica's webhook
        # requests up to 58 ms under load).
        gc.freeze()
        if drain:
            sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)  # a serving process: see above
            await self.inbox.start()
        if schedule:
            self.scheduler.start()
        self.started = True

    @property
    def ready(self) -> bool:
        return self.started and self.inbox.ready

    async def serving_replicas(self) -> list[str]:
        """The other processes serving this store now (PostgreSQL replicas holding their
        heartbeat lease); a SQLite store has none: its lock keeps them out of the file."""
        if self.replicas is None:
            return []
        holders = await self.replicas.leases.holders()
        return sorted(owner for name, owner in holders.items() if name.startswith("replica:") and owner != self.replicas.owner)

    def webhook_secrets(self) -> list[str]:
        return self.settings.secrets()

    async def stop(self, grace: float = 10.0) -> None:
        """Stop within about `grace` seconds: the scheduler's tick and the inbox's running
        handlers finish meanwhile, side by side, or are cancelled (their work runs again)."""
        self.started = False
        deadline = asyncio.get_running_loop().time() + grace
        if self.replicas is not None:
            self.replicas.stop_taking()
        await asyncio.gather(self.scheduler.stop(grace), self.inbox.stop(grace))
        # The check runs and the dashboard publish what is pending in what is left of the
        # grace (a moment at least): a slow GitHub held a stop for minutes. Before the leases
        # are released: a replica writes only the repositories it holds.
        left = max(deadline - asyncio.get_running_loop().time(), MIN_FLUSH_SECONDS)
        await asyncio.gather(self.checks.close(left), self.dashboard.close(left))
        if self.inbox.ownership is not None and self.replicas is not None:
            await self.replicas.stop()
        await self.session.close()
        await self.db.close()

    async def prune(self) -> dict[str, int]:
        """Retention: finished deliveries and old attempts leave the store."""
        now = time.time()
        deliveries = await self.inbox.prune(
            done_before=now - DELIVERY_RETENTION.total_seconds(),
            failed_before=now - FAILED_DELIVERY_RETENTION.total_seconds(),
        )
        attempts = await self.store.prune_attempts(stamp(self.clock.now() - ATTEMPT_RETENTION) or "")
        log.info("store.pruned", deliveries=deliveries, attempts=attempts)
        return {"deliveries": deliveries, "attempts": attempts}

    async def handle(self, delivery: Delivery) -> None:
        """Route one stored delivery to its handlers."""
        # Handlers are routed by event and action, which the ack stored; each parses the body
        # itself, once, into the typed model it reads, and a delivery no handler wants is
        # done without parsing it.
        if delivery.body is None:
            raise RuntimeError(f"delivery {delivery.id}: its body was not read from the store")
        event = WebhookEvent(delivery.body, event=delivery.event, delivery_id=delivery.id, action=delivery.action)
        if not self.router.fetch(event):
            log.info("delivery.ignored", reason="no handler for this event")
            return
        await self.router.dispatch(event, self.services)

    async def state_document(self, repo: str) -> dict[str, Any] | None:
        state = self.live.repo(repo)
        return None if state is None else state.state_document(self.clock.now())

    def repo_names(self) -> list[str]:
        return sorted(state.name for state in self.live.repos.values())

    def reconcile_failures(self) -> dict[str, dict[str, object]]:
        return {name: failure.document() for name, failure in sorted(self.reconciler.failures.items())}

    async def plan_document(self, repo: str, at: datetime | None = None) -> dict[str, Any] | None:
        wave = await self.waves.preview(repo, at)
        return None if wave is None else wave.document()

    async def wave_documents(self, repo: str, limit: int) -> list[dict[str, Any]] | None:
        """The last `limit` stored wave documents, newest first (waves are stored by number)."""
        state = self.live.repo(repo)
        if state is None:
            return None
        documents = []
        for number in await self.store.last_wave_numbers(state.name, limit):
            wave = await self.live.stored_wave(state.name, number)
            if wave is not None:  # unreadable (reported in one line)
                documents.append(wave.document())
        return documents
