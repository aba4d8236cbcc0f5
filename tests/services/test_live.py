"""The live state (`bot.services.live`) on its own: its locks and what they key on, what it
marks stale and reads back (and what a read back keeps out), renames, departures and
uninstalls, which attempts a load keeps in memory, and what its listeners hear."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from bot.core.cooldown import ATTEMPT_MEMORY
from bot.services.live import GoneRepository
from bot.services.repo_state import RepoMeta, RepoState
from bot.store.change import Change
from tests.services.conftest import REPO, Kit
from tests.services.fakes import pull_event
from tests.services.test_long_running import failed


async def test_a_repository_is_in_use_only_while_a_section_holds_its_lock(kit: Kit) -> None:
    # What this catches: a lock once made counted as held for ever: a reconcile never admitted the repository again.
    assert not kit.live.in_use(REPO)
    async with kit.live.lock(REPO):
        assert kit.live.in_use(REPO)
    assert not kit.live.in_use(REPO)


async def test_two_spellings_of_a_name_share_one_lock(kit: Kit) -> None:
    # What this catches: the lock was keyed by the name as spelled: `Acme/Bench` and `acme/bench` sections interleaved.
    async with kit.live.lock("Acme/Bench"):
        assert kit.live.in_use(REPO)


async def test_a_cancelled_section_marks_its_repository_stale_in_lowercase(kit: Kit) -> None:
    # What this catches: the stale mark kept the name as spelled: the reload, keyed lowercase, read back a repository not kept and left the mark.
    await kit.reconciler.reconcile(REPO, 1)

    async def cancelled() -> None:
        async with kit.live.lock("Acme/Bench"):
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await asyncio.create_task(cancelled())
    assert kit.live.stale == {REPO}


async def test_a_taker_of_two_locks_holds_none_while_it_waits_for_the_first(kit: Kit) -> None:
    # What this catches: locks were taken in the order named, not sorted: two takers of the same pair each held one and waited for the other.
    entered = asyncio.Event()

    async def pair() -> None:
        async with kit.live.locks("o/a", "o/b"):
            entered.set()

    async def b_alone() -> None:
        async with kit.live.lock("o/b"):
            pass

    async with kit.live.lock("o/a"):
        waiting = asyncio.create_task(pair())
        await asyncio.sleep(0)
        # A section that holds a and then takes b (the sorted order) must get b: the pair's
        # taker waits for a holding nothing.
        await asyncio.wait_for(b_alone(), 1)
    await asyncio.wait_for(waiting, 1)
    assert entered.is_set()


async def test_a_forgotten_or_renamed_repository_leaves_no_lock_behind(kit: Kit) -> None:
    # What this catches: a lock per repository name ever locked, kept for as long as the process ran.
    await kit.reconciler.reconcile(REPO, 1)
    locks = len(kit.live._locks)
    for n in range(50):  # a repository installed (its state stored), renamed, then uninstalled
        name, renamed = f"acme/r{n}", f"acme/moved{n}"
        state = RepoState(name, RepoMeta(installation=1))
        async with kit.live.lock(name):
            kit.live.put(state)
            await kit.live.persist(state.save_meta())
        await kit.live.rename(name, renamed)
        await kit.live.forget(renamed)
    assert kit.live.repos.keys() == {REPO} and len(kit.live._locks) == locks


async def test_a_lock_someone_waits_on_outlives_its_holder(kit: Kit) -> None:
    # Dropped when its holder let go, the waiter would hold a lock no later taker sees.
    holder_in, waiter_in = asyncio.Event(), asyncio.Event()
    holder_done, waiter_done = asyncio.Event(), asyncio.Event()

    async def section(entered: asyncio.Event, done: asyncio.Event) -> None:
        async with kit.live.lock(REPO):
            entered.set()
            await done.wait()

    tasks = [asyncio.create_task(section(holder_in, holder_done))]
    await holder_in.wait()
    tasks.append(asyncio.create_task(section(waiter_in, waiter_done)))
    await asyncio.sleep(0)
    holder_done.set()
    await waiter_in.wait()
    assert kit.live.in_use(REPO)  # the waiter holds the very lock a newcomer would take
    waiter_done.set()
    await asyncio.gather(*tasks)
    assert not kit.live.in_use(REPO) and len(kit.live._locks) == 0


async def test_a_repository_renamed_twice_is_found_by_its_first_name(kit: Kit) -> None:
    # What this catches: only the first step of a chain of renames was followed: events under the first name found nothing.
    await kit.reconciler.reconcile(REPO, 1)
    kit.live.former["acme/first"] = "acme/second"
    kit.live.former["acme/second"] = REPO
    assert kit.live.renamed("acme/first") is kit.state


async def test_bot_logins_match_whatever_the_case(kit: Kit) -> None:
    # What this catches: logins were compared as spelled: a comment by `KLAUD-COLD[BOT]` was taken for a person's.
    assert kit.live.is_bot("KLAUD-COLD[BOT]") and kit.live.is_bot("klaud-cold")
    assert not kit.live.is_bot("someone") and not kit.live.is_bot(None)


async def test_a_load_keeps_the_attempts_of_the_last_two_weeks_only(kit: Kit) -> None:
    # What this catches: the load trimmed attempts by the wrong bound: all history came back into memory, or recent attempts rules read were lost.
    await kit.reconciler.reconcile(REPO, 1)
    candidate = next(iter(kit.state.catalog)).candidate
    old = failed(candidate, 901, kit.clock.now() - ATTEMPT_MEMORY - timedelta(hours=1))
    recent = failed(candidate, 902, kit.clock.now() - timedelta(days=3))
    for attempt in (old, recent):
        _, change = kit.state.record_attempt(attempt)
        await kit.live.persist(change)
    loaded = await kit.live.load_repo(REPO)
    assert loaded is not None
    assert {a.run_id for a in loaded.ledger.for_candidate(candidate)} >= {902}
    assert 901 not in {a.run_id for a in loaded.ledger.all()}


async def test_a_load_keeps_every_attempt_of_a_candidate_an_open_klaud_pr_works_on(kit: Kit) -> None:
    # What this catches: a restart loaded no attempt older than 14 days, also those of a
    # Klaud PR still open: its check run turned neutral, "No attempts yet.", at its next render.
    await kit.reconciler.reconcile(REPO, 1)
    shown, other = [family.candidate for family in list(kit.state.catalog)[:2]]
    await kit.pulls.on_pull_request(kit.state, pull_event("opened", 1000, updated_at=kit.clock.now(),
                                                          head_ref=f"klaud/auto-{shown}", user="klaud-cold[bot]"))
    long_ago = kit.clock.now() - ATTEMPT_MEMORY - timedelta(days=30)
    for attempt in (failed(shown, 901, long_ago), failed(other, 902, long_ago)):
        _, change = kit.state.record_attempt(attempt)
        await kit.live.persist(change)
    loaded = await kit.live.load_repo(REPO)
    assert loaded is not None
    assert [a.run_id for a in loaded.ledger.all()] == [901]
    # The running process keeps them alike when older attempts leave memory.
    kit.state.forget_attempts_before(kit.clock.now() - ATTEMPT_MEMORY)
    assert [a.run_id for a in kit.state.ledger.all()] == [901]


async def test_a_reopened_klaud_pr_shows_its_candidates_attempts_as_a_restart_would(kit: Kit) -> None:
    # README: the attempts of a candidate an open Klaud PR works on stay, whatever their age,
    # while the PR is open, and a restart loads them. Closed meanwhile, the 6-hourly trim let
    # them go; reopened, the running process shows "No attempts yet." where a restart shows them.
    await kit.reconciler.reconcile(REPO, 1)
    shown = next(iter(kit.state.catalog)).candidate
    opened = {"head_ref": f"klaud/auto-{shown}", "user": "klaud-cold[bot]"}
    await kit.pulls.on_pull_request(kit.state, pull_event("opened", 1000, updated_at=kit.clock.now(), **opened))
    _, change = kit.state.record_attempt(failed(shown, 901, kit.clock.now() - ATTEMPT_MEMORY - timedelta(days=1)))
    await kit.live.persist(change)
    await kit.pulls.on_pull_request(
        kit.state, pull_event("closed", 1000, updated_at=kit.clock.now() + timedelta(seconds=1), **opened))
    assert 1000 not in {p.number for p in kit.state.overlap.prs()}
    kit.state.forget_attempts_before(kit.clock.now() - ATTEMPT_MEMORY)
    assert [a.run_id for a in kit.state.ledger.for_candidate(shown)] == []
    await kit.pulls.on_pull_request(
        kit.state, pull_event("reopened", 1000, updated_at=kit.clock.now() + timedelta(seconds=2), **opened))
    assert 1000 in {p.number for p in kit.state.overlap.prs()}
    running = [a.run_id for a in kit.state.ledger.for_candidate(shown)]
    loaded = await kit.live.load_repo(REPO)
    assert loaded is not None and [a.run_id for a in loaded.ledger.for_candidate(shown)] == [901]
    assert running == [901]


async def test_a_section_that_took_its_state_before_a_handover_writes_no_ghost_back(kit: Kit) -> None:
    # What this catches: a state dropped for another replica was not noted as departed: a late write brought it back under this process.
    await kit.reconciler.reconcile(REPO, 1)
    taken = kit.state
    kit.live.drop(REPO)
    with pytest.raises(GoneRepository):
        await kit.live.persist(taken.save_meta())


async def test_a_commit_cancelled_while_it_runs_marks_its_repository_stale(kit: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    # What this catches: only errors marked the repository stale, not a cancel: memory stayed ahead of the store.
    await kit.reconciler.reconcile(REPO, 1)

    async def cancelled(change: Change) -> None:
        raise asyncio.CancelledError

    monkeypatch.setattr(kit.live.store, "apply", cancelled)
    with pytest.raises(asyncio.CancelledError):
        await kit.live.persist(kit.state.save_meta())
    assert REPO in kit.live.stale


async def test_a_reload_waits_for_the_section_holding_the_repository(kit: Kit) -> None:
    # What this catches: the reload read back without the repository's lock: it replaced memory under a running section, which then committed the old state.
    await kit.reconciler.reconcile(REPO, 1)
    stored = kit.state.meta.wave
    async with kit.live.lock(REPO):
        kit.state.meta.wave = stored + 5  # changed in memory, committed before the section ends
        reload = asyncio.create_task(kit.live.reload(REPO))
        await asyncio.wait({reload}, timeout=0.3)
        assert not reload.done()
        await kit.live.persist(kit.state.save_meta())
    await asyncio.wait_for(reload, 1)
    assert kit.state.meta.wave == stored + 5


async def test_every_stale_repository_is_read_back(kit: Kit) -> None:
    # What this catches: one stale repository was read back per call: the others stayed ahead of the store.
    await kit.reconciler.reconcile(REPO, 1)
    kit.live.stale |= {REPO, "acme/other", "zz/last"}
    await kit.live.reload_stale()
    assert kit.live.stale == set()


async def test_listeners_hear_of_a_pull_request_that_moved_even_with_no_family_changed(kit: Kit) -> None:
    # What this catches: listeners were told only of family changes: a PR's new head got no check run render.
    await kit.reconciler.reconcile(REPO, 1)
    heard = []

    async def listener(state, families, pulls) -> None:
        heard.append((families, pulls))

    kit.live.listeners.append(listener)
    await kit.live.notify(kit.state, set(), {7})
    await kit.live.notify(kit.state, set(), set())
    assert heard == [(set(), {7})]


@pytest.mark.filterwarnings("ignore::UserWarning")  # placeholder records, not of each kind's shape
async def test_an_uninstall_leaves_nothing_of_the_repository_in_the_store(kit: Kit) -> None:
    # What this catches: a kind of record (claims) was left out of the uninstall: loaded again when the repository came back.
    await kit.reconciler.reconcile(REPO, 1)
    change = Change()
    for kind in ("family", "pull", "attempt", "hold", "retry", "claim", "dispatch", "artifact-retry"):
        change.put(REPO, kind, "k", {"left": kind})
    await kit.live.persist(change)
    await kit.live.forget(REPO)
    assert await kit.live.store.load(REPO) == {}


async def test_an_uninstall_forgets_the_store_records_of_a_repository_kept_elsewhere_whatever_its_case(kit: Kit) -> None:
    # What this catches: with replicas the leader forgets a repository another replica keeps
    # by the payload's name; records are stored under their own spelling (GitHub's names are
    # case-insensitive, and a rename of the case alone is not followed), so they stayed and
    # the repository came back at the next start.
    await kit.reconciler.reconcile(REPO, 1)  # stored as acme/bench
    kit.live.drop(REPO)  # kept by another replica: not in this process's memory
    await kit.live.forget("ACME/Bench")
    assert await kit.live.store.repos() == [] and await kit.live.store.load(REPO) == {}


async def test_a_reload_of_a_repository_no_longer_kept_here_leaves_it_out(kit: Kit) -> None:
    # What this catches: a read back loaded a repository memory had let go (another replica's now): a second keeper planned its waves.
    await kit.reconciler.reconcile(REPO, 1)
    kit.live.drop(REPO)
    await kit.live.reload(REPO)
    assert kit.live.repo(REPO) is None


async def test_a_reload_of_a_repository_the_store_has_nothing_of_drops_it_from_memory(kit: Kit) -> None:
    # What this catches: a read back that found no record of the repository kept the memory the store lacks: a repository never reconciled anew.
    await kit.reconciler.reconcile(REPO, 1)
    await kit.live.store.apply(Change().delete("", "repo", REPO))
    await kit.live.reload(REPO)
    assert kit.live.repo(REPO) is None


async def test_a_reload_updates_the_state_object_its_holders_already_have(kit: Kit) -> None:
    # What this catches: the read back put a new state object in place: a handler waiting for the lock with the old one kept the memory that was ahead of the store.
    await kit.reconciler.reconcile(REPO, 1)
    held = kit.state
    stored = held.meta.wave
    held.meta.wave = stored + 7  # ahead of the store
    await kit.live.reload(REPO)
    assert kit.live.repo(REPO) is held and held.meta.wave == stored
