"""Times read from records and from GitHub carry `datetime.UTC` (`bot.core.domain.as_utc`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from bot.core.domain import Attempt, as_utc
from bot.core.events import PullRequestEvent
from bot.store.codec import decode_many, decode_one, encode

AT = datetime(2026, 11, 30, 8, tzinfo=UTC)


def attempt() -> Attempt:
    return Attempt("c" * 33, None, 5, 1, "a" * 40, AT, True, "failed", "targeted", None, None, None)


def test_a_record_read_back_holds_utc_times_that_compare_like_the_clocks() -> None:
    text = encode("attempt", attempt())
    for read in (decode_one("attempt", text), decode_many("attempt", [text])[0]):
        assert read == attempt()
        assert read.completed_at.tzinfo is UTC  # pydantic's own tzinfo compares ~15x slower


def test_a_github_time_with_an_offset_becomes_the_same_instant_in_utc() -> None:
    event = PullRequestEvent.model_validate({
        "action": "opened",
        "repository": {"full_name": "o/r"}, "installation": {"id": 1},
        "pull_request": {"number": 1, "state": "open", "title": "t", "user": {"login": "u"},
                         "head": {"ref": "b", "sha": "a" * 40}, "base": {"ref": "main", "sha": "b" * 40},
                         "created_at": "2026-11-30T10:00:00+02:00", "updated_at": "2026-11-30T08:00:00Z"},
    })
    assert event.pull_request.created_at == AT and event.pull_request.created_at.tzinfo is UTC
    assert event.pull_request.updated_at.tzinfo is UTC


def test_as_utc_keeps_utc_and_naive_times_as_they_are() -> None:
    naive = datetime(2026, 11, 30, 8)
    assert as_utc(naive) is naive and as_utc(AT) is AT
    assert as_utc(datetime(2026, 11, 30, 9, tzinfo=timezone(timedelta(hours=1)))) == AT
