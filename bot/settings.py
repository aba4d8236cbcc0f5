"""Process settings from the environment (DESIGN §3.2).

A pydantic model so a bad value is reported with the name of the variable that
holds it, never discovered later as an odd behaviour.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Literal
from urllib.parse import SplitResult, parse_qsl, urlsplit

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)

# ASCII control characters: no HTTP header value carries them.
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# A PEM RSA private key is a few KB (GitHub issues 2048-bit App keys, 1.7 KB; 4096 bits is
# 3.2 KB). 64 KiB leaves room for any key with comments or a certificate beside it, and
# refuses /dev/zero, a pipe or a large file named by mistake before it fills the memory.
MAX_PRIVATE_KEY_BYTES = 64 * 1024


class SettingsError(ValueError):
    """A setting is missing or invalid; the message names the variable."""


class FileTooLarge(ValueError):
    """A file goes on past the bound it is read with."""


def read_at_most(path: Path, limit: int) -> bytes:
    """The file's bytes, or FileTooLarge past `limit`, read no further: read whole, a file
    without end (/dev/zero, a pipe) or a huge one takes all the memory there is.

    Here for KLAUD_PRIVATE_KEY_FILE, read before the CLI starts; the CLI's `--payload` and
    `config check` are bounded by it too."""
    with path.open("rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(f"{path} is over {limit} bytes")
    return data


class Settings(BaseModel):
    """Process settings from the environment (DESIGN §3.2)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    webhook_secret: SecretStr | None = None
    webhook_secret_previous: SecretStr | None = None
    app_id: int | None = None
    private_key: SecretStr | None = None
    github_url: str = "https://api.github.com"
    db: str = "sqlite:///klaud.db"
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    # The admin listener carries private repository data: loopback unless told otherwise.
    admin_host: str = "127.0.0.1"
    admin_port: int = Field(default=8081, ge=0, le=65535)
    admin_token: SecretStr | None = None
    dry_run: bool = False
    bot_logins: tuple[str, ...] = ("klaud-cold[bot]", "Klaud-Cold")
    capacity_url: str | None = None
    capacity_token: SecretStr | None = None
    log_format: Literal["json", "console"] = "json"
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    @field_validator("log_level", mode="before")
    @classmethod
    def _any_case(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("private_key")
    @classmethod
    def _pem_private_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return value
        try:
            key = serialization.load_pem_private_key(value.get_secret_value().encode(), password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm):
            # The message never includes the key itself.
            raise ValueError("not an unencrypted PEM private key") from None
        if not isinstance(key, rsa.RSAPrivateKey):
            # GitHub Apps' keys are RSA (the App's token is signed RS256): another kind (a TLS
            # key named by mistake) failed at the first GitHub call, with a traceback.
            raise ValueError("not an RSA private key (a GitHub App's private key is RSA)")  # noqa: TRY004 - pydantic reports ValueError
        return value

    @field_validator("admin_token", "capacity_token")
    @classmethod
    def _presentable_token(cls, value: SecretStr | None) -> SecretStr | None:
        # HTTP drops the whitespace around a header's value (RFC 9110 §5.5) and carries no
        # control character: a token with either (a secret file's trailing newline) would be
        # accepted here and then match no request, every admin call a 401 (the capacity
        # feed's token: every read of the feed refused by aiohttp before it is sent).
        token = value.get_secret_value() if value is not None else ""
        if token != token.strip() or _CONTROL.search(token):
            # The message never includes the token itself.
            raise ValueError("has whitespace around it or a control character in it (a secret file's"
                             " trailing newline?); no request could present it")
        return value

    @field_validator("db")
    @classmethod
    def _store_url(cls, value: str) -> str:
        if value.startswith(("postgresql://", "postgres://")):
            return _checked_postgresql_url(value)
        if not value.startswith("sqlite:///"):
            raise ValueError("expected sqlite:///PATH or postgresql://…")
        path = value[len("sqlite:///") :]
        if not path or path.endswith("/"):
            raise ValueError("sqlite:/// needs a file path (sqlite:///klaud.db)")
        if path != ":memory:":
            _check_sqlite_file(path)
        return value

    @field_validator("github_url", "capacity_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        return _checked_http_url(value).rstrip("/") if value is not None else value

    def secrets(self) -> list[str]:
        """Webhook secrets to accept, current first."""
        return [
            s.get_secret_value()
            for s in (self.webhook_secret, self.webhook_secret_previous)
            if s is not None and s.get_secret_value()
        ]


# Environment variable -> Settings field.
_ENV_FIELDS = {
    "KLAUD_WEBHOOK_SECRET": "webhook_secret",
    "KLAUD_WEBHOOK_SECRET_PREVIOUS": "webhook_secret_previous",
    "KLAUD_APP_ID": "app_id",
    "KLAUD_PRIVATE_KEY": "private_key",
    "KLAUD_GITHUB_URL": "github_url",
    "KLAUD_DB": "db",
    "KLAUD_HOST": "host",
    "KLAUD_PORT": "port",
    "KLAUD_ADMIN_HOST": "admin_host",
    "KLAUD_ADMIN_PORT": "admin_port",
    "KLAUD_ADMIN_TOKEN": "admin_token",
    "KLAUD_DRY_RUN": "dry_run",
    "KLAUD_BOT_LOGINS": "bot_logins",
    "KLAUD_CAPACITY_URL": "capacity_url",
    "KLAUD_CAPACITY_TOKEN": "capacity_token",
    "KLAUD_LOG_FORMAT": "log_format",
    "KLAUD_LOG_LEVEL": "log_level",
}
_FIELD_ENV = {field: env for env, field in _ENV_FIELDS.items()}


def load_settings(
    env: Mapping[str, str] | None = None,
    *,
    require_secret: bool = False,
    require_app: bool = False,
) -> Settings:
    """Read settings from `env` (default: the process environment).

    Raises SettingsError with a one-line message naming the offending variable.
    """
    env = os.environ if env is None else env
    values: dict[str, object] = {}
    for name, field in _ENV_FIELDS.items():
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        if field == "bot_logins":
            values[field] = tuple(login.strip() for login in raw.split(",") if login.strip())
            if not values[field]:
                # No login at all: Klaud would no longer know its own PRs and comments.
                raise SettingsError(f"KLAUD_BOT_LOGINS: names no login ({raw!r})")
        elif field == "dry_run":
            lowered = raw.strip().lower()
            if lowered not in {"1", "0", "true", "false", "yes", "no", "on", "off"}:
                raise SettingsError(f"KLAUD_DRY_RUN: expected true or false, got {raw!r}")
            values[field] = lowered in {"1", "true", "yes", "on"}
        else:
            values[field] = raw
    key_file = env.get("KLAUD_PRIVATE_KEY_FILE")
    if key_file and "private_key" not in values:
        values["private_key"] = _private_key_in(key_file)
    try:
        settings = Settings(**values)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = str(error["loc"][0]) if error["loc"] else "?"
        name = _FIELD_ENV.get(field, field)
        if field == "private_key" and not env.get("KLAUD_PRIVATE_KEY"):
            name = "KLAUD_PRIVATE_KEY_FILE"  # the variable the operator set
        message = str(error["msg"]).removeprefix("Value error, ")
        raise SettingsError(f"{name}: {message}") from None
    # The previous secret alone is not enough: it is accepted only while rotating to a new one.
    if require_secret and not (settings.webhook_secret and settings.webhook_secret.get_secret_value()):
        raise SettingsError("KLAUD_WEBHOOK_SECRET: required to verify webhook deliveries")
    if require_app:
        if settings.app_id is None:
            raise SettingsError("KLAUD_APP_ID: required to authenticate as the GitHub App")
        if settings.private_key is None:
            raise SettingsError(
                "KLAUD_PRIVATE_KEY: required (or KLAUD_PRIVATE_KEY_FILE) to sign App JWTs"
            )
    return settings


def _private_key_in(key_file: str) -> str:
    """The text of KLAUD_PRIVATE_KEY_FILE, or SettingsError naming the variable."""
    try:
        return read_at_most(Path(key_file), MAX_PRIVATE_KEY_BYTES).decode()
    except OSError as exc:
        raise SettingsError(f"KLAUD_PRIVATE_KEY_FILE: cannot read {key_file}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise SettingsError(f"KLAUD_PRIVATE_KEY_FILE: {key_file} is not a PEM text file") from None
    except FileTooLarge as exc:
        raise SettingsError(f"KLAUD_PRIVATE_KEY_FILE: {exc}; a PEM private key is a few KB") from None


def _check_sqlite_file(path: str) -> None:
    """Refuse a SQLite file Klaud could not open, at start-up in one line: the store's lock
    would otherwise fail to open it later, with a traceback.

    os.path's checks, which answer False where Path's raise (Path.resolve on a symlink loop,
    Path.is_dir on a folder that may not be searched): raised here, those would escape the
    settings' one-line errors, a traceback before the CLI's boundary."""
    if not os.path.isdir(os.path.dirname(os.path.realpath(path))):
        # Klaud does not create folders: a typo must not scatter state across the disk.
        raise ValueError(f"the folder of {path} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"{path} is a folder, not a SQLite file (sqlite:///{path}/klaud.db?)")


def _checked_http_url(value: str) -> str:
    """An http(s) URL with a host and a port that is a number in range: read later, a URL
    without them is a traceback at the GitHub client's first request, or a capacity feed
    whose every read fails."""
    if not value.startswith(("http://", "https://")):
        raise ValueError("must be an http(s) URL")
    parts = _split_url(value, ValueError("not a URL (http(s)://HOST[:PORT][/PATH], PORT a number up to 65535)"))
    if not parts.hostname:
        raise ValueError("needs a host (http(s)://HOST[:PORT][/PATH])")
    return value


def _split_url(value: str, unreadable: ValueError) -> SplitResult:
    """`value`'s parts, its port read too (urlsplit reads a port, out of range or not a
    number, only when asked); `unreadable` when they cannot be had."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (read for its check)
    except ValueError:
        raise unreadable from None
    return parts


def _checked_postgresql_url(value: str) -> str:
    """A PostgreSQL URL with a host, a port that is a number and a database: asyncpg reads
    a malformed one only when it connects, with a traceback."""
    # The parser's own words are not repeated: they quote the URL's parts, and a password
    # with a character that ends the user part (`/`, `#`, `?`) is cut into them.
    unreadable = ValueError(
        "not a PostgreSQL URL (postgresql://USER:PASSWORD@HOST:PORT/DATABASE; a password with "
        "any of / # ? @ : % must be percent-encoded)"
    )
    parts = _split_url(value, unreadable)
    # The user part went on past a `/`, `?` or `#` of its password: an `@` after it. A query
    # parameter's value may hold one (`?user=sa@project.iam`), its name may not.
    query_names = [name for name, _ in parse_qsl(parts.query, keep_blank_values=True)]
    if "@" in parts.path or "@" in parts.fragment or any("@" in name for name in query_names):
        raise unreadable
    if not parts.hostname and "host=" not in parts.query:
        raise ValueError("postgresql:// needs a host (postgresql://USER@HOST:PORT/DATABASE)")
    if not parts.path.strip("/") and "dbname=" not in parts.query:
        raise ValueError("postgresql:// needs a database name (postgresql://USER@HOST:PORT/DATABASE)")
    return value
