"""The wave ladder (DESIGN §4 "A wave") on hand-built snapshots."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import TypeAdapter

from bot.core.domain import (
    Attempt,
    Blocked,
    CapacityReading,
    Claim,
    Dispatch,
    Family,
    Hold,
    Overlap,
    RetryApproval,
    TouchKind,
    candidate_id,
    claim_ref,
)
from bot.core.planner import Facts, Snapshot, plan, verdict
from bot.core.policy import Policy

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
BASE = "4f1c2a9e0b7d3c5a8e6f9b1d2c3a4e5f6a7b8c9d"
OLD_BASE = "0" * 40
OPEN = CapacityReading(
    eligible=frozenset({"b200-nscale", "h200-nb"}),
    known=frozenset({"b200-nscale", "h200-nb", "b200-dgxc"}),
    at=NOW,
)


def family(
    key: str,
    *,
    changed_days_ago: float | None = 10,
    clusters: tuple[str, ...] = ("b200-nscale",),
    image: str = "lmsysorg/sglang:v0.5.16-cu130",
    unresolved: tuple[str, ...] = (),
) -> Family:
    return Family(
        id=f"configs/nvidia-master.yaml:{key}",
        path="configs/nvidia-master.yaml",
        key=key,
        image=image,
        runner="b200",
        clusters=clusters,
        model_prefix="dsr1",
        precision="fp4",
        framework="sglang",
        line_start=1,
        line_end=20,
        image_changed_at=(
            None if changed_days_ago is None else NOW - timedelta(days=changed_days_ago)
        ),
        unresolved=unresolved,
    )


def attempt(
    fam: Family, outcome: str | None, hours_ago: float, *, base: str = BASE, run_id: int = 101
) -> Attempt:
    return Attempt(
        candidate=fam.candidate,
        family=fam.id,
        run_id=run_id,
        run_attempt=1,
        base=base,
        completed_at=NOW - timedelta(hours=hours_ago),
        verified=outcome is not None,
        outcome=outcome,  # type: ignore[arg-type]
        phase="targeted" if outcome else None,
        pull_request=None,
        reason_code=None,
        error=None if outcome else "artifact-expired",
    )


@dataclass
class OpenPull:
    """What the overlap index knows of one open human PR."""

    number: int
    updated_days_ago: float = 0
    touches: dict[str, TouchKind] = field(default_factory=dict)  # family id -> kind


def overlaps_at(pulls: list[OpenPull], families: list[Family], now: datetime = NOW, idle_days: int = 7) -> dict[str, list[Overlap]]:
    """What the overlap index answers at `now`: idle PRs and untouched families never overlap."""
    found: dict[str, list[Overlap]] = {}
    for fam in families:
        for pull in pulls:
            updated_at = NOW - timedelta(days=pull.updated_days_ago)
            kind = pull.touches.get(fam.id)
            if kind is None or now - updated_at >= timedelta(days=idle_days):
                continue
            what = "image line" if kind == "image" else "flags"
            reason = f"PR #{pull.number} changes this family's {what}"
            found.setdefault(fam.id, []).append(Overlap(pull.number, kind, reason))
    return found


def attempts_by_candidate(attempts: list[Attempt]) -> dict[str, list[Attempt]]:
    found: dict[str, list[Attempt]] = {}
    for item in attempts:
        found.setdefault(item.candidate, []).append(item)
    return found


def snapshot(
    families: list[Family],
    *,
    pulls: list[OpenPull] | None = None,
    attempts: list[Attempt] | None = None,
    wave: int = 17,
    **state: Any,
) -> Snapshot:
    return Snapshot(
        repo="acme/bench",
        base=BASE,
        wave=wave,
        families=families,
        overlaps=overlaps_at(pulls or [], families),
        attempts=attempts_by_candidate(attempts or []),
        holds=state.get("holds", {}),
        retries=state.get("retries", {}),
        claims=state.get("claims", {}),
        dispatches=state.get("dispatches", {}),
        klaud_prs=state.get("klaud_prs", {}),
        blocked=state.get("blocked"),
        canary=state.get("canary", False),
        settled=state.get("settled", {}),
    )


def decide(
    snap: Snapshot,
    *,
    policy: Policy | None = None,
    capacity: CapacityReading = OPEN,
    now: datetime = NOW,
) -> dict[str, Any]:
    """Decisions by family key."""
    wave = plan(snap, policy or Policy(), capacity, now)
    return {d.family.split(":", 1)[1]: d for d in wave.decisions}


def dispatch(fam: Family, hours_ago: float, *, wave: int = 16, **changes: Any) -> Dispatch:
    return Dispatch(
        family=fam.id,
        candidate=fam.candidate,
        wave=wave,
        base=BASE,
        at=NOW - timedelta(hours=hours_ago),
        run_id=555,
        **changes,
    )


def claim(fam: Family, wave: int | None = 16) -> Claim:
    return Claim(
        family=fam.id,
        candidate=fam.candidate,
        wave=wave,
        ref=claim_ref(fam.id),
        at=NOW - timedelta(hours=1),
    )


A = family("dsr1-fp4-b200-sglang")


# --- order ------------------------------------------------------------------------------


def test_stalest_image_first_unknown_first_ties_by_candidate_id() -> None:
    fresh = family("fresh", changed_days_ago=1)
    old = family("old", changed_days_ago=30)
    unknown = family("unknown", changed_days_ago=None)
    tie_a = family("tie-a", changed_days_ago=5)
    tie_b = family("tie-b", changed_days_ago=5)
    assert tie_b.candidate < tie_a.candidate  # so the tie is not broken by family id
    wave = plan(snapshot([fresh, tie_a, old, tie_b, unknown]), Policy(), OPEN, NOW)
    assert [d.family for d in wave.decisions] == [unknown.id, old.id, tie_b.id, tie_a.id, fresh.id]


def test_same_inputs_give_the_same_wave_whatever_the_family_order() -> None:
    families = [family(f"fam-{i}", changed_days_ago=i % 4) for i in range(30)]
    documents = []
    for seed in range(3):
        shuffled = families[:]
        random.Random(seed).shuffle(shuffled)
        documents.append(plan(snapshot(shuffled), Policy(), OPEN, NOW).document())
    assert documents[0] == documents[1] == documents[2]


# --- each rung --------------------------------------------------------------------------


def test_selected_when_nothing_stands_in_the_way() -> None:
    decision = decide(snapshot([A]))["dsr1-fp4-b200-sglang"]
    assert decision.decision == "selected"
    assert decision.candidate == candidate_id(A.id, A.image)
    assert decision.clusters == ("b200-nscale",)
    assert decision.until is None and decision.pull_requests == ()
    assert "cluster b200-nscale has capacity" in decision.reason


def test_held_names_who_and_why() -> None:
    hold = Hold(A.id, "alice", "driver upgrade on b200", NOW - timedelta(hours=2))
    decision = decide(snapshot([A], holds={A.id: hold}))["dsr1-fp4-b200-sglang"]
    assert decision.decision == "held"
    assert "held by alice" in decision.reason and "@" not in decision.reason and "driver upgrade on b200" in decision.reason
    assert decision.clusters == ("b200-nscale",)


def test_in_flight_until_the_claim_ttl_runs_out() -> None:
    running = dispatch(A, hours_ago=11)
    decision = decide(snapshot([A], dispatches={A.id: running}))["dsr1-fp4-b200-sglang"]
    assert decision.decision == "in-flight"
    assert decision.until == running.at + timedelta(hours=12)
    assert "wave 16" in decision.reason


def test_a_dispatch_past_its_claim_ttl_stays_in_flight_until_its_run_is_read() -> None:
    # The TTL only says when Klaud reads the run; it never makes the candidate selectable
    # again while its run may still be queued (which would dispatch it twice).
    stale = dispatch(A, hours_ago=13)
    decision = decide(snapshot([A], dispatches={A.id: stale}))[A.key]
    assert decision.decision == "in-flight"
    assert "reads the run before the next wave" in decision.reason


def test_a_run_found_running_at_the_check_stays_in_flight_until_the_next_check() -> None:
    checked = dispatch(A, hours_ago=20, run_status="in_progress", checked_at=NOW - timedelta(hours=7))
    decision = decide(snapshot([A], dispatches={A.id: checked}))[A.key]
    assert decision.decision == "in-flight"
    assert decision.until == checked.checked_at + timedelta(hours=12)
    assert "still in progress at" in decision.reason


def test_claimed_by_a_claim_ref_of_another_wave() -> None:
    decision = decide(snapshot([A], claims={A.id: claim(A, wave=16)}))[A.key]
    assert decision.decision == "claimed"
    assert claim_ref(A.id) in decision.reason and "wave 16" in decision.reason


def test_claim_ref_not_made_by_a_wave_still_claims() -> None:
    decision = decide(snapshot([A], claims={A.id: claim(A, wave=None)}))[A.key]
    assert decision.decision == "claimed"
    assert "no Klaud wave" in decision.reason


def test_claim_made_by_this_wave_does_not_block_it() -> None:
    assert decide(snapshot([A], wave=17, claims={A.id: claim(A, wave=17)}))[A.key].decision == (
        "selected"
    )


def test_claimed_by_an_open_klaud_pr() -> None:
    decision = decide(snapshot([A], klaud_prs={A.id: 4100}))[A.key]
    assert decision.decision == "claimed"
    assert decision.pull_requests == (4100,)
    assert "#4100" in decision.reason


def test_overlap_lists_pull_requests_and_joins_reasons() -> None:
    pulls = [
        OpenPull(4012, touches={A.id: "image"}),
        OpenPull(3990, touches={A.id: "flags"}),
    ]
    decision = decide(snapshot([A], pulls=pulls))[A.key]
    assert decision.decision == "overlap"
    assert decision.pull_requests == (3990, 4012)
    assert decision.reason == (
        "PR #3990 changes this family's flags; PR #4012 changes this family's image line"
    )


def test_capacity_names_the_busy_cluster() -> None:
    busy = family("busy", clusters=("b200-dgxc",))
    decision = decide(snapshot([busy]))["busy"]
    assert decision.decision == "capacity"
    assert decision.reason == "cluster b200-dgxc is busy"
    assert decision.clusters == ("b200-dgxc",)


def test_runner_without_clusters_is_never_selected_and_says_which_runner() -> None:
    nowhere = family("nowhere", clusters=())
    decision = decide(snapshot([nowhere]))["nowhere"]
    assert decision.decision == "capacity"
    assert decision.reason == f"runner {nowhere.runner} targets no cluster declared in runners.yaml"
    unresolved = family("stray", clusters=(), unresolved=("b200-cw_00",))
    assert "lists b200-cw_00, which names no cluster declared in runners.yaml" in decide(snapshot([unresolved]))["stray"].reason


# --- precedence -------------------------------------------------------------------------


def test_ladder_precedence_peeled_one_rung_at_a_time() -> None:
    busy = family("busy", clusters=("b200-dgxc",))
    leader = family("leader", changed_days_ago=None)  # takes the wave's only slot first
    state: dict[str, Any] = {
        "holds": {busy.id: Hold(busy.id, "alice", "", NOW)},
        "dispatches": {busy.id: dispatch(busy, hours_ago=1)},
        "claims": {busy.id: claim(busy)},
    }
    attempts = [attempt(busy, "failed", hours_ago=1)]
    pulls = [OpenPull(4012, touches={busy.id: "image"})]
    policy = Policy(max_candidates_per_wave=1)

    def rung(target: Family = busy) -> str:
        snap = snapshot([leader, target], pulls=pulls, attempts=attempts, **state)
        return decide(snap, policy=policy)["busy"].decision

    assert rung() == "held"
    del state["holds"]
    assert rung() == "in-flight"
    del state["dispatches"]
    assert rung() == "claimed"
    del state["claims"]
    assert rung() == "cooldown"
    attempts.clear()
    assert rung() == "overlap"
    pulls.clear()
    assert rung() == "capacity"
    free = replace(busy, clusters=("b200-nscale",))
    assert rung(free) == "cap"
    policy = Policy(max_candidates_per_wave=2)
    assert rung(free) == "selected"


def test_a_snapshot_is_plain_data_that_replays_to_the_same_wave() -> None:
    # A wave's inputs can be stored and replayed: the snapshot survives a JSON round trip
    # and the replayed plan decides exactly as the original.
    families = [family(f"fam-{i}") for i in range(6)]
    snap = snapshot(
        families,
        pulls=[OpenPull(41, touches={families[1].id: "image"})],
        attempts=[attempt(families[2], "failed", hours_ago=1)],
        holds={families[3].id: Hold(families[3].id, "alice", "x", NOW)},
    )
    adapter = TypeAdapter(Snapshot)
    replayed = adapter.validate_json(adapter.dump_json(snap))
    assert plan(replayed, Policy(max_candidates_per_wave=2), OPEN, NOW) == plan(
        snap, Policy(max_candidates_per_wave=2), OPEN, NOW
    )


def test_cap_after_max_candidates_per_wave_skipping_ineligible_families() -> None:
    families = [family(f"fam-{i}", changed_days_ago=10 - i) for i in range(5)]
    families[1] = replace(families[1], clusters=("b200-dgxc",))  # busy: not counted
    decisions = decide(snapshot(families), policy=Policy(max_candidates_per_wave=2))
    assert [decisions[f"fam-{i}"].decision for i in range(5)] == [
        "selected",
        "capacity",
        "selected",
        "cap",
        "cap",
    ]
    assert "max_candidates_per_wave 2" in decisions["fam-3"].reason


def test_max_in_flight_counts_the_dispatches_in_flight() -> None:
    running = [family(f"run-{i}") for i in range(3)]
    waiting = [family(f"new-{i}", changed_days_ago=20 - i) for i in range(3)]
    dispatches = {f.id: dispatch(f, hours_ago=1) for f in running}
    snap = snapshot(running + waiting, dispatches=dispatches)
    decisions = decide(snap, policy=Policy(max_in_flight=4, max_candidates_per_wave=5))
    assert [decisions[f"new-{i}"].decision for i in range(3)] == ["selected", "cap", "cap"]
    assert "3 candidates in flight" in decisions["new-1"].reason
    assert all(decisions[f"run-{i}"].decision == "in-flight" for i in range(3))


def test_max_in_flight_also_counts_claims_without_a_known_dispatch() -> None:
    """A replica that died mid-wave dispatched candidates it never stored: the next owner
    sees only their claim refs. They count as in flight (once each, with or without a
    dispatch), so the cap still limits the GPU work GitHub was asked for."""
    dispatched = family("run-0")
    foreign = [family(f"elsewhere-{i}") for i in range(2)]
    waiting = [family(f"new-{i}", changed_days_ago=20 - i) for i in range(3)]
    claims = {f.id: claim(f, wave=None) for f in foreign} | {dispatched.id: claim(dispatched)}
    snap = snapshot([dispatched, *foreign, *waiting], claims=claims, dispatches={dispatched.id: dispatch(dispatched, hours_ago=1)})
    decisions = decide(snap, policy=Policy(max_in_flight=4, max_candidates_per_wave=5))
    assert [decisions[f"new-{i}"].decision for i in range(3)] == ["selected", "cap", "cap"]
    assert "3 candidates in flight" in decisions["new-1"].reason
    assert all(decisions[f"elsewhere-{i}"].decision == "claimed" for i in range(2))


# --- cooldown through the planner -------------------------------------------------------


def test_unverified_attempt_never_blocks() -> None:
    decision = decide(snapshot([A], attempts=[attempt(A, None, hours_ago=1)]))[A.key]
    assert decision.decision == "selected"
    assert "could not be read (artifact-expired)" in decision.reason


def test_capacity_deferred_is_retried_next_wave() -> None:
    decision = decide(snapshot([A], attempts=[attempt(A, "capacity-deferred", hours_ago=2)]))
    assert decision[A.key].decision == "selected"


def test_readiness_blocked_waits_24_hours_across_a_change_of_base() -> None:
    blocked = attempt(A, "readiness-blocked", hours_ago=2, base=OLD_BASE)
    snap = snapshot([A], attempts=[blocked])
    decision = decide(snap)[A.key]
    assert decision.decision == "cooldown"
    assert decision.until == blocked.completed_at + timedelta(hours=24)
    assert decision.reason == (
        "cooling down until 2026-12-01 06:00 UTC: last attempt readiness-blocked (run 101)"
    )
    assert decide(snap, now=NOW + timedelta(hours=21, minutes=59))[A.key].decision == "cooldown"
    assert decide(snap, now=NOW + timedelta(hours=22))[A.key].decision == "selected"


def test_unexpected_error_cools_down() -> None:
    decision = decide(snapshot([A], attempts=[attempt(A, "unexpected-error", hours_ago=1)]))
    assert decision[A.key].decision == "cooldown"


def test_retry_approval_clears_the_cooldown_and_names_who() -> None:
    approval = RetryApproval(A.candidate, "bob", NOW - timedelta(minutes=5))
    snap = snapshot(
        [A], attempts=[attempt(A, "failed", hours_ago=1)], retries={A.candidate: approval}
    )
    decision = decide(snap)[A.key]
    assert decision.decision == "selected"
    assert "cooldown cleared by /klaud retry" in decision.reason and "approved by bob" in decision.reason and "@" not in decision.reason


def test_cooldown_policy_hours_apply() -> None:
    snap = snapshot([A], attempts=[attempt(A, "failed", hours_ago=5)])
    assert decide(snap, policy=Policy(cooldown_hours=4))[A.key].decision == "selected"
    assert decide(snap, policy=Policy(cooldown_hours=6))[A.key].decision == "cooldown"


# --- overlaps as the index reports them -------------------------------------------------


def test_idle_human_pr_does_not_block() -> None:
    pulls = [OpenPull(3001, updated_days_ago=8, touches={A.id: "image"})]
    assert decide(snapshot([A], pulls=pulls))[A.key].decision == "selected"


def test_active_pr_touching_only_a_shared_file_does_not_block() -> None:
    pulls = [OpenPull(3002, updated_days_ago=1, touches={})]  # e.g. .github/workflows only
    assert decide(snapshot([A], pulls=pulls))[A.key].decision == "selected"


def test_active_pr_touching_the_image_line_blocks() -> None:
    pulls = [OpenPull(4012, updated_days_ago=1, touches={A.id: "image"})]
    decision = decide(snapshot([A], pulls=pulls))[A.key]
    assert decision.decision == "overlap"
    assert decision.pull_requests == (4012,)
    assert decision.reason == "PR #4012 changes this family's image line"


def test_pr_touching_another_family_blocks_only_that_family() -> None:
    other = family("other")
    pulls = [OpenPull(4012, touches={other.id: "flags"})]
    decisions = decide(snapshot([A, other], pulls=pulls))
    assert decisions[A.key].decision == "selected"
    assert decisions["other"].decision == "overlap"


# --- capacity rule ----------------------------------------------------------------------


def test_capacity_rule_all_versus_any() -> None:
    split = family("split", clusters=("b200-nscale", "b200-dgxc"))
    assert decide(snapshot([split]))["split"].decision == "capacity"
    assert decide(snapshot([split]))["split"].reason == "cluster b200-dgxc is busy"
    decision = decide(snapshot([split]), policy=Policy(capacity_rule="any"))["split"]
    assert decision.decision == "selected"
    assert decision.clusters == ("b200-nscale", "b200-dgxc")


def test_unavailable_feed_makes_every_family_wait_for_capacity_and_says_why() -> None:
    closed = CapacityReading(frozenset(), frozenset(), NOW, error="http-503")
    families = [family(f"fam-{i}") for i in range(4)]
    wave = plan(snapshot(families), Policy(), closed, NOW)
    assert {d.decision for d in wave.decisions} == {"capacity"}
    assert {d.reason for d in wave.decisions} == {
        "capacity feed unavailable (http-503): every cluster counts as busy"
    }
    assert wave.selected == ()


# --- the wave document ------------------------------------------------------------------


def test_wave_document_has_the_keys_of_design_3_4() -> None:
    busy = family("busy", clusters=("b200-dgxc",))
    overlapped = family("overlapped")
    pulls = [OpenPull(4012, touches={overlapped.id: "image"})]
    snap = snapshot([A, busy, overlapped], pulls=pulls, wave=17)
    document = plan(snap, Policy(), OPEN, NOW).document()
    assert set(document) == {"repo", "at", "base", "wave", "selected", "blocked", "decisions"}
    assert document["blocked"] is None
    assert document["repo"] == "acme/bench"
    assert document["at"] == "2026-11-30T08:00:00Z"
    assert document["base"] == BASE and document["wave"] == 17
    assert document["selected"] == [A.candidate]
    for entry in document["decisions"]:
        assert set(entry) == {
            "family",
            "candidate",
            "decision",
            "reason",
            "until",
            "pull_requests",
            "clusters",
        }
    by_family = {entry["family"]: entry for entry in document["decisions"]}
    assert by_family[overlapped.id]["pull_requests"] == [4012]
    assert by_family[busy.id]["clusters"] == ["b200-dgxc"]
    assert by_family[A.id]["until"] is None


def test_cooldown_until_is_an_iso_time_in_the_document() -> None:
    snap = snapshot([A], attempts=[attempt(A, "failed", hours_ago=1)])
    (entry,) = plan(snap, Policy(), OPEN, NOW).document()["decisions"]
    assert entry["until"] == "2026-12-01T07:00:00Z"


def test_every_live_family_appears_exactly_once() -> None:
    families = [family(f"fam-{i}", changed_days_ago=i % 3) for i in range(50)]
    state = {
        "holds": {families[0].id: Hold(families[0].id, "alice", "x", NOW)},
        "claims": {families[1].id: claim(families[1])},
        "dispatches": {families[2].id: dispatch(families[2], hours_ago=1)},
    }
    wave = plan(snapshot(families, **state), Policy(), OPEN, NOW)
    assert sorted(d.family for d in wave.decisions) == sorted(f.id for f in families)
    assert len(wave.selected) == 5


@pytest.mark.parametrize("kind", ["held", "in-flight", "claimed", "cooldown", "overlap"])
def test_every_decision_carries_the_family_clusters(kind: str) -> None:
    fam = family("fam", clusters=("b200-nscale", "h200-nb"))
    state: dict[str, Any] = {
        "held": {"holds": {fam.id: Hold(fam.id, "alice", "x", NOW)}},
        "in-flight": {"dispatches": {fam.id: dispatch(fam, hours_ago=1)}},
        "claimed": {"klaud_prs": {fam.id: 9}},
        "cooldown": {"attempts": [attempt(fam, "failed", hours_ago=1)]},
        "overlap": {"pulls": [OpenPull(4012, touches={fam.id: "flags"})]},
    }[kind]
    (decision,) = plan(snapshot([fam], **state), Policy(), OPEN, NOW).decisions
    assert decision.decision == kind
    assert decision.clusters == ("b200-nscale", "h200-nb")
    assert decision.reason


# --- a blocked repository ---------------------------------------------------------------


def blocked(code: str = "dispatch-paused") -> Blocked:
    return Blocked(code, "dispatch paused: 3 of the 4 finished runs of wave 7 failed", NOW)  # type: ignore[arg-type]


def test_a_paused_repository_decides_would_be_selections_paused() -> None:
    families = [family(f"fam-{i}") for i in range(4)]
    busy = family("busy", clusters=("b200-dgxc",))
    wave = plan(snapshot([*families, busy], blocked=blocked()), Policy(max_candidates_per_wave=2), OPEN, NOW)
    ordered = [d for d in wave.decisions if d.family != busy.id]
    assert [d.decision for d in ordered] == ["paused", "paused", "cap", "cap"]
    assert ordered[0].reason.startswith("dispatch paused: 3 of the 4")
    assert decide(snapshot([busy], blocked=blocked()))["busy"].decision == "capacity"  # other rungs still say why
    assert wave.selected == () and wave.document()["blocked"]["code"] == "dispatch-paused"


def test_an_armed_canary_selects_one_candidate_of_a_paused_repository() -> None:
    families = [family(f"fam-{i}") for i in range(3)]
    wave = plan(snapshot(families, blocked=blocked(), canary=True), Policy(), OPEN, NOW)
    assert [d.decision for d in wave.decisions] == ["selected", "paused", "paused"]
    assert "canary" in wave.decisions[0].reason


def test_a_setup_error_pauses_everything_even_with_a_canary() -> None:
    wave = plan(snapshot([A], blocked=blocked("setup-error"), canary=True), Policy(), OPEN, NOW)
    assert [d.decision for d in wave.decisions] == ["paused"]


def test_settled_decisions_are_kept_and_free_their_slot() -> None:
    families = [family(f"fam-{i}") for i in range(3)]
    first = plan(snapshot(families), Policy(max_candidates_per_wave=1), OPEN, NOW)
    failed = replace(first.decisions[0], decision="dispatch-failed", reason="dispatch failed (502)")
    again = plan(snapshot(families, settled={failed.family: failed}), Policy(max_candidates_per_wave=1), OPEN, NOW)
    assert [d.decision for d in again.decisions] == ["dispatch-failed", "selected", "cap"]


def test_a_run_adopted_from_an_orphan_claim_is_in_flight_without_a_check_time() -> None:
    # The claim keeper adopts a run it finds for an orphan claim as the family's dispatch
    # with the run's status but no check yet (bot/services/claims.py `_settle_orphan`);
    # the rung must decide it in flight and not describe a check that never happened.
    adopted = dispatch(A, hours_ago=1, run_status="queued")
    assert adopted.checked_at is None
    decision = decide(snapshot([A], dispatches={A.id: adopted}))[A.key]
    assert decision.decision == "in-flight"
    assert "still" not in decision.reason
    assert decision.reason.endswith("waiting for its outcome")


def test_in_flight_reason_names_the_run() -> None:
    decision = decide(snapshot([A], dispatches={A.id: dispatch(A, hours_ago=1)}))[A.key]
    assert "dispatched by wave 16 at" in decision.reason and ", run 555;" in decision.reason


def test_a_dispatch_exactly_at_its_claim_ttl_is_due_for_its_run_to_be_read() -> None:
    # `claim_ttl_hours` passed means the claim keeper reads the run (claims.py counts a
    # dispatch due at `now - at >= ttl`); the reason must say so from that very moment.
    at_ttl = dispatch(A, hours_ago=12)
    decision = decide(snapshot([A], dispatches={A.id: at_ttl}))[A.key]
    assert decision.decision == "in-flight"
    assert decision.until == NOW
    assert "its claim TTL passed" in decision.reason
    just_before = decide(snapshot([A], dispatches={A.id: dispatch(A, hours_ago=12 - 1 / 60)}))[A.key]
    assert just_before.reason.endswith("waiting for its outcome")
    assert just_before.until == NOW + timedelta(minutes=1)


def test_an_eligible_verdict_holds_until_the_first_attempt_leaves_the_cooldown_window() -> None:
    # Verdict contract (planner.py): `valid_until` is when time alone may change it; the
    # live repository reuses a verdict until then (repo_state._verdict), so the reason of a
    # selection must not keep quoting an attempt that has left the window.
    older, newer = attempt(A, None, hours_ago=20, run_id=1), attempt(A, None, hours_ago=2, run_id=2)
    facts = Facts(hold=None, dispatch=None, claim=None, klaud_pr=None, attempts=(older, newer), retry=None, overlaps=())
    found = verdict(A, A.candidate, facts, Policy(), 17, NOW)
    assert found.decision is None
    assert found.valid_until == NOW + timedelta(hours=4)
