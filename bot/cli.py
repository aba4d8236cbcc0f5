"""The `klaud` command (DESIGN §3.1). Exit status: 0 success, 2 bad arguments or settings, 1 otherwise."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import uuid
from pathlib import Path
from typing import Any, Sequence

import structlog
from aiohttp import web

from bot.app import Klaud
from bot.inbox import Delivery
from bot.log import configure_logging
from bot.server import create_app
from bot.settings import Settings, SettingsError, load_settings

log = structlog.get_logger("klaud.cli")


class UsageError(Exception):
    """Bad arguments: reported on one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="klaud", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the bot")
    serve.add_argument("--sandbox", action="store_true", help="also run the sandbox GitHub")
    serve.add_argument("--scenario", type=Path, help="scenario file for --sandbox")

    receive = sub.add_parser("receive", help="feed one payload through the handlers")
    receive.add_argument("--event", required=True)
    receive.add_argument("--payload", required=True, type=Path)
    receive.add_argument("--delivery", default=None)
    return parser


async def _serve(settings: Settings, args: argparse.Namespace) -> None:
    klaud = Klaud(settings)
    await klaud.start()
    app = create_app(klaud)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    await site.start()
    log.info("serve.listening", host=settings.host, port=settings.port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("serve.stopping")
    # Stop accepting webhooks first, then let running handlers finish.
    await site.stop()
    await klaud.stop(grace=10.0)
    await runner.cleanup()
    log.info("serve.stopped")


async def _receive(settings: Settings, args: argparse.Namespace) -> int:
    try:
        body = args.payload.read_bytes()
        payload = json.loads(body)
    except OSError as exc:
        raise UsageError(f"--payload: cannot read {args.payload}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--payload: not JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise UsageError("--payload: must hold a JSON object")
    delivery = Delivery.from_payload(
        args.delivery or f"receive-{uuid.uuid4()}", args.event, body, payload, {}
    )
    klaud = Klaud(settings)
    await klaud.start(drain=False)
    try:
        await klaud.handle(delivery)
    finally:
        await klaud.stop()
    print(json.dumps({"delivery": delivery.id, "event": args.event, "status": "done"}))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed the reason
        return 2 if exc.code else 0
    try:
        settings = load_settings(
            require_secret=args.command == "serve",
            require_app=args.command == "serve" and not getattr(args, "sandbox", False),
        )
    except SettingsError as exc:
        print(f"klaud: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format)
    try:
        return asyncio.run(_run(settings, args))
    except UsageError as exc:
        print(f"klaud: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 1


async def _run(settings: Settings, args: argparse.Namespace) -> Any:
    if args.command == "serve":
        await _serve(settings, args)
        return 0
    if args.command == "receive":
        return await _receive(settings, args)
    raise UsageError(f"unknown command {args.command}")
