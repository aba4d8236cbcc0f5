"""The GitHub client against what real GitHub does: gateway pages on GraphQL, bodies that are
not the JSON they claim, rate limits an hour long or garbled, GraphQL's own budget, listings
whose pages never end, one ETag for a file's JSON and raw forms, and a renamed repository's
artifact URL (found by an audit of the client; each test failed before its fix)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from bot.core.clock import Clock, ManualClock
from bot.core.errors import is_transient
from bot.github.client import (
    MAX_CALL_WAIT,
    SECONDARY_RATE_LIMIT_WAIT,
    GitHubApp,
    InstallationClient,
    route_template,
)
from bot.github.errors import GitHubError, RateLimited, Unavailable
from bot.github.repo import BLAME_QUERY, GitHubRepo
from bot.metrics import REGISTRY
from tests.github.test_github import PREFIX, T0, Stub, reply, requests_metric, serve

GRAPHQL = "/api/graphql"  # graphql_endpoint(stub.url + "/api/v3")


def html(status: int, text: str = "<html><body><h1>502 Bad Gateway</h1></body></html>") -> Callable[..., Any]:
    async def answer(_request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, text=text, content_type="text/html")

    return answer


def graphql_route(stub: Stub, handler: Callable[..., Any]) -> None:
    stub.routes[("POST", GRAPHQL)] = handler


def graphql_calls(stub: Stub) -> int:
    return sum(1 for s in stub.seen if s.path == GRAPHQL)


# ---------------------------------------------------------------- F1 GraphQL non-JSON bodies


async def test_graphql_502_with_an_html_body_is_unavailable(inst: InstallationClient, stub: Stub) -> None:
    """GitHub's edge answers 502/504 with an HTML page on any route, /graphql included.
    The client retries it (a read) and must then raise Unavailable (transient)."""
    graphql_route(stub, html(502))
    try:
        await inst.graphql(BLAME_QUERY, owner="acme", name="bench", ref="main", path="x")
    except Exception as exc:  # noqa: BLE001
        caught: BaseException = exc
    else:
        pytest.fail("no error")
    assert isinstance(caught, Unavailable), f"untyped {type(caught).__module__}.{type(caught).__name__}: {caught}"


async def test_graphql_504_with_an_empty_body_is_unavailable(inst: InstallationClient, stub: Stub) -> None:
    async def empty(_request: web.Request) -> web.StreamResponse:
        return web.Response(status=504)

    graphql_route(stub, empty)
    with pytest.raises(Exception) as caught:
        await inst.graphql(BLAME_QUERY, owner="acme", name="bench", ref="main", path="x")
    assert isinstance(caught.value, Unavailable), f"untyped {type(caught.value).__name__}: {caught.value}"


async def test_blame_behind_a_gateway_error_is_a_transient_github_error(inst: InstallationClient, stub: Stub) -> None:
    """CatalogSync.date_images catches GitHubError only (catalog_sync.py:150); the inbox
    fails a delivery at once on a non-transient error (core/errors.py)."""
    graphql_route(stub, html(504, "<html>Gateway Time-out</html>"))
    repo = GitHubRepo(inst, "acme/bench")
    with pytest.raises(Exception) as caught:
        await repo.blame("configs/nvidia-master.yaml", "a" * 40)
    assert isinstance(caught.value, GitHubError), f"not a GitHubError: {type(caught.value).__name__}"
    assert is_transient(caught.value)


async def test_a_json_labelled_body_that_is_not_json_is_a_typed_error(inst: InstallationClient, stub: Stub) -> None:
    """A body cut short behind a proxy (or any non-JSON body under a JSON content type)
    must reach callers as a GitHubError, not a json.JSONDecodeError."""

    async def cut(_request: web.Request) -> web.StreamResponse:
        return web.Response(status=200, body=b'{"sha": "abc', content_type="application/json")

    stub.route("GET", "/repos/acme/bench/commits/main", cut)
    with pytest.raises(Exception) as caught:
        await inst.getitem("/repos/acme/bench/commits/main")
    assert isinstance(caught.value, GitHubError), f"untyped {type(caught.value).__name__}: {caught.value}"


# ------------------------------------------------------------ F2 unbounded rate-limit waits


async def test_a_reset_an_hour_away_is_surfaced_not_slept_through(
    inst: InstallationClient, stub: Stub, clock: ManualClock
) -> None:
    """Primary quota spent with the reset 60 min away: the call must not sleep an hour
    inside a webhook handler or a scheduler tick; it should raise RateLimited(retry_after)."""
    headers = {"x-ratelimit-remaining": "0", "x-ratelimit-limit": "5000", "x-ratelimit-reset": str(int(T0) + 3600)}
    stub.script("GET", "/repos/acme/bench", reply(403, {"message": "API rate limit exceeded for installation ID 7."}, **headers))
    with pytest.raises(RateLimited) as raised:
        await inst.getitem("/repos/acme/bench")
    assert raised.value.retry_after == 3600.0
    assert max(clock.slept, default=0.0) <= MAX_CALL_WAIT, f"one call slept {clock.slept} s"


async def test_rate_limits_answered_again_and_again_hold_one_call_a_minute_in_all(
    inst: InstallationClient, stub: Stub, clock: ManualClock
) -> None:
    # What this catches: each wait capped alone, so four answers asking for 60 s held one
    # call (a handler, the scheduler's tick) four minutes; README promises at most a minute.
    for _ in range(6):
        stub.script("GET", "/repos/acme/bench", reply(429, {"message": "slow down"}, **{"Retry-After": "60"}))
    with pytest.raises(RateLimited):
        await inst.getitem("/repos/acme/bench")
    assert sum(clock.slept) <= MAX_CALL_WAIT, f"one call slept {clock.slept} s"


async def test_a_huge_retry_after_does_not_hang_the_call_on_the_real_clock(
    session: aiohttp.ClientSession, stub: Stub
) -> None:
    """Real clock: a Retry-After of a day (or a hostile 1e9) holds the call (and every
    other call of the installation) that long; nothing surfaces."""
    stub.script("GET", "/repos/acme/bench", reply(429, {"message": "slow down"}, **{"Retry-After": "86400"}))
    app = GitHubApp(session, base_url=stub.url + PREFIX, app_id=1, private_key=None, clock=Clock())
    inst = app.installation(7)
    try:
        await asyncio.wait_for(inst.getitem("/repos/acme/bench"), 3.0)
    except RateLimited:
        return
    except TimeoutError:
        pytest.fail("getitem was still sleeping after 3 s (Retry-After: 86400 is slept in full)")


async def test_retry_after_nan_does_not_make_the_client_hammer(
    make_app: Callable[..., GitHubApp], stub: Stub, clock: ManualClock
) -> None:
    """A garbled Retry-After must fall back to the one-minute wait, not to no wait."""
    inst = make_app().installation(7)
    stub.route("GET", "/repos/acme/bench", reply(429, {"message": "slow down"}, **{"Retry-After": "nan"}))
    with pytest.raises(RateLimited):
        await inst.getitem("/repos/acme/bench")
    calls = stub.calls("GET", "/repos/acme/bench")
    # A minute apart, and a call waits a minute in all: sent twice, then RateLimited.
    assert len(calls) == 2
    assert calls[1].at - calls[0].at >= SECONDARY_RATE_LIMIT_WAIT, (
        f"2 rate-limited requests sent within {calls[1].at - calls[0].at} s; slept {clock.slept}"
    )


# ------------------------------------------------------------- F3 GraphQL and the REST gate


async def test_a_spent_graphql_quota_does_not_hold_rest_calls(
    inst: InstallationClient, stub: Stub, clock: ManualClock
) -> None:
    """GitHub keeps separate budgets (x-ratelimit-resource: core / graphql / search).
    Spending GraphQL's must not stop the installation's REST calls until its reset."""
    headers = {
        "x-ratelimit-limit": "5000",
        "x-ratelimit-remaining": "0",
        "x-ratelimit-used": "5000",
        "x-ratelimit-resource": "graphql",
        "x-ratelimit-reset": str(int(T0) + 1800),
    }
    graphql_route(stub, reply(200, {"data": {"repository": None}}, **headers))
    await inst.graphql(BLAME_QUERY, owner="acme", name="bench", ref="main", path="x")
    await inst.getitem("/repos/acme/bench")  # core budget untouched
    assert clock.slept == [], f"a REST read waited {clock.slept} s for the GraphQL reset"


async def test_graphql_rate_limited_errors_are_rate_limited(inst: InstallationClient, stub: Stub) -> None:
    """GraphQL answers a spent quota with HTTP 200 and errors[].type RATE_LIMITED."""
    body = {"errors": [{"type": "RATE_LIMITED", "message": "API rate limit exceeded for installation ID 7."}]}
    headers = {"x-ratelimit-remaining": "0", "x-ratelimit-resource": "graphql", "x-ratelimit-reset": str(int(T0) + 600)}
    graphql_route(stub, reply(200, body, **headers))
    with pytest.raises(GitHubError) as caught:
        await inst.graphql(BLAME_QUERY, owner="acme", name="bench", ref="main", path="x")
    assert isinstance(caught.value, RateLimited), f"{type(caught.value).__name__} (transient={caught.value.transient})"


async def test_a_graphql_403_asking_to_wait_stays_rate_limited_after_its_retries(
    inst: InstallationClient, stub: Stub
) -> None:
    # What this catches: gidgethub's GraphQL errors carry no headers, so a 403 whose only
    # sign of a limit is its Retry-After header (its message says nothing of one) was
    # classified without it, after the retries, as a bad query: permanent.
    graphql_route(stub, reply(403, {"message": "Forbidden"}, **{"Retry-After": "1"}))
    with pytest.raises(GitHubError) as caught:
        await inst.graphql(BLAME_QUERY, owner="acme", name="bench", ref="main", path="x")
    assert isinstance(caught.value, RateLimited) and caught.value.transient
    assert graphql_calls(stub) > 1  # waited and sent again first


@pytest.mark.parametrize(("message", "transient"), [
    (("Something went wrong while executing your query. This may be the result of a timeout, or it could be a "
     "GitHub bug. Please include `1234:5678` when reporting this issue."), True),
    ("Field 'blames' doesn't exist on type 'Commit'", False),
])
async def test_a_graphql_error_of_no_type_is_transient_only_when_github_says_it_timed_out(
    inst: InstallationClient, stub: Stub, message: str, transient: bool
) -> None:
    # What this catches: GitHub's answer to a query it could not finish in time (200, no
    # data, an error without a type) taken for a bad query: permanent, never tried again.
    graphql_route(stub, reply(200, {"data": None, "errors": [{"message": message}]}))
    with pytest.raises(GitHubError) as caught:
        await inst.graphql(BLAME_QUERY, owner="acme", name="bench", ref="main", path="x")
    assert caught.value.transient is transient


# ---------------------------------------------------------- F4 empty pages with a next link


@pytest.mark.parametrize("next_page", [lambda page: page + 1, lambda page: page], ids=["ever-new", "the-same"])
async def test_pages_that_always_name_a_next_one_are_not_followed_for_ever(
    inst: InstallationClient, stub: Stub, next_page: Callable[[int], int]
) -> None:
    """MAX_LISTED counts items; a listing of empty pages whose Link always names a next
    page (or itself) was followed without end, as fast as the server answered."""

    async def empty(request: web.Request) -> web.StreamResponse:
        page = next_page(int(request.query.get("page", "1")))
        return web.json_response([], headers={"Link": f'<{stub.url}{PREFIX}/repos/acme/bench/pulls?page={page}>; rel="next"'})

    stub.route("GET", "/repos/acme/bench/pulls", empty)

    async def drain() -> list[Any]:
        return [p async for p in inst.getiter("/repos/{owner}/{repo}/pulls", {"owner": "acme", "repo": "bench"})]

    with pytest.raises(GitHubError):
        await asyncio.wait_for(drain(), 5.0)
    assert len(stub.calls("GET", "/repos/acme/bench/pulls")) <= 2


# ------------------------------------------------- F5 ETag cache keyed without the media type


async def test_a_large_file_read_raw_after_its_json_is_not_served_the_cached_json(
    inst: InstallationClient, stub: Stub
) -> None:
    """GitHub gives a file's JSON and raw representations the same ETag (octokit/rest.js#337)
    and answers If-None-Match with 304 whatever the Accept. file_text reads a file over
    1 MB twice (JSON says encoding "none", then the raw media type) with the same URL."""
    text = "families:\n" + "  x: 1\n" * 10
    etag = 'W/"495a13f66a7b267e5a3d9b7ac795289c60d79003"'

    async def contents(request: web.Request) -> web.StreamResponse:
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers={"ETag": etag})
        if "raw" in request.headers.get("Accept", ""):
            return web.Response(body=text.encode(), headers={"ETag": etag}, content_type="application/vnd.github.raw")
        entry = {"type": "file", "path": "configs/big.yaml", "size": 1_500_000, "encoding": "none", "content": ""}
        return web.json_response(entry, headers={"ETag": etag})

    stub.route("GET", "/repos/acme/bench/contents/configs/big.yaml", contents)
    got = await GitHubRepo(inst, "acme/bench").file_text("configs/big.yaml", "main")
    assert got == text, f"file_text returned {got!r}"


async def test_a_large_file_with_a_byte_that_is_not_utf_8_reads_with_a_replacement_not_a_failure(
    inst: InstallationClient, stub: Stub
) -> None:
    # What this catches: the raw read of a config over 1 MB decoded strictly, so one bad
    # byte failed it as a transient error at every retry, for ever; the JSON form of a
    # smaller file gets U+FFFD and the YAML parser reports the file.
    async def contents(request: web.Request) -> web.StreamResponse:
        if "raw" in request.headers.get("Accept", ""):
            return web.Response(body=b"a: \xff\n", content_type="application/vnd.github.raw")
        entry = {"type": "file", "path": "configs/big.yaml", "size": 1_500_000, "encoding": "none", "content": ""}
        return web.json_response(entry)

    stub.route("GET", "/repos/acme/bench/contents/configs/big.yaml", contents)
    assert await GitHubRepo(inst, "acme/bench").file_text("configs/big.yaml", "main") == "a: \ufffd\n"


# ------------------------------------------------- F6 same-origin redirect of a download


async def test_an_artifact_download_of_a_renamed_repository_keeps_the_token_on_the_api_host(
    inst: InstallationClient, stub: Stub
) -> None:
    """A renamed repository's old URL answers 301 to /repositories/{id}/… on the API host;
    that hop needs the token, and only the storage host's must go without it."""
    blob = Stub(stub.clock, prefix="")
    runner, blob.url = await serve(blob.handle)
    try:
        blob.route("GET", "/blob/9.zip", lambda _r: _zip())
        stub.script(
            "GET", "/repos/acme/old-name/actions/artifacts/9/zip",
            reply(301, {"message": "Moved Permanently"}, Location=f"{stub.url}{PREFIX}/repositories/42/actions/artifacts/9/zip"),
        )

        async def moved(request: web.Request) -> web.StreamResponse:
            if not request.headers.get("Authorization"):
                return web.json_response({"message": "Not Found"}, status=404)
            raise web.HTTPFound(f"{blob.url}/blob/9.zip?sig=1")

        stub.route("GET", "/repositories/42/actions/artifacts/9/zip", moved)
        data = await inst.download(f"{stub.url}{PREFIX}/repos/acme/old-name/actions/artifacts/9/zip", max_bytes=1024)
        assert data == b"PK\x03\x04data"
    finally:
        await runner.cleanup()


async def test_an_archive_slower_than_one_answers_timeout_still_downloads_while_bytes_come(
    make_app: Callable[..., GitHubApp], stub: Stub
) -> None:
    # What this catches: the 30 s total of one answer applied to a whole archive, so one
    # that takes longer (64 MiB at under 2.2 MB/s) failed at every retry for 14 days.
    async def slow(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/zip"})
        await response.prepare(request)
        for _ in range(10):
            await response.write(b"x" * 1024)
            await asyncio.sleep(0.15)  # 1.5 s in all, never 1 s without a byte
        return response

    blob = Stub(stub.clock, prefix="")
    runner, blob.url = await serve(blob.handle)
    try:
        blob.route("GET", "/blob/slow.zip", slow)
        stub.script("GET", "/repos/acme/bench/actions/artifacts/9/zip",
                    reply(302, {"message": "Found"}, Location=f"{blob.url}/blob/slow.zip"))
        inst = make_app(request_timeout=1.0).installation(7)
        data = await inst.download(f"{stub.url}{PREFIX}/repos/acme/bench/actions/artifacts/9/zip", max_bytes=1 << 20)
        assert len(data) == 10 * 1024
    finally:
        await runner.cleanup()


async def _zip() -> web.StreamResponse:
    return web.Response(body=b"PK\x03\x04data", content_type="application/zip")


async def test_answers_pinned_to_a_commit_are_not_kept_and_others_are_asked_again_with_their_etag(
    inst: InstallationClient, stub: Stub
) -> None:
    # One config read per push at a new sha, never asked again: kept, they filled the cache
    # with hundreds of MB over months.
    async def contents(_request: web.Request) -> web.StreamResponse:
        return web.json_response({"type": "file", "encoding": "base64", "content": "eDogMQo="}, headers={"ETag": 'W/"1"'})

    stub.route("GET", "/repos/acme/bench/contents/a.yaml", contents)
    repo = GitHubRepo(inst, "acme/bench")
    for ref in ("a" * 40, "a" * 40, "main", "main"):
        assert await repo.file_text("a.yaml", ref) == "x: 1\n"
    conditional = [s.headers.get("If-None-Match") for s in stub.calls("GET", "/repos/acme/bench/contents/a.yaml")]
    assert conditional == [None, None, None, 'W/"1"']


async def test_a_page_added_after_a_full_last_page_is_read_though_that_page_answers_304(
    inst: InstallationClient, stub: Stub
) -> None:
    # What this catches: GitHub answers the unchanged first page with 304, and gidgethub kept
    # the cached next link (none): the 101st comment, where Klaud may find its own reply to
    # a redelivered command, was never read.
    comments = [{"id": n} for n in range(1, 101)]
    etag = 'W/"first-page"'

    async def first_page(request: web.Request) -> web.StreamResponse:
        if request.query.get("page") == "2":
            return web.json_response(comments[100:])
        if request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers={"ETag": etag})
        more = {"Link": f'<{stub.url}{PREFIX}/repos/acme/bench/issues/1/comments?per_page=100&page=2>; rel="next"'}
        return web.json_response(comments[:100], headers={"ETag": etag, **(more if len(comments) > 100 else {})})

    stub.route("GET", "/repos/acme/bench/issues/1/comments", first_page)
    url = "/repos/acme/bench/issues/1/comments?per_page=100"
    assert len([c async for c in inst.getiter(url)]) == 100
    comments.append({"id": 101})
    assert [c["id"] async for c in inst.getiter(url)][-1] == 101


# ------------------------------------------------------------- bounded labels and gates


def github_route_labels() -> set[str]:
    return {sample.labels["route"] for metric in REGISTRY.collect() if metric.name == "klaud_github_requests"
            for sample in metric.samples if sample.name == "klaud_github_requests_total"}


async def test_next_links_to_paths_of_their_own_add_no_route_label_each(inst: InstallationClient, stub: Stub) -> None:
    # What this catches: an unknown path kept its first segment as the `route` label, and a
    # listing whose `next` links name a new path each time (a proxy, a server at odds with
    # the client) added a series per page read, for as long as the process ran.
    pages = 50

    def page(number: int) -> Callable[[web.Request], Any]:
        async def answer(_request: web.Request) -> web.StreamResponse:
            last = number == pages
            headers = {} if last else {"Link": f'<{stub.url}{PREFIX}/page-{number + 1}-x>; rel="next"'}
            return web.json_response([{"number": number}], headers=headers)
        return answer

    stub.route("GET", "/repos/acme/bench/pulls", page(0))
    for number in range(1, pages + 1):
        stub.route("GET", f"/page-{number}-x", page(number))
    before = github_route_labels()
    listed = [p async for p in inst.getiter("/repos/{owner}/{repo}/pulls", {"owner": "acme", "repo": "bench"})]
    assert len(listed) == pages + 1
    assert github_route_labels() - before <= {
        "/app/installations/{installation_id}/access_tokens", "/repos/{owner}/{repo}/pulls", "/{other}"}


async def test_a_spent_budget_klaud_never_waits_on_keeps_no_gate(
    inst: InstallationClient, stub: Stub, clock: ManualClock
) -> None:
    # What this catches: a gate per `x-ratelimit-resource` name an answer gave, kept for the
    # life of the process; only core's and GraphQL's are ever waited on.
    names = iter(range(1000))

    async def answer(_request: web.Request) -> web.StreamResponse:
        return web.json_response({}, headers={"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(T0) + 600),
                                              "x-ratelimit-resource": f"budget-{next(names)}"})

    stub.route("GET", "/repos/acme/bench", answer)
    for _ in range(100):
        await inst.getitem("/repos/{owner}/{repo}", {"owner": "acme", "repo": "bench"})
    assert clock.slept == []  # another budget spent holds no core call
    assert set(inst._api._gates) <= {"core", "graphql"}


async def test_graphql_requests_are_counted_under_their_own_route(inst: InstallationClient, stub: Stub) -> None:
    # What this catches: with unknown paths counted as `{other}`, Klaud's own GraphQL calls
    # (GitHub Enterprise Server's /api/graphql, beside its REST /api/v3) lost their label.
    graphql_route(stub, reply(200, {"data": {"repository": None}}))
    before = requests_metric("POST", "/graphql", "200")
    await inst.graphql(BLAME_QUERY, owner="acme", name="bench", ref="main", path="x")
    assert requests_metric("POST", "/graphql", "200") == before + 1
    assert route_template("/graphql") == "/graphql"  # GitHub.com's, under its API root
