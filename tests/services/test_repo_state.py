"""RepoState on its own (bot/services/repo_state.py): read back from the store, its configs and policy, its dispatches, canary and bounded memories."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import pytest

from bot.core.domain import Attempt, CapacityReading, Claim, Dispatch, RetryApproval
from bot.services.repo_state import (
    KEEP_CLOSED_PULLS,
    KEEP_WAVE_RUNS,
    RepoMeta,
    RepoState,
)
from tests.builders import family

NOW = datetime(2026, 11, 30, 8, tzinfo=UTC)
META: dict[str, Any] = msgspec.to_builtins(RepoMeta(installation=1, head_sha="a" * 40))


def test_a_state_read_back_from_the_store_finds_its_families_by_hash() -> None:
    # What this catches: a restarted process not indexing families by hash, so claim refs, Klaud PRs and outcomes of known families look like strangers (claims deleted as strays, receipts unmatched).
    fam = family("dsr1-fp4-b200-sglang")
    state = RepoState.from_records("o/r", {"family": {fam.id: fam}}, META)
    assert state.family_by_hash(fam.family_hash) == fam
    assert state.family_of_candidate(fam.candidate) == fam.id


def test_a_state_read_back_from_the_store_keeps_its_pending_artifact_retries() -> None:
    # What this catches: artifact reads that failed transiently being forgotten at a restart, so that run's outcome is never recorded.
    entry = {"run": {"id": 9, "run_attempt": 1}, "candidate": "c" * 33, "artifact_id": 4,
             "first_failure_at": "2026-11-30T08:00:00Z", "failures": 1, "next_at": "2026-11-30T08:05:00Z"}
    state = RepoState.from_records("o/r", {"artifact-retry": {"9:1:" + "c" * 33: entry}}, META)
    assert state.pending_artifacts == {"9:1:" + "c" * 33: entry}


def test_a_valid_policy_clears_the_error_of_the_invalid_one_before_it() -> None:
    # What this catches: a fixed `.github/klaud.yml` still reported as invalid (state document, check runs) after the push that fixed it.
    state = RepoState("o/r", RepoMeta(installation=1))
    state.set_policy_text("cooldown_hours: 0\n")
    assert state.meta.policy_error is not None
    state.set_policy_text("cooldown_hours: 12\n")
    assert state.meta.policy_error is None and state.policy.cooldown_hours == 12


@pytest.mark.parametrize("refused", ["candidate_inputs: {candidate: target, family: target}", "cooldown_hours: true"])
def test_a_stored_policy_this_version_refuses_stays_in_force_as_read_and_is_reported(refused: str) -> None:
    # What this catches: a policy an earlier version accepted read back as the defaults in
    # silence: `enabled: false` and its other settings dropped, waves dispatching again.
    state = RepoState.from_records("o/r", {}, META | {"policy_text": f"enabled: false\nidle_days: 3\n{refused}\n"})
    assert (state.policy.enabled, state.policy.idle_days) == (False, 3)
    assert state.meta.policy_error is not None and refused.split(":")[0] in state.meta.policy_error
    state.set_policy_text("enabled: false\ncandidate_inputs: {candidate: target}\n")
    assert state.meta.policy_error is None and state.policy.candidate_inputs == {"candidate": "target"}


def test_a_restart_shows_the_error_of_the_file_not_of_the_stored_policy() -> None:
    # The file was edited since an earlier version stored `cooldown_hours: true`: that line
    # fixed, another mistake made. After a restart the error named must be the file's.
    state = RepoState.from_records("o/r", {}, META | {"policy_text": "enabled: false\ncooldown_hours: true\n"})
    state.set_policy_text("enabled: false\ncooldown_hours: 2\nidle_days: 0\n")
    restarted = RepoState.from_records("o/r", {}, msgspec.to_builtins(state.meta))
    assert "idle_days" in (restarted.meta.policy_error or "") and restarted.policy.enabled is False


def test_a_stored_policy_no_version_wrote_dispatches_nothing() -> None:
    state = RepoState.from_records("o/r", {}, META | {"policy_text": "cooldown_hours: 0\n"})  # edited by hand
    assert state.policy.enabled is False and "no wave dispatches" in (state.meta.policy_error or "")


def test_a_config_read_again_clears_its_config_error() -> None:
    # What this catches: a master config that parses again still listed under config_errors after the push that fixed it.
    state = RepoState("o/r", RepoMeta(installation=1))
    path = "configs/x-master.yaml"
    state.meta.config_errors[path] = "line 3: not a mapping"
    state.replace_families(path, [family("k1", path=path)], None)
    assert path not in state.meta.config_errors


def test_removing_a_config_deletes_its_families_from_the_store() -> None:
    # What this catches: a deleted master config whose families stay in the store, so they come back (and get planned) after a restart.
    state = RepoState("o/r", RepoMeta(installation=1))
    path = "configs/x-master.yaml"
    fams = [family("k1", path=path), family("k2", path=path)]
    state.replace_families(path, fams, None)
    change = state.remove_config(path)
    assert {(kind, key) for _, kind, key in change.deletes} >= {("family", f.id) for f in fams}
    assert list(state.catalog) == []


def test_removing_a_config_drops_the_retry_approvals_of_its_candidates() -> None:
    # What this catches: `/klaud retry` approvals of families whose config was deleted kept in memory and in the store for good.
    state = RepoState("o/r", RepoMeta(installation=1))
    path = "configs/x-master.yaml"
    fam = family("k1", path=path)
    state.replace_families(path, [fam], None)
    state.approve_retry(RetryApproval(fam.candidate, "bob", NOW))
    change = state.remove_config(path)
    assert state.retries == {}
    assert ("o/r", "retry", fam.candidate) in change.deletes


def test_the_family_of_a_dispatched_candidate_is_known_after_its_config_is_gone() -> None:
    # What this catches: an in-flight candidate whose family left the configs no longer matched to its dispatch, so its outcome never releases the claim and dispatch.
    state = RepoState("o/r", RepoMeta(installation=1))
    path = "configs/x-master.yaml"
    fam = family("k1", path=path)
    state.replace_families(path, [fam], None)
    state.add_dispatch(Dispatch(fam.id, fam.candidate, 1, "a" * 40, NOW))
    state.remove_config(path)
    assert state.family_of_candidate(fam.candidate) == fam.id


def test_closed_pulls_are_remembered_up_to_a_bound_newest_first() -> None:
    # What this catches: the memory of closed PRs (kept against late events) growing without bound, in memory and in the repository's one record.
    state = RepoState("o/r", RepoMeta(installation=1))
    for number in range(1, KEEP_CLOSED_PULLS + 6):
        state.remove_pull(number, NOW + timedelta(seconds=number))
    assert len(state.meta.closed_pulls) == KEEP_CLOSED_PULLS
    assert "1" not in state.meta.closed_pulls and str(KEEP_CLOSED_PULLS + 5) in state.meta.closed_pulls


def test_an_outcome_of_a_families_older_candidate_leaves_its_newer_candidate_in_flight() -> None:
    # What this catches: a late outcome of a family's previous image (older candidate) ending the dispatch and claim of its current candidate, whose run is still going, so the family is dispatched twice.
    state = RepoState("o/r", RepoMeta(installation=1))
    path = "configs/x-master.yaml"
    old = family("k1", "img:1", path=path)
    new = family("k1", "img:2", path=path)
    state.replace_families(path, [new], None)
    state.add_claim(Claim(new.id, new.candidate, 2, "klaud/claim-x", NOW))
    state.add_dispatch(Dispatch(new.id, new.candidate, 2, "a" * 40, NOW, run_id=20))
    late = Attempt(old.candidate, old.id, 10, 1, "a" * 40, NOW, True, "failed", "targeted", None, None, None)
    state.record_attempt(late)
    claim, ended, _ = state.release_for(late, run_known=False)
    assert (claim, ended) == (None, None)
    assert state.dispatches[new.id].run_id == 20 and state.claims[new.id].candidate == new.candidate


def test_a_canary_released_without_an_outcome_can_be_armed_again() -> None:
    # What this catches: a paused repository whose canary run vanished (dispatch released with no outcome) refusing every later push or `/klaud resume`, so it stays paused for good.
    state = RepoState("o/r", RepoMeta(installation=1))
    state.meta.pause = {"reason": "3 runs failed in get-jobs", "since": "2026-11-30T08:00:00Z"}
    assert state.arm_canary()
    state.canary_dispatched("c" * 33, 4)
    state.add_dispatch(Dispatch("configs/x-master.yaml:k1", "c" * 33, 4, "a" * 40, NOW))
    assert not state.arm_canary()  # its run is still going
    state.drop_dispatch("configs/x-master.yaml:k1")  # released without an outcome
    assert state.arm_canary() and state.canary_armed


def test_an_outcome_naming_its_family_releases_the_claim_after_the_family_left_the_configs() -> None:
    # What this catches: the claim of a family removed from the configs never released by its run's outcome, although the outcome names the family (the slot stays taken).
    state = RepoState("o/r", RepoMeta(installation=1))
    path = "configs/x-master.yaml"
    fam = family("k1", path=path)
    state.replace_families(path, [fam], None)
    state.add_claim(Claim(fam.id, fam.candidate, 2, "klaud/claim-x", NOW))
    state.remove_config(path)
    done = Attempt(fam.candidate, fam.id, 10, 1, "a" * 40, NOW, True, "failed", "targeted", None, None, None)
    state.record_attempt(done)
    claim, _, _ = state.release_for(done, run_known=False)
    assert claim is not None and fam.id not in state.claims


def test_a_family_added_to_the_configs_is_planned_by_the_next_wave() -> None:
    # What this catches: a stale cached priority order after the catalog changes, so a family added by a push is never planned (and a removed one still is).
    state = RepoState("o/r", RepoMeta(installation=1, head_sha="a" * 40))
    path = "configs/x-master.yaml"
    first = family("k1", path=path)
    capacity = CapacityReading(eligible=frozenset({"b200-nb"}), known=frozenset({"b200-nb"}), at=NOW)
    state.replace_families(path, [first], None)
    assert [d.family for d in state.plan(1, NOW, capacity).decisions] == [first.id]
    added = family("k2", path=path, line_start=6, line_end=10)
    state.replace_families(path, [first, added], None)
    assert sorted(d.family for d in state.plan(2, NOW, capacity).decisions) == sorted([first.id, added.id])
    state.remove_config(path)
    assert [d.family for d in state.plan(3, NOW, capacity).decisions] == []


def paused_with_canary(candidate: str) -> RepoState:
    state = RepoState("o/r", RepoMeta(installation=1))
    state.meta.pause = {"reason": "3 runs failed in get-jobs", "since": "2026-11-30T08:00:00Z"}
    state.arm_canary()
    state.canary_dispatched(candidate, 4)
    state.note_dispatched(4, 1)
    return state


def test_a_canary_that_fails_before_an_outcome_keeps_dispatch_paused() -> None:
    # What this catches: a paused repository resuming dispatch although its canary run failed again before producing an outcome.
    state = paused_with_canary("c" * 33)
    dispatch = Dispatch("configs/x-master.yaml:k1", "c" * 33, 4, "a" * 40, NOW, run_id=40)
    failed = Attempt("c" * 33, dispatch.family, 40, 1, "a" * 40, NOW, False, None, None, None, None, "run-failed")
    assert state.note_finished(dispatch, failed, NOW) is None
    assert state.meta.pause is not None and state.blocked() is not None


def test_another_runs_outcome_while_paused_leaves_the_canary_alone() -> None:
    # What this catches: an older run's outcome arriving while a canary runs being taken for the canary's, so the canary's own outcome is no longer recognised and dispatch stays paused.
    state = paused_with_canary("c" * 33)
    other = Dispatch("configs/x-master.yaml:k2", "d" * 33, 3, "a" * 40, NOW, run_id=30)
    late = Attempt("d" * 33, other.family, 30, 1, "a" * 40, NOW, True, "failed", "targeted", None, None, None)
    state.note_finished(other, late, NOW)
    assert state.meta.canary is not None and state.meta.canary["candidate"] == "c" * 33
    canary = Dispatch("configs/x-master.yaml:k1", "c" * 33, 4, "a" * 40, NOW, run_id=40)
    done = Attempt("c" * 33, canary.family, 40, 1, "a" * 40, NOW, True, "failed", "targeted", None, None, None)
    assert state.note_finished(canary, done, NOW) == "resumed" and state.meta.pause is None


def test_run_endings_are_kept_for_a_bounded_number_of_waves() -> None:
    # What this catches: the per-wave run endings (for the pause rule) growing by one entry per wave for good, in memory and in the repository's record.
    state = RepoState("o/r", RepoMeta(installation=1))
    for wave in range(1, KEEP_WAVE_RUNS + 11):
        state.note_dispatched(wave, 2)
    assert sorted(map(int, state.meta.wave_runs)) == list(range(11, KEEP_WAVE_RUNS + 11))
