"""What stands before every REST handler: faults, authentication, rate limits, the log."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import jwt
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from bot.sandbox.shapes import ts
from bot.sandbox.world import World

DOCS = "https://docs.github.com/rest"
# GitHub's answer to a suspended installation's token request, and to its tokens.
SUSPENDED = "This installation has been suspended"
RATE_WINDOW = timedelta(hours=1)
# GitHub refuses App JWTs that live longer than ten minutes; allow its clock-drift slack.
JWT_MAX_LIFETIME = 600
JWT_SKEW = 60


class ApiError(Exception):
    """An error answer with GitHub's JSON body {"message", "documentation_url", "status"}."""

    def __init__(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return {"message": self.message, **self.extra, "documentation_url": DOCS,
                "status": str(self.status)}


class GraphQLRateLimited(ApiError):
    """GraphQL's budget spent: GitHub answers 200 with an error of type RATE_LIMITED."""

    def __init__(self, message: str, headers: dict[str, str]) -> None:
        super().__init__(200, message, headers)

    def body(self) -> dict[str, Any]:
        return {"errors": [{"type": "RATE_LIMITED", "message": self.message}]}


# --- faults ----------------------------------------------------------------------------


class FaultRule(BaseModel):
    """One injected fault: an error answer, a delay or a lost answer for REST requests
    matching `method` and `route`, or a dropped delivery for a `webhook` rule."""

    model_config = ConfigDict(extra="forbid")

    method: str | None = None
    route: str = ".*"
    status: int | None = Field(default=None, ge=100, le=599)
    rate: float = Field(default=1.0, ge=0, le=1)
    count: int | None = Field(default=None, ge=0)
    retry_after: int | None = Field(default=None, ge=0)
    latency_ms: int = Field(default=0, ge=0)
    ratelimit_remaining_zero: bool = False
    message: str | None = None
    lose_answer: bool = False
    webhook: str | None = None
    action: str | None = None

    @field_validator("route")
    @classmethod
    def _valid_regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @model_validator(mode="after")
    def _one_kind_of_fault(self) -> FaultRule:
        rest_only = {"method", "route", "status", "retry_after", "latency_ms",
                     "ratelimit_remaining_zero", "message", "lose_answer"}
        if self.webhook is not None and self.model_fields_set & rest_only:
            raise ValueError("a webhook rule drops deliveries; it takes only webhook, "
                             "action, rate and count")
        if self.action is not None and self.webhook is None:
            raise ValueError("action narrows a webhook rule; give webhook too")
        if self.lose_answer and (self.status or self.ratelimit_remaining_zero):
            raise ValueError("a lost answer is applied first; it cannot also be an error status")
        return self

    @property
    def is_webhook_rule(self) -> bool:
        return self.webhook is not None

    def matches_request(self, method: str, path: str) -> bool:
        return (not self.is_webhook_rule
                and (not self.method or self.method.upper() == method)
                and re.search(self.route, path) is not None)

    def matches_event(self, name: str, action: str | None) -> bool:
        return self.webhook == name and (self.action is None or self.action == action)


class FaultSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rules: list[FaultRule]
    seed: int | None = None


class Faults:
    def __init__(self, seed: int) -> None:
        self.rules: list[FaultRule] = []
        self.left: list[int | None] = []
        self.rng = random.Random(seed)

    def configure(self, settings: FaultSettings) -> None:
        self.rules = list(settings.rules)
        self.left = [rule.count for rule in self.rules]
        if settings.seed is not None:
            self.rng = random.Random(settings.seed)

    def pick(self, method: str, path: str) -> FaultRule | None:
        """The first active rule for this request; spends one of its `count`."""
        return self._first(lambda rule: rule.matches_request(method, path))

    def drops(self, name: str, action: str | None) -> bool:
        """Whether a webhook rule swallows this delivery; spends one of its `count`."""
        return self._first(lambda rule: rule.matches_event(name, action)) is not None

    def _first(self, matches: Callable[[FaultRule], bool]) -> FaultRule | None:
        for index, rule in enumerate(self.rules):
            if not matches(rule) or self.left[index] == 0:
                continue
            if rule.rate < 1 and self.rng.random() >= rule.rate:
                continue
            left = self.left[index]
            if left is not None:
                self.left[index] = left - 1
            return rule
        return None


def rate_limit_message(budget_key: str) -> str:
    return f"API rate limit exceeded for installation ID {budget_key.removesuffix(GRAPHQL_BUDGET)}."


def fault_error(rule: FaultRule, limits: RateLimits, budget_key: str) -> ApiError:
    status = rule.status or 403
    headers: dict[str, str] = {}
    if rule.retry_after is not None:
        headers["retry-after"] = str(rule.retry_after)
    if rule.ratelimit_remaining_zero:
        headers.update(limits.headers(budget_key, exhausted=True))
        message = rule.message or rate_limit_message(budget_key)
    elif rule.retry_after is not None and status in (403, 429):
        message = rule.message or "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."
    else:
        message = rule.message or STATUS_MESSAGES.get(status, "Server Error")
    return ApiError(status, message, headers)


STATUS_MESSAGES = {
    400: "Bad Request",
    401: "Bad credentials",
    403: "Forbidden",
    404: "Not Found",
    409: "Conflict",
    422: "Validation Failed",
    429: "Too Many Requests",
    500: "Server Error",
    502: "Server Error",
    503: "Service Unavailable",
    504: "We couldn't respond to your request in time. Sorry about that.",
}


# --- rate limits -----------------------------------------------------------------------


@dataclass
class Budget:
    used: int
    reset: datetime


# GraphQL has a budget of its own beside REST's ("core"), per installation alike.
GRAPHQL_BUDGET = "/graphql"


class RateLimits:
    """GitHub's primary rate limit: a budget per installation (or the App) per hour, one
    for REST and one for GraphQL (a key ending in GRAPHQL_BUDGET)."""

    def __init__(self, limit: int, now: Callable[[], datetime]) -> None:
        self.limit = limit
        self.now = now
        self.budgets: dict[str, Budget] = {}

    def budget(self, key: str) -> Budget:
        now = self.now()
        current = self.budgets.get(key)
        if current is None or now >= current.reset:
            current = Budget(0, now.replace(microsecond=0) + RATE_WINDOW)
            self.budgets[key] = current
        return current

    def exhausted(self, key: str) -> bool:
        return self.budget(key).used >= self.limit

    def spend(self, key: str) -> None:
        self.budget(key).used += 1

    def headers(self, key: str, exhausted: bool = False) -> dict[str, str]:
        budget = self.budget(key)
        used = self.limit if exhausted else min(budget.used, self.limit)
        return {
            "x-ratelimit-limit": str(self.limit),
            "x-ratelimit-remaining": str(self.limit - used),
            "x-ratelimit-reset": str(int(budget.reset.timestamp())),
            "x-ratelimit-used": str(used),
            "x-ratelimit-resource": "graphql" if key.endswith(GRAPHQL_BUDGET) else "core",
        }


# --- authentication --------------------------------------------------------------------


# Routes GitHub answers only for the App's JWT, outside /app: "find the installation".
APP_ROUTE_RE = re.compile(r"^/(repos/[^/]+/[^/]+|orgs/[^/]+|users/[^/]+)/installation$")

def credential(header: str | None) -> str | None:
    """The token of an `Authorization: token X` / `Bearer X` header."""
    if not header:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() not in ("token", "bearer") or not value.strip():
        return None
    return value.strip()


class Auth:
    def __init__(self, world: World, strict: bool, app_id: int, public_key: Any) -> None:
        self.world = world
        self.strict = strict
        self.app_id = app_id
        self.public_key = public_key

    def installation_for(self, path: str, header: str | None) -> int | None:
        """The installation a request acts for (None for the App itself or any token).

        Raises a 401 ApiError when GitHub would refuse the credentials.
        """
        if not header:
            raise ApiError(401, "Requires authentication")
        token = credential(header)
        if token is not None:
            self.refuse_withdrawn(token)
        if not self.strict:
            return self.world.token_installation(token) if token else None
        if token is None:
            raise ApiError(401, "Bad credentials")
        if path.startswith("/app/") or path == "/app" or APP_ROUTE_RE.match(path):
            self.verify_jwt(token)
            return None
        installation = self.world.token_installation(token)
        if installation is None:
            raise ApiError(401, "Bad credentials")
        return installation

    def refuse_withdrawn(self, token: str) -> None:
        """GitHub revokes an uninstalled installation's tokens and refuses a suspended one's,
        whether or not authentication is strict."""
        if self.world.revoked(token):
            raise ApiError(401, "Bad credentials")
        if self.world.token_installation(token) in self.world.suspended:
            raise ApiError(403, SUSPENDED)

    def verify_jwt(self, token: str) -> None:
        if self.public_key is None:
            raise ApiError(401, "A JSON web token could not be decoded")
        try:
            claims = jwt.decode(
                token,
                self.public_key,
                algorithms=["RS256"],
                options={"verify_exp": False, "verify_iat": False, "verify_nbf": False,
                         "verify_iss": False, "require": ["iat", "exp", "iss"]},
            )
        except jwt.PyJWTError:
            raise ApiError(401, "A JSON web token could not be decoded") from None
        if str(claims["iss"]) != str(self.app_id):
            raise ApiError(401, "Integration not found: 'iss' names another App")
        now = self.world.now().timestamp()
        if not isinstance(claims["exp"], (int, float)) or claims["exp"] <= now:
            raise ApiError(401, "'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires")
        if claims["exp"] > now + JWT_MAX_LIFETIME + JWT_SKEW:
            raise ApiError(401, "'Expiration time' claim ('exp') is too far in the future")
        if not isinstance(claims["iat"], (int, float)) or claims["iat"] > now + JWT_SKEW:
            raise ApiError(401, "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued")


# --- request log -----------------------------------------------------------------------


class RequestLog:
    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def record(self, method: str, path: str, route: str, status: int, at: datetime,
               lost: bool = False, query: str = "") -> None:
        """`lost`: the request was applied but its answer never reached the client."""
        self.entries.append({"method": method, "path": path, "query": query, "route": route,
                             "status": status, "at": ts(at), "lost": lost})

    def reset(self) -> None:
        self.entries.clear()

    def document(self) -> dict[str, Any]:
        by_route: dict[str, int] = {}
        for entry in self.entries:
            by_route[entry["route"]] = by_route.get(entry["route"], 0) + 1
        return {"total": len(self.entries), "by_route": by_route,
                "requests": list(self.entries)}
