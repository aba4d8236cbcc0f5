"""The incremental verdict cache against a restart: a RepoState rebuilt from the same records
(what a restart, or another replica, would plan from) decides the same at any time; and
two runs failing in a row cool the candidate down for the full window after the second
(found by an audit of time: the cached verdict said cooldown, a restart said selected)."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta

import msgspec
import pytest

from bench import bigstate as big
from bot.core.cooldown import cooldown
from bot.core.domain import (
    CapacityReading,
    Claim,
    Dispatch,
    Hold,
    RetryApproval,
)
from bot.services.repo_state import RepoMeta, RepoState
from tests.builders import attempt, run_failed
from tests.services.test_incremental_plan import catalogued

NOW = big.NOW


def small_state(count: int = 12) -> tuple[RepoState, list[big.SynthFamily]]:
    fams = big.families(count)
    return catalogued(fams, RepoMeta(installation=1, head_sha="a" * 40)), fams


def all_free() -> CapacityReading:
    known = frozenset(big.clusters())
    return CapacityReading(eligible=known, known=known, at=NOW)


def records_of(state: RepoState) -> dict[str, dict[str, object]]:
    """What the store would hold for `state` (the same records a restart loads)."""
    return {
        "family": {f.id: f for f in state.catalog},
        "pull": {p.number: p for p in state.overlap.prs()},
        "attempt": {f"{a.candidate}:{a.run_id}:{a.run_attempt}": a for a in state.ledger.all()},
        "hold": dict(state.holds),
        "retry": dict(state.retries),
        "claim": dict(state.claims),
        "dispatch": dict(state.dispatches),
    }


def fresh(state: RepoState) -> RepoState:
    """A RepoState rebuilt from `state`'s records: no verdict cached (the oracle)."""
    meta = msgspec.to_builtins(state.meta)
    return RepoState.from_records(state.name, records_of(state), meta)


def decision_of(wave, family_id: str):  # type: ignore[no-untyped-def]
    return next(d for d in wave.decisions if d.family == family_id)


def hours(h: float) -> timedelta:
    return timedelta(hours=h)



def test_repeated_run_failure_cached_verdict_outlives_the_first_failure_leaving_the_window() -> None:
    state, _ = small_state()
    family = next(iter(state.catalog))
    cand = family.candidate
    # Two runs in a row failed before an outcome: 6 h apart.
    state.record_attempt(run_failed(cand, family.id, 1, NOW))
    state.record_attempt(run_failed(cand, family.id, 2, NOW + hours(6)))
    live_wave = state.plan(5, NOW + hours(7), all_free())
    assert decision_of(live_wave, family.id).decision == "cooldown"
    # 25 h after the first failure: no event since. The live state reuses its verdict...
    later = NOW + hours(25)
    cached = decision_of(state.plan(6, later, all_free()), family.id)
    # ...while the same records loaded afresh (a restart) decide from scratch.
    scratch = decision_of(fresh(state).plan(6, later, all_free()), family.id)
    assert (cached.decision, cached.reason) == (scratch.decision, scratch.reason), (
        f"cached: {cached.decision} ({cached.reason}) / fresh: {scratch.decision} ({scratch.reason})"
    )


def test_repeated_run_failure_cooldown_lasts_cooldown_hours_after_the_second_failure() -> None:
    state, _ = small_state()
    family = next(iter(state.catalog))
    cand = family.candidate
    attempts = [run_failed(cand, family.id, 1, NOW), run_failed(cand, family.id, 2, NOW + hours(6))]
    first = cooldown(attempts, cand, NOW + hours(7), 24, retry_approved_at=None)
    assert not first.eligible and first.until == NOW + hours(30)  # "cooling down until +30 h"
    # Still before the promised end (+30 h), the rule says eligible as soon as the FIRST
    # failure leaves the 24 h window (+24 h): the second failure alone is "once".
    later = cooldown(attempts, cand, NOW + hours(25), 24, retry_approved_at=None)
    assert not later.eligible, f"eligible at +25 h although it promised cooldown until +30 h: {later.reason}"


def event(state, fams, rng, now, *, run_failures: bool) -> None:  # type: ignore[no-untyped-def]
    family = rng.choice(list(state.catalog))
    cand = family.candidate
    what = rng.randrange(12)
    skew = timedelta(minutes=rng.choice([-90, -3, 0, 0, 2, 45, 600]))  # GitHub clock vs ours
    if what in (0, 1, 2):
        outcome = rng.choice(["failed", "capacity-deferred", "incompatible", None])
        at = now + skew - timedelta(hours=rng.choice([0, 1, 5, 23.9, 24, 30, 200]))
        error = None if outcome else rng.choice(["artifact-expired", "download-failed"])
        state.record_attempt(attempt(cand, family.id, rng.randrange(10**6), at, outcome=outcome, error=error))
    elif what == 3 and run_failures:
        at = now + skew - timedelta(hours=rng.choice([0, 2, 10, 20]))
        state.record_attempt(run_failed(cand, family.id, rng.randrange(10**6), at))
        state.record_attempt(run_failed(cand, family.id, rng.randrange(10**6), at + timedelta(hours=rng.choice([1, 6]))))
    elif what == 4:
        if rng.random() < 0.3:
            state.hold(Hold(family.id, "alice", "x", now))
        else:
            for held in list(state.holds):
                state.unhold(held, now)
    elif what == 5:
        state.unhold(family.id, now)
    elif what == 6:
        state.approve_retry(RetryApproval(cand, "bob", now))
    elif what == 7 and rng.random() < 0.4:
        state.add_dispatch(Dispatch(family.id, cand, 3, "a" * 40, now + skew - timedelta(hours=rng.uniform(0, 14))))
    elif what == 8:
        state.drop_dispatch(family.id)
        state.drop_claim(family.id)
    elif what == 9 and rng.random() < 0.3:
        state.add_claim(Claim(family.id, cand, None, "klaud/claim-x", now))
    elif what == 10:
        pull = big.random_pull(fams, rng.randrange(1, 30), rng)
        updated = now + skew - timedelta(days=rng.uniform(0, 8))
        state.upsert_pull(big.pull_request(replace(pull, updated_at=updated)))
    else:
        hours_ = rng.choice([1, 6, 24, 48, 168])
        state.set_policy_text(f"cooldown_hours: {hours_}\nidle_days: {rng.choice([1, 7])}\nclaim_ttl_hours: {rng.choice([1, 12])}\n")


def run(seed: int, *, run_failures: bool) -> None:
    rng = random.Random(seed)
    state, fams = small_state(24)
    now = NOW
    for step in range(150):
        for _ in range(rng.randrange(3)):
            event(state, fams, rng, now, run_failures=run_failures)
        at = now if rng.random() < 0.8 else now - timedelta(hours=rng.choice([1, 30]))  # a preview --at
        wave = 5 + step
        cached = state.plan(wave, at, all_free())
        scratch = fresh(state).plan(wave, at, all_free())
        for a, b in zip(cached.decisions, scratch.decisions, strict=True):
            assert (a.family, a.decision, a.reason, a.until) == (b.family, b.decision, b.reason, b.until), (
                f"seed {seed} step {step} at {at}: cached {a.decision} ({a.reason}) until {a.until}"
                f" / fresh {b.decision} ({b.reason}) until {b.until}"
            )
        now += timedelta(hours=rng.choice([0.0, 0.25, 1.0, 5.0, 13.0, 24.0]))


@pytest.mark.parametrize("seed", range(5))
def test_cache_equals_fresh_without_run_failures(seed: int) -> None:
    run(seed, run_failures=False)


@pytest.mark.parametrize("seed", range(5))
def test_cache_equals_fresh_with_run_failures(seed: int) -> None:
    run(seed, run_failures=True)
