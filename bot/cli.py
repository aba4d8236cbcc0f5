"""The `klaud` command (DESIGN §3.1). Exit status: 0 success, 2 bad arguments or settings, 1 otherwise."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sqlite3
import sys
import tempfile
import uuid
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from pydantic import SecretStr

from bot.app import Klaud
from bot.core.domain import TIME_EXPECTED, UNREADABLE_DOCUMENT, Wave, parse_time
from bot.core.errors import is_permanent
from bot.core.policy import POLICY_PATH, PolicyError, parse_policy, policy_schema
from bot.core.report import render_requests, render_wave_table
from bot.github.errors import GitHubError
from bot.github.repo import GitHubRepos
from bot.log import configure_logging
from bot.metrics import klaud_version
from bot.runtime import scenario_from, start_stack
from bot.sandbox import Sandbox, ScenarioError, load_scenario
from bot.services.doctor import diagnose
from bot.services.reconcile import reconcile_request
from bot.settings import (
    FileTooLarge,
    Settings,
    SettingsError,
    load_settings,
    read_at_most,
)
from bot.store import sqlite_path
from bot.store.deliveries import Delivery
from bot.store.errors import StoreError, StoreLocked
from bot.web.body import MAX_BODY
from bot.web.envelope import UnreadableBody, envelope_of
from bot.web.events import KLAUD_EVENTS
from bot.web.server import bind
from bot.web.webhook import HEADER_TOKEN

log = structlog.get_logger("klaud.cli")


class UsageError(Exception):
    """Bad arguments: reported on one line, exit status 2."""


class Refused(Exception):
    """The command would write behind a running server's back: one line, exit status 1."""


# How long `klaud receive` waits for the serving replicas to process what it handed them.
RECEIVE_WAIT_SECONDS = 60.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="klaud", description="Klaud: plans image-refresh waves from webhook-fed state.")
    parser.add_argument("--version", action="version", version=f"klaud {klaud_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the bot")
    serve.add_argument("--sandbox", action="store_true", help="also run the sandbox GitHub in this process")
    serve.add_argument("--scenario", type=Path, help="scenario file for --sandbox (default: the bundled one)")

    demo = sub.add_parser("demo", help="sandbox + bot + the scenario's timeline, then one wave")
    demo.add_argument("--once", action="store_true", help="exit after printing the wave")
    demo.add_argument("--scenario", type=Path)

    sandbox = sub.add_parser("sandbox", help="the sandbox GitHub alone")
    # Not 8081: that is the admin listener's default.
    sandbox.add_argument("--port", type=_port, default=8082)
    sandbox.add_argument("--scenario", type=Path)
    sandbox.add_argument("--deliver-to", dest="deliver_to", help="URL that receives the webhooks")
    sandbox.add_argument(
        "--strict-auth", dest="strict_auth", action="store_true",
        help="accept only JWTs signed with the App key (KLAUD_APP_ID, KLAUD_PRIVATE_KEY) and tokens it issued",
    )

    plan = sub.add_parser("plan", help="the next wave's decisions from local state (dispatches nothing)")
    plan.add_argument("--repo", help="OWNER/NAME (default: every repository in the store)")
    plan.add_argument("--at", help="ISO time to plan for (default: now)")
    plan.add_argument("--json", action="store_true", help="print the wave document")

    receive = sub.add_parser("receive", help="feed one payload through the handlers (no HTTP, no signature)")
    receive.add_argument("--event", required=True)
    receive.add_argument("--payload", required=True, type=Path)
    receive.add_argument("--delivery", default=None)

    reconcile = sub.add_parser("reconcile", help="rebuild local state from the GitHub API")
    reconcile.add_argument("--repo", help="OWNER/NAME (default: every installed repository)")

    doctor = sub.add_parser("doctor", help="check an installation end to end, one line per check with a fix")
    doctor.add_argument("--repo", help="OWNER/NAME (default: every installed repository)")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")

    config = sub.add_parser("config", help="the per-repository policy file, .github/klaud.yml")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="validate a policy file locally (exit 1 when invalid)")
    check.add_argument("file", type=Path)
    check.add_argument("--json", action="store_true", help="print the policy in force, defaults included")
    config_sub.add_parser("schema", help="print the policy's JSON Schema")
    return parser


def _stop_on_signals() -> asyncio.Event:
    """An event SIGTERM or SIGINT sets; a second one exits at once (a person pressing
    Ctrl-C twice, an orchestrator out of patience), as a crash, which Klaud recovers from."""
    stop = asyncio.Event()

    def stopping() -> None:
        if stop.is_set():
            log.warning("serve.forced_exit")
            os._exit(1)
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping)
    return stop


async def _wait_for_signal() -> None:
    await _stop_on_signals().wait()


async def _serve(settings: Settings, args: argparse.Namespace) -> None:
    # Signals are heard from the start: start-up (migrations, the first reconcile of every
    # installation, minutes against a slow GitHub) ignored SIGTERM as a container's PID 1,
    # and without a container died of it, or of SIGINT with a traceback.
    stop = _stop_on_signals()
    if args.sandbox and not settings.secrets():
        settings = settings.model_copy(update={"webhook_secret": SecretStr(DEMO_SECRET)})
    starting = asyncio.create_task(start_stack(settings, scenario=scenario_from(args.scenario), sandbox_mode=args.sandbox))
    signalled = asyncio.create_task(stop.wait())
    await asyncio.wait({starting, signalled}, return_when=asyncio.FIRST_COMPLETED)
    if not starting.done():
        log.info("serve.stopping", during="start-up")
        starting.cancel()  # start_stack stops what it had started
        with contextlib.suppress(asyncio.CancelledError):
            await starting
        log.info("serve.stopped")
        return
    if starting.exception() is not None:
        signalled.cancel()
    stack = starting.result()
    await signalled
    log.info("serve.stopping")
    # The server stops taking webhooks first; running handlers then finish (bounded).
    await stack.stop()
    log.info("serve.stopped")


async def _sandbox(settings: Settings, args: argparse.Namespace) -> None:
    secret = settings.secrets()[0] if settings.secrets() else None
    scenario = scenario_from(args.scenario) or load_scenario(None)
    if args.strict_auth:
        # The App's own key: the sandbox checks JWTs as GitHub does, with its public half.
        assert settings.private_key is not None and settings.app_id is not None  # required by main
        key = serialization.load_pem_private_key(settings.private_key.get_secret_value().encode(), password=None)
        sandbox = Sandbox(scenario, webhook_secret=secret, deliver_to=args.deliver_to, strict_auth=True,
                          app_id=settings.app_id, app_public_key=key.public_key())
    else:
        sandbox = Sandbox(scenario, webhook_secret=secret, deliver_to=args.deliver_to)
    # Bound first, as `serve` binds: a busy port or an unknown host is one line, exit 2.
    bound = bind(settings.host, args.port, "KLAUD_HOST/--port")
    runner = web.AppRunner(sandbox.create_app(), handle_signals=False, access_log=None)
    await runner.setup()
    await web.SockSite(runner, bound.sock).start()
    sandbox.world.origin = bound.url
    print(f"sandbox GitHub at {bound.url}/_sandbox/github", flush=True)
    await _wait_for_signal()
    await runner.cleanup()


DEMO_SECRET = "klaud-demo-secret"


async def _demo(settings: Settings, args: argparse.Namespace) -> int:
    """The sandbox GitHub, the bot, the scenario's timeline, then one wave.

    Runs against a throw-away store so a demo never touches real state. Prints every
    family's decision with its reason and the GitHub requests the wave itself made (only
    claim and dispatch writes: a wave reads nothing from GitHub).
    """
    once = args.once
    # The table is the demo's output; only problems are logged.
    configure_logging(settings.log_format, level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="klaud-demo-") as tmp:
        settings = settings.model_copy(
            update={
                "db": f"sqlite:///{tmp}/demo.db",
                "webhook_secret": settings.webhook_secret or SecretStr(DEMO_SECRET),
                "port": 0 if once else settings.port,
                "admin_port": 0 if once else settings.admin_port,
            }
        )
        stack = await start_stack(settings, scenario=scenario_from(args.scenario), sandbox_mode=True, schedule=False)
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
                print(f"\nServing at {stack.url} (state: {stack.admin_url}/api/v1/repos/OWNER/NAME/state); Ctrl-C stops.")
                await _wait_for_signal()
        finally:
            await stack.stop()
    return 0


async def _plan(settings: Settings, args: argparse.Namespace) -> int:
    at = None
    if args.at:
        try:
            at = parse_time(args.at)
        except ValueError:
            raise UsageError(f"--at: not {TIME_EXPECTED}: {args.at!r}") from None
    _refuse_a_missing_sqlite_store(settings)
    klaud = Klaud(settings)
    try:
        await klaud.start(drain=False)
    except StoreLocked:
        # A server holds the SQLite file: the same plan, from the running server.
        return await _plan_from_server(settings, args, at)
    try:
        repos = [args.repo] if args.repo else sorted(klaud.live.repos)
        if args.repo and klaud.live.repo(args.repo) is None:
            raise UsageError(f"--repo: {args.repo} has no local state (run `klaud reconcile --repo {args.repo}`)")
        if not repos:
            print("klaud: no repository has local state in this store (run `klaud reconcile`)", file=sys.stderr)
        for repo in repos:
            state = klaud.live.repo(repo)
            if state is None:
                continue
            wave = await klaud.waves.preview_state(state, at or klaud.clock.now())
            print(_wave_json(wave.document()) if args.json else render_wave_table(wave))
    finally:
        await klaud.stop()
    return 0


# A policy is a few hundred bytes; GitHub's contents API serves files up to 1 MB as JSON.
MAX_POLICY_BYTES = 1024 * 1024


def _read_at_most(path: Path, limit: int, what: str) -> bytes:
    """The file's bytes, or a UsageError naming `what` past `limit` (read no further)."""
    try:
        return read_at_most(path, limit)
    except FileTooLarge as exc:
        raise UsageError(f"{what}: {exc}") from None


def _refuse_a_missing_sqlite_store(settings: Settings) -> None:
    """`plan` only reads: a KLAUD_DB naming a SQLite file that is not there (a typo, another
    folder) is refused, not created, migrated and planned as empty."""
    path = sqlite_path(settings.db)
    # os.path.exists answers False where Path.exists raises (a name too long for the disk).
    if path is not None and path != ":memory:" and not os.path.exists(path):
        raise UsageError(f"KLAUD_DB: no store at {path} (`klaud serve` or `klaud reconcile` creates it)")


async def _plan_from_server(settings: Settings, args: argparse.Namespace, at: datetime | None) -> int:
    """`klaud plan` through the admin API of the server that holds the store."""
    base = admin_url(settings)
    headers = {"Authorization": f"Bearer {settings.admin_token.get_secret_value()}"} if settings.admin_token else {}
    query = {"at": at.isoformat()} if at is not None else {}
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=60)) as session:

        async def get(path: str) -> Any:
            try:
                async with session.get(f"{base}{path}", params=query) as answer:
                    document = await answer.json(content_type=None)
                    if answer.status == 404 and args.repo:
                        raise UsageError(f"--repo: {args.repo} has no local state on the running server")
                    if answer.status != 200:
                        raise Refused(f"the running server's admin API answered {answer.status} to {path}: {document}")
                    return document
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                raise Refused(
                    f"KLAUD_DB is held by a running Klaud server, and its admin API at {base} did not answer"
                    f" ({type(exc).__name__}: {exc}); set KLAUD_ADMIN_HOST, KLAUD_ADMIN_PORT and KLAUD_ADMIN_TOKEN"
                    " as the server has them"
                ) from None

        repos = [args.repo] if args.repo else _listed_repos(await get("/api/v1/repos"), base)
        if not repos:
            # Said, as the store's own plan says it: a server still starting keeps none yet.
            print(f"klaud: the running server at {base} keeps no repository yet (starting up, or none "
                  "reconciled: `klaud reconcile`)", file=sys.stderr)
        for repo in repos:
            path = f"/api/v1/repos/{repo}/plan"
            document = await get(path)
            wave = _answered_wave(document, f"{base}{path}")
            print(_wave_json(document) if args.json else render_wave_table(wave))
    return 0


def _wave_json(document: dict[str, Any]) -> str:
    """One wave document per line (JSON Lines): with several repositories, the output is one
    document per repository that a program reads line by line."""
    return json.dumps(document)


def _not_klaud(url: str, expected: str) -> Refused:
    # A port that answers 200, but not as Klaud does: another service on KLAUD_ADMIN_PORT,
    # or a proxy's page. Said in one line like a port that does not answer at all.
    return Refused(f"the admin API at {url} answered, but not with {expected} as Klaud does; set"
                   " KLAUD_ADMIN_HOST and KLAUD_ADMIN_PORT as the running Klaud server has them")


def _listed_repos(answer: Any, base: str) -> list[str]:
    """The repositories of the admin API's `/api/v1/repos` answer."""
    repos = answer.get("repos") if isinstance(answer, dict) else None
    if not isinstance(repos, list) or not all(isinstance(repo, str) for repo in repos):
        raise _not_klaud(f"{base}/api/v1/repos", "a list of repositories")
    return repos


def _answered_wave(document: Any, url: str) -> Wave:
    """The admin API's plan read back as a wave, checked even for --json: a document of
    another shape is refused rather than printed as if it were a plan."""
    try:
        return Wave.from_document(document)
    except UNREADABLE_DOCUMENT:
        raise _not_klaud(url, "a wave document") from None


def admin_url(settings: Settings) -> str:
    """Where this machine reaches the admin listener the settings describe."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(settings.admin_host, settings.admin_host)
    return f"http://[{host}]:{settings.admin_port}" if ":" in host else f"http://{host}:{settings.admin_port}"


async def _installed(klaud: Klaud, repo: str | None) -> list[tuple[str, int]]:
    """(repository, installation) of every installed repository, or of `repo` alone."""
    targets: list[tuple[str, int]] = []
    github = GitHubRepos(klaud.github)
    for installation in await github.installations():
        for found in await github.repositories(installation):
            if repo is None or found.full_name.lower() == repo.lower():
                targets.append((found.full_name, installation))
    if repo and not targets:
        raise UsageError(f"--repo: {repo} is not installed for this App")
    return targets


async def _doctor(settings: Settings, args: argparse.Namespace) -> int:
    # The checks read GitHub and the capacity feed only: on a throw-away store, doctor runs
    # beside a server that holds the SQLite file (it refused, exit 1, as for a failed check).
    klaud = Klaud(settings.model_copy(update={"db": "sqlite:///:memory:"}))
    await klaud.start(drain=False)
    failed = False
    try:
        for name, installation in await _installed(klaud, args.repo):
            checks = await diagnose(klaud.live, klaud.reconciler.catalog, klaud.capacity, name, installation)
            failed = failed or not all(check.ok for check in checks)
            if args.json:
                print(json.dumps({"repo": name, "checks": [check.document() for check in checks]}))
            else:
                print(name)
                print("\n".join("  " + check.line() for check in checks))
    finally:
        await klaud.stop()
    return 1 if failed else 0


async def _reconcile(settings: Settings, args: argparse.Namespace) -> int:
    klaud = Klaud(settings)
    await klaud.start(drain=False)
    try:
        targets = await _installed(klaud, args.repo)
        if await klaud.serving_replicas():
            # Their memory would not see what this process writes: each repository's owner
            # reconciles it, asked through the inbox they share.
            return await _reconciled_by_replicas(klaud, targets)
        for name, installation in targets:
            print(json.dumps(await klaud.reconciler.reconcile(name, installation)))
    finally:
        await klaud.stop()
    return 0


async def _reconciled_by_replicas(klaud: Klaud, targets: list[tuple[str, int]]) -> int:
    """One line per repository once its owner ran the reconcile (a GitHub failure: `failed`
    with the reason, and the owner tries again with backoff); exit 1 if one failed."""
    requests = [(name, reconcile_request(name, installation, "full")) for name, installation in targets]
    for _, request in requests:  # all handed over first: the replicas work on them together
        await _hand_over(klaud, request)
    # Waited for together: a replica stopped without releasing its leases holds each of its
    # repositories' requests for the whole wait, one wait for all of them, not one each.
    ends = await asyncio.gather(*(_finished(klaud, request.id) for _, request in requests), return_exceptions=True)
    failed = False
    for (name, request), end in zip(requests, ends, strict=True):
        error: str | None
        if isinstance(end, Refused):  # not finished in time: said, and the others still reported
            status, error = "unfinished", str(end)
        elif isinstance(end, BaseException):
            raise end
        else:
            status, error = end
        print(json.dumps({"repo": name, "delivery": request.id, "status": status} | ({"error": error} if error else {})))
        failed = failed or status != "done"
    return 1 if failed else 0


async def _config(settings: Settings, args: argparse.Namespace) -> int:
    if args.config_command == "schema":
        print(json.dumps(policy_schema(), indent=2))
        return 0
    try:
        text = _read_at_most(args.file, MAX_POLICY_BYTES, str(args.file)).decode()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{args.file}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        policy = parse_policy(text)
    except PolicyError as exc:
        # The same words a push of this file would show on the check runs, named for this file.
        print(f"klaud: {args.file}{str(exc).removeprefix(POLICY_PATH)}", file=sys.stderr)
        return 1
    print(policy.model_dump_json(indent=2) if args.json else f"{args.file}: valid")
    return 0


async def _receive(settings: Settings, args: argparse.Namespace) -> int:
    if args.event not in KLAUD_EVENTS:
        raise UsageError(f"--event: unknown event name {args.event!r} (known: {', '.join(sorted(KLAUD_EVENTS))})")
    if args.delivery is not None and not HEADER_TOKEN.fullmatch(args.delivery):
        # The id the webhook's X-GitHub-Delivery may hold, and that the admin API looks up.
        raise UsageError("--delivery: 1-200 printable ASCII characters without spaces, and not . or ..")
    try:
        # The webhook's own checks: a payload it would refuse is refused here in one line.
        body = _read_at_most(args.payload, MAX_BODY, "--payload")
        envelope = envelope_of(body)
    except OSError as exc:
        raise UsageError(f"--payload: cannot read {args.payload}: {exc.strerror}") from None
    except UnreadableBody as exc:
        raise UsageError(f"--payload: {exc.detail}") from None
    delivery = Delivery(
        id=args.delivery or f"receive-{uuid.uuid4()}", event=args.event, body=body, action=envelope.action,
        repo=envelope.repo, installation=envelope.installation, headers={},
    )
    klaud = Klaud(settings)
    await klaud.start(drain=False)
    try:
        if await klaud.serving_replicas():
            status, error = await _through_the_inbox(klaud, delivery)
        else:
            status, error = await _handled(klaud, delivery)
    finally:
        await klaud.stop()
    print(json.dumps({"delivery": delivery.id, "event": args.event, "status": status}
                     | ({"error": error} if error else {})))
    return 0 if status == "done" else 1


async def _handled(klaud: Klaud, delivery: Delivery) -> tuple[str, str | None]:
    """Run the delivery's handlers here; its status, and the error when they failed."""
    try:
        await klaud.handle(delivery)
    # The handlers' boundary, logged as the inbox logs a failed delivery (a permanent error,
    # a payload the handler cannot read, without a traceback), and the status line still
    # printed (exit 1), like a delivery the running server failed.
    except Exception as exc:
        permanent = is_permanent(exc)
        log.warning("receive.failed", delivery_id=delivery.id, error=f"{type(exc).__name__}: {exc}"[:2000],
                    permanent=permanent, exc_info=None if permanent else exc)
        return "failed", f"{type(exc).__name__}: {exc}"[:2000]
    return "done", None


async def _through_the_inbox(klaud: Klaud, delivery: Delivery) -> tuple[str, str | None]:
    """Hand `delivery` to the serving replicas through the inbox they share (its owner
    processes it like a webhook, in the repository's order) and wait for its status."""
    await _hand_over(klaud, delivery)
    return await _finished(klaud, delivery.id)


async def _hand_over(klaud: Klaud, delivery: Delivery) -> None:
    if not await klaud.inbox.store.put(delivery):
        raise Refused(f"--delivery: {delivery.id} is already stored (a delivery id is processed once)")


async def _finished(klaud: Klaud, delivery_id: str) -> tuple[str, str | None]:
    """The status and error of a delivery handed over, once its owner finished it."""
    waited = 0.0
    while waited < RECEIVE_WAIT_SECONDS:
        stored = await klaud.inbox.store.get(delivery_id)
        if stored is not None and stored.status in ("done", "failed"):
            return stored.status, stored.error
        await asyncio.sleep(0.1)
        waited += 0.1
    raise Refused(f"delivery {delivery_id} is stored; the serving replicas did not finish it within"
                  f" {RECEIVE_WAIT_SECONDS:.0f} s (`GET /api/v1/deliveries/{delivery_id}` shows it)")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0-65535)")
    return port


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if args.command == "serve" and args.scenario is not None and not args.sandbox:
            # Served against real GitHub, the file would be ignored with no word.
            parser.error("serve: --scenario plays a scenario in the sandbox: add --sandbox")
    except SystemExit as exc:  # argparse already printed the reason
        return 2 if exc.code else 0
    try:
        settings = load_settings(
            # The sandbox signs its own webhooks: serve --sandbox needs no secret, like demo.
            require_secret=args.command == "serve" and not args.sandbox,
            require_app=(args.command == "serve" and not args.sandbox) or args.command in ("reconcile", "doctor")
            or (args.command == "sandbox" and args.strict_auth),
        )
    except SettingsError as exc:
        print(f"klaud: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_format, settings.log_level)
    try:
        status = asyncio.run(_run(settings, args))
        sys.stdout.flush()  # a reader that went away shows here, inside the boundary, not at exit
        return status
    except UsageError as exc:
        print(f"klaud: {exc}", file=sys.stderr)
        return 2
    except Refused as exc:
        print(f"klaud: {exc}", file=sys.stderr)
        return 1
    except (ScenarioError, SettingsError) as exc:
        print(f"klaud: {exc}", file=sys.stderr)
        return 2
    except GitHubError as exc:
        print(f"klaud: GitHub answered {exc}", file=sys.stderr)
        return 1
    except sqlite3.DatabaseError as exc:
        print(f"klaud: KLAUD_DB: cannot use {settings.db}: {exc}", file=sys.stderr)
        return 1
    except StoreError as exc:
        print(f"klaud: KLAUD_DB: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # Whoever read stdout stopped (`klaud plan | head`): nothing is wrong to report.
        _discard_stdout()
        return 1
    except KeyboardInterrupt:
        # Ctrl-C on a command without a signal handler of its own (`plan`, `receive`, …).
        print("klaud: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # the CLI's boundary: one JSON log line with the traceback, exit 1
        log.error("cli.failed", command=args.command, error=f"{type(exc).__name__}: {exc}", exc_info=exc)
        return 1


def _discard_stdout() -> None:
    """Point stdout at /dev/null so what is still buffered cannot fail again at exit."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no real file (captured by a test runner)
        pass


COMMANDS = {
    "serve": _serve,
    "sandbox": _sandbox,
    "demo": _demo,
    "plan": _plan,
    "receive": _receive,
    "reconcile": _reconcile,
    "doctor": _doctor,
    "config": _config,
}


async def _run(settings: Settings, args: argparse.Namespace) -> int:
    result = await COMMANDS[args.command](settings, args)
    return 0 if result is None else int(result)
