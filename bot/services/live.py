"""The live state of every installed repository: the registry the other services share.

`LiveState` owns the `RepoState`s, the store that persists them, the per-repository locks
that keep handlers, waves, reconciles and background retries from interleaving their
changes, and the listeners told when a family's state changed (check runs). Each concern
that keeps part of a repository current lives in its own module: `catalog_sync` (families,
runners, policy), `pulls` (the overlap index), `outcomes` (the ledger), `reconcile`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import get_args

import structlog
from cachetools import LRUCache

from bot.core.clock import Clock
from bot.core.cooldown import ATTEMPT_MEMORY
from bot.core.domain import UNREADABLE_DOCUMENT, DecisionKind, Wave, stamp
from bot.core.errors import is_permanent
from bot.metrics import DISPATCH_PAUSED, forget_repo, show_wave
from bot.services.api import RepoAPI, ReposAPI
from bot.services.keyed_locks import KeyedLocks
from bot.services.repo_state import RepoMeta, RepoState
from bot.store.change import Change
from bot.store.records import StateStore

log = structlog.get_logger("klaud.live")

# Earlier names of renamed repositories remembered, for the events still named by them.
FORMER_NAMES = 1024


def spellings(names: list[str]) -> dict[str, list[str]]:
    """Stored repository names by their lowercase, each one's spellings in a fixed order."""
    found: dict[str, list[str]] = {}
    for name in sorted(names):
        found.setdefault(name.lower(), []).append(name)
    return found


_NO_RECORD = object()  # a repository record absent (or unreadable, reported as it was read)

# Called with the repository, the families whose state changed and the pull requests that
# got a new head (their check runs need a render even if no family changed).
Listener = Callable[[RepoState, set[str], set[int]], Awaitable[None]]
# Called after each real wave with its document (the dashboard).
WaveListener = Callable[[RepoState, Wave], Awaitable[None]]


class GoneRepository(RuntimeError):
    """A change to a repository that left this process (renamed, removed, handed over):
    transient, as a delivery's retry finds the repository where it is now."""

    transient = True


async def _always(_name: str, *, take_over: bool = False) -> bool:
    return True


def _nowhere(_name: str) -> bool:
    return False


def _forget_metrics(name: str) -> None:
    forget_repo(name, get_args(DecisionKind))


class LiveState:
    def __init__(self, store: StateStore, github: ReposAPI | None, clock: Clock, bot_logins: tuple[str, ...]) -> None:
        self.store = store
        self.github = github
        self.clock = clock
        self.bot_logins = bot_logins
        # Keyed by the lower-cased name: GitHub's names are case-insensitive, and `ACME/Bench`
        # must never become a second copy of `acme/bench` (with dispatches of its own).
        self.repos: dict[str, RepoState] = {}
        self._locks: KeyedLocks[str] = KeyedLocks()
        self.listeners: list[Listener] = []
        self.wave_listeners: list[WaveListener] = []
        # Told the name of a repository that leaves this process (uninstalled, renamed, kept
        # by another replica now), to drop what they keep of it.
        self.gone_listeners: list[Callable[[str], None]] = [_forget_metrics]
        # Whether this process may take up a repository it has no state for. With replicas
        # (`bot.services.replicas`) only the holder of the repository's lease may.
        self.admit: Callable[..., Awaitable[bool]] = _always
        # Replicas: whether another process may keep `name` (one this process does not own).
        self.kept_elsewhere: Callable[[str], bool] = _nowhere
        # Repositories (lowercase) whose memory is ahead of the store (a change it refused, a
        # section that failed or was cancelled), to read back; the inbox shares the set.
        self.stale: set[str] = set()
        # An earlier name (lowercase) of a renamed repository -> the name it moved to.
        self.former: LRUCache[str, str] = LRUCache(maxsize=FORMER_NAMES)
        # Repositories (lowercase) that left this process and are not kept again since.
        self._departed: LRUCache[str, bool] = LRUCache(maxsize=FORMER_NAMES)

    def in_use(self, repo: str) -> bool:
        """Whether a section holds the repository's lock now (a reconcile admitting it)."""
        return self._locks.held(repo.lower())

    def lock(self, repo: str) -> AbstractAsyncContextManager[None]:
        """The repository's lock, held to change its state.

        A section changes memory, then commits the change; an error or a cancel between the
        two left memory ahead of the store, and the section run again (a retried delivery,
        the next tick) found nothing left to write. Whatever leaves a section with an error
        leaves memory as the store holds it.
        """
        return self._changing(repo)

    @asynccontextmanager
    async def _changing(self, repo: str) -> AsyncIterator[None]:
        async with self._locks.hold(repo.lower()):
            try:
                yield
            except asyncio.CancelledError:
                self.stale.add(repo.lower())  # read back before the repository's next batch or tick
                raise
            except Exception:
                await self._read_back_after_error(repo)
                raise

    async def _read_back_after_error(self, repo: str) -> None:
        try:
            await self._read_back(repo)
        # The store cannot be read now either (or a bug, logged with its traceback): the
        # next batch or tick reads it back.
        except Exception as exc:
            log.warning(
                "live.read_back_failed", repo=repo, error=f"{type(exc).__name__}: {exc}",
                exc_info=exc if is_permanent(exc) else None,
            )
            self.stale.add(repo.lower())

    async def _read_back(self, name: str) -> None:
        """Memory of `name` as the store holds it, once what delivery units still hold of it
        is committed. The state object stays the same: whoever holds it sees the store's."""
        state = self.repo(name)
        if state is None:
            return
        await self.store.writer.commit_holding({state.name})
        stored = await self._stored(state.name)
        if stored is None:
            self.drop(name)
        else:
            state.take_contents(stored)

    @asynccontextmanager
    async def locks(self, *names: str) -> AsyncIterator[None]:
        """Several repositories' locks, always taken in one order: two takers of the same
        pair never hold one each while waiting for the other."""
        async with AsyncExitStack() as stack:
            for name in sorted({name.lower() for name in names}):
                await stack.enter_async_context(self.lock(name))
            yield

    def repo(self, name: str) -> RepoState | None:
        return self.repos.get(name.lower())

    def by_id(self, repo_id: int | None) -> RepoState | None:
        """The repository kept here, under whatever name, whose GitHub id is `repo_id`."""
        if repo_id is None:
            return None
        return next((state for state in self.repos.values() if state.meta.repo_id == repo_id), None)

    def renamed(self, name: str) -> RepoState | None:
        """The repository once called `name`, kept here under the name it moved to."""
        for _ in range(FORMER_NAMES):  # a chain of renames; bounded should a cycle form
            moved = self.former.get(name.lower())
            if moved is None:
                return None
            state = self.repo(moved)
            if state is not None:
                return state
            name = moved
        return None

    def put(self, state: RepoState) -> None:
        self.repos[state.name.lower()] = state
        self._departed.pop(state.name.lower(), None)

    def api(self, state: RepoState) -> RepoAPI:
        """The repository's GitHub operations, as its installation."""
        if self.github is None:
            raise RuntimeError("no GitHub client configured (KLAUD_APP_ID and a private key, or --sandbox)")
        return self.github.repo(state.name, state.meta.installation)

    def is_bot(self, login: str | None) -> bool:
        if not login:
            return False
        wanted = login.lower()
        return any(wanted == bot.lower() for bot in self.bot_logins)

    def new_state(self, name: str, installation: int) -> RepoState:
        return RepoState(name, RepoMeta(installation=installation))

    async def load(self) -> None:
        """Rebuild every repository's in-memory state from the store (no GitHub call)."""
        for names in spellings(await self.store.repos()).values():
            await self.load_spellings(names)
        log.info("live.loaded", repositories=len(self.repos))

    async def load_spellings(self, names: list[str]) -> RepoState | None:
        """Rebuild a repository's state from the store, given every spelling it is stored
        under (`spellings`). Several: stored before names were case-insensitive. One state
        each would plan waves, so the last readable is kept (in a fixed order, the same on
        both engines and every replica); the others' records stay in the store, untouched,
        for a person to merge."""
        kept = None
        for name in reversed(names):
            if (kept := await self.load_repo(name)) is not None:
                break
        if len(names) > 1:
            left = [name for name in names if kept is None or name != kept.name]
            log.warning("live.repository_spelled_twice", kept=kept.name if kept else None, left=left)
        return kept

    async def load_repo(self, name: str) -> RepoState | None:
        """Rebuild one repository's state from the store; None when the store has none."""
        state = await self._stored(name)
        if state is not None:
            self.put(state)
            await self._show_stored(state)
        return state

    async def _show_stored(self, state: RepoState) -> None:
        """What /metrics shows of a repository, from the store: after a restart (or a
        replica's takeover) an alert on the last wave's time, or on a pause, must not go
        blind until the next wave, up to two hours later."""
        DISPATCH_PAUSED.labels(state.name).set(0 if state.blocked_now(self.clock.now()) is None else 1)
        wave = await self.stored_wave(state.name, state.meta.wave) if state.meta.wave else None
        if wave is not None:
            counts = Counter(d.decision for d in wave.decisions)
            show_wave(state.name, wave.at.timestamp(), counts, get_args(DecisionKind), state.image_change_times())

    async def stored_wave(self, name: str, number: int) -> Wave | None:
        """Wave `number` as stored; None when it is absent or unreadable (reported in one
        line: a document written by hand or by another version must not take down the
        status page, the API or the dashboard)."""
        document = await self.store.wave(name, number)
        if document is None:
            return None
        try:
            return Wave.from_document(document)
        except UNREADABLE_DOCUMENT as exc:
            log.warning("store.record_unreadable", repo=name, kind="wave", key=number, reason=f"{type(exc).__name__}: {exc}")
            return None

    async def _stored(self, name: str) -> RepoState | None:
        # Not `is None`: a record that is JSON null would vanish in silence; read, it is reported.
        meta = await self.store.get("", "repo", name, _NO_RECORD)
        if meta is _NO_RECORD:
            return None
        records = await self.store.load(name, attempts_since=stamp(self.clock.now() - ATTEMPT_MEMORY))
        try:
            state = RepoState.from_records(name, records, meta)
        except ValueError as exc:
            # Written by another version, or damaged: reported, and the repository is
            # rebuilt from GitHub as if new (a traceback would stop start-up, or a replica's
            # every takeover of it).
            log.warning("store.record_unreadable", repo=name, kind="repo", key=name, reason=str(exc))
            return None
        await self.recall_attempts(state, state.klaud_pr_candidates())
        return state

    async def recall_attempts(self, state: RepoState, candidates: Collection[str]) -> None:
        """Every stored attempt of `candidates`, however old, back in memory: those of
        candidates open Klaud PRs work on, which their check runs show."""
        for attempt in (await self.store.attempts_of(state.name, candidates)).values():
            state.ledger.add(attempt)

    def drop(self, name: str) -> None:
        """Forget a repository's state in memory only (another replica took it over)."""
        state = self.repos.pop(name.lower(), None)
        if state is not None:
            self._gone(state.name)

    def _gone(self, name: str) -> None:
        self._departed[name.lower()] = True
        for listener in self.gone_listeners:
            listener(name)

    async def persist(self, change: Change) -> None:
        """Commit `change`, made to repositories kept here.

        A section that took its state before a rename, a removal or a handover moved it
        away finishes on a state no longer kept: what it writes would bring the repository
        back under a name it left (a ghost loaded at the next start). It fails instead.
        """
        gone = sorted(repo for repo in change.written() if repo in self._departed and repo not in self.repos)
        if gone:
            raise GoneRepository(f"no longer kept here: {', '.join(gone)}")
        try:
            await self.store.apply(change)
        except BaseException:
            # Memory now holds what the store does not: what reads it next (a retried
            # wave, a reconcile) would find nothing to write. Read back at the next tick.
            self.stale |= change.repos()
            raise

    async def reload(self, name: str) -> None:
        """Replace a repository's state in memory with what the store holds (a commit of its
        changes failed); one the store has nothing of leaves memory, to be reconciled anew.
        One no longer in memory stays out (with replicas, another may own it now)."""
        async with self._locks.hold(name.lower()):
            await self._read_back(name)
            self.stale.discard(name.lower())
        log.info("live.reloaded", repo=name)

    async def reload_stale(self) -> None:
        for name in sorted(self.stale):
            await self.reload(name)

    async def notify(self, state: RepoState, families: set[str], pulls: set[int] | None = None) -> None:
        """Tell listeners (check runs) which families' state changed and which PRs moved."""
        # Set here, after whatever changed the state: a setup error or `enabled: false` from a
        # push showed on /plan and the page at once, and on /metrics only after the next wave.
        DISPATCH_PAUSED.labels(state.name).set(0 if state.blocked_now(self.clock.now()) is None else 1)
        if families or pulls:
            for listener in self.listeners:
                await listener(state, families, pulls or set())

    async def forget(self, name: str) -> None:
        """An uninstalled repository: its state leaves memory and the store."""
        async with self.lock(name):
            await self._forget(name)

    async def _forget(self, name: str) -> None:
        state = self.repos.pop(name.lower(), None)
        # Not kept here: the records are keyed by the stored spelling, which may differ in
        # case from the payload's (GitHub's names are case-insensitive); cleared by the
        # payload's, they stayed, and the repository came back at the next start.
        name = state.name if state is not None else await self.store.stored_name(name) or name
        self._gone(name)
        change = Change()
        for kind in ("family", "pull", "attempt", "hold", "retry", "claim", "dispatch", "artifact-retry"):
            change.clear(name, kind)
        change.clear_waves(name)
        if state is None:
            # Kept by another replica, if any (an uninstall at the replica leading
            # installation events): its lease passes here, so its keeper stops writing it.
            change.drop_repo(name)
        else:
            # Kept here: as any write of this replica's, it lands only while no other replica
            # took the repository since (a stall past the lease), never taking it back.
            change.delete("", "repo", name)
        await self.persist(change)
        log.info("live.forgotten", repo=name)

    async def rename(self, old: str, new: str) -> RepoState | None:
        """GitHub calls repository `old` `new` now (renamed, or transferred to another
        owner): its state moves to the new name, in the store and here. Its attempts,
        holds, claims and wave counter go with it; rebuilt from GitHub they would be lost.

        When `new` is kept already (its events came first and built it from GitHub, here or
        at another replica), the state of `old` is dropped instead: two states of one
        repository would each plan waves. Returns the state now kept here under `new`, if any.
        """
        async with self.locks(old, new):
            state = self.repo(old)
            if state is None:
                kept = self.repo(new)
            elif self.repo(new) is None and not await self._admit_renamed(new):
                await self._drop_renamed(state, new, "another replica keeps the new name")
                kept = None
            elif kept := self.repo(new) or await self.load_repo(new):
                await self._drop_renamed(state, new, "the new name is kept already")
            else:
                await self.store.rename(state.name, new)
                self.drop(old)
                kept = await self.load_repo(new)
                log.info("live.renamed", repo=state.name, to=new)
            self.former[old.lower()] = new
        return kept

    async def _admit_renamed(self, new: str) -> bool:
        """Keep `new` here for a rename. A replica that leases the new name but stores
        nothing under it took it for the events GitHub queues there, and hands them on
        here: waiting for it to let go, every later event would keep it leased. Its lease
        is taken over instead; what it still writes of the name is refused by the fence."""
        if await self.admit(new):
            return True
        return not await self.store.stores(new) and await self.admit(new, take_over=True)

    async def _drop_renamed(self, state: RepoState, new: str, reason: str) -> None:
        log.info("live.rename_dropped", repo=state.name, to=new, reason=reason)
        await self._forget(state.name)
