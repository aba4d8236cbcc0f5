"""The dashboard issue's publishes: a coalesced one (after a wave) and a forced one (the answer
to a ticked box, from an `issues` `edited` delivery) of one repository run one at a time."""

from __future__ import annotations

import asyncio

from bot.core.events import IssuesEvent
from bot.services import controls
from bot.services.dashboard import DashboardKeeper
from bot.services.permissions import Permissions
from tests.services.conftest import REPO, Kit


async def test_a_ticked_box_answered_while_the_wave_render_is_published_is_not_undone(kit: Kit) -> None:
    # The coalesced publish after a wave renders the dashboard, then reads the issue
    # (`_lost_ticks`, a GraphQL call) before it writes. Meanwhile the `issues` delivery of a
    # ticked "unhold" box releases the hold and publishes the answer (forced). The coalesced
    # publish then writes its render, made before the release: the issue shows the hold again.
    dashboard = DashboardKeeper(kit.live, Permissions(kit.clock), kit.clock, delay_seconds=3600)
    kit.live.wave_listeners.append(dashboard.wave_done)
    await kit.reconciler.reconcile(REPO, 1)
    kit.repo.permissions["alice"] = "admin"
    family = next(iter(kit.state.catalog))
    await controls.hold(kit.live, kit.state, family, "alice", "flaky runner", kit.clock.now())
    assert await kit.waves.run(REPO, trigger="schedule") is not None
    await dashboard.settle()
    number = kit.state.meta.dashboard["issue"]
    rendered = kit.repo.issues[number].body or ""
    assert f"- [ ] unhold `{family.id}`" in rendered

    # The next wave; its dashboard render reads the issue slowly (GitHub slow, or a retry).
    read_issue = kit.repo.edited_issue
    reading, answer = asyncio.Event(), asyncio.Event()

    async def slow_read(n: int):  # type: ignore[no-untyped-def]
        reading.set()
        await answer.wait()
        return await read_issue(n)

    kit.repo.edited_issue = slow_read  # type: ignore[method-assign]
    kit.clock.advance(120 * 60)
    assert await kit.waves.run(REPO, trigger="schedule") is not None
    flush = asyncio.create_task(dashboard.settle())
    await reading.wait()
    kit.repo.edited_issue = read_issue  # type: ignore[method-assign]

    # Alice ticks the unhold box; its delivery is handled.
    ticked = rendered.replace(f"- [ ] unhold `{family.id}`", f"- [x] unhold `{family.id}`")
    kit.repo.issues[number] = kit.repo.issues[number].model_copy(update={"body": ticked})
    kit.repo.editors[number] = "alice"
    event = IssuesEvent.model_validate({
        "action": "edited",
        "issue": {"number": number, "title": "Klaud Cold dashboard", "body": ticked},
        "changes": {"body": {"from": rendered}},
        "sender": {"login": "alice", "type": "User"},
        "repository": {"full_name": REPO},
        "installation": {"id": 1},
    })
    forced = asyncio.Event()
    publish = dashboard.publish

    async def forced_publish(repo: str, *, force: bool = False) -> None:
        forced.set()  # the answer's render (the coalescer keeps its own reference to publish)
        await publish(repo, force=force)

    dashboard.publish = forced_publish  # type: ignore[method-assign]
    handler = asyncio.create_task(dashboard.on_issue_edited(kit.state, event))
    # The delivery's handler runs as far as it can while the wave's render waits for GitHub:
    # to its end, its answer written, unless its publish waits for the wave's one to end.
    for _ in range(10_000):
        if handler.done() or (forced.is_set() and dashboard._publishing.held(REPO.lower())):
            break
        await asyncio.sleep(0)
    assert family.id not in kit.state.holds

    answer.set()
    assert (await asyncio.gather(flush, handler))[1] == 1
    await dashboard.close()
    # The hold is released; the issue (and the marker a lost store is restored from) must say so.
    assert f"unhold `{family.id}`" not in (kit.repo.issues[number].body or "")
