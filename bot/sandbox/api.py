"""The edge of the sandbox REST API: everything between an HTTP request and a handler.

Order per request, as GitHub behaves: route lookup, injected faults, authentication, the
rate-limit budget, the route's permission, the handler; then pagination, ETag/304 and the
rate-limit headers on the answer, and one line in the request log. A fault rule may then
cut the connection under an answer that was applied (`lose_answer`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web

from bot.sandbox.gate import (
    GRAPHQL_BUDGET,
    ApiError,
    Auth,
    FaultRule,
    Faults,
    GraphQLRateLimited,
    RateLimits,
    RequestLog,
    credential,
    fault_error,
    rate_limit_message,
)
from bot.sandbox.rest import Call, Reply, Route
from bot.sandbox.routes import build_router
from bot.sandbox.world import Event, World

PREFIX = "/_sandbox/github"
DEFAULT_PER_PAGE = 30
MAX_PER_PAGE = 100
WRITE_METHODS = frozenset({"POST", "PATCH", "PUT", "DELETE"})
# A repository's routes under the id that survives renames: where GitHub's redirects point.
BY_ID = re.compile(r"/repositories/(\d+)(/.+)")


class Api:
    def __init__(
        self,
        world: World,
        auth: Auth,
        faults: Faults,
        limits: RateLimits,
        log: RequestLog,
        announce: Callable[[list[Event]], None],
    ) -> None:
        self.world = world
        self.auth = auth
        self.faults = faults
        self.limits = limits
        self.log = log
        self.announce = announce
        self.router = build_router()
        self.request_count = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        origin = str(request.url.origin())
        self.world.origin = origin
        method = request.method
        path = self.by_name(request.path[len(PREFIX):] or "/")
        matched = self.router.match(method, path)
        label = f"{method} {matched[0].template}" if matched else f"{method} (unknown route)"
        budget = self.budget_key(None, matched[1] if matched else {}, path)
        announce: list[Event] = []
        counted = False
        rule = self.faults.pick(method, path)
        try:
            await self.apply_fault(rule, budget)
            if matched is None:
                raise ApiError(404, "Not Found")
            route, params = matched
            header = request.headers.get("Authorization")
            installation = self.auth.installation_for(path, header)
            budget = self.budget_key(installation, params, path)
            if self.limits.exhausted(budget):
                spent = self.limits.headers(budget, exhausted=True)
                if budget.endswith(GRAPHQL_BUDGET):
                    raise GraphQLRateLimited(rate_limit_message(budget), spent)
                raise ApiError(403, rate_limit_message(budget), spent)
            counted = True
            # After authentication, as GitHub does: only a caller who may see the renamed
            # repository learns its new name; any other gets the old name's 404.
            moved = self.world.moved_to(params)
            if moved is not None and self.world.repo_named(params) is None:
                if (self.auth.strict or installation is not None) and installation != moved.installation_id:
                    raise ApiError(404, "Not Found")
                raise redirect(request, params, moved.id)
            call = Call(
                world=self.world,
                shapes=self.world.shapes(origin),
                params=params,
                query=request.query,
                body=await read_json(request),
                accept=request.headers.get("Accept", ""),
                # A token the sandbox issued sees only its installation's repositories, as on
                # GitHub, strict or not: lenient auth only lets unknown credentials through.
                installation_id=installation,
                origin=origin,
                token=credential(header),
                announce=announce,
            )
            self.check_permissions(call, route)
            reply = route.handler(call)
        except ApiError as error:
            reply = Reply(error.status, error.body(), dict(error.headers))
        response = self.render(request, reply)
        if counted and response.status != 304:
            self.limits.spend(budget)
        for name, value in self.limits.headers(budget).items():
            response.headers.setdefault(name, value)
        lost = rule is not None and rule.lose_answer
        self.log.record(method, path, label, response.status, self.world.now(), lost, query=request.query_string)
        if announce:
            self.announce(announce)
        if lost:
            cut_connection(request)
        return response

    def check_permissions(self, call: Call, route: Route) -> None:
        """403 when the route needs a permission the request's installation lacks. A
        repository the request may not see at all is left to the handler's 404."""
        repo = self.world.repo_named(call.params)
        if repo is None or not self.world.app_sees(repo, call.installation_id):
            return
        call.require(repo, route.needs)

    async def apply_fault(self, rule: FaultRule | None, budget: str) -> None:
        if rule is None:
            return
        if rule.latency_ms:
            # Real time, not the sandbox clock: this is how client timeouts are provoked.
            await asyncio.sleep(rule.latency_ms / 1000)
        if rule.status or rule.ratelimit_remaining_zero:
            raise fault_error(rule, self.limits, budget)

    def by_name(self, path: str) -> str:
        """`/repositories/{id}/rest` as the route of the repository's current name (an
        unknown id keeps the path, which then matches no route: 404)."""
        found = BY_ID.fullmatch(path)
        if found is None:
            return path
        repo = self.world.repo_by_id(int(found[1]))
        return path if repo is None else f"/repos/{repo.full_name}{found[2]}"

    def budget_key(self, installation: int | None, params: dict[str, str], path: str) -> str:
        """Whose hourly budget a request spends: its installation's, else the App's; GraphQL's
        or REST's."""
        resource = GRAPHQL_BUDGET if path == "/graphql" else ""
        if installation is not None:
            return f"{installation}{resource}"
        if "owner" in params and "repo" in params:
            repo = self.world.repos.get(f"{params['owner']}/{params['repo']}".lower())
            if repo is not None:
                return f"{repo.installation_id}{resource}"
        return f"app{resource}"

    def render(self, request: web.Request, reply: Reply) -> web.Response:
        self.request_count += 1
        headers = {
            "x-github-media-type": "github.v3; format=json",
            "x-github-api-version-selected": "2022-11-28",
            "x-github-request-id": f"SANDBOX:{self.request_count:08X}",
            **reply.headers,
        }
        body = reply.body
        if reply.items is not None:
            body, link = paginate(request, reply)
            if link:
                headers["link"] = link
        if reply.raw is not None:
            payload, content_type = reply.raw, reply.content_type
        elif body is not None:
            payload, content_type = json.dumps(body).encode("utf-8"), "application/json"
        else:
            return web.Response(status=reply.status, headers=headers)
        if request.method == "GET" and reply.status == 200:
            etag = headers.get("etag") or 'W/"' + hashlib.sha1(payload).hexdigest() + '"'
            headers["etag"] = etag
            if etag in request.headers.get("If-None-Match", ""):
                return web.Response(status=304, headers=headers)
        return web.Response(status=reply.status, body=payload, headers=headers,
                            content_type=content_type, charset="utf-8")


def redirect(request: web.Request, params: dict[str, str], repository_id: int) -> ApiError:
    """A renamed repository's old route, as GitHub answers it: 301 for a read, 307 for a
    write (a client follows 307 with the same method and body), to the same route under
    `/repositories/{id}`, which does not name the repository."""
    old = f"/repos/{params['owner']}/{params['repo']}"
    location = request.url.with_path(request.path.replace(old, f"/repositories/{repository_id}", 1))
    status = 301 if request.method in ("GET", "HEAD") else 307
    return ApiError(status, "Moved Permanently", {"Location": str(location.with_query(request.query))})


def cut_connection(request: web.Request) -> None:
    """Close the connection under the answer: the request took effect, but the client
    sees only a disconnect and must read the state back to learn what happened."""
    if request.transport is not None:
        request.transport.close()


async def read_json(request: web.Request) -> Any:
    if request.method not in WRITE_METHODS or not request.can_read_body:
        return None
    raw = await request.read()
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError(400, "Problems parsing JSON") from None


def int_param(request: web.Request, name: str, default: int) -> int:
    try:
        return int(request.query.get(name, default))
    except ValueError:
        return default


def paginate(request: web.Request, reply: Reply) -> tuple[Any, str]:
    """One page of `reply.items` and GitHub's `Link` header (rel prev/next/last/first)."""
    items = reply.items or []
    per_page = min(max(int_param(request, "per_page", DEFAULT_PER_PAGE), 1), MAX_PER_PAGE)
    page = max(int_param(request, "page", 1), 1)
    last = max(1, -(-len(items) // per_page))
    chunk = items[(page - 1) * per_page: page * per_page]
    if reply.shape is not None:
        chunk = [reply.shape(item) for item in chunk]

    def url(number: int) -> str:
        return str(request.url.update_query(page=str(number), per_page=str(per_page)))

    links = []
    if page > 1:
        links.append(f'<{url(min(page - 1, last))}>; rel="prev"')
    if page < last:
        links.append(f'<{url(page + 1)}>; rel="next"')
        links.append(f'<{url(last)}>; rel="last"')
    if page > 1:
        links.append(f'<{url(1)}>; rel="first"')
    body: Any = chunk
    if reply.wrap is not None:
        total = len(items) if reply.total is None else reply.total
        body = {"total_count": total, **reply.extra, reply.wrap: chunk}
    return body, ", ".join(links)
