"""The capacity feed client against a local server (bot/services/capacity_feed.py)."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from bot.core.capacity import evaluate_feed
from bot.core.clock import ManualClock
from bot.core.doctor import capacity_check
from bot.services import capacity_feed
from bot.services.capacity_feed import CLOSED_RECHECK, MAX_BODY_BYTES, CapacityFeed
from tests.core.test_capacity import NOW, cluster, feed

# --- CapacityFeed against a local server -------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def valid_document(clock: ManualClock) -> bytes:
    """A feed document naming one eligible cluster, fresh at the clock's time."""
    now = clock.now()
    return json.dumps(feed(cluster("b200-nscale", at=now), at=now)).encode()


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
        return web.Response(body=valid_document(self.clock), content_type="application/json")

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
        # Past what Python's json reads: arrays nested too deep, an integer of 5,000 digits.
        (answer(200, b'{"kind": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"), "invalid-json", 1),
        (answer(200, b'{"n": ' + b"7" * 5_000 + b"}"), "invalid-json", 1),
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


# Found by an audit of time: a reading outlived its document, or a clock stepped back.


async def test_a_cached_reading_is_not_used_past_the_documents_120_s_age(server: FeedServer, session: aiohttp.ClientSession, clock: ManualClock) -> None:
    # The feed serves a document generated 100 s ago (its publisher runs every ~2 min).
    generated = {"at": NOW - timedelta(seconds=100)}

    async def lagging(_: web.Request) -> web.StreamResponse:
        at = generated["at"]
        return web.json_response(feed(cluster("b200-nscale", at=at), at=at))

    server.handler = lagging
    capacity = CapacityFeed(session, server.url, None, clock)
    first = await capacity.read()
    assert first.eligible == {"b200-nscale"}
    clock.advance(110)  # the document is now 210 s old
    document = feed(cluster("b200-nscale", at=generated["at"]), at=generated["at"])
    from_scratch = evaluate_feed(document, now=clock.now(), retrieved_at=clock.now())
    assert from_scratch.error == "stale-feed"  # what domain §4.5 says of a 210 s old document
    again = await capacity.read()
    assert again.eligible == from_scratch.eligible, (
        f"cached reading still says {sorted(again.eligible)} eligible from a document "
        f"{(clock.now() - generated['at']).total_seconds():.0f} s old (limit 120 s + 5 s skew)"
    )


async def test_a_clock_stepped_back_does_not_keep_the_cached_reading(server: FeedServer, session: aiohttp.ClientSession, clock: ManualClock) -> None:
    # Our clock ran an hour fast: the feed's document looks an hour old, the reading is closed.
    clock.set(NOW + timedelta(hours=1))
    capacity = CapacityFeed(session, server.url, None, clock)

    async def real_time(_: web.Request) -> web.StreamResponse:
        return web.json_response(feed(cluster("b200-nscale", at=NOW), at=NOW))

    server.handler = real_time
    first = await capacity.read()
    assert first.error == "stale-feed"
    # NTP steps the clock back to the right time; a minute later the feed is fine again.
    clock.set(NOW + timedelta(minutes=1))

    async def fresh(_: web.Request) -> web.StreamResponse:
        now = clock.now()
        return web.json_response(feed(cluster("b200-nscale", at=now), at=now))

    server.handler = fresh
    reading = await capacity.read()
    assert reading.error is None and reading.eligible == {"b200-nscale"}, (
        f"still the reading made at the wrong time ({reading.error}); requests={len(server.requests)}"
    )


# --- caching ---------------------------------------------------------------------------


async def test_concurrent_reads_share_one_request(server, session, clock) -> None:
    # What this catches: without the lock every wave waiting on the feed sent its own request.
    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(0.2)
        return await server.valid_feed(request)

    server.handler = slow
    capacity = CapacityFeed(session, server.url, None, clock)
    first, second = await asyncio.gather(capacity.read(), capacity.read())
    assert first is second and len(server.requests) == 1


async def test_a_failed_read_is_kept_for_the_whole_ttl(server, session, clock) -> None:
    # What this catches: a failure was kept CLOSED_RECHECK (10 s), not the TTL: a broken feed was
    # asked (three times, with retries) every 10 s.
    server.handler = answer(503)
    capacity = CapacityFeed(session, server.url, None, clock, ttl_seconds=120)
    assert (await capacity.read()).error == "http-503"
    clock.advance(60)
    assert (await capacity.read()).error == "http-503"
    assert len(server.requests) == 3


async def test_a_stale_document_is_not_fetched_again_for_every_read(server, session, clock) -> None:
    # What this catches: the closed reading of a stale document was not kept CLOSED_RECHECK,
    # so every preview and wave fetched the feed again.
    old = NOW - timedelta(minutes=10)

    async def stale(_: web.Request) -> web.StreamResponse:
        return web.json_response(feed(cluster("b200-nscale", at=old), at=old))

    server.handler = stale
    capacity = CapacityFeed(session, server.url, None, clock)
    assert (await capacity.read()).error == "stale-feed"
    clock.advance(1)
    assert (await capacity.read()).error == "stale-feed"
    assert len(server.requests) == 1
    clock.advance((CLOSED_RECHECK - timedelta(seconds=1)).total_seconds())
    await capacity.read()
    assert len(server.requests) == 2  # asked again once CLOSED_RECHECK has passed


# --- timeouts --------------------------------------------------------------------------


async def test_a_feed_that_never_answers_is_a_closed_reading_not_an_exception(server, session, clock, monkeypatch) -> None:
    # What this catches: aiohttp raises a bare TimeoutError (not a ClientError) at the total timeout:
    # it escaped read() and failed the wave. And: no request timeout, the wave waited
    # on the feed (holding the repository's lock) for aiohttp's default 5 minutes.
    monkeypatch.setattr(capacity_feed, "REQUEST_TIMEOUT", aiohttp.ClientTimeout(total=0.2))

    async def hanging(_: web.Request) -> web.StreamResponse:
        await asyncio.sleep(30)
        return web.json_response({})

    server.handler = hanging
    reading = await asyncio.wait_for(CapacityFeed(session, server.url, None, clock).read(), timeout=5)
    assert reading.error == "network-error" and reading.eligible == frozenset()
    assert len(server.requests) == 3  # a timeout is transient: retried


# --- what is accepted ------------------------------------------------------------------


@pytest.mark.parametrize(("status", "requests"), [(408, 3), (202, 1), (204, 1)])
async def test_statuses_other_than_200_fail_closed(server, session, clock, status, requests) -> None:
    # What this catches: 408 was not retried. And: any 2xx was read as the feed.
    async def answering(request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, body=b"" if status == 204 else valid_document(clock),
                            content_type="application/json")

    server.handler = answering
    reading = await CapacityFeed(session, server.url, None, clock).read()
    assert reading.error == f"http-{status}" and reading.eligible == frozenset()
    assert len(server.requests) == requests


@pytest.mark.parametrize(
    ("content_encoding", "content_type", "zipped"),
    [
        ("GZIP", "application/json", True),  # content codings are case-insensitive (RFC 9110 §8.4.1)
        ("identity", "application/json", False),
        ("", "Application/JSON; charset=utf-8", False),  # so are media types (§8.3.1)
    ],
)
async def test_equivalent_spellings_of_encoding_and_type_are_read(server, session, clock, content_encoding, content_type, zipped) -> None:
    # What this catches: Content-Encoding not lowercased/stripped. And: "identity" refused.
    # And: Content-Type compared case-sensitively.
    async def answering(_: web.Request) -> web.StreamResponse:
        body = valid_document(clock)
        headers = {"Content-Type": content_type}
        if content_encoding:
            headers["Content-Encoding"] = content_encoding
        return web.Response(body=gzip.compress(body) if zipped else body, headers=headers)

    server.handler = answering
    reading = await CapacityFeed(session, server.url, None, clock).read()
    assert reading.error is None and reading.eligible == {"b200-nscale"}


def padded_to_cap(document: bytes) -> bytes:
    """`document` followed by whitespace: exactly MAX_BODY_BYTES, still valid JSON."""
    return document + b" " * (MAX_BODY_BYTES - len(document))


@pytest.mark.parametrize("declared", [True, False])
async def test_a_body_of_exactly_16_mib_is_read(server, session, clock, declared) -> None:
    # What this catches: a declared length of exactly the cap refused. And: a streamed body
    # of exactly the cap refused. (The cap is "over 16 MiB", as the 17 MiB tests say.)
    async def exactly(request: web.Request) -> web.StreamResponse:
        body = padded_to_cap(valid_document(clock))
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        if declared:
            response.content_length = len(body)
        else:
            response.enable_chunked_encoding()
        await response.prepare(request)
        await response.write(body)
        await response.write_eof()
        return response

    server.handler = exactly
    reading = await CapacityFeed(session, server.url, None, clock).read()
    assert reading.error is None and reading.eligible == {"b200-nscale"}


async def test_a_gzip_body_inflating_to_exactly_16_mib_is_read(server, session, clock) -> None:
    # What this catches: `len(body) > MAX_BODY_BYTES` became `>=` after inflating.
    async def zipped(_: web.Request) -> web.StreamResponse:
        body = gzip.compress(padded_to_cap(valid_document(clock)), compresslevel=1)
        return web.Response(body=body, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})

    server.handler = zipped
    reading = await CapacityFeed(session, server.url, None, clock).read()
    assert reading.error is None and reading.eligible == {"b200-nscale"}


def gzip_of_spaces(mib: int) -> bytes:
    packer = zlib.compressobj(1, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    chunk = b" " * (1024 * 1024)
    return b"".join([*(packer.compress(chunk) for _ in range(mib)), packer.flush()])


async def test_a_gzip_bomb_is_refused_without_inflating_it_in_memory(server, session, clock) -> None:
    # What this catches: the inflation was unbounded: a 64 MiB bomb (~64 KiB on the wire) was
    # inflated whole before the size check (a 1 GiB one would take 1 GiB).
    bomb = gzip_of_spaces(64)

    async def bombing(_: web.Request) -> web.StreamResponse:
        return web.Response(body=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})

    server.handler = bombing
    capacity = CapacityFeed(session, server.url, None, clock)
    tracemalloc.start()
    try:
        reading = await capacity.read()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert reading.error == "response-too-large"
    # Bounded, the inflation peaks near 2 x 16 MiB (the output buffer and its copy); whole, near 2 x 64 MiB.
    assert peak < 3 * MAX_BODY_BYTES, f"peak {peak / 2**20:.0f} MiB while refusing a bomb"


@pytest.mark.parametrize("status", [401, 403])
async def test_a_feed_that_refuses_the_token_is_told_to_fix_the_token(server, session, clock, status) -> None:
    # A refusal arrives as http-401/403 (capacity-token-invalid is only a token that cannot
    # be sent), whose hint said "something other than a cluster status feed: check the URL".
    async def refusing(request: web.Request) -> web.StreamResponse:
        return web.json_response({"message": "Bad credentials"}, status=status)

    server.handler = refusing
    reading = await CapacityFeed(session, server.url, "old-token", clock).read()
    check = capacity_check(reading, [])
    assert "KLAUD_CAPACITY_TOKEN" in check.hint, (reading.error, check.hint)
