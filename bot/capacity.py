"""Cluster capacity gate (domain §4.5, DESIGN §4 "Clusters").

Klaud fails closed: a missing, unreachable or malformed feed makes every cluster count as
busy, and each capacity decision says why. The feed's numbers are private, so nothing here
logs or returns them; a reading only says which clusters are known and which may take work.
"""

from __future__ import annotations

import asyncio
import json
import math
import zlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Sequence

import aiohttp
import structlog

from bot.clock import Clock
from bot.domain import CapacityReading, parse_time

FEED_KIND = "inferencex.status.clusters"
MAX_AGE = timedelta(seconds=120)
CLOCK_SKEW = timedelta(seconds=5)
USABLE_STATUSES = frozenset({"operational", "degraded"})
NODE_COUNTS = ("allocatedNodes", "mixedNodes", "idleNodes", "downNodes", "otherNodes")

MAX_BODY_BYTES = 16 * 1024 * 1024
REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=15)
RETRY_DELAYS = (0.5, 1.5)
ACCEPTED_ENCODINGS = frozenset({"", "identity", "gzip"})
USER_AGENT = "Klaud-Cold/0.1 (capacity gate)"

log = structlog.get_logger(__name__)


class _Unusable(Exception):
    """The feed cannot be used at all; `code` is the short reason shown to people."""

    def __init__(self, code: str, *, retryable: bool = False) -> None:
        super().__init__(code)
        self.code = code
        self.retryable = retryable


def evaluate_feed(document: Any, *, now: datetime, retrieved_at: datetime) -> CapacityReading:
    """Apply the payload and per-cluster gates of domain §4.5 to a parsed feed document."""
    try:
        generated_at, clusters = _usable_clusters(document, now=now, retrieved_at=retrieved_at)
    except _Unusable as problem:
        return closed_reading(retrieved_at, problem.code)
    return CapacityReading(
        eligible=frozenset(c["id"] for c in clusters if _has_capacity(c, generated_at)),
        known=frozenset(c["id"] for c in clusters),
        at=retrieved_at,
    )


def closed_reading(at: datetime, error: str) -> CapacityReading:
    """A reading in which no cluster may take work, with the reason why."""
    return CapacityReading(eligible=frozenset(), known=frozenset(), at=at, error=error)


def _usable_clusters(
    document: Any, *, now: datetime, retrieved_at: datetime
) -> tuple[datetime, list[dict[str, Any]]]:
    if not _fresh(retrieved_at, now):
        raise _Unusable("stale-retrieval")
    if not isinstance(document, dict):
        raise _Unusable("invalid-response")
    if document.get("kind") != FEED_KIND:
        raise _Unusable("invalid-kind")
    generated_at = _time(document.get("generatedAt"))
    if generated_at is None:
        raise _Unusable("invalid-generated-at")
    if not _fresh(generated_at, now):
        raise _Unusable("stale-feed")
    data = document.get("data")
    if not isinstance(data, dict):
        raise _Unusable("invalid-response")
    if data.get("available") is not True:
        raise _Unusable("feed-unavailable")
    clusters = data.get("clusters")
    if not isinstance(clusters, list) or not all(isinstance(c, dict) for c in clusters):
        raise _Unusable("invalid-response")
    ids = [c.get("id") for c in clusters]
    if not all(isinstance(i, str) and i for i in ids) or len(set(ids)) != len(ids):
        raise _Unusable("invalid-cluster-ids")
    return generated_at, clusters


def _fresh(moment: datetime, now: datetime) -> bool:
    age = now - moment
    return -CLOCK_SKEW <= age <= MAX_AGE + CLOCK_SKEW


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return parse_time(value)
    except ValueError:
        return None


def _has_capacity(cluster: dict[str, Any], generated_at: datetime) -> bool:
    if cluster.get("stale") is not False or cluster.get("status") not in USABLE_STATUSES:
        return False
    observed_at = _time(cluster.get("observedAt"))
    received_at = _time(cluster.get("receivedAt"))
    if observed_at is None or received_at is None:
        return False
    if observed_at - received_at > CLOCK_SKEW or received_at - generated_at > CLOCK_SKEW:
        return False
    summary = cluster.get("summary")
    if not isinstance(summary, dict):
        return False
    total = summary.get("totalNodes")
    counts = [summary.get(name) for name in NODE_COUNTS]
    if not _node_count(total) or total <= 0 or not all(_node_count(c) for c in counts):
        return False
    if sum(counts) != total:
        return False
    allocated, mixed, idle = counts[0], counts[1], counts[2]
    # Strictly below 80 % busy, in integers so no rounding can let a full cluster through.
    return idle > 0 and (allocated + mixed) * 5 < total * 4


def _node_count(value: Any) -> bool:
    # JSON true would pass an isinstance(int) check; a node count is never a boolean.
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def target_eligibility(
    clusters: Sequence[str], reading: CapacityReading, rule: Literal["all", "any"]
) -> tuple[bool, str]:
    """Whether a family's target clusters may take work under `rule`, with a reason for people."""
    if reading.error is not None:
        return False, f"capacity feed unavailable ({reading.error}): every cluster counts as busy"
    if not clusters:
        return False, "runner has no known target cluster"
    free = [c for c in clusters if c in reading.eligible]
    blocked = [_why_blocked(c, reading) for c in clusters if c not in reading.eligible]
    if rule == "all" and not blocked:
        return True, f"{_cluster_list(free)} {'has' if len(free) == 1 else 'have'} capacity"
    if rule == "any" and free:
        return True, f"{_cluster_list(free)} {'has' if len(free) == 1 else 'have'} capacity"
    if rule == "any" and len(clusters) > 1:
        return False, "no target cluster has capacity: " + "; ".join(blocked)
    return False, "; ".join(blocked)


def _why_blocked(cluster: str, reading: CapacityReading) -> str:
    if cluster in reading.known:
        return f"cluster {cluster} is busy"
    return f"cluster {cluster} is not in the capacity feed"


def _cluster_list(clusters: Sequence[str]) -> str:
    return ("cluster " if len(clusters) == 1 else "clusters ") + ", ".join(clusters)


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
        self._cached: CapacityReading | None = None
        # Concurrent waves share one request instead of each fetching the feed.
        self._lock = asyncio.Lock()

    async def read(self) -> CapacityReading:
        if self._url is None:
            return closed_reading(self._clock.now(), "capacity-feed-not-configured")
        async with self._lock:
            cached = self._cached
            if cached is not None and self._clock.now() - cached.at < self._ttl:
                return cached
            reading = await self._fresh_reading(self._url)
            self._cached = reading
            return reading

    async def _fresh_reading(self, url: str) -> CapacityReading:
        try:
            retrieved = await self._retrieve_with_retries(url)
        except _Unusable as problem:
            log.warning("capacity-feed-unusable", error=problem.code)
            return closed_reading(self._clock.now(), problem.code)
        reading = evaluate_feed(
            retrieved.document, now=self._clock.now(), retrieved_at=retrieved.at
        )
        if reading.error is not None:
            log.warning("capacity-feed-unusable", error=reading.error)
        return reading

    async def _retrieve_with_retries(self, url: str) -> _Retrieved:
        for delay in RETRY_DELAYS:
            try:
                return await self._retrieve(url)
            except _Unusable as problem:
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
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise _Unusable("network-error", retryable=True) from exc
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
                raise _Unusable("capacity-token-invalid")
            headers["Authorization"] = f"Bearer {self._token}"
        return headers


def _checked_encoding(response: aiohttp.ClientResponse) -> str:
    """The body's content encoding, once status, type and declared length are acceptable."""
    status = response.status
    if status != 200:
        raise _Unusable(f"http-{status}", retryable=status in (408, 429) or status >= 500)
    encoding = response.headers.get("Content-Encoding", "").strip().lower()
    if encoding not in ACCEPTED_ENCODINGS:
        raise _Unusable("unsupported-content-encoding")
    if "application/json" not in response.headers.get("Content-Type", "").lower():
        raise _Unusable("response-not-json")
    if response.content_length is not None and response.content_length > MAX_BODY_BYTES:
        raise _Unusable("response-too-large")
    return encoding


async def _read_capped(response: aiohttp.ClientResponse) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise _Unusable("response-too-large")
        chunks.append(chunk)
    return b"".join(chunks)


def _gunzip_capped(raw: bytes) -> bytes:
    # Bounded inflation: a small gzip bomb must not expand past the cap in memory.
    inflater = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
    try:
        body = inflater.decompress(raw, MAX_BODY_BYTES + 1)
    except zlib.error:
        raise _Unusable("invalid-content-encoding") from None
    if len(body) > MAX_BODY_BYTES:
        raise _Unusable("response-too-large")
    if not inflater.eof:
        raise _Unusable("invalid-content-encoding")
    return body


def _parse_json(body: bytes) -> Any:
    try:
        return json.loads(
            body.decode("utf-8"), parse_constant=_reject_number, parse_float=_finite_float
        )
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise _Unusable("invalid-json") from None


def _reject_number(_: str) -> float:
    raise _Unusable("invalid-json-number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Unusable("invalid-json-number")
    return value
