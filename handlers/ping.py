"""`ping`: GitHub checks the hook after it is created or edited."""

from __future__ import annotations

from gidgethub import routing, sansio

from handlers.context import HandlerContext

router = routing.Router()


@router.register("ping")
async def on_ping(event: sansio.Event, ctx: HandlerContext) -> None:
    hook = event.data.get("hook") or {}
    ctx.log.info("ping", hook_id=event.data.get("hook_id"), events=hook.get("events"))
