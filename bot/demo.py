"""`klaud demo`: the sandbox GitHub, the bot, the scenario's timeline, then one wave.

Runs against a throw-away store so a demo never touches real state. Prints every
family's decision with its reason and the GitHub requests the wave itself made (only
claim and dispatch writes: a wave reads nothing from GitHub).
"""

from __future__ import annotations

import logging
import tempfile
from typing import Any, Awaitable, Callable

from pydantic import SecretStr

from bot.log import configure_logging
from bot.core.report import render_requests, render_wave_table
from bot.runtime import start_stack
from bot.settings import Settings

DEMO_SECRET = "klaud-demo-secret"


async def run_demo(
    settings: Settings,
    *,
    scenario: dict[str, Any] | None,
    once: bool,
    wait: Callable[[], Awaitable[None]],
) -> int:
    # The table is the demo's output; only problems are logged.
    configure_logging(settings.log_format, level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="klaud-demo-") as tmp:
        settings = settings.model_copy(
            update={
                "db": f"sqlite:///{tmp}/demo.db",
                "webhook_secret": settings.webhook_secret or SecretStr(DEMO_SECRET),
                "port": 0 if once else settings.port,
            }
        )
        stack = await start_stack(settings, scenario=scenario, sandbox_mode=True, schedule=False)
        try:
            sandbox, klaud = stack.sandbox, stack.klaud
            print(f"Klaud and the sandbox GitHub at {stack.url} (sandbox time {sandbox.clock.now():%Y-%m-%d %H:%M} UTC)")
            steps = await sandbox.run_timeline()
            await klaud.inbox.drained()
            await klaud.checks.settle()
            deliveries = sum(len(step.get("deliveries", [])) for step in steps)
            print(f"Played the scenario's timeline: {len(steps)} actions, {deliveries} webhooks delivered and processed.")
            for name in sorted(klaud.live.repos):
                sandbox.log.reset()
                wave = await klaud.waves.run(name, trigger="demo")
                if wave is None:
                    print(f"{name}: Klaud is disabled by its .github/klaud.yml")
                    continue
                print()
                print(render_wave_table(wave))
                print()
                print(render_requests(sandbox.request_log["by_route"]))
            if not once:
                print(f"\nServing at {stack.url} (state: {stack.url}/api/v1/repos/OWNER/NAME/state); Ctrl-C stops.")
                await wait()
        finally:
            await stack.stop()
    return 0
