"""Reading a webhook body without letting its sender decide what it costs.

Bodies arrive before anyone knows whether they are signed, so three bounds hold for every
request: the time it may take to arrive (`deadline`), the bytes it may hold once decoded
(MAX_BODY, counted while a gzip body inflates, so a small bomb never expands past it), and
the bytes all bodies in flight may hold together (`BodyBudget`). A request that does not
fit the budget waits, unread: the kernel's socket buffers hold its bytes, not this process.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

MAX_BODY = 25 * 1024 * 1024  # GitHub caps payloads at 25 MB
READ_CHUNK = 256 * 1024
ENCODINGS = ("identity", "gzip")


class Rejected(Exception):
    """The request cannot be taken; the webhook answers `status` with the contract's error body."""

    def __init__(self, status: int, code: str, detail: str, *, retry_after: int | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.retry_after = retry_after  # seconds, sent as `Retry-After`


def too_large() -> Rejected:
    return Rejected(413, "payload-too-large", f"body exceeds {MAX_BODY} bytes (after decoding)")


class BodyBudget:
    """Bytes of request bodies held in memory at once, across every request."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_use = 0
        self._waiters: list[asyncio.Future[None]] = []

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @asynccontextmanager
    async def held(self, size: int) -> AsyncIterator[None]:
        """Hold `size` bytes (at most the whole budget) while the block runs; wait for them first."""
        size = min(size, self.limit)
        await self._acquire(size)
        try:
            yield
        finally:
            self._release(size)

    async def _acquire(self, size: int) -> None:
        while self.in_use + size > self.limit:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                self._waiters.remove(waiter)
        self.in_use += size

    def _release(self, size: int) -> None:
        self.in_use -= size
        # Every waiter checks again: a release may fit several small bodies or none.
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)


def encoding_of(request: web.Request) -> str:
    return request.headers.get("Content-Encoding", "identity").strip().lower() or "identity"


def expected_size(request: web.Request) -> int:
    """What a body may grow to in memory: its announced length, or the cap when the length
    is unknown (chunked) or says nothing of the decoded size (gzip)."""
    length = request.content_length
    if length is None or encoding_of(request) != "identity":
        return MAX_BODY
    return min(length, MAX_BODY)


async def read_body(request: web.Request) -> list[bytes]:
    """The decoded body as chunks (joined only once it is known to be wanted).

    The caller bounds the time (`asyncio.timeout_at`); raises Rejected.
    """
    inflater = Inflater(MAX_BODY) if encoding_of(request) == "gzip" else None
    chunks: list[bytes] = []
    received = decoded = 0
    try:
        async for chunk in request.content.iter_chunked(READ_CHUNK):
            received += len(chunk)
            if received > MAX_BODY:
                raise too_large()
            pieces = inflater.feed(chunk) if inflater else [chunk]
            for piece in pieces:
                decoded += len(piece)
                if decoded > MAX_BODY:
                    raise too_large()
                chunks.append(piece)
    except (web.RequestPayloadError, ConnectionError) as exc:  # the sender went away mid-body
        raise Rejected(400, "incomplete-body", f"the body did not arrive whole: {exc}") from None
    if inflater is not None:
        inflater.finish()
    return chunks


class Inflater:
    """gzip decoding that never produces more than `limit` bytes, however the input is built."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.produced = 0
        self._zlib = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)

    def feed(self, data: bytes) -> list[bytes]:
        pieces: list[bytes] = []
        while True:
            try:
                # One byte past the limit is enough to know the body is too large.
                piece = self._zlib.decompress(data, max_length=min(READ_CHUNK, self.limit - self.produced + 1))
            except zlib.error as exc:
                raise Rejected(400, "invalid-encoding", f"the body is not valid gzip: {exc}") from None
            self.produced += len(piece)
            if self.produced > self.limit:
                raise too_large()
            if piece:
                pieces.append(piece)
            data = self._zlib.unconsumed_tail
            # Output held back by max_length comes out of later calls, even with no new input.
            if not data and not piece:
                return pieces

    def finish(self) -> None:
        if not self._zlib.eof:
            raise Rejected(400, "invalid-encoding", "the gzip body ends before its stream does")
        if self._zlib.unused_data:
            raise Rejected(400, "invalid-encoding", "bytes follow the gzip stream")
