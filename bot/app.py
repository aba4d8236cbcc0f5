"""The running Klaud: settings, store, inbox and the services handlers use."""

from __future__ import annotations

from typing import Any

import structlog
from gidgethub import routing, sansio

from bot.clock import Clock
from bot.inbox import Delivery, Inbox
from bot.settings import Settings
from bot.store.db import Database
from handlers.context import HandlerContext

log = structlog.get_logger("klaud.app")


class Klaud:
    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock | None = None,
        router: routing.Router | None = None,
        inbox_options: dict[str, Any] | None = None,
    ) -> None:
        if router is None:
            from handlers import router as default_router

            router = default_router
        self.settings = settings
        self.clock = clock or Clock()
        self.router = router
        self.db = Database(settings.db_path)
        self.inbox = Inbox(self.db, self.handle, **(inbox_options or {}))

    async def start(self, *, drain: bool = True) -> None:
        await self.inbox.open()
        if drain:
            await self.inbox.start()

    async def stop(self, grace: float = 10.0) -> None:
        await self.inbox.stop(grace)
        await self.db.close()

    async def handle(self, delivery: Delivery) -> None:
        """Route one stored delivery to its handlers."""
        event = sansio.Event(delivery.payload(), event=delivery.event, delivery_id=delivery.id)
        if not self.router.fetch(event):
            log.info("delivery.ignored", reason="no handler for this event")
            return
        await self.router.dispatch(event, HandlerContext(self, delivery))

    async def state_document(self, repo: str) -> dict[str, Any] | None:
        return None

    async def plan_document(self, repo: str) -> dict[str, Any] | None:
        return None
