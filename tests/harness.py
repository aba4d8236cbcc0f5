"""Run a real Klaud server on 127.0.0.1 for tests, and sign deliveries like GitHub."""

from __future__ import annotations

import hashlib
import hmac
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bot.app import Klaud
from bot.settings import load_settings
from bot.web.admin import create_admin_app
from bot.web.server import Listeners, bind, start_listeners
from bot.web.webhook import create_webhook_app

SECRET = "test-secret"
PREVIOUS_SECRET = "old-secret"


def sign(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def headers_for(event: str, body: bytes, *, delivery: str | None = None, secret: str = SECRET) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "X-GitHub-Event": event,
        "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
        "X-Hub-Signature-256": sign(body, secret),
    }


def make_settings(db_path: Path, **env: str):
    db_path.parent.mkdir(parents=True, exist_ok=True)
    values = {
        "KLAUD_WEBHOOK_SECRET": SECRET,
        "KLAUD_WEBHOOK_SECRET_PREVIOUS": PREVIOUS_SECRET,
        "KLAUD_DB": f"sqlite:///{db_path}",
        "KLAUD_LOG_FORMAT": "console",
        # Never the internet: a test that calls GitHub without the sandbox fails fast here.
        "KLAUD_GITHUB_URL": "http://127.0.0.1:9",
        # Never a fixed port: tests run beside each other and beside a real Klaud.
        "KLAUD_ADMIN_PORT": "0",
    }
    values.update(env)
    return load_settings(values)


class Running:
    """A served Klaud: `url` is the webhook listener, `admin_url` the API and /metrics."""

    def __init__(self, klaud: Klaud, listeners: Listeners, session: aiohttp.ClientSession) -> None:
        self.klaud = klaud
        self.listeners = listeners
        self.url = listeners.url
        self.admin_url = listeners.admin_url
        self.session = session

    @property
    def webhook_app(self) -> web.Application:
        return self.listeners.runners[0].app

    async def post(self, event: str, payload: Any, *, delivery: str | None = None, secret: str = SECRET) -> tuple[int, dict]:
        body = json.dumps(payload).encode()
        async with self.session.post(
            f"{self.url}/webhook", data=body, headers=headers_for(event, body, delivery=delivery, secret=secret)
        ) as response:
            return response.status, await response.json()

    async def get_json(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        """GET from the admin listener (the API; health answers on both listeners)."""
        async with self.session.get(f"{self.admin_url}{path}", headers=headers) as response:
            return response.status, await response.json()


@asynccontextmanager
async def running_klaud(
    klaud: Klaud, *, drain: bool = True, admin_token: str | None = None, **webhook_options: Any
) -> AsyncIterator[Running]:
    """Klaud's two listeners on free loopback ports; `webhook_options` go to create_webhook_app."""
    await klaud.start(drain=drain)
    listeners = await start_listeners(
        (create_webhook_app(klaud, **webhook_options), bind("127.0.0.1", 0, "webhook")),
        (create_admin_app(klaud, token=admin_token), bind("127.0.0.1", 0, "admin")),
        # A short shutdown: a test that leaves a connection open must not wait a minute for it.
        shutdown_timeout=0.5,
    )
    try:
        async with aiohttp.ClientSession() as session:
            yield Running(klaud, listeners, session)
    finally:
        await listeners.stop()
        await klaud.stop(grace=5.0)


@asynccontextmanager
async def sandbox_stack(tmp_path: Path, scenario: dict[str, Any], **options: Any) -> AsyncIterator[SandboxRun]:
    """Klaud with the sandbox GitHub mounted (like `klaud serve --sandbox`), on a free port."""
    from bot.runtime import start_stack

    settings = make_settings(tmp_path / "klaud.db", KLAUD_PORT="0", **options.pop("env", {}))
    klaud_options = {"check_delay_seconds": 0.02, "inbox_options": {"base_delay": 0.005, "max_delay": 0.02}}
    klaud_options.update(options.pop("klaud_options", {}))
    stack = await start_stack(
        settings,
        scenario=scenario,
        sandbox_mode=True,
        schedule=False,
        klaud_options=klaud_options,
        shutdown_timeout=0.5,
        **options,
    )
    try:
        yield SandboxRun(stack)
    finally:
        await stack.stop()


class SandboxRun:
    """Drive the sandbox and wait for the bot to have processed what it delivered."""

    def __init__(self, stack: Any) -> None:
        self.stack = stack
        self.klaud: Klaud = stack.klaud
        self.sandbox = stack.sandbox
        self.url = stack.url  # the webhook listener, with the sandbox mounted
        self.admin_url = stack.admin_url

    async def act(self, action: dict[str, Any]) -> dict[str, Any]:
        answer = await self.sandbox.act(action)
        await self.settle()
        return answer

    async def settle(self) -> None:
        """Until no delivery, background webhook, check-run or dashboard flush is pending."""
        for _ in range(20):
            await self.sandbox.drain()
            await self.klaud.inbox.drained()
            await self.klaud.checks.settle()
            await self.klaud.dashboard.settle()
            if not self.sandbox._tasks and self.klaud.inbox.backlog == 0:
                return
        raise AssertionError(
            f"state did not settle: {len(self.sandbox._tasks)} webhooks in flight, "
            f"{self.klaud.inbox.backlog} deliveries queued"
        )

    def state(self, repo: str = "acme/bench") -> dict[str, Any]:
        return self.klaud.live.repo(repo).state_document(self.klaud.clock.now())

    def github(self, repo: str = "acme/bench") -> dict[str, Any]:
        return self.sandbox.state_document()["repositories"][repo]

    def reset_requests(self) -> None:
        self.sandbox.log.reset()

    @property
    def requests(self) -> dict[str, Any]:
        return self.sandbox.request_log
