"""What an installation may do and hear: its permissions and subscribed events.

GitHub answers 403 "Resource not accessible by integration" to a request whose route needs
a permission the installation (or the token, when minted with fewer) lacks, and it sends
no webhook for an event the installation does not subscribe to or may not see. The App's
own permissions and events are those Klaud's App manifest (`app.yaml`) asks for, which
`klaud doctor` requires (a test keeps the three equal), so the sandbox grants exactly what the
real App would be granted. They are not read from `app.yaml`: an installed Klaud (the
container's) has no checkout beside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from bot.core.doctor import REQUIRED_EVENTS, REQUIRED_PERMISSIONS

LEVELS = {"read": 1, "write": 2, "admin": 3}
# GitHub delivers these to every App, whatever it subscribes to.
ALWAYS_DELIVERED = ("installation", "installation_repositories")

# A route's requirement: any one of these (permission, level) pairs grants it; `write`
# implies `read`. An empty tuple needs no permission (App-JWT and token-only routes).
Needs = tuple[tuple[str, str], ...]
NOTHING: Needs = ()
METADATA_READ: Needs = (("metadata", "read"),)
CONTENTS_READ: Needs = (("contents", "read"),)
CONTENTS_WRITE: Needs = (("contents", "write"),)
PULLS_READ: Needs = (("pull_requests", "read"),)
ACTIONS_READ: Needs = (("actions", "read"),)
ACTIONS_WRITE: Needs = (("actions", "write"),)
CHECKS_READ: Needs = (("checks", "read"),)
CHECKS_WRITE: Needs = (("checks", "write"),)
ISSUES_READ: Needs = (("issues", "read"),)
ISSUES_WRITE: Needs = (("issues", "write"),)
# Comments and reactions live on issues and pull requests alike; GitHub documents either.
CONVERSATION_READ: Needs = (("issues", "read"), ("pull_requests", "read"))
CONVERSATION_WRITE: Needs = (("issues", "write"), ("pull_requests", "write"))

# The permission an App needs to receive each webhook the sandbox sends.
EVENT_NEEDS: dict[str, Needs] = {
    "push": CONTENTS_READ,
    "repository_dispatch": CONTENTS_READ,
    "pull_request": PULLS_READ,
    "issue_comment": CONVERSATION_READ,
    "issues": ISSUES_READ,
    "workflow_run": ACTIONS_READ,
    "check_run": CHECKS_READ,
    "check_suite": CHECKS_READ,
}


def grants(permissions: dict[str, str], needs: Needs) -> bool:
    if not needs:
        return True
    return any(LEVELS.get(permissions.get(name, ""), 0) >= LEVELS[level]
               for name, level in needs)


def covers(granted: dict[str, str], wanted: dict[str, str]) -> bool:
    """Whether `granted` holds every permission of `wanted` at least at its level."""
    return all(grants(granted, ((name, level),)) for name, level in wanted.items())


def with_metadata(permissions: dict[str, str]) -> dict[str, str]:
    """GitHub gives read access to metadata to any App that has a repository permission."""
    if permissions and "metadata" not in permissions:
        return {**permissions, "metadata": "read"}
    return dict(permissions)


@dataclass(frozen=True)
class AppManifest:
    """The App's registered permissions and events (`default_permissions`, `default_events`)."""

    permissions: dict[str, str] = field(default_factory=dict)
    events: tuple[str, ...] = ()

    @property
    def installation_events(self) -> tuple[str, ...]:
        return self.events + tuple(e for e in ALWAYS_DELIVERED if e not in self.events)


KLAUD_MANIFEST = AppManifest(dict(REQUIRED_PERMISSIONS), tuple(sorted(REQUIRED_EVENTS)))


@dataclass(frozen=True)
class Installation:
    id: int
    permissions: dict[str, str]
    events: tuple[str, ...]

    def allows(self, needs: Needs) -> bool:
        return grants(self.permissions, needs)

    def withholds(self, event: str) -> str | None:
        """Why GitHub would not deliver `event` to this installation; None if it would."""
        if event in ALWAYS_DELIVERED:
            return None
        if event not in self.events:
            return f"the installation does not subscribe to {event}"
        if not self.allows(EVENT_NEEDS.get(event, NOTHING)):
            return f"the installation has no permission to receive {event}"
        return None


@dataclass(frozen=True)
class Suspension:
    """Who suspended an installation, and when (its `suspended_by`, `suspended_at`)."""

    by: str
    at: datetime
