"""A repository whose lease went while a batch of it ran, taken back by the same replica
before that batch ended (DESIGN §6: a delivery is processed once, by its repository's owner).

The replica was cut off from the store past its lease; the next owner processed what it had
claimed and let the repository go; the first took it back. What its old batch still held had
been run by the other owner: neither its waiting deliveries nor its running handler may act
again (their GitHub writes went out twice; only the store commit was refused, too late).
Found by a review of the inbox under replicas."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

from bot.core.clock import ManualClock
from bot.services.live import LiveState
from bot.services.replicas import Replicas
from bot.store import open_stores
from bot.store.deliveries import Delivery, status_statement
from bot.store.engine import Statement
from bot.web.inbox import Inbox
from tests.services.test_replicas import database, nodes  # noqa: F401  (fixtures)
from tests.web.test_inbox_batches import Gate, wait_for


def replica_a(stores: Any, handler: Any) -> tuple[Inbox, Replicas]:
    """Replica `a`: its inbox running `handler`, and its lease coordinator."""
    inbox = Inbox(stores.deliveries, handler, claim_every=0.01, batch_size=32)
    live = LiveState(stores.state, None, ManualClock(datetime(2026, 12, 1, tzinfo=UTC)), ())
    a = Replicas(stores.leases, stores.deliveries, live, busy=inbox.busy, release=inbox.release, owner="a")
    inbox.ownership = a
    return inbox, a


async def test_a_delivery_the_next_owner_finished_is_not_run_again_when_the_repository_comes_back(nodes, database):  # noqa: F811
    # a runs x1 (x2 waits behind it in the same batch) when it loses o/x's lease; b takes the
    # repository, processes x1 and x2, and lets it go; a takes it back while x1's handler still
    # runs, and claims a new delivery x3. The release mark of a's old queue is cleared by that
    # claim: after x1, a's batch goes on to run x2's handler (its GitHub writes allowed, a owns
    # o/x again), a delivery b already processed.
    stores = await open_stores(database)
    gate = Gate(held={"x1"})
    inbox = None
    try:
        inbox, a = replica_a(stores, gate)
        for n in (1, 2):
            body = json.dumps({"n": n}).encode()
            assert await stores.deliveries.put(Delivery(f"x{n}", "push", body, repo="o/x", installation=7))
        await a.round()
        assert a.owns("o/x")
        await inbox.open()
        await inbox.start()
        await wait_for(lambda: "x1" in gate.running)

        # a is cut off from the store past its lease of o/x: b takes the repository over.
        await stores.engine.transaction([Statement("UPDATE leases SET expires_at = 0 WHERE name = 'repo:o/x'", ())])
        b = await nodes("b")
        await b.replicas.round()
        assert b.replicas.owns("o/x")
        claimed = [d.id for d in await b.stores.deliveries.claim_owned("b", {"o/x"}, unrouted=False, limit=9)]
        assert claimed == ["x1", "x2"]
        for delivery_id in claimed:  # b processes both, as its inbox does (fenced by its claim)
            writer = b.stores.deliveries.writer
            unit = writer.begin_unit(b.stores.deliveries.claim_fence(delivery_id, "b"))
            await writer.end_unit(unit, [status_statement(delivery_id, "done", 1, None)])
        await b.replicas.stop()  # and lets it go (a rolling deploy)

        # A new delivery of o/x; a's next round learns it lost the lease, and takes o/x back.
        assert await stores.deliveries.put(Delivery("x3", "push", b'{"n": 3}', repo="o/x", installation=7))
        await a.round()
        assert a.owns("o/x")
        for _ in range(300):  # a's claim loop claims x3
            if (await stores.deliveries.progress(["x3"]))["x3"].claimed_by == "a":
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("x3 not claimed by a in 3 s")

        gate.open.set()  # x1's handler at a returns
        await wait_for(lambda: "x3" in gate.runs and inbox.backlog == 0)
        ran_again = [run for run in gate.runs if run in ("x1", "x2")]
        assert ran_again == ["x1"], f"a ran {ran_again}: x2 was processed by b already"
    finally:
        if inbox is not None:
            await inbox.stop()
        await stores.close()


async def test_a_handler_running_since_before_the_lease_went_writes_no_github_after_the_repository_comes_back(nodes, database):  # noqa: F811
    # a runs x1's handler (a slow GitHub read) when it is cut off from the store past o/x's
    # lease; b takes o/x, processes x1 (its reply posted by b) and lets it go; a's next round
    # takes o/x back while x1's handler still runs. The guard before each GitHub write
    # (`Klaud._before_github_write`) asks only whether a owns o/x *now*: x1's reply is sent a
    # second time by a (its commit is then refused by the claim fence, too late).
    from types import SimpleNamespace

    from bot.app import Klaud
    from bot.store.errors import LeaseTaken

    stores = await open_stores(database)
    resume = asyncio.Event()
    running: set[str] = set()
    writes: list[str] = []

    async def handler(delivery: Delivery) -> None:
        running.add(delivery.id)
        if delivery.id == "x1":
            await resume.wait()  # a slow GitHub read
            guard = SimpleNamespace(store=live.store, inbox=inbox)
            try:  # the reply to the event: the guard runs right before the send
                await Klaud._before_github_write(guard, "https://api.github.com/repos/o/x/issues/1/comments")
            except LeaseTaken:
                return
            writes.append(delivery.id)

    inbox = None
    try:
        inbox, a = replica_a(stores, handler)
        live = a.live
        assert await stores.deliveries.put(Delivery("x1", "issue_comment", b'{"n": 1}', repo="o/x", installation=7))
        await a.round()
        await inbox.open()
        await inbox.start()
        await wait_for(lambda: "x1" in running)

        await stores.engine.transaction([Statement("UPDATE leases SET expires_at = 0 WHERE name = 'repo:o/x'", ())])
        b = await nodes("b")
        await b.replicas.round()
        assert b.replicas.owns("o/x")
        assert [d.id for d in await b.stores.deliveries.claim_owned("b", {"o/x"}, unrouted=False, limit=9)] == ["x1"]
        writer = b.stores.deliveries.writer  # b runs x1 (and posts its reply), then commits it
        unit = writer.begin_unit(b.stores.deliveries.claim_fence("x1", "b"))
        await writer.end_unit(unit, [status_statement("x1", "done", 1, None)])
        await b.replicas.stop()

        # Something else of o/x waits (a new delivery, or o/x's stored state): a takes o/x back.
        assert await stores.deliveries.put(Delivery("x2", "push", b'{"n": 2}', repo="o/x", installation=7))
        await a.round()

        resume.set()  # x1's handler at a goes on to its reply
        await wait_for(lambda: "x2" in running and inbox.backlog == 0)
        assert writes == [], "a posted x1's reply again: b processed x1 already"
    finally:
        if inbox is not None:
            await inbox.stop()
        await stores.close()
