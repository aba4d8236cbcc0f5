"""The routing fields of a delivery, the only part of the body decoded before it is stored.

The inbox orders and routes deliveries by `repository.full_name` and `installation.id`, and
stores them with `action` in typed columns. At the ack msgspec decodes just those three
fields (skipping the rest of the ~25 KB body in C; the handlers parse it once, later) and a
payload whose routing fields have the wrong shape (a list for a name, an id past 64 bits)
is refused with 400 here, so it never reaches the store's shared write batch, where one
unstorable row would fail its neighbours.

msgspec does not check the UTF-8 of the fields it skips, and JSON that is not UTF-8 can never
be read by a handler: the ack checks it (~1 µs for an ASCII body), so such a body is a 400,
not a delivery acknowledged, stored, then failed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec

# GitHub logins and repository names: letters, digits, '-', '_', '.' (EMU logins have '_').
FULL_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}")
MAX_INSTALLATION_ID = 2**63 - 1  # SQLite's INTEGER


# GitHub's actions are words joined by '_' ("ready_for_review"); a repository_dispatch's is
# the sender's event_type, which GitHub caps at 100 characters.
MAX_ACTION = 100


class UnreadableBody(ValueError):
    """The body is not a JSON object (`code` invalid-json) or a routing field has the wrong
    type or shape (invalid-payload, the message names the field)."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Envelope:
    action: str | None
    repo: str | None
    installation: int | None


# The leaves are `object` so that the checks below, not msgspec, word the errors.
class _Repository(msgspec.Struct):
    full_name: object = None


class _Installation(msgspec.Struct):
    id: object = None


class _Routing(msgspec.Struct):
    action: object = None
    repository: _Repository | None = None
    installation: _Installation | None = None


_ROUTING = msgspec.json.Decoder(_Routing)


def envelope_of(body: bytes) -> Envelope:
    """The routing fields of `body`; UnreadableBody says why there are none."""
    try:
        routing = _ROUTING.decode(body)
    except msgspec.ValidationError as exc:
        if " - at `$" not in str(exc):
            raise UnreadableBody("invalid-json", "body must be a JSON object") from None
        raise invalid(str(exc).replace("`", "")) from None
    except msgspec.DecodeError as exc:
        raise UnreadableBody("invalid-json", f"body is not JSON: {exc}") from None
    except RecursionError:
        raise UnreadableBody("invalid-json", "body exceeds the JSON nesting depth limit") from None
    _check_utf8(body)
    return Envelope(_action(routing.action), _repo(routing.repository), _installation(routing.installation))


def _check_utf8(body: bytes) -> None:
    if body.isascii():
        return
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UnreadableBody("invalid-json", f"body is not UTF-8 at byte {exc.start}: {exc.reason}") from None


def invalid(detail: str) -> UnreadableBody:
    return UnreadableBody("invalid-payload", detail)


def _action(action: object) -> str | None:
    if action is not None and not isinstance(action, str):
        raise invalid(f"action must be a string, not {_kind(action)}")
    # Stored, shown by the API and logged: a 5 MB action was echoed whole into one log line.
    if action is not None and not (0 < len(action) <= MAX_ACTION and action.isprintable()):
        raise invalid(f"action must be 1-{MAX_ACTION} printable characters")
    return action


def _repo(repository: _Repository | None) -> str | None:
    if repository is None:
        return None
    name = repository.full_name
    if not isinstance(name, str):
        raise invalid(f"repository.full_name must be a string, not {_kind(name)}")
    if not FULL_NAME.fullmatch(name):
        raise invalid("repository.full_name must read OWNER/NAME")
    return name


def _installation(installation: _Installation | None) -> int | None:
    if installation is None:
        return None
    number = installation.id
    # bool is an int to Python; a JSON number past 64 bits fails the range check.
    if not isinstance(number, int) or isinstance(number, bool):
        raise invalid(f"installation.id must be an integer, not {_kind(number)}")
    if not 0 <= number <= MAX_INSTALLATION_ID:
        raise invalid(f"installation.id must be within 0..{MAX_INSTALLATION_ID}")
    return number


def _kind(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")
