"""Lost webhooks the light reconcile repairs, whatever else GitHub refuses meanwhile."""

from __future__ import annotations

from datetime import timedelta

import pytest

from bot.core.domain import stamp
from bot.core.events import Account, Comment, RepoEvent
from bot.github.errors import Conflict, Unavailable
from bot.services.missed_comments import MissedComments
from bot.services.permissions import Permissions
from bot.services.reconcile import Reconciler
from bot.services.responder import CommandResponder
from tests import scenarios as sc
from tests.services.conftest import REPO, Kit
from tests.services.fakes import pull, pull_event

H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"
# What GitHub answers for the files of a pull request whose diff it gives up on.
DIFF_TOO_SLOW = Conflict(422, "Server Error: Sorry, this diff is taking too long to generate.")


async def test_one_pull_request_github_cannot_list_the_files_of_does_not_stop_the_reconcile_repairing_the_rest(
    kit: Kit,
) -> None:
    await kit.reconciler.reconcile(REPO, 1)
    cand = sc.candidate(H200)
    # Klaud's own PR for the family is open: the family is `claimed`.
    own = pull(30, user="klaud-cold[bot]", head_ref=f"klaud/auto-{cand}", updated_at=kit.clock.now())
    kit.repo.pulls[30] = own
    await kit.pulls.on_pull_request(kit.state, pull_event("opened", 30, updated_at=kit.clock.now(),
                                                          user="klaud-cold[bot]", head_ref=f"klaud/auto-{cand}"))
    assert kit.state.overlap.klaud_pr(kit.state.catalog.get(H200)) == 30
    # The run ends, the PR is closed: its `closed` delivery is lost.
    kit.clock.advance(3600)
    del kit.repo.pulls[30]
    # Someone opens a huge refactor whose files GitHub will not list.
    kit.repo.pulls[40] = pull(40, updated_at=kit.clock.now())
    kit.repo.fail("pull_files", DIFF_TOO_SLOW, times=1000)
    # Light reconciles, day after day, while the refactor stays open: none fails at it.
    for _ in range(4):
        kit.clock.advance(timedelta(hours=6).total_seconds())
        await kit.reconciler.reconcile(REPO, 1, light=True)
    assert kit.state.overlap.get(30) is None, "the closed Klaud PR is never removed from the index"
    assert kit.state.meta.reconciled_at == stamp(kit.clock.now())
    # The refactor may touch any family: it overlaps them all until GitHub lists its files.
    wave = await kit.waves.run(REPO, trigger="test")
    assert wave is not None
    found = next(d for d in wave.decisions if d.family == H200)
    assert (found.decision, found.reason) == ("overlap", "PR #40: file list unavailable; assuming it touches this family")
    kit.repo.clear_failures("pull_files")
    kit.clock.advance(timedelta(hours=6).total_seconds())
    await kit.reconciler.reconcile(REPO, 1, light=True)
    assert kit.state.overlap.get(40).files_complete


@pytest.mark.parametrize("installation_event", ["received", "lost"])
async def test_a_command_whose_delivery_was_given_up_before_the_first_reconcile_is_still_answered(
    kit: Kit, installation_event: str
) -> None:
    responder = CommandResponder(kit.live, kit.waves, Permissions(kit.clock), kit.clock)
    reconciler = Reconciler(kit.live, kit.catalog, kit.pulls, kit.outcomes, kit.claims, None,
                            MissedComments(kit.live, responder, kit.outcomes))
    kit.repo.permissions["alice"] = "write"
    # The App is installed while GitHub has a bad quarter of an hour: the installation's
    # reconcile fails (remembered, retried with backoff).
    kit.repo.fail("repository", Unavailable(502, "Bad Gateway"), times=1000)
    if installation_event == "received":
        await reconciler.reconcile_all(1, [REPO])
        assert REPO in reconciler.failures
    assert kit.live.repo(REPO) is None
    # Meanwhile alice writes a command. Its delivery needs the repository's state first:
    # every retry of it fails the same way, until the inbox gives up on it.
    kit.clock.advance(120)
    comment = Comment(id=701, body=f"/klaud hold {H200} flaky driver", user=Account(login="alice", type="User"),
                      created_at=kit.clock.now())
    kit.repo.comments_on.setdefault(12, []).append(comment)
    event = RepoEvent.model_validate({"repository": {"full_name": REPO}, "installation": {"id": 1}})
    for _ in range(5):
        try:
            await reconciler.state_for(event)
        except Unavailable:
            kit.clock.advance(50)
    # GitHub is back: the failed reconcile is retried and succeeds.
    kit.repo.clear_failures("repository")
    kit.clock.advance(3600)
    await reconciler.retry_failed()  # (the next discovery, were the failure not remembered)
    if kit.live.repo(REPO) is None:
        await reconciler.reconcile_new_installations()
    assert kit.live.repo(REPO) is not None
    # Light reconciles go by; every one of them sweeps the comments.
    for _ in range(3):
        kit.clock.advance(timedelta(hours=6).total_seconds())
        await reconciler.reconcile(REPO, 1, light=True)
    replies = [c.body for c in kit.repo.comments_on[12] if f"<!-- klaud-command:{701} -->" in (c.body or "")]
    assert len(replies) == 1, "alice's command is never answered"
    assert H200 in kit.state.holds


async def test_a_first_reconcile_that_succeeds_at_the_next_event_is_no_longer_failing(kit: Kit) -> None:
    # README: `failing` lists "the reconciles that failed and wait for their retry". The
    # first event's reconcile fails (remembered by state_for), the next event's succeeds:
    # the repository stayed `failing`, and its retry reconciled it once more from GitHub.
    kit.repo.fail("repository", Unavailable(502, "Bad Gateway"), times=1)
    event = RepoEvent.model_validate({"repository": {"full_name": REPO}, "installation": {"id": 1}})
    try:
        await kit.reconciler.state_for(event)
    except Unavailable:
        pass
    assert REPO in kit.reconciler.failures
    kit.clock.advance(10)
    assert await kit.reconciler.state_for(event) is not None
    assert REPO not in kit.reconciler.failures
    kit.clock.advance(3600)
    before = len(kit.repo.calls)
    await kit.reconciler.retry_failed()
    assert kit.repo.calls[before:] == []
