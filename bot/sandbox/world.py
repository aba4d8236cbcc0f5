"""Everything the sandbox knows: repositories, capacity, installation tokens, the clock.

Built once from a scenario; the REST routes read and write it, the control actions change
it and say which webhooks GitHub would send.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from bot.core.clock import ManualClock
from bot.sandbox import scenario as sc
from bot.sandbox.permissions import (
    ALWAYS_DELIVERED,
    KLAUD_MANIFEST,
    AppManifest,
    Installation,
    Suspension,
    with_metadata,
)
from bot.sandbox.shapes import Shapes, ts
from bot.sandbox.state import Ids, Issue, IssueComment, RepoState, SandboxError

TOKEN_LIFETIME = timedelta(hours=1)
# Until the first request tells us where we listen, payload URLs point nowhere reachable.
UNKNOWN_ORIGIN = "http://sandbox.invalid"


@dataclass(frozen=True)
class Event:
    """One webhook GitHub would send: event name (X-GitHub-Event) and payload."""

    name: str
    payload: dict[str, Any]

    @property
    def action(self) -> str | None:
        action = self.payload.get("action")
        return action if isinstance(action, str) else None


# A control action's answer, and the webhooks GitHub would send for it.
Outcome = tuple[dict[str, Any], list[Event]]


@dataclass(frozen=True)
class Token:
    installation_id: int
    expires_at: datetime
    permissions: dict[str, str]


class World:
    def __init__(self, scenario: sc.Scenario, clock: ManualClock, app_id: int) -> None:
        self.clock = clock
        self.app_id = app_id
        self.ids = Ids()
        self.capacity = scenario.capacity
        self.rate_limit = scenario.rate_limit
        self.origin = UNKNOWN_ORIGIN
        self.tokens: dict[str, Token] = {}
        self.suspended: dict[int, Suspension] = {}
        # Installations the App was uninstalled from: installed again, they get a new id.
        self.uninstalled: set[int] = set()
        self.blobs: dict[str, bytes] = {}
        self.repos: dict[str, RepoState] = {}
        # A renamed repository's earlier names (lowercase): their API routes redirect.
        self.moved: dict[str, RepoState] = {}
        self.manifest: AppManifest = KLAUD_MANIFEST
        self._installations: dict[int, Installation] = {}
        now = clock.now()
        for index, spec in enumerate(scenario.repositories):
            key = spec.full_name.lower()
            if key in self.repos:
                raise SandboxError(f"repository {spec.full_name} appears twice in the scenario")
            self._install(spec)
            repo = RepoState(spec, 500_000_001 + index, self.ids, now)
            self.repos[key] = repo
            self._load_contents(repo, spec, now)

    def _install(self, spec: sc.Repository) -> None:
        """The installation's permissions and events, which all its repositories share."""
        permissions: dict[str, str] = dict(
            self.manifest.permissions if spec.permissions is None else spec.permissions)
        events = self.manifest.installation_events if spec.events is None else tuple(spec.events)
        made = Installation(spec.installation_id, with_metadata(permissions), events)
        known = self._installations.setdefault(spec.installation_id, made)
        if known != made:
            raise SandboxError(f"installation {spec.installation_id}: its repositories give "
                               "different permissions or events")

    def _load_contents(self, repo: RepoState, spec: sc.Repository, now: datetime) -> None:
        for pull in spec.pulls:
            repo.add_pull(pull, now)
        for issue in spec.issues:
            made = repo.add_issue(issue.number, self.ids.next("pull"), issue.title, issue.user,
                                  issue.created_at or now)
            made.body, made.state, made.labels = issue.body, issue.state, list(issue.labels)
            if issue.state == "closed":
                made.closed_at = made.created_at
        for run in spec.runs:
            repo.add_run(run, now)
        for comment in spec.comments:
            self.add_comment(repo, comment.number, comment.user, comment.body,
                             via_app=False, at=comment.created_at or now)

    # --- lookups -----------------------------------------------------------------------

    def now(self) -> datetime:
        return self.clock.now()

    def shapes(self, origin: str | None = None) -> Shapes:
        return Shapes(api=f"{origin or self.origin}/_sandbox/github", app_id=self.app_id,
                      manifest=self.manifest)

    def repo_named(self, params: dict[str, str]) -> RepoState | None:
        """The repository a route's `owner`/`repo` parameters name, if it exists."""
        if "owner" not in params or "repo" not in params:
            return None
        return self.repos.get(f"{params['owner']}/{params['repo']}".lower())

    def moved_to(self, params: dict[str, str]) -> RepoState | None:
        """The repository a route names by an earlier name, if any."""
        if "owner" not in params or "repo" not in params:
            return None
        return self.moved.get(f"{params['owner']}/{params['repo']}".lower())

    def rename(self, repo: RepoState, name: str) -> None:
        """`repo` is called `name` (same owner) from now on; its old name redirects."""
        full_name = f"{repo.owner}/{name}"
        key = full_name.lower()
        if key in self.repos and self.repos[key] is not repo:
            raise SandboxError(f"repository {full_name} already exists", 422)
        del self.repos[repo.full_name.lower()]
        self.moved[repo.full_name.lower()] = repo
        self.moved.pop(key, None)
        repo.full_name, repo.name = full_name, name
        self.repos[key] = repo

    def delete(self, repo: RepoState) -> None:
        """`repo` no longer exists: neither its name nor an earlier one finds it. An
        installation left without repositories is no longer listed either (the sandbox
        knows installations through their repositories)."""
        del self.repos[repo.full_name.lower()]
        for name in [name for name, moved in self.moved.items() if moved is repo]:
            del self.moved[name]

    def repo(self, full_name: str) -> RepoState:
        repo = self.repos.get(full_name.lower())
        if repo is None:
            raise SandboxError(f"no repository {full_name} in the scenario", 404)
        return repo

    def repo_by_id(self, repo_id: int) -> RepoState | None:
        return next((repo for repo in self.repos.values() if repo.id == repo_id), None)

    @staticmethod
    def app_sees(repo: RepoState, installation_id: int | None) -> bool:
        """Whether a request for `installation_id` (None: the App, or a token the sandbox
        did not mint) may see `repo`: only while the App is installed on it, and only
        through that installation."""
        return repo.installed and installation_id in (None, repo.installation_id)

    def installation(self, installation_id: int) -> Installation:
        return self._installations[installation_id]

    def installation_shape(self, shapes: Shapes, repo: RepoState) -> dict[str, Any]:
        """The installation `repo` is (or was) the App's through, as GitHub shows it whole
        (suspended or not) in its API and in the App's installation events."""
        installation_id = repo.installation_id
        return shapes.installation(self.installation(installation_id), repo,
                                   self.suspended.get(installation_id))

    def installations(self) -> dict[int, list[RepoState]]:
        """Each installation and the repositories the App is installed on through it; one
        left with none is uninstalled (or its last repository deleted)."""
        grouped: dict[int, list[RepoState]] = {}
        for repo in self.repos.values():
            if repo.installed:
                grouped.setdefault(repo.installation_id, []).append(repo)
        return grouped

    def install(self, repos: list[RepoState]) -> int:
        """The App installed on `repos`, one account's; answers their installation's id,
        a new one when the App was uninstalled from the account before, as on GitHub."""
        installation_id = repos[0].installation_id
        if installation_id in self.uninstalled:
            fresh = max(self._installations) + 1
            self._installations[fresh] = replace(self._installations[installation_id], id=fresh)
            for repo in self.repos.values():
                if repo.installation_id == installation_id:
                    repo.installation_id = fresh
            installation_id = fresh
        for repo in repos:
            repo.installed = True
        return installation_id

    def uninstall(self, installation_id: int) -> None:
        """No repository is the App's through `installation_id`, and its tokens are revoked."""
        for repo in self.installations().get(installation_id, []):
            repo.installed = False
        self.suspended.pop(installation_id, None)
        self.uninstalled.add(installation_id)

    # --- installation tokens -----------------------------------------------------------

    def issue_token(self, installation_id: int, permissions: dict[str, str]) -> tuple[str, Token]:
        token = "ghs_" + secrets.token_hex(18)
        expires = self.now().replace(microsecond=0) + TOKEN_LIFETIME
        made = Token(installation_id, expires, permissions)
        self.tokens[token] = made
        return token, made

    def live_token(self, token: str | None) -> Token | None:
        """A token the sandbox issued and that has not expired."""
        known = self.tokens.get(token) if token else None
        if known is None or self.now() >= known.expires_at:
            return None
        return known

    def revoked(self, token: str) -> bool:
        """Whether `token` is an uninstalled installation's: GitHub revokes those for good
        (401 from then on; installed again, the App gets a new installation id)."""
        made = self.tokens.get(token)
        return made is not None and made.installation_id in self.uninstalled

    def token_installation(self, token: str) -> int | None:
        known = self.live_token(token)
        return known.installation_id if known is not None else None

    def permissions_for(self, token: str | None, repo: RepoState) -> dict[str, str]:
        """What a request may do in `repo`: its token's permissions when the sandbox minted
        it for this installation (perhaps fewer than the installation's), else the
        installation's (any token is accepted unless authentication is strict)."""
        known = self.live_token(token)
        if known is not None and known.installation_id == repo.installation_id:
            return known.permissions
        return self.installation(repo.installation_id).permissions

    def withholds(self, event: Event) -> str | None:
        """Why GitHub would not deliver `event`: a suspended installation hears nothing but
        `installation` events, an App not installed on the repository nothing of it; else
        see Installation.withholds. A deleted repository's last events still go out."""
        installation_id = (event.payload.get("installation") or {}).get("id", 0)
        if installation_id in self.suspended and event.name != "installation":
            return "the installation is suspended"
        repo = self.repo_by_id((event.payload.get("repository") or {}).get("id", 0))
        if repo is not None and not repo.installed and event.name not in ALWAYS_DELIVERED:
            return "the App is not installed on the repository"
        known = self._installations.get(installation_id)
        return known.withholds(event.name) if known is not None else None

    # --- shared writes -----------------------------------------------------------------

    def add_comment(
        self, repo: RepoState, number: int, user: str, body: str, via_app: bool,
        at: datetime | None = None,
    ) -> IssueComment:
        when = at or self.now()
        if number not in repo.pulls and number not in repo.issues:
            repo.add_issue(number, self.ids.next("pull"), f"Issue #{number}", user, when)
        comment = IssueComment(self.ids.next("comment"), number, user, body, when, when, via_app)
        repo.comments[comment.id] = comment
        # GitHub: a comment moves its issue's or pull request's `updated_at`.
        if number in repo.pulls:
            repo.pulls[number].updated_at = max(repo.pulls[number].updated_at, when)
        else:
            repo.issues[number].updated_at = max(repo.issues[number].last_change, when)
        return comment

    def open_issue(self, repo: RepoState, title: str, user: str) -> Issue:
        return repo.add_issue(None, self.ids.next("pull"), title, user, self.now())

    def register_blob(self, data: bytes) -> str:
        """An unauthenticated download name, like GitHub's signed artifact URLs."""
        name = hashlib.sha256(data + secrets.token_bytes(8)).hexdigest()[:40]
        self.blobs[name] = data
        return name

    # --- capacity ----------------------------------------------------------------------

    def capacity_document(self) -> dict[str, Any]:
        """The cluster status feed of domain §4.5, stamped with the sandbox clock."""
        now = ts(self.now())
        return {
            "kind": "inferencex.status.clusters",
            "generatedAt": now,
            "data": {
                "available": self.capacity.available,
                "clusters": [
                    {
                        "id": cluster.id,
                        "stale": cluster.stale,
                        "status": cluster.status,
                        "observedAt": now,
                        "receivedAt": now,
                        "summary": {
                            "totalNodes": cluster.total,
                            "allocatedNodes": cluster.allocated,
                            "mixedNodes": cluster.mixed,
                            "idleNodes": cluster.idle,
                            "downNodes": cluster.down,
                            "otherNodes": cluster.other,
                        },
                    }
                    for cluster in self.capacity.clusters
                ],
            },
        }
