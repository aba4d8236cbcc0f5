"""The durable delivery inbox's storage: one row per webhook delivery, on either engine.

A delivery is committed before GitHub gets its 202, because GitHub does not redeliver on
its own. Its writes go through the store's one `Writer` (group commit, shared with the state
records), so a burst of deliveries costs one fsync per batch, and a delivery's new status
commits in the transaction of the state it changed.

With several replicas on one PostgreSQL database, any replica stores a delivery and the
replica holding the lease of its repository takes it with `claim_owned`: the delivery
becomes `processing` with its owner and the time of the claim; the next owner of the
repository takes over the claims of one that died or lost the lease.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import structlog

from bot.store.engine import (
    Dialect,
    Engine,
    Result,
    Row,
    Statement,
    as_count,
    as_rows,
    compressed_now,
    inflate,
)
from bot.store.leases import lease_fence
from bot.store.writer import Writer

log = structlog.get_logger("klaud.store")

# Headers worth keeping for processing and audits; the signature is not among them.
KEPT_HEADERS = (
    "X-GitHub-Event",
    "X-GitHub-Delivery",
    "X-GitHub-Hook-ID",
    "X-GitHub-Hook-Installation-Target-Type",
    "X-GitHub-Hook-Installation-Target-ID",
    "User-Agent",
)


def _readable_body(delivery_id: str, encoding: str | None, stored: bytes) -> bytes | None:
    """A stored body, or None (reported in one line) when it does not decompress: the
    delivery then fails on its empty body, where a raise would hold its batch for ever."""
    try:
        return inflate(encoding, stored)
    except ValueError as exc:
        log.warning("store.record_unreadable", kind="delivery-body", key=delivery_id, reason=str(exc))
        return None


INSTALLATION_QUEUE = "installation:"  # the ordering key's prefix of deliveries without a repository


def repo_queue(repo: str) -> str:
    """The ordering key of a repository's deliveries (one queue, processed in order)."""
    return f"repo:{repo.lower()}"


@dataclass(slots=True)
class Delivery:
    id: str
    event: str
    # None while the delivery waits in a long queue: the inbox keeps a bounded number of
    # bodies in memory and reads the others from the store when their turn comes.
    body: bytes | None
    action: str | None = None
    repo: str | None = None
    installation: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    status: str = "queued"
    attempts: int = 0
    error: str | None = None

    @property
    def ordering_key(self) -> str:
        # Deliveries without a repository (installation events) are ordered per installation.
        if self.repo:
            return repo_queue(self.repo)
        return f"{INSTALLATION_QUEUE}{self.installation}"

    def status_document(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "event": self.event,
            "action": self.action,
            "status": self.status,
            "attempts": self.attempts,
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class Progress:
    status: str
    attempts: int
    claimed_by: str | None  # the replica whose claim it is (None: one process, no claims)


# A delivery's columns; the body (position 6) lives in `delivery_bodies` and is read on its
# own, so these queries leave it NULL: a long backlog must not be read into memory at once.
COLUMNS = "id, event, action, repo, installation, headers, NULL, status, attempts, error"
# New deliveries are written by a few statements per burst (`NewDeliveries`), their rows in
# arrival order (so `seq` keeps it). SQLite: the rows as one VALUES list (one execution, not
# one per row: each execution gives the interpreter up), then the bodies likewise.
DELIVERY_COLUMNS = "id, event, action, repo, installation, headers, received_at, updated_at"
# Returns the ids it stored: one statement, where asking first which ids are stored took two
# (the two measured alike, acknowledgements a second over six interleaved rounds).
SQLITE_INSERT = f"INSERT INTO deliveries ({DELIVERY_COLUMNS}) VALUES {{rows}} ON CONFLICT (id) DO NOTHING RETURNING id"
SQLITE_INSERT_BODIES = "INSERT INTO delivery_bodies (id, encoding, body) VALUES {rows} ON CONFLICT (id) DO NOTHING"
# PostgreSQL: one statement of fixed text over arrays (one round trip, one prepared
# statement whatever the burst's size), which returns the ids it stored.
POSTGRESQL_INSERT = f"""
    WITH given AS (
        SELECT * FROM unnest(?::text[], ?::text[], ?::text[], ?::text[], ?::bigint[], ?::text[],
                             ?::float8[], ?::float8[], ?::text[], ?::bytea[])
            WITH ORDINALITY AS given({DELIVERY_COLUMNS}, encoding, body, position)
    ), stored AS (
        INSERT INTO deliveries ({DELIVERY_COLUMNS})
        SELECT {DELIVERY_COLUMNS} FROM given ORDER BY position
        ON CONFLICT (id) DO NOTHING
        RETURNING id
    ), bodies AS (
        INSERT INTO delivery_bodies (id, encoding, body)
        SELECT DISTINCT ON (given.id) given.id, given.encoding, given.body
        FROM given JOIN stored ON stored.id = given.id ORDER BY given.id, given.position
        ON CONFLICT (id) DO NOTHING
    )
    SELECT id FROM stored"""
SELECT_ONE = (
    "SELECT d.id, d.event, d.action, d.repo, d.installation, d.headers, b.body, d.status, d.attempts, d.error,"
    " b.encoding FROM deliveries d LEFT JOIN delivery_bodies b ON b.id = d.id WHERE d.id = ?"
)
SELECT_PENDING = f"SELECT {COLUMNS} FROM deliveries WHERE status = 'queued' ORDER BY seq"
SELECT_BODIES = "SELECT id, encoding, body FROM delivery_bodies WHERE {ids}"
SELECT_PROGRESS = "SELECT id, status, attempts, claimed_by FROM deliveries WHERE {ids}"
UPDATE_STATUS = "UPDATE deliveries SET status = ?, attempts = ?, error = ?, updated_at = ? WHERE id = ?"
# The statuses a transaction writes, as one statement (`StatusUpdates`). SQLite names the
# columns of a VALUES list column1, column2, ...
SQLITE_UPDATE_STATUSES = (
    "UPDATE deliveries SET status = given.column1, attempts = given.column2, error = given.column3,"
    " updated_at = given.column4 FROM (VALUES {rows}) AS given WHERE deliveries.id = given.column5"
)
POSTGRESQL_UPDATE_STATUSES = (
    "UPDATE deliveries SET status = given.status, attempts = given.attempts, error = given.error,"
    " updated_at = given.updated_at"
    " FROM unnest(?::text[], ?::integer[], ?::text[], ?::float8[], ?::text[])"
    " AS given(status, attempts, error, updated_at, id) WHERE deliveries.id = given.id"
)
# The claim stays the mover's: a queued delivery is anyone's to claim, and the claim fence
# of the transaction that moves it checks that it is still the mover's.
MOVE = "UPDATE deliveries SET repo = ?, status = 'queued', attempts = ?, error = ?, updated_at = ? WHERE id = ?"
PRUNABLE = "(status = 'done' AND updated_at < ?) OR (status = 'failed' AND updated_at < ?)"
PRUNE_BODIES = f"DELETE FROM delivery_bodies WHERE id IN (SELECT id FROM deliveries WHERE {PRUNABLE})"
PRUNE = f"DELETE FROM deliveries WHERE {PRUNABLE}"
# The claim of a repository's owner (it holds the repository's lease, so it is the only one
# allowed to work on it): the unfinished deliveries of its repositories but its own claims it
# keeps in memory (`kept`: queued there, or running), whoever claimed them: another process's (a
# replica that died or lost the lease) and its own that it does not keep (claimed before it
# let the repository go, a claim whose answer was lost, one that came back after its lease
# clock lapsed, a queue dropped while a claim ran). Passing over its own claims for a while
# instead, as kept, let the repository's later deliveries go first. Its parameters: the
# owner, the ids kept, whether to take deliveries without a repository, a JSON array of
# lowercase repository names, the limit.
# On PostgreSQL, SKIP LOCKED passes over a row another transaction holds (the last owner's
# claim or commit still in flight): `held_back` keeps the repository's later deliveries out of
# this claim, or they would run before the one passed over. Rows not picked for another
# reason are kept here (their order is the queue's) or past the LIMIT. A delivery kept here
# whose claim was reset (its repository taken up again) is claimed again, not run twice.
# Names are ordering keys (`Delivery.ordering_key`): a repository's, or for deliveries of no
# repository their installation's (matched by repository alone, one passed over never held
# back the later events of its installation).
# `held_back` matches repositories against picked's distinct names: PostgreSQL plans the
# statement once for a table it believes nearly empty (a new store, before autovacuum's first
# ANALYZE) and joins in a nested loop, which compared every unfinished row with every picked
# row, ~130,000 comparisons and 35-60 ms a claim for three replicas under bench/ingest.py's
# load; with one name per repository it is ~2,000 comparisons, ~6 ms.
CLAIM_OWNED: dict[Dialect, str] = {
    "sqlite": """
        WITH picked AS (
            SELECT seq FROM deliveries
            WHERE status IN ('queued', 'processing') AND NOT (claimed_by IS ? AND id IN (SELECT value FROM json_each(?)))
              AND ((repo IS NULL AND ?) OR lower(repo) IN (SELECT value FROM json_each(?)))
            ORDER BY seq LIMIT ?
        )
        UPDATE deliveries SET status = 'processing', claimed_by = ?, claimed_at = {now}
        WHERE seq IN (SELECT seq FROM picked)
        RETURNING {columns}, seq""",
    "postgresql": """
        WITH picked AS MATERIALIZED (
            SELECT seq, coalesce(lower(repo), 'installation:' || installation) AS name FROM deliveries
            WHERE status IN ('queued', 'processing') AND NOT (claimed_by IS NOT DISTINCT FROM $1 AND id = ANY($2::text[]))
              AND ((repo IS NULL AND $3::boolean) OR lower(repo) IN (SELECT json_array_elements_text($4::json)))
            ORDER BY seq LIMIT $5
            FOR UPDATE SKIP LOCKED
        ), held_back AS (
            SELECT coalesce(lower(repo), 'installation:' || installation) AS name, min(seq) AS seq FROM deliveries
            WHERE status IN ('queued', 'processing') AND seq < (SELECT max(seq) FROM picked)
              AND (lower(repo) IN (SELECT DISTINCT name FROM picked)
                   OR (repo IS NULL AND 'installation:' || installation IN (SELECT DISTINCT name FROM picked)))
              AND seq NOT IN (SELECT seq FROM picked)
              AND NOT (claimed_by IS NOT DISTINCT FROM $1 AND id = ANY($2::text[]))
            GROUP BY 1
        )
        UPDATE deliveries SET status = 'processing', claimed_by = $1, claimed_at = {now}
        WHERE seq IN (SELECT picked.seq FROM picked LEFT JOIN held_back ON held_back.name = picked.name
                      WHERE held_back.seq IS NULL OR picked.seq < held_back.seq)
        RETURNING {columns}, seq""",
}
UNCLAIM = (
    "UPDATE deliveries SET status = 'queued', claimed_by = NULL"
    " WHERE lower(repo) = ? AND status = 'processing'"
)
WAITING_REPOS = "SELECT DISTINCT repo FROM deliveries WHERE status IN ('queued', 'processing') AND repo IS NOT NULL"
GIVEN_UP_WITHIN = (
    "SELECT repo, max(updated_at) FROM deliveries"
    " WHERE status = 'failed' AND updated_at > ? AND repo IS NOT NULL GROUP BY repo"
)
COUNT_UNFINISHED = "SELECT count(*) FROM deliveries WHERE status IN ('queued', 'processing')"


def ids_among(dialect: Dialect, delivery_ids: list[str]) -> tuple[str, tuple[Any, ...]]:
    """(condition, arguments) matching rows whose id is one of `delivery_ids`.

    PostgreSQL's is one statement text for any number of ids: asyncpg prepares each distinct
    text on the server, one round trip more, and keeps 100 per connection, so an IN list of
    every length would be prepared at almost every read and crowd out the hot statements.
    SQLite prepares in-process in microseconds: an IN list of `?`."""
    if dialect == "postgresql":
        return "id = ANY(?::text[])", (delivery_ids,)
    return f"id IN ({', '.join('?' * len(delivery_ids))})", tuple(delivery_ids)


class DeliveryStore:
    def __init__(self, db: Engine, writer: Writer | None = None) -> None:
        self.db = db
        self.writer = writer or Writer(db)
        # PostgreSQL: new deliveries have a writer of their own, so their burst commits on its
        # own connection while the state's writes commit on another (a new delivery's rows
        # conflict with no other write). Two such writers were measured slower than one once
        # a burst became one statement: each commit made smaller bursts. SQLite has one
        # connection: its puts share the one writer.
        self._intake = Writer(db) if db.dialect == "postgresql" else self.writer
        self._claim_owned = CLAIM_OWNED[db.dialect].format(now=db.now_sql, columns=COLUMNS)
        self._new = NewDeliveries(db.dialect)

    @property
    def is_open(self) -> bool:
        return self.db.is_open

    async def open(self) -> None:
        await self.db.open()

    async def put(self, delivery: Delivery) -> bool:
        """Commit `delivery`; False when its id is already stored (a redelivery)."""
        return await self.put_soon(delivery)

    def put_soon(self, delivery: Delivery) -> asyncio.Future[bool]:
        """`put`, as the future of its commit: the write goes on whoever stops waiting."""
        if delivery.body is None:
            raise ValueError(f"delivery {delivery.id} has no body to store")
        now = time.time()
        row = (
            delivery.id,
            delivery.event,
            delivery.action,
            delivery.repo,
            delivery.installation,
            msgspec.json.encode(delivery.headers).decode(),
            now,
            now,
        )
        # SQLite's bodies are compressed (~9x for a webhook) here, as each delivery arrives
        # (all but the rare large ones, `compressed_now`), rather than in the store's thread:
        # a burst's commits queue for that one thread, so their compression (~0.3 ms a burst)
        # made every delivery's wait longer, while the event loop ran only ~45 % of a burst
        # (zstd releases the interpreter). bench/ingest.py's load, 20 interleaved rounds
        # against compressing in the thread: +3 % acknowledged a second (geometric mean of
        # the paired rounds). PostgreSQL compresses large values itself.
        return self._intake.enqueue_item(self._new, (row, compressed_now(self.db.dialect, delivery.body)))

    async def get(self, delivery_id: str) -> Delivery | None:
        rows = await self.db.fetch(SELECT_ONE, delivery_id)
        if not rows:
            return None
        delivery = _row_to_delivery(rows[0])
        if rows[0][6] is not None:  # absent only if deleted behind Klaud's back
            delivery.body = _readable_body(delivery_id, rows[0][10], rows[0][6])
        return delivery

    async def prune(self, *, done_before: float, failed_before: float) -> int:
        """Delete finished deliveries last updated before the given epoch times.

        GitHub redelivers on request for a few days only, so duplicate detection needs
        no older ids; failed deliveries are kept longer for people to inspect.
        """
        before = (done_before, failed_before)
        [_, count] = await self.writer.write([Statement(PRUNE_BODIES, before), Statement(PRUNE, before)])
        return as_count(count)

    async def pending(self) -> list[Delivery]:
        """Every delivery acknowledged but not finished (nor claimed), in arrival order,
        without its body (`body` reads it)."""
        return [_row_to_delivery(row) for row in await self.db.fetch(SELECT_PENDING)]

    async def bodies(self, delivery_ids: list[str]) -> dict[str, bytes]:
        """The bodies of the deliveries still stored, by id (one query for a batch)."""
        ids, args = ids_among(self.db.dialect, delivery_ids)
        rows = await self.db.fetch(SELECT_BODIES.format(ids=ids), *args)
        bodies = {row[0]: _readable_body(row[0], row[1], row[2]) for row in rows}
        return {delivery_id: body for delivery_id, body in bodies.items() if body is not None}

    async def progress(self, delivery_ids: list[str]) -> dict[str, Progress]:
        """What the store says of each delivery's processing: after a commit whose answer
        was lost, whether it landed; after a claim fence failed, who holds the delivery."""
        ids, args = ids_among(self.db.dialect, delivery_ids)
        rows = await self.db.fetch(SELECT_PROGRESS.format(ids=ids), *args)
        return {row[0]: Progress(row[1], row[2], row[3]) for row in rows}

    async def claim_owned(
        self, owner: str, repos: set[str], *, unrouted: bool, limit: int, kept: Collection[str] = ()
    ) -> list[Delivery]:
        """The claim of the owner of `repos` (and, with `unrouted`, of deliveries without a
        repository): up to `limit` of their unfinished deliveries but those `kept` (in the
        owner's memory), oldest first, now `processing` for `owner`."""
        if not repos and not unrouted:
            return []
        wanted = msgspec.json.encode(sorted(repo.lower() for repo in repos)).decode()
        if self.db.dialect == "sqlite":  # its `?` are positional; PostgreSQL's $1 is used twice
            args: tuple[Any, ...] = (owner, msgspec.json.encode(sorted(kept)).decode(), unrouted, wanted, limit, owner)
        else:
            args = (owner, sorted(kept), unrouted, wanted, limit)
        results = await self.db.transaction([Statement(self._claim_owned, args, rows=True)])
        rows = sorted(as_rows(results[0]), key=lambda row: row[-1])
        return [_row_to_delivery(row) for row in rows]

    def claim_fence(self, delivery_id: str, owner: str) -> Statement | None:
        """A statement that fails its transaction unless `owner` still holds the claim of
        `delivery_id` (PostgreSQL's replicas; None on SQLite, where one process works).
        The fences of a transaction are one statement (`ClaimFences`)."""
        if self.db.dialect != "postgresql":
            return None
        # Run alone (outside the writer) it is the same check for the one delivery.
        return Statement(CLAIMS_HELD, ([delivery_id], owner), rows=True, coalesce=CLAIM_FENCES)

    async def unclaim(self, repo: str, owner: str | None = None) -> int:
        """Put every unfinished claim of `repo` back in the queue (its new owner takes it up).

        `owner`: only while no other replica holds its lease (`LeaseTaken` else). A replica
        that stalled past its lease and resumed here would reset the claims of the one that
        took the repository meanwhile, whose commits its claim fence then refused."""
        statements = [Statement(UNCLAIM, (repo.lower(),))]
        if owner is not None:
            statements.append(lease_fence([repo.lower()], owner))
        count, *_ = await self.writer.write(statements)
        return as_count(count)

    async def unfinished(self) -> int:
        """How many deliveries, every replica's, are not done yet."""
        [(count,)] = await self.db.fetch(COUNT_UNFINISHED)
        return int(count)

    async def waiting_repos(self) -> set[str]:
        """Repositories (lowercase) with deliveries not yet done."""
        return {row[0].lower() for row in await self.db.fetch(WAITING_REPOS)}

    async def given_up_within(self, seconds: float) -> dict[str, float]:
        """Repositories (lowercase) with deliveries that failed for good in the last `seconds`:
        how many seconds ago the last of them failed. Ages, not times: the store's times are
        the wall clock's, which a sandbox's Klaud clock is not."""
        now = time.time()
        ages: dict[str, float] = {}
        for repo, at in await self.db.fetch(GIVEN_UP_WITHIN, now - seconds):
            ages[repo.lower()] = min(max(0.0, now - at), ages.get(repo.lower(), seconds))
        return ages

    async def flushed(self) -> None:
        """Wait for the writes already asked for."""
        for writer in {self.writer, self._intake}:
            await writer.flushed()


NewDelivery = tuple[tuple[Any, ...], tuple[str | None, Any]]  # (row, (encoding, body))


@dataclass(frozen=True)
class NewDeliveries:
    """The `Merge` kind of new deliveries: each one's answer says whether it was stored
    (False: its id was stored already, or earlier in the same burst: a redelivery)."""

    dialect: Dialect
    limit: int = 256  # SQLite: 8 parameters a row, far below its 32,766

    def statements(self, items: Sequence[NewDelivery]) -> list[Statement]:
        if self.dialect == "postgresql":
            return [Statement(POSTGRESQL_INSERT, _columns([row + body for row, body in items]), rows=True)]
        return [
            _values_statement(SQLITE_INSERT, [row for row, _ in items], returning=True),
            _values_statement(SQLITE_INSERT_BODIES, [(row[0], *body) for row, body in items]),
        ]

    def answers(self, items: Sequence[NewDelivery], results: list[Result]) -> list[bool]:
        stored = {row[0] for row in as_rows(results[0])}  # the ids the first statement stored
        answers = []
        for row, _ in items:
            answers.append(row[0] in stored)
            stored.discard(row[0])  # a second delivery of the same id in the burst is a redelivery
        return answers


@dataclass(frozen=True)
class StatusUpdates:
    """The `Coalesce` of status writes: a transaction holding the statuses of a batch of
    deliveries writes them all with one statement (one round trip to PostgreSQL; one wait
    for the interpreter in SQLite's thread) instead of one UPDATE each."""

    rows_per_statement: int = 1000  # SQLite: 5 parameters a row, below its 32,766

    def statements(self, dialect: Dialect, args: list[Sequence[Any]]) -> list[Statement]:
        # The last status of a delivery wins, as it would written one after the other.
        latest = list({row[4]: row for row in args}.values())
        chunks = [latest[start : start + self.rows_per_statement] for start in range(0, len(latest), self.rows_per_statement)]
        if dialect == "postgresql":
            return [Statement(POSTGRESQL_UPDATE_STATUSES, _columns(chunk)) for chunk in chunks]
        return [_values_statement(SQLITE_UPDATE_STATUSES, chunk) for chunk in chunks]


STATUS_UPDATES = StatusUpdates()
CLAIMS_HELD = "SELECT klaud_claims_held(?::text[], ?)"  # migration 6


@dataclass(frozen=True)
class ClaimFences:
    """The `Coalesce` of claim fences (PostgreSQL): one check, and one round trip, for the
    deliveries of a transaction, per replica (a process has one)."""

    def statements(self, dialect: Dialect, args: list[Sequence[Any]]) -> list[Statement]:
        by_owner: dict[str, list[str]] = {}
        for ids, owner in args:
            by_owner.setdefault(owner, []).extend(ids)
        return [Statement(CLAIMS_HELD, (ids, owner), rows=True) for owner, ids in by_owner.items()]


CLAIM_FENCES = ClaimFences()


def _columns(rows: Sequence[Sequence[Any]]) -> list[list[Any]]:
    """Rows as one list per column: the arrays PostgreSQL's unnest(...) takes."""
    return [list(column) for column in zip(*rows, strict=True)]


def _values_statement(sql: str, rows: Sequence[Sequence[Any]], *, returning: bool = False) -> Statement:
    """`sql` with its `{rows}` as a VALUES list of `rows` (SQLite), their values in order."""
    marks = "(" + ", ".join("?" * len(rows[0])) + ")"
    values = [value for row in rows for value in row]
    return Statement(sql.format(rows=", ".join([marks] * len(rows))), values, rows=returning)


def moved_statement(delivery_id: str, repo: str, attempts: int, error: str) -> Statement:
    """Hand an unfinished delivery on to `repo` (its repository's new name): queued again,
    for whichever process owns that name to claim."""
    return Statement(MOVE, (repo, attempts, error, time.time(), delivery_id))


def status_statement(delivery_id: str, status: str, attempts: int, error: str | None) -> Statement:
    """The write that records a delivery's status (`Writer.end_unit` commits it with its changes)."""
    # PostgreSQL refuses U+0000 in text, SQLite keeps it: dropped on both alike.
    text = error.replace("\x00", "") if error is not None else None
    return Statement(UPDATE_STATUS, (status, attempts, text, time.time(), delivery_id), coalesce=STATUS_UPDATES)


def _readable_headers(delivery_id: str, stored: str | bytes) -> dict[str, str]:
    """A delivery's stored headers, or none (reported in one line) when they are unreadable:
    a raise stopped the server at start-up, when it loads the deliveries still queued."""
    try:
        headers = msgspec.json.decode(stored)
    except msgspec.DecodeError as exc:
        log.warning("store.record_unreadable", kind="delivery-headers", key=delivery_id, reason=str(exc))
        return {}
    return headers if isinstance(headers, dict) else {}


def _row_to_delivery(row: Row) -> Delivery:
    return Delivery(
        id=row[0],
        event=row[1],
        action=row[2],
        repo=row[3],
        installation=row[4],
        headers=_readable_headers(row[0], row[5]),
        body=None,
        status=row[7],
        attempts=row[8],
        error=row[9],
    )
