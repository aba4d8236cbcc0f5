"""`klaud doctor`: read what an installation and its repository hold, and check it.

The reading reuses the catalog's own load on a throwaway state, so the doctor sees the
repository exactly as a reconcile would, and stores nothing.
"""

from __future__ import annotations

from bot.core.doctor import (
    Check,
    capacity_check,
    config_checks,
    events_check,
    permission_check,
    policy_check,
    workflow_checks,
)
from bot.core.setup import SetupError, workflow_path
from bot.github.errors import GitHubError
from bot.services.api import CapacitySource
from bot.services.catalog_sync import CatalogSync
from bot.services.live import LiveState
from bot.store.change import Change


async def diagnose(
    live: LiveState, catalog: CatalogSync, capacity: CapacitySource, name: str, installation: int
) -> list[Check]:
    """Every check of DESIGN §3.1 for one installed repository, in a fixed order."""
    if live.github is None:
        raise RuntimeError("no GitHub client configured")
    permissions, events = await live.github.granted(name, installation)
    checks = [permission_check(permissions), events_check(events)]
    state = live.new_state(name, installation)
    api = live.api(state)
    try:
        await catalog.load(state, api, Change(), await api.repository())
        workflow = state.policy.candidate_workflow
        text = await api.file_text(workflow_path(workflow), state.meta.head_sha)
    except GitHubError as exc:
        checks.append(Check("repository", False, f"reading the repository failed: {exc}", "grant contents: read"))
        return checks
    setup = [SetupError(e["code"], e["detail"]) for e in state.meta.setup_errors]
    checks.append(policy_check(state.meta.policy_error))
    checks += workflow_checks(workflow, text, setup, state.policy.candidate_inputs.get("candidate"))
    checks += config_checks(state.meta.config_errors, state.policy.runners_file, len(state.catalog))
    checks.append(capacity_check(await capacity.read(), state.catalog))
    return checks
