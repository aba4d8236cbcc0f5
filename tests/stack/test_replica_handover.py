"""GitHub side effects across a change of a repository's owner (DESIGN §6).

Two in-process replicas on one PostgreSQL store and one sandbox GitHub. Replica A is the
`serve --sandbox` stack (the sandbox's webhooks reach A, which stores them in the shared
inbox); replica B is a second Klaud on the same store and the same sandbox. Lease rounds
are run by hand, so each handover happens at a known moment: a new replica joins and the
old one gives up what is "above the share", exactly as a rolling deploy does; or the old
one's lease lapses (the store out of reach) and the new one takes the repository.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from bot.app import Klaud
from bot.store.leases import repo_lease
from tests import scenarios as sc
from tests.harness import SandboxRun, sandbox_stack
from tests.helpers.waiting import until
from tests.stack.test_people_e2e import B200, H200, klaud_pr

REPOS = ("acme/bench", "acme/other")
DELAY = 30.0  # the coalescers' window: a flush is pending while ownership moves


def two_repositories(pulls: list[dict[str, Any]]) -> dict[str, Any]:
    scenario = sc.scenario(pulls=pulls)
    [first] = scenario["repositories"]
    scenario["repositories"].append({**copy.deepcopy(first), "full_name": REPOS[1]})
    return scenario


@asynccontextmanager
async def two_replicas(tmp_path: Path, store_url: str, scenario: dict[str, Any]) -> AsyncIterator[tuple[SandboxRun, Klaud]]:
    options = {"check_delay_seconds": DELAY}
    async with sandbox_stack(tmp_path, scenario, env={"KLAUD_DB": store_url}, klaud_options=options) as run:
        a = run.klaud
        assert a.replicas is not None
        a.replicas._stopping.set()  # its rounds from now on are run by hand (stop() still releases)
        await a.replicas.round()
        await run.settle()  # the first reconcile's check runs are published
        assert all(a.replicas.owns(repo) for repo in REPOS)
        b = Klaud(a.settings, clock=run.sandbox.clock, check_delay_seconds=DELAY,
                  inbox_options={"base_delay": 0.005, "max_delay": 0.02})
        assert b.replicas is not None
        b.replicas.round_seconds = 3600.0  # rounds by hand
        await b.start(drain=True)  # its first round: a heartbeat, nothing free to take
        try:
            yield run, b
        finally:
            await b.stop(grace=2.0)


def moving_repository(run: SandboxRun) -> str:
    """The repository A will give up above its share once it sees B: the idle one last
    in its spread order (`Replicas.round`)."""
    assert run.klaud.replicas is not None
    return max(REPOS, key=run.klaud.replicas._spread)


async def rebalance(run: SandboxRun, b: Klaud, moving: str) -> None:
    a = run.klaud
    assert a.replicas is not None and b.replicas is not None
    await a.replicas.round()  # B's heartbeat is seen: the share is 1, `moving` is given up
    assert not a.replicas.owns(moving), "A kept the repository above its share"
    await b.replicas.round()
    assert b.replicas.owns(moving) and b.live.repo(moving) is not None


async def settle_both(run: SandboxRun, b: Klaud) -> None:
    await run.sandbox.drain()
    await run.klaud.inbox.drained()
    await b.inbox.drained()
    for klaud in (run.klaud, b):
        await klaud.checks.settle()
        await klaud.dashboard.settle()


async def processed(run: SandboxRun) -> None:
    """Every stored delivery processed (by the replica owning its repository), without
    flushing the coalescers."""
    await run.sandbox.drain()
    for _ in range(200):
        unfinished = await run.klaud.db.fetch(
            "SELECT count(*) FROM deliveries WHERE status IN ('queued', 'processing')")
        if not unfinished[0][0] and run.klaud.inbox.backlog == 0 and not run.sandbox._tasks:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the deliveries were not processed")


async def answer_delayed(run: SandboxRun, sent: int) -> None:
    """Until `sent` of the requests the sandbox's one fault delays have reached it (GitHub
    slow to answer them)."""
    [count] = [rule.count for rule in run.sandbox.faults.rules]
    for _ in range(300):
        if run.sandbox.faults.left == [count - sent]:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the delayed request was never sent")


def answers_held(run: SandboxRun, rule: dict[str, object]) -> asyncio.Event:
    """From now on GitHub answers a request `rule` matches (its sandbox fault) once the event
    is set, however long that takes: not a latency the test must act within."""
    api = run.sandbox.api
    apply_fault, answer = api.apply_fault, asyncio.Event()

    async def held(matched, budget):  # type: ignore[no-untyped-def]
        if matched is not None:
            await answer.wait()
        await apply_fault(matched, budget)

    api.apply_fault = held  # type: ignore[method-assign]
    run.sandbox.set_faults({"rules": [rule]})
    return answer


async def in_each_repository(run: SandboxRun, action: dict[str, Any]) -> str:
    """`action` done in each repository and processed; the repository A will give up."""
    for repo in REPOS:
        await run.sandbox.act({**action, "repo": repo})
    await processed(run)
    return moving_repository(run)


@asynccontextmanager
async def kept_while_created(
    run: SandboxRun, b: Klaud, route: str, flush: Callable[[], Awaitable[None]], what: str
) -> AsyncIterator[None]:
    """A's `flush` sends creations (POSTs to `route`) that GitHub is slow to answer; inside,
    one is on the wire. Then A's lease round, above its share since B joined, must keep every
    repository until they are answered; once they are, B takes the moving one."""
    a = run.klaud
    assert a.replicas is not None
    answer = answers_held(run, {"method": "POST", "route": route, "latency_ms": 1, "count": 2})
    flushing = asyncio.create_task(flush())
    await answer_delayed(run, sent=1)
    yield
    await a.replicas.round()
    assert a.replicas.repos() == set(REPOS), f"A gave a repository up while its {what} was being created"
    answer.set()
    await flushing
    await processed(run)  # the webhooks of the creations
    await rebalance(run, b, moving_repository(run))


def lasting_waits(run: SandboxRun) -> tuple[asyncio.Event, asyncio.Event]:
    """The sandbox clock skips waits; from now on one of 5 s or more (a rate limit's) lasts,
    as on a real clock, until the second event is set. The first is set when one begins."""
    clock, skip = run.sandbox.clock, run.sandbox.clock.sleep
    waiting, over = asyncio.Event(), asyncio.Event()

    async def sleep(seconds: float) -> None:
        if seconds >= 5.0:
            waiting.set()
            await over.wait()
        await skip(seconds)

    clock.sleep = sleep  # type: ignore[method-assign]
    return waiting, over


async def lapse_to(run: SandboxRun, b: Klaud, moving: str) -> None:
    """A's lease rounds fail past its lease clock (the store out of reach): it lets go of
    everything; its lease of `moving` expires, and B takes it."""
    a = run.klaud.replicas
    assert a is not None and b.replicas is not None
    a._valid_until = 0.0
    a._let_go_if_lapsed()
    await a.leases.release(repo_lease(moving), a.owner)
    await b.replicas.round()
    assert b.replicas.owns(moving)


def check_runs(run: SandboxRun, repo: str) -> list[dict[str, Any]]:
    return [c for c in run.github(repo)["check_runs"] if c["name"] == "Klaud Cold"]


async def test_a_check_run_update_pending_at_the_handover_is_published_by_the_new_owner(
    tmp_path: Path, store_url: str
) -> None:
    # A `/klaud hold` on a Klaud PR is processed by A and committed; its check-run update
    # waits in A's coalescer window. B joins, A gives the repository up above its share,
    # B takes it. The hold must show on the PR's check run in the end.
    async with two_replicas(tmp_path, store_url, two_repositories([klaud_pr(50, H200)])) as (run, b):
        moving = moving_repository(run)
        [before] = check_runs(run, moving)
        assert "waiting for weights" not in json.dumps(before["output"])
        await run.sandbox.act({"action": "comment", "repo": moving, "number": 50, "user": "alice",
                               "body": "/klaud hold waiting for weights"})
        await processed(run)
        assert H200 in run.klaud.live.repo(moving).holds  # committed by A
        assert (run.klaud.live.repo(moving).name, 50) in run.klaud.checks.coalescer.pending

        await rebalance(run, b, moving)
        assert H200 in b.live.repo(moving).holds  # B loaded the hold from the store
        await settle_both(run, b)

        [after] = check_runs(run, moving)
        assert "waiting for weights" in json.dumps(after["output"]), (
            "the hold never reached the PR's check run: A's pending update was dropped with the "
            f"repository and B never rendered it; the check run still says {after['output'].get('title')!r}")


async def test_a_dashboard_render_pending_at_the_handover_is_published_by_the_new_owner(
    tmp_path: Path, store_url: str
) -> None:
    # A wave runs on A (a `klaud-plan` dispatch); its dashboard render waits in A's window.
    # A gives the repository up above its share, B takes it. A dashboard issue must exist.
    async with two_replicas(tmp_path, store_url, two_repositories([])) as (run, b):
        moving = moving_repository(run)
        assert run.github(moving)["issues"] == []
        await run.sandbox.act({"action": "dispatch", "repo": moving, "event_type": "klaud-plan"})
        await processed(run)
        state = run.klaud.live.repo(moving)
        assert state.meta.wave == 1  # the wave ran and was committed on A
        assert state.name in run.klaud.dashboard.coalescer.pending

        await rebalance(run, b, moving)
        assert b.live.repo(moving).meta.wave == 1
        await settle_both(run, b)

        issues = [i for i in run.github(moving)["issues"] if i["title"] == "Klaud Cold dashboard"]
        assert len(issues) == 1, (
            f"dashboard issues after wave 1 and a handover: {issues}: A's pending render was dropped "
            "with the repository and B renders only after its next wave")


async def test_a_repository_whose_check_run_is_being_created_is_given_up_once_it_is_created(
    tmp_path: Path, store_url: str
) -> None:
    # A Klaud PR is opened in each repository; A publishes their check runs: it notes each
    # creation ahead and sends it (GitHub slow to answer; the installation's writes go one
    # at a time). B has joined, so A is above its share, but it keeps both repositories
    # while their creations are unanswered: B, finding no check run yet, would create a
    # second. Then it gives one up, and B renders the PR's next change on its check run.
    async with two_replicas(tmp_path, store_url, two_repositories([])) as (run, b):
        a, moving = run.klaud, await in_each_repository(run, {"action": "open_pull", "pull": klaud_pr(51, B200)})
        state = a.live.repo(moving)
        head = state.overlap.get(51).head_sha
        async with kept_while_created(run, b, r"/check-runs$", a.checks.settle, "check run"):
            assert state.meta.check_runs["51"]["id"] is None  # noted ahead, not answered yet
        await run.sandbox.act({"action": "comment", "repo": moving, "number": 51, "user": "alice",
                               "body": "/klaud hold waiting for weights"})
        await processed(run)
        assert B200 in b.live.repo(moving).holds  # processed by B, the owner now
        await settle_both(run, b)

        on_head = [c for c in check_runs(run, moving) if c["head_sha"] == head]
        assert len(on_head) == 1, f"check runs on the PR's head: {[(c['id'], c['status']) for c in on_head]}"
        assert "waiting for weights" in json.dumps(on_head[0]["output"])


async def test_a_repository_whose_dashboard_is_being_created_is_given_up_once_it_is_created(
    tmp_path: Path, store_url: str
) -> None:
    # A wave runs in each repository and renders its dashboard: no issue yet, so A creates
    # them, and GitHub is slow to answer. A keeps both repositories above its share until
    # their issues are created; then B takes one, and B's next wave updates its issue.
    async with two_replicas(tmp_path, store_url, two_repositories([])) as (run, b):
        a, moving = run.klaud, await in_each_repository(run, {"action": "dispatch", "event_type": "klaud-plan"})
        assert a.live.repo(moving).meta.wave == 1
        async with kept_while_created(run, b, r"/issues$", a.dashboard.settle, "dashboard issue"):
            pass
        await run.sandbox.act({"action": "dispatch", "repo": moving, "event_type": "klaud-plan"})
        await processed(run)
        assert b.live.repo(moving).meta.wave == 2  # run by B, the owner now
        await settle_both(run, b)

        issues = [i for i in run.github(moving)["issues"] if i["title"] == "Klaud Cold dashboard"]
        assert [(i["number"], i["state"]) for i in issues] == [(1, "open")], issues
        assert "## Last wave: 2 " in issues[0]["body"], issues[0]["body"]


async def test_a_command_reply_waiting_out_a_rate_limit_across_a_lease_lapse_is_sent_once(
    tmp_path: Path, store_url: str
) -> None:
    # A processes `/klaud help`; its reply meets a secondary rate limit (403, Retry-After:
    # 6), so the installation's gate holds the POST. Meanwhile A's lease lapses and B takes
    # the repository and processes the delivery again, replying. A's POST, cleared for
    # ownership before it waited, is cleared again before it is sent, and is not.
    async with two_replicas(tmp_path, store_url, two_repositories([klaud_pr(50, H200)])) as (run, b):
        a = run.klaud
        moving = moving_repository(run)
        waiting, over = lasting_waits(run)
        run.sandbox.set_faults({"rules": [
            {"method": "POST", "route": r"/issues/\d+/comments$", "status": 403, "retry_after": 6, "count": 1}]})
        await run.sandbox.act({"action": "comment", "repo": moving, "number": 50, "user": "carol", "body": "/klaud help"})
        await asyncio.wait_for(waiting.wait(), 10)  # A's reply waits at the installation's gate
        await lapse_to(run, b, moving)

        def replies() -> list[str]:
            return [c["body"] for c in run.github(moving)["comments"]
                    if c["issue_number"] == 50 and c["user"] == "klaud-cold[bot]"]

        await until(lambda: bool(replies()), seconds=5)  # B processes the delivery again and answers
        assert len(replies()) == 1, "B did not answer the command"
        over.set()  # the rate limit's wait is over for A
        await until(lambda: not a.inbox._active, seconds=5)
        assert len(replies()) == 1, f"{len(replies())} replies to one `/klaud help`"


async def test_a_check_run_creation_waiting_out_a_rate_limit_across_a_lease_lapse_is_not_sent(
    tmp_path: Path, store_url: str
) -> None:
    # A notes the creation of a new PR's check run ahead and sends it; a secondary rate
    # limit holds it at the installation's gate. Meanwhile A's lease lapses (it cannot wait
    # for the flush, as a handover above the share does) and B takes the repository: it
    # looks for the check run noted ahead, finds none, and creates it. A's creation, once
    # the gate opens, is not sent.
    async with two_replicas(tmp_path, store_url, two_repositories([])) as (run, b):
        a = run.klaud
        moving = moving_repository(run)
        await run.sandbox.act({"action": "open_pull", "repo": moving, "pull": klaud_pr(51, B200)})
        await processed(run)
        state = a.live.repo(moving)
        head = state.overlap.get(51).head_sha
        waiting, over = lasting_waits(run)
        run.sandbox.set_faults({"rules": [
            {"method": "POST", "route": r"/check-runs$", "status": 403, "retry_after": 6, "count": 1}]})
        flushing = asyncio.create_task(a.checks.settle())
        await asyncio.wait_for(waiting.wait(), 10)
        assert state.meta.check_runs["51"]["id"] is None  # noted ahead, its answer a refusal

        await lapse_to(run, b, moving)
        await b.checks.settle()  # B renders the repository it took
        assert len([c for c in check_runs(run, moving) if c["head_sha"] == head]) == 1
        over.set()
        await flushing
        await settle_both(run, b)

        on_head = [c for c in check_runs(run, moving) if c["head_sha"] == head]
        assert len(on_head) == 1, f"check runs on the PR's head: {[(c['id'], c['status']) for c in on_head]}"
