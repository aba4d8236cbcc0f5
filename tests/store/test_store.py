"""The state store, on both engines: records round-trip, changes apply atomically, and a
record the code cannot read is reported in one line and skipped."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sqlite3
import zlib
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from structlog.testing import capture_logs

from bot.core.domain import Attempt, Family, FileChange, PullRequest, stamp
from bot.store import Stores, open_stores
from bot.store.codec import encode
from bot.store.deliveries import Delivery
from bot.store.engine import Statement
from bot.store.records import Change, StoredRepo

NOW = datetime(2026, 11, 30, 8, tzinfo=UTC)
CANDIDATE = "d92e15065c55779d-555679de269db36f"


def attempt(run_id: int, days_ago: float) -> Attempt:
    return Attempt(CANDIDATE, None, run_id, 1, "a" * 40, NOW - timedelta(days=days_ago), True, "failed",
                   "targeted", None, None, None)


def family(key: str = "k") -> Family:
    return Family(f"configs/a-master.yaml:{key}", "configs/a-master.yaml", key, "img:1", "b200", ("b200-x",),
                  "dsr1", "fp8", "sglang", 1, 9, NOW)


def raw(change: Change, repo: str, kind: str, key: str, text: str) -> Change:
    """Put `text` as stored, past the codec: what another version of Klaud may have left."""
    change.puts.append((repo, kind, key, text))
    return change


async def test_records_round_trip_as_the_same_values(stores):
    pull = PullRequest(3, "t", "bob", "h", "b" * 40, "main", False, ("x",), None, NOW, False, None,
                       (FileChange("configs/a-master.yaml", None, {"k": "image"}),), True, "b" * 40)
    await stores.state.apply(Change().put("o/r", "family", family().id, family()).put("o/r", "pull", 3, pull)
                             .put("", "repo", "o/r", {"installation": 1}))
    loaded = await stores.state.load("o/r")
    assert loaded["family"][family().id] == family() and loaded["pull"]["3"] == pull
    assert await stores.state.repos() == ["o/r"]
    assert await stores.state.get("", "repo", "o/r") == {"installation": 1}
    assert await stores.state.get("", "repo", "x/y") is None


async def test_old_attempts_stay_in_the_store_but_are_not_loaded(stores):
    change = Change()
    for run_id, days in ((1, 1), (2, 13), (3, 15), (4, 40)):
        change.put("o/r", "attempt", str(run_id), attempt(run_id, days))
    await stores.state.apply(change)
    recent = await stores.state.load("o/r", attempts_since=stamp(NOW - timedelta(days=14)))
    assert sorted(a.run_id for a in recent["attempt"].values()) == [1, 2]
    assert len((await stores.state.load("o/r"))["attempt"]) == 4


async def test_the_attempts_of_one_candidate_are_read_whatever_their_age(stores):
    # Those an open Klaud PR's check run shows, loaded past the 14 days a load keeps.
    mine, other = "0123456789abcdef-0123456789abcdef", "0123456789abcdef-fedcba9876543210"
    change = Change()
    for run_id, days, candidate in ((1, 1, mine), (2, 40, mine), (3, 40, other)):
        change.put("o/r", "attempt", f"{candidate}:{run_id}:1", dataclasses.replace(attempt(run_id, days), candidate=candidate))
    change.put("o/q", "attempt", f"{mine}:4:1", dataclasses.replace(attempt(4, 40), candidate=mine))
    await stores.state.apply(change)
    assert sorted(a.run_id for a in (await stores.state.attempts_of("o/r", [mine])).values()) == [1, 2]
    assert len(await stores.state.attempts_of("o/r", [mine, other])) == 3
    assert await stores.state.attempts_of("o/r", []) == {}
    with pytest.raises(ValueError, match="not candidate ids"):
        await stores.state.attempts_of("o/r", ["%"])


async def test_text_holding_u0000_from_github_is_stored_without_it_and_attempts_still_load(stores):
    # A step's name comes verbatim from GitHub's jobs API. PostgreSQL's ->> (loading and
    # pruning attempts) refused the whole document, so the repository could not be loaded.
    failed = dataclasses.replace(attempt(1, 1), failed_job="build\x00", failed_step="step\x00one")
    await stores.state.apply(Change().put("o/r", "attempt", "1", failed).put("", "repo", "o/r", {"note": "a\\u0000b"}))
    [loaded] = (await stores.state.load("o/r", attempts_since=stamp(NOW - timedelta(days=14))))["attempt"].values()
    assert (loaded.failed_job, loaded.failed_step) == ("build", "stepone")
    assert await stores.state.get("", "repo", "o/r") == {"note": "a\\u0000b"}  # a backslash and u0000: kept
    assert await stores.state.prune_attempts(stamp(NOW)) == 1


async def test_a_failing_change_leaves_nothing_behind(stores):
    await stores.state.apply(Change().put("o/r", "wave", "f", {"by": "x"}))
    broken = Change().delete("o/r", "wave", "f")
    broken.puts.append(("o/r", "wave", "g", None))  # NOT NULL violation inside the transaction
    with pytest.raises((sqlite3.IntegrityError, asyncpg.NotNullViolationError)):
        await stores.state.apply(broken)
    assert (await stores.state.load("o/r"))["wave"] == {"f": {"by": "x"}}


async def test_clear_then_put_in_one_change(stores):
    await stores.state.apply(Change().put("o/r", "wave", "a", {"v": 1}).put("o/r", "wave", "b", {"v": 2}))
    await stores.state.apply(Change().clear("o/r", "wave").put("o/r", "wave", "c", {"v": 3}))
    assert (await stores.state.load("o/r"))["wave"] == {"c": {"v": 3}}


async def test_a_put_replaces_the_record_of_its_key(stores):
    await stores.state.apply(Change().put("o/r", "wave", "a", {"v": 1}))
    await stores.state.apply(Change().put("o/r", "wave", "a", {"v": 2}))
    assert await stores.state.get("o/r", "wave", "a") == {"v": 2}


async def test_prune_attempts_deletes_only_old_ones(stores):
    change = Change()
    for run_id, days in ((1, 1), (2, 100)):
        change.put("o/r", "attempt", str(run_id), attempt(run_id, days))
    change.put("o/r", "wave", "1", {"at": "2026-01-01T00:00:00Z"})
    await stores.state.apply(change)
    assert await stores.state.prune_attempts(stamp(NOW - timedelta(days=90))) == 1
    loaded = await stores.state.load("o/r")
    assert [a.run_id for a in loaded["attempt"].values()] == [1] and "1" in loaded["wave"]


async def test_an_unreadable_record_is_reported_in_one_line_and_skipped(stores):
    change = Change().put("o/r", "family", family("good").id, family("good"))
    raw(change, "o/r", "family", "configs/a-master.yaml:old", '{"id": "configs/a-master.yaml:old"}')
    change.put("o/r", "attempt", "1", attempt(1, 1))
    older = json.loads(encode("attempt", attempt(2, 1))) | {"run_id": "two"}  # a shape of another version
    raw(change, "o/r", "attempt", "2", json.dumps(older))
    await stores.state.apply(change)
    with capture_logs() as logs:
        loaded = await stores.state.load("o/r", attempts_since=stamp(NOW - timedelta(days=14)))
        missing = await stores.state.get("o/r", "family", "configs/a-master.yaml:old")
    assert list(loaded["family"]) == [family("good").id] and list(loaded["attempt"]) == ["1"]
    assert missing is None
    # One line per unreadable record and read: two from load, one from get.
    reports = sorted((e["kind"], e["key"], e["reason"]) for e in logs if e["event"] == "store.record_unreadable")
    assert [(kind, key) for kind, key, _ in reports] == [
        ("attempt", "2"), ("family", "configs/a-master.yaml:old"), ("family", "configs/a-master.yaml:old")]
    assert all(e["log_level"] == "warning" and e["repo"] == "o/r" for e in logs)
    assert reports[0][2].startswith("run_id: Input should be a valid integer")
    assert "(and " in reports[1][2]  # several fields missing: the first, and how many more


async def test_a_record_holding_a_time_past_the_year_9000_is_reported_and_skipped(stores):
    # What this catches: a dispatch stored at 9999-12-31 read back as it was, so every plan of
    # its repository overflowed adding the claim TTL (`klaud plan` and /plan tracebacks).
    late = json.loads(encode("attempt", attempt(3, 1))) | {"completed_at": "9999-12-31T23:59:00Z"}
    await stores.state.apply(raw(Change().put("o/r", "attempt", "1", attempt(1, 1)), "o/r", "attempt", "3", json.dumps(late)))
    with capture_logs() as logs:
        loaded = await stores.state.load("o/r", attempts_since=stamp(NOW - timedelta(days=14)))
    assert list(loaded["attempt"]) == ["1"]
    [report] = [e for e in logs if e["event"] == "store.record_unreadable"]
    assert report["key"] == "3" and "past the year 9000" in report["reason"]


async def test_records_and_deliveries_survive_a_restart(store_url):
    from bot.store.deliveries import Delivery

    first = await open_stores(store_url)
    await first.state.apply(Change().put("o/r", "family", family().id, family()))
    assert await first.deliveries.put(Delivery("d1", "push", b'{"a":1}', repo="o/r"))
    await first.close()
    second = await open_stores(store_url)
    try:
        assert (await second.state.load("o/r"))["family"] == {family().id: family()}
        assert [d.id for d in await second.deliveries.pending()] == ["d1"]
        assert not await second.deliveries.put(Delivery("d1", "push", b'{"a":1}', repo="o/r"))
    finally:
        await second.close()


async def test_one_row_the_store_refuses_fails_only_its_own_put(stores) -> None:  # type: ignore[no-untyped-def]
    from bot.store.deliveries import Delivery

    def delivery(n: int, **changes: object) -> Delivery:
        values: dict[str, object] = {"id": f"d-{n}", "event": "push", "body": b"{}", "repo": "acme/bench", "installation": 1}
        values.update(changes)
        return Delivery(**values)  # type: ignore[arg-type]

    puts = [stores.deliveries.put(delivery(n)) for n in range(3)]
    puts.append(stores.deliveries.put(delivery(99, installation=10**30)))  # no engine stores that
    results = await asyncio.gather(*puts, return_exceptions=True)
    assert results[:3] == [True, True, True]
    assert isinstance(results[3], Exception)
    assert sorted(d.id for d in await stores.deliveries.pending()) == ["d-0", "d-1", "d-2"]


async def test_a_wave_compressed_by_an_earlier_version_reads_back_and_a_corrupt_one_is_reported(
        stores: Stores) -> None:
    """Waves and bodies were zlib-compressed before zstd: those rows stay readable; a blob
    that does not decompress is one line of report, not a traceback."""
    document = {"repo": "o/r", "wave": 3, "decisions": []}
    insert = "INSERT INTO waves (repo, number, encoding, body) VALUES (?, ?, ?, ?)"
    await stores.engine.transaction([Statement(insert, ("o/r", 3, "zlib", zlib.compress(json.dumps(document).encode()))),
                                     Statement(insert, ("o/r", 4, "zstd", b"not zstd at all"))])

    with capture_logs() as logs:
        assert await stores.state.wave("o/r", 3) == document
        assert await stores.state.wave("o/r", 4) is None
    [report] = [e for e in logs if e["event"] == "store.record_unreadable"]
    assert (report["kind"], report["key"]) == ("wave", 4) and "zstd" in report["reason"]


async def test_wave_documents_are_kept_apart_compressed_on_sqlite_and_read_back(stores: Stores) -> None:
    document = {"repo": "o/r", "wave": 7, "decisions": [{"family": f"f{n}", "reason": "cooling down"} for n in range(500)]}
    await stores.state.apply(Change().put_wave("o/r", 7, document).put_wave("o/r", 8, {"wave": 8}))
    await stores.state.apply(Change().delete_wave("o/r", 8))

    assert await stores.state.wave("o/r", 7) == document
    assert await stores.state.wave("o/r", 8) is None
    assert "wave" not in await stores.state.load("o/r"), "a repository's load leaves the documents in the store"
    [(encoding, size)] = await stores.engine.fetch("SELECT encoding, length(body) FROM waves")
    assert (encoding, size < 2_000) == (("zstd", True) if stores.engine.dialect == "sqlite" else (None, False))
    await stores.state.apply(Change().clear_waves("O/R".lower()))
    assert await stores.state.wave("o/r", 7) is None


async def test_a_renamed_repository_moves_its_records_and_waves_and_leaves_the_others(stores: Stores) -> None:
    await stores.state.apply(
        Change().put("o/r", "family", family().id, family()).put("", "repo", "o/r", {"installation": 1})
        .put_wave("o/r", 3, {"wave": 3}).put("x/y", "family", family().id, family()).put("", "repo", "x/y", {"installation": 1})
    )
    for n, status in enumerate(("queued", "done")):
        await stores.deliveries.put(Delivery(f"d{n}", "push", b"{}", action=None, repo="O/R", installation=1))
        if status == "done":
            await stores.engine.transaction([Statement("UPDATE deliveries SET status = 'done' WHERE id = ?", ("d1",))])
    await stores.state.rename("o/r", "o/renamed")

    assert sorted(await stores.state.repos()) == ["o/renamed", "x/y"]
    assert await stores.state.get("", "repo", "o/renamed") == {"installation": 1}
    assert (await stores.state.load("o/renamed"))["family"][family().id] == family()
    assert await stores.state.wave("o/renamed", 3) == {"wave": 3}
    assert await stores.state.load("o/r") == {} and await stores.state.wave("o/r", 3) is None
    assert (await stores.state.load("x/y"))["family"][family().id] == family()
    # Its deliveries still to process follow it (with replicas, to the new name's lease).
    assert await stores.deliveries.waiting_repos() == {"o/renamed"}
    assert (await stores.deliveries.get("d1")).repo == "O/R"  # type: ignore[union-attr]  # history stays


@pytest.mark.parametrize(("stored_as", "readable"), [
    ("CAST(data AS BLOB)", True),  # what the sqlite3 shell's readfile() writes: the same JSON, typed BLOB
    ("CAST(X'7B22FF22' AS TEXT)", False),  # not UTF-8: a corrupted page, a hand edit
])
async def test_a_sqlite_record_typed_blob_or_not_utf8_costs_only_itself(tmp_path, stored_as, readable):
    # What this catches: SQLite decoded every record as text, so one such row failed the
    # repository's whole load, and with it every start of `klaud serve` and `klaud plan`.
    path = tmp_path / "klaud.db"
    stores = await open_stores(f"sqlite:///{path}")
    await stores.state.apply(Change().put("o/r", "family", family("good").id, family("good"))
                             .put("o/r", "family", family("odd").id, family("odd")))
    await stores.close()
    with sqlite3.connect(path) as conn:
        conn.execute(f"UPDATE records SET data = {stored_as} WHERE key = ?", (family("odd").id,))
    stores = await open_stores(f"sqlite:///{path}")
    try:
        with capture_logs() as logs:
            loaded = await stores.state.load("o/r")
            odd = await stores.state.get("o/r", "family", family("odd").id)
    finally:
        await stores.close()
    assert family("good").id in loaded["family"]
    assert (family("odd").id in loaded["family"]) is readable and (odd == family("odd")) is readable
    reports = [e for e in logs if e["event"] == "store.record_unreadable"]
    assert len(reports) == (0 if readable else 2) and all("invalid unicode" in e["reason"] for e in reports)


async def test_every_stored_repository_is_listed_with_its_installation_and_id(stores: Stores) -> None:
    change = Change().put("", "repo", "o/a", {"installation": 1, "repo_id": 4242}).put("", "repo", "o/B", {"installation": 2})
    change.put("", "repo", "o/odd", {"installation": "one", "repo_id": 1.5})
    if stores.engine.dialect == "sqlite":  # PostgreSQL's JSON column takes no other text
        raw(change, "", "repo", "o/odd", "not json")
    await stores.state.apply(change)

    listed = sorted(await stores.state.stored_repos(), key=lambda repo: repo.name)

    assert listed == [StoredRepo("o/B", 2, None), StoredRepo("o/a", 1, 4242), StoredRepo("o/odd", None, None)]


async def test_the_last_stored_wave_numbers_skip_numbers_that_stored_no_wave(stores: Stores) -> None:
    change = Change()
    for repo, number in (("o/r", 1), ("o/r", 3), ("o/r", 4), ("o/other", 9)):
        change.put_wave(repo, number, {"wave": number})
    await stores.state.apply(change)

    assert await stores.state.last_wave_numbers("o/r", 2) == [4, 3]
    assert await stores.state.last_wave_numbers("o/r", 10) == [4, 3, 1]
