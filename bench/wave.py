"""Wave benchmark: planning waves over a big state through the real server and sandbox GitHub.

The state: 2,000 families (synthetic master configs in the real format), 1,000 open pull
requests (each changes one to three families' image or settings lines; some are idle, a
few are Klaud's own) and 100,000 attempts. How it gets into Klaud:

- the attempts are written straight into the store before the server starts, as an
  earlier Klaud process would have left them (with the repository's metadata record, so
  the start-up load finds the repository and makes no GitHub call);
- the families and the pull requests come from the sandbox GitHub through a reconcile
  (`klaud reconcile`: configs, open PR list, every PR's files), like an installation.

Then it triggers waves the way production does (sandbox `dispatch` action with event
type `klaud-plan` -> signed `repository_dispatch` webhook -> inbox -> handler -> wave) and
also calls WaveRunner.run directly. The policy is the default one (five candidates per wave,
ten in flight), so the first two waves claim and dispatch five candidates each and the
later ones, with ten in flight, dispatch none. Each wave's duration is the wave's own
measurement (the `klaud_wave_seconds` histogram, read before and after every wave), so
webhook transport is excluded; the sandbox answers the dispatch writes in the same event
loop, so its work on them is included. GitHub reads are counted from the sandbox request
log between its reset and the end of the waves. The GitHub calls the previous poll-based
planner needs for the same state are computed for comparison (assumptions printed with
the figures).

`--scale N` (N > 1) also runs the benchmark on N times the state (families, PRs and attempts
all times N) and compares the medians. The two states are served by two processes, each
with its own heap, set up side by side; then they take turns, one kind of wave each
(dispatched, direct, dry), so the two medians are measured within seconds of each other.
Run one after the other, minutes apart across the N-times setup, the ratio measured this
machine's speed, which moves by 20-30 % from one minute to the next, as much as the code.

Last line: {"wave_ms_median", "github_reads", "poll_design_calls"} for today's state, plus
"scale", "wave_ms_median_scaled" and "scale_ratio" (N-times median / 1-time median) with
`--scale N`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import bigstate as big
from bot.core.domain import Attempt, stamp
from bot.log import configure_logging
from bot.metrics import REGISTRY
from bot.services.repo_state import RepoMeta, RepoState
from bot.store.db import Database
from bot.store.records import STATE_SCHEMA, Change, StateStore
from tests.harness import SandboxRun, sandbox_stack
from tests.scenarios import CANDIDATE_WORKFLOW

PER_PAGE = 100
# An artifact the previous planner finds nothing to download for.
NO_DOWNLOAD = {"artifact-expired", "artifact-missing"}


# -- the state ----------------------------------------------------------------------------


def cluster(cluster_id: str) -> dict[str, Any]:
    if cluster_id in big.BUSY_CLUSTERS:
        return {"id": cluster_id, "total": 10, "allocated": 9, "idle": 1}
    return {"id": cluster_id, "total": 10, "allocated": 2, "idle": 8}


def scenario_pull(pull: big.SynthPull, lines: dict[str, list[str]]) -> dict[str, Any]:
    return {
        "number": pull.number,
        "title": f"Update {len(pull.touches)} families",
        "user": pull.author,
        "head_ref": pull.head_ref,
        "created_at": stamp(pull.updated_at - timedelta(days=1)),
        "updated_at": stamp(pull.updated_at),
        "files": [
            {"filename": path, "status": "modified", "patch": patch}
            for path, patch in sorted(big.patches(pull, lines).items())
        ],
    }


def scenario(fams: list[big.SynthFamily], pulls: list[big.SynthPull]) -> dict[str, Any]:
    configs = big.master_configs(fams)
    lines = {path: text.splitlines() for path, text in configs.items()}
    files = {
        **configs,
        "configs/runners.yaml": big.runners_yaml(),
        ".github/workflows/klaud-candidate.yml": CANDIDATE_WORKFLOW,
    }
    return {
        "now": stamp(big.NOW),
        "capacity": {"clusters": [cluster(c) for c in big.clusters()]},
        "repositories": [
            {
                "full_name": big.REPO,
                "installation_id": 1,
                "default_branch": "main",
                "files": files,
                "collaborators": {"alice": "admin", "bob": "write"},
                "pulls": [scenario_pull(pull, lines) for pull in pulls],
            }
        ],
        "timeline": [],
    }


async def seed_attempts(path: Path, attempts: list[Attempt]) -> None:
    """Write the attempts and the repository record as an earlier Klaud process left them."""
    db = Database(str(path))
    await db.open(STATE_SCHEMA)
    try:
        state = RepoState(big.REPO, RepoMeta(installation=1))
        change = Change()
        for attempt in attempts:
            change.extend(state.record_attempt(attempt)[1])
        await StateStore(db).apply(state.save_meta(change))
    finally:
        await db.close()


def check_overlap_index(run: SandboxRun, pulls: list[big.SynthPull]) -> None:
    """Stop unless Klaud read from the patches exactly what each PR changes."""
    state = run.klaud.live.repo(big.REPO)
    assert state is not None
    for pull in pulls:
        expected = {family.id: kind for family, kind in pull.touches}
        if state.overlap.touches(pull.number) != expected:
            raise SystemExit(f"PR #{pull.number}: Klaud's index has {state.overlap.touches(pull.number)}, "
                             f"the PR changes {expected}")


# -- waves --------------------------------------------------------------------------------


def wave_histogram() -> tuple[float, float]:
    """(count, sum) of klaud_wave_seconds so far."""
    count = REGISTRY.get_sample_value("klaud_wave_seconds_count") or 0.0
    total = REGISTRY.get_sample_value("klaud_wave_seconds_sum") or 0.0
    return count, total


def one_wave_seconds(before: tuple[float, float]) -> float:
    count, total = wave_histogram()
    if count != before[0] + 1:
        raise SystemExit(f"expected exactly one wave, the histogram counted {count - before[0]:.0f}")
    return total - before[1]


@dataclass(frozen=True)
class WaveSample:
    seconds: float  # the wave's own klaud_wave_seconds observation
    dispatched: int  # workflow dispatches GitHub received from it
    trigger: str


def dispatch_count(run: SandboxRun) -> int:
    return len(run.github(big.REPO)["dispatches"])


async def dispatched_wave(run: SandboxRun) -> WaveSample:
    """A wave triggered like production: repository_dispatch `klaud-plan` from GitHub."""
    before, dispatches = wave_histogram(), dispatch_count(run)
    answer = await run.act({"action": "dispatch", "repo": big.REPO, "event_type": "klaud-plan"})
    if answer["statuses"] != [202]:
        raise SystemExit(f"the bot did not accept the repository_dispatch: {answer}")
    return WaveSample(one_wave_seconds(before), dispatch_count(run) - dispatches, "repository_dispatch")


async def direct_wave(run: SandboxRun) -> tuple[WaveSample, float]:
    """WaveRunner.run called directly; also answers the time measured around the call."""
    before, dispatches = wave_histogram(), dispatch_count(run)
    started = time.perf_counter()
    await run.klaud.waves.run(big.REPO, trigger="benchmark")
    around = time.perf_counter() - started
    seconds = one_wave_seconds(before)
    # Let the webhooks the dispatches caused be handled before the next wave starts.
    await run.settle()
    return WaveSample(seconds, dispatch_count(run) - dispatches, "direct"), around


async def dry_plan_seconds(run: SandboxRun) -> float:
    """One planner pass over the snapshot, as `klaud plan` makes it (nothing dispatched)."""
    started = time.perf_counter()
    await run.klaud.waves.preview(big.REPO)
    return time.perf_counter() - started


# -- the previous design ------------------------------------------------------------------


def poll_design_calls(pulls: list[big.SynthPull], attempts: list[Attempt]) -> dict[str, int]:
    """GitHub calls one wave of the previous poll-based planner makes for this state.

    Assumptions: it lists every open PR (pages of 100) and every PR's files (pages of 100;
    a file per touched master config); it lists the candidate runs of the last 24 hours
    (pages of 100), each run's artifacts once, and downloads every `klaud-candidate-*`
    artifact of those runs that exists (each attempt here is one artifact; expired or
    missing ones are listed but not downloaded). Claim-ref and capacity reads are left out.
    """
    cutoff = big.NOW - timedelta(hours=24)
    recent = [a for a in attempts if a.completed_at >= cutoff]
    runs = {a.run_id for a in recent}
    files = [len({family.path for family, _ in pull.touches}) for pull in pulls]
    return {
        "pull_listing": math.ceil(len(pulls) / PER_PAGE),
        "pull_files": sum(max(1, math.ceil(n / PER_PAGE)) for n in files),
        "run_listing": max(1, math.ceil(len(runs) / PER_PAGE)),
        "artifact_listing": len(runs),
        "artifact_download": sum(1 for a in recent if a.error not in NO_DOWNLOAD),
    }


# -- main ---------------------------------------------------------------------------------


def ms(values: list[float]) -> str:
    if not values:
        return "none"
    return (f"median {statistics.median(values) * 1000:.1f} ms "
            f"(min {min(values) * 1000:.1f}, max {max(values) * 1000:.1f}, n={len(values)})")


class Turns:
    """When a wave may run: at once when this process is the only one measuring."""

    async def setup_done(self) -> None:
        pass

    async def take(self) -> None:
        pass

    def give_back(self) -> None:
        pass


class PipeTurns(Turns):
    """Turns given by the parent over a pipe, so two processes' waves never overlap."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    async def setup_done(self) -> None:
        self.conn.send("ready")

    async def take(self) -> None:
        if await asyncio.to_thread(self.conn.recv) != "go":
            raise SystemExit("the parent process ended the benchmark")

    def give_back(self) -> None:
        self.conn.send("done")


async def run_benchmark(args: argparse.Namespace, turns: Turns | None = None) -> dict[str, Any]:
    turns = turns or Turns()
    fams = big.families(args.families)
    pulls = big.pulls(fams, args.pulls)
    attempts = list(big.attempts(fams, args.attempts))
    own = sum(pull.author == big.BOT_LOGIN for pull in pulls)
    idle = sum(pull.author != big.BOT_LOGIN and big.NOW - pull.updated_at > timedelta(days=7) for pull in pulls)
    print(f"state: {len(fams)} families in {len(big.CONFIG_PATHS)} master configs; {len(pulls)} open PRs "
          f"({own} Klaud's own, {idle} idle); {len(attempts)} attempts {big.outcome_mix(attempts)}")
    with tempfile.TemporaryDirectory(prefix="klaud-bench-wave-") as tmp:
        started = time.perf_counter()
        await seed_attempts(Path(tmp) / "klaud.db", attempts)
        print(f"wrote {len(attempts)} attempts into the store in {time.perf_counter() - started:.1f} s")

        started = time.perf_counter()
        async with sandbox_stack(Path(tmp), scenario(fams, pulls)) as run:
            print(f"started the server with the sandbox GitHub in {time.perf_counter() - started:.1f} s")
            started = time.perf_counter()
            report = await run.klaud.reconciler.reconcile(big.REPO, 1)
            await run.settle()
            print(f"reconciled {report['after']} in {time.perf_counter() - started:.1f} s "
                  f"with {run.requests['total']} GitHub requests")
            check_overlap_index(run, pulls)
            await turns.setup_done()

            run.reset_requests()
            # Each kind of wave is one turn: its waves follow each other, as alone.
            await turns.take()
            samples = [await dispatched_wave(run) for _ in range(args.waves)]
            await run.settle()
            turns.give_back()
            around = []
            await turns.take()
            for _ in range(args.waves):
                sample, seconds = await direct_wave(run)
                samples.append(sample)
                around.append(seconds)
            turns.give_back()
            requests = run.requests["requests"]
            await turns.take()
            dry = [await dry_plan_seconds(run) for _ in range(args.waves)]
            turns.give_back()
            await turns.take()  # the report, printed in turn too
            print(f"--- {len(fams)} families, {len(pulls)} open PRs, {len(attempts)} attempts")
            wave = await run.klaud.waves.preview(big.REPO)

        reads = [entry for entry in requests if entry["method"] == "GET"]
        writes = Counter(entry["route"] for entry in requests if entry["method"] != "GET")
        print(f"waves triggered by repository_dispatch: {ms([s.seconds for s in samples if s.trigger != 'direct'])}")
        print(f"waves by WaveRunner.run: {ms([s.seconds for s in samples if s.trigger == 'direct'])}; "
              f"timed around the call: {ms(around)}")
        print(f"waves that dispatched candidates: {ms([s.seconds for s in samples if s.dispatched])}; "
              f"that dispatched none: {ms([s.seconds for s in samples if not s.dispatched])}")
        print(f"one dry plan (WaveRunner.preview): {ms(dry)}")
        assert wave is not None
        print(f"the next wave would decide: {dict(Counter(d.decision for d in wave.decisions))}")
        print(f"during the waves: {sum(s.dispatched for s in samples)} candidates dispatched; "
              f"GitHub reads {len(reads)}, writes {dict(writes)}")
        poll = poll_design_calls(pulls, attempts)
        print(f"the previous poll-based planner, per wave: {poll} = {sum(poll.values())} calls "
              "(open PRs and their files in pages of 100; runs of the last 24 h in pages of 100, "
              "one artifact listing per run, one download per artifact that exists)")

    figures = {
        "wave_ms_median": round(statistics.median(s.seconds for s in samples) * 1000, 2),
        "github_reads": len(reads),
        "poll_design_calls": sum(poll.values()),
    }
    turns.give_back()
    return figures


def measure_in_turn(args: argparse.Namespace, conn: Connection) -> None:
    """A child process's benchmark, its waves run when the parent says (`PipeTurns`)."""
    configure_logging("json", logging.WARNING)
    conn.send(asyncio.run(run_benchmark(args, PipeTurns(conn))))


def side_by_side(states: list[argparse.Namespace]) -> list[dict[str, Any]]:
    """Each state's figures, measured by one process per state, their waves taking turns."""
    spawn = multiprocessing.get_context("spawn")
    pipes = [spawn.Pipe() for _ in states]
    children = [spawn.Process(target=measure_in_turn, args=(state, child)) for state, (_, child) in zip(states, pipes, strict=True)]
    for child in children:
        child.start()
    try:
        conns = [parent for parent, _ in pipes]
        for conn in conns:  # every state set up before the first wave: setup is no neighbour to a wave
            expect(conn, "ready")
        for _ in range(4):  # dispatched waves, direct waves, dry plans, the report
            for conn in conns:
                conn.send("go")
                expect(conn, "done")
        return [conn.recv() for conn in conns]
    finally:
        for child in children:
            child.join(timeout=60)
            if child.is_alive():
                child.kill()


def expect(conn: Connection, word: str) -> None:
    got = conn.recv()
    if got != word:
        raise SystemExit(f"a benchmark process answered {got!r} where {word!r} was expected")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--families", type=int, default=2000)
    parser.add_argument("--pulls", type=int, default=1000)
    parser.add_argument("--attempts", type=int, default=100_000)
    parser.add_argument("--waves", type=int, default=15, help="waves per trigger (repository_dispatch, direct)")
    parser.add_argument("--scale", type=int, default=1, help="also run N times the state and compare (N > 1)")
    args = parser.parse_args()
    configure_logging("json", logging.WARNING)
    if args.scale == 1:
        figures = asyncio.run(run_benchmark(args))
    else:
        scaled = argparse.Namespace(**vars(args))
        for name in ("families", "pulls", "attempts"):
            setattr(scaled, name, getattr(args, name) * args.scale)
        print(f"the 1x state and {args.scale} times the state, side by side: their setups interleave, "
              "then each prints its report in turn, 1x first")
        figures, bigger = side_by_side([args, scaled])
        ratio = bigger["wave_ms_median"] / figures["wave_ms_median"]
        print(f"{args.scale}x the state: wave median {bigger['wave_ms_median']} ms, "
              f"{ratio:.2f} times the 1x median (target <= 4.5)")
        figures.update(scale=args.scale, wave_ms_median_scaled=bigger["wave_ms_median"], scale_ratio=round(ratio, 2))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
