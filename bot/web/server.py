"""The aiohttp application: webhook intake, health, metrics and the read API (DESIGN §3.3)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any, Protocol

import structlog
from aiohttp import web
from gidgethub import ValidationFailure
from gidgethub.sansio import validate_event
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from bot.metrics import DELIVERIES, REGISTRY
from bot.store.deliveries import KEPT_HEADERS, Delivery
from bot.web.inbox import Inbox

log = structlog.get_logger("klaud.server")

MAX_BODY = 25 * 1024 * 1024  # GitHub caps payloads at 25 MB


class Backend(Protocol):
    """What the HTTP endpoints need of the running Klaud (`bot.app.Klaud` provides it)."""

    inbox: Inbox
    started: bool

    @property
    def ready(self) -> bool: ...

    def webhook_secrets(self) -> list[str]: ...

    async def state_document(self, repo: str) -> dict[str, Any] | None: ...

    async def plan_document(self, repo: str) -> dict[str, Any] | None: ...


KLAUD_KEY = web.AppKey("klaud", Backend)


def error(status: int, code: str, detail: str) -> web.Response:
    return web.json_response({"error": code, "detail": detail}, status=status)


def _klaud(request: web.Request) -> Backend:
    return request.app[KLAUD_KEY]


async def _read_capped(request: web.Request) -> bytes | None:
    """The body, or None when it exceeds MAX_BODY (whatever Content-Length claimed)."""
    if request.content_length is not None and request.content_length > MAX_BODY:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(256 * 1024):
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _verify_signature(body: bytes, signature: str | None, secrets: list[str]) -> bool:
    if not signature or not secrets:
        return False
    for secret in secrets:
        try:
            # gidgethub compares with hmac.compare_digest.
            validate_event(body, signature=signature, secret=secret)
        except ValidationFailure:
            continue
        return True
    return False


def _reject(event: str, status: int, code: str, detail: str) -> web.Response:
    DELIVERIES.labels(event or "unknown", "rejected").inc()
    log.warning("delivery.rejected", status=status, error=code, detail=detail, github_event=event)
    return error(status, code, detail)


async def webhook(request: web.Request) -> web.Response:
    klaud = _klaud(request)
    event = request.headers.get("X-GitHub-Event", "")
    body = await _read_capped(request)
    if body is None:
        return _reject(event, 413, "payload-too-large", f"body exceeds {MAX_BODY} bytes")
    if request.content_type != "application/json":
        return _reject(
            event,
            415,
            "unsupported-media-type",
            f"expected application/json, got {request.content_type or 'none'}",
        )
    signature = request.headers.get("X-Hub-Signature-256")
    if not _verify_signature(body, signature, klaud.webhook_secrets()):
        detail = "missing X-Hub-Signature-256" if not signature else "signature does not match"
        return _reject(event, 401, "invalid-signature", detail)
    delivery_id = request.headers.get("X-GitHub-Delivery", "")
    if not event or not delivery_id:
        missing = "X-GitHub-Event" if not event else "X-GitHub-Delivery"
        return _reject(event, 400, "missing-header", f"{missing} header is required")
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return _reject(event, 400, "invalid-json", f"body is not JSON: {exc}")
    if not isinstance(payload, dict):
        return _reject(event, 400, "invalid-json", "body must be a JSON object")

    headers = {name: request.headers[name] for name in KEPT_HEADERS if name in request.headers}
    delivery = Delivery.from_payload(delivery_id, event, body, payload, headers)
    structlog.contextvars.bind_contextvars(
        delivery_id=delivery.id,
        github_event=event,
        action=delivery.action,
        repository=delivery.repo,
        installation=delivery.installation,
    )
    try:
        try:
            stored = await klaud.inbox.put(delivery)
        except sqlite3.Error as exc:
            log.error("delivery.store_failed", error=str(exc))
            return error(503, "store-unavailable", "the delivery could not be stored; retry later")
        if not stored:
            DELIVERIES.labels(event, "duplicate").inc()
            log.info("delivery.duplicate")
            return web.json_response({"delivery": delivery_id, "duplicate": True}, status=200)
        DELIVERIES.labels(event, "accepted").inc()
        log.info("delivery.received")
        if event == "ping":
            return web.json_response({"delivery": delivery_id, "queued": True, "ping": True})
        return web.json_response({"delivery": delivery_id, "queued": True}, status=202)
    finally:
        structlog.contextvars.clear_contextvars()


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def readyz(request: web.Request) -> web.Response:
    klaud = _klaud(request)
    inbox = klaud.inbox
    body = {
        "started": klaud.started,
        "store": inbox.store.is_open,
        "backlog": inbox.backlog,
        "limit": inbox.backlog_limit,
    }
    return web.json_response(body, status=200 if klaud.ready else 503)


async def metrics(request: web.Request) -> web.Response:
    response = web.Response(body=generate_latest(REGISTRY))
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response


async def delivery_status(request: web.Request) -> web.Response:
    delivery = await _klaud(request).inbox.get(request.match_info["id"])
    if delivery is None:
        return error(404, "not-found", "no delivery with that id")
    return web.json_response(delivery.status_document())


def _repo_name(request: web.Request) -> str:
    return f"{request.match_info['owner']}/{request.match_info['repo']}"


async def repo_state(request: web.Request) -> web.Response:
    document = await _klaud(request).state_document(_repo_name(request))
    if document is None:
        return error(404, "not-found", f"{_repo_name(request)} is not an installed repository")
    return web.json_response(document)


async def repo_plan(request: web.Request) -> web.Response:
    document = await _klaud(request).plan_document(_repo_name(request))
    if document is None:
        return error(404, "not-found", f"{_repo_name(request)} is not an installed repository")
    return web.json_response(document)


def create_app(klaud: Backend, extra_routes: Any = None) -> web.Application:
    # Bodies are read (and capped) by the webhook handler itself so that an oversized
    # body is answered with the JSON error of the contract rather than aiohttp's text.
    app = web.Application(client_max_size=MAX_BODY + 1)
    app[KLAUD_KEY] = klaud
    app.router.add_post("/webhook", webhook)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/v1/deliveries/{id}", delivery_status)
    app.router.add_get("/api/v1/repos/{owner}/{repo}/state", repo_state)
    app.router.add_get("/api/v1/repos/{owner}/{repo}/plan", repo_plan)
    if extra_routes is not None:
        extra_routes(app)
    return app
