"""Fixtures of the stack tests that run replicas on PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.conftest import fresh_database
from tests.store.postgres_server import PostgresServer


@pytest.fixture
async def store_url(postgres_server: PostgresServer) -> AsyncIterator[str]:
    """A fresh database on the session's PostgreSQL server (skipped loudly without one)."""
    async with fresh_database(postgres_server) as url:
        yield url
