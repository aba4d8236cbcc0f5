"""Records as JSON: each kind of state record is (de)serialised by pydantic from its model.

A stored record is validated on the way back in, so a record the code cannot read is an
error with its kind and key, never a half-built object.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter

from bot.core.domain import (
    Attempt,
    Claim,
    Dispatch,
    Family,
    Hold,
    PullRequest,
    RetryApproval,
)

# kind -> adapter; kinds absent here hold plain JSON documents (repo metadata, waves, ...).
MODELS: dict[str, type] = {
    "family": Family,
    "pull": PullRequest,
    "attempt": Attempt,
    "hold": Hold,
    "retry": RetryApproval,
    "claim": Claim,
    "dispatch": Dispatch,
}
ADAPTERS: dict[str, TypeAdapter[Any]] = {kind: TypeAdapter(model) for kind, model in MODELS.items()}
LIST_ADAPTERS: dict[str, TypeAdapter[Any]] = {kind: TypeAdapter(list[model]) for kind, model in MODELS.items()}  # type: ignore[valid-type]


def encode(kind: str, value: Any) -> str:
    adapter = ADAPTERS.get(kind)
    if adapter is None:
        return json.dumps(value, separators=(",", ":"))
    return adapter.dump_json(value).decode()


def decode_many(kind: str, texts: list[str]) -> list[Any]:
    adapter = LIST_ADAPTERS.get(kind)
    if adapter is None:
        return [json.loads(text) for text in texts]
    # One validate_json call over a JSON array is far faster than one call per record.
    return adapter.validate_json("[" + ",".join(texts) + "]")
