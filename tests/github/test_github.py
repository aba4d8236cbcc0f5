"""The GitHub client: credentials, retries, rate limits, write spacing, ETags, dry run,
typed errors, pagination and downloads.

Most tests talk to `Stub`, a tiny scripted GitHub stand-in on 127.0.0.1 whose API lives under
a path prefix (as the sandbox's does); the tests at the end run against the real sandbox.
Every wait goes through a ManualClock, so nothing here really sleeps except the few
timeouts, which are a fraction of a second.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import formatdate
from functools import lru_cache
from typing import Any

import aiohttp
import jwt
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from structlog.testing import capture_logs

import bot.github.client as client_module
import bot.github.repo as repo_module
from bot.core.clock import ManualClock
from bot.core.domain import stamp
from bot.github.client import (
    BadRequest,
    Conflict,
    GitHubApp,
    GitHubError,
    InstallationClient,
    NotFound,
    NotSent,
    RateLimited,
    TooLarge,
    Unauthorized,
    Unavailable,
    backoff_delay,
    origin_of,
    rate_limit_wait,
    repository_of,
    route_template,
)
from bot.github.repo import GitHubRepo
from bot.metrics import REGISTRY
from bot.sandbox import Sandbox
from bot.store.errors import LeaseTaken

START = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)
T0 = START.timestamp()
PREFIX = "/api/v3"
TOKEN_LIFETIME = 3600


@lru_cache(maxsize=1)
def rsa_keys() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    ).decode()
    return private, public


# ------------------------------------------------------------------------- the stub

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any
    at: float
    status: int = 0


def reply(status: int = 200, body: Any = None, **headers: str) -> Handler:
    async def answer(_request: web.Request) -> web.StreamResponse:
        if body is None and status == 204:
            return web.Response(status=status, headers=headers)
        return web.json_response({} if body is None else body, status=status, headers=headers)

    return answer


async def disconnect(request: web.Request) -> web.StreamResponse:
    """The request arrived (and may have had its effect), but no answer goes back."""
    assert request.transport is not None
    request.transport.close()
    return web.Response()


def slow(seconds: float) -> Handler:
    async def answer(_request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(seconds)
        return web.json_response({"late": True})

    return answer


class Stub:
    """Scripted answers per (method, path); tokens minted on demand; every request logged."""

    def __init__(self, clock: ManualClock, prefix: str = PREFIX) -> None:
        self.clock = clock
        self.prefix = prefix
        self.seen: list[Seen] = []
        self.scripts: defaultdict[tuple[str, str], list[Handler]] = defaultdict(list)
        self.routes: dict[tuple[str, str], Handler] = {}
        self.minted = 0
        self.url = ""

    def script(self, method: str, path: str, *answers: Handler) -> None:
        """The next requests to `path` get these answers in turn, then the default one."""
        self.scripts[(method, self.prefix + path)].extend(answers)

    def route(self, method: str, path: str, handler: Handler) -> None:
        """Every request to `path` not scripted otherwise gets this handler."""
        self.routes[(method, self.prefix + path)] = handler

    def calls(self, method: str, path: str) -> list[Seen]:
        return [s for s in self.seen if s.method == method and s.path == self.prefix + path]

    def tokens(self) -> list[str]:
        return [s.headers.get("Authorization", "") for s in self.seen if not s.path.endswith("/access_tokens")]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        seen = Seen(
            method=request.method,
            path=request.path,
            query=dict(request.query),
            headers=dict(request.headers),
            body=json.loads(raw) if raw else None,
            at=self.clock.timestamp(),
        )
        self.seen.append(seen)
        key = (request.method, request.path)
        if self.scripts.get(key):
            handler = self.scripts[key].pop(0)
        elif key in self.routes:
            handler = self.routes[key]
        elif request.method == "POST" and request.path.endswith("/access_tokens"):
            handler = self.mint
        else:
            handler = reply(200, {"path": request.path}, **{"x-ratelimit-remaining": "4999"})
        response = await handler(request)
        seen.status = response.status
        # GitHub's time (the quota's reset is read against it), unless the answer set one.
        response.headers.setdefault("Date", formatdate(self.clock.timestamp(), usegmt=True))
        return response

    async def mint(self, _request: web.Request) -> web.StreamResponse:
        self.minted += 1
        expires = self.clock.now() + timedelta(seconds=TOKEN_LIFETIME)
        # Tokens of an odd shape and length: the client must not assume GitHub's format.
        return web.json_response(
            {"token": f"t{self.minted}." + "x" * (40 + self.minted * 7), "expires_at": stamp(expires)},
            status=201,
        )


async def serve(handler: Handler) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture
async def stub(clock: ManualClock) -> AsyncIterator[Stub]:
    stub = Stub(clock)
    runner, stub.url = await serve(stub.handle)
    yield stub
    await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def make_app(session: aiohttp.ClientSession, stub: Stub, clock: ManualClock) -> Callable[..., GitHubApp]:
    def make(**overrides: Any) -> GitHubApp:
        options: dict[str, Any] = {
            "base_url": stub.url + PREFIX,
            "app_id": 1,
            "private_key": None,
            "clock": clock,
        }
        options.update(overrides)
        return GitHubApp(session, **options)

    return make


@pytest.fixture
def inst(make_app: Callable[..., GitHubApp]) -> InstallationClient:
    return make_app().installation(7)


def requests_metric(method: str, route: str, status: str) -> float:
    value = REGISTRY.get_sample_value(
        "klaud_github_requests_total", {"method": method, "route": route, "status": status}
    )
    return value or 0.0


# ------------------------------------------------------------------- pure helpers


@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("/repos/acme/bench/pulls/12/files", "/repos/{owner}/{repo}/pulls/{number}/files"),
        ("/repos/acme/bench/pulls", "/repos/{owner}/{repo}/pulls"),
        ("/repos/acme/bench/git/ref/heads/klaud/claim-0123", "/repos/{owner}/{repo}/git/ref/{ref}"),
        ("/repos/a/b/contents/configs/nvidia-master.yaml", "/repos/{owner}/{repo}/contents/{path}"),
        ("/repos/a/b/issues/comments/55/reactions", "/repos/{owner}/{repo}/issues/comments/{comment_id}/reactions"),
        ("/repos/a/b/issues/12/comments", "/repos/{owner}/{repo}/issues/{number}/comments"),
        ("/repos/a/b/commits/" + "a" * 40 + "/check-runs", "/repos/{owner}/{repo}/commits/{ref}/check-runs"),
        (
            "/repos/a/b/actions/workflows/klaud-candidate.yml/dispatches",
            "/repos/{owner}/{repo}/actions/workflows/{workflow_id}/dispatches",
        ),
        ("/repos/a/b/actions/artifacts/9/zip", "/repos/{owner}/{repo}/actions/artifacts/{artifact_id}/{archive_format}"),
        ("/repos/a/b/compare/main...feature/x", "/repos/{owner}/{repo}/compare/{basehead}"),
        ("/app/installations/3/access_tokens", "/app/installations/{installation_id}/access_tokens"),
        ("/repos/a/b/pulls?page=2&per_page=100", "/repos/{owner}/{repo}/pulls"),
        # Unknown routes keep only the leading segments Klaud's own routes have: no names or
        # ids in labels, and no path an answer's link names (a new label each).
        ("/repos/alice/secret-repo/hooks/77/deliveries", "/repos/{owner}/{repo}/{other}/{rest}"),
        ("/repos/alice/secret-repo/pulls/comments/7/replies", "/repos/{owner}/{repo}/pulls/{rest}"),
        ("/users/alice", "/{other}/{rest}"),
        ("/page-17-x", "/{other}"),
        ("/app/hook/config", "/app/{rest}"),
    ],
)
def test_route_template_replaces_names_numbers_and_shas(path: str, template: str) -> None:
    assert route_template(path) == template


def test_backoff_grows_exponentially_with_bounded_jitter() -> None:
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (10, 30.0)]:
        delays = {backoff_delay(attempt) for _ in range(50)}
        assert all(ceiling / 2 <= d <= ceiling for d in delays)
        assert len(delays) > 1, "jitter must vary the delay"


def test_rate_limit_wait_reads_the_headers_github_sends() -> None:
    now = 1_000.0
    assert rate_limit_wait(429, {"retry-after": "12"}, "", now=now, attempt=1) == 12.0
    assert rate_limit_wait(403, {"retry-after": "3"}, "whatever", now=now, attempt=1) == 3.0
    reset = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": "1300"}
    assert rate_limit_wait(403, reset, "API rate limit exceeded", now=now, attempt=1) == 300.0
    secondary = "You have exceeded a secondary rate limit."
    assert rate_limit_wait(403, {}, secondary, now=now, attempt=1) == 60.0
    assert rate_limit_wait(403, {}, secondary, now=now, attempt=2) == 120.0
    assert rate_limit_wait(403, {}, "Resource not accessible by integration", now=now, attempt=1) is None
    assert rate_limit_wait(404, {"retry-after": "5"}, "", now=now, attempt=1) is None


# --------------------------------------------------------------------- credentials


async def test_app_jwt_is_rs256_backdated_and_short_lived(make_app: Callable[..., GitHubApp]) -> None:
    private, public = rsa_keys()
    app = make_app(app_id=4242, private_key=private)
    token = app.app_jwt()
    assert jwt.get_unverified_header(token)["alg"] == "RS256"
    claims = jwt.decode(token, public, algorithms=["RS256"], options={"verify_exp": False, "verify_iat": False})
    assert claims == {"iat": int(T0) - 60, "exp": int(T0) + 9 * 60, "iss": "4242"}


async def test_installation_token_is_minted_once_with_the_app_jwt_and_reused(
    make_app: Callable[..., GitHubApp], stub: Stub
) -> None:
    private, public = rsa_keys()
    inst = make_app(private_key=private).installation(7)
    await inst.getitem("/repos/acme/bench")
    await inst.getitem("/repos/acme/bench/pulls")
    mints = stub.calls("POST", "/app/installations/7/access_tokens")
    assert len(mints) == 1
    bearer = mints[0].headers["Authorization"].removeprefix("Bearer ").removeprefix("bearer ")
    assert jwt.decode(bearer, public, algorithms=["RS256"], options={"verify_exp": False, "verify_iat": False})["iss"] == "1"
    assert stub.tokens() == [f"token t1.{'x' * 47}"] * 2


async def test_token_is_renewed_five_minutes_before_it_expires(
    inst: InstallationClient, stub: Stub, clock: ManualClock
) -> None:
    await inst.getitem("/repos/acme/bench")
    clock.advance(TOKEN_LIFETIME - 301)
    await inst.getitem("/repos/acme/bench")
    assert stub.minted == 1
    clock.advance(2)
    await inst.getitem("/repos/acme/bench")
    assert stub.minted == 2
    assert stub.tokens()[-1].startswith("token t2.")


async def test_a_refused_token_past_the_replication_lag_is_replaced_once(
    inst: InstallationClient, stub: Stub, clock: ManualClock
) -> None:
    await inst.getitem("/repos/acme/bench")
    clock.advance(60)  # revoked, say, a minute after it was minted
    stub.script("GET", "/repos/acme/bench", reply(401, {"message": "Bad credentials"}))
    assert await inst.getitem("/repos/acme/bench") == {"path": PREFIX + "/repos/acme/bench"}
    assert stub.minted == 2
    assert [t.split(".")[0] for t in stub.tokens()] == ["token t1", "token t1", "token t2"]


async def test_a_401_that_persists_after_re_minting_is_unauthorized(inst: InstallationClient, stub: Stub) -> None:
    bad = reply(401, {"message": "Bad credentials"})
    stub.script("GET", "/repos/acme/bench", *[bad] * 6)
    with pytest.raises(Unauthorized) as caught:
        await inst.getitem("/repos/acme/bench")
    # The error is transient, so the delivery retries later.
    assert caught.value.status == 401 and caught.value.transient
    assert len(stub.calls("GET", "/repos/acme/bench")) == 5
    # Not one token per try: the first is sent again while it may be replicating, and is
    # replaced (once) if the backoffs carry it past that.
    assert stub.minted <= 2


async def test_a_new_token_refused_while_it_replicates_is_sent_again(
    inst: InstallationClient, stub: Stub, clock: ManualClock
) -> None:
    # GitHub may refuse a token for a few seconds after minting it, until every server has
    # it: a new one would be no older, so the same one is sent again after a backoff.
    bad = reply(401, {"message": "Bad credentials"})
    stub.script("GET", "/repos/acme/bench", bad, bad, reply(200, {"full_name": "acme/bench"}))
    assert (await inst.getitem("/repos/acme/bench"))["full_name"] == "acme/bench"
    assert stub.minted == 1 and 1.5 <= sum(clock.slept) <= 3.0


async def test_concurrent_calls_share_one_token_mint(inst: InstallationClient, stub: Stub) -> None:
    await asyncio.gather(*(inst.getitem(f"/repos/acme/r{i}") for i in range(5)))
    assert stub.minted == 1


async def test_a_forgotten_installation_mints_afresh_and_a_token_lock_in_use_stays(
    make_app: Callable[..., GitHubApp], stub: Stub
) -> None:
    app = make_app()
    await app.installation(7).getitem("/repos/acme/bench")
    app.forget_installation(7)
    assert 7 not in app._clients and 7 not in app._token_locks
    await app.installation(7).getitem("/repos/acme/bench")  # installed again
    assert stub.minted == 2
    async with app._token_locks[8]:  # a mint under way keeps its lock
        app.forget_installation(8)
        assert 8 in app._token_locks


async def test_a_failed_mint_reaches_the_caller_typed(inst: InstallationClient, stub: Stub) -> None:
    stub.script("POST", "/app/installations/7/access_tokens", reply(404, {"message": "Not Found"}))
    with pytest.raises(NotFound):
        await inst.getitem("/repos/acme/bench")


async def test_a_request_not_sent_for_want_of_a_token_carries_no_status_of_its_own(
    make_app: Callable[..., GitHubApp], stub: Stub
) -> None:
    # The token service's 500 is not the request's: read as the request's status, it was taken
    # for GitHub's "diff taking too long" answer to a comparison never asked (pulls._DiffBase).
    inst = make_app(max_attempts=2).installation(7)
    stub.script("POST", "/app/installations/7/access_tokens", *[reply(500, {"message": "Internal Server Error"})] * 2)
    with pytest.raises(Unavailable) as refused:
        await inst.getitem("/repos/acme/bench/compare/a...c?per_page=1")
    assert refused.value.status is None and "500" in str(refused.value) and "not sent" in str(refused.value)
    assert stub.calls("GET", "/repos/acme/bench/compare/a...c") == []


async def test_the_token_mint_is_retried_on_5xx_because_minting_twice_is_harmless(
    inst: InstallationClient, stub: Stub
) -> None:
    stub.script("POST", "/app/installations/7/access_tokens", reply(502, {"message": "Bad gateway"}))
    await inst.getitem("/repos/acme/bench")
    assert len(stub.calls("POST", "/app/installations/7/access_tokens")) == 2


async def test_credentials_never_go_to_another_origin(inst: InstallationClient, stub: Stub) -> None:
    other = Stub(stub.clock)
    runner, other.url = await serve(other.handle)
    try:
        await inst.getitem(other.url + "/elsewhere")
    finally:
        await runner.cleanup()
    assert "Authorization" not in other.seen[0].headers


# ------------------------------------------------------------------------- retries


async def test_5xx_bursts_are_retried_with_growing_backoff(
    inst: InstallationClient, stub: Stub, clock: ManualClock
) -> None:
    stub.script("GET", "/repos/acme/bench", reply(502), reply(503), reply(500))
    assert await inst.getitem("/repos/acme/bench") == {"path": PREFIX + "/repos/acme/bench"}
    assert [s.status for s in stub.calls("GET", "/repos/acme/bench")] == [502, 503, 500, 200]
    assert len(clock.slept) == 3
    for delay, ceiling in zip(clock.slept, [1.0, 2.0, 4.0]):
        assert ceiling / 2 <= delay <= ceiling


async def test_5xx_after_every_attempt_is_unavailable(make_app: Callable[..., GitHubApp], stub: Stub) -> None:
    inst = make_app(max_attempts=3).installation(7)
    stub.script("GET", "/repos/acme/bench", *[reply(500, {"message": "boom"})] * 5)
    with pytest.raises(Unavailable) as caught:
        await inst.getitem("/repos/acme/bench")
    assert caught.value.status == 500 and caught.value.transient
    assert len(stub.calls("GET", "/repos/acme/bench")) == 3


async def test_timeouts_are_retried_and_counted(make_app: Callable[..., GitHubApp], stub: Stub) -> None:
    inst = make_app(request_timeout=0.1).installation(7)
    before = requests_metric("GET", "/repos/{owner}/{repo}", "timeout")
    stub.script("GET", "/repos/acme/bench", slow(2.0))
    assert await inst.getitem("/repos/acme/bench") == {"path": PREFIX + "/repos/acme/bench"}
    assert len(stub.calls("GET", "/repos/acme/bench")) == 2
    assert requests_metric("GET", "/repos/{owner}/{repo}", "timeout") == before + 1


async def test_network_errors_on_reads_become_unavailable_after_the_attempts(
    make_app: Callable[..., GitHubApp], stub: Stub
) -> None:
    inst = make_app(max_attempts=2).installation(7)
    # aiohttp itself resends an idempotent request once on a dropped keep-alive
    # connection, so script more failures than attempts.
    stub.script("GET", "/repos/acme/bench", *[disconnect] * 6)
    with pytest.raises(Unavailable) as caught:
        await inst.getitem("/repos/acme/bench")
    assert caught.value.status is None and not caught.value.maybe_applied
    assert len(stub.calls("GET", "/repos/acme/bench")) >= 2


async def test_retry_after_is_honoured(inst: InstallationClient, stub: Stub, clock: ManualClock) -> None:
    stub.script("GET", "/repos/acme/bench", reply(429, {"message": "slow down"}, **{"Retry-After": "17"}))
    await inst.getitem("/repos/acme/bench")
    assert clock.slept == [17.0]
    assert [s.at for s in stub.calls("GET", "/repos/acme/bench")] == [T0, T0 + 17]


async def test_an_exhausted_quota_fails_the_call_until_the_reset(inst: InstallationClient, stub: Stub, clock: ManualClock) -> None:
    # Waited out inside the call, a reset up to an hour away held a handler, or the
    # scheduler's tick and with it every repository's waves, that long.
    headers = {"x-ratelimit-remaining": "0", "x-ratelimit-limit": "5000", "x-ratelimit-reset": str(int(T0) + 240)}
    stub.script("GET", "/repos/acme/bench", reply(403, {"message": "API rate limit exceeded"}, **headers))
    with pytest.raises(RateLimited) as raised:
        await inst.getitem("/repos/acme/bench")
    assert raised.value.retry_after == 240.0 and raised.value.transient and clock.slept == []
    with pytest.raises(RateLimited):  # the installation's other calls are not sent meanwhile
        await inst.getitem("/repos/acme/other")
    assert len(stub.calls("GET", "/repos/acme/bench")) == 1 and stub.calls("GET", "/repos/acme/other") == []
    clock.advance(240)
    await inst.getitem("/repos/acme/bench")
    assert stub.calls("GET", "/repos/acme/bench")[-1].at == T0 + 240


async def test_a_secondary_rate_limit_waits_at_least_a_minute(
    inst: InstallationClient, stub: Stub, clock: ManualClock
) -> None:
    message = {"message": "You have exceeded a secondary rate limit. Please wait a few minutes."}
    stub.script("POST", "/repos/acme/bench/issues/1/comments", reply(403, message))
    await inst.post("/repos/acme/bench/issues/1/comments", data={"body": "hi"})
    assert clock.slept == [60.0]
    assert len(stub.calls("POST", "/repos/acme/bench/issues/1/comments")) == 2


async def test_a_permission_403_is_not_retried(inst: InstallationClient, stub: Stub, clock: ManualClock) -> None:
    stub.script("GET", "/repos/acme/bench", reply(403, {"message": "Resource not accessible by integration"}))
    with pytest.raises(BadRequest) as caught:
        await inst.getitem("/repos/acme/bench")
    assert caught.value.status == 403 and "not accessible" in caught.value.message
    assert clock.slept == []


async def test_a_rate_limited_installation_holds_its_other_calls(
    make_app: Callable[..., GitHubApp], stub: Stub, clock: ManualClock
) -> None:
    app = make_app(max_attempts=1)
    inst = app.installation(7)
    stub.script("GET", "/repos/acme/a", reply(429, {"message": "slow down"}, **{"Retry-After": "30"}))
    with pytest.raises(RateLimited) as caught:
        await inst.getitem("/repos/acme/a")
    assert caught.value.transient and caught.value.retry_after == 30.0
    assert clock.slept == []
    await inst.getitem("/repos/acme/b")
    assert clock.slept == [30.0]
    assert stub.calls("GET", "/repos/acme/b")[0].at == T0 + 30
    # Another installation has its own quota and is not held.
    await app.installation(8).getitem("/repos/other/c")
    assert clock.slept == [30.0]


async def test_a_spent_quota_holds_the_next_call_until_the_reset(
    inst: InstallationClient, stub: Stub, clock: ManualClock
) -> None:
    headers = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(T0) + 50)}
    stub.script("GET", "/repos/acme/a", reply(200, {"ok": 1}, **headers))
    assert await inst.getitem("/repos/acme/a") == {"ok": 1}
    assert REGISTRY.get_sample_value("klaud_github_rate_limit_remaining", {"installation": "7"}) == 0.0
    await inst.getitem("/repos/acme/b")
    assert clock.slept == [50.0]
    assert REGISTRY.get_sample_value("klaud_github_rate_limit_remaining", {"installation": "7"}) == 4999.0


# ------------------------------------------------------------ writes and their safety


async def test_a_create_that_lost_its_answer_is_verified_instead_of_repeated(inst: InstallationClient, stub: Stub) -> None:
    stub.script("POST", "/repos/acme/bench/git/refs", disconnect)
    verified: list[bool] = []

    async def verify() -> Any:
        verified.append(True)
        return await inst.getitem("/repos/acme/bench/git/ref/heads/klaud/claim-1")

    result = await inst.post("/repos/acme/bench/git/refs", data={"ref": "refs/heads/klaud/claim-1", "sha": "a" * 40}, verify=verify)
    assert result == {"path": PREFIX + "/repos/acme/bench/git/ref/heads/klaud/claim-1"}
    assert verified == [True]
    assert len(stub.calls("POST", "/repos/acme/bench/git/refs")) == 1


async def test_a_create_that_did_not_happen_is_sent_again(inst: InstallationClient, stub: Stub) -> None:
    stub.script("POST", "/repos/acme/bench/git/refs", disconnect, reply(201, {"ref": "refs/heads/x"}))
    stub.script("GET", "/repos/acme/bench/git/ref/heads/x", reply(404, {"message": "Not Found"}))

    async def verify() -> Any:
        return await inst.getitem("/repos/acme/bench/git/ref/heads/x")

    assert await inst.post("/repos/acme/bench/git/refs", data={"ref": "refs/heads/x"}, verify=verify) == {"ref": "refs/heads/x"}
    assert len(stub.calls("POST", "/repos/acme/bench/git/refs")) == 2


async def test_a_create_without_verify_is_never_repeated(inst: InstallationClient, stub: Stub) -> None:
    stub.script("POST", "/repos/acme/bench/dispatches", disconnect)
    with pytest.raises(Unavailable) as caught:
        await inst.post("/repos/acme/bench/dispatches", data={"event_type": "x"})
    assert caught.value.maybe_applied and caught.value.transient
    stub.script("POST", "/repos/acme/bench/dispatches", reply(502, {"message": "Server Error"}))
    with pytest.raises(Unavailable) as caught:
        await inst.post("/repos/acme/bench/dispatches", data={"event_type": "x"})
    assert caught.value.status == 502 and caught.value.maybe_applied
    assert len(stub.calls("POST", "/repos/acme/bench/dispatches")) == 2


async def test_idempotent_writes_are_retried_after_network_errors(inst: InstallationClient, stub: Stub) -> None:
    stub.script("PATCH", "/repos/acme/bench/check-runs/5", disconnect)
    stub.script("DELETE", "/repos/acme/bench/git/refs/heads/x", reply(503), reply(204))
    assert await inst.patch("/repos/acme/bench/check-runs/5", data={"status": "completed"}) == {
        "path": PREFIX + "/repos/acme/bench/check-runs/5"
    }
    assert await inst.delete("/repos/acme/bench/git/refs/heads/x") is None
    assert len(stub.calls("PATCH", "/repos/acme/bench/check-runs/5")) == 2
    assert len(stub.calls("DELETE", "/repos/acme/bench/git/refs/heads/x")) == 2


async def test_writes_of_one_installation_are_spaced_a_second_apart(
    make_app: Callable[..., GitHubApp], stub: Stub, clock: ManualClock
) -> None:
    app = make_app()
    inst = app.installation(7)
    await inst.getitem("/repos/acme/bench")  # reads are not spaced, and this mints the token
    await asyncio.gather(*(inst.patch(f"/repos/acme/bench/check-runs/{i}", data={"i": i}) for i in range(3)))
    await inst.put("/repos/acme/bench/issues/1/labels", data={"labels": ["x"]})
    await inst.getitem("/repos/acme/bench/pulls")
    writes = [s.at for s in stub.seen if s.method in {"PATCH", "PUT"}]
    assert writes == [T0, T0 + 1, T0 + 2, T0 + 3]
    assert stub.calls("GET", "/repos/acme/bench/pulls")[0].at == T0 + 3
    # Another installation's writes are not held back by these.
    await app.installation(8).post("/repos/other/r/issues/1/comments", data={"body": "x"})
    assert clock.slept == [1.0, 1.0, 1.0]


async def test_replicas_writing_for_one_installation_each_space_their_writes_by_their_number(
    make_app: Callable[..., GitHubApp], stub: Stub, clock: ManualClock
) -> None:
    replicas = 3
    inst = make_app(writers=lambda: replicas).installation(7)
    await inst.getitem("/repos/acme/bench")
    await asyncio.gather(*(inst.patch(f"/repos/acme/bench/check-runs/{i}", data={"i": i}) for i in range(2)))
    replicas = 1  # the others are gone: this one takes the whole pace again
    await inst.patch("/repos/acme/bench/check-runs/9", data={})
    assert [s.at for s in stub.seen if s.method == "PATCH"] == [T0, T0 + 3, T0 + 4]


async def test_dry_run_reads_but_only_logs_writes(make_app: Callable[..., GitHubApp], stub: Stub) -> None:
    inst = make_app(dry_run=True).installation(7)
    with capture_logs() as logs:
        assert await inst.getitem("/repos/acme/bench") == {"path": PREFIX + "/repos/acme/bench"}
        assert await inst.post("/repos/acme/bench/issues/1/comments", data={"body": "hello"}) == {}
        assert await inst.patch("/repos/acme/bench/check-runs/3", data={"status": "completed"}) == {}
        assert await inst.put("/repos/acme/bench/issues/1/labels", data={"labels": ["a"]}) == {}
        assert await inst.delete("/repos/acme/bench/git/refs/heads/x") is None
    assert [(s.method, s.path) for s in stub.seen] == [
        ("POST", PREFIX + "/app/installations/7/access_tokens"),
        ("GET", PREFIX + "/repos/acme/bench"),
    ]
    dry = [entry for entry in logs if entry["event"] == "github.dry_run"]
    assert [(e["method"], e["log_level"]) for e in dry] == [
        ("POST", "info"), ("PATCH", "info"), ("PUT", "info"), ("DELETE", "info")
    ]
    assert dry[0]["body"] == {"body": "hello"}
    assert dry[0]["route"] == "/repos/{owner}/{repo}/issues/{number}/comments"


async def test_state_is_committed_before_each_write_and_never_for_a_read(
    make_app: Callable[..., GitHubApp], stub: Stub
) -> None:
    order: list[str] = []

    async def commit(url: str) -> None:  # `Klaud._before_github_write` in the running App
        order.append(f"commit {repository_of(url)}")

    inst = make_app(before_write=commit).installation(7)
    await inst.getitem("/repos/acme/bench")
    order.append("read")
    await inst.post("/repos/acme/bench/actions/workflows/klaud-candidate.yml/dispatches", data={"ref": "main"})
    order.append("dispatched")
    assert order == ["read", "commit acme/bench", "dispatched"]
    assert [s.method for s in stub.seen][-1] == "POST", "the commit came before the request was sent"


async def test_a_write_that_waited_out_a_rate_limit_is_cleared_again_before_it_is_sent(
    make_app: Callable[..., GitHubApp], stub: Stub, clock: ManualClock
) -> None:
    # A reply held by a secondary rate limit: meanwhile another replica took the repository.
    cleared: list[float] = []

    async def before_write(url: str) -> None:  # `Klaud._before_github_write` in the running App
        cleared.append(clock.timestamp())
        if len(cleared) > 1:
            raise LeaseTaken(f"{repository_of(url)} is not held by this replica now")

    path = "/repos/acme/bench/issues/1/comments"
    stub.script("POST", path, reply(403, {"message": "You have exceeded a secondary rate limit."}, **{"Retry-After": "17"}))
    inst = make_app(before_write=before_write).installation(7)
    with pytest.raises(LeaseTaken):
        await inst.post(path, data={"body": "hello"})
    assert cleared == [T0, T0 + 17], "cleared once before each send, the second after the wait"
    assert len(stub.calls("POST", path)) == 1


# ----------------------------------------------------------------- ETags and logging


async def test_etags_are_sent_and_a_304_is_served_from_the_installation_cache(
    make_app: Callable[..., GitHubApp], stub: Stub
) -> None:
    async def etagged(request: web.Request) -> web.StreamResponse:
        if request.headers.get("If-None-Match") == '"v1"':
            return web.Response(status=304, headers={"ETag": '"v1"'})
        return web.json_response({"files": [1, 2]}, headers={"ETag": '"v1"'})

    stub.route("GET", "/repos/acme/bench/pulls/3/files", etagged)
    app = make_app()
    before = requests_metric("GET", "/repos/{owner}/{repo}/pulls/{number}/files", "304")
    first, second = app.installation(7), app.installation(8)
    assert await first.getitem("/repos/acme/bench/pulls/3/files") == {"files": [1, 2]}
    assert await first.getitem("/repos/acme/bench/pulls/3/files") == {"files": [1, 2]}
    assert await second.getitem("/repos/acme/bench/pulls/3/files") == {"files": [1, 2]}
    calls = stub.calls("GET", "/repos/acme/bench/pulls/3/files")
    assert [s.status for s in calls] == [200, 304, 200]
    assert [s.headers.get("If-None-Match") for s in calls] == [None, '"v1"', None]
    assert requests_metric("GET", "/repos/{owner}/{repo}/pulls/{number}/files", "304") == before + 1


async def test_the_etag_cache_keeps_answers_up_to_a_budget_of_bytes(
    make_app: Callable[..., GitHubApp], stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Pages of pull-request files run up to megabytes: a count of entries bounded nothing.
    monkeypatch.setattr(client_module, "ETAG_CACHE_BYTES", 100_000)

    async def files(request: web.Request) -> web.StreamResponse:
        number = request.path.split("/")[-2]
        etag = f'"{number}"'
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers={"ETag": etag})
        size = 150_000 if number == "99" else 20_000
        return web.json_response({"patch": "x" * size}, headers={"ETag": etag})

    for number in [*range(1, 11), 99]:
        stub.route("GET", f"/repos/acme/bench/pulls/{number}/files", files)
    inst = make_app().installation(7)
    for number in [*range(1, 11), 99]:  # ten answers of 20 KB, then one over the budget
        await inst.getitem(f"/repos/acme/bench/pulls/{number}/files")
    for number in (99, 10, 6, 5, 1):
        assert (await inst.getitem(f"/repos/acme/bench/pulls/{number}/files"))["patch"].startswith("x")
    sent = {s.path.split("/")[-2]: s.headers.get("If-None-Match") for s in stub.seen[-5:]}
    # Room for four: the newest (10, 9, 8, 7), then 6 again from GitHub; the one over the
    # budget was never kept.
    assert sent == {"99": None, "10": '"10"', "6": None, "5": None, "1": None}


async def test_requests_are_logged_with_their_route_and_never_the_token(inst: InstallationClient, stub: Stub) -> None:
    with capture_logs() as logs:
        await inst.getitem("/repos/acme/bench/pulls/{number}", {"number": 12})
    entries = [e for e in logs if e["event"] == "github.request"]
    assert [(e["method"], e["route"], e["status"]) for e in entries] == [
        ("POST", "/app/installations/{installation_id}/access_tokens", "201"),
        ("GET", "/repos/{owner}/{repo}/pulls/{number}", "200"),
    ]
    assert all(e["log_level"] == "debug" and "duration_ms" in e for e in entries)
    token = stub.tokens()[0].removeprefix("token ")
    assert token not in repr(logs)


# --------------------------------------------------------------------- typed errors


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (404, {"message": "Not Found"}, NotFound),
        (410, {"message": "Gone"}, NotFound),
        (409, {"message": "Git Repository is empty."}, Conflict),
        (422, {"message": "Reference already exists"}, Conflict),
        (400, {"message": "Problems parsing JSON"}, BadRequest),
        (451, {"message": "Unavailable for legal reasons"}, BadRequest),
    ],
)
async def test_errors_reach_callers_typed(
    inst: InstallationClient, stub: Stub, status: int, body: dict[str, str], error: type[Exception]
) -> None:
    stub.script("POST", "/repos/acme/bench/git/refs", reply(status, body))
    with pytest.raises(error) as caught:
        await inst.post("/repos/acme/bench/git/refs", data={"ref": "refs/heads/x", "sha": "0" * 40})
    assert caught.value.status == status  # type: ignore[attr-defined]
    assert body["message"] in caught.value.message  # type: ignore[attr-defined]
    assert not caught.value.transient  # type: ignore[attr-defined]


# ------------------------------------------------------------- URLs and pagination


async def test_pagination_follows_absolute_next_links_under_the_prefix(inst: InstallationClient, stub: Stub) -> None:
    async def pages(request: web.Request) -> web.StreamResponse:
        page = int(request.query.get("page", "1"))
        headers = {}
        if page < 3:
            headers["Link"] = f'<{stub.url}{PREFIX}/repos/acme/bench/pulls?page={page + 1}>; rel="next"'
        return web.json_response([{"number": page * 10 + i} for i in range(2)], headers=headers)

    stub.route("GET", "/repos/acme/bench/pulls", pages)
    numbers = [pull["number"] async for pull in inst.getiter("/repos/{owner}/{repo}/pulls", {"owner": "acme", "repo": "bench"})]
    assert numbers == [10, 11, 20, 21, 30, 31]
    assert [s.query.get("page") for s in stub.calls("GET", "/repos/acme/bench/pulls")] == [None, "2", "3"]


async def test_a_listing_whose_next_page_never_ends_fails_instead_of_paging_for_ever(
    inst: InstallationClient, stub: Stub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "MAX_LISTED", 30)

    async def endless(request: web.Request) -> web.StreamResponse:
        page = int(request.query.get("page", "1"))
        link = f'<{stub.url}{PREFIX}/repos/acme/bench/pulls?page={page + 1}>; rel="next"'
        return web.json_response([{"number": page * 10 + i} for i in range(10)], headers={"Link": link})

    stub.route("GET", "/repos/acme/bench/pulls", endless)
    listed = []
    with pytest.raises(BadRequest, match="lists more than 30 items"):
        async for pull in inst.getiter("/repos/{owner}/{repo}/pulls", {"owner": "acme", "repo": "bench"}):
            listed.append(pull["number"])
    # Failed, not cut short: a caller would take the PRs it was not shown for closed.
    assert len(listed) == 30 and len(stub.calls("GET", "/repos/acme/bench/pulls")) == 4


async def test_iterable_key_unwraps_paged_objects(make_app: Callable[..., GitHubApp], stub: Stub) -> None:
    async def repos(request: web.Request) -> web.StreamResponse:
        page = int(request.query.get("page", "1"))
        headers = {"Link": f'<{stub.url}{PREFIX}/installation/repositories?page=2>; rel="next"'} if page == 1 else {}
        return web.json_response({"total_count": 2, "repositories": [{"full_name": f"acme/r{page}"}]}, headers=headers)

    async def installations(request: web.Request) -> web.StreamResponse:
        return web.json_response([{"id": 7}, {"id": 8}])

    stub.route("GET", "/installation/repositories", repos)
    stub.route("GET", "/app/installations", installations)
    app = make_app()
    assert [r["full_name"] for r in await app.installation(7).repositories()] == ["acme/r1", "acme/r2"]
    assert [i["id"] for i in await app.installations()] == [7, 8]
    assert stub.calls("GET", "/app/installations")[0].headers["Authorization"].lower().startswith("bearer ")


async def test_params_and_url_variables_build_the_query(inst: InstallationClient, stub: Stub) -> None:
    await inst.getitem(
        "/repos/{owner}/{repo}/actions/runs", {"owner": "acme", "repo": "bench"}, params={"status": "completed", "per_page": 100}
    )
    assert stub.calls("GET", "/repos/acme/bench/actions/runs")[0].query == {"status": "completed", "per_page": "100"}


# ------------------------------------------------------------------------ downloads


@pytest.fixture
async def blob_host(stub: Stub) -> AsyncIterator[Stub]:
    """A second origin standing in for the storage host an artifact redirect points at."""
    host = Stub(stub.clock, prefix="")
    runner, host.url = await serve(host.handle)
    yield host
    await runner.cleanup()


async def test_download_follows_the_redirect_without_the_token(
    inst: InstallationClient, stub: Stub, blob_host: Stub
) -> None:
    blob_host.route("GET", "/blob/9.zip", lambda _r: _bytes(b"PK\x03\x04zipdata"))
    stub.script(
        "GET", "/repos/acme/bench/actions/artifacts/9/zip", reply(302, {}, Location=f"{blob_host.url}/blob/9.zip?sig=abc")
    )
    data = await inst.download(f"{stub.url}{PREFIX}/repos/acme/bench/actions/artifacts/9/zip", max_bytes=1024)
    assert data == b"PK\x03\x04zipdata"
    api_call = stub.calls("GET", "/repos/acme/bench/actions/artifacts/9/zip")[0]
    assert api_call.headers["Authorization"].startswith("token ")
    assert blob_host.seen[0].query == {"sig": "abc"}
    assert "Authorization" not in blob_host.seen[0].headers


async def test_download_caps_by_content_length_and_by_bytes_read(
    inst: InstallationClient, stub: Stub, blob_host: Stub
) -> None:
    async def announced(_request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"x" * 2000)

    async def chunked(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(20):
            await response.write(b"y" * 100)
        await response.write_eof()
        return response

    blob_host.route("GET", "/announced", announced)
    blob_host.route("GET", "/chunked", chunked)
    stub.script("GET", "/a/1", reply(302, {}, Location=f"{blob_host.url}/announced"))
    stub.script("GET", "/a/2", reply(302, {}, Location=f"{blob_host.url}/chunked"))
    stub.script("GET", "/a/3", reply(302, {}, Location=f"{blob_host.url}/chunked"))
    with pytest.raises(TooLarge) as caught:
        await inst.download("/a/1", max_bytes=1999)
    assert "announced" in caught.value.message
    with pytest.raises(TooLarge) as caught:
        await inst.download("/a/2", max_bytes=1999)
    assert "received" in caught.value.message
    assert await inst.download("/a/3", max_bytes=2000) == b"y" * 2000


async def test_a_failing_storage_host_retries_the_whole_download(
    inst: InstallationClient, stub: Stub, blob_host: Stub
) -> None:
    blob_host.script("GET", "/blob", reply(503, {"message": "busy"}))
    blob_host.route("GET", "/blob", lambda _r: _bytes(b"PK-data"))
    redirect = reply(302, {}, Location=f"{blob_host.url}/blob")
    stub.script("GET", "/a/9/zip", redirect, redirect)
    assert await inst.download("/a/9/zip", max_bytes=100) == b"PK-data"
    # Each attempt asks the API again, since a signed storage URL may have gone stale.
    assert len(stub.calls("GET", "/a/9/zip")) == 2
    assert [s.status for s in blob_host.seen] == [503, 200]


async def test_an_expired_artifact_is_not_found(inst: InstallationClient, stub: Stub) -> None:
    stub.script("GET", "/repos/acme/bench/actions/artifacts/9/zip", reply(410, {"message": "Artifact has expired"}))
    with pytest.raises(NotFound) as caught:
        await inst.download("/repos/acme/bench/actions/artifacts/9/zip", max_bytes=10)
    assert caught.value.status == 410


async def _bytes(data: bytes) -> web.StreamResponse:
    return web.Response(body=data, content_type="application/zip")


# ------------------------------------------------------------- against the sandbox

SANDBOX_API = "/_sandbox/github"
SANDBOX_SCENARIO: dict[str, Any] = {
    "now": "2026-11-30T08:00:00Z",
    "repositories": [
        {
            "full_name": "acme/bench",
            "installation_id": 1,
            "files": {"configs/nvidia-master.yaml": "dsr1-fp4-b200-sglang:\n  image: lmsysorg/sglang:v0.5.3\n"},
            "pulls": [
                {"number": n, "title": f"Bump {n}", "user": "bob", "head_ref": f"bump-{n}",
                 "files": [{"filename": f"docs/{n}.md", "content": f"change {n}\n"}]}
                for n in range(1, 26)
            ],
            "runs": [
                {"id": 101, "workflow": "klaud-candidate.yml", "conclusion": "success",
                 "artifacts": [{"name": "klaud-candidate-x",
                                "files": {"candidate-diagnostics.json": "z" * 5000}}]}
            ],
        }
    ],
}


@dataclass
class Sandboxed:
    sandbox: Any
    url: str
    clock: ManualClock
    blob_authorization: list[str | None]

    async def faults(self, session: aiohttp.ClientSession, *rules: dict[str, Any]) -> None:
        async with session.post(f"{self.url}/_sandbox/faults", json={"rules": list(rules)}) as response:
            assert response.status == 200, await response.text()

    def log(self) -> list[tuple[str, str, int]]:
        """(method, route, status) of every request the sandbox answered, in order."""
        entries = self.sandbox.request_log["requests"]
        return [(e["method"], e["route"].split(" ", 1)[1], e["status"]) for e in entries]

    def statuses(self, method: str, route: str) -> list[int]:
        return [status for m, r, status in self.log() if (m, r) == (method, route)]


@pytest.fixture
async def sandboxed() -> AsyncIterator[Callable[..., Awaitable[Sandboxed]]]:
    """Start the real sandbox on 127.0.0.1; `strict`/`public_key` select its auth mode."""
    runners: list[web.AppRunner] = []

    async def start(
        *, strict: bool = False, public_key: str | None = None, scenario: dict[str, Any] = SANDBOX_SCENARIO
    ) -> Sandboxed:
        clock = ManualClock(START)
        sandbox = Sandbox(
            scenario, clock=clock, webhook_secret=None, deliver_to=None,
            strict_auth=strict, app_id=1, app_public_key=public_key,
        )
        blob_authorization: list[str | None] = []

        @web.middleware
        async def watch_blobs(request: web.Request, handler: Handler) -> web.StreamResponse:
            if request.path.startswith("/_sandbox/blobs/"):
                blob_authorization.append(request.headers.get("Authorization"))
            return await handler(request)

        app = sandbox.create_app()
        app.middlewares.append(watch_blobs)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return Sandboxed(sandbox, f"http://127.0.0.1:{port}", clock, blob_authorization)

    yield start
    for runner in runners:
        await runner.cleanup()


def sandbox_app(session: aiohttp.ClientSession, sb: Sandboxed, **options: Any) -> GitHubApp:
    settings: dict[str, Any] = {"app_id": 1, "private_key": None, "clock": sb.clock}
    settings.update(options)
    return GitHubApp(session, base_url=sb.url + SANDBOX_API, **settings)


PULL = "/repos/{owner}/{repo}/pulls/{pull_number}"
PULLS = "/repos/{owner}/{repo}/pulls"
MINT = "/app/installations/{installation_id}/access_tokens"


async def test_sandbox_5xx_burst_then_success(sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession) -> None:
    sb = await sandboxed()
    await sb.faults(session, {"method": "GET", "route": r"/pulls/3$", "status": 502, "count": 2},
                    {"method": "GET", "route": r"/pulls/3$", "status": 503, "count": 1})
    pull = await sandbox_app(session, sb).installation(1).getitem("/repos/acme/bench/pulls/3")
    assert pull["number"] == 3
    assert sb.statuses("GET", PULL) == [502, 502, 503, 200]


async def test_sandbox_timeouts_are_retried(sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession) -> None:
    sb = await sandboxed()
    await sb.faults(session, {"method": "GET", "route": r"/pulls/4$", "latency_ms": 600, "count": 1})
    before = requests_metric("GET", "/repos/{owner}/{repo}/pulls/{number}", "timeout")
    inst = sandbox_app(session, sb, request_timeout=0.2).installation(1)
    assert (await inst.getitem("/repos/acme/bench/pulls/4"))["number"] == 4
    assert requests_metric("GET", "/repos/{owner}/{repo}/pulls/{number}", "timeout") == before + 1
    assert 200 in sb.statuses("GET", PULL)


async def test_sandbox_retry_after(sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession) -> None:
    sb = await sandboxed()
    await sb.faults(session, {"method": "GET", "route": r"/pulls$", "status": 429, "retry_after": 20, "count": 1})
    inst = sandbox_app(session, sb).installation(1)
    pulls = [p async for p in inst.getiter("/repos/acme/bench/pulls")]
    assert len(pulls) == 25
    assert sb.clock.slept == [20.0]
    assert sb.statuses("GET", PULLS) == [429, 200]


async def test_sandbox_quota_exhausted_fails_until_the_reset_then_re_mints(
    sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession
) -> None:
    sb = await sandboxed()
    await sb.faults(session, {"method": "GET", "route": r"/pulls/5$", "status": 403,
                              "ratelimit_remaining_zero": True, "count": 1})
    inst = sandbox_app(session, sb).installation(1)
    with pytest.raises(RateLimited) as raised:
        await inst.getitem("/repos/acme/bench/pulls/5")
    # The sandbox's hourly window opened at 08:00:00, so it resets at 09:00:00.
    assert raised.value.retry_after == 3600.0 and sb.clock.slept == []
    sb.clock.advance(3600)
    assert (await inst.getitem("/repos/acme/bench/pulls/5"))["number"] == 5
    retried = sb.sandbox.request_log["requests"][-1]
    assert (retried["status"], retried["at"]) == (200, "2026-11-30T09:00:00Z")
    # The token minted at 08:00 expires at 09:00, so the retry carried a fresh one.
    assert sb.statuses("POST", MINT) == [201, 201]


async def test_sandbox_etag_304_is_served_from_cache(sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession) -> None:
    sb = await sandboxed()
    inst = sandbox_app(session, sb).installation(1)
    first = await inst.getitem("/repos/acme/bench/pulls/7")
    second = await inst.getitem("/repos/acme/bench/pulls/7")
    assert first == second and first["number"] == 7
    assert sb.statuses("GET", PULL) == [200, 304]


async def test_sandbox_pagination_and_repositories(sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession) -> None:
    sb = await sandboxed()
    app = sandbox_app(session, sb)
    inst = app.installation(1)
    numbers = [p["number"] async for p in inst.getiter("/repos/acme/bench/pulls?per_page=10")]
    assert sorted(numbers) == list(range(1, 26))
    assert sb.statuses("GET", PULLS) == [200, 200, 200]
    assert [r["full_name"] for r in await inst.repositories()] == ["acme/bench"]
    assert [i["id"] for i in await app.installations()] == [1]


RUNS = "/repos/{owner}/{repo}/actions/workflows/{workflow_id}/runs"
BUSY_SINCE = datetime(2026, 11, 1, tzinfo=UTC)


def busy_scenario(runs: int, queued: int | None = None) -> dict[str, Any]:
    """`runs` completed runs of the candidate workflow, one a minute from 2026-11-01 00:00,
    ids 5000 onwards (the `queued` one still queued)."""
    def run(i: int) -> dict[str, Any]:
        created = BUSY_SINCE + timedelta(minutes=i)
        if i == queued:
            return {"id": 5000 + i, "workflow": "klaud-candidate.yml", "status": "queued", "created_at": stamp(created)}
        return {"id": 5000 + i, "workflow": "klaud-candidate.yml", "conclusion": "success",
                "created_at": stamp(created), "completed_at": stamp(created + timedelta(seconds=30))}

    [repository] = SANDBOX_SCENARIO["repositories"]
    return {**SANDBOX_SCENARIO, "repositories": [{**repository, "runs": [run(i) for i in range(runs)]}]}


async def listed_runs(session: aiohttp.ClientSession, sb: Sandboxed, *, active: bool = False) -> list[int]:
    repo = GitHubRepo(sandbox_app(session, sb).installation(1), "acme/bench")
    return [run.id async for run in repo.workflow_runs("klaud-candidate.yml", created_since=BUSY_SINCE.date(), active=active)]


async def test_sandbox_runs_past_githubs_cap_of_1000_are_listed_by_a_narrower_search(
    sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession
) -> None:
    # What this catches (review C): GitHub lists at most 1,000 runs of a listing filtered by
    # `created` or `status`, newest first, and Klaud read only that: on a repository with
    # more runs since the bound, the oldest ones (their outcomes, for a reconcile) were lost.
    sb = await sandboxed(scenario=busy_scenario(2_105))
    runs = await listed_runs(session, sb)
    assert sorted(runs) == list(range(5000, 7105)) and len(runs) == len(set(runs))
    searches = [e["query"] for e in sb.sandbox.request_log["requests"] if e["route"] == f"GET {RUNS}"]
    # 10 pages of 100 per search, none past the cap; each narrower one ends at the oldest run seen.
    # (1,000 newest down to 18:25, then from that minute 1,000 down to 01:46, then 107.)
    assert len(searches) == 10 + 10 + 2
    assert searches[10].endswith("created=2026-11-01T00:00:00Z..2026-11-01T18:25:00Z")
    assert searches[20].endswith("created=2026-11-01T00:00:00Z..2026-11-01T01:46:00Z")


async def test_sandbox_a_run_in_flight_behind_a_thousand_newer_ones_is_seen(
    sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession
) -> None:
    # The claims keeper's "in flight" reading lists runs of every status: a run still queued
    # behind 1,000 newer ones was taken for absent, and its claim released.
    sb = await sandboxed(scenario=busy_scenario(1_005, queued=0))
    assert await listed_runs(session, sb, active=True) == [5000]


async def test_sandbox_runs_no_narrower_search_reaches_fail_instead_of_being_passed_over(
    sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(repo_module, "MAX_RUN_SEARCHES", 2)
    sb = await sandboxed(scenario=busy_scenario(2_105))
    with pytest.raises(BadRequest, match="do not fit in 2 searches of 1000"):
        await listed_runs(session, sb)
    assert len(sb.statuses("GET", RUNS)) == 20
    one_second = busy_scenario(1_001)
    for run in one_second["repositories"][0]["runs"]:
        run["created_at"] = "2026-11-01T00:00:00Z"
    sb = await sandboxed(scenario=one_second)
    with pytest.raises(BadRequest):
        await listed_runs(session, sb)
    assert len(sb.statuses("GET", RUNS)) == 20  # the same second twice, then no further search


async def test_sandbox_fewer_runs_than_the_cap_take_no_further_search(
    sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession
) -> None:
    sb = await sandboxed(scenario=busy_scenario(999))
    assert len(await listed_runs(session, sb)) == 999
    assert sb.statuses("GET", RUNS) == [200] * 10


async def test_sandbox_write_spacing(sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession) -> None:
    sb = await sandboxed()
    inst = sandbox_app(session, sb).installation(1)
    await asyncio.gather(*(inst.post("/repos/acme/bench/issues/1/comments", data={"body": f"c{i}"}) for i in range(3)))
    times = [e["at"] for e in sb.sandbox.request_log["requests"] if e["method"] == "POST" and "comments" in e["path"]]
    assert times == ["2026-11-30T08:00:00Z", "2026-11-30T08:00:01Z", "2026-11-30T08:00:02Z"]


async def test_sandbox_dry_run_sends_no_write(sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession) -> None:
    sb = await sandboxed()
    before = sb.sandbox.state_document()["repositories"]["acme/bench"]
    inst = sandbox_app(session, sb, dry_run=True).installation(1)
    ref = await inst.getitem("/repos/acme/bench/git/ref/heads/main")
    assert await inst.post("/repos/acme/bench/git/refs", data={"ref": "refs/heads/klaud/claim-1", "sha": ref["object"]["sha"]}) == {}
    assert await inst.post("/repos/acme/bench/issues/1/comments", data={"body": "hello"}) == {}
    await inst.delete("/repos/acme/bench/git/refs/heads/main")
    writes = [(m, r) for m, r, _ in sb.log() if m != "GET"]
    assert writes == [("POST", MINT)]
    after = sb.sandbox.state_document()["repositories"]["acme/bench"]
    assert after["comments"] == [] and after["refs"] == before["refs"]
    assert "refs/heads/main" in after["refs"]


async def test_sandbox_typed_errors(sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession) -> None:
    sb = await sandboxed()
    inst = sandbox_app(session, sb).installation(1)
    with pytest.raises(NotFound):
        await inst.getitem("/repos/acme/bench/pulls/999")
    head = (await inst.getitem("/repos/acme/bench/git/ref/heads/main"))["object"]["sha"]
    claim = {"ref": "refs/heads/klaud/claim-0123456789abcdef", "sha": head}
    created = await inst.post("/repos/acme/bench/git/refs", data=claim)
    assert created["ref"] == claim["ref"]
    with pytest.raises(Conflict) as caught:
        await inst.post("/repos/acme/bench/git/refs", data=claim)
    assert caught.value.status == 422 and "already exists" in caught.value.message


async def test_sandbox_create_ref_that_timed_out_is_read_back_before_it_is_sent_again(
    sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession
) -> None:
    sb = await sandboxed()
    inst = sandbox_app(session, sb, request_timeout=0.2).installation(1)
    head = (await inst.getitem("/repos/acme/bench/git/ref/heads/main"))["object"]["sha"]
    # The sandbox drops a request whose client gave up during the injected latency, so
    # this timed-out create did not happen: verify finds no ref and the POST goes again.
    await sb.faults(session, {"method": "POST", "route": r"/git/refs$", "latency_ms": 600, "count": 1})
    verified: list[Any] = []

    async def verify() -> Any:
        ref = await inst.getitem("/repos/acme/bench/git/ref/heads/klaud/claim-1")
        verified.append(ref)
        return ref if ref["object"]["sha"] == head else None

    created = await inst.post("/repos/acme/bench/git/refs", data={"ref": "refs/heads/klaud/claim-1", "sha": head}, verify=verify)
    assert created["object"]["sha"] == head
    assert verified == []  # the read answered 404, which counts as "not created"
    assert sb.statuses("GET", "/repos/{owner}/{repo}/git/ref/{ref}") == [200, 404]
    assert sb.statuses("POST", "/repos/{owner}/{repo}/git/refs") == [201]


async def test_sandbox_download_redirect_drops_the_token_and_caps(
    sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession
) -> None:
    sb = await sandboxed()
    inst = sandbox_app(session, sb).installation(1)
    artifact = (await inst.getitem("/repos/acme/bench/actions/runs/101/artifacts"))["artifacts"][0]
    archive = await inst.download(artifact["archive_download_url"], max_bytes=1_000_000)
    assert archive.startswith(b"PK\x03\x04")
    with pytest.raises(TooLarge):
        await inst.download(artifact["archive_download_url"], max_bytes=len(archive) - 1)
    assert sb.statuses("GET", "/repos/{owner}/{repo}/actions/artifacts/{artifact_id}/{archive_format}") == [302, 302]
    assert sb.blob_authorization == [None, None]


async def test_sandbox_strict_auth_with_a_real_key(sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession) -> None:
    private, public = rsa_keys()
    sb = await sandboxed(strict=True, public_key=public)
    app = sandbox_app(session, sb, private_key=private)
    assert [i["id"] for i in await app.installations()] == [1]
    inst = app.installation(1)
    assert (await inst.getitem("/repos/acme/bench/pulls/1"))["number"] == 1
    # Past the token's renewal point a new one is minted before GitHub would refuse it.
    sb.clock.advance(3600 - 299)
    assert (await inst.getitem("/repos/acme/bench/pulls/2"))["number"] == 2
    assert sb.statuses("POST", MINT) == [201, 201]
    # A refused token is re-minted once (it is past the seconds a new one may take to replicate).
    sb.clock.advance(60)
    await sb.faults(session, {"method": "GET", "route": r"/pulls/3$", "status": 401, "count": 1})
    assert (await inst.getitem("/repos/acme/bench/pulls/3"))["number"] == 3
    assert sb.statuses("GET", PULL)[-2:] == [401, 200]
    assert sb.statuses("POST", MINT) == [201, 201, 201]


async def test_sandbox_strict_auth_refuses_another_key(sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession) -> None:
    _, public = rsa_keys()
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    sb = await sandboxed(strict=True, public_key=public)
    inst = sandbox_app(session, sb, private_key=other).installation(1)
    with pytest.raises(Unauthorized):
        await inst.getitem("/repos/acme/bench/pulls/1")
    assert sb.statuses("POST", MINT) == [401] * 5


@pytest.mark.parametrize(
    ("api", "url", "same"),
    [
        ("https://ghe.example.com:443/api/v3", "https://ghe.example.com/api/v3/repos/a/b", True),
        ("https://ghe.example.com/api/v3", "https://GHE.example.com:443/api/v3/x", True),
        ("http://127.0.0.1:80/_sandbox/github", "http://127.0.0.1/_sandbox/github/x", True),
        ("https://ghe.example.com", "https://ghe.example.com:8443/x", False),
        ("https://ghe.example.com", "http://ghe.example.com/x", False),
        ("https://api.github.com", "https://objects.githubusercontent.com/x", False),
    ],
)
def test_origins_compare_with_default_ports_made_explicit(api: str, url: str, same: bool) -> None:
    assert (origin_of(api) == origin_of(url)) is same


async def test_deleting_a_branch_already_gone_is_false_and_a_refused_delete_raises(
    sandboxed: Callable[..., Awaitable[Sandboxed]], session: aiohttp.ClientSession
) -> None:
    # What this catches: every 422 taken for "already gone", so a ruleset forbidding
    # deletions was logged as a claim already released and a stray ref forgotten undeleted.
    sb = await sandboxed()
    repo = GitHubRepo(sandbox_app(session, sb).installation(1), "acme/bench")
    assert await repo.delete_branch("klaud/claim-0123456789abcdef") is False  # 422 Reference does not exist
    await sb.faults(session, {"method": "DELETE", "route": "/git/refs/", "status": 422,
                              "message": "Repository rule violations found\n\nCannot delete this branch"})
    with pytest.raises(Conflict, match="Repository rule violations"):
        await repo.delete_branch("main")


async def test_creating_an_issue_in_dry_run_makes_none_and_says_so(make_app: Callable[..., GitHubApp], stub: Stub) -> None:
    # What this catches: the pretend answer of a dry-run write ({}) read for its number: a KeyError.
    assert await GitHubRepo(make_app(dry_run=True).installation(7), "acme/bench").create_issue("t", "b") is None


@pytest.mark.parametrize(("url", "repo"), [
    ("https://api.github.com/repos/acme/bench/issues/12/comments", "acme/bench"),
    ("https://ghe.example/api/v3/repos/Acme/bench.js/git/refs", "Acme/bench.js"),
    ("https://api.github.com/repos/acme/bench", "acme/bench"),
    ("https://api.github.com/repositories/42/issues/1/comments", None),
    ("https://api.github.com/app/installations/7/access_tokens", None),
])
def test_the_repository_a_write_is_for_is_read_from_its_url(url: str, repo: str | None) -> None:
    assert repository_of(url) == repo


class _OneAnswer:
    """A client whose every GET answers `answer` (GitHub's, or a proxy's)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer

    async def getitem(self, url: str, url_vars: Any = None, *, params: Any = None, accept: Any = None) -> Any:
        return self.answer


@pytest.mark.parametrize("odd", [
    "not an object",
    {"ref": "refs/heads/main", "after": None, "timestamp": "2026-12-01T00:00:00Z"},
    {"ref": "refs/heads/main", "after": "c" * 40, "timestamp": "yesterday"},
    # Year 1 east of UTC: converting it overflowed, an OverflowError pydantic did not wrap.
    {"ref": "refs/heads/main", "after": "c" * 40, "timestamp": "0001-01-01T00:00:00+05:00"},
])
async def test_an_activity_entry_of_another_shape_dates_nothing_and_the_others_still_do(odd: Any) -> None:
    # What this catches (a review): one entry pydantic could not read raised out of the
    # light reconcile, so a missed push, the open PRs and the claims were never caught up.
    moved = {"ref": "refs/heads/main", "after": "c" * 40, "timestamp": "2026-12-01T08:00:00Z", "activity_type": "push"}
    assert await GitHubRepo(_OneAnswer([odd]), "acme/bench").moved_to_at("main", "c" * 40) is None  # type: ignore[arg-type]
    found = await GitHubRepo(_OneAnswer([odd, moved]), "acme/bench").moved_to_at("main", "c" * 40)  # type: ignore[arg-type]
    assert found == datetime(2026, 12, 1, 8, tzinfo=UTC)


class _Trees:
    """A client answering a folder's contents with GitHub's first 1,000 entries, and trees."""

    def __init__(self, trees: dict[str, dict[str, Any]]) -> None:
        self.trees = trees
        self.asked: list[str] = []

    async def getitem(self, url: str, url_vars: Any = None, *, params: Any = None, accept: Any = None) -> Any:
        if url.endswith("/contents/{+path}"):
            return [{"type": "file", "path": f"{url_vars['path']}/n-{number:04d}.md"} for number in range(1_000)]
        self.asked.append(url_vars["tree"])
        return self.trees[url_vars["tree"]]


async def test_a_folder_of_a_thousand_entries_is_read_from_its_tree_down_the_path() -> None:
    notes = [{"path": f"n-{number:04d}.md", "type": "blob"} for number in range(1_200)]
    client = _Trees({
        "c" * 40: {"tree": [{"path": "deploy", "type": "tree", "sha": "d1"}, {"path": "x", "type": "blob"}]},
        "d1": {"tree": [{"path": "configs", "type": "tree", "sha": "d2"}]},
        "d2": {"tree": [*notes, {"path": "a-master.yaml", "type": "blob"}, {"path": "old", "type": "tree", "sha": "d3"}],
               "truncated": False},
    })
    found = await GitHubRepo(client, "acme/bench").directory("deploy/configs", "c" * 40)  # type: ignore[arg-type]
    assert client.asked == ["c" * 40, "d1", "d2"]
    assert len(found) == 1_201 and "deploy/configs/a-master.yaml" in found and "deploy/configs/old" not in found


async def test_a_tree_github_lists_only_in_part_is_an_error_not_a_shorter_folder() -> None:
    # Families of the configs past the part would be retired by the next full reload.
    client = _Trees({"c" * 40: {"tree": [{"path": "configs", "type": "tree", "sha": "d1"}]},
                     "d1": {"tree": [{"path": "a-master.yaml", "type": "blob"}], "truncated": True}})
    with pytest.raises(TooLarge, match="configs: GitHub lists only part of its tree"):
        await GitHubRepo(client, "acme/bench").directory("configs", "c" * 40)  # type: ignore[arg-type]


@pytest.mark.parametrize(("method", "path"), [
    ("patch", "/repos/acme/bench/issues/1"),
    ("post", "/repos/acme/bench/actions/workflows/klaud-candidate.yml/dispatches"),
])
async def test_a_write_whose_cause_could_not_be_committed_is_not_sent_nor_taken_for_a_lost_answer(
    make_app: Callable[..., GitHubApp], stub: Stub, method: str, path: str
) -> None:
    # What this catches: the commit (inside the request loop since the ownership check moved
    # there) timed out, was taken for GitHub not answering: a PATCH was sent again with its
    # cause uncommitted, a dispatch reported as maybe sent though nothing left.
    async def before_write(url: str) -> None:
        raise TimeoutError  # the store's wait for a connection

    inst = make_app(before_write=before_write).installation(7)
    with pytest.raises(NotSent, match="not sent: TimeoutError") as refused:
        await getattr(inst, method)(path, data={})
    assert refused.value.transient and not stub.calls(method.upper(), path)


DISPATCH_PATH = "/repos/acme/bench/actions/workflows/klaud-candidate.yml/dispatches"
DISPATCH_BODY = {"ref": "main", "inputs": {}, "return_run_details": True}


def raw(status, body, ctype="application/json"):
    async def answer(_r):
        return web.Response(status=status, body=body, headers={"content-type": ctype})
    return answer


async def test_a_2xx_write_with_a_broken_body_is_maybe_applied(inst: InstallationClient, stub: Stub) -> None:
    stub.script("POST", DISPATCH_PATH, raw(200, b'{"workflow_run_id": 12'))  # run started, body cut
    with pytest.raises(Unavailable) as caught:
        await inst.post(DISPATCH_PATH, data=DISPATCH_BODY)
    assert caught.value.maybe_applied


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_a_status_outside_httpstatus_is_a_github_error(inst: InstallationClient, stub: Stub, method) -> None:
    stub.route(method, "/repos/acme/bench/issues", raw(520, b"<html>origin error</html>", "text/html"))
    with pytest.raises(GitHubError):
        if method == "GET":
            await inst.getitem("/repos/acme/bench/issues")
        else:
            await inst.post("/repos/acme/bench/issues", data={"title": "t"})


async def test_a_spent_quota_is_waited_for_by_githubs_clock(inst: InstallationClient, stub: Stub) -> None:
    github_now = T0 - 600  # our clock 10 min ahead of GitHub's; quota resets in 5 min of its own
    stub.route("GET", "/repos/acme/bench", reply(403, {"message": "API rate limit exceeded"}, **{
        "x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(github_now + 300)),
        "date": formatdate(github_now, usegmt=True)}))
    with pytest.raises(RateLimited) as caught:
        await inst.getitem("/repos/acme/bench")
    assert len(stub.calls("GET", "/repos/acme/bench")) == 1  # today: 5 requests, 1 s apart
    assert (caught.value.retry_after or 0) >= 250  # today: 1.0


async def test_a_write_never_sent_for_want_of_a_token_is_not_maybe_applied(inst: InstallationClient, stub: Stub) -> None:
    stub.route("POST", "/app/installations/7/access_tokens", disconnect)
    with pytest.raises(Unavailable) as caught:
        await inst.post(DISPATCH_PATH, data=DISPATCH_BODY)
    assert stub.calls("POST", DISPATCH_PATH) == []
    assert not caught.value.maybe_applied


@pytest.mark.parametrize("status", [301, 302])
async def test_a_redirected_write_does_not_become_a_read(inst: InstallationClient, stub: Stub, status) -> None:
    comments = "/repos/acme/bench/issues/12/comments"

    async def moved(request):
        return web.Response(status=status, headers={"location": str(request.url)})
    stub.route("POST", comments, moved)
    stub.route("GET", comments, reply(200, []))
    try:
        answer = await inst.post(comments, data={"body": "hello"})
    except GitHubError:
        return
    assert [s for s in stub.calls("POST", comments) if s.status < 300], f"{answer!r} taken for the new comment"


async def test_the_check_run_found_on_a_head_is_this_apps_not_another_apps_of_the_same_name(
    make_app: Callable[..., GitHubApp], stub: Stub
) -> None:
    # GitHub lists every App's runs named "Klaud Cold": a staging Klaud's came first, and
    # this one updated it (which GitHub refuses) instead of creating its own.
    path = "/repos/acme/bench/commits/" + "a" * 40 + "/check-runs"
    runs = [{"id": 5, "name": "Klaud Cold", "app": {"id": 99}}, {"id": 6, "name": "Klaud Cold", "app": {"id": 1}}]
    stub.route("GET", path, reply(200, {"total_count": 2, "check_runs": runs}))
    repo = GitHubRepo(make_app().installation(7), "acme/bench")
    assert await repo.check_run_on("a" * 40, "Klaud Cold") == 6
    stub.route("GET", path, reply(200, {"total_count": 1, "check_runs": runs[:1]}))
    assert await repo.check_run_on("a" * 40, "Klaud Cold") is None
