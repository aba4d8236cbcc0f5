"""Services over a SQLite file and a `FakeRepo` that outlive a "process": kill, restart.

`CrashKit.kill()` drops what memory held and every write not yet in a transaction, as a
SIGKILL would; `restart()` builds the services again from the same file, the way start-up
does (`store.open`, `live.load`), while GitHub (the `FakeRepo`) keeps what the dead process
did to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.core.clock import ManualClock
from bot.core.domain import Dispatch
from bot.core.events import Artifact
from bot.services.catalog_sync import CatalogSync
from bot.services.claims import ClaimKeeper
from bot.services.live import LiveState
from bot.services.outcomes import OutcomeRecorder
from bot.services.pulls import PullSync
from bot.services.reconcile import Reconciler
from bot.services.repo_state import RepoState
from bot.services.scheduler import Scheduler
from bot.services.waves import WaveRunner
from bot.store.change import Change
from bot.store.db import Database
from bot.store.records import StateStore
from tests.services.conftest import NOW, REPO, FixedCapacity, scenario_repo
from tests.services.fakes import FakeRepo, FakeRepos, artifact_zip

INCOMPATIBLE = {"outcome": "incompatible", "phase": "targeted", "pull-request": None, "run-ids": [], "repairs-used": 0}


class Killed(BaseException):
    """The process dies here: no handler catches it, nothing after it runs."""


@dataclass
class Process:
    db: Database
    live: LiveState
    outcomes: OutcomeRecorder
    claims: ClaimKeeper
    reconciler: Reconciler
    waves: WaveRunner
    scheduler: Scheduler

    @property
    def state(self) -> RepoState:
        state = self.live.repo(REPO)
        assert state is not None
        return state

    def die_at_commit(self, when: Callable[[Change], bool]) -> None:
        """The process dies at the first commit of a change `when` picks."""
        persist = self.live.persist

        async def dying(change: Change) -> None:
            if when(change):
                raise Killed
            await persist(change)

        self.live.persist = dying  # type: ignore[method-assign]


def wave_commit(change: Change) -> bool:
    """The commit that ends a wave (it stores the wave's document)."""
    return bool(change.wave_puts)


class CrashKit:
    def __init__(self, path: Path, repo: FakeRepo | None = None) -> None:
        self.path = path
        self.clock = ManualClock(NOW)
        self.repo = repo or scenario_repo()
        self.capacity = FixedCapacity(self.clock)
        self.process: Process | None = None

    async def dispatched(self) -> tuple[Process, Dispatch]:
        """A process that reconciled the repository and dispatched a wave; one dispatch of it,
        its run 10 minutes on."""
        process = await self.boot()
        await process.reconciler.reconcile(REPO, 1)
        await process.waves.run(REPO, trigger="test")
        dispatch = next(iter(process.state.dispatches.values()))
        assert dispatch.run_id is not None
        self.clock.advance(600)
        return process, dispatch

    async def boot(self) -> Process:
        db = Database(str(self.path))
        await db.open()
        store = StateStore(db)
        live = LiveState(store, FakeRepos({REPO: self.repo}), self.clock, ("klaud-cold[bot]", "Klaud-Cold"))
        catalog, pulls, outcomes = CatalogSync(live), PullSync(live), OutcomeRecorder(live)
        claims = ClaimKeeper(live, outcomes)
        reconciler = Reconciler(live, catalog, pulls, outcomes, claims)
        waves = WaveRunner(live, self.capacity, self.clock)
        scheduler = Scheduler(live, waves, reconciler, outcomes, self.clock)
        await live.load()
        self.process = Process(db, live, outcomes, claims, reconciler, waves, scheduler)
        return self.process

    async def kill(self) -> None:
        """SIGKILL: writes not yet in a transaction are lost."""
        assert self.process is not None
        writer = self.process.live.store.writer
        writer._queue.clear()  # what was not yet in a transaction dies with the process
        if writer._flusher is not None and not writer._flusher.done():
            writer._flusher.cancel()
            await asyncio.gather(writer._flusher, return_exceptions=True)
        await self.process.db.close()
        self.process = None

    async def restart(self) -> Process:
        if self.process is not None:
            await self.kill()
        return await self.boot()

    async def close(self) -> None:
        if self.process is not None:
            await self.process.live.store.writer.flushed()
            await self.process.db.close()
            self.process = None

    # -- GitHub's side -----------------------------------------------------------------------

    def runs_in_flight(self) -> list[int]:
        return [run_id for run_id, run in self.repo.runs.items() if run.status != "completed"]

    def dispatches_of(self, candidate: str) -> int:
        return [d["inputs"]["candidate"] for d in self.repo.dispatched].count(candidate)

    def complete_run(self, run_id: int, outcome: dict[str, Any], artifact_id: int) -> None:
        """The run ends with `outcome` in its candidate artifact."""
        run = self.repo.runs[run_id]
        candidate = next(d["inputs"]["candidate"] for d in self.repo.dispatched if d["run_id"] == run_id)
        self.repo.runs[run_id] = run.model_copy(update={
            "status": "completed", "conclusion": "success",
            "created_at": run.created_at or self.clock.now(), "updated_at": self.clock.now(),
        })
        self.repo.artifacts_of[run_id] = [
            Artifact(id=artifact_id, name=f"klaud-candidate-{candidate}", expired=False, archive_download_url="x")
        ]
        self.repo.archives[artifact_id] = artifact_zip(outcome)
