"""Two listeners (DESIGN §3.3): the webhook listener GitHub reaches, the admin listener with
the API and /metrics; each endpoint on its own listener and 404 on the other."""

from __future__ import annotations

import asyncio
import contextlib
import json
from urllib.parse import urlsplit

import pytest

from bot.services import waves as waves_module
from bot.settings import SettingsError, load_settings
from tests import scenarios as sc
from tests.harness import headers_for, make_settings, running_klaud, sandbox_stack
from tests.web.test_ingest import PR_PAYLOAD, Recorder, make_klaud

ADMIN_ONLY = [
    "/metrics",
    "/api/v1/deliveries/d-1",
    "/api/v1/repos",
    "/api/v1/repos/acme/bench/state",
    "/api/v1/repos/acme/bench/plan",
    "/api/v1/repos/acme/bench/waves?limit=2",
]


async def _status(session, method: str, url: str, **kwargs) -> int:
    async with session.request(method, url, **kwargs) as response:
        await response.read()
        return response.status


async def test_each_endpoint_answers_on_its_listener_and_404_on_the_other(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        session = run.klaud.session
        body = json.dumps(PR_PAYLOAD).encode()
        webhook = {"data": body, "headers": headers_for("pull_request", body, delivery="d-1")}
        assert await _status(session, "POST", f"{run.url}/webhook", **webhook) == 202
        assert await _status(session, "POST", f"{run.admin_url}/webhook", **webhook) == 404
        await run.settle()
        for path in ("/healthz", "/readyz"):
            assert await _status(session, "GET", f"{run.url}{path}") == 200, path
            assert await _status(session, "GET", f"{run.admin_url}{path}") == 200, path
        for path in ADMIN_ONLY:
            assert await _status(session, "GET", f"{run.admin_url}{path}") == 200, path
            assert await _status(session, "GET", f"{run.url}{path}") == 404, path


async def test_a_missing_route_answers_the_json_error_body(tmp_path):
    async with running_klaud(make_klaud(tmp_path)) as run, run.session.get(f"{run.url}/metrics") as response:
        assert response.status == 404
        assert (await response.json())["error"] == "not-found"


async def test_waves_endpoint_lists_the_last_stored_wave_documents_newest_first(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        for _ in range(3):
            await run.klaud.waves.run(sc.REPO, trigger="test")
        async with run.klaud.session.get(f"{run.admin_url}/api/v1/repos/acme/bench/waves?limit=2") as response:
            assert response.status == 200
            documents = await response.json()
        assert [d["wave"] for d in documents] == [3, 2]
        assert {"repo", "selected", "decisions"} <= set(documents[0])
        async with run.klaud.session.get(f"{run.admin_url}/api/v1/repos/acme/bench/waves") as response:
            assert [d["wave"] for d in await response.json()] == [3, 2, 1]
        async with run.klaud.session.get(f"{run.admin_url}/api/v1/repos/acme/nope/waves") as response:
            assert response.status == 404


@pytest.mark.parametrize("limit", ["0", "101", "x", "-1", "²"])
async def test_waves_limit_outside_1_to_100_is_400(tmp_path, limit):
    async with running_klaud(make_klaud(tmp_path)) as run:
        status, body = await run.get_json(f"/api/v1/repos/acme/bench/waves?limit={limit}")
    assert status == 400 and body["error"] == "invalid-parameter"


async def test_admin_token_guards_every_admin_route_but_health(tmp_path):
    async with running_klaud(make_klaud(tmp_path, Recorder()), admin_token="s3cret") as run:
        await run.post("pull_request", PR_PAYLOAD, delivery="d-1")
        for path in ("/metrics", "/api/v1/deliveries/d-1", "/api/v1/repos/acme/bench/state", "/nowhere"):
            status, body = await run.get_json(path)
            assert (status, body["error"]) == (401, "unauthorized"), path
        assert (await run.get_json("/api/v1/deliveries/d-1", {"Authorization": "Bearer wrong"}))[0] == 401
        assert (await run.get_json("/api/v1/deliveries/d-1", {"Authorization": "s3cret"}))[0] == 401
        assert (await run.get_json("/api/v1/deliveries/d-1", {"Authorization": "Bearer s3cret"}))[0] == 200
        headers = {"Authorization": "Bearer s3cret"}
        assert await _status(run.session, "GET", f"{run.admin_url}/metrics", headers=headers) == 200
        assert (await run.get_json("/healthz"))[0] == 200
        assert (await run.get_json("/readyz"))[0] == 200


async def test_serve_settings_give_the_admin_listener_its_token(tmp_path):
    async with sandbox_stack(tmp_path, sc.scenario(), env={"KLAUD_ADMIN_TOKEN": "t0ken"}) as run:
        session = run.klaud.session
        assert await _status(session, "GET", f"{run.admin_url}/api/v1/repos/acme/bench/state") == 401
        headers = {"Authorization": "Bearer t0ken"}
        assert await _status(session, "GET", f"{run.admin_url}/api/v1/repos/acme/bench/state", headers=headers) == 200


def test_admin_listener_defaults_to_loopback_8081_without_a_token():
    settings = load_settings({})
    assert (settings.admin_host, settings.admin_port, settings.admin_token) == ("127.0.0.1", 8081, None)


def test_admin_settings_are_read_from_the_environment(tmp_path):
    settings = make_settings(tmp_path / "k.db", KLAUD_ADMIN_HOST="0.0.0.0", KLAUD_ADMIN_PORT="9100", KLAUD_ADMIN_TOKEN="x")
    assert (settings.admin_host, settings.admin_port) == ("0.0.0.0", 9100)
    assert settings.admin_token is not None and settings.admin_token.get_secret_value() == "x"
    assert "x" not in repr(settings)


@pytest.mark.parametrize("variable", ["KLAUD_ADMIN_TOKEN", "KLAUD_CAPACITY_TOKEN"])
@pytest.mark.parametrize("token", ["t0ken\n", "t0ken ", " t0ken", "t0\x01ken"])
def test_an_admin_token_no_request_can_present_stops_start_up_naming_the_variable(tmp_path, token, variable):
    # What this catches: a token read with a secret file's trailing newline accepted at
    # start-up; HTTP strips a header value's surrounding whitespace, so every admin call was
    # a 401 (and aiohttp refused to send every read of the capacity feed with such a token).
    with pytest.raises(SettingsError, match=f"^{variable}: ") as refused:
        make_settings(tmp_path / "k.db", **{variable: token})
    assert "t0" not in str(refused.value) and len(str(refused.value).splitlines()) == 1


async def test_an_unknown_delivery_id_is_404_not_found(tmp_path):
    # What this catches: a delivery id nobody sent answered with a 500 instead of a 404.
    async with running_klaud(make_klaud(tmp_path)) as run:
        status, body = await run.get_json("/api/v1/deliveries/never-sent")
    assert (status, body["error"]) == (404, "not-found")


async def test_the_admin_token_is_compared_case_sensitively(tmp_path):
    # What this catches: a token that differs only in letter case let through.
    async with running_klaud(make_klaud(tmp_path), admin_token="s3cret") as run:
        assert (await run.get_json("/api/v1/repos", {"Authorization": "Bearer S3CRET"}))[0] == 401
        assert (await run.get_json("/api/v1/repos", {"Authorization": "Bearer s3cret"}))[0] == 200


async def test_a_refused_admin_request_names_the_bearer_scheme(tmp_path):
    # What this catches: a 401 without the WWW-Authenticate header that says which credentials to send.
    async with running_klaud(make_klaud(tmp_path), admin_token="s3cret") as run, \
            run.session.get(f"{run.admin_url}/api/v1/repos") as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("limit", ["0010", "9" * 5000])
async def test_a_waves_limit_of_more_than_three_digits_is_400(tmp_path, limit):
    # What this catches: a limit of thousands of digits reaching int() (a 500) or zero-padded ones let through.
    async with running_klaud(make_klaud(tmp_path)) as run:
        status, body = await run.get_json(f"/api/v1/repos/acme/bench/waves?limit={limit}")
    assert (status, body["error"]) == (400, "invalid-parameter")


async def test_waves_limit_lists_the_last_n_stored_documents_past_a_wave_that_stored_none(tmp_path, monkeypatch):
    # A wave cancelled during its dispatch (a SIGTERM) numbered itself and stored no document:
    # counting N numbers back listed fewer than N documents.
    async with sandbox_stack(tmp_path, sc.scenario(policy="max_candidates_per_wave: 1\n")) as run:
        assert (await run.klaud.waves.run("acme/bench", trigger="test")).wave == 1
        dispatching = asyncio.Event()

        async def hanging_dispatch(*args, **kwargs):  # type: ignore[no-untyped-def]
            dispatching.set()
            await asyncio.Event().wait()

        monkeypatch.setattr(waves_module, "dispatch_run", hanging_dispatch)
        cancelled = asyncio.create_task(run.klaud.waves.run("acme/bench", trigger="test"))
        await dispatching.wait()
        cancelled.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await cancelled
        monkeypatch.undo()
        third = await run.klaud.waves.run("acme/bench", trigger="test")

        async with run.klaud.session.get(f"{run.admin_url}/api/v1/repos/acme/bench/waves?limit=2") as response:
            status, body = response.status, await response.json()

    assert status == 200 and [document["wave"] for document in body] == [third.wave, 1] and third.wave == 3


async def test_the_plan_endpoint_plans_for_the_time_asked(tmp_path):
    # What this catches: `/plan?at=` parsed and then ignored, the plan made for the present instead.
    async with sandbox_stack(tmp_path, sc.scenario()) as run, \
            run.klaud.session.get(f"{run.admin_url}/api/v1/repos/acme/bench/plan",
                                  params={"at": "2026-11-30T09:00:00Z"}) as response:
        assert response.status == 200
        document = await response.json()
    assert document["at"] == "2026-11-30T09:00:00Z"


@pytest.mark.parametrize("at", ["2026-11-30T09:00:00", "9998-01-01T00:00:00Z"])
async def test_a_plan_time_without_a_zone_or_out_of_range_is_400_saying_what_is_accepted(tmp_path, at):
    # What this catches: a year past 9000 answered "must have a timezone", the wrong reason.
    async with running_klaud(make_klaud(tmp_path)) as run:
        status, body = await run.get_json(f"/api/v1/repos/acme/bench/plan?at={at}")
    assert (status, body["error"]) == (400, "invalid-parameter")
    assert body["detail"] == "at must be an ISO time with a timezone, in the years 1970-9000"


@pytest.mark.parametrize("limit", ["1", "100"])
async def test_waves_limits_1_and_100_are_accepted(tmp_path, limit):
    # What this catches: the documented bounds of `limit` themselves refused with 400.
    async with sandbox_stack(tmp_path, sc.scenario()) as run, \
            run.klaud.session.get(f"{run.admin_url}/api/v1/repos/acme/bench/waves", params={"limit": limit}) as response:
        assert response.status == 200


async def test_a_non_utf8_authorization_header_is_a_json_401(tmp_path):
    # What this catches: header bytes that are not UTF-8 answered with aiohttp's plain-text 500
    # (and a traceback in the log) instead of the contract's 401.
    async with running_klaud(make_klaud(tmp_path), admin_token="s3cret") as run:
        where = urlsplit(run.admin_url)
        reader, writer = await asyncio.open_connection(where.hostname, where.port)
        writer.write(b"GET /api/v1/repos HTTP/1.1\r\nHost: k\r\nAuthorization: Bearer \xff\r\nConnection: close\r\n\r\n")
        await writer.drain()
        answer = await reader.read()
        writer.close()
    assert answer.startswith(b"HTTP/1.1 401")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"] == "unauthorized"
