"""Persistence of the live state behind one small interface.

Every piece of state is a record `(repo, kind, key) -> JSON`: families, pull requests with
their parsed changes, attempts, holds, retry approvals, claims, in-flight dispatches,
pending artifact retries, waves and per-repository metadata. One table keeps the engine
swappable (DESIGN §2 "store/"), and loading a repository is one indexed scan. Records are
(de)serialised by pydantic from the dataclasses of bot.core.domain, so a stored record is
validated on the way back in; one the code cannot read (written by another version, or
edited by hand) is reported in one log line and skipped, never a traceback.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from bot.core.domain import CANDIDATE_LENGTH, CANDIDATE_RE
from bot.store.change import Change
from bot.store.codec import decode_document, decode_many, decode_one, unreadable_reason
from bot.store.engine import Dialect, Engine, Statement, as_count, inflate, stored_as
from bot.store.errors import LeaseTaken
from bot.store.leases import lease_fence, lease_taken_over
from bot.store.migrations import SQLITE_RECORDS_V1
from bot.store.writer import Writer

__all__ = ["STATE_SCHEMA", "Change", "StateStore", "StoredRepo"]

log = structlog.get_logger("klaud.store")

# For callers that still pass it to `Database.open`; migration 1 creates the table.
STATE_SCHEMA = SQLITE_RECORDS_V1

PUT = (
    "INSERT INTO records (repo, kind, key, data) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (repo, kind, key) DO UPDATE SET data = excluded.data"
)
DELETE = "DELETE FROM records WHERE repo = ? AND kind = ? AND key = ?"
CLEAR = "DELETE FROM records WHERE repo = ? AND kind = ?"
PUT_WAVE = (
    "INSERT INTO waves (repo, number, encoding, body) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (repo, number) DO UPDATE SET encoding = excluded.encoding, body = excluded.body"
)
DELETE_WAVE = "DELETE FROM waves WHERE repo = ? AND number = ?"
CLEAR_WAVES = "DELETE FROM waves WHERE repo = ?"
# A renamed repository's records and waves, moved to its new name in one transaction, with
# its deliveries still to process: named by the old name, with replicas they went to the old
# name's lease, whose holder no longer kept the repository (and lost them).
RENAME = (
    "UPDATE records SET repo = ? WHERE repo = ?",
    "UPDATE records SET key = ? WHERE repo = '' AND kind = 'repo' AND key = ?",
    "UPDATE waves SET repo = ? WHERE repo = ?",
    "UPDATE deliveries SET repo = ? WHERE lower(repo) = lower(?) AND status IN ('queued', 'processing')",
)
GET_WAVE = "SELECT encoding, body FROM waves WHERE repo = ? AND number = ?"
# A wave cancelled (or crashed) after numbering itself stored no document: its number is a gap.
LAST_WAVES = "SELECT number FROM waves WHERE repo = ? ORDER BY number DESC LIMIT ?"
REPOS = "SELECT key FROM records WHERE repo = '' AND kind = 'repo'"
# The name a repository's GitHub id is stored under: one meta record read, not all decoded.
NAME_OF: dict[Dialect, str] = {
    "sqlite": "SELECT key FROM records WHERE repo = '' AND kind = 'repo'"
    " AND CASE WHEN json_valid(data) THEN json_extract(data, '$.repo_id') END = ?",
    "postgresql": "SELECT key FROM records WHERE repo = '' AND kind = 'repo' AND (data ->> 'repo_id') = ?",
}
# Every stored repository with the installation and id its meta record names, whichever
# replica keeps it (meta records stay JSON text on both engines: only waves are compressed).
STORED_REPOS: dict[Dialect, str] = {
    "sqlite": "SELECT key, CASE WHEN json_valid(data) THEN json_extract(data, '$.installation') END,"
    " CASE WHEN json_valid(data) THEN json_extract(data, '$.repo_id') END"
    " FROM records WHERE repo = '' AND kind = 'repo'",
    "postgresql": "SELECT key, data ->> 'installation', data ->> 'repo_id' FROM records WHERE repo = '' AND kind = 'repo'",
}
# The spelling a name is stored under, as GitHub compares names (readable or not).
STORED = "SELECT key FROM records WHERE repo = '' AND kind = 'repo' AND lower(key) = lower(?)"
# SQLite hands each record over as bytes: decoded as text, one that is not UTF-8 (or typed
# BLOB by a hand edit) failed the whole query, and its repository could not load at all.
STORED_DATA: dict[Dialect, str] = {"sqlite": "CAST(data AS BLOB)", "postgresql": "data"}
LOAD = "SELECT kind, key, {data} FROM records WHERE repo = ?"
GET = "SELECT {data} FROM records WHERE repo = ? AND kind = ? AND key = ?"
# An attempt's completion time (ISO text), NULL when the record has none. SQLite's TEXT
# column may hold text that is not JSON, on which json_extract would fail the whole query.
COMPLETED_AT: dict[Dialect, str] = {
    "sqlite": "CASE WHEN json_valid(data) THEN json_extract(data, '$.completed_at') END",
    "postgresql": "(data ->> 'completed_at')",
}
# Attempts without a readable time are loaded, so that they are reported, not hidden.
LOAD_SINCE = LOAD + " AND (kind != 'attempt' OR coalesce({completed_at} >= ?, TRUE))"
PRUNE_ATTEMPTS = "DELETE FROM records WHERE kind = 'attempt' AND {completed_at} < ?"
# Some candidates' attempts, whatever their age, in one pass over the repository's attempts
# (keys are "<candidate>:<run>:<attempt>", a candidate id CANDIDATE_LENGTH characters): one query
# per candidate read them all again for each of a restart's open Klaud PRs.
ATTEMPTS_OF: dict[Dialect, str] = {
    "sqlite": "SELECT kind, key, {data} FROM records WHERE repo = ? AND kind = 'attempt'"
    " AND substr(key, 1, {length}) IN (SELECT value FROM json_each(?))",
    "postgresql": "SELECT kind, key, {data} FROM records WHERE repo = ? AND kind = 'attempt'"
    " AND substr(key, 1, {length}) = ANY(?::text[])",
}


class StateStore:
    def __init__(self, db: Engine, writer: Writer | None = None) -> None:
        self.db = db
        # Shared with the delivery store, so a delivery's status commits with its changes.
        self.writer = writer or Writer(db)
        completed_at, data = COMPLETED_AT[db.dialect], STORED_DATA[db.dialect]
        self._load = LOAD.format(data=data)
        self._get = GET.format(data=data)
        self._load_since = LOAD_SINCE.format(completed_at=completed_at, data=data)
        self._attempts_of = ATTEMPTS_OF[db.dialect].format(data=data, length=CANDIDATE_LENGTH)
        self._prune_attempts = PRUNE_ATTEMPTS.format(completed_at=completed_at)
        # Replicas (PostgreSQL): this process's owner name (set by `Replicas`). Changes then
        # commit only while no other replica holds their repositories' leases (a delivery's
        # are fenced by its claim as well: a claim still held does not say whether the
        # repository was taken or uninstalled meanwhile).
        self.lease_owner: str | None = None
        # Replicas: whether this process holds a repository now, by its own clock (set by
        # `Replicas`). The fence above lets anyone write a repository nobody holds: a replica
        # resumed after a stall, its successor gone with a clean stop, would write its stale
        # memory over the successor's state. Its own clock tells it that it holds nothing.
        self.owns: Callable[[str], bool] | None = None

    async def open(self) -> None:
        await self.db.open()

    async def apply(self, change: Change) -> None:
        waves = [(repo, number, *stored_as(self.db.dialect, data)) for repo, number, data in change.wave_puts]
        statements = [
            Statement(CLEAR, change.clears, many=True),
            Statement(DELETE, change.deletes, many=True),
            Statement(PUT, change.puts, many=True),
            Statement(CLEAR_WAVES, [(repo,) for repo in change.wave_clears], many=True),
            Statement(DELETE_WAVE, change.wave_deletes, many=True),
            Statement(PUT_WAVE, waves, many=True),
        ]
        if change:
            repos = change.repos()
            self._refuse_unheld(repos - {repo.lower() for repo in change.dropped})
            fence = None
            if self.lease_owner is not None:
                fence = lease_fence(repos, self.lease_owner)
                if change.dropped:
                    statements.append(lease_taken_over(change.dropped, self.lease_owner))
            await self.writer.apply([statement for statement in statements if statement.args], repos, fence)

    def _refuse_unheld(self, repos: set[str]) -> None:
        unheld = sorted(repo for repo in repos if self.owns is not None and not self.owns(repo))
        if unheld:
            raise LeaseTaken(f"{', '.join(unheld)}: not held by this replica now (its lease lapsed or moved)")

    async def rename(self, old: str, new: str) -> None:
        """Move every record and wave of `old` to `new` (the store has nothing of `new`);
        with replicas, only while no other replica holds either name."""
        statements = [Statement(sql, (new, old)) for sql in RENAME]
        if self.lease_owner is not None:
            statements.append(lease_fence([old, new], self.lease_owner))
        await self.writer.write(statements, {old, new})

    async def repos(self) -> list[str]:
        return [row[0] for row in await self.db.fetch(REPOS)]

    async def stored_repos(self) -> list[StoredRepo]:
        """Every repository kept in the store, by any replica, with its installation and id
        (None where its meta record does not say, or cannot be read)."""
        rows = await self.db.fetch(STORED_REPOS[self.db.dialect])
        return [StoredRepo(str(name), _whole_number(installation), _whole_number(repo_id))
                for name, installation, repo_id in rows]

    async def load(self, repo: str, *, attempts_since: str | None = None) -> dict[str, dict[str, Any]]:
        """Every readable record of `repo` as {kind: {key: value}}.

        `attempts_since` (ISO text, as stored) leaves older attempts in the store: they are
        history no rule reads, and decoding them dominated the time of a restart.
        """
        if attempts_since is None:
            rows = await self.db.fetch(self._load, repo)
        else:
            rows = await self.db.fetch(self._load_since, repo, attempts_since)
        return _decoded_by_kind(repo, rows)

    async def attempts_of(self, repo: str, candidates: Collection[str]) -> dict[str, Any]:
        """Every readable stored attempt of `candidates` (candidate ids), of any age, by key."""
        wanted = sorted(candidates)
        if not wanted:
            return {}
        if not all(CANDIDATE_RE.fullmatch(candidate) for candidate in wanted):
            raise ValueError(f"not candidate ids: {wanted!r}")
        listed: str | list[str] = wanted if self.db.dialect == "postgresql" else json.dumps(wanted)
        rows = await self.db.fetch(self._attempts_of, repo, listed)
        return _decoded_by_kind(repo, rows).get("attempt", {})

    async def prune_attempts(self, before: str) -> int:
        """Delete attempts that completed before `before` (ISO text, as stored)."""
        results = await self.writer.write([Statement(self._prune_attempts, (before,))])
        return as_count(results[0])

    async def name_of(self, repo_id: int) -> str | None:
        """The name the repository whose GitHub id is `repo_id` is stored under, if any."""
        # PostgreSQL's ->> answers text; SQLite's json_extract the stored integer.
        wanted: int | str = str(repo_id) if self.db.dialect == "postgresql" else repo_id
        rows = await self.db.fetch(NAME_OF[self.db.dialect], wanted)
        return str(rows[0][0]) if rows else None

    async def stores(self, name: str) -> bool:
        """Whether a repository's record is stored under `name` (in any case, readable or not)."""
        return await self.stored_name(name) is not None

    async def stored_name(self, name: str) -> str | None:
        """The spelling a repository's record is stored under, `name` in any case (readable
        or not); None when there is none."""
        rows = await self.db.fetch(STORED, name)
        return str(rows[0][0]) if rows else None

    async def get(self, repo: str, kind: str, key: str, default: Any = None) -> Any:
        """The record's value; `default` when it is absent or unreadable (then reported)."""
        rows = await self.db.fetch(self._get, repo, kind, key)
        if not rows:
            return default
        return _decode(repo, kind, [key], [rows[0][0]]).get(key, default)

    async def last_wave_numbers(self, repo: str, limit: int) -> list[int]:
        """The numbers of the last `limit` waves stored, newest first."""
        return [int(row[0]) for row in await self.db.fetch(LAST_WAVES, repo, limit)]

    async def wave(self, repo: str, number: int) -> dict[str, Any] | None:
        """The stored document of wave `number`; None when absent or unreadable (then reported)."""
        rows = await self.db.fetch(GET_WAVE, repo, number)
        if not rows:
            return None
        # ValueError: a blob that does not decompress, or text that is not JSON (its message says which).
        try:
            document: dict[str, Any] = decode_document(inflate(rows[0][0], rows[0][1]))
        except ValueError as exc:
            log.warning("store.record_unreadable", repo=repo, kind="wave", key=number, reason=str(exc))
            return None
        return document


@dataclass(frozen=True, slots=True)
class StoredRepo:
    name: str  # as GitHub spelled it when it was stored
    installation: int | None
    repo_id: int | None


def _whole_number(value: Any) -> int | None:
    """A stored id as an integer (PostgreSQL's ->> answers text), None when it is not one."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _decoded_by_kind(repo: str, rows: Sequence[Sequence[Any]]) -> dict[str, dict[str, Any]]:
    grouped: dict[str, tuple[list[str], list[str | bytes]]] = defaultdict(lambda: ([], []))
    for kind, key, data in rows:
        keys, texts = grouped[kind]
        keys.append(key)
        texts.append(data)
    return {kind: _decode(repo, kind, keys, texts) for kind, (keys, texts) in grouped.items()}


def _decode(repo: str, kind: str, keys: list[str], texts: list[str | bytes]) -> dict[str, Any]:
    try:
        # strict: text that is not one JSON value could split into several array items.
        return dict(zip(keys, decode_many(kind, texts), strict=True))
    except ValueError:
        # One record the code cannot read must not cost the others.
        return dict(_readable(repo, kind, keys, texts))


def _readable(repo: str, kind: str, keys: list[str], texts: list[str | bytes]) -> Iterator[tuple[str, Any]]:
    for key, text in zip(keys, texts, strict=True):
        try:
            yield key, decode_one(kind, text)
        except ValueError as exc:
            log.warning("store.record_unreadable", repo=repo, kind=kind, key=key, reason=unreadable_reason(exc))
