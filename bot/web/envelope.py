"""The routing fields of a delivery, checked before it is stored.

The inbox orders and routes deliveries by `repository.full_name` and `installation.id`, and
stores them with `action` in typed columns; a payload whose routing fields have the wrong
shape (a list for a name, an id past 64 bits) is refused with 400 here, so it never reaches
the store's shared write batch, where one unstorable row would fail its neighbours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# GitHub logins and repository names: letters, digits, '-', '_', '.' (EMU logins have '_').
FULL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}")
MAX_INSTALLATION_ID = 2**63 - 1  # SQLite's INTEGER


class InvalidEnvelope(ValueError):
    """A routing field has the wrong type or shape; the message names the field."""


@dataclass(frozen=True, slots=True)
class Envelope:
    action: str | None
    repo: str | None
    installation: int | None


def envelope_of(payload: dict[str, Any]) -> Envelope:
    return Envelope(_action(payload), _repo(payload), _installation(payload))


def _action(payload: dict[str, Any]) -> str | None:
    action = payload.get("action")
    if action is not None and not isinstance(action, str):
        raise InvalidEnvelope(f"action must be a string, not {_kind(action)}")
    return action


def _repo(payload: dict[str, Any]) -> str | None:
    repository = payload.get("repository")
    if repository is None:
        return None
    if not isinstance(repository, dict):
        raise InvalidEnvelope(f"repository must be an object, not {_kind(repository)}")
    name = repository.get("full_name")
    if not isinstance(name, str):
        raise InvalidEnvelope(f"repository.full_name must be a string, not {_kind(name)}")
    if not FULL_NAME.fullmatch(name):
        raise InvalidEnvelope("repository.full_name must read OWNER/NAME")
    return name


def _installation(payload: dict[str, Any]) -> int | None:
    installation = payload.get("installation")
    if installation is None:
        return None
    if not isinstance(installation, dict):
        raise InvalidEnvelope(f"installation must be an object, not {_kind(installation)}")
    number = installation.get("id")
    # bool is an int to Python, and a JSON number past 64 bits arrives as a float.
    if not isinstance(number, int) or isinstance(number, bool):
        raise InvalidEnvelope(f"installation.id must be an integer, not {_kind(number)}")
    if not 0 <= number <= MAX_INSTALLATION_ID:
        raise InvalidEnvelope(f"installation.id must be within 0..{MAX_INSTALLATION_ID}")
    return number


def _kind(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
