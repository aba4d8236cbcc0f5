"""Coalescing a burst of marks into one flush per key (bot/services/coalescer.py)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from structlog.testing import capture_logs

from bot.services.coalescer import Coalescer

# ------------------------------------------------------------------------- coalescer

DELAY = 0.05


class Recorder:
    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.flushed = asyncio.Event()

    async def __call__(self, key: str) -> None:
        self.calls[key] += 1
        self.flushed.set()


async def test_burst_of_marks_flushes_once() -> None:
    recorder = Recorder()
    coalescer: Coalescer[str] = Coalescer(recorder, DELAY)
    for _ in range(50):
        coalescer.mark("pr-1")
    await asyncio.wait_for(recorder.flushed.wait(), 5)
    await coalescer.close()
    assert recorder.calls == {"pr-1": 1}


async def test_marks_during_a_flush_cause_exactly_one_more() -> None:
    gate = asyncio.Event()
    started = asyncio.Event()
    calls: list[str] = []

    async def slow_flush(key: str) -> None:
        calls.append(key)
        started.set()
        await gate.wait()

    coalescer: Coalescer[str] = Coalescer(slow_flush, DELAY)
    coalescer.mark("pr-1")
    await asyncio.wait_for(started.wait(), 5)
    for _ in range(10):
        coalescer.mark("pr-1")
    gate.set()
    await coalescer.close()
    assert calls == ["pr-1", "pr-1"]


async def test_distinct_keys_flush_separately() -> None:
    recorder = Recorder()
    coalescer: Coalescer[str] = Coalescer(recorder, DELAY)
    for key in ["a", "b", "a", "c", "b"]:
        coalescer.mark(key)
    await coalescer.close()
    assert recorder.calls == {"a": 1, "b": 1, "c": 1}


async def test_close_flushes_pending_without_waiting_for_the_window() -> None:
    recorder = Recorder()
    coalescer: Coalescer[str] = Coalescer(recorder, delay_seconds=3600)
    coalescer.mark("pr-1")
    await asyncio.wait_for(coalescer.close(), 5)
    assert recorder.calls == {"pr-1": 1}
    assert coalescer.pending == frozenset()
    with pytest.raises(RuntimeError):
        coalescer.mark("pr-2")


async def test_settle_flushes_and_stays_open() -> None:
    recorder = Recorder()
    coalescer: Coalescer[str] = Coalescer(recorder, delay_seconds=3600)
    coalescer.mark("pr-1")
    await asyncio.wait_for(coalescer.settle(), 5)
    assert recorder.calls == {"pr-1": 1}
    coalescer.mark("pr-1")
    assert coalescer.pending == {"pr-1"}  # a new window started, not an immediate flush
    await coalescer.close()
    assert recorder.calls == {"pr-1": 2}


async def test_a_later_burst_flushes_again() -> None:
    recorder = Recorder()
    coalescer: Coalescer[str] = Coalescer(recorder, DELAY)
    coalescer.mark("pr-1")
    await asyncio.wait_for(recorder.flushed.wait(), 5)
    await coalescer.settle()
    coalescer.mark("pr-1")
    await coalescer.close()
    assert recorder.calls == {"pr-1": 2}


async def test_declared_errors_are_logged_and_the_key_stays_usable() -> None:
    calls: list[str] = []

    async def failing(key: str) -> None:
        calls.append(key)
        if len(calls) == 1:
            raise ConnectionError("github unreachable")

    coalescer: Coalescer[str] = Coalescer(failing, DELAY, errors=(ConnectionError,))
    with capture_logs() as logs:
        coalescer.mark("pr-9")
        await coalescer.settle()
    assert [(e["event"], e["key"]) for e in logs] == [("check_flush_failed", "pr-9")]
    assert "github unreachable" in logs[0]["error"]
    coalescer.mark("pr-9")
    await coalescer.close()
    assert calls == ["pr-9", "pr-9"]


async def test_undeclared_errors_end_the_task_are_logged_at_once_and_leave_the_coalescer() -> None:
    calls: list[str] = []

    async def buggy(key: str) -> None:
        calls.append(key)
        if len(calls) == 1:
            raise KeyError("bug")

    coalescer: Coalescer[str] = Coalescer(buggy, DELAY, errors=(ConnectionError,))
    with capture_logs() as logs:
        coalescer.mark("pr-1")
        [task] = [t for t in asyncio.all_tasks() if t.get_name() == "check-flush:pr-1"]
        await coalescer.settle()
    assert isinstance(task.exception(), KeyError)
    # Not taken for a declared failure; reported now, not when the task is collected.
    assert [(e["event"], e["task"], e["log_level"]) for e in logs] == [("flush_crashed", "check-flush:pr-1", "error")]
    coalescer.mark("pr-1")
    await coalescer.close()
    assert calls == ["pr-1", "pr-1"]


async def test_settle_also_waits_for_keys_marked_by_a_flush_it_ran() -> None:
    # What this catches: settle()/close() returning while a key marked during the settle (here by another key's flush) is still unflushed, so shutdown drops it.
    calls: Counter[str] = Counter()
    coalescer: Coalescer[str]

    async def flush(key: str) -> None:
        if key == "dashboard":
            coalescer.mark("check-run")
        else:
            for _ in range(5):
                await asyncio.sleep(0)  # a PATCH in flight
        calls[key] += 1

    coalescer = Coalescer(flush, delay_seconds=3600)
    coalescer.mark("dashboard")
    await asyncio.wait_for(coalescer.settle(), 5)
    assert calls == {"dashboard": 1, "check-run": 1}
    assert coalescer.pending == frozenset()
    await coalescer.close()


async def test_after_a_settle_marks_coalesce_again() -> None:
    # What this catches: a settle leaving the coalescer in "hurry" mode, so every later mark flushes at once and bursts are no longer coalesced (one PATCH per change).
    calls: Counter[str] = Counter()

    async def flush(key: str) -> None:
        calls[key] += 1

    coalescer: Coalescer[str] = Coalescer(flush, delay_seconds=3600)
    coalescer.mark("pr-1")
    await coalescer.settle()
    coalescer.mark("pr-1")
    for _ in range(5):
        await asyncio.sleep(0)  # let a task that wrongly skips its window run its flush
    coalescer.mark("pr-1")
    for _ in range(5):
        await asyncio.sleep(0)
    assert calls == {"pr-1": 1}
    await asyncio.wait_for(coalescer.close(), 5)
    assert calls == {"pr-1": 2}


async def test_a_second_burst_after_a_flush_is_flushed_once() -> None:
    # What this catches: a key left marked "running" after its flush, so every later burst of it is flushed twice (and the set of running keys grows for good).
    calls: Counter[str] = Counter()

    async def flush(key: str) -> None:
        calls[key] += 1

    coalescer: Coalescer[str] = Coalescer(flush, delay_seconds=3600)
    coalescer.mark("pr-1")
    await coalescer.settle()
    coalescer.mark("pr-1")
    coalescer.mark("pr-1")
    await coalescer.close()
    assert calls == {"pr-1": 2}


async def test_a_crashed_flush_leaves_no_pending_extra_flush_behind() -> None:
    # What this catches: a "flush again" request left over from a flush that crashed, causing a spurious extra flush on the key's next burst.
    calls: list[str] = []
    coalescer: Coalescer[str]

    async def buggy(key: str) -> None:
        calls.append(key)
        if len(calls) == 1:
            coalescer.mark(key)  # a change arrives while this flush runs
            raise KeyError("bug")

    coalescer = Coalescer(buggy, delay_seconds=3600, errors=(ConnectionError,))
    coalescer.mark("pr-1")
    await coalescer.settle()
    assert calls == ["pr-1"]
    coalescer.mark("pr-1")
    await coalescer.close()
    assert calls == ["pr-1", "pr-1"]


async def test_close_cancels_flushes_still_running_after_its_grace() -> None:
    # What this catches: a SIGTERM'd Klaud waited ~3 minutes for a check-run flush retrying
    # a slow GitHub (5 tries of 30 s), past any container's stop grace.
    started = asyncio.Event()

    async def slow(key: str) -> None:
        started.set()
        await asyncio.sleep(3600)

    coalescer: Coalescer[str] = Coalescer(slow, delay_seconds=0)
    coalescer.mark("pr-1")
    await asyncio.wait_for(started.wait(), 5)
    with capture_logs() as logs:
        await asyncio.wait_for(coalescer.close(grace=0.05), 5)
    assert coalescer.pending == frozenset()
    assert [entry["event"] for entry in logs] == ["coalescer.flushes_cancelled"]
