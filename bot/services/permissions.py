"""Who may change what: collaborator permissions, read from GitHub and cached briefly."""

from __future__ import annotations

from cachetools import TTLCache

from bot.core.clock import Clock
from bot.core.commands import effective_permission, permission_allows
from bot.services.api import RepoAPI
from bot.services.repo_state import RepoState

PERMISSION_TTL_SECONDS = 600


class Permissions:
    def __init__(self, clock: Clock) -> None:
        self._cache: TTLCache[tuple[str, str], str | None] = TTLCache(
            maxsize=4096, ttl=PERMISSION_TTL_SECONDS, timer=clock.timestamp
        )

    async def of(self, api: RepoAPI, state: RepoState, user: str) -> str | None:
        key = (state.name.lower(), user.lower())
        if key not in self._cache:
            permission, role_name = await api.permission(user)
            self._cache[key] = effective_permission(permission, role_name)
        return self._cache[key]

    async def allows(self, api: RepoAPI, state: RepoState, user: str, verb: str) -> bool:
        return permission_allows(verb, await self.of(api, state, user))
