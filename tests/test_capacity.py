"""Capacity gate: the feed document rules (domain §4.5) and the HTTP reader."""

from __future__ import annotations

import copy
import gzip
import json
import socket
from datetime import datetime, timedelta, timezone
from typing import Any, AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bot.capacity import CapacityFeed, evaluate_feed, target_eligibility
from bot.clock import ManualClock
from bot.domain import CapacityReading, stamp

NOW = datetime(2026, 11, 30, 8, 0, tzinfo=timezone.utc)


def cluster(cluster_id: str, at: datetime = NOW, **changes: Any) -> dict[str, Any]:
    """A cluster with capacity, observed and received just before `at` (generatedAt)."""
    summary = {
        "totalNodes": 8,
        "allocatedNodes": 2,
        "mixedNodes": 0,
        "idleNodes": 6,
        "downNodes": 0,
        "otherNodes": 0,
    }
    summary.update(changes.pop("summary", {}))
    entry = {
        "id": cluster_id,
        "stale": False,
        "status": "operational",
        "observedAt": stamp(at - timedelta(seconds=30)),
        "receivedAt": stamp(at - timedelta(seconds=29)),
        "summary": summary,
    }
    entry.update(changes)
    return entry


def feed(*clusters: dict[str, Any], at: datetime = NOW) -> dict[str, Any]:
    return {
        "kind": "inferencex.status.clusters",
        "generatedAt": stamp(at),
        "data": {"available": True, "clusters": list(clusters) or [cluster("b200-nscale")]},
    }


def evaluate(document: Any, *, retrieved_at: datetime = NOW) -> CapacityReading:
    return evaluate_feed(document, now=NOW, retrieved_at=retrieved_at)


DELETE = object()


def with_change(path: str, value: Any) -> dict[str, Any]:
    """A valid feed with one value (dotted path; `DELETE` removes it) changed."""
    document = copy.deepcopy(feed())
    keys: list[Any] = path.split(".")
    target: Any = document
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    last = int(keys[-1]) if isinstance(target, list) else keys[-1]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    return document


def test_valid_feed_lists_eligible_and_known_clusters() -> None:
    reading = evaluate(
        feed(
            cluster("b200-nscale"),
            cluster("h200-nb", status="degraded"),
            cluster("mi355x-amd", summary={"allocatedNodes": 7, "idleNodes": 1}),
        )
    )
    assert reading.error is None
    assert reading.eligible == {"b200-nscale", "h200-nb"}
    assert reading.known == {"b200-nscale", "h200-nb", "mi355x-amd"}
    assert reading.at == NOW


@pytest.mark.parametrize(
    ("document", "code"),
    [
        ([], "invalid-response"),
        ("text", "invalid-response"),
        (with_change("kind", "inferencex.status.images"), "invalid-kind"),
        (with_change("kind", DELETE), "invalid-kind"),
        (with_change("generatedAt", DELETE), "invalid-generated-at"),
        (with_change("generatedAt", "yesterday"), "invalid-generated-at"),
        (with_change("generatedAt", "2026-11-30T08:00:00"), "invalid-generated-at"),
        (with_change("generatedAt", 1796025600), "invalid-generated-at"),
        (with_change("generatedAt", stamp(NOW - timedelta(seconds=126))), "stale-feed"),
        (with_change("generatedAt", stamp(NOW + timedelta(seconds=6))), "stale-feed"),
        (with_change("data", DELETE), "invalid-response"),
        (with_change("data", []), "invalid-response"),
        (with_change("data.available", False), "feed-unavailable"),
        (with_change("data.available", "true"), "feed-unavailable"),
        (with_change("data.available", DELETE), "feed-unavailable"),
        (with_change("data.clusters", {"b200-nscale": {}}), "invalid-response"),
        (with_change("data.clusters", DELETE), "invalid-response"),
        (with_change("data.clusters.0", "b200-nscale"), "invalid-response"),
        (with_change("data.clusters.0.id", ""), "invalid-cluster-ids"),
        (with_change("data.clusters.0.id", 7), "invalid-cluster-ids"),
        (with_change("data.clusters.0.id", DELETE), "invalid-cluster-ids"),
        (feed(cluster("b200-nscale"), cluster("b200-nscale")), "invalid-cluster-ids"),
    ],
)
def test_structural_problem_closes_every_cluster(document: Any, code: str) -> None:
    reading = evaluate(document)
    assert reading.error == code
    assert reading.eligible == frozenset()


@pytest.mark.parametrize("age", [125, 0, -5])
def test_feed_ages_within_the_skew_allowance_are_accepted(age: int) -> None:
    generated_at = NOW - timedelta(seconds=age)
    reading = evaluate(feed(cluster("b200-nscale", at=generated_at), at=generated_at))
    assert reading.error is None and reading.eligible == {"b200-nscale"}


def test_retrieval_older_than_allowed_closes_the_feed() -> None:
    reading = evaluate(feed(), retrieved_at=NOW - timedelta(seconds=126))
    assert reading.error == "stale-retrieval" and reading.eligible == frozenset()


def test_duplicate_ids_empty_the_whole_set() -> None:
    reading = evaluate(feed(cluster("a"), cluster("b"), cluster("a")))
    assert reading.eligible == frozenset() and reading.error == "invalid-cluster-ids"


@pytest.mark.parametrize(
    "changes",
    [
        {"stale": True},
        {"stale": None},
        {"status": "down"},
        {"status": "Operational"},
        {"observedAt": None},
        {"receivedAt": "soon"},
        # observed more than 5 s after it was received
        {"observedAt": stamp(NOW - timedelta(seconds=23))},
        # received more than 5 s after the document was generated
        {"receivedAt": stamp(NOW + timedelta(seconds=6)), "observedAt": stamp(NOW)},
        {"summary": {"totalNodes": 0, "allocatedNodes": 0, "idleNodes": 0}},
        {"summary": {"totalNodes": True}},
        {"summary": {"idleNodes": 6.0}},
        {"summary": {"idleNodes": "6"}},
        {"summary": {"downNodes": -1, "idleNodes": 7}},
        {"summary": {"otherNodes": 1}},  # counts no longer sum to the total
        {"summary": {"allocatedNodes": 8, "idleNodes": 0}},
        # exactly 80 % allocated or mixed: strictly below is required
        {"summary": {"totalNodes": 10, "allocatedNodes": 6, "mixedNodes": 2, "idleNodes": 2}},
    ],
)
def test_cluster_failing_a_gate_is_known_but_not_eligible(changes: dict[str, Any]) -> None:
    summary = changes.pop("summary", None)
    broken = cluster("b200-nscale", **changes)
    if summary is not None:
        broken["summary"].update(summary)
    reading = evaluate(feed(broken, cluster("h200-nb")))
    assert reading.error is None
    assert reading.known == {"b200-nscale", "h200-nb"}
    assert reading.eligible == {"h200-nb"}


def test_cluster_without_summary_is_not_eligible() -> None:
    bare = cluster("b200-nscale")
    del bare["summary"]
    assert evaluate(feed(bare)).eligible == frozenset()


def test_just_below_eighty_percent_busy_is_eligible() -> None:
    summary = {"totalNodes": 10, "allocatedNodes": 5, "mixedNodes": 2, "idleNodes": 1,
               "downNodes": 2}
    assert evaluate(feed(cluster("b200-nscale", summary=summary))).eligible == {"b200-nscale"}


READING = CapacityReading(
    eligible=frozenset({"b200-nscale"}), known=frozenset({"b200-nscale", "b200-dgxc"}), at=NOW
)


@pytest.mark.parametrize(
    ("clusters", "rule", "expected"),
    [
        (["b200-nscale"], "all", (True, "cluster b200-nscale has capacity")),
        (["b200-dgxc"], "all", (False, "cluster b200-dgxc is busy")),
        (["b200-nscale", "b200-dgxc"], "all", (False, "cluster b200-dgxc is busy")),
        (["b200-nscale", "b200-dgxc"], "any", (True, "cluster b200-nscale has capacity")),
        (["mi355x-amd"], "all", (False, "cluster mi355x-amd is not in the capacity feed")),
        (
            ["b200-dgxc", "mi355x-amd"],
            "any",
            (
                False,
                "no target cluster has capacity: cluster b200-dgxc is busy; "
                "cluster mi355x-amd is not in the capacity feed",
            ),
        ),
        ([], "any", (False, "runner has no known target cluster")),
    ],
)
def test_target_eligibility(clusters: list[str], rule: str, expected: tuple[bool, str]) -> None:
    assert target_eligibility(clusters, READING, rule) == expected  # type: ignore[arg-type]


def test_target_eligibility_with_an_unusable_feed_says_why() -> None:
    closed = CapacityReading(frozenset(), frozenset(), NOW, error="http-503")
    assert target_eligibility(["b200-nscale"], closed, "any") == (
        False,
        "capacity feed unavailable (http-503): every cluster counts as busy",
    )


# --- CapacityFeed against a local server -------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FeedServer:
    """A capacity endpoint on 127.0.0.1 whose answer each test chooses."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.requests: list[web.Request] = []
        self.handler: Handler = self.valid_feed
        app = web.Application()
        app.router.add_get("/status", self._serve)
        app.router.add_get("/elsewhere", self.valid_feed)
        self.server = TestServer(app, host="127.0.0.1")

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request)
        return await self.handler(request)

    async def valid_feed(self, request: web.Request) -> web.StreamResponse:
        now = self.clock.now()
        return web.json_response(feed(cluster("b200-nscale", at=now), at=now))

    @property
    def url(self) -> str:
        return str(self.server.make_url("/status"))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(NOW)


@pytest.fixture
async def server(clock: ManualClock) -> AsyncIterator[FeedServer]:
    feed_server = FeedServer(clock)
    await feed_server.server.start_server()
    yield feed_server
    await feed_server.server.close()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


async def test_reads_the_feed_with_bearer_token(server, session, clock) -> None:
    reading = await CapacityFeed(session, server.url, "s3cret", clock).read()
    assert reading.error is None and reading.eligible == {"b200-nscale"}
    (request,) = server.requests
    assert request.headers["Authorization"] == "Bearer s3cret"
    assert request.headers["Accept"] == "application/json"
    assert request.headers["Accept-Encoding"] == "gzip"


async def test_no_token_sends_no_authorization(server, session, clock) -> None:
    await CapacityFeed(session, server.url, None, clock).read()
    assert "Authorization" not in server.requests[0].headers


async def test_reading_is_cached_for_the_ttl_of_the_clock(server, session, clock) -> None:
    capacity = CapacityFeed(session, server.url, None, clock, ttl_seconds=120)
    first = await capacity.read()
    clock.advance(119)
    assert await capacity.read() is first
    assert len(server.requests) == 1
    clock.advance(1)
    second = await capacity.read()
    assert len(server.requests) == 2
    assert second.at == NOW + timedelta(seconds=120) and second.eligible == {"b200-nscale"}


async def test_unconfigured_feed_fails_closed_without_a_request(session, clock) -> None:
    reading = await CapacityFeed(session, None, "token", clock).read()
    assert reading.error == "capacity-feed-not-configured" and reading.eligible == frozenset()


GZIP_BOMB = gzip.compress(b" " * (17 * 1024 * 1024), compresslevel=1)


def answer(status: int = 200, body: bytes = b"{}", content_type: str = "application/json",
           headers: dict[str, str] | None = None) -> Handler:
    async def handler(_: web.Request) -> web.StreamResponse:
        response = web.Response(status=status, body=body, headers=headers or {})
        response.content_type = content_type
        return response

    return handler


@pytest.mark.parametrize(
    ("handler", "code", "requests"),
    [
        (answer(404, b'{"error": "no"}'), "http-404", 1),
        (answer(503), "http-503", 3),
        (answer(429), "http-429", 3),
        (answer(200, b"<html></html>", "text/html"), "response-not-json", 1),
        (answer(200, b'{"kind": '), "invalid-json", 1),
        (answer(200, b"\xff\xfe{}"), "invalid-json", 1),
        (answer(200, b'{"n": NaN}'), "invalid-json-number", 1),
        (answer(200, b'{"n": 1e999}'), "invalid-json-number", 1),
        (answer(200, b"{}"), "invalid-kind", 1),
        (answer(200, gzip.compress(b"{}"), headers={"Content-Encoding": "br"}),
         "unsupported-content-encoding", 1),
        (answer(200, b"not gzip", headers={"Content-Encoding": "gzip"}),
         "invalid-content-encoding", 1),
        (answer(200, gzip.compress(b"{}")[:-12], headers={"Content-Encoding": "gzip"}),
         "invalid-content-encoding", 1),
        # a gzip bomb: a few KiB on the wire, over 16 MiB once inflated
        (answer(200, GZIP_BOMB, headers={"Content-Encoding": "gzip"}), "response-too-large", 1),
    ],
)
async def test_feed_errors_fail_closed(server, session, clock, handler, code, requests) -> None:
    server.handler = handler
    reading = await CapacityFeed(session, server.url, None, clock).read()
    assert reading.error == code
    assert reading.eligible == frozenset()
    assert len(server.requests) == requests


async def test_a_failed_read_is_cached_like_a_good_one(server, session, clock) -> None:
    # Each read may retry three times; a broken feed is not asked again before the TTL.
    server.handler = answer(503)
    capacity = CapacityFeed(session, server.url, None, clock, ttl_seconds=120)
    assert (await capacity.read()).error == "http-503"
    assert (await capacity.read()).error == "http-503"
    assert len(server.requests) == 3
    server.handler = server.valid_feed
    clock.advance(120)
    assert (await capacity.read()).eligible == {"b200-nscale"}


async def test_transient_errors_retry_with_backoff_then_succeed(server, session, clock) -> None:
    answers = [answer(502), answer(500), server.valid_feed]

    async def flaky(request: web.Request) -> web.StreamResponse:
        return await answers.pop(0)(request)

    server.handler = flaky
    reading = await CapacityFeed(session, server.url, None, clock).read()
    assert reading.error is None and reading.eligible == {"b200-nscale"}
    assert clock.slept == [0.5, 1.5]


async def test_redirects_are_not_followed(server, session, clock) -> None:
    async def redirect(_: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(server.server.make_url("/elsewhere"))

    server.handler = redirect
    reading = await CapacityFeed(session, server.url, None, clock).read()
    assert reading.error == "http-302"


async def test_gzip_encoded_feed_is_read(server, session, clock) -> None:
    async def gzipped(request: web.Request) -> web.StreamResponse:
        document = json.loads((await server.valid_feed(request)).body)
        return await answer(200, gzip.compress(json.dumps(document).encode()),
                            headers={"Content-Encoding": "gzip"})(request)

    server.handler = gzipped
    assert (await CapacityFeed(session, server.url, None, clock).read()).eligible == {
        "b200-nscale"
    }


async def test_body_over_16_mib_is_refused_while_streaming(server, session, clock) -> None:
    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        chunk = b" " * (1024 * 1024)
        try:
            for _ in range(17):
                await response.write(chunk)
        except ConnectionResetError:
            pass  # the client hung up once it had read too much, as it should
        return response

    server.handler = endless
    reading = await CapacityFeed(session, server.url, None, clock).read()
    assert reading.error == "response-too-large"


async def test_declared_length_over_16_mib_is_refused(server, session, clock) -> None:
    async def huge(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.content_length = 17 * 1024 * 1024
        await response.prepare(request)
        return response

    server.handler = huge
    reading = await CapacityFeed(session, server.url, None, clock).read()
    assert reading.error == "response-too-large"


async def test_unreachable_feed_is_a_network_error_after_retries(session, clock) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    reading = await CapacityFeed(session, f"http://127.0.0.1:{port}/status", None, clock).read()
    assert reading.error == "network-error" and reading.eligible == frozenset()
    assert clock.slept == [0.5, 1.5]


async def test_token_with_control_characters_is_never_sent(server, session, clock) -> None:
    reading = await CapacityFeed(session, server.url, "abc\r\nX-Evil: 1", clock).read()
    assert reading.error == "capacity-token-invalid"
    assert server.requests == []
