"""`repository` renamed or transferred: the repository's state moves to its new name;
edited with a new default branch: the catalog follows that branch at once; deleted: the
repository is forgotten, as an uninstall forgets it.

Without this event (not subscribed, or lost) the move is found all the same, later: by the
first event under the new name (matched by the repository's id) or by the next reconcile
(GitHub answers the old name with a redirect). A deletion without this event is found by
the next discovery, which no longer lists the repository.
"""

from __future__ import annotations

from gidgethub import routing

from bot.core.events import RepositoryEvent
from handlers.context import HandlerContext, WebhookEvent

router = routing.Router()


@router.register("repository", action="renamed")
@router.register("repository", action="transferred")
async def on_moved(event: WebhookEvent, ctx: HandlerContext) -> None:
    await ctx.repos.state_for(event.parsed(RepositoryEvent))


@router.register("repository", action="edited")
async def on_edited(event: WebhookEvent, ctx: HandlerContext) -> None:
    # Pushes are compared with the default branch Klaud knows: until the next light
    # reconcile, a push to the new one was ignored and the catalog stayed the old branch's.
    payload = event.parsed(RepositoryEvent)
    if "default_branch" not in payload.changes:
        return
    state = await ctx.repos.state_for(payload)
    if state is not None:
        await ctx.repos.reconcile(state.name, state.meta.installation, light=True)


@router.register("repository", action="deleted")
async def on_deleted(event: WebhookEvent, ctx: HandlerContext) -> None:
    # An installation on all repositories gets no `installation_repositories` for it:
    # kept, it was reconciled (every answer a 404) and planned for as long as Klaud ran.
    payload = event.parsed(RepositoryEvent)
    await ctx.repos.forget(payload.installation.id, [payload.repository])
