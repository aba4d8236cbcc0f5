"""`/healthz` and `/readyz`, served by both listeners (DESIGN §3.3)."""

from __future__ import annotations

from functools import partial

from aiohttp import web

from bot.web.backend import json_response, klaud_of


async def healthz(request: web.Request) -> web.Response:
    return json_response({"ok": True})


async def readyz(request: web.Request, *, public: bool) -> web.Response:
    """Readiness; on the public (webhook) listener the store's error is named by its kind
    only: its message names the database's address, for anyone who can reach `/webhook`."""
    klaud = klaud_of(request)
    inbox = klaud.inbox
    if inbox.store.is_open:
        await inbox.probe_store()
    error = inbox.store_error
    body = {
        "started": klaud.started,
        "store": inbox.store.is_open,
        "store_error": error.partition(":")[0] if error is not None and public else error,
        "backlog": inbox.backlog,
        "limit": inbox.backlog_limit,
        "storage_risk": inbox.storage_risk(),
    }
    return json_response(body, 200 if klaud.ready else 503)


def add_health_routes(app: web.Application, *, public: bool) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", partial(readyz, public=public))
