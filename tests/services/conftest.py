"""Services wired together over an in-memory store and a `FakeRepo` (no server, no sandbox)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from bot.core.clock import ManualClock
from bot.core.domain import CapacityReading
from bot.core.events import BlameRange
from bot.services.catalog_sync import CatalogSync
from bot.services.claims import ClaimKeeper
from bot.services.live import LiveState
from bot.services.outcomes import OutcomeRecorder
from bot.services.pulls import PullSync
from bot.services.reconcile import Reconciler
from bot.services.waves import WaveRunner
from bot.store.db import Database
from bot.store.records import STATE_SCHEMA, StateStore
from tests import scenarios as sc
from tests.services.fakes import FakeRepo, FakeRepos

if TYPE_CHECKING:
    from tests.services.crash import CrashKit

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
REPO = "acme/bench"


class FixedCapacity:
    """Every cluster of the test scenarios is free unless listed in `busy`."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.busy: set[str] = set()

    async def read(self) -> CapacityReading:
        known = frozenset(sc.CLUSTERS)
        return CapacityReading(eligible=known - self.busy, known=known, at=self.clock.now())


@dataclass
class Kit:
    clock: ManualClock
    repo: FakeRepo
    live: LiveState
    catalog: CatalogSync
    pulls: PullSync
    outcomes: OutcomeRecorder
    reconciler: Reconciler
    waves: WaveRunner
    capacity: FixedCapacity
    claims: ClaimKeeper

    @property
    def state(self):  # type: ignore[no-untyped-def]
        state = self.live.repo(REPO)
        assert state is not None, "reconcile the repository first"
        return state


def scenario_repo() -> FakeRepo:
    repo = FakeRepo(REPO)
    repo.put_files(
        {
            "configs/nvidia-master.yaml": sc.NVIDIA,
            "configs/amd-master.yaml": sc.AMD,
            "configs/runners.yaml": sc.RUNNERS,
            ".github/workflows/klaud-candidate.yml": sc.CANDIDATE_WORKFLOW,
        }
    )
    # The configs' history: every line last changed a month ago.
    for path in ("configs/nvidia-master.yaml", "configs/amd-master.yaml"):
        repo.blames[path] = [BlameRange(startingLine=1, endingLine=10_000, committed=NOW - timedelta(days=30))]
    return repo


@pytest.fixture
async def kit() -> AsyncIterator[Kit]:
    db = Database(":memory:")
    await db.open(STATE_SCHEMA)
    store = StateStore(db)
    clock = ManualClock(NOW)
    repo = scenario_repo()
    live = LiveState(store, FakeRepos({REPO: repo}), clock, ("klaud-cold[bot]", "Klaud-Cold"))
    catalog, pulls, outcomes = CatalogSync(live), PullSync(live), OutcomeRecorder(live)
    capacity = FixedCapacity(clock)
    claims = ClaimKeeper(live, outcomes)
    yield Kit(
        clock, repo, live, catalog, pulls, outcomes, Reconciler(live, catalog, pulls, outcomes, claims),
        WaveRunner(live, capacity, clock), capacity, claims,
    )
    await db.close()


@pytest.fixture
async def ck(tmp_path: Path) -> AsyncIterator[CrashKit]:
    """Services over a SQLite file that can be killed and restarted (`tests.services.crash`)."""
    from tests.services.crash import CrashKit  # imports this module: not at its top

    kit = CrashKit(tmp_path / "klaud.db")
    yield kit
    await kit.close()
