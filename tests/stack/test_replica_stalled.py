"""A replica resumed after a stall past its lease (SIGSTOP, a VM pause, a long GC) writes
nothing for the repositories it held, on GitHub or in the store, until its lease round says
it still holds them (DESIGN §6: one owner at a time)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bot.app import Klaud
from bot.core.domain import stamp
from bot.store.errors import LeaseTaken
from tests import scenarios as sc
from tests.harness import sandbox_stack
from tests.stack.test_people_e2e import H200, klaud_pr

REPO = "acme/bench"


async def test_a_replica_past_its_lease_writes_nothing_until_its_round_renews(tmp_path, store_url):
    # What this catches: resumed after another replica answered a command of its repository,
    # a replica posted a second reply (and its scheduler made a claim ref nobody dispatched):
    # only its store writes were fenced, not its GitHub ones.
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)]), env={"KLAUD_DB": store_url}) as run:
        klaud = run.klaud
        await klaud.replicas.round()
        state = klaud.live.repo(REPO)
        assert state is not None and klaud.replicas.owns(REPO)
        api = klaud.live.api(state)
        comments, refs = len(run.github()["comments"]), set(run.github()["refs"])
        state.meta.next_wave_at = stamp(klaud.clock.now() - timedelta(minutes=1))  # a wave is due
        klaud.replicas._valid_until = 0.0  # its own clock: the leases' validity passed (a stall)

        with pytest.raises(LeaseTaken):
            await api.post_comment(12, "an answer its successor gave already")
        assert await klaud.scheduler.tick() == []  # no wave of a repository it may not hold
        with pytest.raises(LeaseTaken):
            await klaud.live.persist(state.save_meta())
        assert len(run.github()["comments"]) == comments and set(run.github()["refs"]) == refs

        await klaud.replicas.round()  # nobody took it: it holds it again, and acts
        await api.post_comment(12, "now it may")
        assert len(run.github()["comments"]) == comments + 1
        await klaud.live.reload_stale()  # memory is read back: the refused write never landed
        again = klaud.live.repo(REPO)
        assert again is not None and again.meta.next_wave_at is None
        again.meta.next_wave_at = stamp(klaud.clock.now() - timedelta(minutes=1))
        assert await klaud.scheduler.tick() == [REPO]


async def test_a_cli_command_on_postgresql_with_no_replica_serving_writes_as_before(tmp_path, store_url):
    # What this catches: the guard above, set up with the Replicas object, refused every
    # write of `klaud reconcile` (a Klaud started without draining runs no lease round, so
    # it held nothing): the CLI works on the store directly when no replica serves it.
    async with sandbox_stack(tmp_path, sc.scenario(pulls=[sc.image_bump(12)])) as run:
        state = run.klaud.live.repo(REPO)
        assert state is not None
        cli = Klaud(run.klaud.settings.model_copy(update={"db": store_url}), clock=run.sandbox.clock)
        await cli.start(drain=False)
        try:
            report = await cli.reconciler.reconcile(REPO, state.meta.installation)
            assert "skipped" not in report and await cli.store.get("", "repo", REPO) is not None
        finally:
            await cli.stop()


async def test_a_check_run_update_pending_at_stop_is_published_before_the_leases_go(tmp_path, store_url):
    # What this catches: a stop released the leases first, then flushed what was pending:
    # refused (the replica held nothing by then), the check run stayed stale.
    scenario = sc.scenario(pulls=[klaud_pr(50, H200)])
    options = {"check_delay_seconds": 30.0}
    async with sandbox_stack(tmp_path, scenario, env={"KLAUD_DB": store_url}, klaud_options=options) as run:
        klaud = run.klaud
        await klaud.replicas.round()
        await klaud.checks.settle()
        state = klaud.live.repo(REPO)
        assert state is not None and "50" in state.meta.check_runs
        state.meta.check_runs["50"]["digest"] = "outdated"  # the view changed: an update is due
        klaud.checks.coalescer.mark((state.name, 50))  # pending, in a 30 s window
        run.reset_requests()
        await klaud.stop(grace=5.0)
        patched = [r for r in run.requests["requests"] if r["method"] == "PATCH" and "/check-runs/" in r["path"]]
        assert patched, "the pending check-run update was never sent"
        klaud.stop = _stopped  # type: ignore[method-assign]  # the harness stops the stack again


async def _stopped(*args: object, **kwargs: object) -> None:
    return None
