"""Records as JSON: each kind of state record is (de)serialised by pydantic from its model.

A stored record is validated on the way back in, so a record the code cannot read is an
error with its kind and key, never a half-built object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, NotRequired, cast

import msgspec
from pydantic import AfterValidator, TypeAdapter, ValidationError

# pydantic validates typing's TypedDict only from Python 3.12.
from typing_extensions import TypedDict

from bot.core.domain import (
    Attempt,
    Claim,
    Dispatch,
    Family,
    Hold,
    PullRequest,
    RetryApproval,
    parse_time,
)


def _a_time_text(value: str) -> str:
    parse_time(value)  # ValueError (the record is reported unreadable) unless it is one
    return value


TimeText = Annotated[str, AfterValidator(_a_time_text)]  # a time kept as GitHub's text


class RetriedRun(TypedDict):
    """The run of an artifact read to retry, as stored: enough to read its artifact again."""

    id: int
    run_attempt: int
    head_sha: str
    created_at: TimeText | None
    updated_at: TimeText | None
    conclusion: NotRequired[str | None]  # stored since the fallback outcome is told apart


# What of a workflow run an artifact retry keeps (`WorkflowRun`'s fields of these names).
RETRIED_RUN_FIELDS = frozenset(RetriedRun.__required_keys__ | RetriedRun.__optional_keys__)


class ArtifactRetry(TypedDict):
    """An artifact read that failed transiently, tried again with backoff (`artifact-retry`
    records, keyed "<run id>:<run attempt>:<candidate>")."""

    run: RetriedRun
    candidate: str
    artifact_id: int
    first_failure_at: TimeText
    failures: int
    next_at: NotRequired[TimeText]
    wave: NotRequired[int]  # the wave whose dispatch the failed run ended (its pause rule counts the read)


# kind -> adapter; kinds absent here hold plain JSON documents (repo metadata, waves, ...).
MODELS: dict[str, type] = {
    "family": Family,
    "pull": PullRequest,
    "attempt": Attempt,
    "hold": Hold,
    "retry": RetryApproval,
    "claim": Claim,
    "dispatch": Dispatch,
    "artifact-retry": ArtifactRetry,
}
ADAPTERS: dict[str, TypeAdapter[Any]] = {kind: TypeAdapter(model) for kind, model in MODELS.items()}
LIST_ADAPTERS: dict[str, TypeAdapter[Any]] = {kind: TypeAdapter(list[model]) for kind, model in MODELS.items()}  # type: ignore[valid-type]


# Plain documents may hold dataclasses (a wave's decisions): msgspec writes them in C, and
# UTC datetimes as ISO text with a Z like `bot.core.domain.stamp`.
_PLAIN = msgspec.json.Encoder()
_ANY = msgspec.json.Decoder()


_NUL = "\\u0000"  # how JSON writes U+0000


def encode(kind: str, value: Any) -> str:
    adapter = ADAPTERS.get(kind)
    text = _PLAIN.encode(value).decode() if adapter is None else adapter.dump_json(value).decode()
    if _NUL in text:
        # PostgreSQL's json operators (the queries that load and prune attempts read
        # completed_at with ->>) refuse a document holding U+0000, and text from GitHub (a
        # job's or a step's name) may hold one: it is dropped, on both engines alike.
        text = _PLAIN.encode(_without_nul(_ANY.decode(text))).decode()
    return text


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, list):
        return [_without_nul(item) for item in value]
    if isinstance(value, dict):
        return {_without_nul(key): _without_nul(item) for key, item in value.items()}
    return value


def encode_document(value: Any) -> bytes:
    """A plain document (a wave's) as JSON bytes."""
    return _PLAIN.encode(value)


def decode_document(data: bytes) -> Any:
    return _ANY.decode(data)


def decode_many(kind: str, texts: Sequence[str | bytes]) -> list[Any]:
    """Every record (its JSON as text, or as UTF-8 bytes), or ValueError (pydantic's
    ValidationError is one, as are bytes that are not UTF-8) if any is unreadable."""
    adapter = LIST_ADAPTERS.get(kind)
    if adapter is None:
        return [_ANY.decode(text) for text in texts]
    # One validate_json call over a JSON array is far faster than one call per record.
    return adapter.validate_json(_json_array(texts))


def _json_array(texts: Sequence[str | bytes]) -> str | bytes:
    if all(isinstance(text, bytes) for text in texts):
        return b"[" + b",".join(cast("Sequence[bytes]", texts)) + b"]"
    return "[" + ",".join(text if isinstance(text, str) else text.decode("utf-8") for text in texts) + "]"


def decode_one(kind: str, text: str | bytes) -> Any:
    adapter = ADAPTERS.get(kind)
    if adapter is None:
        return _ANY.decode(text)
    return adapter.validate_json(text)


def unreadable_reason(exc: ValueError) -> str:
    """Why a record could not be decoded, on one line: the first problem and how many more."""
    if not isinstance(exc, ValidationError):
        return f"not JSON: {exc}"
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "record"
    more = exc.error_count() - 1
    return f"{where}: {first['msg']}" + (f" (and {more} more)" if more else "")
