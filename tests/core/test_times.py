"""Times read from records and from GitHub carry `datetime.UTC` (`bot.core.domain.as_utc`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from bot.core.domain import Attempt, as_utc, parse_time
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


def test_as_utc_keeps_utc_converts_other_zones_and_refuses_naive_times() -> None:
    assert as_utc(AT) is AT
    assert as_utc(datetime(2026, 11, 30, 9, tzinfo=timezone(timedelta(hours=1)))) == AT
    # Stored, a naive time made every later wave of its repository raise TypeError.
    with pytest.raises(ValueError, match="without a timezone"):
        as_utc(datetime(2026, 11, 30, 8))


def test_a_run_event_with_a_time_without_its_zone_is_refused_at_the_edge() -> None:

    from bot.core.events import WorkflowRunEvent

    run = {"id": 5, "path": ".github/workflows/klaud-candidate.yml", "head_sha": "a" * 40, "status": "completed",
           "conclusion": "success", "created_at": "2026-11-30T08:00:00", "updated_at": "2026-11-30T08:00:00"}
    with pytest.raises(ValidationError, match="without a timezone"):
        WorkflowRunEvent.model_validate({"action": "completed", "workflow_run": run,
                                         "repository": {"full_name": "acme/bench"}, "installation": {"id": 1}})


@pytest.mark.parametrize(
    ("pushed_at", "expected"),
    [(int(AT.timestamp()), AT.timestamp()), ("2026-11-30T08:00:00Z", AT.timestamp()), ("yesterday", None), (True, None),
     # Past the years Klaud plans with: kept, the family was dropped at the next load
     # (9892); further, the push failed with a bare ValueError or OverflowError.
     (2.5e11, None), (1e12, None), (1e20, None), (-1, None), (float("inf"), None), (float("nan"), None)],
)
def test_a_push_time_is_read_from_epoch_seconds_or_iso_text(pushed_at: object, expected: float | None) -> None:
    # An ISO `pushed_at` was dropped: the image was dated when the delivery was processed.
    from bot.core.events import PushEvent

    event = PushEvent.model_validate({"ref": "refs/heads/main", "before": "a" * 40, "after": "b" * 40,
                                      "repository": {"full_name": "acme/bench", "pushed_at": pushed_at},
                                      "installation": {"id": 1}})
    assert event.repository.pushed_at == expected


def test_a_time_before_the_year_1_in_utc_is_a_validation_error_naming_its_field() -> None:
    # What this catches: converting it overflowed, and an OverflowError got past pydantic:
    # the delivery failed with "date value out of range", naming no field.
    from bot.core.events import IssueCommentEvent

    comment = {"id": 1, "body": "/klaud help", "user": {"login": "x"}, "created_at": "0001-01-01T00:00:00+05:00"}
    with pytest.raises(ValidationError, match="created_at"):
        IssueCommentEvent.model_validate({"action": "created", "repository": {"full_name": "acme/bench"},
                                          "installation": {"id": 1}, "issue": {"number": 1}, "comment": comment})


def test_a_time_at_the_end_of_the_range_west_of_utc_is_refused_as_it_would_be_stored() -> None:
    # What this catches: the year was checked before converting to UTC: 9000-12-31T23:00-05:00
    # was accepted, stored as 9001-01-01T04:00Z, and its record refused at the next load.
    late = "9000-12-31T23:00:00-05:00"
    with pytest.raises(ValueError, match="outside"):
        parse_time(late)
    with pytest.raises(ValidationError, match="past the year 9000"):
        decode_one("claim", '{"family": "configs/x-master.yaml:k", "candidate": "aaaaaaaaaaaaaaaa-bbbbbbbbbbbbbbbb",'
                            f' "wave": 1, "ref": "klaud/claim-x", "at": "{late}"}}')
    assert parse_time("9000-12-31T23:00:00+05:00") == datetime(9000, 12, 31, 18, tzinfo=UTC)


def test_a_time_in_the_year_9999_west_of_utc_is_refused_as_past_the_range() -> None:
    # What this catches: converting it to UTC overflows, and the error said "before the year 1".
    late = datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-5)))
    with pytest.raises(ValueError, match="past the year 9000"):
        as_utc(late)
    with pytest.raises(ValidationError, match="past the year 9000"):
        decode_one("claim", '{"family": "configs/x-master.yaml:k", "candidate": "aaaaaaaaaaaaaaaa-bbbbbbbbbbbbbbbb",'
                            ' "wave": 1, "ref": "klaud/claim-x", "at": "9999-12-31T23:00:00-05:00"}')


def test_a_retry_further_off_than_its_longest_wait_is_due() -> None:
    from bot.core.clock import retry_due

    now = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
    hour = timedelta(hours=1)
    assert retry_due(now, now, hour) and retry_due(now - hour, now, hour)
    assert not retry_due(now + hour, now, hour)  # waiting its full delay
    assert retry_due(now + timedelta(days=365), now, hour)  # set while the clock ran a year ahead
