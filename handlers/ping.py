"""`ping`: GitHub checks the hook after it is created or edited."""

from __future__ import annotations

import structlog
from gidgethub import routing, sansio

from handlers.context import HandlerContext

router = routing.Router()
log = structlog.get_logger("klaud.handlers.ping")


@router.register("ping")
async def on_ping(event: sansio.Event, ctx: HandlerContext) -> None:
    hook = event.data.get("hook") or {}
    log.info("ping", hook_id=event.data.get("hook_id"), events=hook.get("events"))
