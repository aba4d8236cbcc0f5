"""`ping`: GitHub checks the hook after it is created or edited."""

from __future__ import annotations

import structlog
from gidgethub import routing

from bot.core.events import PingEvent
from handlers.context import HandlerContext, WebhookEvent

router = routing.Router()
log = structlog.get_logger("klaud.handlers.ping")


@router.register("ping")
async def on_ping(event: WebhookEvent, ctx: HandlerContext) -> None:
    payload = event.parsed(PingEvent)
    log.info("ping", hook_id=payload.hook_id, events=payload.hook.events if payload.hook else None)
