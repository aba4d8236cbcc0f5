"""Webhook handlers: one module per event, each with its own gidgethub Router.

Every handler receives the gidgethub `Event` and a `HandlerContext` (the running Klaud and
the delivery being processed). Handlers are level-triggered: they update local state from
the payload plus at most the one or two API reads the event needs.
"""

from __future__ import annotations

from gidgethub import routing

from handlers import (
    check_run,
    check_suite,
    installation,
    installation_repositories,
    issue_comment,
    issues,
    klaud_reconcile,
    ping,
    pull_request,
    push,
    repository,
    repository_dispatch,
    workflow_run,
)

router = routing.Router(
    ping.router,
    installation.router,
    installation_repositories.router,
    pull_request.router,
    push.router,
    workflow_run.router,
    issue_comment.router,
    issues.router,
    check_run.router,
    check_suite.router,
    repository.router,
    repository_dispatch.router,
    klaud_reconcile.router,
)
