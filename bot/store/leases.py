"""Named leases: who owns what (a repository, the scheduler) among replicas, for how long.

A lease is a row with an owner and an expiry. It is taken by an atomic upsert that only
succeeds on a free, expired or already own lease, so two replicas never both believe they
hold it; an owner that stops renewing (it crashed, or lost the database) loses it at expiry.
Times are the database's clock, the one every replica shares.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from bot.store.engine import Dialect, Engine, Statement, as_count, as_rows

ACQUIRE = (
    "INSERT INTO leases (name, owner, expires_at) VALUES (?, ?, {now} + ?)"
    " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at"
    " WHERE leases.owner = excluded.owner OR leases.expires_at <= {now}"
)
TAKE_OVER = (
    "INSERT INTO leases (name, owner, expires_at) VALUES (?, ?, {now} + ?)"
    " ON CONFLICT (name) DO UPDATE SET owner = excluded.owner, expires_at = excluded.expires_at"
)
# Only while the row still names the owner: once another replica took the lease, or it was
# released, renewing fails and the owner knows to stop.
RENEW_MANY = "UPDATE leases SET expires_at = {now} + ? WHERE owner = ? AND name IN ({names}) RETURNING name"
RELEASE = "DELETE FROM leases WHERE name = ? AND owner = ?"
HOLDERS = "SELECT name, owner FROM leases WHERE expires_at > {now}"
# A process that dies leaves its heartbeat lease (`replica:<host>:<pid>:<id>`, a new name at
# every start) behind, expired; without this, every crash would add a row for good.
PRUNE = "DELETE FROM leases WHERE expires_at < {now} - ?"
LEASES_FREE = "SELECT klaud_leases_free(?::text[], ?)"  # migration 7


def repo_lease(repo: str) -> str:
    """The lease of a repository (one owner among replicas)."""
    return f"repo:{repo.lower()}"


def lease_taken_over(repos: Iterable[str], owner: str) -> Statement:
    """A statement that makes `owner` the holder of the leases of `repos` held by another
    replica, until they expire (PostgreSQL): that replica's renewal fails, and what it
    writes of them meanwhile is refused by the lease fence."""
    names = sorted({repo_lease(repo) for repo in repos})
    return Statement("UPDATE leases SET owner = ? WHERE name = ANY(?::text[]) AND owner <> ?", (owner, names, owner))


def lease_fence(repos: Iterable[str], owner: str) -> Statement:
    """A statement that fails its transaction (`LeaseTaken`) when another replica than
    `owner` holds the lease of one of `repos` (PostgreSQL). The fences of a transaction
    are one statement (`LeaseFences`)."""
    return Statement(LEASES_FREE, (sorted({repo_lease(repo) for repo in repos}), owner), rows=True, coalesce=LEASE_FENCES)


@dataclass(frozen=True)
class LeaseFences:
    """The `Coalesce` of lease fences: one check per transaction and replica, over the
    leases of every repository its statements write."""

    def statements(self, dialect: Dialect, args: list[Sequence[Any]]) -> list[Statement]:
        by_owner: dict[str, set[str]] = {}
        for names, owner in args:
            by_owner.setdefault(owner, set()).update(names)
        return [Statement(LEASES_FREE, (sorted(names), owner), rows=True) for owner, names in by_owner.items()]


LEASE_FENCES = LeaseFences()


class LeaseStore:
    def __init__(self, db: Engine) -> None:
        self.db = db
        self._acquire = ACQUIRE.format(now=db.now_sql)
        self._holders = HOLDERS.format(now=db.now_sql)
        self._take_over = TAKE_OVER.format(now=db.now_sql)

    async def acquire(self, name: str, owner: str, ttl_seconds: float) -> bool:
        """Take lease `name` for `ttl_seconds` unless someone else holds it unexpired."""
        return await self._changed(self._acquire, name, owner, ttl_seconds)

    async def take_over(self, name: str, owner: str, ttl_seconds: float) -> bool:
        """Take lease `name` for `ttl_seconds` whoever holds it: its holder's renewal fails,
        and what it writes meanwhile is refused by the lease fence."""
        return await self._changed(self._take_over, name, owner, ttl_seconds)

    async def renew_all(self, names: set[str], owner: str, ttl_seconds: float) -> set[str]:
        """Renew every lease of `names` `owner` still holds, in one statement; answer those."""
        if not names:
            return set()
        sql = RENEW_MANY.format(now=self.db.now_sql, names=", ".join("?" * len(names)))
        results = await self.db.transaction([Statement(sql, (ttl_seconds, owner, *sorted(names)), rows=True)])
        return {row[0] for row in as_rows(results[0])}

    async def release(self, name: str, owner: str) -> None:
        """Give the lease up at once (a clean shutdown), if `owner` still holds it."""
        await self.db.transaction([Statement(RELEASE, (name, owner))])

    async def prune(self, expired_for_seconds: float) -> int:
        """Delete the leases expired for longer than `expired_for_seconds`; their count."""
        results = await self.db.transaction([Statement(PRUNE.format(now=self.db.now_sql), (expired_for_seconds,))])
        return as_count(results[0])

    async def holders(self) -> dict[str, str]:
        """Every unexpired lease: {name: owner}."""
        return {name: owner for name, owner in await self.db.fetch(self._holders)}

    async def _changed(self, sql: str, *args: object) -> bool:
        results = await self.db.transaction([Statement(sql, args)])
        return as_count(results[0]) == 1
