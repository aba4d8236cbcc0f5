"""Header bytes a client library would not send, delivery ids a URL cannot carry, `Expect`,
and the admin listener's idle connections and Authorization spacing."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import quote, urlsplit

import pytest

from bot.log import configure_logging
from bot.web.webhook import IDLE_SECONDS
from tests.harness import headers_for, running_klaud
from tests.web.test_hostile_input import stored, until
from tests.web.test_ingest import PR_PAYLOAD, Recorder, make_klaud, raw_post


async def raw_request(url: str, head: bytes, body: bytes = b"") -> bytes:
    """One request written byte for byte (header bytes a client library would not send)."""
    where = urlsplit(url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    writer.write(head + b"Connection: close\r\n\r\n" + body)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), timeout=30)
    writer.close()
    return answer


def head_for(headers: dict[str, str], *extra: bytes, length: int) -> bytes:
    lines = "".join(f"{name}: {value}\r\n" for name, value in headers.items()).encode()
    return b"POST /webhook HTTP/1.1\r\nHost: klaud\r\n" + lines + b"".join(extra) + f"Content-Length: {length}\r\n".encode()


def status_and_body(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), json.loads(body)


async def test_an_event_header_that_is_not_utf_8_is_a_400_not_a_500(tmp_path, capsys):
    # Unsigned, so anyone may send it: aiohttp keeps the byte as a surrogate, the JSON log line
    # of the rejection cannot be written, and the request ends in a 500 with a traceback.
    configure_logging("json")
    capsys.readouterr()
    async with running_klaud(make_klaud(tmp_path)) as run:
        body = json.dumps(PR_PAYLOAD).encode()
        headers = headers_for("pull_request", body, delivery="bad-event")
        del headers["X-GitHub-Event"]
        answer = await raw_request(run.url, head_for(headers, b"X-GitHub-Event: pull\xff\r\n", length=len(body)), body)
        status, document = status_and_body(answer)
        assert (status, document["error"]) == (400, "invalid-header")
        assert not await stored(run, "bad-event")
    records = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert not [record for record in records if record["level"] in ("error", "critical")]


@pytest.mark.parametrize("header", ["User-Agent", "X-GitHub-Hook-ID"])
async def test_a_signed_delivery_with_a_kept_header_that_is_not_utf_8_is_not_a_503(tmp_path, header):
    # The signature covers the body only: a kept audit header with a byte that is not UTF-8
    # made the store's row unwritable, answered "store-unavailable; retry later" (a retry
    # fails the same way), and the authentic delivery was never stored.
    async with running_klaud(make_klaud(tmp_path, Recorder())) as run:
        body = json.dumps(PR_PAYLOAD).encode()
        headers = headers_for("pull_request", body, delivery="odd-header")
        extra = header.encode() + b": GitHub-Hookshot/\xff\xfe\r\n"
        status, document = status_and_body(await raw_request(run.url, head_for(headers, extra, length=len(body)), body))
        assert status in (202, 400), document
        if status == 202:
            assert await stored(run, "odd-header")
        else:
            assert document["error"] == "invalid-header" and not await stored(run, "odd-header")


@pytest.mark.parametrize("delivery", ["{x}", "a{b}c"])
async def test_a_delivery_id_with_braces_that_webhook_stored_can_be_looked_up(tmp_path, delivery):
    # HEADER_TOKEN takes any printable ASCII (and `klaud receive --delivery` points at the API),
    # but the route's default pattern `[^{}/]+` never matches braces: 404 "no delivery".
    async with running_klaud(make_klaud(tmp_path, Recorder())) as run:
        body = json.dumps(PR_PAYLOAD).encode()
        assert (await raw_post(run, body, headers_for("pull_request", body, delivery=delivery)))[0] == 202
        status, document = await run.get_json(f"/api/v1/deliveries/{quote(delivery, safe='')}")
        assert (status, document.get("id")) == (200, delivery)


@pytest.mark.parametrize("delivery", [".", ".."])
async def test_a_delivery_id_the_api_cannot_address_is_refused_rather_than_stored(tmp_path, delivery):
    # `/api/v1/deliveries/..` (escaped or not) is resolved away as a dot segment by every client
    # and by the server: such a delivery is stored and can never be looked up.
    async with running_klaud(make_klaud(tmp_path, Recorder())) as run:
        body = json.dumps(PR_PAYLOAD).encode()
        status, answer = await raw_post(run, body, headers_for("pull_request", body, delivery=delivery))
        if status == 202:
            assert (await run.get_json(f"/api/v1/deliveries/{quote(delivery, safe='')}"))[0] == 200
        else:
            assert (status, answer["error"]) == (400, "invalid-header")


async def test_an_unknown_expectation_on_webhook_is_answered_with_the_json_error_body(tmp_path):
    # aiohttp answers an Expect other than 100-continue itself, in plain text, before any
    # middleware: the contract's error bodies are JSON.
    async with running_klaud(make_klaud(tmp_path)) as run:
        body = json.dumps(PR_PAYLOAD).encode()
        head = head_for(headers_for("pull_request", body), b"Expect: something-else\r\n", length=len(body))
        answer = await raw_request(run.url, head, body)
    assert b"content-type: application/json" in answer.partition(b"\r\n\r\n")[0].lower()
    status, document = status_and_body(answer)
    assert status == 417 and set(document) == {"error", "detail"}


async def test_the_admin_listener_does_not_keep_a_silent_connection_for_an_hour(tmp_path):
    # The webhook listener closes a connection with no request in progress after IDLE_SECONDS;
    # the admin listener kept aiohttp's default (3630 s): a few thousand silent connections to
    # it use up the file descriptors the webhook listener shares.
    async with running_klaud(make_klaud(tmp_path)) as run:
        where = urlsplit(run.admin_url)
        _reader, writer = await asyncio.open_connection(where.hostname, where.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: k\r\nX-Slow: ")
        await writer.drain()
        admin = run.listeners.runners[1].server
        await until(lambda: bool(admin.connections), "the admin listener holds the connection")
        [connection] = admin.connections
        writer.close()
        assert connection.keepalive_timeout <= IDLE_SECONDS


async def test_a_bearer_token_after_more_than_one_space_is_accepted(tmp_path):
    # RFC 6750 §2.1: credentials = "Bearer" 1*SP b64token (RFC 9110 §11.4 alike).
    async with running_klaud(make_klaud(tmp_path), admin_token="s3cret") as run:
        assert (await run.get_json("/api/v1/repos", {"Authorization": "Bearer  s3cret"}))[0] == 200
