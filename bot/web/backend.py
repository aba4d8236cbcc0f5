"""What both listeners share: the running Klaud they serve, JSON answers, and the boundary
that turns an unexpected exception into a logged, JSON 500."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

import msgspec
import structlog
from aiohttp import web
from aiohttp.typedefs import Handler

from bot.services.status_view import StatusViews
from bot.web.inbox import Inbox

log = structlog.get_logger("klaud.http")


class Backend(Protocol):
    """What the HTTP endpoints need of the running Klaud (`bot.app.Klaud` provides it)."""

    inbox: Inbox
    started: bool
    status: StatusViews  # what the status page shows

    @property
    def ready(self) -> bool: ...

    def webhook_secrets(self) -> list[str]: ...

    async def state_document(self, repo: str) -> dict[str, Any] | None: ...

    def repo_names(self) -> list[str]:
        """The repositories this process keeps, sorted."""
        ...

    def reconcile_failures(self) -> dict[str, dict[str, object]]:
        """The reconciles that failed and wait for their retry, by repository (or
        installation): why a repository is missing from `repo_names`."""
        ...

    async def plan_document(self, repo: str, at: datetime | None = None) -> dict[str, Any] | None: ...

    async def wave_documents(self, repo: str, limit: int) -> list[dict[str, Any]] | None:
        """The last `limit` stored wave documents, newest first; None for an unknown repository."""
        ...


KLAUD_KEY = web.AppKey("klaud", Backend)


def klaud_of(request: web.Request) -> Backend:
    return request.app[KLAUD_KEY]


def json_response(document: Any, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(document), status=status, content_type="application/json")


def error(status: int, code: str, detail: str) -> web.Response:
    """The contract's error body (DESIGN §3.3)."""
    return json_response({"error": code, "detail": detail}, status)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Unknown routes answer JSON; an exception a handler let escape is logged with its
    traceback (one JSON line) and answered 500, never left to a bare traceback."""
    unmatched = request.match_info.http_exception
    if unmatched is not None:
        return error(unmatched.status, "not-found" if unmatched.status == 404 else "method-not-allowed", unmatched.reason)
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception:
        log.exception("http.failed", method=request.method, path=request.path)
        return error(500, "internal-error", "the request failed; the server log has the reason")
