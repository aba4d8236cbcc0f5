"""Persistence of the live state behind one small interface.

Every piece of state is a record `(repo, kind, key) -> JSON`: families, pull requests with
their parsed changes, attempts, holds, retry approvals, claims, in-flight dispatches,
pending artifact retries, waves and per-repository metadata. One table keeps the engine
swappable (DESIGN §2 "store/"), and loading a repository is one indexed scan. Records are
(de)serialised by pydantic from the dataclasses of bot.core.domain, so a stored record is
validated on the way back in.
"""

from __future__ import annotations

import sqlite3
from collections import defaultdict
from typing import Any

from bot.store.change import Change
from bot.store.codec import decode_many
from bot.store.db import Database

STATE_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    repo TEXT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (repo, kind, key)
) WITHOUT ROWID;
"""

class StateStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def open(self) -> None:
        await self.db.run(lambda conn: conn.executescript(STATE_SCHEMA))

    async def apply(self, change: Change) -> None:
        if change:
            await self.db.transaction(change.apply)

    async def repos(self) -> list[str]:
        def select(conn: sqlite3.Connection) -> list[str]:
            rows = conn.execute("SELECT key FROM records WHERE repo = '' AND kind = 'repo'")
            return [row[0] for row in rows]

        return await self.db.run(select)

    async def load(self, repo: str, *, attempts_since: str | None = None) -> dict[str, dict[str, Any]]:
        """Every record of `repo` as {kind: {key: value}}.

        `attempts_since` (ISO text, as stored) leaves older attempts in the store: they are
        history no rule reads, and decoding them dominated the time of a restart.
        """

        def select(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
            if attempts_since is None:
                return conn.execute("SELECT kind, key, data FROM records WHERE repo = ?", (repo,)).fetchall()
            return conn.execute(
                "SELECT kind, key, data FROM records WHERE repo = ?"
                " AND (kind != 'attempt' OR json_extract(data, '$.completed_at') >= ?)",
                (repo, attempts_since),
            ).fetchall()

        rows = await self.db.run(select)
        grouped: dict[str, tuple[list[str], list[str]]] = defaultdict(lambda: ([], []))
        for kind, key, data in rows:
            keys, texts = grouped[kind]
            keys.append(key)
            texts.append(data)
        return {
            kind: dict(zip(keys, decode_many(kind, texts))) for kind, (keys, texts) in grouped.items()
        }

    async def prune_attempts(self, before: str) -> int:
        """Delete attempts that completed before `before` (ISO text, as stored)."""

        def delete(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                "DELETE FROM records WHERE kind = 'attempt' AND json_extract(data, '$.completed_at') < ?", (before,)
            )
            return cur.rowcount

        return await self.db.transaction(delete)

    async def get(self, repo: str, kind: str, key: str) -> Any | None:
        def select(conn: sqlite3.Connection) -> str | None:
            row = conn.execute(
                "SELECT data FROM records WHERE repo = ? AND kind = ? AND key = ?", (repo, kind, key)
            ).fetchone()
            return row[0] if row else None

        text = await self.db.run(select)
        return None if text is None else decode_many(kind, [text])[0]
