"""Numbered schema migrations, the same numbers for SQLite and PostgreSQL.

Each engine applies, at open and under a lock (SQLite `BEGIN EXCLUSIVE`, PostgreSQL
`pg_advisory_xact_lock`), every migration newer than the version stored in `schema_version`,
in one transaction with the version rows. A migration is never edited once released: a
change of schema is a new migration appended here.

Migration 1 is the schema Klaud used before versions existed. Its SQLite statements say
`IF NOT EXISTS`, so a file written by that code (tables `deliveries` and `records`, no
`schema_version`) is adopted as version 1 and upgraded, never recreated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from bot.store.engine import Dialect
from bot.store.errors import LEASE_TAKEN_SQLSTATE, SchemaTooNew, StoreError

log = structlog.get_logger("klaud.store")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sqlite: tuple[str, ...]
    postgresql: tuple[str, ...]
    # A query (both engines) of the records, as (repo, kind, key), that the migration could
    # not move and left where no code reads them: reported in one line after the upgrade.
    left: str = ""

    def statements(self, dialect: Dialect) -> tuple[str, ...]:
        return self.sqlite if dialect == "sqlite" else self.postgresql


SQLITE_DELIVERIES_V1 = """
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
)"""
SQLITE_RECORDS_V1 = """
CREATE TABLE IF NOT EXISTS records (
    repo TEXT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (repo, kind, key)
) WITHOUT ROWID"""

# A wave record's key that is a wave number: 1 to 18 ASCII digits (any 18 fit a BIGINT),
# the same keys on both engines.
SQLITE_WAVE_NUMBER = "length(key) BETWEEN 1 AND 18 AND key NOT GLOB '*[^0-9]*'"
POSTGRESQL_WAVE_NUMBER = "key ~ '^[0-9]{1,18}$'"

MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "deliveries and records",
        sqlite=(
            SQLITE_DELIVERIES_V1,
            "CREATE INDEX IF NOT EXISTS deliveries_open ON deliveries(status) WHERE status = 'queued'",
            SQLITE_RECORDS_V1,
        ),
        postgresql=(
            """
            CREATE TABLE deliveries (
                seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                id TEXT NOT NULL UNIQUE,
                event TEXT NOT NULL,
                action TEXT,
                repo TEXT,
                installation BIGINT,
                headers TEXT NOT NULL,
                body BYTEA NOT NULL,
                status TEXT NOT NULL DEFAULT 'queued',
                attempts INTEGER NOT NULL DEFAULT 0,
                error TEXT,
                received_at DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL
            )""",
            "CREATE INDEX deliveries_open ON deliveries(status) WHERE status = 'queued'",
            # `json` keeps the text exactly as written (like SQLite's TEXT) and refuses text
            # that is not JSON, so the JSON operators of the queries never fail on a record.
            """
            CREATE TABLE records (
                repo TEXT NOT NULL,
                kind TEXT NOT NULL,
                key TEXT NOT NULL,
                data JSON NOT NULL,
                PRIMARY KEY (repo, kind, key)
            )""",
        ),
    ),
    Migration(
        2,
        "leases and delivery claims",
        sqlite=(
            "CREATE TABLE leases (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at REAL NOT NULL)",
            "ALTER TABLE deliveries ADD COLUMN claimed_by TEXT",
            "ALTER TABLE deliveries ADD COLUMN claimed_at REAL",
            "CREATE INDEX deliveries_unfinished ON deliveries(seq) WHERE status IN ('queued', 'processing')",
        ),
        postgresql=(
            "CREATE TABLE leases (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_at DOUBLE PRECISION NOT NULL)",
            "ALTER TABLE deliveries ADD COLUMN claimed_by TEXT",
            "ALTER TABLE deliveries ADD COLUMN claimed_at DOUBLE PRECISION",
            "CREATE INDEX deliveries_unfinished ON deliveries(seq) WHERE status IN ('queued', 'processing')",
        ),
    ),
    # A delivery's status changes several times, its body never: in a row of their own, a
    # status update no longer rewrites ~25 KB (SQLite rewrites a whole row). `encoding` says
    # how the body is stored: NULL as received, 'zstd' (or before it 'zlib') compressed
    # (SQLite; PostgreSQL compresses large values itself).
    Migration(
        3,
        "delivery bodies apart from their status",
        sqlite=(
            "CREATE TABLE delivery_bodies (id TEXT PRIMARY KEY, encoding TEXT, body BLOB NOT NULL)",
            "INSERT INTO delivery_bodies (id, encoding, body) SELECT id, NULL, body FROM deliveries",
            "ALTER TABLE deliveries DROP COLUMN body",
        ),
        postgresql=(
            "CREATE TABLE delivery_bodies (id TEXT PRIMARY KEY, encoding TEXT, body BYTEA NOT NULL)",
            "INSERT INTO delivery_bodies (id, encoding, body) SELECT id, NULL, body FROM deliveries",
            "ALTER TABLE deliveries DROP COLUMN body",
        ),
    ),
    # A wave document holds one decision per family (~600 KB at 2,000 families) and is
    # written by every wave and read only by the API, the dashboard and the status page: in
    # a table of its own it is compressed like delivery bodies (~10x less to fsync), and the
    # start-up load of a repository's records no longer decodes a hundred of them.
    #
    # Klaud keys a wave record by its number ("00000003"); a key that is not one (edited by
    # hand: "latest") has no number to be read back by. PostgreSQL's `key::bigint` refused
    # it and stopped every start, SQLite's CAST read it as wave 0: both now move only keys
    # of digits that fit the column, and keep any other in `records` (reported by `left`).
    # Kept, not dropped: an upgrade does not delete what it cannot read, and no code reads
    # wave records there, so the operator can look at it and delete it.
    Migration(
        4,
        "wave documents in a table of their own",
        sqlite=(
            ("CREATE TABLE waves (repo TEXT NOT NULL, number INTEGER NOT NULL, encoding TEXT, body BLOB NOT NULL,"
            " PRIMARY KEY (repo, number))"),
            ("INSERT INTO waves (repo, number, encoding, body)"
            " SELECT repo, CAST(key AS INTEGER), NULL, CAST(data AS BLOB) FROM records"
            f" WHERE kind = 'wave' AND {SQLITE_WAVE_NUMBER}"),
            f"DELETE FROM records WHERE kind = 'wave' AND {SQLITE_WAVE_NUMBER}",
        ),
        postgresql=(
            ("CREATE TABLE waves (repo TEXT NOT NULL, number BIGINT NOT NULL, encoding TEXT, body BYTEA NOT NULL,"
            " PRIMARY KEY (repo, number))"),
            ("INSERT INTO waves (repo, number, encoding, body)"
            " SELECT repo, key::bigint, NULL, convert_to(data::text, 'UTF8') FROM records"
            f" WHERE kind = 'wave' AND {POSTGRESQL_WAVE_NUMBER}"),
            f"DELETE FROM records WHERE kind = 'wave' AND {POSTGRESQL_WAVE_NUMBER}",
        ),
        left="SELECT repo, kind, key FROM records WHERE kind = 'wave' ORDER BY repo, key",
    ),
    # PostgreSQL compresses a stored body with pglz by default, which costs more CPU than
    # the rest of a delivery's intake (~0.6 ms for a 20 KB webhook); lz4 is several times
    # faster for a similar size. A server built without lz4 keeps pglz. SQLite's bodies are
    # compressed by Klaud (zstd), so nothing changes there.
    Migration(
        5,
        "lz4 compression of stored bodies on PostgreSQL",
        sqlite=(),
        postgresql=(
            """DO $$ BEGIN
                ALTER TABLE delivery_bodies ALTER COLUMN body SET COMPRESSION lz4;
                ALTER TABLE waves ALTER COLUMN body SET COMPRESSION lz4;
            EXCEPTION WHEN feature_not_supported THEN
                RAISE NOTICE 'this server has no lz4: stored bodies stay compressed with pglz';
            END $$""",
        ),
    ),
    # Replicas: a replica that stalled past its lease may still be running deliveries its
    # repository's new owner has claimed since. Its commit of what they changed checks, in
    # the same transaction, that the claim is still its own (and locks the row, so a claim
    # cannot pass between the check and the commit); SQLite has one process and no replicas.
    Migration(
        6,
        "a commit fenced by its delivery's claim",
        sqlite=(),
        postgresql=(
            """CREATE FUNCTION klaud_claims_held(ids TEXT[], replica TEXT) RETURNS BOOLEAN
            LANGUAGE plpgsql AS $$
            DECLARE lost TEXT[];
            BEGIN
                PERFORM 1 FROM deliveries WHERE id = ANY(ids) AND claimed_by = replica FOR SHARE;
                SELECT array_agg(given) INTO lost FROM unnest(ids) AS given
                WHERE NOT EXISTS (SELECT 1 FROM deliveries WHERE id = given AND claimed_by = replica);
                IF lost IS NOT NULL THEN
                    RAISE EXCEPTION 'deliveries % are no longer claimed by %: their repository has another owner',
                        array_to_string(lost, ', '), replica;
                END IF;
                RETURN TRUE;
            END $$""",
        ),
    ),
    # Replicas: a write outside a delivery (a wave, the scheduler, a reconcile) by a replica
    # whose repository another replica has taken since (it stalled past its lease between
    # asking whether it owns it and committing) must not land. The check locks the lease
    # rows, so the lease cannot pass to another between the check and the commit; a
    # repository nobody holds (its lease expired and not taken yet, or never taken) is
    # anyone's to write, as the replica taking it next loads what is stored.
    Migration(
        7,
        "a write outside a delivery fenced by the repository's lease",
        sqlite=(),
        postgresql=(
            f"""CREATE FUNCTION klaud_leases_free(names TEXT[], replica TEXT) RETURNS BOOLEAN
            LANGUAGE plpgsql AS $$
            DECLARE taken TEXT[];
            BEGIN
                PERFORM 1 FROM leases WHERE name = ANY(names) FOR SHARE;
                SELECT array_agg(name || ' (' || owner || ')') INTO taken FROM leases
                WHERE name = ANY(names) AND owner <> replica
                    AND expires_at > extract(epoch from clock_timestamp())::double precision;
                IF taken IS NOT NULL THEN
                    RAISE EXCEPTION 'leases % are held by another replica', array_to_string(taken, ', ')
                        USING ERRCODE = '{LEASE_TAKEN_SQLSTATE}';
                END IF;
                RETURN TRUE;
            END $$""",
        ),
    ),
    # The deliveries given up on, newest first, are read when a process takes up a
    # repository (`DeliveryStore.given_up_since`); they are few among the done ones.
    Migration(
        8,
        "an index of failed deliveries",
        sqlite=("CREATE INDEX deliveries_failed ON deliveries(updated_at) WHERE status = 'failed'",),
        postgresql=("CREATE INDEX deliveries_failed ON deliveries(updated_at) WHERE status = 'failed'",),
    ),
)
LATEST = MIGRATIONS[-1].version

VERSION_TABLE: dict[Dialect, str] = {
    "sqlite": "CREATE TABLE IF NOT EXISTS schema_version"
    " (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)",
    "postgresql": "CREATE TABLE IF NOT EXISTS schema_version"
    " (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)",
}
CURRENT_VERSION = "SELECT coalesce(max(version), 0) FROM schema_version"
RECORD_VERSION = "INSERT INTO schema_version (version, name, applied_at) VALUES (?, ?, ?)"


def to_apply(current: int, where: str) -> tuple[Migration, ...]:
    """The migrations a store at version `current` needs, oldest first."""
    if current > LATEST:
        # An older Klaud must not write a schema it does not know (a rollback, or an old
        # replica restarting during a rolling upgrade).
        raise SchemaTooNew(f"{where} has schema version {current}; this Klaud knows versions up to {LATEST}")
    return tuple(m for m in MIGRATIONS if m.version > current)


def failed(migration: Migration, where: str, exc: Exception) -> StoreError:
    """The store's one-line error for a migration the engine refused (its transaction is
    rolled back: the store stays at the version it had)."""
    reason = " ".join(str(exc).split())  # an engine's message may span lines (DETAIL, HINT)
    return StoreError(f"{where}: migration {migration.version} ({migration.name}) failed:"
                      f" {type(exc).__name__}: {reason}")


# Records named in a report, at most: the count says how many there are.
LEFT_SHOWN = 10


def report_left(migration: Migration, where: str, rows: Sequence[Sequence[Any]]) -> None:
    """One warning line for the records `migration` left behind (none: no line)."""
    if not rows:
        return
    log.warning(
        "store.records_left", where=where, migration=migration.version, count=len(rows),
        records=[f"{repo or '-'} {kind} {key!r}" for repo, kind, key in rows[:LEFT_SHOWN]],
        reason=f"migration {migration.version} ({migration.name}) could not move them; kept in"
        " `records`, where Klaud does not read them",
    )
