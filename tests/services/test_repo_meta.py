"""The repository's record: its meta, persisted as one JSON document."""

from __future__ import annotations

import json

import pytest
from structlog.testing import capture_logs

from bot.core.clock import Clock
from bot.services.live import LiveState
from bot.services.repo_state import RepoMeta, RepoState
from bot.store.change import Change
from bot.store.db import Database
from bot.store.records import StateStore


def meta() -> RepoMeta:
    return RepoMeta(
        installation=7,
        head_sha="b" * 40,
        check_runs={"5": {"head_sha": "a" * 40, "id": 3}},
        setup_errors=[{"code": "workflow-missing", "detail": "no klaud-candidate.yml"}],
        pause={"reason": "three failed dispatches", "since": "2026-11-30T08:00:00Z"},
        wave_runs={"3": {"dispatched": 2, "finished": 1, "failed_jobs": {"get-jobs": 1},
                         "failed_steps": {"get-jobs": "Generate matrix"}}},
    )


def test_the_record_is_the_meta_as_it_was_when_put_and_reads_back_whole() -> None:
    state = RepoState("o/r", meta())
    change = state.save_meta()
    # Changed after the put: the record keeps the moment it was put.
    state.meta.check_runs["6"] = {"head_sha": "c" * 40, "id": 4}
    state.meta.wave += 1

    [(repo, kind, key, text)] = change.puts
    assert (repo, kind, key) == ("", "repo", "o/r")
    assert RepoState.from_records("o/r", {}, json.loads(text)).meta == meta()


async def test_a_record_this_version_cannot_read_is_reported_and_the_repository_starts_anew(tmp_path) -> None:
    db = Database(str(tmp_path / "k.db"))
    await db.open()
    store = StateStore(db)
    live = LiveState(store, None, Clock(), ())
    # A newer version's extra field is read past; a record missing `installation` is not.
    await store.apply(Change().put("", "repo", "o/new", {"installation": 7, "from_a_newer_version": 1}))
    await store.apply(Change().put("", "repo", "o/bad", {"wave": 3}))
    await store.apply(Change().put("", "repo", "o/null", None))  # vanished with no word
    with capture_logs() as logs:
        await live.load()
    assert sorted(live.repos) == ["o/new"] and live.repos["o/new"].meta.installation == 7
    assert sorted((e["event"], e["key"]) for e in logs if e["log_level"] == "warning") == [
        ("store.record_unreadable", "o/bad"), ("store.record_unreadable", "o/null")]
    await db.close()


@pytest.mark.parametrize("field", [
    {"pause": {"reason": "x"}},  # no `since`
    {"setup_errors": [{"code": "candidate-workflow-missing"}]},  # no `detail`
    {"wave_runs": {"3": {"dispatched": 2}}},
    # Times kept as text: a bad one loaded, then raised at start-up (`klaud plan` exited with
    # a traceback), on the status page, or at every scheduler tick (its waves never ran).
    {"pause": {"reason": "x", "since": "not a time"}},
    {"setup_errors": [{"code": "c", "detail": "d"}], "setup_since": "2026-11-30T08:00:00"},  # no zone
    {"next_wave_at": "soon"},
    {"reconciled_at": "0001-01-01T00:00:00Z"},
    {"dashboard": {"issue": 3, "rendered_at": 5}},
    {"closed_pulls": {"12": "yesterday"}},
])
async def test_a_record_whose_nested_fields_lack_keys_is_reported_not_read(tmp_path, field) -> None:
    # What this catches (a review): these fields were read as plain dicts, so a record
    # missing one of their keys loaded, and every plan, state document, status page and
    # delivery of the repository then failed with a KeyError (a /klaud hold was lost).
    db = Database(str(tmp_path / "k.db"))
    await db.open()
    store = StateStore(db)
    await store.apply(Change().put("", "repo", "o/bad", {"installation": 7, **field}))
    with capture_logs() as logs:
        await LiveState(store, None, Clock(), ()).load()
    assert [(e["event"], e["key"]) for e in logs if e["log_level"] == "warning"] == [("store.record_unreadable", "o/bad")]
    await db.close()


async def test_a_repository_stored_under_two_spellings_is_kept_once_and_the_other_reported(tmp_path) -> None:
    # Stores written before names were case-insensitive may hold both: one replaced the
    # other in silence, its holds and claims no longer in force, by the engine's row order.
    db = Database(str(tmp_path / "k.db"))
    await db.open()
    store = StateStore(db)
    change = Change().put("", "repo", "ACME/Bench", {"installation": 7}).put("", "repo", "acme/bench", {"installation": 7})
    await store.apply(change.put("", "repo", "o/r", {"installation": 7}))
    with capture_logs() as logs:
        await LiveState(store, None, Clock(), ()).load()
    assert [(e["kept"], e["left"]) for e in logs if e["event"] == "live.repository_spelled_twice"] == [
        ("acme/bench", ["ACME/Bench"])]
    await db.close()


# The bad records are put through the codec, which warns that they do not fit the model.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")
async def test_an_artifact_retry_record_of_another_shape_is_reported_and_skipped(tmp_path) -> None:
    # Copied into memory unchecked, such a record raised at every scheduler tick's retry of
    # artifact reads, and nothing ever deleted it.
    db = Database(str(tmp_path / "k.db"))
    await db.open()
    store = StateStore(db)
    good = {"run": {"id": 7, "run_attempt": 1, "head_sha": "a" * 40, "created_at": None,
                    "updated_at": "2026-11-30T08:00:00Z"},
            "candidate": "c", "artifact_id": 3, "first_failure_at": "2026-11-30T08:00:00Z", "failures": 1,
            "next_at": "2026-11-30T08:05:00Z"}
    change = Change().put("", "repo", "o/r", {"installation": 7}).put("o/r", "artifact-retry", "7:1:c", good)
    change.put("o/r", "artifact-retry", "8:1:a", "by hand").put("o/r", "artifact-retry", "9:1:b", {"candidate": "b"})
    change.put("o/r", "artifact-retry", "10:1:d", good | {"next_at": "later"})
    await store.apply(change)
    live = LiveState(store, None, Clock(), ())
    with capture_logs() as logs:
        await live.load()
    assert live.repos["o/r"].pending_artifacts == {"7:1:c": good}
    assert sorted(e["key"] for e in logs if e["event"] == "store.record_unreadable") == ["10:1:d", "8:1:a", "9:1:b"]
    await db.close()
