"""Installing the App, choosing its repositories, suspending it (control actions, DESIGN §5).

Each action changes which repositories the App reaches and answers the `installation` or
`installation_repositories` event GitHub sends it. What GitHub's settings pages do not
allow is refused: installing twice on one account, giving the App a repository it has or
another account's, taking away the last one (an installation on selected repositories
keeps at least one), suspending twice.
"""

from __future__ import annotations

from bot.sandbox import scenario as sc
from bot.sandbox.events import Payloads
from bot.sandbox.permissions import Suspension
from bot.sandbox.state import RepoState, SandboxError
from bot.sandbox.world import Outcome, World


def _one_installation(world: World, names: list[str], installed: bool) -> list[RepoState]:
    """The repositories `names` says (each once), one installation's, each installed or not
    as wanted."""
    repos = list({id(repo): repo for repo in map(world.repo, names)}.values())
    if len({repo.installation_id for repo in repos}) > 1:
        raise SandboxError("the repositories belong to different installations' accounts", 422)
    for repo in repos:
        if repo.installed != installed:
            state = "already has" if repo.installed else "does not have"
            raise SandboxError(f"the App {state} {repo.full_name}", 409)
    return repos


def _installed(world: World, installation_id: int) -> list[RepoState]:
    repos = world.installations().get(installation_id)
    if not repos:
        raise SandboxError(f"installation {installation_id} is not installed", 404)
    return repos


def install_app(world: World, action: sc.InstallApp) -> Outcome:
    repos = _one_installation(world, action.repos, installed=False)
    if world.installations().get(repos[0].installation_id):
        raise SandboxError(f"the App is already installed on {repos[0].owner}; use add_repositories", 409)
    installation_id = world.install(repos)
    event = Payloads(world).installation(repos[0], "created", action.user or repos[0].first_admin(), repos)
    return {"installation_id": installation_id}, [event]


def add_repositories(world: World, action: sc.AddRepositories) -> Outcome:
    repos = _one_installation(world, action.repos, installed=False)
    _installed(world, repos[0].installation_id)
    world.install(repos)
    sender = action.user or repos[0].first_admin()
    return {}, [Payloads(world).installation_repositories("added", sender, repos, [])]


def remove_repositories(world: World, action: sc.RemoveRepositories) -> Outcome:
    repos = _one_installation(world, action.repos, installed=True)
    if len(_installed(world, repos[0].installation_id)) == len(repos):
        raise SandboxError("an installation keeps at least one repository; use uninstall_app", 422)
    for repo in repos:
        repo.installed = False
    sender = action.user or repos[0].first_admin()
    return {}, [Payloads(world).installation_repositories("removed", sender, [], repos)]


def uninstall_app(world: World, action: sc.UninstallApp) -> Outcome:
    """The payload is built while the repositories are still the App's."""
    repos = _installed(world, action.installation_id)
    event = Payloads(world).installation(repos[0], "deleted", action.user or repos[0].first_admin(), repos)
    world.uninstall(action.installation_id)
    return {}, [event]


def suspend_app(world: World, action: sc.SuspendApp) -> Outcome:
    """suspend_app and unsuspend_app: the event goes out in the installation's new state."""
    repos = _installed(world, action.installation_id)
    suspending = action.action == "suspend_app"
    if (action.installation_id in world.suspended) == suspending:
        state = "already" if suspending else "not"
        raise SandboxError(f"installation {action.installation_id} is {state} suspended", 409)
    sender = action.user or repos[0].first_admin()
    if suspending:
        world.suspended[action.installation_id] = Suspension(sender, world.now())
    else:
        del world.suspended[action.installation_id]
    return {}, [Payloads(world).installation(repos[0], "suspend" if suspending else "unsuspend", sender)]
