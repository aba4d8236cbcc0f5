"""Status page benchmark: rendering one big repository's page (DESIGN §3.3, issue 14).

The state: 2,000 families (synthetic master configs in the real format, parsed by Klaud's
catalog, their images dated over the last 400 days), 1,000 open pull requests, the attempts
of the last 14 days (what a live Klaud keeps in memory), a few holds, and 100 stored waves two
hours apart, each planned by `RepoState.plan` at its own time and stored as a real wave
stores its document; the candidates each wave selected get an attempt an hour later, so the
wave history has outcomes and later waves see the cooldowns.

It renders the repository page through the page's own functions (`StatusViews.repository`,
then `bot.web.page.render_repository`: the view model and the HTML, no HTTP), first once cold
(the 100 stored waves are read and summarised) and then `--renders` times warm.

Last line: {"page_ms_median", "page_bytes", "families", "waves"}.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bigstate as big
from bench.state import add_pulls, load_catalog, open_store, record_attempts
from bot.core.clock import ManualClock
from bot.core.domain import Attempt, CapacityReading, Hold
from bot.log import configure_logging
from bot.services.live import ATTEMPT_MEMORY, LiveState
from bot.services.repo_state import RepoMeta, RepoState
from bot.services.status_view import RowQuery, StatusViews
from bot.services.waves import WaveRunner, wave_record
from bot.store.records import Change, StateStore
from bot.web.page import render, render_family, render_repository

WAVE_EVERY = timedelta(hours=2)
DEFAULT_QUERY = RowQuery()  # the page as first opened: every family, in the wave's order
OUTCOMES = [name for name, _ in big.VERIFIED_OUTCOMES]
WEIGHTS = [weight for _, weight in big.VERIFIED_OUTCOMES]


class FixedCapacity:
    """The capacity feed as one unchanging reading: the busy clusters of bigstate are busy."""

    def __init__(self) -> None:
        known = frozenset(big.clusters())
        self.reading = CapacityReading(eligible=known - big.BUSY_CLUSTERS, known=known, at=big.NOW)

    async def read(self) -> CapacityReading:
        return self.reading


async def date_images(state: RepoState, store: StateStore, rng: random.Random) -> None:
    """Image ages spread over 400 days, one family in fifty of unknown age."""
    dates = {f.id: big.NOW - timedelta(days=rng.uniform(0, 400)) for f in state.catalog if rng.random() > 0.02}
    await store.apply(state.date_images(dates))


async def hold_some(state: RepoState, store: StateStore) -> None:
    change = Change()
    for family in list(state.catalog)[::97]:
        change.extend(state.hold(Hold(family.id, "alice", "waiting for new weights <b>soon</b>", big.NOW - timedelta(days=2))))
    await store.apply(change)


async def store_waves(state: RepoState, store: StateStore, count: int, rng: random.Random) -> None:
    """`count` waves up to now, stored as WaveRunner stores them; each selection gets its
    attempt an hour later (when that is before now)."""
    reading = FixedCapacity().reading
    run_id = 5_000_000
    for number in range(1, count + 1):
        at = big.NOW - WAVE_EVERY * (count - number)
        wave = state.plan(number, at, reading)
        change = Change().put_wave(state.name, number, wave_record(wave))
        for decision in wave.decisions:
            if decision.decision == "selected" and at + timedelta(hours=1) <= big.NOW:
                run_id += 1
                change.extend(state.record_attempt(outcome_of(decision.candidate, decision.family, run_id, at, rng))[1])
        state.meta.wave = number
        await store.apply(state.save_meta(change))


def outcome_of(candidate: str, family: str, run_id: int, at: Any, rng: random.Random) -> Attempt:
    outcome = rng.choices(OUTCOMES, WEIGHTS)[0]
    return Attempt(
        candidate=candidate, family=family, run_id=run_id, run_attempt=1, base="b" * 40,
        completed_at=at + timedelta(hours=1), verified=True, outcome=outcome,  # type: ignore[arg-type]
        phase="final-sweep", pull_request=None, reason_code=None, error=None,
    )


async def build(path: Path, args: argparse.Namespace) -> tuple[StatusViews, StateStore]:
    rng = random.Random(5)
    fams = big.families(args.families)
    store = await open_store(path)
    state = RepoState(big.REPO, RepoMeta(installation=1))
    await load_catalog(state, store, fams)
    await date_images(state, store, rng)
    await add_pulls(state, store, big.pulls(fams, args.pulls))
    days = ATTEMPT_MEMORY.total_seconds() / 86400
    await record_attempts(state, store, big.attempts(fams, args.attempts, days=days))
    await hold_some(state, store)
    await store_waves(state, store, args.waves, rng)
    clock = ManualClock(big.NOW)
    live = LiveState(store, None, clock, big.BOT_LOGINS)
    live.put(state)
    # As Klaud does once its state is loaded: the collector no longer walks the long-lived state.
    gc.freeze()
    return StatusViews(live, WaveRunner(live, FixedCapacity(), clock), clock), store


async def timed(make: Callable[[], Awaitable[str]], times: int) -> tuple[list[float], str]:
    """Milliseconds of each of `times` calls, and the last page made."""
    samples, page = [], ""
    for _ in range(times):
        started = time.perf_counter()
        page = await make()
        samples.append((time.perf_counter() - started) * 1000)
    return samples, page


def ms(samples: list[float]) -> str:
    return f"median {statistics.median(samples):.1f} ms (min {min(samples):.1f}, max {max(samples):.1f}, n={len(samples)})"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="klaud-bench-page-") as tmp:
        started = time.perf_counter()
        views, store = await build(Path(tmp) / "state.db", args)
        state = views.live.repo(big.REPO)
        assert state is not None
        print(f"built {len(state.catalog)} families, {len(state.overlap)} open PRs, {len(state.ledger)} attempts, "
              f"{len(state.holds)} holds and {state.meta.wave} stored waves in {time.perf_counter() - started:.1f} s")

        async def repository_page(query: RowQuery = DEFAULT_QUERY) -> str:
            page = await views.repository(big.REPO, query)
            assert page is not None
            return render_repository(page)

        cold, _ = await timed(repository_page, 1)
        print(f"first render (reads and summarises the {state.meta.wave} stored waves): {cold[0]:.1f} ms")
        samples, html = await timed(repository_page, args.renders)
        page = await views.repository(big.REPO, RowQuery())
        assert page is not None and len(page.rows) == args.families and len(page.history) == args.waves
        print(f"repository page: {ms(samples)}, {len(html.encode()) / 1e6:.2f} MB")

        started = time.perf_counter()
        page = await views.repository(big.REPO, RowQuery())
        built = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        render_repository(page)  # type: ignore[arg-type]
        print(f"  of which the view model {built:.1f} ms, the HTML {(time.perf_counter() - started) * 1000:.1f} ms")

        filtered, _ = await timed(lambda: repository_page(RowQuery.parse("age", None, "cooldown", "fp8")), 10)
        print(f"filtered and sorted (?sort=age&decision=cooldown&q=fp8): {ms(filtered)}")
        family = max(state.catalog, key=lambda f: len(state.ledger.for_candidate(f.candidate)))

        async def family_page() -> str:
            found = await views.family(big.REPO, family.id)
            assert found is not None
            return render_family(found)

        print(f"a family page ({family.id}): {ms((await timed(family_page, 10))[0])}")

        async def index_page() -> str:
            return render("index.html", repos=await views.overview(), now=big.NOW)

        print(f"the index page: {ms((await timed(index_page, 10))[0])}")
        await store.db.close()
    return {
        "page_ms_median": round(statistics.median(samples), 1),
        "page_bytes": len(html.encode()),
        "families": args.families,
        "waves": args.waves,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", type=int, default=2000)
    parser.add_argument("--pulls", type=int, default=1000)
    parser.add_argument("--attempts", type=int, default=20_000, help="attempts over the last 14 days")
    parser.add_argument("--waves", type=int, default=100)
    parser.add_argument("--renders", type=int, default=50)
    args = parser.parse_args()
    configure_logging("json", logging.WARNING)
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
