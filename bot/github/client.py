"""Klaud's one GitHub client: App JWT, installation tokens, retries, rate limits, dry run.

gidgethub's aiohttp `GitHubAPI` formats URLs, builds headers, encodes bodies, keeps the
ETag cache and raises on error statuses. `_KlaudAPI._request` wraps every HTTP exchange
with what a GitHub App needs on top: credentials, retries with backoff, the per-installation
rate-limit gate, write spacing, dry run, logging and metrics. Callers see only
`InstallationClient` and the typed errors below, never aiohttp's or gidgethub's.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import (
    AbstractAsyncContextManager,
    asynccontextmanager,
    contextmanager,
    nullcontext,
    suppress,
)
from contextvars import ContextVar
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from functools import partial
from http import HTTPStatus
from operator import itemgetter
from typing import Any, NamedTuple
from urllib.parse import unquote, urlencode, urljoin, urlsplit

import aiohttp
import cachetools
import gidgethub
import gidgethub.aiohttp
import jwt
import structlog
from gidgethub import sansio

from bot.core.clock import Clock
from bot.core.domain import parse_time
from bot.github.errors import (
    BadRequest,
    Conflict,
    GitHubError,
    NotFound,
    NotSent,
    RateLimited,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from bot.metrics import GITHUB_RATE_LIMIT_REMAINING, GITHUB_REQUESTS

log = structlog.get_logger(__name__)

WRITE_METHODS = frozenset({"POST", "PATCH", "PUT", "DELETE"})


_REPOSITORY_PATH = re.compile(r"/repos/([^/]+)/([^/]+)(?:/|$)")


def repository_of(url: str) -> str | None:
    """`owner/name` of the repository a REST URL names (`…/repos/{owner}/{repo}/…`)."""
    found = _REPOSITORY_PATH.search(urlsplit(url).path)
    return f"{unquote(found[1])}/{unquote(found[2])}" if found else None


def graphql_endpoint(base_url: str) -> str:
    """GitHub's GraphQL endpoint beside a REST base: `/graphql`, or GHE's `/api/graphql`."""
    base = base_url.rstrip("/")
    if base.endswith("/api/v3"):
        return base[: -len("/v3")] + "/graphql"
    return base + "/graphql"


def changes_state(method: str, url: str) -> bool:
    """Whether a request may change something on GitHub.

    GraphQL is sent as POST, but Klaud only queries it (blame): those POSTs are reads, safe
    to repeat, and not spaced like writes.
    """
    return method in WRITE_METHODS and not urlsplit(url).path.endswith("/graphql")
RETRY_STATUSES = frozenset({500, 502, 503, 504})
KNOWN_STATUSES = frozenset(status.value for status in HTTPStatus)
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
# GitHub rejects a JWT whose `iat` lies in its future; backdating absorbs clock drift.
JWT_BACKDATE = 60
JWT_LIFETIME = 9 * 60
TOKEN_RENEW_MARGIN = 5 * 60
TOKEN_REPLICATION_LAG = 10.0  # seconds a new installation token may be refused by some servers
# GitHub asks to wait at least a minute after a secondary rate limit without headers.
SECONDARY_RATE_LIMIT_WAIT = 60.0
MAX_SECONDARY_WAIT = 15 * 60.0
# The longest rate limits are waited out inside a call, all its attempts together. Longer,
# the call fails at once with RateLimited(retry_after): a handler or the scheduler's tick
# (which serves every repository in turn) must not sleep an hour to the quota's reset; the
# inbox retries the delivery then.
MAX_CALL_WAIT = 60.0
# No wait GitHub asks for is believed beyond this: its quotas reset within the hour.
MAX_RATE_LIMIT_WAIT = 3600.0
MAX_BACKOFF = 30.0
# The longest an artifact's archive is downloaded for, however steadily its bytes come.
MAX_BLOB_SECONDS = 600.0
# Per installation, in bytes of the answers as received (decoded they take a few times more):
# a count alone let a thousand pages of pull-request files, up to 3 MB each, be kept. Room
# for the open pull requests' listing of a busy repository (10 pages of 100, ~2.5 MB each)
# and a thousand single answers besides: a scan larger than the cache would hit nothing.
ETAG_CACHE_BYTES = 32 * 1024 * 1024
ETAG_ENTRY_OVERHEAD = 512  # the key, the ETag and the entry's own objects
TOKEN_CACHE_SIZE = 4096
DOWNLOAD_CHUNK = 64 * 1024
ERROR_BODY_LIMIT = 64 * 1024
ITEMS_KEY = "items"
GRAPHQL_RATE_LIMITED = frozenset({"RATE_LIMITED", "RATE_LIMIT"})
GRAPHQL_TIMED_OUT = re.compile(r"something went wrong while executing your query|timeout", re.IGNORECASE)
# What one listing may yield: 200 full pages. A Link header that always names a next page
# (a broken proxy, a paging bug) would otherwise be followed for ever. Listing fails rather
# than end early: callers act on what a listing leaves out (a PR not listed is closed).
MAX_LISTED = 20_000
MAX_API_HOPS = 3  # redirects within the API before an artifact's storage redirect
MAX_PAGES = MAX_LISTED // 30 + 1  # at GitHub's default page size


def translate(exc: gidgethub.HTTPException, *, now: float) -> GitHubError:
    """Map one of gidgethub's HTTP errors onto Klaud's small set."""
    return error_for(int(exc.status_code), exc.headers, str(exc), now=now)


def error_for(status: int, headers: Mapping[str, str], message: str, *, now: float) -> GitHubError:
    if status in (404, 410):
        return NotFound(status, message)
    if status in (409, 422):
        return Conflict(status, message)
    if status == 401:
        return Unauthorized(status, message)
    wait = rate_limit_wait(status, headers, message, now=now, attempt=1)
    if wait is not None:
        return RateLimited(status, message, retry_after=wait)
    if status >= 500:
        return Unavailable(status, message)
    if status >= 400:
        return BadRequest(status, message)
    return GitHubError(status, message)


@contextmanager
def _github_errors(clock: Clock) -> Iterator[None]:
    try:
        yield
    except gidgethub.HTTPException as exc:
        raise translate(exc, now=clock.timestamp()) from exc
    # A body labelled JSON that is not (a proxy's truncated answer): GitHub unwell, not a bug.
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise Unavailable(None, f"an answer that is not the JSON it says it is: {exc}") from exc


# ------------------------------------------------------------------ pure decisions


def _unlisted_status(method: str, url: str, response: _Response) -> GitHubError:
    message = _message_of(response.body) or f"answered {response.status}"
    if response.status >= 500:
        return Unavailable(response.status, message, maybe_applied=changes_state(method, url))
    return BadRequest(response.status, message)


def _readable_json(response: _Response) -> bool:
    if not response.headers.get("content-type", "").startswith("application/json") or not response.body:
        return True
    try:
        json.loads(response.body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return True


def backoff_delay(attempt: int, *, base: float = 1.0, cap: float = MAX_BACKOFF) -> float:
    """Exponential backoff with jitter: half the ceiling fixed, half random.

    The fixed half keeps a retry from firing at once; the random half keeps many clients
    that failed together from retrying together.
    """
    ceiling = min(cap, base * 2 ** (attempt - 1))
    return ceiling / 2 + random.random() * ceiling / 2


def is_rate_limited(status: int, headers: Mapping[str, str], message: str) -> bool:
    if status not in (403, 429):
        return False
    if "retry-after" in headers or headers.get("x-ratelimit-remaining") == "0":
        return True
    # A 403 is usually a permission problem; only its message tells a secondary limit apart.
    lowered = message.lower()
    return status == 429 or "rate limit" in lowered or "abuse" in lowered


def rate_limit_wait(
    status: int, headers: Mapping[str, str], message: str, *, now: float, attempt: int
) -> float | None:
    """Seconds to wait before retrying a rate-limited answer; None when it is not one."""
    if not is_rate_limited(status, headers, message):
        return None
    retry_after = headers.get("retry-after")
    if retry_after is not None:
        return _retry_after_seconds(retry_after, now=now)
    reset_in = _reset_in(headers, now=now)
    if headers.get("x-ratelimit-remaining") == "0" and reset_in is not None:
        # At least a second, so a reset that our clock already passed does not spin.
        return _believable(max(reset_in, 1.0))
    return min(SECONDARY_RATE_LIMIT_WAIT * 2 ** min(attempt - 1, 8), MAX_SECONDARY_WAIT)


def _reset_in(headers: Mapping[str, str], *, now: float) -> float | None:
    """Seconds until the quota resets, by GitHub's clock (its answer's Date) when it says:
    `x-ratelimit-reset` is GitHub's time, and ours may run minutes apart from it (ahead,
    the calls before the reset were each spent on a 403)."""
    reset = _seconds(headers.get("x-ratelimit-reset"))
    if reset is None:
        return None
    try:
        github_now = parsedate_to_datetime(headers["date"]).timestamp()
    except (KeyError, TypeError, ValueError):
        github_now = now
    return reset - github_now


def _retry_after_seconds(value: str, *, now: float) -> float:
    seconds = _seconds(value)
    if seconds is None:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - now
        except (TypeError, ValueError):
            return SECONDARY_RATE_LIMIT_WAIT
    return _believable(max(seconds, 0.0))


def _seconds(value: str | None) -> float | None:
    """A header's number of seconds; None when absent or not a finite number (`nan`, `inf`)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and math.isfinite(seconds) else None


def _believable(wait: float) -> float:
    return min(wait, MAX_RATE_LIMIT_WAIT)


_ROUTES = (
    "/graphql",
    "/app",
    "/app/installations",
    "/app/installations/{installation_id}",
    "/app/installations/{installation_id}/access_tokens",
    "/installation/repositories",
    "/rate_limit",
    "/repos/{owner}/{repo}",
    "/repos/{owner}/{repo}/actions/artifacts",
    "/repos/{owner}/{repo}/actions/artifacts/{artifact_id}",
    "/repos/{owner}/{repo}/actions/artifacts/{artifact_id}/{archive_format}",
    "/repos/{owner}/{repo}/actions/runs",
    "/repos/{owner}/{repo}/actions/runs/{run_id}",
    "/repos/{owner}/{repo}/actions/runs/{run_id}/artifacts",
    "/repos/{owner}/{repo}/actions/runs/{run_id}/attempts/{attempt_number}",
    "/repos/{owner}/{repo}/actions/workflows/{workflow_id}",
    "/repos/{owner}/{repo}/actions/workflows/{workflow_id}/dispatches",
    "/repos/{owner}/{repo}/actions/workflows/{workflow_id}/runs",
    "/repos/{owner}/{repo}/branches/{branch}",
    "/repos/{owner}/{repo}/check-runs",
    "/repos/{owner}/{repo}/check-runs/{check_run_id}",
    "/repos/{owner}/{repo}/collaborators/{username}/permission",
    "/repos/{owner}/{repo}/commits",
    "/repos/{owner}/{repo}/commits/{ref}/check-runs",
    "/repos/{owner}/{repo}/commits/{ref}",
    "/repos/{owner}/{repo}/compare/{basehead}",
    "/repos/{owner}/{repo}/contents",
    "/repos/{owner}/{repo}/contents/{path}",
    "/repos/{owner}/{repo}/dispatches",
    "/repos/{owner}/{repo}/git/blobs/{sha}",
    "/repos/{owner}/{repo}/git/commits/{sha}",
    "/repos/{owner}/{repo}/git/matching-refs/{ref}",
    "/repos/{owner}/{repo}/git/ref/{ref}",
    "/repos/{owner}/{repo}/git/refs",
    "/repos/{owner}/{repo}/git/refs/{ref}",
    "/repos/{owner}/{repo}/git/trees/{sha}",
    "/repos/{owner}/{repo}/installation",
    "/repos/{owner}/{repo}/issues/comments/{comment_id}",
    "/repos/{owner}/{repo}/issues/comments/{comment_id}/reactions",
    "/repos/{owner}/{repo}/issues/{number}",
    "/repos/{owner}/{repo}/issues/{number}/comments",
    "/repos/{owner}/{repo}/issues/{number}/labels",
    "/repos/{owner}/{repo}/pulls",
    "/repos/{owner}/{repo}/pulls/{number}",
    "/repos/{owner}/{repo}/pulls/{number}/commits",
    "/repos/{owner}/{repo}/pulls/{number}/files",
    "/repositories/{repository_id}",
)
_NUMERIC_VARS = frozenset(
    {"number", "installation_id", "artifact_id", "run_id", "attempt_number", "check_run_id", "comment_id",
     "repository_id"}
)
# Ref names, file paths and compare specs contain slashes.
_MULTI_SEGMENT_VARS = frozenset({"path", "ref", "basehead", "branch"})


def _variable_regex(name: str) -> str:
    if name in _NUMERIC_VARS:
        return r"\d+"
    return ".+" if name in _MULTI_SEGMENT_VARS else "[^/]+"


def _route_pattern(template: str) -> re.Pattern[str]:
    # re.split with a group alternates literal text (even places) and variable names.
    parts = re.split(r"\{(\w+)\}", template)
    return re.compile(
        "".join(re.escape(part) if i % 2 == 0 else _variable_regex(part) for i, part in enumerate(parts))
    )


_ROUTE_PATTERNS = tuple((_route_pattern(template), template) for template in _ROUTES)
# The literal segments an unknown path may keep in its label: those of Klaud's own routes
# (a `next` link or a download URL from an answer can name any path at all).
_KNOWN_HEADS = frozenset(template.split("/")[1] for template in _ROUTES)
_KNOWN_REPO_PARTS = frozenset(
    template.split("/")[4] for template in _ROUTES if template.startswith("/repos/{owner}/{repo}/")
)


def route_template(path: str) -> str:
    """The route template of a concrete API path, for metric labels and logs.

    Unknown paths collapse to their leading literal segment, if one of Klaud's routes has
    it (else `{other}`), so that a label never carries a name, number or sha and the
    metric's cardinality stays bounded.
    """
    path = "/" + path.split("?", 1)[0].strip("/")
    for pattern, template in _ROUTE_PATTERNS:
        if pattern.fullmatch(path):
            return template
    segments = path.strip("/").split("/")
    if segments[0] == "repos" and len(segments) >= 3:
        part = (segments[3] if segments[3] in _KNOWN_REPO_PARTS else "{other}") if len(segments) > 3 else ""
        head = "/repos/{owner}/{repo}" + (f"/{part}" if part else "")
        return head + ("/{rest}" if len(segments) > 4 else "")
    head = segments[0] if segments[0] in _KNOWN_HEADS else "{other}"
    return f"/{head}" + ("/{rest}" if len(segments) > 1 else "")


DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the scheme's default port made explicit.

    `https://ghe.example.com:443/api/v3` and the `https://ghe.example.com/…` URLs its API
    returns are one origin: the token must go to both, and only to them.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or DEFAULT_PORTS.get(scheme)


def _message_of(body: bytes) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    return str(data.get("message", "")) if isinstance(data, dict) else ""


def _with_params(url: str, params: Mapping[str, Any] | None) -> str:
    if not params:
        return url
    return url + ("&" if "?" in url else "?") + urlencode(params)


# ------------------------------------------------------------ per-installation state


# A file's contents as they are (its JSON form leaves out files over 1 MB).
RAW_MEDIA_TYPE = "application/vnd.github.raw"


class _Response(NamedTuple):
    """What gidgethub's `_request` returns: status, headers, body."""

    status: int
    headers: Mapping[str, str]
    body: bytes


# The media type of the GET in progress in this task, read by its conditional-request cache.
_ACCEPT: ContextVar[str] = ContextVar("klaud_accept", default="")
# The size of the answer last received in this task: gidgethub caches what it decoded from it.
_ANSWER_BYTES: ContextVar[int] = ContextVar("klaud_answer_bytes", default=0)
# An answer at a commit's sha never changes and is not asked for again: not worth keeping.
_PINNED_TO_A_COMMIT = re.compile(r"[?&]ref=[0-9a-f]{40}(?:&|$)")


class _ConditionalCache:
    """gidgethub's cache of ETags and answers, keyed by URL *and* media type.

    GitHub gives a file's JSON and raw forms one ETag and answers either's If-None-Match
    with 304: keyed by URL alone, the raw read of a config over 1 MB got the cached JSON,
    and every family of that file was dropped. Answers pinned to a commit are not kept
    (one per push and config file, a few hundred KB each, none ever asked again).
    Bounded by the bytes of the answers kept: least recently used first out.
    """

    def __init__(self, max_bytes: int) -> None:
        # Each value is (gidgethub's entry, its size in bytes).
        self._entries: cachetools.LRUCache[tuple[str, str], tuple[Any, int]] = cachetools.LRUCache(
            maxsize=max_bytes, getsizeof=itemgetter(1)
        )

    def __getitem__(self, url: str) -> Any:
        entry = self._entries[(_ACCEPT.get(), url)][0]
        if _full_last_page(url, entry):
            # GitHub answers a page's If-None-Match with 304 when its items are the same,
            # and gidgethub then keeps the cached next link: a page added after this full
            # one (a 101st comment, where Klaud looks for its own replies) was never read.
            raise KeyError(url)
        return entry

    def __setitem__(self, url: str, entry: Any) -> None:
        if _PINNED_TO_A_COMMIT.search(url):
            return
        key = (_ACCEPT.get(), url)
        size = _ANSWER_BYTES.get() + ETAG_ENTRY_OVERHEAD
        if size > self._entries.maxsize:
            self._entries.pop(key, None)  # an older, smaller answer of it is out of date
            return
        self._entries[key] = (entry, size)


# GitHub's page size when a listing does not ask for one.
DEFAULT_PER_PAGE = 30
_PER_PAGE = re.compile(r"[?&]per_page=(\d+)")


def _full_last_page(url: str, entry: Any) -> bool:
    """A cached listing page with as many items as a page holds and no next page."""
    _etag, _modified, data, more = entry
    if more is not None:
        return False
    if isinstance(data, dict):  # {"total_count", "workflow_runs": [...]} and the like
        data = next((value for value in data.values() if isinstance(value, list)), None)
    asked = _PER_PAGE.search(url)
    return isinstance(data, list) and len(data) >= (int(asked[1]) if asked else DEFAULT_PER_PAGE)


BUDGETS = ("core", "graphql")


def _budget_of(url: str) -> str:
    """Which of GitHub's rate-limit budgets (`x-ratelimit-resource`) a request spends."""
    return "graphql" if urlsplit(url).path.endswith("/graphql") else "core"


class _RateGate:
    """Holds back every call of one installation while GitHub says it is rate limited."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.blocked_until = 0.0

    def block_until(self, when: float) -> None:
        self.blocked_until = max(self.blocked_until, when)

    async def wait(self, deadline: float) -> None:
        """Wait while the gate is closed; RateLimited when it stays closed past `deadline`."""
        while (left := self.blocked_until - self._clock.timestamp()) > 0:
            if self.blocked_until > deadline:
                raise RateLimited(None, f"rate limited for {left:.0f} s more", retry_after=left)
            await self._clock.sleep(left)


class _WriteSpacer:
    """Sends one installation's writes one at a time, `spacing` seconds apart, times the
    number of processes writing for it (`writers`: replicas each write for theirs).

    GitHub's secondary rate limits punish bursts of writes; serial writes with a pause
    between them are what its guidelines ask for, per installation, whichever process
    sends them.
    """

    def __init__(self, clock: Clock, spacing: float, writers: Callable[[], int] | None) -> None:
        self._clock = clock
        self._spacing = spacing
        self._writers = writers
        self._lock = asyncio.Lock()
        self._last: float | None = None

    @asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        async with self._lock:
            if self._last is not None:
                spacing = self._spacing * max(1, self._writers() if self._writers else 1)
                left = self._last + spacing - self._clock.timestamp()
                if left > 0:
                    await self._clock.sleep(left)
            try:
                yield
            finally:
                self._last = self._clock.timestamp()


Credential = Callable[[str | None], Awaitable[str]]
"""Given the Authorization value GitHub just rejected (or None), the value to send."""

Reader = Callable[[aiohttp.ClientResponse], Awaitable[_Response]]


async def _read_all(response: aiohttp.ClientResponse) -> _Response:
    return _Response(response.status, response.headers, await response.read())


async def _read_capped(response: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    if response.status != 200:
        # An error's body only feeds the error message; the cap guards the payload.
        return await _read_at_most(response, ERROR_BODY_LIMIT)
    announced = response.content_length
    if announced is not None and announced > max_bytes:
        raise TooLarge(None, f"{announced} bytes announced, limit {max_bytes}")
    received = await _read_at_most(response, max_bytes + 1)
    if len(received) > max_bytes:
        raise TooLarge(None, f"more than {max_bytes} bytes received")
    return received


async def _read_at_most(response: aiohttp.ClientResponse, limit: int) -> bytes:
    received = bytearray()
    async for chunk in response.content.iter_chunked(DOWNLOAD_CHUNK):
        received += chunk
        if len(received) >= limit:
            break
    return bytes(received[:limit])


@dataclass(frozen=True)
class _Transport:
    """What every API object of one App shares."""

    session: aiohttp.ClientSession
    base_url: str
    user_agent: str
    clock: Clock
    timeout: aiohttp.ClientTimeout
    max_attempts: int
    write_spacing: float
    # How many processes write for an installation (live replicas); None: this one only.
    writers: Callable[[], int] | None = None
    # Awaited with the URL right before each send of an installation's request that changes
    # GitHub (every attempt, after its waits): the state that led to it is committed first (a
    # claim is durable before the dispatch it guards), and with replicas a repository this one
    # no longer holds is not written.
    before_write: Callable[[str], Awaitable[None]] | None = None


class _KlaudAPI(gidgethub.aiohttp.GitHubAPI):
    """gidgethub's API object for one credential: the App itself or one installation."""

    def __init__(
        self,
        transport: _Transport,
        *,
        label: str,
        credential: Credential,
        dry_run: bool,
        creates_are_safe: bool,
        etag_cache: _ConditionalCache | None,
    ) -> None:
        super().__init__(
            transport.session, transport.user_agent, cache=etag_cache, base_url=transport.base_url
        )
        self._transport = transport
        self._clock = transport.clock
        self._label = label
        self._credential = credential
        self._dry_run = dry_run
        self._creates_are_safe = creates_are_safe
        # The App's own writes only mint tokens; an installation's act on its repositories.
        self._acts_on_repositories = label != "app"
        # GitHub budgets REST ("core") and GraphQL apart: one spent must not hold the other.
        self._gates: defaultdict[str, _RateGate] = defaultdict(lambda: _RateGate(transport.clock))
        self._writes = _WriteSpacer(transport.clock, transport.write_spacing, transport.writers)
        self._origin = origin_of(transport.base_url)
        self._base_path = urlsplit(transport.base_url).path.rstrip("/")
        # GitHub Enterprise Server's is /api/graphql, beside its REST /api/v3.
        self._graphql_path = urlsplit(graphql_endpoint(transport.base_url)).path

    async def sleep(self, seconds: float) -> None:
        await self._clock.sleep(seconds)

    async def _make_request(
        self, method: str, url: str, url_vars: Any, data: Any, accept: str, *args: Any, **kwargs: Any
    ) -> tuple[Any, str | None, int]:
        media = _ACCEPT.set(accept)  # for the conditional-request cache's key
        try:
            return await super()._make_request(method, url, url_vars, data, accept, *args, **kwargs)
        finally:
            _ACCEPT.reset(media)

    async def getiter(  # type: ignore[override]
        self, url: str, url_vars: Any = None, *, iterable_key: str | None = ITEMS_KEY, **kwargs: Any
    ) -> AsyncIterator[Any]:
        """gidgethub's listing, guarded: a `next` page already read, an empty page naming a
        next one, or more than MAX_PAGES pages end it with an error (empty pages that always
        named a next one, from a broken proxy, were read for ever, thousands a second)."""
        accept = kwargs.pop("accept", sansio.accept_format())
        read: set[str] = set()
        current: str | None = url
        while current:
            if current in read or len(read) >= MAX_PAGES:
                raise BadRequest(None, f"{route_template(url)}: the listing's pages do not end; stopped")
            read.add(current)
            data, current, _ = await self._make_request("GET", current, url_vars or {}, b"", accept, **kwargs)
            if isinstance(data, dict) and iterable_key in data:
                data = data[iterable_key]
            if not data and current:
                raise BadRequest(None, f"{route_template(url)}: an empty page names a next one; stopped")
            for item in data:
                yield item

    async def _request(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes = b""
    ) -> tuple[int, Mapping[str, str], bytes]:
        if self._dry_run and changes_state(method, url):
            return self._pretend(method, url, body)
        response = await self._exchange(method, url, headers, body, read=_read_all)
        _ANSWER_BYTES.set(len(response.body))
        if response.status not in KNOWN_STATUSES:
            # gidgethub reads the status as an http.HTTPStatus: a proxy's 520 raised a bare
            # ValueError, neither transient nor "maybe applied".
            raise _unlisted_status(method, url, response)
        if 200 <= response.status < 300 and changes_state(method, url) and not _readable_json(response):
            # Done, by its status: an answer cut short must not read as "not applied" (a
            # dispatch that started a run, released and dispatched again).
            raise Unavailable(response.status, "a write's answer that is not the JSON it says it is",
                              maybe_applied=True)
        if response.status >= 400 and _budget_of(url) == "graphql":
            # gidgethub's GraphQL errors keep no headers: a 403 whose Retry-After alone says
            # it is a limit would be taken for a bad query. Classified here, with them.
            message = _message_of(response.body) or f"GraphQL answered {response.status}"
            raise error_for(response.status, response.headers, message, now=self._clock.timestamp())
        if response.headers.get("content-type", "").startswith(RAW_MEDIA_TYPE):
            # gidgethub decodes a text answer strictly: one bad byte in a config over 1 MB
            # (read raw) failed every read as if GitHub were down. As in a file's JSON form,
            # where file_text decodes the content itself: U+FFFD, and the YAML parser says why.
            response = response._replace(body=response.body.decode("utf-8", "replace").encode())
        return response

    async def download(self, url: str, *, max_bytes: int) -> bytes:
        target = sansio.format_url(url, {}, base_url=self.base_url)
        headers = sansio.create_headers(self.requester)
        read = partial(self._read_artifact, max_bytes=max_bytes)
        response = await self._exchange(
            "GET", target, headers, b"", read=read, allow_redirects=False
        )
        if response.status != 200:
            message = _message_of(response.body) or f"download answered {response.status}"
            raise error_for(response.status, response.headers, message, now=self._clock.timestamp())
        return response.body

    def _pretend(self, method: str, url: str, body: bytes) -> _Response:
        log.info(
            "github.dry_run",
            method=method,
            route=self._route(url),
            path=urlsplit(url).path,
            body=json.loads(body) if body else None,
            installation=self._label,
        )
        if method == "DELETE":
            return _Response(204, {}, b"")
        return _Response(200, {"content-type": "application/json"}, b"{}")

    def _may_repeat(self, method: str, url: str) -> bool:
        """Whether a request that may have reached GitHub can be sent again blindly."""
        return method != "POST" or self._creates_are_safe or not changes_state(method, url)

    def _turn(self, method: str, url: str) -> AbstractAsyncContextManager[None]:
        return self._writes.turn() if changes_state(method, url) else nullcontext()

    async def _exchange(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        *,
        read: Reader,
        allow_redirects: bool = True,
    ) -> _Response:
        headers = dict(headers)
        rejected: str | None = None
        attempt = 1
        # Each wait alone was capped: four answers asking for 60 s held one call 4 minutes.
        deadline = self._clock.timestamp() + MAX_CALL_WAIT
        while True:
            try:
                gate = self._gates[_budget_of(url)]
                await gate.wait(deadline)
                async with self._turn(method, url):
                    # Again: the gate may have closed while this call waited for its turn.
                    await gate.wait(deadline)
                    await self._credentials_for(headers, url, rejected)
                    # Last: a write that waited (the gate, up to a minute; its turn; a retry)
                    # may no longer be this replica's to send by now.
                    await self._before_write(method, url)
                    response = await self._send(
                        method, url, headers, body, read=read, allow_redirects=allow_redirects
                    )
            except (aiohttp.ClientError, TimeoutError) as exc:
                failure = Unavailable(None, f"{type(exc).__name__}: {exc}", maybe_applied=changes_state(method, url))
                if not self._may_repeat(method, url) or attempt >= self._transport.max_attempts:
                    raise failure from exc
                await self._clock.sleep(backoff_delay(attempt))
                attempt += 1
                continue
            self._note_rate_limit(url, response.headers)
            if response.status == 401 and "authorization" in headers and attempt < self._transport.max_attempts:
                # GitHub refused the credential before doing anything, so sending again is
                # safe, after a backoff: with a new token (or the same one while it may still
                # be replicating); one GitHub keeps refusing ends as Unauthorized (transient:
                # the delivery retries later).
                rejected = headers["authorization"]
                await self._clock.sleep(backoff_delay(attempt))
                attempt += 1
                continue
            if not await self._ready_to_retry(method, url, response, attempt):
                return response
            attempt += 1

    async def _ready_to_retry(self, method: str, url: str, response: _Response, attempt: int) -> bool:
        """Wait as long as the answer asks and say whether to send again.

        False hands the answer back to gidgethub, which raises for an error status.
        """
        if response.status < 400:
            return False
        message = _message_of(response.body)
        now = self._clock.timestamp()
        wait = rate_limit_wait(response.status, response.headers, message, now=now, attempt=attempt)
        if wait is not None:
            # The gate does the waiting, for this call and the installation's others.
            self._gates[_budget_of(url)].block_until(now + wait)
            log.info("github.rate_limited", route=self._route(url), wait=wait, installation=self._label)
            return attempt < self._transport.max_attempts
        if response.status not in RETRY_STATUSES:
            return False
        if not self._may_repeat(method, url):
            raise Unavailable(response.status, message, maybe_applied=True)
        if attempt >= self._transport.max_attempts:
            return False
        await self._clock.sleep(backoff_delay(attempt))
        return True

    async def _before_write(self, method: str, url: str) -> None:
        if self._acts_on_repositories and self._transport.before_write is not None and changes_state(method, url):
            try:
                await self._transport.before_write(url)
            # The hook's (the store's), in the request loop: taken there for GitHub not
            # answering, a write was sent again with its cause uncommitted, and a dispatch
            # reported as maybe sent.
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise NotSent(f"{url}: not sent: {type(exc).__name__}: {exc}") from exc

    async def _credentials_for(self, headers: dict[str, str], url: str, rejected: str | None) -> None:
        try:
            await self._authorize(headers, url, rejected)
        except Unavailable as exc:
            # Minting the token is a POST of its own, whose lost answer is "maybe applied":
            # this request was not sent at all (a dispatch taken for a lost answer kept its
            # claim until the claim keeper found no run).
            # No answer came back for this request (it was not sent): not its status, which a
            # caller may read as the request's own (a 500 the comparison answered).
            raise Unavailable(None, f"not sent, no installation token: {exc}") from exc

    async def _authorize(self, headers: dict[str, str], url: str, rejected: str | None) -> None:
        # The credential goes only to the API's own origin, never to a host a URL from a
        # response points at.
        if origin_of(url) == self._origin:
            headers["authorization"] = await self._credential(rejected)
        else:
            headers.pop("authorization", None)

    async def _send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes,
        *,
        read: Reader,
        allow_redirects: bool,
    ) -> _Response:
        started = time.perf_counter()
        outcome = "error"
        try:
            async with self._transport.session.request(
                method,
                url,
                headers=headers,
                data=body,
                timeout=self._transport.timeout,
                allow_redirects=allow_redirects,
            ) as response:
                outcome = str(response.status)
                if response.method != method:
                    # aiohttp follows a 301/302/303 answer to a write with a GET (307/308 keep
                    # the method): the write was not made, and the GET's answer would be taken
                    # for its result (a claim "made", a comment "posted").
                    first = response.history[0].status if response.history else response.status
                    raise BadRequest(first, f"{method} answered with a redirect to {response.url.path}: not made")
                return await read(response)
        except TimeoutError:
            outcome = "timeout"
            raise
        finally:
            self._observe(method, url, outcome, started)

    async def _read_artifact(self, response: aiohttp.ClientResponse, *, max_bytes: int, hops: int = 0) -> _Response:
        location = response.headers.get("location")
        if response.status not in REDIRECT_STATUSES or location is None or hops >= MAX_API_HOPS:
            return _Response(response.status, response.headers, await _read_capped(response, max_bytes))
        target = urljoin(str(response.url), location)
        if self._within_api(target):
            # Still the API (a renamed repository's old URL answers with its new one): this
            # hop needs the token, and answers with the storage redirect in turn.
            headers = {"user-agent": self.requester, "authorization": await self._credential(None)}
            async with self._transport.session.get(
                target, headers=headers, timeout=self._transport.timeout, allow_redirects=False
            ) as hop:
                return await self._read_artifact(hop, max_bytes=max_bytes, hops=hops + 1)
        # The blob URL carries its own signature; GitHub's token must not travel with it.
        started = time.perf_counter()
        async with self._transport.session.get(
            target, headers={"user-agent": self.requester}, timeout=self._blob_timeout()
        ) as blob:
            log.debug(
                "github.blob",
                status=blob.status,
                duration_ms=round((time.perf_counter() - started) * 1000, 1),
                installation=self._label,
            )
            return _Response(blob.status, blob.headers, await _read_capped(blob, max_bytes))

    def _blob_timeout(self) -> aiohttp.ClientTimeout:
        """An archive may take longer than one answer's whole timeout (64 MiB at 2 MB/s is
        32 s: such a read failed at every retry): it is given up when no byte comes for that
        long, or after MAX_BLOB_SECONDS."""
        each = self._transport.timeout.total
        return aiohttp.ClientTimeout(total=MAX_BLOB_SECONDS, sock_connect=each, sock_read=each)

    def _observe(self, method: str, url: str, outcome: str, started: float) -> None:
        route = self._route(url)
        GITHUB_REQUESTS.labels(method=method, route=route, status=outcome).inc()
        log.debug(
            "github.request",
            method=method,
            route=route,
            status=outcome,
            duration_ms=round((time.perf_counter() - started) * 1000, 1),
            installation=self._label,
        )

    def _note_rate_limit(self, url: str, headers: Mapping[str, str]) -> None:
        remaining = _seconds(headers.get("x-ratelimit-remaining"))  # a count, read alike
        if remaining is None:
            return
        GITHUB_RATE_LIMIT_REMAINING.labels(installation=self._label).set(remaining)
        now = self._clock.timestamp()
        reset_in = _reset_in(headers, now=now)
        if remaining == 0 and reset_in is not None:
            # The quota is spent: hold the installation's next calls instead of spending
            # one request each on a 403.
            budget = headers.get("x-ratelimit-resource") or _budget_of(url)
            # Only the budgets Klaud's calls wait on: a gate per name an answer gave was kept
            # for the life of the process, and never waited on.
            if budget in BUDGETS:
                self._gates[budget].block_until(now + min(reset_in, MAX_RATE_LIMIT_WAIT))

    def _within_api(self, url: str) -> bool:
        """Whether `url` is one of the API's own (its origin, under its base path)."""
        path = urlsplit(url).path
        return origin_of(url) == self._origin and (not self._base_path or path.startswith(self._base_path + "/"))

    def _route(self, url: str) -> str:
        if origin_of(url) != self._origin:
            return "(external)"
        path = urlsplit(url).path
        if path == self._graphql_path:
            return "/graphql"
        if self._base_path and path.startswith(self._base_path + "/"):
            path = path[len(self._base_path) :]
        return route_template(path)


# -------------------------------------------------------------------- public API


class InstallationClient:
    """GitHub as one installation of the App sees it."""

    def __init__(
        self, api: _KlaudAPI, installation_id: int, *, clock: Clock, max_attempts: int, app_id: int | None = None
    ) -> None:
        self.installation_id = installation_id
        self.app_id = app_id  # the App this client acts as, when known (not with a plain token)
        self._api = api
        self._clock = clock
        self._max_attempts = max_attempts

    async def getitem(
        self,
        url: str,
        url_vars: dict[str, Any] | None = None,
        *,
        params: dict[str, Any] | None = None,
        accept: str | None = None,
    ) -> Any:
        """One GET; `accept` asks for another media type (e.g. a file's raw text)."""
        with _github_errors(self._clock):
            if accept is None:
                return await self._api.getitem(_with_params(url, params), url_vars or {})
            return await self._api.getitem(_with_params(url, params), url_vars or {}, accept=accept)

    async def getiter(
        self, url: str, url_vars: dict[str, Any] | None = None, *, iterable_key: str | None = None
    ) -> AsyncIterator[Any]:
        """Every item of every page, following `Link: rel="next"`, at most MAX_LISTED."""
        listed = 0
        with _github_errors(self._clock):
            async for item in self._api.getiter(
                url, url_vars or {}, iterable_key=iterable_key or ITEMS_KEY
            ):
                listed += 1
                if listed > MAX_LISTED:
                    raise BadRequest(None, f"{url} lists more than {MAX_LISTED} items; stopped")
                yield item

    async def post(
        self,
        url: str,
        url_vars: dict[str, Any] | None = None,
        *,
        data: Any,
        verify: Callable[[], Awaitable[Any]] | None = None,
    ) -> Any:
        """POST once; when no answer says whether it took effect, ask `verify`.

        `verify` reads what the POST would have created and returns it, or returns None
        (or raises NotFound) when it is not there; only then is the POST sent again.
        Without `verify` such a POST fails with `Unavailable(maybe_applied=True)`.
        """
        attempt = 1
        while True:
            try:
                with _github_errors(self._clock):
                    return await self._api.post(url, url_vars or {}, data=data)
            except Unavailable as exc:
                if verify is None or not exc.maybe_applied or attempt >= self._max_attempts:
                    raise
            applied = await self._applied(verify)
            if applied is not None:
                log.info("github.post_applied", route=route_template(url), installation=self.installation_id)
                return applied
            await self._clock.sleep(backoff_delay(attempt))
            attempt += 1

    async def patch(self, url: str, url_vars: dict[str, Any] | None = None, *, data: Any) -> Any:
        with _github_errors(self._clock):
            return await self._api.patch(url, url_vars or {}, data=data)

    async def put(self, url: str, url_vars: dict[str, Any] | None = None, *, data: Any = None) -> Any:
        with _github_errors(self._clock):
            return await self._api.put(url, url_vars or {}, data=b"" if data is None else data)

    async def delete(self, url: str, url_vars: dict[str, Any] | None = None, *, data: Any = None) -> None:
        with _github_errors(self._clock):
            await self._api.delete(url, url_vars or {}, data=b"" if data is None else data)

    async def graphql(self, query: str, **variables: Any) -> Any:
        """A GraphQL query's `data`; its errors as Klaud's (NOT_FOUND is NotFound)."""
        try:
            with _github_errors(self._clock):
                return await self._api.graphql(query, endpoint=graphql_endpoint(self._api.base_url), **variables)
        except gidgethub.QueryError as exc:
            errors = (exc.response or {}).get("errors") or []
            message = "; ".join(str(e.get("message", "")) for e in errors) or str(exc)
            kinds = {e.get("type") for e in errors}
            if "NOT_FOUND" in kinds:
                raise NotFound(200, message) from exc
            if kinds & GRAPHQL_RATE_LIMITED:
                # GraphQL's own budget, answered with 200: a wait, not a bad query.
                raise RateLimited(200, message, retry_after=SECONDARY_RATE_LIMIT_WAIT) from exc
            if kinds == {None} and GRAPHQL_TIMED_OUT.search(message):
                # "Something went wrong while executing your query. This may be the result
                # of a timeout": GitHub unwell, like the 502 a long blame gets; not our query.
                raise Unavailable(200, message) from exc
            raise BadRequest(200, message) from exc
        # (An error status is classified by _KlaudAPI._request, which has its headers.)
        # A body that is not JSON or holds neither data nor errors: GitHub unwell, retried later.
        except gidgethub.GraphQLException as exc:
            raise Unavailable(None, f"GraphQL answered without data: {exc}") from exc

    async def download(self, url: str, *, max_bytes: int) -> bytes:
        """The bytes behind `url` (e.g. an artifact zip), at most `max_bytes` of them."""
        with _github_errors(self._clock):
            return await self._api.download(url, max_bytes=max_bytes)

    async def repositories(self) -> list[dict[str, Any]]:
        return [repo async for repo in self.getiter("/installation/repositories", iterable_key="repositories")]

    @staticmethod
    async def _applied(verify: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await verify()
        except NotFound:
            return None


@dataclass(frozen=True)
class _Token:
    header: str
    expires_at: float
    minted_at: float = 0.0


def _renew_at(_installation_id: int, token: _Token, _now: float) -> float:
    return token.expires_at - TOKEN_RENEW_MARGIN


class GitHubApp:
    """The App: its JWT, its installations' tokens, and one client per installation."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        *,
        base_url: str,
        app_id: int | None,
        private_key: str | None,
        clock: Clock,
        dry_run: bool = False,
        user_agent: str = "klaud",
        request_timeout: float = 30.0,
        max_attempts: int = 5,
        write_spacing: float = 1.0,
        writers: Callable[[], int] | None = None,
        before_write: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        if private_key is not None and app_id is None:
            raise ValueError("a private key needs the App id it belongs to")
        self._app_id = app_id
        self._private_key = private_key
        self._clock = clock
        self._dry_run = dry_run
        self._transport = _Transport(
            session=session,
            base_url=base_url.rstrip("/"),
            user_agent=user_agent,
            clock=clock,
            timeout=aiohttp.ClientTimeout(total=request_timeout),
            max_attempts=max(1, max_attempts),
            write_spacing=write_spacing,
            writers=writers,
            before_write=before_write,
        )
        self._tokens: cachetools.TLRUCache[int, _Token] = cachetools.TLRUCache(
            maxsize=TOKEN_CACHE_SIZE, ttu=_renew_at, timer=clock.timestamp
        )
        self._token_locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._clients: dict[int, InstallationClient] = {}
        # The App itself only reads and mints tokens, and minting twice is harmless.
        self._api = _KlaudAPI(
            self._transport,
            label="app",
            credential=self._app_credential,
            dry_run=False,
            creates_are_safe=True,
            etag_cache=None,
        )

    def app_jwt(self) -> str:
        """The App's JWT: RS256, issued a minute ago, valid for nine more minutes.

        Without a private key the JWT is unsigned; only the sandbox without strict auth
        accepts it.
        """
        now = int(self._clock.timestamp())
        payload = {
            "iat": now - JWT_BACKDATE,
            "exp": now + JWT_LIFETIME,
            "iss": str(self._app_id) if self._app_id is not None else "0",
        }
        if self._private_key is None:
            return jwt.encode(payload, "", algorithm="none")
        return jwt.encode(payload, self._private_key, algorithm="RS256")

    async def repo_installation(self, full_name: str) -> dict[str, Any]:
        """`GET /repos/{owner}/{repo}/installation` as the App (its JWT, not a token)."""
        owner, _, repo = full_name.partition("/")
        with _github_errors(self._clock):
            answer = await self._api.getitem("/repos/{owner}/{repo}/installation", {"owner": owner, "repo": repo})
        return dict(answer)

    async def installations(self) -> list[dict[str, Any]]:
        with _github_errors(self._clock):
            return [item async for item in self._api.getiter("/app/installations")]

    def installation(self, installation_id: int) -> InstallationClient:
        client = self._clients.get(installation_id)
        if client is None:
            api = _KlaudAPI(
                self._transport,
                label=str(installation_id),
                credential=partial(self._installation_credential, installation_id),
                dry_run=self._dry_run,
                creates_are_safe=False,
                etag_cache=_ConditionalCache(ETAG_CACHE_BYTES),
            )
            client = InstallationClient(
                api, installation_id, clock=self._clock, max_attempts=self._transport.max_attempts, app_id=self._app_id
            )
            self._clients[installation_id] = client
        return client

    def forget_installation(self, installation_id: int) -> None:
        """The App was uninstalled from an account: its client (with an ETag cache of up to
        32 MiB), its token, token lock and rate-limit series go, else kept for as long as the
        process runs. A call under way finishes with what it holds; a later one starts anew.
        A token lock a mint holds stays (two mints at once would be harmless, but needless)."""
        self._clients.pop(installation_id, None)
        self._tokens.pop(installation_id, None)
        lock = self._token_locks.get(installation_id)
        if lock is not None and not lock.locked():
            del self._token_locks[installation_id]
        with suppress(KeyError):  # no request of it noted a rate limit
            GITHUB_RATE_LIMIT_REMAINING.remove(str(installation_id))

    async def _app_credential(self, _rejected: str | None) -> str:
        return f"bearer {self.app_jwt()}"

    async def _installation_credential(self, installation_id: int, rejected: str | None) -> str:
        async with self._token_locks[installation_id]:
            token = self._tokens.get(installation_id)
            # Only the token GitHub refused is dropped: calls that failed with it together
            # share one renewal instead of minting one each. A token a few seconds old may
            # not have reached every GitHub server yet: it is sent again (after the call's
            # backoff), as a new one would be no older.
            fresh = token is not None and self._clock.timestamp() - token.minted_at < TOKEN_REPLICATION_LAG
            if token is not None and token.header == rejected and not fresh:
                del self._tokens[installation_id]
                token = None
            if token is None:
                token = await self._mint(installation_id)
                self._tokens[installation_id] = token
            return token.header

    async def _mint(self, installation_id: int) -> _Token:
        with _github_errors(self._clock):
            answer = await self._api.post(
                "/app/installations/{installation_id}/access_tokens",
                {"installation_id": installation_id},
                data=b"",
            )
        expires_at = parse_time(answer["expires_at"])
        if expires_at is None:
            raise GitHubError(201, "installation token without expires_at")
        log.info("github.token_minted", installation=installation_id, expires_at=answer["expires_at"])
        return _Token(f"token {answer['token']}", expires_at.timestamp(), self._clock.timestamp())
