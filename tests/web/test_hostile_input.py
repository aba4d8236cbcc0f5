"""Hostile input on /webhook (issue 11, the listener's rows): each test is named for its row."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import secrets
from collections.abc import Callable
from urllib.parse import urlsplit

import pytest

from bot.log import configure_logging
from bot.metrics import REGISTRY
from bot.web.body import FIRST_READ, MAX_BODY, Inflater, Rejected
from bot.web.webhook import INTAKE_KEY
from tests.harness import headers_for, running_klaud
from tests.web.test_ingest import PR_PAYLOAD, Recorder, make_klaud, raw_post

MIB = 1024 * 1024
BOGUS_SIGNATURE = "sha256=" + "0" * 64


def nested(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


async def stored(run, delivery: str) -> bool:
    return (await run.get_json(f"/api/v1/deliveries/{delivery}"))[0] == 200


async def open_upload(url: str, headers: dict[str, str], first: bytes = b"") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A POST /webhook whose headers (and `first` body bytes) are sent, the rest never."""
    where = urlsplit(url)
    reader, writer = await asyncio.open_connection(where.hostname, where.port)
    head = "POST /webhook HTTP/1.1\r\nHost: klaud\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    writer.write(head.encode() + first)
    await writer.drain()
    return reader, writer


def upload_headers(length: int, *, signature: str | None = BOGUS_SIGNATURE, delivery: str = "stalled") -> dict[str, str]:
    headers = {"Content-Type": "application/json", "Content-Length": str(length),
               "X-GitHub-Event": "pull_request", "X-GitHub-Delivery": delivery}
    if signature:
        headers["X-Hub-Signature-256"] = signature
    return headers


async def until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


# -- JSON nested 5k-200k levels, signed ----------------------------------------------------


@pytest.mark.parametrize("depth", [5_000, 200_000])
async def test_json_nested_5k_to_200k_levels_is_400_invalid_json_and_stores_nothing(tmp_path, depth):
    async with running_klaud(make_klaud(tmp_path)) as run:
        body = nested(depth)
        status, answer = await raw_post(run, body, headers_for("pull_request", body, delivery="deep"))
        assert (status, answer["error"]) == (400, "invalid-json")
        assert "depth" in answer["detail"]
        assert not await stored(run, "deep")


def with_unread_field(value: bytes) -> bytes:
    """PR_PAYLOAD plus a field no handler reads, holding `value` as raw JSON bytes."""
    return json.dumps(PR_PAYLOAD).encode()[:-1] + b', "unread": ' + value + b"}"


@pytest.mark.parametrize(
    "value",
    [b'"\xff"', b'"\xed\xa0\x80"', b'{"\xc0\xaf": 1}', b'"\\udc00"'],
    ids=["invalid-utf-8", "utf-8-encoded-surrogate", "overlong-utf-8-key", "lone-surrogate-escape"],
)
async def test_json_that_is_not_utf_8_anywhere_in_the_body_is_400_and_stores_nothing(tmp_path, value):
    # What this catches: a field the ack does not read, not UTF-8, acknowledged with 202 and
    # stored, then failed by the handler's parser.
    async with running_klaud(make_klaud(tmp_path)) as run:
        body = with_unread_field(value)
        status, answer = await raw_post(run, body, headers_for("pull_request", body, delivery="unreadable"))
        assert (status, answer["error"]) == (400, "invalid-json")
        assert not await stored(run, "unreadable")


# -- headers sent, then the body stalls ----------------------------------------------------


async def test_a_body_that_stalls_after_its_headers_is_408_and_the_connection_closed(tmp_path):
    async with running_klaud(make_klaud(tmp_path), read_timeout=0.3) as run:
        reader, writer = await open_upload(run.url, upload_headers(1000), b'{"action": ')
        # Read to the end: the server answers, then closes the connection itself.
        answer = await asyncio.wait_for(reader.read(), timeout=30)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 408")
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"] == "request-timeout"
        assert not await stored(run, "stalled")


@pytest.mark.parametrize("sent", [b"", b"POST /webhook HTTP/1.1\r\nHost: k\r\nX-GitHub-Event: pu"])
async def test_a_connection_idle_or_stalled_in_its_headers_is_closed(tmp_path, sent):
    async with running_klaud(make_klaud(tmp_path), idle_timeout=0.3) as run:
        where = urlsplit(run.url)
        reader, writer = await asyncio.open_connection(where.hostname, where.port)
        writer.write(sent)
        await writer.drain()
        # aiohttp's default kept it open for an hour: a few thousand use up the descriptors.
        assert await asyncio.wait_for(reader.read(), timeout=30) == b""
        writer.close()


# -- unsigned 24 MiB bodies, stalled, many connections --------------------------------------


async def test_stalled_uploads_hold_only_the_bytes_they_sent_and_a_delivery_goes_through(tmp_path):
    async with running_klaud(make_klaud(tmp_path), body_budget=1 * MIB) as run:
        budget = run.webhook_app[INTAKE_KEY].budget
        # Charged for what they announced, two of these held the whole budget for 30 s.
        uploads = [await open_upload(run.url, upload_headers(MIB // 2, delivery=f"u{n}"), b"x" * 65536) for n in range(5)]
        # What each sent, plus the room for its next read (16 KiB, doubling while filled).
        await until(lambda: budget.in_use >= 5 * (65536 + FIRST_READ), "each upload holds the 64 KiB it sent")
        assert budget.in_use <= 5 * 2 * 65536 and budget.waiting == 0
        assert (await run.post("pull_request", PR_PAYLOAD, delivery="small"))[0] == 202
        for _, writer in uploads:
            writer.close()
        await until(lambda: budget.in_use == 0 and budget.waiting == 0, "the budget is free again")


async def test_bodies_that_fill_the_budget_make_the_next_wait_unread_until_bytes_are_freed(tmp_path):
    async with running_klaud(make_klaud(tmp_path), body_budget=1 * MIB) as run:
        budget = run.webhook_app[INTAKE_KEY].budget
        uploads = [await open_upload(run.url, upload_headers(MIB // 2, delivery=f"u{n}"), b"x" * (400 * 1024))
                   for n in range(2)]
        # The third comes once the first two hold what they sent: which of three arriving
        # together gets ahead depends on the order their reads came in.
        await until(lambda: budget.in_use >= 2 * 400 * 1024, "the first two hold what they sent")
        uploads.append(await open_upload(run.url, upload_headers(MIB // 2, delivery="u2"), b"x" * (400 * 1024)))
        await until(lambda: budget.waiting == 1, "the third upload waits for bytes to be freed")
        assert budget.in_use <= budget.limit == MIB
        for _, writer in uploads[:2]:
            writer.close()
        await until(lambda: budget.in_use >= 400 * 1024 and budget.waiting == 0, "the third one's bytes are read")
        uploads[2][1].close()
        await until(lambda: budget.in_use == 0, "the budget is free again")


async def test_an_upload_without_a_signature_is_refused_before_its_body_is_read(tmp_path):
    async with running_klaud(make_klaud(tmp_path)) as run:
        reader, writer = await open_upload(run.url, upload_headers(24 * MIB, signature=None))
        status_line = await asyncio.wait_for(reader.readline(), timeout=30)
        writer.close()
        assert status_line.startswith(b"HTTP/1.1 401")
        assert run.webhook_app[INTAKE_KEY].budget.in_use == 0


async def test_an_announced_length_over_25_mib_is_413_before_reading(tmp_path):
    async with running_klaud(make_klaud(tmp_path)) as run:
        reader, writer = await open_upload(run.url, upload_headers(MAX_BODY + 1))
        status_line = await asyncio.wait_for(reader.readline(), timeout=30)
        writer.close()
        assert status_line.startswith(b"HTTP/1.1 413")


# -- gzip bodies: the cap applies after decoding, counted as it decodes -----------------------


def padded_payload(pad_bytes: int) -> bytes:
    return json.dumps(dict(PR_PAYLOAD, pad="a" * pad_bytes)).encode()


async def post_gzip(run, decoded: bytes, delivery: str, encoded: bytes | None = None) -> tuple[int, dict]:
    # The signature covers the payload itself, as GitHub signs it before any proxy compresses it.
    headers = headers_for("pull_request", decoded, delivery=delivery) | {"Content-Encoding": "gzip"}
    return await raw_post(run, gzip.compress(decoded) if encoded is None else encoded, headers)


async def test_a_24_kb_gzip_body_inflating_to_23_mib_is_stored_decoded(tmp_path):
    recorder = Recorder()
    async with running_klaud(make_klaud(tmp_path, recorder)) as run:
        decoded = padded_payload(23 * MIB)
        assert len(gzip.compress(decoded)) < 64 * 1024
        status, _ = await post_gzip(run, decoded, "inflated")
        assert status == 202
        await run.klaud.inbox.drained()
        assert (await run.klaud.inbox.get("inflated")).body == decoded
    assert recorder.calls == [("acme/bench", 1)]


async def test_a_gzip_body_inflating_past_25_mib_is_413_and_stores_nothing(tmp_path):
    async with running_klaud(make_klaud(tmp_path)) as run:
        status, answer = await post_gzip(run, padded_payload(MAX_BODY), "bomb")
        assert (status, answer["error"]) == (413, "payload-too-large")
        assert not await stored(run, "bomb")


def test_inflating_stops_one_byte_past_the_cap_whatever_the_ratio():
    bomb = gzip.compress(b"\0" * (64 * MIB))  # about 64 KB
    inflater = Inflater(MIB)
    with pytest.raises(Rejected) as refused:
        list(inflater.pieces(bomb))
    assert refused.value.status == 413
    assert inflater.produced <= MIB + 1


def test_inflating_a_body_fed_in_small_pieces_gives_it_back_whole():
    original = json.dumps({"n": list(range(50_000))}).encode()
    compressed = gzip.compress(original)
    inflater = Inflater(MAX_BODY)
    pieces = [p for i in range(0, len(compressed), 1000) for p in inflater.pieces(compressed[i : i + 1000])]
    inflater.finish()
    assert b"".join(pieces) == original


@pytest.mark.parametrize(
    "encoded, code",
    [(b"not gzip at all", "invalid-encoding"), (gzip.compress(b'{"a": 1}')[:-6], "invalid-encoding")],
    ids=["garbage", "truncated"],
)
async def test_a_body_that_is_not_valid_gzip_is_400(tmp_path, encoded, code):
    async with running_klaud(make_klaud(tmp_path)) as run:
        status, answer = await post_gzip(run, b'{"a": 1}', "bad-gzip", encoded)
        assert (status, answer["error"]) == (400, code)


async def test_a_content_encoding_other_than_gzip_is_415(tmp_path):
    async with running_klaud(make_klaud(tmp_path)) as run:
        body = json.dumps(PR_PAYLOAD).encode()
        headers = headers_for("pull_request", body) | {"Content-Encoding": "br"}
        status, answer = await raw_post(run, body, headers)
        assert (status, answer["error"]) == (415, "unsupported-media-type")


# -- 20,000 unsigned requests with random X-GitHub-Event -------------------------------------


def rejected_count(label: str) -> float:
    return REGISTRY.get_sample_value("klaud_deliveries_total", {"event": label, "result": "rejected"}) or 0.0


async def metrics_text(run) -> str:
    async with run.session.get(f"{run.admin_url}/metrics") as response:
        return await response.text()


async def test_2000_unsigned_requests_with_random_event_names_keep_metrics_under_64_kb(tmp_path):
    async with running_klaud(make_klaud(tmp_path)) as run:
        before_size, before_other = len((await metrics_text(run)).encode()), rejected_count("other")
        names = [f"evt_{secrets.token_hex(6)}" for _ in range(2000)]

        async def unsigned(name: str) -> int:
            headers = {"Content-Type": "application/json", "X-GitHub-Event": name, "X-GitHub-Delivery": name}
            async with run.session.post(f"{run.url}/webhook", data=b"{}", headers=headers) as response:
                return response.status

        for start in range(0, len(names), 100):
            assert set(await asyncio.gather(*(unsigned(n) for n in names[start : start + 100]))) == {401}
        after_rejections = await metrics_text(run)
        # A signed delivery of an unknown event is accepted, under the shared label too.
        assert (await run.post("made_up_event", {"zen": "x"}))[0] == 202
        text = await metrics_text(run)
    assert rejected_count("other") - before_other == 2000
    # At most the shared label's two lines (total, created) appeared; the rest are numbers.
    assert len(after_rejections.encode()) - before_size < 512
    assert not any(name in after_rejections for name in names)
    assert 'klaud_deliveries_total{event="other",result="accepted"}' in text
    assert len(text.encode()) < 64 * 1024


# -- bad routing fields among 200 valid concurrent deliveries --------------------------------

VALID_ENVELOPE = '"action":"opened","number":0,"repository":{"full_name":"acme/bench"},"installation":{"id":7}'
BAD_BODIES = {
    "installation-id-10**30": '{"action":"opened","number":0,"repository":{"full_name":"acme/bench"},"installation":{"id":1000000000000000000000000000000}}',
    "lone-utf16-surrogate": '{' + VALID_ENVELOPE + ',"title":"\\ud800"}',
    "list-for-full_name": '{"action":"opened","number":0,"repository":{"full_name":["x"]},"installation":{"id":7}}',
    "number-for-full_name": '{"action":"opened","number":0,"repository":{"full_name":12345},"installation":{"id":7}}',
    "list-for-action": '{"action":["opened"],"number":0,"repository":{"full_name":"acme/bench"},"installation":{"id":7}}',
    "negative-installation-id": '{"action":"opened","number":0,"repository":{"full_name":"acme/bench"},"installation":{"id":-1}}',
    # Stored, shown by the API and logged: 5 MB of it made one 5 MB log line.
    "101-character-action": '{"action":"' + "a" * 101 + '","repository":{"full_name":"acme/bench"},"installation":{"id":7}}',
    "control-character-in-action": '{"action":"opened\\n","repository":{"full_name":"acme/bench"},"installation":{"id":7}}',
}


async def test_bad_deliveries_among_200_valid_concurrent_ones_are_refused_alone(tmp_path):
    recorder = Recorder()
    async with running_klaud(make_klaud(tmp_path, recorder)) as run:
        valid = [
            run.post("pull_request", dict(PR_PAYLOAD, number=n, repository={"full_name": f"acme/bench-{n % 4}"}), delivery=f"ok-{n}")
            for n in range(200)
        ]
        bad = [raw_post(run, body.encode(), headers_for("pull_request", body.encode(), delivery=name)) for name, body in BAD_BODIES.items()]
        # The bad ones go out in the middle of the burst, so they would share the store's batches.
        answers = await asyncio.gather(*valid[:100], *bad, *valid[100:])
        refused = dict(zip(BAD_BODIES, answers[100 : 100 + len(bad)], strict=True))
        for name, (status, answer) in refused.items():
            assert status == 400 and answer["error"] in {"invalid-json", "invalid-payload"}, name
        assert [status for status, _ in answers[:100] + answers[100 + len(bad) :]] == [202] * 200
        await run.klaud.inbox.drained()
        for name in BAD_BODIES:
            assert not await stored(run, name)
    assert sorted(number for _, number in recorder.calls) == list(range(200))


async def test_repository_full_name_12345_is_400_before_storing(tmp_path):
    async with running_klaud(make_klaud(tmp_path)) as run:
        status, answer = await run.post("pull_request", dict(PR_PAYLOAD, repository={"full_name": 12345}), delivery="n")
        assert (status, answer["error"]) == (400, "invalid-payload")
        assert "repository.full_name" in answer["detail"]
        assert not await stored(run, "n")


@pytest.mark.parametrize("name", ["acme", "acme/bench/extra", "acme/be nch", ""])
async def test_a_full_name_that_is_not_owner_slash_name_is_400(tmp_path, name):
    async with running_klaud(make_klaud(tmp_path)) as run:
        status, answer = await run.post("pull_request", dict(PR_PAYLOAD, repository={"full_name": name}))
        assert (status, answer["error"]) == (400, "invalid-payload")


async def test_installation_events_without_a_repository_are_accepted(tmp_path):
    async with running_klaud(make_klaud(tmp_path, Recorder())) as run:
        payload = {"action": "created", "installation": {"id": 9}, "repositories": [{"full_name": "acme/bench"}]}
        status, _ = await run.post("installation", payload, delivery="inst")
        assert status == 202


@pytest.mark.parametrize("header, value", [("X-GitHub-Event", "pull request"), ("X-GitHub-Delivery", "d\u00e9j\u00e0")])
async def test_event_and_delivery_headers_must_be_printable_ascii(tmp_path, header, value):
    async with running_klaud(make_klaud(tmp_path)) as run:
        body = json.dumps(PR_PAYLOAD).encode()
        headers = headers_for("pull_request", body) | {header: value}
        status, answer = await raw_post(run, body, {k: v.encode().decode("latin-1") for k, v in headers.items()})
        assert (status, answer["error"]) == (400, "invalid-header")


async def test_a_signed_delivery_naming_klauds_own_reconcile_request_is_refused(tmp_path):
    klaud = make_klaud(tmp_path)
    async with running_klaud(klaud) as run:
        payload = {"action": "full", "repository": {"full_name": "acme/bench"}, "installation": {"id": 1}}
        status, answer = await run.post("klaud_reconcile", payload, delivery="forged")
        assert (status, answer["error"]) == (400, "invalid-header") and "Klaud's own" in answer["detail"]
        assert await klaud.inbox.store.get("forged") is None


# -- full_name ACME/Bench vs acme/bench ------------------------------------------------------


async def test_full_name_case_does_not_split_a_repository_queue(tmp_path):
    # The first delivery fails twice: had the names two queues, the second would overtake it.
    recorder = Recorder(failures=2)
    async with running_klaud(make_klaud(tmp_path, recorder)) as run:
        await run.post("pull_request", dict(PR_PAYLOAD, number=1, repository={"full_name": "ACME/Bench"}))
        await run.post("pull_request", dict(PR_PAYLOAD, number=2, repository={"full_name": "acme/bench"}))
        await run.klaud.inbox.drained()
    assert [number for _, number in recorder.calls] == [1, 1, 1, 2]


# -- a traceback anywhere in the server ------------------------------------------------------


async def test_an_exception_in_a_route_is_one_json_log_line_and_a_json_500(tmp_path, capsys):
    klaud = make_klaud(tmp_path)

    async def exploding(repo: str) -> None:
        raise RuntimeError("the state exploded")

    klaud.state_document = exploding  # type: ignore[method-assign]
    configure_logging("json")
    capsys.readouterr()  # what was logged before JSON was asked for
    async with running_klaud(klaud) as run:
        status, answer = await run.get_json("/api/v1/repos/acme/bench/state")
    assert (status, answer["error"]) == (500, "internal-error")
    assert "exploded" not in answer["detail"]
    records = [json.loads(line) for line in capsys.readouterr().err.splitlines()]  # every line is JSON
    failed = next(record for record in records if record["event"] == "http.failed")
    assert "RuntimeError: the state exploded" in failed["exception"]


@pytest.mark.parametrize(("request_head", "error"), [
    (b"GET * HTTP/1.1\r\nHost: klaud\r\n\r\n", "InvalidURLError: 400 *"),
    (b"GET /healthz HTTP/1.1\r\nHost: klaud\r\nContent-Length: x\r\n\r\n",
     "BadHttpMessage: 400 Invalid character in Content-Length"),
    (b"POST /webhook HTTP/1.1\r\nHost: klaud\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
     "BadHttpMessage: 400 Duplicate Content-Length"),
])
async def test_a_request_the_listener_cannot_parse_is_400_and_one_info_line_without_a_traceback(
        tmp_path, capsys, request_head, error):
    # What this catches: aiohttp logging a malformed request (the client's error, answered
    # 400) as an ERROR with a traceback: anyone could flood the error log and trip alerts.
    configure_logging("json")
    capsys.readouterr()
    async with running_klaud(make_klaud(tmp_path)) as run:
        where = urlsplit(run.url)
        reader, writer = await asyncio.open_connection(where.hostname, where.port)
        writer.write(request_head)
        assert (await reader.readline()).startswith(b"HTTP/1.0 400 ")
        await reader.read()  # aiohttp closes the connection after logging
        writer.close()
    records = [json.loads(line) for line in capsys.readouterr().err.splitlines()]  # every line is JSON
    [said] = [record for record in records if record.get("logger") == "aiohttp.server"]
    assert said["level"] == "info" and "exception" not in said
    assert said["event"].startswith(f"Error handling request from 127.0.0.1: {error}")
    assert not [record for record in records if record["level"] in ("error", "critical")]


def test_library_log_records_become_json_lines_with_their_exception(capsys):
    configure_logging("json")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("aiohttp.server").exception("Error handling request")
    [line] = capsys.readouterr().err.splitlines()
    record = json.loads(line)
    assert record["event"] == "Error handling request" and record["logger"] == "aiohttp.server"
    assert record["level"] == "error" and "ValueError: boom" in record["exception"]


def test_a_client_error_aiohttp_logs_at_debug_stays_at_debug(capsys):
    # What this catches: the client-error filter raising aiohttp's debug line for non-HTTP
    # traffic (BadHttpMethod on a connection's first request) to info.
    from aiohttp.http_exceptions import BadHttpMethod

    configure_logging("json", "debug")
    logging.getLogger("aiohttp.server").debug("Error handling request", exc_info=BadHttpMethod("\x16\x03"))
    [record] = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert record["level"] == "debug" and "exception" not in record


def test_log_level_warning_hides_info_lines_of_klaud_and_libraries(capsys):
    import structlog
    from aiohttp.http_exceptions import BadHttpMessage

    configure_logging("json", "warning")
    structlog.get_logger("t").info("hidden")
    logging.getLogger("aiohttp.access").info("hidden too")
    # A request aiohttp cannot parse, which it logs as an error and Klaud as an info line
    # (a review: that line passed the logger's error level and printed at any level).
    logging.getLogger("aiohttp.server").error("Error handling request", exc_info=BadHttpMessage("Content-Length: x"))
    structlog.get_logger("t").warning("shown")
    assert [json.loads(line)["event"] for line in capsys.readouterr().err.splitlines()] == ["shown"]

