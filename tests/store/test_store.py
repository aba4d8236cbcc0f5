"""The state store: records round-trip through SQLite, changes apply atomically."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta

import pytest

from bot.core.domain import Attempt, Family, FileChange, PullRequest, stamp
from bot.store.db import Database
from bot.store.records import Change, StateStore

NOW = datetime(2026, 11, 30, 8, tzinfo=UTC)
CANDIDATE = "d92e15065c55779d-555679de269db36f"


def attempt(run_id: int, days_ago: float) -> Attempt:
    return Attempt(CANDIDATE, None, run_id, 1, "a" * 40, NOW - timedelta(days=days_ago), True, "failed",
                   "targeted", None, None, None)


@pytest.fixture
async def store(tmp_path):
    db = Database(str(tmp_path / "state.db"))
    await db.open("")
    store = StateStore(db)
    await store.open()
    yield store
    await db.close()


async def test_records_round_trip_as_the_same_values(store):
    family = Family("configs/a-master.yaml:k", "configs/a-master.yaml", "k", "img:1", "b200", ("b200-x",),
                    "dsr1", "fp8", "sglang", 1, 9, NOW)
    pull = PullRequest(3, "t", "bob", "h", "b" * 40, "main", False, ("x",), None, NOW, False, None,
                       (FileChange("configs/a-master.yaml", None, {"k": "image"}),), True, "b" * 40)
    await store.apply(Change().put("o/r", "family", family.id, family).put("o/r", "pull", 3, pull)
                      .put("", "repo", "o/r", {"installation": 1}))
    loaded = await store.load("o/r")
    assert loaded["family"][family.id] == family and loaded["pull"]["3"] == pull
    assert await store.repos() == ["o/r"] and await store.get("", "repo", "o/r") == {"installation": 1}


async def test_old_attempts_stay_in_the_store_but_are_not_loaded(store):
    change = Change()
    for run_id, days in ((1, 1), (2, 13), (3, 15), (4, 40)):
        change.put("o/r", "attempt", str(run_id), attempt(run_id, days))
    await store.apply(change)
    recent = await store.load("o/r", attempts_since=stamp(NOW - timedelta(days=14)))
    assert sorted(a.run_id for a in recent["attempt"].values()) == [1, 2]
    assert len((await store.load("o/r"))["attempt"]) == 4


async def test_a_failing_change_leaves_nothing_behind(store):
    await store.apply(Change().put("o/r", "wave", "f", {"by": "x"}))
    broken = Change().delete("o/r", "wave", "f")
    broken.puts.append(("o/r", "wave", "g", None))  # NOT NULL violation inside the transaction
    with pytest.raises(sqlite3.IntegrityError):
        await store.apply(broken)
    assert (await store.load("o/r"))["wave"] == {"f": {"by": "x"}}


async def test_clear_then_put_in_one_change(store):
    await store.apply(Change().put("o/r", "wave", "a", {"v": 1}).put("o/r", "wave", "b", {"v": 2}))
    await store.apply(Change().clear("o/r", "wave").put("o/r", "wave", "c", {"v": 3}))
    assert (await store.load("o/r"))["wave"] == {"c": {"v": 3}}


async def test_prune_attempts_deletes_only_old_ones(store):
    change = Change()
    for run_id, days in ((1, 1), (2, 100)):
        change.put("o/r", "attempt", str(run_id), attempt(run_id, days))
    change.put("o/r", "wave", "1", {"at": "2026-01-01T00:00:00Z"})
    await store.apply(change)
    assert await store.prune_attempts(stamp(NOW - timedelta(days=90))) == 1
    loaded = await store.load("o/r")
    assert [a.run_id for a in loaded["attempt"].values()] == [1] and "1" in loaded["wave"]
