"""`installation`: reconcile the repositories of a new installation, forget a removed one."""

from __future__ import annotations

from collections.abc import Iterable

import structlog
from gidgethub import routing

from bot.core.events import InstallationEvent, Named
from handlers.context import HandlerContext, WebhookEvent

router = routing.Router()
log = structlog.get_logger("klaud.installation")

ADDING = {"created", "new_permissions_accepted"}


def known_repositories(ctx: HandlerContext, installation: int) -> list[str]:
    """The repositories Klaud keeps for `installation`: GitHub names none in the payloads
    of `suspend` and `unsuspend`."""
    return sorted(state.name for state in ctx.repos.live.repos.values() if state.meta.installation == installation)


async def reconcile_all(ctx: HandlerContext, installation: int, names: Iterable[str], *, light: bool = False) -> None:
    for name in names:
        await ctx.repos.reconcile(name, installation, light=light)


async def forget_all(ctx: HandlerContext, installation: int, repositories: Iterable[Named]) -> None:
    """Forget the repositories `installation` no longer has, found by name or by id (one
    renamed while its event was lost), and only while this installation keeps them: after
    an uninstall and a re-install, the old installation's `deleted` may come last."""
    live = ctx.repos.live
    for repo in repositories:
        state = live.repo(repo.full_name) or live.by_id(repo.id)
        if state is not None and state.meta.installation != installation:
            log.info("installation.forget_skipped", repo=state.name, installation=installation,
                     kept_for=state.meta.installation)
            continue
        await live.forget(state.name if state is not None else repo.full_name)


@router.register("installation")
async def on_installation(event: WebhookEvent, ctx: HandlerContext) -> None:
    payload = event.parsed(InstallationEvent)
    installation = payload.installation.id
    named = [repo.full_name for repo in payload.repositories or ()]
    if payload.action in ADDING:
        await reconcile_all(ctx, installation, named)
    elif payload.action == "deleted":
        kept = [Named(full_name=name) for name in known_repositories(ctx, installation)]
        await forget_all(ctx, installation, payload.repositories or kept)
    elif payload.action == "suspend":
        # Kept, holds and all: forgotten, they were lost for good. GitHub refuses the
        # App's calls meanwhile, and the scheduler backs off from each repository's.
        log.info("installation.suspended", installation=installation, repositories=known_repositories(ctx, installation))
    elif payload.action == "unsuspend":
        # What moved meanwhile is read again; its webhooks were not sent.
        await reconcile_all(ctx, installation, known_repositories(ctx, installation), light=True)
