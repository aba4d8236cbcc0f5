"""The sandbox GitHub: an aiohttp app under `/_sandbox/` (DESIGN §5).

`/_sandbox/github/…` answers the REST API, the rest is the control API used by the demo,
the tests and the benchmarks. Webhooks caused by control actions are delivered before the
action answers (so the answer carries the bot's statuses); webhooks caused by the bot's
own REST writes are delivered from a background task, never inside its request.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime
from email.utils import formatdate
from typing import Any

import aiohttp
from aiohttp import web
from pydantic import ValidationError

from bot.core.clock import ManualClock
from bot.sandbox import actions
from bot.sandbox import scenario as sc
from bot.sandbox.api import PREFIX, Api
from bot.sandbox.gate import Auth, Faults, FaultSettings, RateLimits, RequestLog
from bot.sandbox.shapes import ts
from bot.sandbox.state import RepoState, SandboxError
from bot.sandbox.webhooks import Delivery, deliver, withheld
from bot.sandbox.world import Event, World


class Sandbox:
    def __init__(
        self,
        scenario: dict[str, Any] | sc.Scenario,
        clock: ManualClock | None = None,
        webhook_secret: str | None = "s3cret",
        deliver_to: str | None = None,
        strict_auth: bool = False,
        app_id: int = 1,
        app_public_key: Any = None,
    ) -> None:
        parsed = scenario if isinstance(scenario, sc.Scenario) else sc.parse_scenario(scenario)
        self.clock = clock if clock is not None else ManualClock(parsed.now)
        self.webhook_secret = webhook_secret
        self.deliver_to = deliver_to
        self.app_id = app_id
        self.timeline = list(parsed.timeline)
        self.world = World(parsed, self.clock, app_id)
        self.faults = Faults(parsed.seed)
        self.limits = RateLimits(parsed.rate_limit, self.clock.now)
        self.log = RequestLog()
        self.auth = Auth(self.world, strict_auth, app_id, app_public_key)
        self.api = Api(self.world, self.auth, self.faults, self.limits, self.log, self._announce)
        self.deliveries: list[Delivery] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None

    # --- in-process API ----------------------------------------------------------------

    @property
    def request_log(self) -> dict[str, Any]:
        return self.log.document()

    async def act(self, body: dict[str, Any]) -> dict[str, Any]:
        """Apply one control action and deliver its webhooks; raises ScenarioError or
        SandboxError when the action is malformed or does not fit the state."""
        return await self.perform(sc.parse_action(body))

    async def perform(self, action: sc.Action) -> dict[str, Any]:
        answer, events = actions.apply(self.world, action)
        delivered = [await self._deliver(event, background=False) for event in events]
        sent = [d for d in delivered if d.attempted]
        return {"deliveries": [d.id for d in sent], "statuses": [d.status for d in sent],
                **answer}

    async def run_timeline(self) -> list[dict[str, Any]]:
        """Play the scenario's timeline in order; one answer per step."""
        return [await self.perform(step) for step in self.timeline]

    def set_faults(self, settings: dict[str, Any]) -> int:
        self.faults.configure(FaultSettings.model_validate(settings))
        return len(self.faults.rules)

    async def drain(self) -> None:
        """Wait until every background delivery has been attempted."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks))

    async def close(self) -> None:
        await self.drain()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def state_document(self) -> dict[str, Any]:
        return {
            "now": ts(self.clock.now()),
            "repositories": {repo.full_name: repo_document(repo, self.clock.now())
                             for repo in self.world.repos.values()},
        }

    # --- aiohttp -----------------------------------------------------------------------

    def add_routes(self, app: web.Application) -> None:
        app.router.add_route("*", PREFIX + "/{tail:.*}", self.api.handle)
        app.router.add_post("/_sandbox/act", self._act)
        app.router.add_get("/_sandbox/state", self._state)
        app.router.add_get("/_sandbox/requests", self._requests)
        app.router.add_post("/_sandbox/requests/reset", self._reset_requests)
        app.router.add_post("/_sandbox/faults", self._faults)
        app.router.add_get("/_sandbox/capacity", self._capacity)
        app.router.add_get("/_sandbox/deliveries", self._deliveries)
        app.router.add_get("/_sandbox/blobs/{name}", self._blob)
        app.on_response_prepare.append(self._dated)
        app.on_cleanup.append(self._cleanup)

    def create_app(self) -> web.Application:
        app = web.Application()
        self.add_routes(app)
        return app

    async def _dated(self, request: web.Request, response: web.StreamResponse) -> None:
        # GitHub's answers carry its time, and a quota's reset is read against it: here the
        # sandbox's clock is GitHub's, not the machine's (which aiohttp would write).
        if request.path.startswith(PREFIX + "/"):
            response.headers["Date"] = formatdate(self.clock.now().timestamp(), usegmt=True)

    async def _cleanup(self, _app: web.Application) -> None:
        await self.close()

    async def _act(self, request: web.Request) -> web.Response:
        self.world.origin = str(request.url.origin())
        body = await json_body(request)
        try:
            return web.json_response(await self.act(body))
        except sc.ScenarioError as exc:
            return error_response(400, "invalid-action", str(exc))
        except SandboxError as exc:
            return error_response(exc.status, "action-failed", str(exc))

    async def _state(self, _request: web.Request) -> web.Response:
        return web.json_response(self.state_document())

    async def _requests(self, _request: web.Request) -> web.Response:
        return web.json_response(self.request_log)

    async def _reset_requests(self, _request: web.Request) -> web.Response:
        self.log.reset()
        return web.json_response({"total": 0})

    async def _faults(self, request: web.Request) -> web.Response:
        body = await json_body(request)
        try:
            count = self.set_faults(body)
        except ValidationError as exc:
            return error_response(400, "invalid-faults", sc.describe(exc))
        return web.json_response({"rules": count})

    async def _capacity(self, _request: web.Request) -> web.Response:
        return web.json_response(self.world.capacity_document())

    async def _deliveries(self, _request: web.Request) -> web.Response:
        return web.json_response([d.summary() for d in self.deliveries])

    async def _blob(self, request: web.Request) -> web.Response:
        data = self.world.blobs.get(request.match_info["name"])
        if data is None:
            return error_response(404, "not-found", "no such download")
        return web.Response(body=data, content_type="application/zip")

    # --- webhooks ----------------------------------------------------------------------

    async def _deliver(self, event: Event, background: bool) -> Delivery:
        skipped = self.world.withholds(event)
        if skipped is not None:
            delivery = withheld(event, background, "skipped", skipped)
        elif self.faults.drops(event.name, event.action):
            delivery = withheld(event, background, "dropped", "fault rule")
        else:
            delivery = await self._send(event, background)
        self.deliveries.append(delivery)
        return delivery

    async def _send(self, event: Event, background: bool) -> Delivery:
        if self.deliver_to and self._session is None:
            self._session = aiohttp.ClientSession()
        return await deliver(self._session if self.deliver_to else None, self.deliver_to,
                             event, self.app_id, self.webhook_secret, background)

    def _announce(self, events: list[Event]) -> None:
        async def send() -> None:
            for event in events:
                await self._deliver(event, background=True)

        task = asyncio.get_running_loop().create_task(send())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def json_body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise web.HTTPBadRequest(
            text=json.dumps({"error": "invalid-json", "detail": "body is not JSON"}),
            content_type="application/json",
        ) from None


def error_response(status: int, code: str, detail: str) -> web.Response:
    return web.json_response({"error": code, "detail": detail}, status=status)


def repo_document(repo: RepoState, now: datetime) -> dict[str, Any]:
    """One repository of GET /_sandbox/state."""
    return {
        "full_name": repo.full_name,
        "installation_id": repo.installation_id,
        "default_branch": repo.default_branch,
        "head_sha": repo.head_sha,
        "refs": dict(sorted(repo.refs.items())),
        "pulls": [
            {"number": p.number, "title": p.title, "user": p.user, "state": p.state,
             "draft": p.draft, "merged": p.merged, "head_ref": p.head_ref,
             "head_repo": p.head_repo or repo.full_name, "head_sha": p.head_sha,
             "base_ref": p.base_ref, "base_sha": p.base_sha, "labels": list(p.labels),
             "updated_at": ts(p.updated_at), "files": [f.filename for f in p.files]}
            for p in sorted(repo.pulls.values(), key=lambda p: p.number)
        ],
        "runs": [
            {"id": r.id, "workflow": r.workflow, "name": r.name, "event": r.event,
             "status": r.status, "conclusion": r.conclusion, "head_sha": r.head_sha,
             "head_branch": r.head_branch, "run_attempt": r.run_attempt,
             "created_at": ts(r.created_at), "updated_at": ts(r.updated_at),
             "artifacts": [{"id": a.id, "name": a.name, "expired": a.expired(now)}
                           for a in r.artifacts]}
            for r in sorted(repo.runs.values(), key=lambda r: r.id)
        ],
        "check_runs": [
            {"id": c.id, "name": c.name, "head_sha": c.head_sha, "status": c.status,
             "conclusion": c.conclusion, "output": c.output, "external_id": c.external_id,
             "details_url": c.details_url}
            for c in sorted(repo.check_runs.values(), key=lambda c: c.id)
        ],
        "comments": [
            {"id": c.id, "issue_number": c.issue_number, "user": c.user, "body": c.body,
             "created_at": ts(c.created_at), "updated_at": ts(c.updated_at)}
            for c in sorted(repo.comments.values(), key=lambda c: c.id)
        ],
        "reactions": [{"comment_id": r.comment_id, "content": r.content, "user": r.user}
                      for r in repo.reactions],
        "dispatches": [{"workflow": d.workflow, "ref": d.ref, "inputs": d.inputs,
                        "at": ts(d.at), "run_id": d.run_id} for d in repo.dispatches],
        "issues": [
            {"number": i.number, "title": i.title, "body": i.body, "state": i.state,
             "user": i.user, "labels": list(i.labels)}
            for i in sorted(repo.issues.values(), key=lambda i: i.number)
        ],
    }
