"""The capacity feed client: fetch the cluster status document once per wave (domain §4.5).

The rule that turns a document into a reading lives in `bot.core.capacity`; this module is
its HTTP edge. Every failure becomes a closed reading with a code, never an exception, and
the feed's numbers are never logged.
"""

from __future__ import annotations

import asyncio
import json
import math
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import aiohttp
import structlog

from bot.core.capacity import FeedUnusable, closed_reading, evaluate_feed, usable_until
from bot.core.clock import Clock
from bot.core.domain import CapacityReading

MAX_BODY_BYTES = 16 * 1024 * 1024
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=15)
RETRY_DELAYS = (0.5, 1.5)
ACCEPTED_ENCODINGS = frozenset({"", "identity", "gzip"})
USER_AGENT = "Klaud-Cold/0.1 (capacity gate)"
CLOSED_RECHECK = timedelta(seconds=10)  # the least a closed reading is kept

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class _Retrieved:
    document: Any
    at: datetime


class CapacityFeed:
    """Reads the cluster status feed, at most once per `ttl_seconds` of the clock.

    Never raises for a feed problem: every failure becomes a closed reading with a code.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str | None,
        token: str | None,
        clock: Clock,
        ttl_seconds: int = 120,
    ) -> None:
        self._session = session
        self._url = url
        self._token = token
        self._clock = clock
        self._ttl = timedelta(seconds=ttl_seconds)
        # The last reading and the moment it stops being usable.
        self._cached: tuple[CapacityReading, datetime] | None = None
        # Concurrent waves share one request instead of each fetching the feed.
        self._lock = asyncio.Lock()

    async def read(self) -> CapacityReading:
        if self._url is None:
            return closed_reading(self._clock.now(), "capacity-feed-not-configured")
        async with self._lock:
            now = self._clock.now()
            # Reused while the document itself is fresh enough (a document 100 s old when
            # read must not be used 110 s later), and never across a clock stepped back.
            if self._cached is not None and self._cached[0].at <= now < self._cached[1]:
                return self._cached[0]
            reading, until = await self._fresh_reading(self._url)
            self._cached = (reading, until)
            return reading

    async def _fresh_reading(self, url: str) -> tuple[CapacityReading, datetime]:
        try:
            retrieved = await self._retrieve_with_retries(url)
        except FeedUnusable as problem:
            log.warning("capacity-feed-unusable", error=problem.code)
            now = self._clock.now()
            return closed_reading(now, problem.code), now + self._ttl
        reading = evaluate_feed(
            retrieved.document, now=self._clock.now(), retrieved_at=retrieved.at
        )
        until = min(retrieved.at + self._ttl, usable_until(retrieved.document, retrieved.at))
        if reading.error is not None:
            log.warning("capacity-feed-unusable", error=reading.error)
            # Closed either way: a stale document is not fetched again for every preview.
            until = max(until, retrieved.at + CLOSED_RECHECK)
        return reading, until

    async def _retrieve_with_retries(self, url: str) -> _Retrieved:
        for delay in RETRY_DELAYS:
            try:
                return await self._retrieve(url)
            except FeedUnusable as problem:
                if not problem.retryable:
                    raise
            await self._clock.sleep(delay)
        return await self._retrieve(url)

    async def _retrieve(self, url: str) -> _Retrieved:
        try:
            async with self._session.get(
                url,
                headers=self._headers(),
                timeout=REQUEST_TIMEOUT,
                allow_redirects=False,
                # Decoded here instead, so the size cap also holds for the decoded body.
                auto_decompress=False,
            ) as response:
                encoding = _checked_encoding(response)
                body = await _read_capped(response)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise FeedUnusable("network-error", retryable=True) from exc
        if encoding == "gzip":
            body = _gunzip_capped(body)
        return _Retrieved(document=_parse_json(body), at=self._clock.now())

    def _headers(self) -> dict[str, str]:
        headers = {
            "Accept": "application/json",
            "Accept-Encoding": "gzip",
            "User-Agent": USER_AGENT,
        }
        if self._token:
            if not self._token.isprintable():
                raise FeedUnusable("capacity-token-invalid")
            headers["Authorization"] = f"Bearer {self._token}"
        return headers


def _checked_encoding(response: aiohttp.ClientResponse) -> str:
    """The body's content encoding, once status, type and declared length are acceptable."""
    status = response.status
    if status != 200:
        raise FeedUnusable(f"http-{status}", retryable=status in (408, 429) or status >= 500)
    encoding = response.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ACCEPTED_ENCODINGS:
        raise FeedUnusable("unsupported-content-encoding")
    if "application/json" not in response.headers.get("Content-Type", "").lower():
        raise FeedUnusable("response-not-json")
    if response.content_length is not None and response.content_length > MAX_BODY_BYTES:
        raise FeedUnusable("response-too-large")
    return encoding


async def _read_capped(response: aiohttp.ClientResponse) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise FeedUnusable("response-too-large")
        chunks.append(chunk)
    return b"".join(chunks)


def _gunzip_capped(raw: bytes) -> bytes:
    # Bounded inflation: a small gzip bomb must not expand past the cap in memory.
    inflater = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
    try:
        body = inflater.decompress(raw, MAX_BODY_BYTES + 1)
    except zlib.error:
        raise FeedUnusable("invalid-content-encoding") from None
    if len(body) > MAX_BODY_BYTES:
        raise FeedUnusable("response-too-large")
    if not inflater.eof:
        raise FeedUnusable("invalid-content-encoding")
    return body


def _parse_json(body: bytes) -> Any:
    try:
        return json.loads(
            body.decode("utf-8"), parse_constant=_reject_number, parse_float=_finite_float
        )
    # ValueError includes JSONDecodeError and an integer past Python's 4,300 digits;
    # RecursionError, arrays nested too deep (a few hundred KB reach it).
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise FeedUnusable("invalid-json") from None


def _reject_number(_: str) -> float:
    raise FeedUnusable("invalid-json-number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise FeedUnusable("invalid-json-number")
    return value
