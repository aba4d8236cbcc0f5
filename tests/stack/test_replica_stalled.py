"""A replica resumed after a stall past its lease (SIGSTOP, a VM pause, a long GC) writes
nothing for the repositories it held, on GitHub or in the store, until its lease round says
it still holds them (DESIGN §6: one owner at a time)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bot.core.domain import stamp
from bot.store.errors import LeaseTaken
from tests import scenarios as sc
from tests.harness import sandbox_stack

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
