"""The repository's record: its meta, persisted as one JSON document."""

from __future__ import annotations

import json

from bot.services.repo_state import RepoMeta, RepoState


def meta() -> RepoMeta:
    return RepoMeta(
        installation=7,
        head_sha="b" * 40,
        check_runs={"5": {"head_sha": "a" * 40, "id": 3}},
        setup_errors=[{"code": "workflow-missing", "detail": "no klaud-candidate.yml"}],
        pause={"reason": "three failed dispatches", "since": "2026-11-30T08:00:00Z"},
        wave_runs={"3": {"dispatched": 2, "failed": 1}},
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
