"""Comments whose `issue_comment` webhook was lost, found by the reconcile (MissedComments)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest

from bot.core.domain import Hold, stamp
from bot.core.events import Account, Comment
from bot.github.errors import BadRequest, Unavailable
from bot.services.missed_comments import GRACE, OVERLAP, MissedComments
from bot.services.permissions import Permissions
from bot.services.reconcile import Reconciler
from bot.services.responder import CommandResponder
from tests.services.conftest import REPO, Kit
from tests.services.test_outcomes import CAND, receipt

H200 = "configs/nvidia-master.yaml:dsr1-fp8-h200-trt"
B200 = "configs/nvidia-master.yaml:dsr1-fp4-b200-sglang"
PERSON = Account(login="alice", type="User")
SIX_HOURS = timedelta(hours=6).total_seconds()
BOT = Account(login="klaud-cold[bot]", type="Bot")


@pytest.fixture
def sweeping(kit: Kit) -> tuple[Reconciler, CommandResponder]:
    responder = CommandResponder(kit.live, kit.waves, Permissions(kit.clock), kit.clock)
    comments = MissedComments(kit.live, responder, kit.outcomes)
    return Reconciler(kit.live, kit.catalog, kit.pulls, kit.outcomes, kit.claims, None, comments), responder


def lost_comment(kit: Kit, comment_id: int, body: str, *, ago: timedelta, number: int = 12, user: Account = PERSON,
                 edited: bool = False) -> Comment:
    """A comment GitHub has, whose webhook never reached Klaud."""
    made = kit.clock.now() - ago
    comment = Comment(id=comment_id, body=body, user=user, created_at=made)
    kit.repo.comments_on.setdefault(number, []).append(comment)
    if edited:
        kit.repo.edited_at[comment_id] = made + timedelta(minutes=1)
    return comment


async def first_sweep(kit: Kit, reconciler: Reconciler) -> None:
    """The repository's first reconcile (it starts the count of comments), six hours ago."""
    await reconciler.reconcile(REPO, 1)
    kit.clock.advance(SIX_HOURS)


async def next_sweep(kit: Kit, reconciler: Reconciler) -> dict[str, Any]:
    """Six hours on, the next light reconcile: its report."""
    kit.clock.advance(SIX_HOURS)
    return await reconciler.reconcile(REPO, 1, light=True)


def replies_to(kit: Kit, comment_id: int, number: int = 12) -> list[str]:
    marker = f"<!-- klaud-command:{comment_id} -->"
    return [c.body or "" for c in kit.repo.comments_on.get(number, []) if marker in (c.body or "")]


async def test_a_command_whose_webhook_was_lost_is_answered_by_the_next_reconcile(kit: Kit, sweeping) -> None:
    reconciler, _ = sweeping
    await reconciler.reconcile(REPO, 1)  # the first one starts the count
    kit.clock.advance(SIX_HOURS)
    lost_comment(kit, 501, "/klaud status dsr1-fp8-h200-trt", ago=timedelta(hours=1))
    report = await reconciler.reconcile(REPO, 1, light=True)
    assert report["commands_answered"] == 1
    [reply] = replies_to(kit, 501)
    assert "Status of" in reply
    assert (501, "eyes") in kit.repo.reactions
    # The next reconcile finds the reply and posts nothing more.
    kit.clock.advance(SIX_HOURS)
    report = await reconciler.reconcile(REPO, 1, light=True)
    assert "commands_answered" not in report and len(replies_to(kit, 501)) == 1


async def test_comments_from_before_klaud_knew_the_repository_are_not_answered(kit: Kit, sweeping) -> None:
    reconciler, _ = sweeping
    lost_comment(kit, 502, "/klaud status dsr1-fp8-h200-trt", ago=timedelta(hours=1))
    await first_sweep(kit, reconciler)
    await reconciler.reconcile(REPO, 1, light=True)
    assert replies_to(kit, 502) == []


async def test_a_comment_still_young_is_left_to_its_webhook_until_the_next_reconcile(kit: Kit, sweeping) -> None:
    reconciler, _ = sweeping
    await first_sweep(kit, reconciler)
    lost_comment(kit, 503, "/klaud status dsr1-fp8-h200-trt", ago=GRACE / 2)
    await reconciler.reconcile(REPO, 1, light=True)
    assert replies_to(kit, 503) == []
    await next_sweep(kit, reconciler)
    assert len(replies_to(kit, 503)) == 1


async def test_an_answered_command_costs_only_the_listing(kit: Kit, sweeping) -> None:
    reconciler, responder = sweeping
    await first_sweep(kit, reconciler)
    await reconciler.reconcile(REPO, 1, light=True)
    swept_until = kit.clock.now() - GRACE
    kit.clock.advance(SIX_HOURS)
    comment = lost_comment(kit, 504, "/klaud status dsr1-fp8-h200-trt", ago=timedelta(hours=1))
    assert await responder.answer(kit.state, 12, comment) == 1  # its webhook came
    kit.repo.calls.clear()
    await reconciler.reconcile(REPO, 1, light=True)
    assert len(replies_to(kit, 504)) == 1
    assert [c[0] for c in kit.repo.calls if c[0] in ("comments", "react", "post_comment")] == []
    # Listed from where the previous reconcile stopped (with a margin for the clocks).
    assert [c[1] for c in kit.repo.calls if c[0] == "comments_since"] == [swept_until - OVERLAP]


async def test_an_edited_comment_is_ignored_as_its_edited_webhook_is(kit: Kit, sweeping) -> None:
    reconciler, _ = sweeping
    await first_sweep(kit, reconciler)
    lost_comment(kit, 505, "/klaud hold dsr1-fp8-h200-trt", ago=timedelta(hours=1), edited=True)
    await reconciler.reconcile(REPO, 1, light=True)
    assert replies_to(kit, 505) == []


async def test_a_lost_receipt_is_counted_by_the_next_reconcile(kit: Kit, sweeping) -> None:
    reconciler, _ = sweeping
    await first_sweep(kit, reconciler)
    lost_comment(kit, 506, receipt(901), ago=timedelta(hours=1), user=BOT)
    report = await reconciler.reconcile(REPO, 1, light=True)
    assert report["receipts_read"] == 1
    [attempt] = kit.state.ledger.for_candidate(CAND)
    assert (attempt.outcome, attempt.run_id) == ("incompatible", 901)


async def test_a_failed_listing_is_looked_at_again_by_the_next_reconcile(kit: Kit, sweeping) -> None:
    reconciler, _ = sweeping
    await first_sweep(kit, reconciler)
    lost_comment(kit, 507, "/klaud status dsr1-fp8-h200-trt", ago=timedelta(hours=1))
    kit.repo.fail("comments_since", Unavailable(502, "Bad Gateway"))
    report = await reconciler.reconcile(REPO, 1, light=True)  # the reconcile itself succeeds
    assert report["light"] and replies_to(kit, 507) == []
    await next_sweep(kit, reconciler)
    assert len(replies_to(kit, 507)) == 1


async def test_a_command_in_a_lost_comment_after_a_long_outage_is_not_answered(kit: Kit, sweeping) -> None:
    reconciler, _ = sweeping
    await reconciler.reconcile(REPO, 1)
    kit.clock.advance(timedelta(days=10).total_seconds())
    lost_comment(kit, 508, "/klaud status dsr1-fp8-h200-trt", ago=timedelta(days=9))
    lost_comment(kit, 509, "/klaud status dsr1-fp8-h200-trt", ago=timedelta(days=2))
    await reconciler.reconcile(REPO, 1, light=True)
    assert replies_to(kit, 508) == [] and len(replies_to(kit, 509)) == 1


async def test_the_webhook_and_the_reconcile_answering_at_once_post_one_reply(kit: Kit, sweeping) -> None:
    _, responder = sweeping
    await sweeping[0].reconcile(REPO, 1)
    comment = lost_comment(kit, 510, "/klaud status dsr1-fp8-h200-trt", ago=timedelta(hours=1))
    post = kit.repo.post_comment

    async def slow_post(number: int, body: str) -> None:
        await asyncio.sleep(0.01)  # the other finder looks for the reply meanwhile
        await post(number, body)

    kit.repo.post_comment = slow_post  # type: ignore[method-assign]
    posted = await asyncio.gather(responder.answer(kit.state, 12, comment), responder.answer(kit.state, 12, comment))
    assert sorted(posted) == [0, 1] and len(replies_to(kit, 510)) == 1


async def test_a_reply_github_refuses_costs_that_comment_alone(kit: Kit, sweeping) -> None:
    # What this catches: one reply refused for good (a locked issue: 403) stopped the sweep
    # and held its watermark; every later lost command went unanswered for a week.
    reconciler, _ = sweeping
    await first_sweep(kit, reconciler)
    lost_comment(kit, 601, "/klaud status dsr1-fp8-h200-trt", ago=timedelta(hours=2), number=7)
    lost_comment(kit, 602, "/klaud status dsr1-fp8-h200-trt", ago=timedelta(hours=1), number=12)
    kit.repo.fail("post_comment", BadRequest(403, "Unable to create comment because issue is locked."))
    report = await reconciler.reconcile(REPO, 1, light=True)
    assert report["commands_answered"] == 1 and len(replies_to(kit, 602)) == 1
    assert kit.state.meta.comments_swept_at == stamp(kit.clock.now() - GRACE)


async def test_a_transient_failure_holds_the_watermark_before_that_comment(kit: Kit, sweeping) -> None:
    reconciler, _ = sweeping
    await first_sweep(kit, reconciler)
    failing = lost_comment(kit, 603, "/klaud status dsr1-fp8-h200-trt", ago=timedelta(hours=2), number=7)
    lost_comment(kit, 604, "/klaud status dsr1-fp8-h200-trt", ago=timedelta(hours=1), number=12)
    kit.repo.fail("post_comment", Unavailable(502, "Bad Gateway"))
    await reconciler.reconcile(REPO, 1, light=True)
    assert len(replies_to(kit, 604)) == 1 and replies_to(kit, 603, number=7) == []
    assert kit.state.meta.comments_swept_at == stamp(failing.created_at)
    await next_sweep(kit, reconciler)
    assert len(replies_to(kit, 603, number=7)) == 1 and len(replies_to(kit, 604)) == 1


async def test_a_lost_command_does_not_undo_a_later_one_answered_already(kit: Kit, sweeping) -> None:
    # What this catches: alice's `hold` (its webhook lost) run by the sweep after her later
    # `unhold` (answered at once): the family stayed held against her last word.
    reconciler, responder = sweeping
    kit.repo.permissions["alice"] = "write"
    await first_sweep(kit, reconciler)
    lost_comment(kit, 605, f"/klaud hold {H200} flaky\n/klaud hold {B200} weights", ago=timedelta(hours=2))
    later = lost_comment(kit, 606, f"/klaud unhold {H200}", ago=timedelta(hours=1), number=40)
    assert await responder.answer(kit.state, 40, later) == 1
    await reconciler.reconcile(REPO, 1, light=True)
    assert H200 not in kit.state.holds and B200 in kit.state.holds  # the other command still ran
    [reply] = replies_to(kit, 605)
    assert "not run" in reply and "released after it was written" in reply


async def test_a_receipt_its_webhook_counted_is_not_reported_as_missed(kit: Kit, sweeping) -> None:
    reconciler, _ = sweeping
    await first_sweep(kit, reconciler)
    counted = lost_comment(kit, 607, receipt(902), ago=timedelta(hours=1), user=BOT)
    assert await kit.outcomes.on_receipt(kit.state, counted)  # its webhook came
    report = await reconciler.reconcile(REPO, 1, light=True)
    assert "receipts_read" not in report
    assert not await kit.outcomes.on_receipt(kit.state, counted)


async def test_a_comment_dated_by_a_github_clock_behind_klauds_is_still_found(kit: Kit, sweeping) -> None:
    # What this catches: with Klaud's clock 14 minutes ahead of GitHub's, a command made
    # just after a sweep was dated before the next sweep's window, and never answered.
    reconciler, _ = sweeping
    await first_sweep(kit, reconciler)
    await reconciler.reconcile(REPO, 1, light=True)
    # Made a minute after that sweep, by GitHub's clock 14 minutes behind.
    lost_comment(kit, 611, "/klaud status dsr1-fp8-h200-trt", ago=timedelta(minutes=13))
    await next_sweep(kit, reconciler)
    assert len(replies_to(kit, 611)) == 1


async def test_a_late_retry_does_not_clear_a_cooldown_that_began_after_it_was_written(kit: Kit, sweeping) -> None:
    # What this catches (a stack-level soak): `/klaud retry` written while the family was not
    # cooling down, its webhook lost; its run then failed for real; the sweep, hours later,
    # cleared that new cooldown and the next wave dispatched the family again.
    reconciler, _ = sweeping
    kit.repo.permissions["alice"] = "write"
    await first_sweep(kit, reconciler)
    lost_comment(kit, 620, f"/klaud retry {H200}", ago=timedelta(hours=3))
    failed = Comment(id=621, body=receipt(903), user=BOT, created_at=kit.clock.now() - timedelta(hours=2))
    assert await kit.outcomes.on_receipt(kit.state, failed)  # incompatible: a real failure
    await reconciler.reconcile(REPO, 1, light=True)
    assert CAND not in kit.state.retries
    [reply] = replies_to(kit, 620)
    assert "Not cleared" in reply and "began cooling down after it was written" in reply
    # Written after the failure, a late retry is the one the person meant: it clears.
    lost_comment(kit, 622, f"/klaud retry {H200}", ago=timedelta(minutes=20))
    kit.clock.advance(timedelta(hours=1).total_seconds())
    await reconciler.reconcile(REPO, 1, light=True)
    assert CAND in kit.state.retries and "Cleared the cooldown" in replies_to(kit, 622)[0]


async def test_a_late_resume_does_not_end_a_pause_that_began_after_it_was_written(kit: Kit, sweeping) -> None:
    reconciler, _ = sweeping
    kit.repo.permissions["alice"] = "write"
    await first_sweep(kit, reconciler)
    lost_comment(kit, 630, "/klaud resume", ago=timedelta(hours=3))
    kit.state.meta.pause = {"reason": "the last 3 waves' runs all failed", "since": stamp(kit.clock.now() - timedelta(hours=1))}
    await reconciler.reconcile(REPO, 1, light=True)
    assert not kit.state.canary_armed
    [reply] = replies_to(kit, 630)
    assert "Not resumed" in reply


async def test_a_late_unhold_does_not_release_a_hold_placed_after_it_was_written(kit: Kit, sweeping) -> None:
    # A dashboard box is no comment: only the hold's time says it came after.
    reconciler, _ = sweeping
    kit.repo.permissions["alice"] = "write"
    await first_sweep(kit, reconciler)
    lost_comment(kit, 640, f"/klaud unhold {H200}", ago=timedelta(hours=3))
    kit.state.holds[H200] = Hold(H200, "bob", "new weights", kit.clock.now() - timedelta(hours=1))
    await reconciler.reconcile(REPO, 1, light=True)
    assert H200 in kit.state.holds
    assert "held after it was written" in replies_to(kit, 640)[0]


async def test_a_lost_hold_then_a_lost_unhold_leave_the_family_unheld(kit: Kit, sweeping) -> None:
    # What this catches: the hold found late was dated when answered, after the unhold was
    # written: the unhold, found by the same sweep, took it for a newer hold and refused.
    reconciler, _ = sweeping
    kit.repo.permissions["alice"] = "write"
    await first_sweep(kit, reconciler)
    lost_comment(kit, 650, f"/klaud hold {H200} flaky", ago=timedelta(hours=3))
    lost_comment(kit, 651, f"/klaud unhold {H200}", ago=timedelta(hours=2))
    await reconciler.reconcile(REPO, 1, light=True)
    assert H200 not in kit.state.holds


async def test_a_flood_of_comments_is_read_over_several_sweeps_and_a_lost_command_still_answered(
    kit: Kit, sweeping, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What this catches (a hostile-input review): every comment since the last sweep was
    # listed at once; past the client's 20,000 the listing failed, the watermark stayed, and
    # every later sweep failed the same way: no lost command was answered again. Here a
    # sweep reads 5 comments at most.
    monkeypatch.setattr("bot.services.missed_comments.MAX_SWEPT", 5)
    reconciler, _ = sweeping
    await first_sweep(kit, reconciler)
    for n in range(12):  # spam, each a second apart, then the command whose webhook was lost
        lost_comment(kit, 600 + n, f"spam {n}", ago=timedelta(hours=5, seconds=-n))
    lost_comment(kit, 700, "/klaud status dsr1-fp8-h200-trt", ago=timedelta(hours=4))
    answered = []
    for _ in range(4):  # 5 + 5 + 5 (the last read being the command) + what is left
        report = await reconciler.reconcile(REPO, 1, light=True)
        answered.append(report.get("commands_answered", 0))
    assert answered == [0, 0, 1, 0] and len(replies_to(kit, 700)) == 1
    assert kit.state.meta.comments_swept_at == stamp(kit.clock.now() - GRACE)  # caught up


async def test_an_unhold_run_again_after_github_refused_its_reply_says_what_it_released(kit: Kit, sweeping) -> None:
    # Its first run released bob's hold, then the reply got a 502 (the watermark stays before
    # it); run again by the next sweep, it answered "was not held: nothing to release".
    reconciler, _ = sweeping
    kit.repo.permissions["alice"] = "write"
    await first_sweep(kit, reconciler)
    held_at = kit.clock.now()
    kit.state.holds[H200] = Hold(H200, "bob", "flaky weights", held_at)
    kit.clock.advance(60)
    lost_comment(kit, 607, f"/klaud unhold {H200}", ago=timedelta(0))
    kit.clock.advance((GRACE + timedelta(minutes=1)).total_seconds())
    kit.repo.fail("post_comment", Unavailable(502, "Bad Gateway"))
    await reconciler.reconcile(REPO, 1, light=True)
    assert H200 not in kit.state.holds and replies_to(kit, 607) == []
    await next_sweep(kit, reconciler)
    [reply] = replies_to(kit, 607)
    assert "Released" in reply and "bob" in reply and "flaky weights" in reply, reply


async def test_an_unhold_retried_by_its_delivery_says_what_it_released(kit: Kit, sweeping) -> None:
    from bot.core.events import IssueCommentEvent

    _, responder = sweeping
    kit.repo.permissions["alice"] = "write"
    await kit.reconciler.reconcile(REPO, 1)
    kit.state.holds[H200] = Hold(H200, "bob", "flaky weights", kit.clock.now())
    kit.clock.advance(60)
    event = IssueCommentEvent.model_validate({
        "action": "created", "issue": {"number": 12}, "repository": {"full_name": REPO}, "installation": {"id": 1},
        "comment": {"id": 608, "body": f"/klaud unhold {H200}", "user": {"login": "alice", "type": "User"},
                    "created_at": kit.clock.now().isoformat()},
    })
    kit.repo.fail("post_comment", Unavailable(502, "Bad Gateway"))
    with pytest.raises(Unavailable):
        await responder.handle(kit.state, event)
    restored = await kit.live.load_repo(REPO)  # the retry may come after a restart
    assert restored is not None and restored.meta.released_holds[H200]["comment"] == 608
    kit.clock.advance(30)
    assert await responder.handle(kit.state, event) == 1
    [reply] = replies_to(kit, 608)
    assert "Released" in reply and "bob" in reply, reply
    # Another person's unhold, written after, is told the truth: nothing was held.
    later = lost_comment(kit, 609, f"/klaud unhold {H200}", ago=timedelta(0), number=40,
                         user=Account(login="carol", type="User"))
    kit.repo.permissions["carol"] = "write"
    assert await responder.answer(kit.state, 40, later) == 1
    assert "was not held" in replies_to(kit, 609, number=40)[0]


async def test_an_unhold_run_again_answers_the_hold_it_released_not_a_later_one(kit: Kit, sweeping) -> None:
    from bot.core.events import IssueCommentEvent

    _, responder = sweeping
    kit.repo.permissions["alice"] = "write"
    await kit.reconciler.reconcile(REPO, 1)

    def unhold(comment_id: int) -> IssueCommentEvent:
        return IssueCommentEvent.model_validate({
            "action": "created", "issue": {"number": 12}, "repository": {"full_name": REPO}, "installation": {"id": 1},
            "comment": {"id": comment_id, "body": f"/klaud unhold {H200}", "user": {"login": "alice", "type": "User"},
                        "created_at": kit.clock.now().isoformat()},
        })

    kit.state.holds[H200] = Hold(H200, "bob", "flaky weights", kit.clock.now())
    kit.clock.advance(60)
    first = unhold(610)
    kit.repo.fail("post_comment", Unavailable(502, "Bad Gateway"))
    with pytest.raises(Unavailable):
        await responder.handle(kit.state, first)  # released "flaky weights"; its reply refused
    # While its delivery waits for the retry, bob holds again and alice's next comment releases it.
    kit.clock.advance(30)
    kit.state.holds[H200] = Hold(H200, "bob", "still broken", kit.clock.now())
    kit.clock.advance(30)
    assert await responder.handle(kit.state, unhold(611)) == 1
    assert "still broken" in replies_to(kit, 611)[0]
    kit.clock.advance(60)
    assert await responder.handle(kit.state, first) == 1
    [reply] = replies_to(kit, 610)
    assert "still broken" not in reply, "it names a release another comment made"
