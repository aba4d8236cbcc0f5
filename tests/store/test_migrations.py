"""Numbered schema migrations: a store written before versions is adopted and upgraded, a new
store gets every migration once, and a store from a newer Klaud is refused."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from datetime import UTC, datetime

import pytest
from structlog.testing import capture_logs

from bot.core.domain import Family
from bot.store import SchemaTooNew, StoreError, open_stores, sqlite_path
from bot.store.codec import encode
from bot.store.engine import Statement
from bot.store.migrations import LATEST, RECORD_VERSION

POSTGRESQL_ONLY = pytest.mark.parametrize("store_url", ["postgresql"], indirect=True)

# The schema exactly as Klaud created it before schema versions existed.
UNVERSIONED_SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    event TEXT NOT NULL,
    action TEXT,
    repo TEXT,
    installation INTEGER,
    headers TEXT NOT NULL,
    body BLOB NOT NULL,
    status TEXT NOT NULL DEFAULT 'queued',
    attempts INTEGER NOT NULL DEFAULT 0,
    error TEXT,
    received_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS deliveries_open ON deliveries(status)
    WHERE status = 'queued';
CREATE TABLE IF NOT EXISTS records (
    repo TEXT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (repo, kind, key)
) WITHOUT ROWID;
"""
FAMILY = Family("configs/a-master.yaml:k", "configs/a-master.yaml", "k", "img:1", "b200", ("b200-x",),
                "dsr1", "fp8", "sglang", 1, 9, datetime(2026, 11, 30, 8, tzinfo=UTC))
# A hold as an older Klaud wrote it: a bare string where the code now wants an object.
OLD_HOLD = json.dumps("waiting for new weights")


def write_unversioned_store(path: str) -> None:
    conn = sqlite3.connect(path)
    conn.executescript(UNVERSIONED_SCHEMA)
    conn.execute(
        "INSERT INTO deliveries (id, event, repo, headers, body, received_at, updated_at)"
        " VALUES ('old-1', 'push', 'o/r', '{}', x'7b7d', 1.0, 1.0)"
    )
    conn.executemany("INSERT INTO records VALUES (?, ?, ?, ?)", [
        ("", "repo", "o/r", '{"installation": 1}'),
        ("o/r", "family", FAMILY.id, encode("family", FAMILY)),
        ("o/r", "hold", FAMILY.id, OLD_HOLD),
        ("o/r", "wave", "00000003", '{"wave": 3, "decisions": []}'),
    ])
    conn.commit()
    conn.close()


async def test_a_store_written_before_versions_is_adopted_as_version_1_and_upgraded(tmp_path):
    path = str(tmp_path / "klaud.db")
    write_unversioned_store(path)
    with capture_logs() as logs:
        stores = await open_stores(f"sqlite:///{path}")
        loaded = await stores.state.load("o/r")
    try:
        versions = await stores.engine.fetch("SELECT version FROM schema_version ORDER BY version")
        assert [row[0] for row in versions] == list(range(1, LATEST + 1))
        columns = {row[1] for row in await stores.engine.fetch("PRAGMA table_info(deliveries)")}
        assert {"claimed_by", "claimed_at"} <= columns and "body" not in columns
        # The body moved to its own table (migration 3), as it was stored: uncompressed.
        assert (await stores.deliveries.get("old-1")).body == b"{}"  # type: ignore[union-attr]
        assert await stores.deliveries.bodies(["old-1"]) == {"old-1": b"{}"}
        # Wave documents moved to their table (migration 4), readable as they were.
        assert await stores.state.wave("o/r", 3) == {"wave": 3, "decisions": []}
        assert "wave" not in loaded
        # Nothing recreated: the old rows are all there, and the new features work on them.
        assert await stores.state.repos() == ["o/r"] and loaded["family"] == {FAMILY.id: FAMILY}
        assert [d.id for d in await stores.deliveries.claim_owned("me", {"o/r"}, unrouted=False, limit=5)] == ["old-1"]
        assert await stores.leases.acquire("repo:o/r", "me", 30)
    finally:
        await stores.close()
    migrated = [e for e in logs if e["event"] == "store.migrated"]
    assert [(e["from_version"], e["to_version"], e["adopted_unversioned"]) for e in migrated] == [(0, LATEST, True)]
    # The record in the old shape: skipped, and said in one line with where it is and why.
    assert loaded["hold"] == {}
    [report] = [e for e in logs if e["event"] == "store.record_unreadable"]
    assert (report["repo"], report["kind"], report["key"]) == ("o/r", "hold", FAMILY.id)
    assert report["reason"] == "record: Input should be an object" and report["log_level"] == "warning"


async def test_a_new_store_gets_every_migration_once(store_url):
    with capture_logs() as logs:
        for _ in range(2):
            stores = await open_stores(store_url)
            versions = await stores.engine.fetch("SELECT version, name FROM schema_version ORDER BY version")
            await stores.close()
    assert [row[0] for row in versions] == list(range(1, LATEST + 1))
    assert [(e["from_version"], e["to_version"]) for e in logs if e["event"] == "store.migrated"] == [(0, LATEST)]


async def test_a_store_migrated_by_a_newer_klaud_is_refused(store_url):
    stores = await open_stores(store_url)
    await stores.engine.transaction([Statement(RECORD_VERSION, (LATEST + 1, "from the future", 0.0))])
    await stores.close()
    with pytest.raises(SchemaTooNew, match=f"schema version {LATEST + 1}; this Klaud knows versions up to {LATEST}$"):
        await open_stores(store_url)


@POSTGRESQL_ONLY
async def test_replicas_starting_together_migrate_once(store_url):
    with capture_logs() as logs:
        replicas = await asyncio.gather(*(open_stores(store_url) for _ in range(4)))
    try:
        versions = await replicas[0].engine.fetch("SELECT version FROM schema_version ORDER BY version")
    finally:
        for replica in replicas:
            await replica.close()
    assert [row[0] for row in versions] == list(range(1, LATEST + 1))
    assert len([e for e in logs if e["event"] == "store.migrated"]) == 1


@pytest.mark.parametrize("version", [1, 2, 3])
async def test_a_store_left_at_each_older_version_is_upgraded_with_its_data(store_url, monkeypatch, version):
    # The moves of migrations 3 (bodies) and 4 (waves) over rows that exist, on both engines.
    from bot.store import migrations

    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:version])
    monkeypatch.setattr(migrations, "LATEST", version)
    old = await open_stores(store_url)
    columns = "id, event, repo, headers, received_at, updated_at" + (", body" if version < 3 else "")
    delivery = Statement(f"INSERT INTO deliveries ({columns}) VALUES (?, ?, ?, ?, ?, ?{', ?' if version < 3 else ''})",
                         ("old-1", "push", "o/r", "{}", 1.0, 1.0, *([b"{}"] if version < 3 else [])))
    statements = [delivery]
    if version >= 3:
        statements.append(Statement("INSERT INTO delivery_bodies (id, encoding, body) VALUES (?, NULL, ?)", ("old-1", b"{}")))
    put = "INSERT INTO records (repo, kind, key, data) VALUES (?, ?, ?, ?)"
    statements += [
        Statement(put, ("", "repo", "o/r", '{"installation": 1}')),
        Statement(put, ("o/r", "family", FAMILY.id, encode("family", FAMILY))),
        Statement(put, ("o/r", "wave", "00000003", '{"wave": 3, "decisions": []}')),
    ]
    await old.engine.transaction(statements)
    await old.close()
    monkeypatch.undo()

    stores = await open_stores(store_url)
    try:
        versions = await stores.engine.fetch("SELECT version FROM schema_version ORDER BY version")
        assert [row[0] for row in versions] == list(range(1, LATEST + 1))
        assert (await stores.deliveries.get("old-1")).body == b"{}"  # type: ignore[union-attr]
        assert await stores.state.wave("o/r", 3) == {"wave": 3, "decisions": []}
        loaded = await stores.state.load("o/r")
        assert loaded["family"] == {FAMILY.id: FAMILY} and "wave" not in loaded
        assert [d.id for d in await stores.deliveries.claim_owned("me", {"o/r"}, unrouted=False, limit=5)] == ["old-1"]
    finally:
        await stores.close()


PUT_RECORD = "INSERT INTO records (repo, kind, key, data) VALUES (?, ?, ?, ?)"
WAVE_3 = '{"wave": 3, "decisions": []}'


async def write_store_at_version(store_url: str, monkeypatch: pytest.MonkeyPatch, version: int,
                                 records: list[tuple[str, str, str, str]]) -> None:
    """A store as a Klaud that knew migrations up to `version` left it, with `records`."""
    from bot.store import migrations

    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:version])
    monkeypatch.setattr(migrations, "LATEST", version)
    try:
        old = await open_stores(store_url)
        await old.engine.transaction([Statement(PUT_RECORD, record) for record in records])
        await old.close()
    finally:
        monkeypatch.undo()


async def test_a_wave_record_whose_key_is_not_a_number_is_kept_and_reported_alike_on_both_engines(store_url, monkeypatch):
    # What this catches: a wave record keyed "latest" (edited by hand) stopped every start on
    # PostgreSQL (`key::bigint`: an asyncpg traceback) and became wave 0 on SQLite (CAST).
    await write_store_at_version(store_url, monkeypatch, 3, [
        ("", "repo", "o/r", '{"installation": 1, "wave": 3}'),
        ("o/r", "wave", "00000003", WAVE_3),
        ("o/r", "wave", "latest", WAVE_3),
        ("o/r", "wave", " 4", WAVE_3),  # a number to both casts, not a key Klaud writes
    ])
    with capture_logs() as logs:
        stores = await open_stores(store_url)
    try:
        assert await stores.state.wave("o/r", 3) == {"wave": 3, "decisions": []}
        numbers = await stores.engine.fetch("SELECT repo, number FROM waves")
        assert [tuple(row) for row in numbers] == [("o/r", 3)]
        kept = await stores.engine.fetch("SELECT key FROM records WHERE kind = 'wave' ORDER BY key")
        assert [row[0] for row in kept] == [" 4", "latest"]
    finally:
        await stores.close()
    [report] = [e for e in logs if e["event"] == "store.records_left"]
    assert report["log_level"] == "warning" and (report["migration"], report["count"]) == (4, 2)
    assert report["records"] == ["o/r wave ' 4'", "o/r wave 'latest'"]


async def test_a_migration_the_engine_refuses_is_one_store_error_naming_it_and_changes_nothing(store_url, monkeypatch):
    # What this catches: a migration's statement refused by the engine (here two wave records
    # of one number: "3" and "00000003") escaping start-up as sqlite3's or asyncpg's own
    # exception with a traceback, instead of the store's one line naming the migration.
    await write_store_at_version(store_url, monkeypatch, 3, [
        ("o/r", "wave", "00000003", WAVE_3),
        ("o/r", "wave", "3", WAVE_3),
    ])
    with pytest.raises(StoreError) as refused:
        await open_stores(store_url)
    message = str(refused.value)
    assert type(refused.value) is StoreError and len(message.splitlines()) == 1
    assert "migration 4 (wave documents in a table of their own) failed: " in message
    assert message.startswith(sqlite_path(store_url) or "PostgreSQL ")  # the store it names
    # Rolled back: the store is still at version 3 with its records, for the next try.
    from bot.store import migrations

    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:3])
    monkeypatch.setattr(migrations, "LATEST", 3)
    stores = await open_stores(store_url)
    try:
        assert (await stores.engine.fetch("SELECT max(version) FROM schema_version"))[0][0] == 3
        assert len(await stores.engine.fetch("SELECT key FROM records WHERE kind = 'wave'")) == 2
    finally:
        await stores.close()


async def _url_of_a_role_without_create(postgres_server, database_url: str) -> str:
    """The database's URL for a role that may connect but not create tables in `public`:
    PostgreSQL 15's default for a role that does not own the database (a managed server, a
    DBA's `CREATE ROLE klaud LOGIN` on a database someone else created)."""
    import asyncpg

    admin = await asyncpg.connect(database_url)
    try:
        await admin.execute(
            "DO $$ BEGIN CREATE ROLE klaud_limited LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        await admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    finally:
        await admin.close()
    return database_url.replace("postgresql://postgres@", "postgresql://klaud_limited@")


async def test_a_schema_the_role_may_not_create_is_one_store_error_and_one_cli_line(postgres_server, tmp_path):
    # The version table is made before the migrations: its refusal escaped start-up as
    # asyncpg's own exception, a traceback at the CLI's boundary for serve, plan, receive.
    from tests.conftest import fresh_database
    from tests.web.test_cli_boundary import klaud_env, one_line, run_klaud

    async with fresh_database(postgres_server) as url:
        limited = await _url_of_a_role_without_create(postgres_server, url)
        with pytest.raises(StoreError) as refused:
            await open_stores(limited)
        message = str(refused.value)
        assert len(message.splitlines()) == 1 and "permission denied for schema public" in message
        assert message.startswith("PostgreSQL ") and "cannot read or create the schema" in message
        done = await asyncio.to_thread(run_klaud, ["plan"], klaud_env(tmp_path, KLAUD_DB=limited))
    assert "Traceback" not in done.stderr, done.stderr[-800:]
    assert done.returncode == 1 and one_line(done.stderr).startswith("klaud: KLAUD_DB: ")
