"""One asyncio lock per key, kept only while someone holds it or waits for it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


class KeyedLocks(Generic[K]):
    """One lock per key, kept only while a section holds it or waits for it: a repository
    that leaves (uninstalled, renamed, handed over) leaves no lock behind. Counted, not
    pruned when let go: a lock its holder released may have a waiter about to take it."""

    def __init__(self) -> None:
        self._locks: dict[K, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    def held(self, key: K) -> bool:
        entry = self._locks.get(key)
        return entry is not None and entry[0].locked()

    @asynccontextmanager
    async def hold(self, key: K) -> AsyncIterator[None]:
        lock, takers = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, takers + 1)
        try:
            async with lock:
                yield
        finally:  # let go, or given up waiting (cancelled)
            lock, takers = self._locks[key]
            if takers == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, takers - 1)
