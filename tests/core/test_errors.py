"""Which handler errors retry a delivery and which fail it at once (bot/core/errors.py)."""

from __future__ import annotations

import sqlite3

import pytest
from pydantic import ValidationError

from bot.core.errors import is_permanent
from bot.core.events import WorkflowRunEvent
from bot.github.errors import (
    BadRequest,
    NotFound,
    RateLimited,
    Unauthorized,
    Unavailable,
)


def validation_error() -> ValidationError:
    try:
        WorkflowRunEvent.model_validate({"action": "completed", "workflow_run": {"id": 1, "updated_at": "notatime"}})
    except ValidationError as exc:
        return exc
    raise AssertionError("the payload should not validate")


@pytest.mark.parametrize(
    "exc",
    [
        Unavailable(502, "Bad Gateway"),
        RateLimited(403, "rate limit", retry_after=60),
        TimeoutError(),
        ConnectionResetError(),
        sqlite3.OperationalError("database is locked"),
    ],
)
def test_github_and_store_trouble_is_transient(exc: BaseException) -> None:
    assert not is_permanent(exc)


@pytest.mark.parametrize(
    "exc",
    [
        NotFound(404, "Not Found"),
        BadRequest(403, "Resource not accessible by integration"),
        KeyError("a bug"),
        ValueError("a bug"),
    ],
)
def test_everything_else_fails_at_once(exc: BaseException) -> None:
    assert is_permanent(exc)


def test_a_workflow_run_with_updated_at_notatime_is_permanent() -> None:
    assert is_permanent(validation_error())


def test_a_token_github_refused_is_transient() -> None:
    # The client re-mints a token on every 401; one that still fails is retried later
    # (a command must not be lost to a token problem).
    assert not is_permanent(Unauthorized(401, "Bad credentials"))
