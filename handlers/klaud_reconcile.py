"""`klaud_reconcile`: Klaud's own request (never GitHub's) that the replica holding a
repository reconcile it, made by a replica that could not (`Reconciler.reconcile`): the
inbox hands it to the holder, as any delivery of the repository."""

from __future__ import annotations

from gidgethub import routing

from bot.core.events import RECONCILE_REQUEST, ReconcileRequest
from handlers.context import HandlerContext, WebhookEvent

router = routing.Router()


@router.register(RECONCILE_REQUEST)
async def on_reconcile_request(event: WebhookEvent, ctx: HandlerContext) -> None:
    await ctx.repos.requested(event.parsed(ReconcileRequest))
