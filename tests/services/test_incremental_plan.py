"""Incremental planning decides exactly as the pure planner, whatever happened in between.

A live repository reuses each family's verdict until an event touches the family or time
changes it (bot/services/repo_state.py); the pure planner computes everything from a
snapshot (bot/core/planner.py). Random events at random times must never make them differ.
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta

import pytest

from bench import bigstate as big
from bot.core.catalog import parse_runners, read_master
from bot.core.cooldown import ATTEMPT_MEMORY
from bot.core.domain import (
    Attempt,
    CapacityReading,
    Claim,
    Dispatch,
    Hold,
    RetryApproval,
)
from bot.core.planner import plan, verdict
from bot.services import repo_state
from bot.services.repo_state import RepoMeta, RepoState
from tests.builders import run_failed

FAMILIES = 150


def catalogued(fams: list[big.SynthFamily], meta: RepoMeta) -> RepoState:
    """A state whose catalog holds `fams`, read from their master configs and runners.yaml."""
    state = RepoState(big.REPO, meta)
    runners = parse_runners(big.runners_yaml())
    state.meta.runners = runners.document()
    for path, text in big.master_configs(fams).items():
        state.replace_families(path, list(read_master(path, text, runners).families), None)
    return state


def built(seed: int) -> tuple[RepoState, list[big.SynthFamily], random.Random]:
    rng = random.Random(seed)
    fams = big.families(FAMILIES)
    state = catalogued(fams, RepoMeta(installation=1))
    for attempt in big.attempts(fams, 600, seed=seed):
        state.record_attempt(attempt)
    for pull in big.pulls(fams, 60, seed=seed):
        state.upsert_pull(big.pull_request(pull))
    return state, fams, rng


def reading(rng: random.Random) -> CapacityReading:
    known = frozenset(big.clusters())
    busy = {c for c in known if rng.random() < 0.2}
    return CapacityReading(eligible=known - busy, known=known, at=big.NOW)


def random_event(state: RepoState, fams: list[big.SynthFamily], rng: random.Random, now) -> None:  # type: ignore[no-untyped-def]
    family = rng.choice(list(state.catalog))
    what = rng.randrange(9)
    if what == 0:
        state.hold(Hold(family.id, "alice", "x", now))
    elif what == 1:
        state.unhold(family.id, now)
    elif what == 2:
        outcome = rng.choice(["failed", "capacity-deferred", None])
        state.record_attempt(Attempt(
            family.candidate, family.id, rng.randrange(10**6), 1, "a" * 40, now - timedelta(hours=rng.uniform(0, 30)),
            outcome is not None, outcome, "targeted" if outcome else None, None, None,  # type: ignore[arg-type]
            None if outcome else rng.choice(["run-failed", "artifact-expired"]),
        ))
    elif what == 3:
        state.approve_retry(RetryApproval(family.candidate, "bob", now))
    elif what == 4:
        state.add_claim(Claim(family.id, family.candidate, None, "klaud/claim-x", now))
    elif what == 5:
        state.drop_claim(family.id)
    elif what == 6:
        state.add_dispatch(Dispatch(family.id, family.candidate, 3, "a" * 40, now - timedelta(hours=rng.uniform(0, 20))))
    elif what == 7:
        state.drop_dispatch(family.id)
    else:
        pull = big.random_pull(fams, rng.randrange(1, 80), rng)
        updated = now - timedelta(days=rng.uniform(0, 10))
        state.upsert_pull(big.pull_request(replace(pull, updated_at=updated)))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_incremental_plans_equal_the_pure_planner_after_random_events(seed: int) -> None:
    state, fams, rng = built(seed)
    now = big.NOW
    capacity = reading(rng)
    for step in range(60):
        for _ in range(rng.randrange(4)):
            random_event(state, fams, rng, now)
        wave = 5 + step
        incremental = state.plan(wave, now, capacity)
        pure = plan(state.snapshot(wave, now), state.policy, capacity, now)
        assert incremental == pure, f"step {step}"
        # Time moves on (cooldowns end, attempts leave the window, PRs go idle).
        now += timedelta(hours=rng.choice([0.0, 0.5, 3.0, 13.0]))
        if rng.random() < 0.2:
            capacity = reading(rng)


def test_an_untouched_family_is_not_decided_again(monkeypatch: pytest.MonkeyPatch) -> None:
    state, _, rng = built(9)
    capacity = reading(rng)
    state.plan(1, big.NOW, capacity)
    decided: list[str] = []

    def counted(family, *args):  # type: ignore[no-untyped-def]
        decided.append(family.id)
        return verdict(family, *args)

    monkeypatch.setattr(repo_state, "verdict", counted)
    family = next(iter(state.catalog))
    state.hold(Hold(family.id, "alice", "x", big.NOW))
    state.unhold(family.id, big.NOW)
    state.plan(2, big.NOW, capacity)
    assert decided == [family.id]  # only the family the hold touched


def test_a_run_failure_days_after_the_first_one_cools_the_candidate_down() -> None:
    # Capacity kept the candidate waiting for days after its first run failed: the second is
    # still the second in a row (DESIGN §4), however far back the planner must look for it.
    state, _, rng = built(4)
    family = next(iter(state.catalog))
    now = big.NOW
    for run_id, completed in ((901, now - timedelta(days=5)), (902, now - timedelta(hours=2))):
        state.record_attempt(run_failed(family.candidate, family.id, run_id, completed))

    [decision] = [d for d in state.plan(7, now, reading(rng)).decisions if d.family == family.id]

    assert decision.decision == "cooldown" and decision.until == now - timedelta(hours=2) + timedelta(hours=24)


@pytest.mark.parametrize("apart", [ATTEMPT_MEMORY - timedelta(hours=22), ATTEMPT_MEMORY + timedelta(hours=1)])
def test_run_failures_further_apart_than_memory_keeps_a_cooldown_agree_everywhere(apart: timedelta) -> None:
    # The first of the pair leaves memory (a restart, the trimming of old attempts) while its
    # cooldown would run: the planner's cached verdict, a fresh plan and `/klaud status` must
    # say the same, now and two hours later.
    state, _, rng = built(5)
    family = next(iter(state.catalog))
    now, capacity = big.NOW, reading(rng)
    state.record_attempt(run_failed(family.candidate, family.id, 901, now - timedelta(hours=1) - apart))
    state.record_attempt(run_failed(family.candidate, family.id, 902, now - timedelta(hours=1)))
    for at in (now, now + timedelta(hours=2)):
        [decision] = [d for d in state.plan(7, at, capacity).decisions if d.family == family.id]
        [pure] = [d for d in plan(state.snapshot(7, at), state.policy, capacity, at).decisions if d.family == family.id]
        shown = state.cooldown_of(family.candidate, at)
        assert decision == pure and (decision.decision == "cooldown") == (not shown.eligible), (at, decision)
