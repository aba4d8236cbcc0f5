"""Klaud's two HTTP listeners (DESIGN §3.3): the webhook listener, the only one GitHub
reaches (`bot.web.webhook`), and the admin listener with the API and /metrics
(`bot.web.admin`).

Sockets are bound before anything else starts, so an address that cannot be used stops
start-up with one line naming its variables, and port 0 picks a free port without a race.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass

from aiohttp import web

from bot.settings import SettingsError


class ListenError(SettingsError):
    """An address from the settings cannot be listened on."""


@dataclass(frozen=True)
class Bound:
    """A listening socket and the URL that reaches it."""

    sock: socket.socket
    url: str


def bind(host: str, port: int, variables: str) -> Bound:
    """Listen on host:port (0: a free port); `variables` name the settings in an error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family)
    except OSError as exc:  # gaierror (no such host) included
        raise ListenError(f"{variables}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound_port = sock.getsockname()[1]
    return Bound(sock, f"http://[{host}]:{bound_port}" if family == socket.AF_INET6 else f"http://{host}:{bound_port}")


@dataclass(frozen=True)
class Listeners:
    url: str
    admin_url: str
    runners: tuple[web.AppRunner, ...]

    async def stop(self) -> None:
        """Stop taking requests; open ones get the runners' shutdown timeout to finish (both
        listeners at once: one after the other, a stop took twice the timeout)."""
        await asyncio.gather(*(runner.cleanup() for runner in self.runners))


async def start_listeners(
    webhook: tuple[web.Application, Bound],
    admin: tuple[web.Application, Bound],
    *,
    shutdown_timeout: float = 10.0,
) -> Listeners:
    runners = []
    for app, bound in (webhook, admin):
        runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=shutdown_timeout)
        await runner.setup()
        await web.SockSite(runner, bound.sock).start()
        runners.append(runner)
    return Listeners(webhook[1].url, admin[1].url, tuple(runners))
