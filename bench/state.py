"""State benchmark: the cost of keeping a big repository's state current, and of a restart.

Builds the state of one repository with 2,000 families (synthetic master configs in the
real format, parsed by Klaud's catalog), 10,000 open pull requests each touching one to
three families, and 100,000 attempts with a mix of verified outcomes and unverified ones.
It is persisted through the real StateStore (SQLite in a temporary directory) and held in
a RepoState exactly as Klaud holds it. Then it measures:

- one `synchronize` update (RepoState.upsert_pull of the PR with its new files, plus
  persisting its Change through StateStore.apply), median over many updates, first with
  100 PRs in the overlap index and then with 10,000 (same families and attempts);
- a restart: LiveState.load() rebuilding every in-memory index from the store, timed in
  a new process (`--rebuild-from DB`) so it starts as cold as a restarted Klaud does;
- the peak RSS (ru_maxrss) of the process that built and updated the state and of the
  restarted one; the larger is reported.

Last line: {"update_us_100", "update_us_10000", "update_ratio", "rebuild_s", "peak_rss_mib"}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bigstate as big
from bot.core.catalog import parse_runners, read_master
from bot.core.clock import ManualClock
from bot.core.domain import Attempt, PullRequest
from bot.log import configure_logging
from bot.services.live import ATTEMPT_MEMORY, LiveState
from bot.services.repo_state import RepoMeta, RepoState
from bot.store.db import Database
from bot.store.records import STATE_SCHEMA, Change, StateStore

SMALL_INDEX = 100
BATCH = 10_000  # records per setup transaction, so setup never holds every encoded record


async def open_store(path: Path) -> StateStore:
    db = Database(str(path))
    await db.open(STATE_SCHEMA)
    return StateStore(db)


async def load_catalog(state: RepoState, store: StateStore, fams: list[big.SynthFamily]) -> None:
    """Parse the master configs with Klaud's catalog, as a push or reconcile does."""
    runners = parse_runners(big.runners_yaml())
    state.meta.runners = {label: list(clusters) for label, clusters in runners.items()}
    state.meta.head_sha = "c" * 40
    change = Change()
    for path, text in big.master_configs(fams).items():
        change.extend(state.replace_families(path, list(read_master(path, text, runners).families), None))
    await store.apply(state.save_meta(change))


async def record_attempts(state: RepoState, store: StateStore, attempts: Iterable[Attempt]) -> None:
    change = Change()
    for attempt in attempts:
        _, recorded = state.record_attempt(attempt)
        change.extend(recorded)
        if len(change.puts) >= BATCH:
            await store.apply(change)
            change = Change()
    await store.apply(change)


async def add_pulls(state: RepoState, store: StateStore, pulls: list[big.SynthPull]) -> None:
    for start in range(0, len(pulls), BATCH):
        change = Change()
        for pull in pulls[start : start + BATCH]:
            change.extend(state.upsert_pull(big.pull_request(pull)))
        await store.apply(change)


def synchronize_pushes(
    fams: list[big.SynthFamily], pulls: list[big.SynthPull], count: int, rng: random.Random, revisions: dict[int, int]
) -> list[PullRequest]:
    """`count` new heads of random open PRs, each touching other families than before."""
    made = []
    for _ in range(count):
        pull = rng.choice(pulls)
        # Klaud's own PR keeps changing its one family's image; a person's moves on.
        own = pull.author == big.BOT_LOGIN
        touches = pull.touches if own else big.random_pull(fams, pull.number, rng).touches
        revisions[pull.number] = revisions.get(pull.number, 0) + 1
        made.append(big.pull_request(replace(pull, updated_at=big.NOW, touches=touches), revisions[pull.number]))
    return made


async def time_updates(state: RepoState, store: StateStore, pushes: list[PullRequest]) -> tuple[list[float], list[float]]:
    """Per update: (total µs, in-memory µs); total = upsert_pull + StateStore.apply."""
    totals, in_memory = [], []
    for pull in pushes:
        started = time.perf_counter()
        change = state.upsert_pull(pull)
        indexed = time.perf_counter()
        await store.apply(change)
        done = time.perf_counter()
        totals.append((done - started) * 1e6)
        in_memory.append((indexed - started) * 1e6)
    return totals, in_memory


async def rebuild(path: Path) -> dict[str, float | dict[str, int]]:
    """LiveState.load() over the store in this fresh process: what a restart does."""
    store = await open_store(path)
    try:
        # The generated attempts end at big.NOW: restart "then", as the live process would.
        live = LiveState(store, None, ManualClock(big.NOW), ("klaud-cold[bot]",))
        started = time.perf_counter()
        await live.load()
        elapsed = time.perf_counter() - started
        state = live.repo(big.REPO)
        assert state is not None
        return {
            "seconds": elapsed,
            "counts": {"families": len(state.catalog), "pulls": len(state.overlap), "attempts": len(state.ledger)},
            "peak_rss_mib": peak_rss_mib(resource.RUSAGE_SELF),
        }
    finally:
        await store.db.close()


def restart(path: Path, expected: dict[str, int]) -> dict[str, Any]:
    """Run `rebuild` in a new process; fail when it does not find what was stored."""
    done = subprocess.run(
        [sys.executable, __file__, "--rebuild-from", str(path)], check=True, capture_output=True, text=True
    )
    result = json.loads(done.stdout.splitlines()[-1])
    if result["counts"] != expected:
        raise SystemExit(f"the rebuilt state differs from the one stored: {result['counts']} != {expected}")
    return result


def peak_rss_mib(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # KiB on Linux


def describe(label: str, totals: list[float], in_memory: list[float]) -> str:
    ordered = sorted(totals)
    return (
        f"{label}: update median {statistics.median(totals):.0f} µs "
        f"(p90 {ordered[int(0.9 * len(ordered))]:.0f} µs; in-memory upsert median "
        f"{statistics.median(in_memory):.1f} µs, the rest is the SQLite commit)"
    )


async def run(args: argparse.Namespace) -> dict[str, float]:
    rng = random.Random(3)
    fams = big.families(args.families)
    pulls = big.pulls(fams, args.pulls)
    revisions: dict[int, int] = {}
    with tempfile.TemporaryDirectory(prefix="klaud-bench-state-") as tmp:
        path = Path(tmp) / "state.db"
        store = await open_store(path)
        state = RepoState(big.REPO, RepoMeta(installation=1))
        started = time.perf_counter()
        await load_catalog(state, store, fams)
        await record_attempts(state, store, big.attempts(fams, args.attempts))
        await add_pulls(state, store, pulls[:SMALL_INDEX])
        print(f"built {len(state.catalog)} families, {len(state.ledger)} attempts, "
              f"{len(state.overlap)} PRs in {time.perf_counter() - started:.1f} s")

        small = await time_updates(state, store, synchronize_pushes(fams, pulls[:SMALL_INDEX], args.updates, rng, revisions))
        print(describe(f"{len(state.overlap):>6} PRs", *small))

        started = time.perf_counter()
        await add_pulls(state, store, pulls[SMALL_INDEX:])
        print(f"added {len(pulls) - SMALL_INDEX} PRs in {time.perf_counter() - started:.1f} s")
        large = await time_updates(state, store, synchronize_pushes(fams, pulls, args.updates, rng, revisions))
        print(describe(f"{len(state.overlap):>6} PRs", *large))

        # A restart loads the attempts of the last ATTEMPT_MEMORY, and older ones only of the
        # candidates open Klaud PRs work on (their check runs show them); the rest stay stored.
        shown = state.klaud_pr_candidates()
        remembered = sum(1 for a in state.ledger.all()
                         if a.completed_at >= big.NOW - ATTEMPT_MEMORY or a.candidate in shown)
        expected = {"families": len(state.catalog), "pulls": len(state.overlap), "attempts": remembered}
        await store.db.close()
        restarts = [restart(path, expected) for _ in range(args.rebuilds)]
        print(f"rebuild from the store in a restarted process ({expected}): "
              + ", ".join(f"{r['seconds']:.3f} s (peak RSS {r['peak_rss_mib']:.0f} MiB)" for r in restarts))

    update_small = statistics.median(small[0])
    update_large = statistics.median(large[0])
    builder, restarted = peak_rss_mib(resource.RUSAGE_SELF), peak_rss_mib(resource.RUSAGE_CHILDREN)
    print(f"peak RSS: {builder:.0f} MiB building and updating the state, {restarted:.0f} MiB restarting with it")
    return {
        "update_us_100": round(update_small, 1),
        "update_us_10000": round(update_large, 1),
        "update_ratio": round(update_large / update_small, 2),
        "rebuild_s": round(statistics.median(r["seconds"] for r in restarts), 3),
        "peak_rss_mib": round(max(builder, restarted), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", type=int, default=2000)
    parser.add_argument("--pulls", type=int, default=10_000)
    parser.add_argument("--attempts", type=int, default=100_000)
    parser.add_argument("--updates", type=int, default=500, help="timed updates per index size")
    parser.add_argument("--rebuilds", type=int, default=3, help="restarts timed")
    parser.add_argument("--rebuild-from", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    configure_logging("json", logging.WARNING)
    if args.rebuild_from:
        print(json.dumps(asyncio.run(rebuild(args.rebuild_from))))
        return
    print(json.dumps(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
