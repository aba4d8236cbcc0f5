"""Waves and dispatch against an in-memory repository: a wave only writes claims and dispatches."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from bot.core.domain import claim_ref
from bot.github.errors import BadRequest, NotFound, Unavailable
from tests import scenarios as sc
from tests.services.conftest import REPO, Kit


async def test_a_wave_reads_nothing_and_writes_a_claim_and_a_dispatch_per_selection(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.calls.clear()
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and len(wave.selected) == 5
    assert kit.repo.reads() == []
    expected = []
    for decision in (d for d in wave.decisions if d.decision == "selected"):
        expected += [("create_branch", claim_ref(decision.family), kit.repo.head),
                     ("dispatch", "klaud-candidate.yml", "main", decision.candidate)]
    assert kit.repo.writes() == expected
    state = kit.state
    assert {d.candidate for d in state.dispatches.values()} == set(wave.selected)
    assert all(d.run_id is not None for d in state.dispatches.values())  # linked by the answer


async def test_a_lost_claim_gives_the_slot_to_the_next_family(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    preview = await kit.waves.preview(REPO)
    assert preview is not None
    first = preview.decisions[0]
    kit.repo.branches_at[claim_ref(first.family)] = "f" * 40  # another planner won the race
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None
    by_family = {d.family: d for d in wave.decisions}
    assert by_family[first.family].decision == "claimed"
    assert first.candidate not in wave.selected


async def test_a_failed_dispatch_releases_its_claim(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.fail("dispatch", Unavailable(502, "Bad Gateway"))
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None
    failed = wave.decisions[0]
    assert "failed" in failed.reason and failed.candidate not in wave.selected
    assert claim_ref(failed.family) not in kit.repo.branches_at
    assert set(wave.selected) == {d["inputs"]["candidate"] for d in kit.repo.dispatched}


async def test_a_dry_run_writes_nothing(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.waves.dry_run = True
    kit.repo.calls.clear()
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and kit.repo.calls == []
    assert all("dry run" in d.reason for d in wave.decisions if d.decision == "selected")


async def test_a_busy_cluster_is_never_dispatched(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.capacity.busy = set(sc.CLUSTERS)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and wave.selected == () and kit.repo.writes() == []


async def test_a_failed_dispatch_gives_its_slot_to_the_next_family(kit: Kit) -> None:
    kit.repo.put_files({".github/klaud.yml": "max_candidates_per_wave: 2\n"})
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.fail("dispatch", Unavailable(502, "Bad Gateway"))
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None
    kinds = [d.decision for d in wave.decisions]
    assert kinds[:3] == ["dispatch-failed", "selected", "selected"]
    assert set(wave.selected) == {d["inputs"]["candidate"] for d in kit.repo.dispatched}
    assert kit.state.meta.retry_wave_at is None  # some got through: no retry wave


async def test_the_document_matches_what_was_dispatched_under_failures(kit: Kit) -> None:
    kit.repo.put_files({".github/klaud.yml": "max_candidates_per_wave: 5\n"})
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.fail("dispatch", Unavailable(503, "Unavailable"), times=2)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None
    assert set(wave.selected) == {d["inputs"]["candidate"] for d in kit.repo.dispatched}
    assert [d.decision for d in wave.decisions].count("dispatch-failed") == 2
    failed = [d.family for d in wave.decisions if d.decision == "dispatch-failed"]
    assert all(claim_ref(f) not in kit.repo.branches_at for f in failed)
    assert set(kit.state.dispatches) == {d.family for d in wave.decisions if d.decision == "selected"}


async def test_a_wave_whose_every_dispatch_failed_is_retried_once_soon(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.fail("dispatch", Unavailable(502, "Bad Gateway"), times=100)
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and wave.selected == ()
    assert kit.state.meta.retry_wave_at == "2026-11-30T08:05:00Z"
    await kit.waves.run(REPO, trigger="retry")
    assert kit.state.meta.retry_wave_at is None  # retried once, not in a loop


async def test_a_misnamed_candidate_workflow_is_a_setup_error_with_zero_claims(kit: Kit) -> None:
    kit.repo.put_files({".github/klaud.yml": "candidate_workflow: klaud-candidat.yml\n"})
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.calls.clear()
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and wave.selected == () and kit.repo.calls == []
    assert wave.blocked is not None and wave.blocked.code == "setup-error"
    paused = [d for d in wave.decisions if d.decision == "paused"]
    assert paused and "klaud-candidat.yml does not exist" in paused[0].reason
    # The push that fixes the policy lifts it.
    head = "e" * 40
    kit.repo.files[head] = {**kit.repo.files[kit.repo.head], ".github/klaud.yml": ""}
    from tests.services.test_catalog_sync import push

    await kit.catalog.on_push(kit.state, push("refs/heads/main", kit.repo.head, head))
    assert kit.state.blocked() is None


def test_a_stored_wave_reads_back_as_its_document() -> None:
    from bot.core.domain import Blocked, Decision, Wave, parse_time
    from bot.services.waves import wave_record
    from bot.store.codec import decode_document, encode_document

    at = parse_time("2026-11-30T08:00:00Z")
    assert at is not None
    wave = Wave("acme/bench", at, "b" * 40, 3, (
        Decision("f", "c", "cooldown", "r", parse_time("2026-12-01T06:05:00.5Z"), (12,), ("b200-nb",)),
        Decision("g", "d", "selected", "s"),
    ), Blocked("dispatch-paused", "why", at))
    assert decode_document(encode_document(wave_record(wave))) == wave.document()


async def test_a_dispatch_whose_answer_was_lost_keeps_its_claim_and_is_not_dispatched_again(kit: Kit) -> None:
    # A timeout or a 502 after GitHub queued the run: released, the family would run twice.
    kit.repo.put_files({".github/klaud.yml": "max_candidates_per_wave: 1\n"})
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.dispatches_unanswered = 1
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None and len(kit.repo.dispatched) == 1  # the slot is not given to another family
    [cand] = wave.selected
    decision = next(d for d in wave.decisions if d.candidate == cand)
    assert "answer was lost" in decision.reason
    dispatch = kit.state.dispatches[decision.family]
    assert dispatch.run_id is None and claim_ref(decision.family) in kit.repo.branches_at
    assert kit.state.meta.retry_wave_at is None
    kit.clock.advance(timedelta(minutes=11).total_seconds())
    await kit.claims.check_due(kit.state)  # found by the candidate id in its title
    assert kit.state.dispatches[decision.family].run_id == kit.repo.dispatched[0]["run_id"]
    kit.clock.advance(timedelta(hours=2).total_seconds())
    again = await kit.waves.run(REPO, trigger="test")
    assert again is not None and cand not in again.selected
    assert [d["inputs"]["candidate"] for d in kit.repo.dispatched].count(cand) == 1


async def test_a_wave_that_waited_for_the_lock_does_not_plan_with_a_stale_reading(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    held = asyncio.Event()
    release = asyncio.Event()

    async def long_section() -> None:  # e.g. a reconcile reading many PRs' files
        async with kit.live.lock(REPO):
            held.set()
            await release.wait()

    blocker = asyncio.create_task(long_section())
    await held.wait()
    wave_task = asyncio.create_task(kit.waves.run(REPO, trigger="schedule"))
    await asyncio.sleep(0)  # the wave reads capacity (all free), then waits for the lock
    await asyncio.sleep(0)
    kit.clock.advance(600)  # ten minutes later every cluster is busy
    kit.capacity.busy = set(sc.CLUSTERS)
    release.set()
    await blocker
    wave = await wave_task
    assert wave is not None
    assert wave.selected == (), (
        f"dispatched {len(wave.selected)} candidates at {wave.at} from a reading taken 600 s before "
        "(the feed says every cluster is busy now)"
    )


async def test_a_wave_in_an_archived_repository_stops_at_the_first_refused_claim(kit: Kit) -> None:
    # Each family's claim was tried in turn, each refused: thousands of writes a wave with
    # 2,000 families, enough for GitHub's write limits to hold the whole installation.
    from bot.github.errors import BadRequest

    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.fail("create_branch", BadRequest(403, "Repository was archived so is read-only."), times=10_000)
    kit.repo.calls.clear()

    wave = await kit.waves.run(REPO, trigger="schedule")

    assert [c[0] for c in kit.repo.calls].count("create_branch") == 1
    failed = [d for d in wave.decisions if d.decision == "dispatch-failed"]
    assert wave.selected == () and len(failed) == kit.state.policy.max_candidates_per_wave
    assert "archived" in failed[0].reason and all("not tried" in d.reason for d in failed[1:])


async def test_a_claim_a_ruleset_refuses_stops_the_wave_at_the_first(kit: Kit) -> None:
    # Claim refs differ only by a hash: a rule restricting the creation of one restricts all.
    from bot.github.errors import Conflict

    await kit.reconciler.reconcile(REPO, 1)
    refused = "Repository rule violations found\n\nCannot create ref due to creations being restricted."
    kit.repo.fail("create_branch", Conflict(422, refused), times=10_000)
    kit.repo.calls.clear()

    wave = await kit.waves.run(REPO, trigger="schedule")

    assert [c[0] for c in kit.repo.calls].count("create_branch") == 1
    failed = [d for d in wave.decisions if d.decision == "dispatch-failed"]
    assert wave.selected == () and "rule violations" in failed[0].reason
    # Nothing was claimed nor dispatched: not "dispatch failed ...; claim released".
    assert failed[0].reason.startswith("claim refused") and "released" not in failed[0].reason
    assert all("not tried" in d.reason for d in failed[1:])


@pytest.mark.parametrize("refusal", [
    NotFound(404, "Not Found"),  # the workflow gone, by a push whose webhook was lost
    BadRequest(403, "Resource not accessible by integration"),  # Actions access withdrawn
])
async def test_a_dispatch_refused_for_the_repository_stops_the_wave_at_the_first(kit: Kit, refusal) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.fail("dispatch", refusal, times=10_000)
    kit.repo.calls.clear()

    wave = await kit.waves.run(REPO, trigger="schedule")

    assert [c[0] for c in kit.repo.calls].count("dispatch") == 1
    assert [c[0] for c in kit.repo.calls].count("create_branch") == 1
    assert wave.selected == () and not kit.state.dispatches and not kit.state.claims
    failed = [d for d in wave.decisions if d.decision == "dispatch-failed"]
    assert refusal.message in failed[0].reason and all("not tried" in d.reason for d in failed[1:])
    assert "for the whole repository" in failed[1].reason and "claims" not in failed[1].reason


async def test_a_dispatch_refused_for_its_inputs_lets_the_next_family_take_the_slot(kit: Kit) -> None:
    # A 422 may be about one family's values (DESIGN §4: the wave goes on with the next).
    from bot.github.errors import Conflict

    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.fail("dispatch", Conflict(422, "Unexpected inputs provided"), times=1)
    wave = await kit.waves.run(REPO, trigger="schedule")
    assert [d.decision for d in wave.decisions].count("dispatch-failed") == 1
    assert len(wave.selected) == 4


async def test_a_claim_refused_for_its_family_alone_lets_the_next_family_take_the_slot(kit: Kit) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.fail("create_branch", Unavailable(502, "Bad Gateway"), times=1)

    wave = await kit.waves.run(REPO, trigger="schedule")

    # GitHub unwell for one request: the wave goes on with every other eligible family.
    assert [d.decision for d in wave.decisions].count("dispatch-failed") == 1
    assert len(wave.selected) == len(kit.state.catalog) - 1 == 4


async def test_a_failed_last_dispatch_of_a_wave_gives_its_slot_to_the_next_family(kit: Kit) -> None:
    # DESIGN §4: "A failed dispatch deletes its claim and the wave goes on with the next
    # candidate", also when it is the last selection the plan made.
    kit.repo.put_files({".github/klaud.yml": "max_candidates_per_wave: 2\n"})
    await kit.reconciler.reconcile(REPO, 1)
    answered = kit.repo.dispatch
    calls = 0

    async def second_refused(workflow: str, branch: str, inputs: dict[str, str]) -> int | None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise Unavailable(502, "Bad Gateway")
        return await answered(workflow, branch, inputs)

    kit.repo.dispatch = second_refused  # type: ignore[method-assign]
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None
    assert [d.decision for d in wave.decisions][:3] == ["selected", "dispatch-failed", "selected"]
    assert len(wave.selected) == 2 == len(kit.repo.dispatched)


async def paused_with_a_canary_armed(kit: Kit) -> None:
    """A reconciled repository whose dispatch paused after failed runs, and a person's
    `/klaud resume` that armed the canary."""
    await kit.reconciler.reconcile(REPO, 1)
    async with kit.live.lock(REPO):
        kit.state.meta.pause = {"reason": "dispatch paused: 3 of 3 runs failed", "since": "2026-11-30T07:00:00Z"}
        assert kit.state.arm_canary()
        await kit.live.persist(kit.state.save_meta())


async def test_a_refused_canary_dispatch_leaves_the_canary_to_the_next_family(kit: Kit) -> None:
    # A paused repository's canary (DESIGN §4 "Failures before an outcome") is spent only by
    # a run that went out: GitHub refusing its dispatch hands it to the next family.
    await paused_with_a_canary_armed(kit)
    kit.repo.fail("dispatch", Unavailable(502, "Bad Gateway"))
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None
    assert [d.decision for d in wave.decisions][:2] == ["dispatch-failed", "selected"]
    [canary] = [d["inputs"]["candidate"] for d in kit.repo.dispatched]
    assert wave.selected == (canary,) and kit.state.canary_running() == canary
