"""Dashboard ticks whose webhooks come late."""

from __future__ import annotations

import json

import aiohttp

from tests import scenarios as sc
from tests.harness import headers_for, sandbox_stack
from tests.stack.test_dashboard_e2e import (
    B200,
    H200,
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
