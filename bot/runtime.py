"""Starting and stopping the whole stack: Klaud's server, optionally with the sandbox GitHub.

`klaud serve`, `klaud demo`, the integration tests and the benchmarks all start Klaud the
same way through `start_stack`, so what the tests exercise is what `serve` runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import SecretStr

from bot.app import Klaud
from bot.sandbox import Sandbox, load_scenario
from bot.settings import Settings
from bot.web.admin import create_admin_app
from bot.web.server import Bound, ListenError, Listeners, bind, start_listeners
from bot.web.webhook import create_webhook_app

log = structlog.get_logger("klaud.runtime")

SANDBOX_APP_ID = 1


def generate_app_key() -> tuple[str, Any]:
    """A throw-away App key for sandbox mode: (private PEM, public key)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    return pem, key.public_key()


@dataclass
class Stack:
    klaud: Klaud
    listeners: Listeners
    sandbox: Any = None  # bot.sandbox.Sandbox in sandbox mode

    @property
    def url(self) -> str:
        """The webhook listener (and the sandbox's, in sandbox mode)."""
        return self.listeners.url

    @property
    def admin_url(self) -> str:
        """The admin listener: API and /metrics."""
        return self.listeners.admin_url

    async def stop(self) -> None:
        if self.sandbox is not None:
            # The sandbox GitHub goes with the listeners: what is pending for it (a check
            # run, the dashboard) is published first, or it fails against a closed port.
            await self.klaud.checks.settle()
            await self.klaud.dashboard.settle()
        await self.listeners.stop()
        await self.klaud.stop()


async def start_stack(
    settings: Settings,
    *,
    scenario: dict[str, Any] | None = None,
    sandbox_mode: bool = False,
    schedule: bool = True,
    reconcile: bool = True,
    klaud_options: dict[str, Any] | None = None,
    shutdown_timeout: float = 10.0,
) -> Stack:
    """Start Klaud's webhook listener on settings.host:settings.port and its admin listener
    on settings.admin_host:settings.admin_port (0 picks a free port).

    In sandbox mode the sandbox GitHub is mounted in the webhook listener, the bot's GitHub
    and capacity URLs point at it, its webhooks are delivered to the bot's /webhook signed
    with the bot's secret, and the bot follows the sandbox clock.
    """
    # Bound first: an address that cannot be used stops start-up before anything opens.
    webhook_socket, admin_socket = _bind_both(settings)
    url = webhook_socket.url
    sandbox = None
    if sandbox_mode:
        sandbox, settings = _sandboxed(settings, url, scenario)
    klaud = Klaud(settings, clock=sandbox.clock if sandbox else None, **(klaud_options or {}))
    webhook_app = create_webhook_app(klaud, extra_routes=sandbox.add_routes if sandbox else None)
    admin_app = create_admin_app(klaud, token=settings.admin_token.get_secret_value() if settings.admin_token else None)
    # shutdown_timeout: how long a stop waits for open requests to finish before closing them.
    listeners = await start_listeners(
        (webhook_app, webhook_socket), (admin_app, admin_socket), shutdown_timeout=shutdown_timeout
    )
    if sandbox is not None:
        sandbox.world.origin = url
    try:
        await klaud.start(drain=True, schedule=schedule, reconcile=reconcile)
    except BaseException:
        # Failed, or cancelled by a signal during start-up: what started is stopped.
        await listeners.stop()
        await klaud.stop()
        raise
    log.info("serve.listening", url=url, admin_url=listeners.admin_url, sandbox=sandbox is not None)
    return Stack(klaud, listeners, sandbox)


def _bind_both(settings: Settings) -> tuple[Bound, Bound]:
    """The webhook and admin sockets, or neither."""
    webhook_socket = bind(settings.host, settings.port, "KLAUD_HOST/KLAUD_PORT")
    try:
        admin_socket = bind(settings.admin_host, settings.admin_port, "KLAUD_ADMIN_HOST/KLAUD_ADMIN_PORT")
    except ListenError:
        webhook_socket.sock.close()
        raise
    return webhook_socket, admin_socket


def _sandboxed(settings: Settings, url: str, scenario: dict[str, Any] | None) -> tuple[Sandbox, Settings]:
    """A sandbox GitHub served at `url`, and the settings that point the bot at it (its API,
    its capacity feed, an App key it trusts); its webhooks go to the bot's /webhook, signed
    with the bot's secret."""
    private_pem, public_key = generate_app_key()
    secret = settings.secrets()[0] if settings.secrets() else None
    sandbox = Sandbox(
        scenario if scenario is not None else load_scenario(None),
        webhook_secret=secret,
        deliver_to=f"{url}/webhook",
        app_id=SANDBOX_APP_ID,
        app_public_key=public_key,
    )
    pointed = settings.model_copy(
        update={
            "github_url": f"{url}/_sandbox/github",
            "app_id": SANDBOX_APP_ID,
            "private_key": SecretStr(private_pem),
            "capacity_url": settings.capacity_url or f"{url}/_sandbox/capacity",
        }
    )
    return sandbox, pointed


def scenario_from(path: Path | None) -> dict[str, Any] | None:
    return None if path is None else load_scenario(path)
