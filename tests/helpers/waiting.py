"""Waiting in tests for something the event loop brings about, without a clock to advance."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Return once `condition()` holds; an AssertionError if it has not after `seconds`."""
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not reached in {seconds} s")
