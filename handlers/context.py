"""What every handler is given besides the event."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from bot.app import Klaud
    from bot.web.inbox import Delivery


@dataclass(slots=True)
class HandlerContext:
    klaud: "Klaud"
    delivery: "Delivery"

    @property
    def log(self) -> Any:
        return structlog.get_logger(f"klaud.handlers.{self.delivery.event}")
