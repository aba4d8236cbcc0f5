"""Replicas that really plan and dispatch (DESIGN §4 "A wave", §6): three replica processes
started as `klaud serve` starts them, on one PostgreSQL store, with the real handlers,
against one sandbox GitHub holding several repositories; waves triggered in every
repository; one replica killed with SIGKILL in the middle of a wave, between a dispatch
GitHub made and the end of the wave (which commits its document and the runs it linked).

The sandbox runs in this process, behind a tap that sees every workflow dispatch (and
fires the SIGKILL) and a load balancer that spreads its webhooks over the replicas. What
is checked comes from the sandbox's own record of dispatches and from the stored wave
documents: no candidate is dispatched twice, every candidate a stored wave selected was
dispatched exactly once by that wave, the dispatches no stored wave accounts for are the
dead replica's, and its repositories are owned again within 30 s.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
from aiohttp import web

from bot.core.domain import claim_ref
from bot.core.policy import Policy
from bot.runtime import SANDBOX_APP_ID, generate_app_key
from bot.sandbox import Sandbox, load_scenario
from tests.harness import SECRET
from tests.helpers import sandbox_replica_server
from tests.helpers.sandbox_replica_server import ShiftedClock
from tests.helpers.slow_server import wait_for_urls
from tests.stack.test_replicas_e2e import Replica, owners, stop_all

REPOS = [f"acme/fleet-{n}" for n in range(6)]
TAKEOVER_LIMIT = 30.0  # DESIGN §6: a dead replica's repositories are carried on within 30 s
# The victim dies as GitHub answers the third dispatch of one of its waves: two dispatches
# are done and one is made but unheard of, and none of them is in the store yet (a wave
# stores its claims and dispatches when it ends), so its successor plans them all again.
KILL_AT_DISPATCH = 3
# What a successor decides for a family the killed wave dispatched: never `selected` again.
GUARDED = ("in-flight", "claimed")
DISPATCH_PATH = re.compile(r"/_sandbox/github/repos/(?P<repo>[^/]+/[^/]+)/actions/workflows/[^/]+/dispatches")


def fleet_scenario() -> dict[str, Any]:
    """The bundled demo repository (30 real families, of which 12 can be dispatched) under
    several names, without the demo's timeline: every repository starts alike."""
    scenario = load_scenario(None)
    [demo] = scenario["repositories"]
    scenario["repositories"] = [{**copy.deepcopy(demo), "full_name": name} for name in REPOS]
    scenario["timeline"] = []
    return scenario


@dataclass
class Dispatched:
    repo: str
    candidate: str
    wave: str
    status: int
    at: float  # time.monotonic() when GitHub answered it


@dataclass
class Tap:
    """Sees every workflow dispatch the sandbox answers, and kills the victim replica right
    after GitHub made its KILL_AT_DISPATCH-th dispatch of one wave, before it hears back."""

    store_url: str
    seen: list[Dispatched] = field(default_factory=list)
    victim: Replica | None = None
    victim_repos: set[str] = field(default_factory=set)
    killed_at: float | None = None
    killed_in: str | None = None
    problem: str | None = None

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        match = DISPATCH_PATH.fullmatch(request.path)
        if request.method != "POST" or match is None:
            return await handler(request)
        response = await handler(request)
        # Read after the sandbox did (aiohttp keeps the body it read): read before, the
        # sandbox would find the stream at its end and see no body at all.
        inputs = (await request.json())["inputs"]
        repo = match["repo"].lower()
        self.seen.append(Dispatched(repo, inputs["candidate"], inputs["wave"], response.status, time.monotonic()))
        armed = self.victim is not None and self.killed_at is None and repo in self.victim_repos
        if armed and sum(1 for d in self.seen if d.repo == repo and d.wave == inputs["wave"]) == KILL_AT_DISPATCH:
            await self._kill(repo)
        return response

    async def _kill(self, repo: str) -> None:
        assert self.victim is not None
        holder = (await owners(self.store_url)).get(f"repo:{repo}")
        if holder != self.victim.owner:
            # Then this dispatch came from another replica and the test would prove nothing.
            self.problem = f"{repo}'s dispatch came while {holder}, not the victim, held its lease"
        os.kill(self.victim.process.pid, signal.SIGKILL)
        self.killed_at = time.monotonic()
        self.killed_in = repo


@dataclass
class Balancer:
    """The load balancer in front of the replicas: each webhook goes to the next replica in
    turn, and one a replica does not acknowledge (it is dead) to the one after, as a
    redelivery from GitHub would."""

    replicas: list[Replica] = field(default_factory=list)
    acknowledged: Counter[str] = field(default_factory=Counter)  # replica owner -> deliveries
    refused: int = 0
    turn: itertools.count[int] = field(default_factory=itertools.count)
    session: aiohttp.ClientSession | None = None

    async def forward(self, request: web.Request) -> web.Response:
        if self.session is None:
            self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        body = await request.read()
        headers = {name: value for name, value in request.headers.items() if name.lower() not in ("host", "content-length")}
        for _ in range(2 * len(self.replicas)):
            replica = self.replicas[next(self.turn) % len(self.replicas)]
            try:
                async with self.session.post(f"{replica.url}/webhook", data=body, headers=headers) as answer:
                    if answer.status in (200, 202):
                        self.acknowledged[replica.owner] += 1
                        return web.Response(status=answer.status, body=await answer.read(), content_type="application/json")
            except aiohttp.ClientError:
                pass
            self.refused += 1
        return web.json_response({"error": "no replica answered"}, status=502)


@dataclass
class ServingReplica(Replica):
    admin_url: str  # its API: the stored wave documents of the repositories it owns


def start_replica(store_url: str, sandbox_url: str, key_file: Path, offset: float, folder: Path) -> ServingReplica:
    folder.mkdir(parents=True, exist_ok=True)
    urls = folder / f"urls-{uuid.uuid4().hex}"
    process = subprocess.Popen(
        [sys.executable, str(sandbox_replica_server.SCRIPT), store_url, sandbox_url, str(key_file), str(urls), str(offset)],
        stderr=(folder / "stderr").open("ab"),
    )
    url, admin_url = wait_for_urls(urls, process, timeout=60)
    return ServingReplica(process, url, json.loads(urls.read_text())["owner"], admin_url)


async def poll(what: str, check: Callable[[], Awaitable[bool]], timeout: float) -> None:
    """Until `check` holds; fails the test with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        await asyncio.sleep(0.1)


async def fetch(store_url: str, sql: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(store_url)
    try:
        return await conn.fetch(sql)
    finally:
        await conn.close()


async def trigger_waves(sandbox: Sandbox) -> None:
    """`repository_dispatch` klaud-plan in every repository at once: a wave each, now."""
    answers = await asyncio.gather(*(sandbox.act({"action": "dispatch", "repo": repo, "event_type": "klaud-plan"}) for repo in REPOS))
    for repo, answer in zip(REPOS, answers, strict=True):
        # 200: a replica that died after storing it; the next one found it already stored.
        assert answer["statuses"] in ([202], [200]), f"{repo}: the trigger was not acknowledged: {answer}"


async def test_no_candidate_is_dispatched_twice_when_a_replica_dies_mid_wave(store_url: str, tmp_path: Path) -> None:
    scenario = fleet_scenario()
    private_pem, public_key = generate_app_key()
    key_file = tmp_path / "app-key.pem"
    key_file.write_text(private_pem)
    # One time line for the sandbox and the replicas: the scenario's, running in real time.
    offset = (datetime.fromisoformat(scenario["now"]) - datetime.now(UTC)).total_seconds()
    # Strict: the replicas must sign App JWTs with the key and use the tokens it issued.
    sandbox = Sandbox(scenario, clock=ShiftedClock(offset), webhook_secret=SECRET, strict_auth=True,
                      app_id=SANDBOX_APP_ID, app_public_key=public_key)
    tap = Tap(store_url)
    balancer = Balancer()
    app = web.Application(middlewares=[tap.middleware])
    sandbox.add_routes(app)
    app.router.add_post("/_balancer/webhook", balancer.forward)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    origin = "http://{}:{}".format(*runner.addresses[0][:2])
    sandbox.world.origin = origin
    sandbox.deliver_to = f"{origin}/_balancer/webhook"

    replicas: list[ServingReplica] = []
    try:
        for n in range(3):
            # In a thread: a starting replica reconciles from the sandbox this loop serves.
            replicas.append(await asyncio.to_thread(start_replica, store_url, origin, key_file, offset, tmp_path / f"replica-{n}"))
            balancer.replicas = list(replicas)
        names = {f"repo:{repo}" for repo in REPOS}

        async def balanced() -> bool:
            held = await owners(store_url)
            return set(held) >= names and Counter(held[name] for name in names) == {r.owner: 2 for r in replicas}

        # The first replica reconciled every repository; the others take their share.
        await poll("every replica owns its share of the repositories", balanced, 30)
        victim = replicas[0]
        held = await owners(store_url)
        tap.victim_repos = {name.removeprefix("repo:") for name in names if held[name] == victim.owner}
        tap.victim = victim

        await trigger_waves(sandbox)

        async def killed() -> bool:
            return tap.killed_at is not None

        await poll(f"a wave of the victim reaching its dispatch {KILL_AT_DISPATCH}", killed, 20)
        assert tap.killed_at is not None and tap.problem is None, tap.problem
        # More waves while the victim's leases have not lapsed yet: their deliveries wait.
        await trigger_waves(sandbox)

        async def taken_over() -> bool:
            held = await owners(store_url)
            return all(held.get(f"repo:{repo}") not in (None, victim.owner) for repo in tap.victim_repos)

        await poll("the killed replica's repositories owned again", taken_over, TAKEOVER_LIMIT + 15)
        takeover = time.monotonic() - tap.killed_at

        async def settled() -> bool:
            # Each trigger makes one stored wave (the victim's unfinished one is run again),
            # and no delivery is left behind, those the victim had claimed included.
            unfinished = await fetch(store_url, "SELECT id FROM deliveries WHERE status IN ('queued', 'processing')")
            stored = await fetch(store_url, "SELECT repo FROM waves")
            return not unfinished and len(stored) == 2 * len(REPOS)

        await poll("both waves of every repository stored, every delivery processed", settled, 30)
        failed = await fetch(store_url, "SELECT id, event, action, error FROM deliveries WHERE status = 'failed'")
        held = await owners(store_url)
        admin = {replica.owner: replica.admin_url for replica in replicas}
        waves: dict[str, list[dict[str, Any]]] = {}
        async with aiohttp.ClientSession() as session:
            for repo in REPOS:  # the stored wave documents, from each repository's owner
                async with session.get(f"{admin[held[f'repo:{repo}']]}/api/v1/repos/{repo}/waves?limit=10") as answer:
                    assert answer.status == 200, f"{repo}: {answer.status} {await answer.text()}"
                    waves[repo] = await answer.json()
        github = sandbox.state_document()["repositories"]
    finally:
        await asyncio.to_thread(stop_all, replicas)  # in a thread: stopping replicas still call the sandbox
        await runner.cleanup()
        if balancer.session is not None:
            await balancer.session.close()

    assert not failed, f"deliveries that failed: {[tuple(row) for row in failed]}"
    assert all(balancer.acknowledged[r.owner] for r in replicas), f"deliveries per replica: {balancer.acknowledged}"
    assert balancer.refused, "no delivery met the dead replica: sending it to another one went untested"
    assert takeover < TAKEOVER_LIMIT, f"the killed replica's repositories were owned again after {takeover:.1f} s"

    # The sandbox's record, per repository: a candidate dispatched twice would run twice
    # (no run completes here, so every dispatch is still in flight), and every dispatch
    # is behind its family's claim ref (none is released while its run is in flight).
    made = {repo.lower(): [d["inputs"] for d in github[repo]["dispatches"]] for repo in REPOS}
    twice = {repo: sorted(c for c, n in Counter(i["candidate"] for i in inputs).items() if n > 1)
             for repo, inputs in made.items()}
    assert not any(twice.values()), f"candidates dispatched twice: { {r: c for r, c in twice.items() if c} }"
    unclaimed = [(repo, i["family"]) for repo, inputs in made.items() for i in inputs
                 if f"refs/heads/{claim_ref(i['family'])}" not in github[repo]["refs"]]
    assert not unclaimed, f"dispatched without a claim ref: {unclaimed}"
    assert sorted((d.repo, d.candidate, d.wave) for d in tap.seen) == sorted(
        (repo, i["candidate"], i["wave"]) for repo, inputs in made.items() for i in inputs)
    refused = [d for d in tap.seen if d.status != 200]
    assert not refused, f"dispatches GitHub refused: {refused}"
    # Nor more in flight than the policy allows: the successor counts the claims of the
    # dispatches it never heard of (before, it dispatched up to the cap on top of them).
    over = {repo: len(inputs) for repo, inputs in made.items() if len(inputs) > Policy().max_in_flight}
    assert not over, f"more candidates in flight than max_in_flight ({Policy().max_in_flight}): {over}"

    accounted: set[tuple[str, str]] = set()
    claimed: dict[str, set[str]] = defaultdict(set)
    for repo, documents in waves.items():
        # A wave the kill cut had its number committed before its first dispatch: the
        # successor's waves number on from it.
        numbers = sorted(doc["wave"] for doc in documents)
        first = numbers[0]
        assert numbers == [first, first + 1], f"{repo}: one stored wave per trigger"
        assert first == 1 or (first == 2 and repo.lower() in tap.victim_repos), f"{repo}: waves {numbers}"
        dispatched = {(i["candidate"], i["wave"]) for i in made[repo.lower()]}
        for doc in documents:
            # A stored document's `selected` lists exactly what its wave dispatched.
            for candidate in doc["selected"]:
                assert (candidate, str(doc["wave"])) in dispatched, f"{repo} wave {doc['wave']}: {candidate} not dispatched"
                accounted.add((repo.lower(), candidate))
            claimed[repo.lower()] |= {d["candidate"] for d in doc["decisions"] if d["decision"] in GUARDED}
        assert next(doc for doc in documents if doc["wave"] == first)["selected"], f"{repo}: the first wave dispatched nothing"

    # What no stored wave accounts for is the victim's: its unfinished wave's dispatches.
    orphans = [d for d in tap.seen if (d.repo, d.candidate) not in accounted]
    assert all(d.repo in tap.victim_repos and d.at <= tap.killed_at for d in orphans), (
        f"dispatches no stored wave made, not the victim's: {orphans}")
    assert len([d for d in orphans if d.repo == tap.killed_in]) == KILL_AT_DISPATCH, orphans
    # Its successor found each in the store (committed before its dispatch) or met its
    # claim ref: decided `in-flight` or `claimed`, not dispatched a second time.
    unguarded = [d.candidate for d in orphans if d.candidate not in claimed[d.repo]]
    assert not unguarded, f"planned again without meeting their claim refs: {unguarded}"
    print(f"deliveries per replica {dict(balancer.acknowledged)}, {balancer.refused} sent again; "
          f"{sum(len(i) for i in made.values())} dispatches, {len(orphans)} by the killed replica's unfinished wave; "
          f"its {len(tap.victim_repos)} repositories owned again after {takeover:.1f} s")
