"""Reading a webhook body without letting its sender decide what it costs.

Bodies arrive before anyone knows whether they are signed, so three bounds hold for every
request: the time it may take to arrive (`deadline`), the bytes it may hold once decoded
(MAX_BODY, counted while a gzip body inflates, so a small bomb never expands past it), and
the bytes all bodies in flight may hold together (`BodyBudget`). Each request is charged
for the bytes it really holds, as they arrive and decode: charged for what it announced,
two stalled senders announcing 25 and 15 MiB and sending 6 bytes held the whole budget,
and GitHub's deliveries waited past its 10 s. A request whose next bytes do not fit waits,
unread: the kernel's socket buffers hold them, not this process. Bytes are only granted while
every body in flight can still finish (`BodyBudget.fits`): two bodies that each fit alone but
not together would otherwise hold half each and wait for one another until both timed out.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

from aiohttp import web

MAX_BODY = 25 * 1024 * 1024  # GitHub caps payloads at 25 MB
READ_CHUNK = 256 * 1024
FIRST_READ = 16 * 1024  # the room a body's first read is charged for
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
        self._accounts: set[Account] = set()
        self._most_total = 0  # what the open accounts may hold at most, together

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @asynccontextmanager
    async def account(self, most: int) -> AsyncIterator[Account]:
        """What one request holds of the budget, `most` bytes at most (`most_held`); all of
        it is given back when the block ends."""
        account = Account(self, min(most, self.limit))
        self._accounts.add(account)
        self._most_total += account.most
        try:
            yield account
        finally:
            self._accounts.discard(account)
            self._most_total -= account.most
            self._release(account.held)

    async def acquire(self, account: Account, size: int) -> None:
        while not self.fits(account, size):
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                self._waiters.remove(waiter)
        self.in_use += size

    def fits(self, account: Account, size: int) -> bool:
        """Whether `account` may hold `size` more bytes: they fit, and afterwards the bodies
        can still all finish in some order, each getting what it may still need from what the
        ones before it gave back (a banker's check; the order that asks least first is the
        one to try). A body waiting for bytes keeps those it holds, so without this two that
        each fit alone but not together could hold half each and wait for one another."""
        if self.in_use + size > self.limit:
            return False
        if self._most_total <= self.limit:  # every body may hold its most at once
            return True
        free = self.limit - self.in_use - size
        needs = sorted(
            (max(0, other.most - other.held - grant), other.held + grant)
            for other in self._accounts
            for grant in [size if other is account else 0]
        )
        for still_needed, held in needs:
            if still_needed > free:
                return False
            free += held
        return True

    def _release(self, size: int) -> None:
        self.in_use -= size
        # Every waiter checks again: a release may fit several small bodies or none.
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)


class Account:
    """The bytes of one body, charged to the budget as they come."""

    def __init__(self, budget: BodyBudget, most: int) -> None:
        self.budget = budget
        self.most = most
        self.held = 0

    async def charge(self, size: int) -> int:
        """Wait until `size` more bytes fit; what was charged (a body is never charged more
        than its `most`)."""
        size = max(0, min(size, self.most - self.held))
        await self.budget.acquire(self, size)
        self.held += size
        return size

    def refund(self, size: int) -> None:
        self.held -= size
        self.budget._release(size)


def most_held(request: web.Request) -> int:
    """The most `read_body` holds of the budget at once for `request`: its announced length
    and the one byte asked for to find its end; unannounced or compressed, the largest body
    and one read (the compressed bytes are held while they inflate)."""
    if request.content_length is not None and encoding_of(request) == "identity":
        return request.content_length + 1
    return MAX_BODY + READ_CHUNK


def encoding_of(request: web.Request) -> str:
    return request.headers.get("Content-Encoding", "identity").strip().lower() or "identity"


async def read_body(request: web.Request, account: Account) -> list[bytes]:
    """The decoded body as chunks (joined only once it is known to be wanted), each charged
    to `account` before it is kept.

    The caller bounds the time (`asyncio.timeout_at`); raises Rejected.
    """
    inflater = Inflater(MAX_BODY) if encoding_of(request) == "gzip" else None
    chunks: list[bytes] = []
    received = decoded = 0
    length = request.content_length
    try:
        step = FIRST_READ
        while True:
            # Room for the next read is charged before it is read, so a sender waiting for
            # room leaves its bytes in the kernel's buffers. It starts small and doubles
            # while the sender fills it: a stalled sender holds about what it really sent.
            wanted = step if length is None else max(1, min(step, length - received))
            room = await account.charge(wanted)
            chunk = await request.content.read(wanted)
            if not chunk:
                account.refund(room)
                break
            if len(chunk) == wanted:
                step = min(2 * step, READ_CHUNK)
            received += len(chunk)
            if received > MAX_BODY:
                raise too_large()
            if inflater is None:
                account.refund(room - min(room, len(chunk)))
                chunks.append(chunk)
                continue
            for piece in inflater.pieces(chunk):
                decoded += len(piece)
                if decoded > MAX_BODY:
                    raise too_large()
                await account.charge(len(piece))
                chunks.append(piece)
            account.refund(room)  # the compressed bytes are dropped once inflated
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

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """What `data` decodes to, one piece of at most READ_CHUNK bytes at a time (a bomb's
        output is charged piece by piece, never held whole first)."""
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
                yield piece
            data = self._zlib.unconsumed_tail
            # Output held back by max_length comes out of later calls, even with no new input.
            if not data and not piece:
                return

    def finish(self) -> None:
        if not self._zlib.eof:
            raise Rejected(400, "invalid-encoding", "the gzip body ends before its stream does")
        if self._zlib.unused_data:
            raise Rejected(400, "invalid-encoding", "bytes follow the gzip stream")
