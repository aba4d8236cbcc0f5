"""Replicas on one PostgreSQL store: which repositories this process owns (DESIGN §6).

Every replica stores the deliveries GitHub sends it. Each repository is owned by one
replica at a time through a lease (`bot.store.leases`): the owner claims the repository's
deliveries, keeps its state in memory and runs its waves. Every few seconds a replica
renews its leases and takes free ones up to its share (repositories / live replicas), so a
new replica gets work and a dead one's repositories, whose leases expire, are taken over
within `lease_seconds` plus one round. A replica above its share gives up repositories it
is not working on (no delivery, no section, no check-run or dashboard write in hand), and
their new owner publishes what was pending; one that stops releases everything at once.

One more lease, "installations", makes one replica the one that handles deliveries without
a repository (installation events) and the housekeeping (discovery of new installations,
retention).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from bot.services.live import LiveState, spellings
from bot.services.repo_state import RepoState
from bot.store.deliveries import DeliveryStore
from bot.store.errors import LeaseTaken, StoreError
from bot.store.leases import LeaseStore, repo_lease

log = structlog.get_logger("klaud.replicas")

INSTALLATIONS = "installations"
LEASE_SECONDS = 10.0
ROUND_SECONDS = 2.0
# A lease counts as this replica's until this share of its length has passed since its
# renewal was sent: the store's clock may run a little faster than this machine's, and the
# repository must be let go before another replica may take it.
LEASE_TRUST = 0.8
PRUNE_AFTER_SECONDS = 3600.0
# How often the leader looks for them: leases an hour dead need no search every round.
PRUNES_PER_EXPIRY = 12


class Publisher(Protocol):
    """What writes a repository's GitHub side a while after its changes, outside its
    deliveries (its check runs, its dashboard)."""

    def repository_taken(self, state: RepoState) -> None:
        """This replica took the repository over: what its last owner still had to publish
        left with it, and is published here."""

    def publishing(self, repo: str) -> bool:
        """Whether one of the repository's flushes (`repo` in lowercase) runs now: it may
        have a write out on GitHub."""


def replica_id() -> str:
    """Unique per process start: a restarted replica takes over its own old claims too."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Replicas:
    def __init__(
        self,
        leases: LeaseStore,
        deliveries: DeliveryStore,
        live: LiveState,
        *,
        busy: Callable[[str], bool],
        release: Callable[[str | None], None],
        publishers: Sequence[Publisher] = (),
        owner: str | None = None,
        lease_seconds: float = LEASE_SECONDS,
        round_seconds: float = ROUND_SECONDS,
    ) -> None:
        self.leases = leases
        self.deliveries = deliveries
        self.live = live
        self.owner = owner or replica_id()
        self.lease_seconds = lease_seconds
        self.round_seconds = round_seconds
        self._busy = busy  # whether the inbox works on a repository right now
        # Tells the inbox to drop a repository's queue (None: those without a repository).
        self._release = release
        self._publishers = publishers
        self._repos: set[str] = set()
        self._installations = False
        self._taking = True  # False once the process stops
        # Monotonic time until which the leases held are surely still this replica's.
        self._valid_until = 0.0
        self._next_prune = 0.0  # monotonic time of the leader's next search for dead leases
        self.live_replicas = 1  # replicas holding a heartbeat lease at the last round
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        live.admit = self.admit
        live.kept_elsewhere = lambda repo: repo.lower() not in self._repos

    @property
    def owner(self) -> str:
        return self._owner

    @owner.setter
    def owner(self, owner: str) -> None:
        # What this process writes commits only while no other replica holds the
        # repository: the store fences its writes with the same name as the leases.
        self._owner = owner
        self.live.store.lease_owner = owner

    # -- what the inbox and the scheduler ask ---------------------------------------------

    # Past the leases' validity (renewals failing or hanging) this replica owns nothing,
    # even before its loop lets the repositories go: another may hold them by now.

    def repos(self) -> set[str]:
        return set(self._repos) if self._valid() else set()

    def unrouted(self) -> bool:
        return self._installations and self._valid()

    def owns(self, repo: str | None) -> bool:
        if not self._valid():
            return False
        return self._installations if repo is None else repo.lower() in self._repos

    def leads(self) -> bool:
        """Whether this replica does the housekeeping (it holds the installations lease)."""
        return self.unrouted()

    def _valid(self) -> bool:
        return time.monotonic() < self._valid_until

    async def admit(self, repo: str, *, take_over: bool = False) -> bool:
        """Take `repo`'s lease to start keeping it (a new installation); False when another
        replica holds it (that one keeps it). `take_over`: from whoever holds it (the new
        name of a repository kept here, only leased elsewhere)."""
        name = repo.lower()
        if name in self._repos:
            return True
        take = self.leases.take_over if take_over else self.leases.acquire
        if not await take(repo_lease(name), self.owner, self.lease_seconds):
            return False
        await self._own(name)
        log.info("replica.admitted", repo=name, owner=self.owner)
        return True

    # -- the rounds ------------------------------------------------------------------------

    async def start(self) -> None:
        await self.round()
        self._stopping.clear()
        self._task = asyncio.create_task(self._loop(), name="klaud-replicas")

    async def _loop(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.round_seconds)
            if self._stopping.is_set():
                return
            try:
                # A store that stops answering (packets dropped) must not hold the round
                # past the leases: they lapse, and the repositories are let go below.
                async with asyncio.timeout(self.lease_seconds * LEASE_TRUST):
                    await self.round()
            # The store is unreachable: leases cannot be renewed (they will lapse, and the
            # repositories move on if this lasts); the next round tries again.
            except Exception:
                log.exception("replica.round_failed", owner=self.owner)
                self._let_go_if_lapsed()

    def stop_taking(self) -> None:
        """The process is stopping: its rounds go on renewing what it holds while its last
        renders are published, and take nothing more (it would be released at once, and the
        publishers, closed by then, could not render it)."""
        self._taking = False

    def _let_go_if_lapsed(self) -> None:
        if self._valid() or not (self._repos or self._installations):
            return
        log.warning("replica.leases_lapsed", owner=self.owner, repos=len(self._repos))
        for repo in sorted(self._repos):
            self._drop(repo)
        self._lose_the_lead()

    async def round(self) -> None:
        """Renew, then take or give up repositories until this replica holds its share."""
        # From its first round on (a serving replica; a CLI command runs none), this process
        # writes only the repositories it holds by its own clock: the store refuses the rest,
        # and so does the GitHub client (`Klaud._before_github_write`).
        self.live.store.owns = self.owns
        sent = time.monotonic()
        await self.leases.acquire(f"replica:{self.owner}", self.owner, self.lease_seconds)
        await self._renew()
        self._valid_until = sent + self.lease_seconds * LEASE_TRUST
        self._drop_unowned()
        holders = await self.leases.holders()
        self.live_replicas = max(1, sum(1 for name in holders if name.startswith("replica:")))
        # The repositories there is something to keep: state in the store, or deliveries.
        # Records are keyed by the name as GitHub spelled it, leases by its lowercase.
        stored = spellings(await self.live.store.repos())
        universe = set(stored) | await self.deliveries.waiting_repos()
        await self._give_up(sorted(repo for repo in self._repos - universe if self._idle(repo)), "nothing to keep")
        share = math.ceil(len(universe) / self.live_replicas)
        free = [repo for repo in universe if repo not in self._repos and repo_lease(repo) not in holders]
        wanted = max(0, share - len(self._repos)) if self._taking else 0
        for repo in sorted(free, key=self._spread)[:wanted]:
            await self._take(repo, stored.get(repo, [repo]))
        idle = sorted((repo for repo in self._repos if self._idle(repo)), key=self._spread, reverse=True)
        await self._give_up(idle[: max(0, len(self._repos) - share)], f"above the share of {share}")
        await self._installations_lease(holders)

    async def _renew(self) -> None:
        names = {repo_lease(repo) for repo in self._repos}
        if self._installations:
            names.add(INSTALLATIONS)
        kept = await self.leases.renew_all(names, self.owner, self.lease_seconds)
        for repo in [repo for repo in self._repos if repo_lease(repo) not in kept]:
            log.warning("replica.lease_lost", repo=repo, owner=self.owner)
            self._drop(repo)
        if self._installations and INSTALLATIONS not in kept:
            log.warning("replica.lease_lost", lease=INSTALLATIONS, owner=self.owner)
            self._lose_the_lead()

    async def _take(self, repo: str, stored_names: list[str]) -> None:
        try:
            taken = await self.leases.acquire(repo_lease(repo), self.owner, self.lease_seconds)
        except StoreError as exc:
            # Its lease row is locked (a stopped replica's commit still open holds it until
            # PostgreSQL ends that session): this round goes on with the other repositories
            # and the installations lease, which a failed round left unowned meanwhile.
            log.warning("replica.take_failed", repo=repo, owner=self.owner, error=str(exc))
            return
        if not taken:
            return  # another replica was faster
        try:
            await self._take_back_claims(repo)
            async with self.live.lock(repo):
                state = self.live.repo(repo) or await self.live.load_spellings(stored_names)
        except LeaseTaken:
            # This replica stalled past the lease it had just taken, and another took the
            # repository meanwhile: that one keeps it, its claims untouched.
            log.info("replica.take_lost", repo=repo, owner=self.owner)
            return
        # Owned without its state, the repository would have no waves until a delivery
        # came: the lease goes back, a later round (here or elsewhere) loads it again, and
        # this round goes on with the other repositories and the installations lease.
        except Exception:
            log.exception("replica.load_failed", repo=repo, owner=self.owner)
            await self.leases.release(repo_lease(repo), self.owner)
            return
        self._repos.add(repo)
        log.info("replica.took", repo=repo, owner=self.owner, state="loaded" if state else "none yet")
        # Its last owner's renders pending when it let go (a coalescer's window) left with it.
        if state is not None:
            for publisher in self._publishers:
                publisher.repository_taken(state)

    async def _own(self, repo: str) -> None:
        await self._take_back_claims(repo)
        self._repos.add(repo)

    async def _take_back_claims(self, repo: str) -> None:
        """Queue again the repository's deliveries claimed but not finished, whoever claimed
        them, before its state is read.

        A stalled last owner's commit in flight holds its deliveries' rows: this waits for
        it, and the state read next includes it; or this comes first, and that commit fails
        its claim fence. Without it, such a commit landed after the state was read, and the
        new owner's memory missed what it changed. This replica's own claims from before it
        last let the repository go are work to do again, not work in hand.
        """
        if not self._busy(repo):
            await self.deliveries.unclaim(repo, self.owner)

    async def _give_up(self, repos: list[str], reason: str) -> None:
        for repo in repos:
            # Asked again for each: work on it may have begun while the lease before was released.
            if not self._idle(repo):
                continue
            # Let go before its lease is: a flush beginning meanwhile finds no state to publish.
            self._drop(repo)
            await self.leases.release(repo_lease(repo), self.owner)
            log.info("replica.gave_up", repo=repo, owner=self.owner, reason=reason)

    def _idle(self, repo: str) -> bool:
        """Whether the repository may be given up: the inbox works on none of its deliveries,
        no section holds it (a new repository's admitting reconcile has stored nothing yet:
        let go meanwhile, it would stay in memory here, owned elsewhere), and no flush of its
        check runs or dashboard is writing GitHub (a creation sent and not answered yet: the
        next owner, finding none, would create a second)."""
        return not (
            self._busy(repo) or self.live.in_use(repo) or any(p.publishing(repo) for p in self._publishers)
        )

    async def _installations_lease(self, holders: dict[str, str]) -> None:
        if self._installations:
            # The leading replica clears what dead processes left (their heartbeat leases
            # never come back under the same name).
            if time.monotonic() >= self._next_prune:
                await self.leases.prune(expired_for_seconds=PRUNE_AFTER_SECONDS)
                self._next_prune = time.monotonic() + PRUNE_AFTER_SECONDS / PRUNES_PER_EXPIRY
            return
        if holders.get(INSTALLATIONS) not in (None, self.owner):
            return
        self._installations = await self.leases.acquire(INSTALLATIONS, self.owner, self.lease_seconds)
        if self._installations:
            log.info("replica.leads", owner=self.owner)

    def _drop_unowned(self) -> None:
        """A state in memory whose repository this replica does not own (a path that kept
        one past its lease, by a race not foreseen) would plan waves beside its owner's,
        refused by the fence tick after tick: it leaves memory, unless a section holds it
        (a reconcile admitting the repository owns it already, or is about to)."""
        for name in [name for name in self.live.repos if name not in self._repos and not self.live.in_use(name)]:
            log.warning("replica.unowned_state_dropped", repo=name, owner=self.owner)
            self.live.drop(name)

    def _drop(self, repo: str) -> None:
        self._repos.discard(repo)
        self._release(repo)
        self.live.drop(repo)

    def _lose_the_lead(self) -> None:
        # The installation events waiting or running here are the new leader's now: run here
        # as well, they would run twice, in either order.
        self._installations = False
        self._release(None)

    def _spread(self, repo: str) -> str:
        # Each replica prefers a different order of repositories, so replicas starting at
        # once mostly reach for different leases.
        return hashlib.blake2s(f"{self.owner}/{repo}".encode(), digest_size=8).hexdigest()

    async def stop(self) -> None:
        """Release every lease: the other replicas take the repositories over at once."""
        self._stopping.set()
        if self._task is not None:
            await self._task
        names = [repo_lease(repo) for repo in self._repos] + ([INSTALLATIONS] if self._installations else [])
        for name in [*names, f"replica:{self.owner}"]:
            try:
                await self.leases.release(name, self.owner)
            # Whatever the store answers, stopping goes on: an unreleased lease lapses.
            except Exception as exc:  # noqa: BLE001
                log.warning("replica.release_failed", lease=name, error=f"{type(exc).__name__}: {exc}")
        self._repos.clear()
        self._installations = False
        self.live.store.owns = None
