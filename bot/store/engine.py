"""What the stores need of a database engine: SQLite (`db.Database`) or PostgreSQL
(`postgres.PostgresDatabase`).

The stores are written once, against this interface, so the record, delivery and lease
semantics cannot drift apart between the engines. Every statement is written in SQLite's
`?` parameter style; the PostgreSQL engine numbers the parameters (`$1`, `$2`, …).
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import zstandard

Dialect = Literal["sqlite", "postgresql"]
Row = Sequence[Any]
# A statement's result: the count of changed rows, the selected rows, or None after `many`.
Result = int | list[Row] | None


@dataclass(frozen=True, slots=True)
class Statement:
    sql: str
    args: Sequence[Any] = ()
    many: bool = False  # `args` is a list of parameter rows, one execution each
    rows: bool = False  # the result is the selected (or RETURNING) rows
    # Statements of one `Coalesce` in a transaction run as its few statements, at its end;
    # their result is None. Only for writes no other statement of the transaction reads.
    # `sql` with `args` stays the statement's meaning when it is run on its own.
    coalesce: Coalesce | None = None


class Coalesce(Protocol):
    def statements(self, dialect: Dialect, args: list[Sequence[Any]]) -> list[Statement]:
        """The statements doing what statements of `sql` with each of `args`, in order, would."""
        ...


def coalesced(dialect: Dialect, statements: Sequence[Statement]) -> tuple[list[Statement], list[int | None]]:
    """The statements to run for `statements`, and where each one's result is among theirs
    (None for a coalesced one)."""
    run: list[Statement] = []
    positions: list[int | None] = []
    gathered: dict[Coalesce, list[Sequence[Any]]] = {}
    for statement in statements:
        if statement.coalesce is None:
            positions.append(len(run))
            run.append(statement)
        else:
            positions.append(None)
            gathered.setdefault(statement.coalesce, []).append(statement.args)
    for kind, args in gathered.items():
        run.extend(kind.statements(dialect, args))
    return run, positions


@dataclass(frozen=True, slots=True)
class Compressed:
    """Bytes SQLite stores compressed (`compress`): compressed in the store's own thread
    (zstd releases the interpreter), not on the event loop: a wave's document (~600 KB at
    2,000 families) would hold the loop ~0.4 ms. New deliveries' bodies, all but the large
    ones, are compressed by the caller instead (`compressed_now`)."""

    data: bytes


ZSTD = "zstd"
ZLIB = "zlib"  # how bodies and waves were compressed before zstd; still read


class _ZstdContexts(threading.local):
    """The calling thread's zstd contexts, made once: python-zstandard's module functions
    make a new context at every call, which was half of the 38 µs a 24 KB body took to
    compress (18 µs with this one). A context serves one thread at a time."""

    def __init__(self) -> None:
        self.compressor = zstandard.ZstdCompressor(level=1)
        self.decompressor = zstandard.ZstdDecompressor()


_ZSTD_CONTEXTS = _ZstdContexts()


def zstd(data: bytes) -> bytes:
    """zstd at level 1: a 24 KB webhook body in ~18 µs to ~2.3 KB, where zlib's fastest
    level took ~64 µs for ~2.8 KB (and reads back in a third of zlib's time)."""
    return _ZSTD_CONTEXTS.compressor.compress(data)


def compress(value: Compressed) -> bytes:
    return zstd(value.data)


def stored_as(dialect: Dialect, data: bytes) -> tuple[str | None, bytes | Compressed]:
    """(encoding, value) for a large blob: SQLite's compressed in the store's thread as it is
    written, PostgreSQL compresses itself."""
    return (ZSTD, Compressed(data)) if dialect == "sqlite" else (None, data)


# The largest blob `compressed_now` compresses on the calling thread (the event loop): ~0.7 ms
# of zstd. GitHub sends bodies of up to 25 MB (~60 ms): those are left to the store's thread.
COMPRESS_NOW_LIMIT = 256 * 1024


def compressed_now(dialect: Dialect, data: bytes) -> tuple[str | None, bytes | Compressed]:
    """`stored_as`, compressed at once on the calling thread (zstd releases the interpreter
    while it works) unless it is larger than COMPRESS_NOW_LIMIT."""
    if dialect == "sqlite" and len(data) <= COMPRESS_NOW_LIMIT:
        return ZSTD, zstd(data)
    return stored_as(dialect, data)


def inflate(encoding: str | None, stored: bytes) -> bytes:
    """A blob as written before `stored_as`; ValueError when it cannot be read."""
    try:
        if encoding is None:
            return bytes(stored)
        if encoding == ZSTD:
            return _ZSTD_CONTEXTS.decompressor.decompress(stored)
        if encoding == ZLIB:
            return zlib.decompress(stored)
    except (zstandard.ZstdError, zlib.error) as exc:
        raise ValueError(f"a {encoding} blob that does not decompress: {exc}") from exc
    raise ValueError(f"unknown encoding {encoding!r}")


class Engine(Protocol):
    dialect: Dialect
    # The database's clock as epoch seconds, in SQL: leases and claims compare times written
    # by several replicas, whose own clocks may disagree.
    now_sql: str

    @property
    def is_open(self) -> bool: ...

    async def open(self) -> None: ...

    async def fetch(self, sql: str, *args: Any) -> list[Row]: ...

    async def transaction(self, statements: Sequence[Statement]) -> list[Result]:
        """Run `statements` in one transaction: all commit, or none (the error is raised)."""
        ...

    async def close(self) -> None: ...

    def free_bytes(self) -> int | None:
        """Free space where the store writes; None when Klaud cannot see it (a server's disk)."""
        ...


def as_count(result: Result) -> int:
    """The count of changed rows of a statement run without `many` or `rows`."""
    if not isinstance(result, int):
        raise TypeError(f"expected a row count, got {type(result).__name__}")
    return result


def as_rows(result: Result) -> list[Row]:
    """The rows of a statement run with `rows=True`."""
    if not isinstance(result, list):
        raise TypeError(f"expected rows, got {type(result).__name__}")
    return result
