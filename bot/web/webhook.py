"""The webhook listener: `POST /webhook`, `/healthz`, `/readyz` and nothing else (DESIGN §3.3).

A delivery is acknowledged only once stored. Everything that costs nothing is checked
before the body is read (headers, content type, announced length, a signature header at
all), the signature before the body is parsed, and the routing fields before it is stored.
Only the routing fields are taken from the payload here; handlers parse it when they run.
"""

from __future__ import annotations

import asyncio
import hmac
import re
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

import structlog
from aiohttp import web

from bot.core.events import RECONCILE_REQUEST
from bot.metrics import DELIVERIES
from bot.store.deliveries import KEPT_HEADERS, Delivery
from bot.web.backend import (
    KLAUD_KEY,
    Backend,
    error,
    json_errors,
    json_response,
    klaud_of,
)
from bot.web.body import (
    ENCODINGS,
    MAX_BODY,
    BodyBudget,
    Rejected,
    encoding_of,
    most_held,
    read_body,
    too_large,
)
from bot.web.envelope import UnreadableBody, envelope_of
from bot.web.events import event_label
from bot.web.health import add_health_routes

log = structlog.get_logger("klaud.webhook")

READ_TIMEOUT = 30.0  # seconds for a body to arrive, waiting for the budget included
# One body at the cap (or one gzip body, whose decoded size is unknown) plus room for many
# ordinary (~25 KB) ones; bench/abuse.py measures what 50 stalled uploads then cost.
BODY_BUDGET = 40 * 1024 * 1024
# What aiohttp buffers of a body nobody reads yet before it stops reading the socket (it
# stops at twice this): a request waiting for the budget holds little more than this.
READ_BUFFER = 16 * 1024
# After an early answer (413, 408) the rest of the body is read and dropped this long, so a
# client still sending sees the answer; then the connection is closed.
LINGER_SECONDS = 2.0
# A connection with no request in progress (idle between requests, or with its headers
# still unfinished) is closed after this long; aiohttp's default keeps it an hour, and a
# few thousand half-sent headers would use up the process's file descriptors.
IDLE_SECONDS = 15.0

# What a 503 for a store at risk asks the sender to wait (the inbox drains meanwhile).
STORAGE_RETRY_AFTER = 60
# GitHub gives up on an answer after 10 s and counts the delivery failed: a store that has
# not kept it by then is answered 503 while its write goes on.
STORE_ANSWER_SECONDS = 8.0

SIGNATURE = re.compile(r"sha256=[0-9a-f]{64}")
# Event names and delivery ids are stored as text and used as keys: printable ASCII only,
# and never a dot segment, which every URL (`/api/v1/deliveries/{id}`) resolves away.
HEADER_TOKEN = re.compile(r"(?!\.\.?\Z)[\x21-\x7e]{1,200}")


@dataclass(frozen=True)
class Intake:
    read_timeout: float
    budget: BodyBudget


INTAKE_KEY = web.AppKey("intake", Intake)


@dataclass(frozen=True)
class Headers:
    event: str
    delivery_id: str
    signature: str


async def webhook(request: web.Request) -> web.Response:
    klaud = klaud_of(request)
    # The body's share of the budget is held until it is stored (or refused).
    async with AsyncExitStack() as budget:
        try:
            delivery = await _receive(request, klaud, budget)
        except Rejected as rejected:
            return _reject(request.headers.get("X-GitHub-Event", ""), rejected)
        return await _store(klaud, delivery)


async def _receive(request: web.Request, klaud: Backend, budget: AsyncExitStack) -> Delivery:
    secrets = klaud.webhook_secrets()
    headers = _checked_headers(request, secrets)
    # Before the body is read: a store at risk takes nothing more (GitHub can redeliver).
    risk = klaud.inbox.storage_risk()
    if risk is not None:
        raise Rejected(503, "storage-at-risk", risk, retry_after=STORAGE_RETRY_AFTER)
    intake = request.app[INTAKE_KEY]
    deadline = asyncio.get_running_loop().time() + intake.read_timeout
    try:
        async with asyncio.timeout_at(deadline):
            account = await budget.enter_async_context(intake.budget.account(most_held(request)))
            chunks = await read_body(request, account)
    except TimeoutError:
        raise Rejected(408, "request-timeout", f"the body did not arrive within {intake.read_timeout:g} s") from None
    body = b"".join(chunks)
    if not _signed(body, headers.signature, secrets):
        raise Rejected(401, "invalid-signature", "signature does not match")
    return _delivery(request, headers, body)


def _checked_headers(request: web.Request, secrets: list[str]) -> Headers:
    event = request.headers.get("X-GitHub-Event", "")
    delivery_id = request.headers.get("X-GitHub-Delivery", "")
    for name, value in (("X-GitHub-Event", event), ("X-GitHub-Delivery", delivery_id)):
        if not value:
            raise Rejected(400, "missing-header", f"{name} header is required")
        if not HEADER_TOKEN.fullmatch(value):
            raise Rejected(400, "invalid-header", f"{name} must be 1-200 printable ASCII characters, and not . or ..")
    if event == RECONCILE_REQUEST:
        raise Rejected(400, "invalid-header", f"X-GitHub-Event {event} is Klaud's own, never GitHub's")
    if request.content_type != "application/json":
        raise Rejected(415, "unsupported-media-type", f"expected application/json, got {request.content_type or 'none'}")
    if encoding_of(request) not in ENCODINGS:
        raise Rejected(415, "unsupported-media-type", f"Content-Encoding must be one of {', '.join(ENCODINGS)}")
    if request.content_length is not None and request.content_length > MAX_BODY:
        raise too_large()
    signature = request.headers.get("X-Hub-Signature-256", "")
    if not signature:
        raise Rejected(401, "invalid-signature", "missing X-Hub-Signature-256")
    if not SIGNATURE.fullmatch(signature) or not secrets:
        raise Rejected(401, "invalid-signature", "signature does not match")
    return Headers(event, delivery_id, signature)


def _signed(body: bytes, signature: str, secrets: list[str]) -> bool:
    # hmac.digest: OpenSSL's one-shot HMAC, with no Python object per update.
    return any(
        hmac.compare_digest("sha256=" + hmac.digest(secret.encode(), body, "sha256").hex(), signature)
        for secret in secrets
    )


def _delivery(request: web.Request, headers: Headers, body: bytes) -> Delivery:
    try:
        envelope = envelope_of(body)
    except UnreadableBody as exc:
        raise Rejected(400, exc.code, exc.detail) from None
    return Delivery(
        id=headers.delivery_id,
        event=headers.event,
        body=body,
        action=envelope.action,
        repo=envelope.repo,
        installation=envelope.installation,
        headers={name: _text(request.headers[name]) for name in KEPT_HEADERS if name in request.headers},
    )


def _text(value: str) -> str:
    """A header's value as UTF-8 text: bytes that are not UTF-8 (aiohttp keeps them as
    surrogates, which neither the store nor a JSON log line can write) become U+FFFD."""
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _reject(event: str, rejected: Rejected) -> web.Response:
    # The header is the sender's choice: counted under a bounded label, logged truncated.
    DELIVERIES.labels(event_label(event), "rejected").inc()
    log.warning(
        "delivery.rejected", status=rejected.status, error=rejected.code, detail=rejected.detail,
        github_event=_text(event[:64]),
    )
    response = error(rejected.status, rejected.code, rejected.detail)
    if rejected.retry_after is not None:
        response.headers["Retry-After"] = str(rejected.retry_after)
    return response


async def _store(klaud: Backend, delivery: Delivery) -> web.Response:
    label = event_label(delivery.event)
    # Passed to each line rather than bound to the context: this runs for every delivery.
    context = {
        "delivery_id": delivery.id,
        "github_event": delivery.event,
        "action": delivery.action,
        "repository": delivery.repo,
        "installation": delivery.installation,
    }
    try:
        stored = await klaud.inbox.put_in_time(delivery, STORE_ANSWER_SECONDS)
    # Whatever the engine raised, the delivery is not stored: logged with its traceback,
    # and GitHub is told so (503) rather than given a 202 or a bare 500.
    except Exception:
        log.exception("delivery.store_failed", **context)
        return error(503, "store-unavailable", "the delivery could not be stored; retry later")
    if stored is None:
        log.error("delivery.store_slow", **context)
        response = error(503, "store-slow", "the store did not answer in time; a redelivery is answered as a duplicate "
                         "if the delivery was kept")
        response.headers["Retry-After"] = str(STORAGE_RETRY_AFTER)
        return response
    if not stored:
        DELIVERIES.labels(label, "duplicate").inc()
        log.info("delivery.duplicate", **context)
        return json_response({"delivery": delivery.id, "duplicate": True})
    DELIVERIES.labels(label, "accepted").inc()
    # At debug: the line that says what became of the delivery is `delivery.processed`.
    log.debug("delivery.received", **context)
    if delivery.event == "ping":
        return json_response({"delivery": delivery.id, "queued": True, "ping": True})
    return json_response({"delivery": delivery.id, "queued": True}, 202)


async def _expect(request: web.Request) -> web.Response | None:
    """`Expect: 100-continue` as aiohttp answers it; any other expectation is refused with
    the contract's error body (aiohttp's own 417 is plain text, sent before any middleware)."""
    if request.headers.get("Expect", "").lower() != "100-continue":
        return _reject(request.headers.get("X-GitHub-Event", ""),
                       Rejected(417, "expectation-failed", "only Expect: 100-continue is understood"))
    if request.version >= (1, 1):
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the answer's own head and body are still to come
    return None


def create_webhook_app(
    klaud: Backend,
    *,
    read_timeout: float = READ_TIMEOUT,
    body_budget: int = BODY_BUDGET,
    idle_timeout: float = IDLE_SECONDS,
    extra_routes: Callable[[web.Application], None] | None = None,
) -> web.Application:
    """The listener GitHub reaches. `extra_routes` mounts the sandbox in `serve --sandbox`."""
    app = web.Application(
        middlewares=[json_errors],
        # /webhook reads its own body; this bounds the sandbox's routes when it is mounted.
        client_max_size=MAX_BODY + 1,
        # aiohttp would inflate a gzip body before the cap could count it: /webhook does it.
        handler_args={
            "auto_decompress": False,
            "lingering_time": LINGER_SECONDS,
            "read_bufsize": READ_BUFFER,
            "keepalive_timeout": idle_timeout,
        },
    )
    app[KLAUD_KEY] = klaud
    app[INTAKE_KEY] = Intake(read_timeout, BodyBudget(body_budget))
    app.router.add_post("/webhook", webhook, expect_handler=_expect)
    add_health_routes(app, public=True)
    if extra_routes is not None:
        extra_routes(app)
    return app
