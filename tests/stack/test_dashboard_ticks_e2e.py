"""Dashboard ticks whose webhooks come late, or on a render older than the state they act on."""

from __future__ import annotations

import json

import aiohttp

from tests import scenarios as sc
from tests.harness import headers_for, sandbox_stack
from tests.stack.test_dashboard_e2e import (
    B200,
    H200,
    REPO,
    held_twice,
    tick_unhold,
    wave,
)


async def test_a_readers_tick_carried_by_a_writers_late_webhook_is_not_acted_on(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        issue = await held_twice(run)  # alice holds H200 and B200
        run.sandbox.set_faults({"rules": [{"webhook": "issues", "rate": 1.0}]})
        body = await tick_unhold(run, issue, issue["body"], H200, "carol")  # carol may only read
        await tick_unhold(run, issue, body, B200, "bob")  # bob, a writer, ticks on top of it
        run.sandbox.set_faults({"rules": []})
        bobs = [d for d in run.sandbox.deliveries if d.event == "issues" and d.payload["sender"]["login"] == "bob"][-1]
        # The next render reads the issue first: carol edited since, so nothing acts; it unticks.
        run.sandbox.clock.advance(120)
        await wave(run)
        assert sorted(h["family"] for h in run.state()["holds"]) == sorted([B200, H200])
        # bob's delivery arrives late (a backlog, a retry): his own tick acts ...
        raw = json.dumps(bobs.payload).encode()
        async with aiohttp.ClientSession() as session, session.post(
                f"{run.url}/webhook", data=raw, headers=headers_for("issues", raw)) as response:
            assert response.status == 202
        await run.settle()
        holds = [h["family"] for h in run.state()["holds"]]
        assert B200 not in holds
        # ... and carol's tick, carried in his edit's body, must not act as his.
        assert holds == [H200]


async def test_a_fresh_tick_does_not_release_a_hold_placed_after_the_render_it_was_ticked_on(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        issue = await held_twice(run)  # alice's holds, shown with unhold boxes
        run.sandbox.clock.advance(60)
        for body in (f"/klaud unhold {H200}", f"/klaud hold {H200} new weights"):
            await run.act({"action": "comment", "repo": REPO, "number": 900, "user": "bob", "body": body})
        [now] = [i for i in run.github()["issues"] if i["number"] == issue["number"]]
        assert now["body"] == issue["body"]  # not re-rendered: it still shows alice's hold
        run.sandbox.clock.advance(60)
        await tick_unhold(run, issue, issue["body"], H200, "alice")  # its webhook comes
        await run.klaud.dashboard.settle()
        # README: "A box is about what the render it was ticked on showed: it releases no
        # hold placed ... after that render." bob's hold came after it.
        assert sorted(h["family"] for h in run.state()["holds"]) == sorted([B200, H200])
