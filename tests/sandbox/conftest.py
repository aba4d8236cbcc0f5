"""Fixtures of the sandbox tests: a served sandbox (`hub`) and a webhook receiver."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bot.sandbox import Sandbox
from tests.sandbox.test_sandbox_support import Hub, Receiver, serve, small_scenario


@pytest.fixture
async def hub() -> AsyncIterator[Hub]:
    async for served in serve(Sandbox(small_scenario())):
        yield served


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    target = Receiver()
    app = web.Application()
    app.router.add_post("/webhook", target.handle)
    async with TestServer(app, host="127.0.0.1") as server:
        target.url = str(server.make_url("/webhook"))
        yield target


@pytest.fixture
async def wired(hub: Hub, receiver: Receiver) -> Hub:
    """`hub` delivering its webhooks to `receiver`."""
    hub.sandbox.deliver_to = receiver.url
    return hub
