"""Delivering webhooks the way GitHub does: signed JSON POSTs with GitHub's headers."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp

from bot.sandbox.world import Event

# GitHub gives a receiver 10 seconds before it calls a delivery failed.
DELIVERY_TIMEOUT = aiohttp.ClientTimeout(total=10)


@dataclass
class Delivery:
    id: str
    event: str
    action: str | None
    payload: dict[str, Any]
    status: int | None  # the receiver's HTTP status; None when not delivered
    background: bool
    error: str | None = None
    # Why GitHub would never send it: "dropped" by a fault rule, "skipped" by the
    # installation (an event it does not subscribe to or may not see).
    withheld: str | None = None
    reason: str | None = None

    @property
    def outcome(self) -> str:
        """sent (the receiver answered), failed, unsent (no target), dropped or skipped."""
        if self.withheld is not None:
            return self.withheld
        if self.status is not None:
            return "sent"
        return "failed" if self.error is not None else "unsent"

    @property
    def attempted(self) -> bool:
        return self.status is not None or self.error is not None

    def summary(self) -> dict[str, Any]:
        return {"id": self.id, "event": self.event, "action": self.action,
                "status": self.status, "background": self.background, "error": self.error,
                "outcome": self.outcome, "reason": self.reason}


def withheld(event: Event, background: bool, outcome: str, reason: str) -> Delivery:
    """A delivery GitHub never makes, kept so tests can see it was due."""
    return Delivery(str(uuid.uuid4()), event.name, event.action, event.payload, None,
                    background, withheld=outcome, reason=reason)


def signature_headers(secret: str | None, body: bytes) -> dict[str, str]:
    if not secret:
        return {}
    key = secret.encode("utf-8")
    return {
        "X-Hub-Signature-256": "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest(),
        "X-Hub-Signature": "sha1=" + hmac.new(key, body, hashlib.sha1).hexdigest(),
    }


def delivery_headers(event: Event, delivery_id: str, app_id: int, secret: str | None,
                     body: bytes) -> dict[str, str]:
    return {
        "X-GitHub-Event": event.name,
        "X-GitHub-Delivery": delivery_id,
        "X-GitHub-Hook-ID": str(400_000_000 + app_id),
        "X-GitHub-Hook-Installation-Target-Type": "integration",
        "X-GitHub-Hook-Installation-Target-ID": str(app_id),
        "User-Agent": "GitHub-Hookshot/sandbox",
        "Content-Type": "application/json",
        **signature_headers(secret, body),
    }


async def deliver(
    session: aiohttp.ClientSession | None,
    url: str | None,
    event: Event,
    app_id: int,
    secret: str | None,
    background: bool,
) -> Delivery:
    """POST one event; an unreachable or slow receiver is recorded, not raised."""
    delivery = Delivery(str(uuid.uuid4()), event.name, event.action, event.payload, None,
                        background)
    if session is None or url is None:
        return delivery
    body = json.dumps(event.payload).encode("utf-8")
    headers = delivery_headers(event, delivery.id, app_id, secret, body)
    try:
        async with session.post(url, data=body, headers=headers,
                                timeout=DELIVERY_TIMEOUT) as response:
            await response.read()
            delivery.status = response.status
    except (TimeoutError, aiohttp.ClientError) as exc:
        delivery.error = f"{type(exc).__name__}: {exc}"
    return delivery
