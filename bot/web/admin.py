"""The admin listener: the read API, /metrics, health and the status page (DESIGN §3.3).

It carries private repository data (authors, branches, hold reasons, delivery errors), so it
binds to loopback by default and, with KLAUD_ADMIN_TOKEN set, wants `Authorization: Bearer
<token>` on every route but the health checks (which orchestrators probe without secrets).
"""

from __future__ import annotations

import hmac
import re

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from bot.core.domain import TIME_EXPECTED, parse_time
from bot.metrics import REGISTRY
from bot.web.backend import (
    KLAUD_KEY,
    Backend,
    error,
    json_errors,
    json_response,
    klaud_of,
)
from bot.web.health import add_health_routes
from bot.web.page import add_status_routes
from bot.web.webhook import HEADER_TOKEN, IDLE_SECONDS

TOKEN_KEY = web.AppKey("admin_token", bytes)
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
DEFAULT_WAVES, MAX_WAVES = 10, 100  # Klaud keeps the latest 100 wave documents
LIMIT = re.compile(r"[0-9]{1,3}")


@web.middleware
async def bearer_token(request: web.Request, handler: Handler) -> web.StreamResponse:
    token = request.app[TOKEN_KEY]
    if not token or request.path in OPEN_PATHS:
        return await handler(request)
    # The header's bytes as sent: aiohttp keeps those that are not UTF-8 as surrogates,
    # which a plain encode() refuses (a 500 with a traceback for any client).
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    # The scheme's name is case-insensitive (RFC 9110 §11.1), the token is not.
    # RFC 6750 §2.1: "Bearer" 1*SP token; a token never starts with a space (settings).
    given = f"{scheme.lower()} {credentials.lstrip(' ')}".encode("utf-8", "surrogateescape")
    # Constant time: how much of a guess matched must not show in the answer's timing.
    if not hmac.compare_digest(given, b"bearer " + token):
        response = error(401, "unauthorized", "this listener wants Authorization: Bearer <KLAUD_ADMIN_TOKEN>")
        response.headers["WWW-Authenticate"] = "Bearer"
        return response
    return await handler(request)


async def metrics(request: web.Request) -> web.Response:
    response = web.Response(body=generate_latest(REGISTRY))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


async def delivery_status(request: web.Request) -> web.Response:
    wanted = request.match_info["id"]
    # Only ids /webhook could have stored: PostgreSQL's text refuses a NUL (a 500 there).
    delivery = await klaud_of(request).inbox.get(wanted) if HEADER_TOKEN.fullmatch(wanted) else None
    if delivery is None:
        return error(404, "not-found", "no delivery with that id")
    return json_response(delivery.status_document())


def _repo_name(request: web.Request) -> str:
    return f"{request.match_info['owner']}/{request.match_info['repo']}"


def _not_installed(request: web.Request) -> web.Response:
    return error(404, "not-found", f"{_repo_name(request)} is not an installed repository")


async def repo_state(request: web.Request) -> web.Response:
    document = await klaud_of(request).state_document(_repo_name(request))
    return _not_installed(request) if document is None else json_response(document)


async def repos(request: web.Request) -> web.Response:
    klaud = klaud_of(request)
    return json_response({"repos": klaud.repo_names(), "failing": klaud.reconcile_failures()})


async def repo_plan(request: web.Request) -> web.Response:
    at = None
    if "at" in request.query:
        try:
            at = parse_time(request.query["at"])
        except ValueError:
            return error(400, "invalid-parameter", f"at must be {TIME_EXPECTED}")
    document = await klaud_of(request).plan_document(_repo_name(request), at)
    return _not_installed(request) if document is None else json_response(document)


async def repo_waves(request: web.Request) -> web.Response:
    raw = request.query.get("limit", str(DEFAULT_WAVES))
    if not LIMIT.fullmatch(raw) or not 1 <= int(raw) <= MAX_WAVES:
        return error(400, "invalid-parameter", f"limit must be an integer from 1 to {MAX_WAVES}")
    documents = await klaud_of(request).wave_documents(_repo_name(request), int(raw))
    return _not_installed(request) if documents is None else json_response(documents)


@web.middleware
async def private(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every answer of this listener holds private repository data (authors, branches, hold
    reasons, delivery errors), or its absence: no cache may keep one."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        exc.headers["Cache-Control"] = "no-store"
        raise
    response.headers["Cache-Control"] = "no-store"
    return response


def create_admin_app(klaud: Backend, *, token: str | None = None) -> web.Application:
    # Silent connections closed as on the webhook listener: the two share the process's descriptors.
    app = web.Application(
        middlewares=[private, bearer_token, json_errors], handler_args={"keepalive_timeout": IDLE_SECONDS}
    )
    app[KLAUD_KEY] = klaud
    app[TOKEN_KEY] = (token or "").encode()
    add_health_routes(app, public=False)
    app.router.add_get("/metrics", metrics)
    # Any id /webhook takes, braces included (the default pattern `[^{}/]+` leaves them out).
    app.router.add_get("/api/v1/deliveries/{id:[^/]+}", delivery_status)
    app.router.add_get("/api/v1/repos", repos)
    app.router.add_get("/api/v1/repos/{owner}/{repo}/state", repo_state)
    app.router.add_get("/api/v1/repos/{owner}/{repo}/plan", repo_plan)
    app.router.add_get("/api/v1/repos/{owner}/{repo}/waves", repo_waves)
    add_status_routes(app)
    return app
