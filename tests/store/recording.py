"""A SQLite engine that remembers its transactions, for tests of what commits together."""

from __future__ import annotations

from collections.abc import Sequence

from bot.store.db import Database
from bot.store.engine import Result, Statement


class RecordingDatabase(Database):
    """SQLite that remembers the SQL of every transaction it committed."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.committed: list[list[str]] = []
        self.transactions: list[list[Statement]] = []  # the statements of each, as run
        self.refuse: str | None = None  # SQL text that makes a transaction fail

    async def transaction(self, statements: Sequence[Statement]) -> list[Result]:
        if self.refuse is not None and any(self.refuse in str(statement.args) for statement in statements):
            raise RuntimeError("refused")
        results = await super().transaction(statements)
        self.committed.append([statement.sql.split()[0] for statement in statements])
        self.transactions.append(list(statements))
        return results
