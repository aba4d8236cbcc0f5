"""Webhook intake and the durable inbox, against the real server over loopback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import aiohttp
import msgspec
import pytest
from gidgethub import routing
from structlog.testing import capture_logs

from bot.app import Klaud
from bot.web import inbox as inbox_module
from bot.web import webhook as webhook_module
from tests.harness import (
    PREVIOUS_SECRET,
    SECRET,
    headers_for,
    make_settings,
    running_klaud,
)
from tests.helpers.slow_server import wait_for_urls
from tests.ports import free_ports

ROOT = Path(__file__).resolve().parents[2]
PR_PAYLOAD = {
    "action": "opened",
    "number": 1,
    "repository": {"full_name": "acme/bench"},
    "installation": {"id": 7},
}


def pull_request_event(number: int) -> dict:
    """PR_PAYLOAD with the pull request a real handler parses (slow_server's does)."""
    side = {"ref": "main", "sha": "0" * 40}
    pull = {"number": number, "user": {"login": "octocat"}, "head": side, "base": side,
            "created_at": "2026-11-30T08:00:00Z", "updated_at": "2026-11-30T08:00:00Z"}
    return dict(PR_PAYLOAD, number=number, pull_request=pull)


class Recorder:
    """A router whose pull_request handler records calls and can fail on demand."""

    def __init__(self, failures: int = 0, exc: type[Exception] = ConnectionError, delay: float = 0.0) -> None:
        self.calls: list[tuple[str, int]] = []
        self.failures = failures
        self.exc = exc
        self.delay = delay
        self.router = routing.Router()
        self.router.add(self._handle, "pull_request")

    async def _handle(self, event, ctx) -> None:
        if self.delay:
            await asyncio.sleep(self.delay)
        payload = msgspec.json.decode(event.body)
        self.calls.append((payload["repository"]["full_name"], payload["number"]))
        if self.failures:
            self.failures -= 1
            raise self.exc("simulated failure")


def make_klaud(tmp_path: Path, recorder: Recorder | None = None, **inbox_options) -> Klaud:
    options = {"base_delay": 0.005, "max_delay": 0.02}
    options.update(inbox_options)
    return Klaud(
        make_settings(tmp_path / "klaud.db"),
        router=recorder.router if recorder else None,
        inbox_options=options,
    )


async def wait_status(run, delivery: str, *statuses: str) -> dict:
    for _ in range(500):
        status, body = await run.get_json(f"/api/v1/deliveries/{delivery}")
        if status == 200 and body["status"] in statuses:
            return body
        await asyncio.sleep(0.01)
    raise AssertionError(f"delivery {delivery} never reached {statuses}: {body}")


async def raw_post(run, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    async with run.session.post(f"{run.url}/webhook", data=body, headers=headers) as response:
        return response.status, await response.json()


async def test_valid_signature_is_queued_then_processed(tmp_path):
    recorder = Recorder()
    async with running_klaud(make_klaud(tmp_path, recorder)) as run:
        status, body = await run.post("pull_request", PR_PAYLOAD, delivery="d-1")
        assert (status, body) == (202, {"delivery": "d-1", "queued": True})
        done = await wait_status(run, "d-1", "done")
    assert done == {
        "id": "d-1",
        "event": "pull_request",
        "action": "opened",
        "status": "done",
        "attempts": 1,
        "error": None,
    }
    assert recorder.calls == [("acme/bench", 1)]


async def test_previous_secret_is_accepted_while_rotating(tmp_path):
    async with running_klaud(make_klaud(tmp_path, Recorder())) as run:
        status, _ = await run.post("pull_request", PR_PAYLOAD, delivery="old", secret=PREVIOUS_SECRET)
        assert status == 202


@pytest.mark.parametrize(
    "mutate, status, code",
    [
        (lambda h, b: h.update({"X-Hub-Signature-256": "sha256=" + "0" * 64}), 401, "invalid-signature"),
        (lambda h, b: h.pop("X-Hub-Signature-256"), 401, "invalid-signature"),
        (lambda h, b: h.update({"X-Hub-Signature-256": headers_for("x", b, secret="wrong")["X-Hub-Signature-256"]}), 401, "invalid-signature"),
        (lambda h, b: h.pop("X-GitHub-Event"), 400, "missing-header"),
        (lambda h, b: h.pop("X-GitHub-Delivery"), 400, "missing-header"),
        (lambda h, b: h.update({"Content-Type": "application/x-www-form-urlencoded"}), 415, "unsupported-media-type"),
    ],
    ids=["bad-signature", "no-signature", "wrong-secret", "no-event", "no-delivery", "form-encoded"],
)
async def test_rejections_answer_json_and_store_nothing(tmp_path, mutate, status, code):
    async with running_klaud(make_klaud(tmp_path, Recorder())) as run:
        body = json.dumps(PR_PAYLOAD).encode()
        headers = headers_for("pull_request", body, delivery="rejected-1")
        mutate(headers, body)
        got_status, got = await raw_post(run, body, headers)
        assert got_status == status
        assert got["error"] == code and got["detail"]
        lookup, _ = await run.get_json("/api/v1/deliveries/rejected-1")
        assert lookup == 404
        assert run.klaud.inbox.backlog == 0


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b"\xff\xfe"], ids=["text", "array", "binary"])
async def test_body_that_is_not_a_json_object_is_400(tmp_path, body):
    async with running_klaud(make_klaud(tmp_path, Recorder())) as run:
        status, got = await raw_post(run, body, headers_for("pull_request", body, delivery="bad-body"))
        assert status == 400 and got["error"] == "invalid-json"
        assert (await run.get_json("/api/v1/deliveries/bad-body"))[0] == 404


async def test_oversized_body_is_413(tmp_path):
    async with running_klaud(make_klaud(tmp_path, Recorder())) as run:
        body = b'{"pad": "' + b"x" * (25 * 1024 * 1024) + b'"}'
        status, got = await raw_post(run, body, headers_for("pull_request", body, delivery="big"))
        assert status == 413 and got["error"] == "payload-too-large"
        assert (await run.get_json("/api/v1/deliveries/big"))[0] == 404


async def test_duplicate_delivery_id_is_not_processed_twice(tmp_path):
    recorder = Recorder()
    async with running_klaud(make_klaud(tmp_path, recorder)) as run:
        first = await run.post("pull_request", PR_PAYLOAD, delivery="dup")
        second = await run.post("pull_request", PR_PAYLOAD, delivery="dup")
        await run.klaud.inbox.drained()
    assert first[0] == 202
    assert second == (200, {"delivery": "dup", "duplicate": True})
    assert recorder.calls == [("acme/bench", 1)]


async def test_ping_answers_200(tmp_path):
    async with running_klaud(make_klaud(tmp_path)) as run:
        status, body = await run.post("ping", {"zen": "Keep it logically awesome.", "hook_id": 1})
        assert status == 200 and body["ping"] is True


async def test_unknown_event_is_accepted_ignored_and_logged(tmp_path):
    with capture_logs() as logs:
        async with running_klaud(make_klaud(tmp_path)) as run:
            status, _ = await run.post("star", {"action": "created"}, delivery="star-1")
            assert status == 202
            done = await wait_status(run, "star-1", "done")
    assert done["attempts"] == 1
    assert any(entry["event"] == "delivery.ignored" for entry in logs)


async def test_same_repository_in_order_other_repositories_concurrently(tmp_path):
    recorder = Recorder(delay=0.01)
    async with running_klaud(make_klaud(tmp_path, recorder)) as run:
        posts = []
        for number in range(1, 21):
            for repo in ("acme/one", "acme/two"):
                payload = dict(PR_PAYLOAD, number=number, repository={"full_name": repo})
                posts.append(run.post("pull_request", payload))
        # Send each repository's deliveries in order, interleaving the repositories.
        for coro in posts:
            assert (await coro)[0] == 202
        await run.klaud.inbox.drained()
    by_repo = defaultdict(list)
    for repo, number in recorder.calls:
        by_repo[repo].append(number)
    assert by_repo["acme/one"] == list(range(1, 21))
    assert by_repo["acme/two"] == list(range(1, 21))
    # Concurrency across repositories: the two sequences interleave instead of running one after the other.
    first_two = recorder.calls.index(("acme/two", 1))
    assert first_two < 20


async def test_transient_error_retries_then_succeeds(tmp_path):
    recorder = Recorder(failures=2)
    async with running_klaud(make_klaud(tmp_path, recorder)) as run:
        await run.post("pull_request", PR_PAYLOAD, delivery="flaky")
        done = await wait_status(run, "flaky", "done")
    assert done["attempts"] == 3 and done["error"] is None
    assert len(recorder.calls) == 3


async def test_retry_keeps_order_of_the_repository(tmp_path):
    recorder = Recorder(failures=2)
    async with running_klaud(make_klaud(tmp_path, recorder)) as run:
        await run.post("pull_request", dict(PR_PAYLOAD, number=1), delivery="first")
        await run.post("pull_request", dict(PR_PAYLOAD, number=2), delivery="second")
        await run.klaud.inbox.drained()
    assert recorder.calls == [("acme/bench", 1)] * 3 + [("acme/bench", 2)]


async def test_persistent_error_ends_failed_after_eight_attempts(tmp_path):
    recorder = Recorder(failures=100)
    async with running_klaud(make_klaud(tmp_path, recorder)) as run:
        await run.post("pull_request", PR_PAYLOAD, delivery="doomed")
        failed = await wait_status(run, "doomed", "failed")
    assert failed["attempts"] == 8
    assert "simulated failure" in failed["error"]
    assert len(recorder.calls) == 8


async def test_permanent_error_fails_at_once(tmp_path):
    recorder = Recorder(failures=1, exc=ValueError)  # a bug: a retry would only repeat it
    with capture_logs() as logs:
        async with running_klaud(make_klaud(tmp_path, recorder)) as run:
            await run.post("pull_request", PR_PAYLOAD, delivery="gone")
            failed = await wait_status(run, "gone", "failed")
    assert failed["attempts"] == 1 and "ValueError" in failed["error"]
    assert any(e["event"] == "delivery.failed" and e["log_level"] == "warning" for e in logs)


async def test_graceful_stop_lets_running_handler_finish(tmp_path):
    recorder = Recorder(delay=0.3)
    klaud = make_klaud(tmp_path, recorder)
    async with running_klaud(klaud) as run:
        await run.post("pull_request", PR_PAYLOAD, delivery="slow")
        await asyncio.sleep(0.05)  # the handler is now running
    # running_klaud stopped the Klaud gracefully; reopen the store to read the outcome.
    reopened = make_klaud(tmp_path)
    await reopened.start(drain=False)
    delivery = await reopened.inbox.get("slow")
    await reopened.stop()
    assert delivery is not None and delivery.status == "done"
    assert recorder.calls == [("acme/bench", 1)]


async def test_killed_process_resumes_every_acknowledged_delivery(tmp_path):
    db = tmp_path / "klaud.db"
    urls_file = tmp_path / "urls"
    # Started and killed from the test's thread: asyncio's subprocess API would tie the
    # process to the event loop, and the point is to kill it like an operator would.
    proc = await asyncio.to_thread(
        subprocess.Popen,
        [sys.executable, str(ROOT / "tests" / "helpers" / "slow_server.py"), str(db), str(urls_file), "0.2"],
        cwd=ROOT,
    )
    try:
        webhook_url, _ = await asyncio.to_thread(wait_for_urls, urls_file, proc)
        url = f"{webhook_url}/webhook"
        ids = [f"kill-{n}" for n in range(10)]
        async with aiohttp.ClientSession() as session:
            for number, delivery in enumerate(ids):
                body = json.dumps(pull_request_event(number)).encode()
                async with session.post(url, data=body, headers=headers_for("pull_request", body, delivery=delivery)) as r:
                    assert r.status == 202
        await asyncio.sleep(0.3)  # let one or two finish, then crash mid-work
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    recorder = Recorder()
    klaud = Klaud(make_settings(db), router=recorder.router, inbox_options={"base_delay": 0.005})
    await klaud.start(drain=False)
    before = {d: (await klaud.inbox.get(d)).status for d in ids}
    await klaud.inbox.start()
    await klaud.inbox.drained()
    after = {d: (await klaud.inbox.get(d)).status for d in ids}
    await klaud.stop()

    unfinished = {d for d, status in before.items() if status != "done"}
    assert unfinished, "the crash came too late to test recovery"
    assert all(status == "done" for status in after.values())
    # Exactly the unfinished deliveries ran again, each once, in arrival order.
    rerun = [f"kill-{number}" for _, number in recorder.calls]
    assert rerun == sorted(unfinished, key=lambda d: int(d.split("-")[1]))


async def test_health_ready_and_metrics(tmp_path):
    async with running_klaud(make_klaud(tmp_path, Recorder())) as run:
        await run.post("pull_request", PR_PAYLOAD, delivery="m-1")
        await run.klaud.inbox.drained()
        assert (await run.get_json("/healthz"))[0] == 200
        status, ready = await run.get_json("/readyz")
        assert status == 200 and ready["store"] is True and ready["backlog"] == 0
        async with run.session.get(f"{run.admin_url}/metrics") as response:
            text = await response.text()
    assert 'klaud_deliveries_total{event="pull_request",result="accepted"}' in text
    assert "klaud_inbox_backlog" in text
    assert "klaud_delivery_processing_seconds_bucket" in text


async def test_a_backlog_being_worked_through_keeps_the_replica_ready(tmp_path):
    async with running_klaud(make_klaud(tmp_path, Recorder()), drain=False) as run:
        for number in range(5):
            await run.post("pull_request", PR_PAYLOAD, delivery=f"busy-{number}")
        status, body = await run.get_json("/readyz")
    assert status == 200 and body["backlog"] == 5 and body["storage_risk"] is None


async def test_a_store_that_does_not_answer_in_time_gets_503_and_the_write_goes_on(tmp_path, monkeypatch):
    # GitHub gives up after 10 s: a store that hangs (a table locked, a link dropping
    # packets) must not hold the answer, nor every later request behind it.
    monkeypatch.setattr(webhook_module, "STORE_ANSWER_SECONDS", 0.2)
    klaud = make_klaud(tmp_path, Recorder())
    async with running_klaud(klaud, drain=False) as run:
        answers = asyncio.Event()
        put_soon = klaud.inbox.store.put_soon

        async def slow_put(delivery):
            await answers.wait()
            return await put_soon(delivery)

        monkeypatch.setattr(klaud.inbox.store, "put_soon", lambda delivery: asyncio.ensure_future(slow_put(delivery)))
        slow = await run.post("pull_request", PR_PAYLOAD, delivery="slow-1")
        refused = await run.post("pull_request", PR_PAYLOAD, delivery="slow-2")  # not waiting behind it
        not_ready = await run.get_json("/readyz")
        answers.set()
        for _ in range(100):
            if klaud.inbox.backlog:
                break
            await asyncio.sleep(0.01)
        ready = await run.get_json("/readyz")
        again = await run.post("pull_request", PR_PAYLOAD, delivery="slow-1")  # GitHub's redelivery
    assert slow[0] == 503 and slow[1]["error"] == "store-slow"
    assert refused[0] == 503 and refused[1]["error"] == "storage-at-risk"
    assert not_ready[0] == 503 and "not answered" in not_ready[1]["storage_risk"]
    assert klaud.inbox.backlog == 1 and ready[0] == 200, "the late write kept and queued the delivery"
    assert again[0] == 200 and again[1]["duplicate"] is True


async def test_a_store_that_stops_answering_is_not_ready_until_it_answers_again(tmp_path, monkeypatch):
    klaud = make_klaud(tmp_path, Recorder())
    async with running_klaud(klaud) as run:
        fetch = klaud.inbox.store.db.fetch

        async def unreachable(sql, *args):
            raise ConnectionRefusedError("Connect call failed ('10.0.0.5', 5432)")

        monkeypatch.setattr(klaud.inbox.store.db, "fetch", unreachable)
        monkeypatch.setattr(inbox_module, "PROBE_EVERY", 0.0)
        down = await run.get_json("/readyz")
        async with run.session.get(f"{run.url}/readyz") as public:
            down_in_public = public.status, await public.json()
        monkeypatch.setattr(klaud.inbox.store.db, "fetch", fetch)
        up = await run.get_json("/readyz")
    assert down[0] == 503 and down[1]["store_error"] == "ConnectionRefusedError: Connect call failed ('10.0.0.5', 5432)"
    # The webhook listener faces the internet: the store's address stays off it (a review).
    assert down_in_public == (503, {**down[1], "store_error": "ConnectionRefusedError"})
    assert up[0] == 200 and up[1]["store_error"] is None


async def test_a_full_inbox_refuses_deliveries_with_retry_after_and_is_not_ready(tmp_path):
    klaud = make_klaud(tmp_path, Recorder(), backlog_limit=1)
    async with running_klaud(klaud, drain=False) as run:
        first, _ = await run.post("pull_request", PR_PAYLOAD, delivery="full-1")
        body_bytes = json.dumps(PR_PAYLOAD).encode()
        headers = headers_for("pull_request", body_bytes, delivery="full-2")
        async with run.session.post(f"{run.url}/webhook", data=body_bytes, headers=headers) as refused:
            retry_after, refusal = refused.headers.get("Retry-After"), await refused.json()
        status, body = await run.get_json("/readyz")
        stored = await klaud.inbox.store.get("full-2")
    assert first == 202
    assert refused.status == 503 and retry_after == "60"
    assert refusal["error"] == "storage-at-risk" and "limit 1" in refusal["detail"]
    assert stored is None
    assert status == 503 and body["backlog"] == 1 and "limit 1" in body["storage_risk"]


async def test_a_disk_about_to_fill_refuses_deliveries(tmp_path):
    klaud = make_klaud(tmp_path, Recorder(), min_free_bytes=2**62)  # more than any disk has
    async with running_klaud(klaud, drain=False) as run:
        status, refusal = await run.post("pull_request", PR_PAYLOAD)
    assert status == 503 and "MiB free where the store writes" in refusal["detail"]


def _fixture_payloads(root: Path):
    for path in sorted((root / "octokit-webhooks").glob("*/*.json")):
        yield path.parent.name, path, json.loads(path.read_text())


def _installation_of(full_name: str, ids: dict[str, int]) -> int:
    """The installation of the account of `full_name`: one per account, as on GitHub."""
    return ids.setdefault(full_name.split("/")[0].lower(), len(ids) + 1)


def _fixture_world(root: Path, ids: dict[str, int]) -> dict:
    """A sandbox holding every repository, pull request and issue the example payloads name;
    `ids` gets each account's installation id."""
    repos: dict[str, dict] = {}

    def repo(name: str) -> dict:
        return repos.setdefault(name, {"full_name": name, "installation_id": _installation_of(name, ids),
                                       "default_branch": "master", "files": {}, "pulls": []})

    for _, _, payload in _fixture_payloads(root):
        for key in ("repository",):
            if payload.get(key):
                repo(payload[key]["full_name"])
        for listed in payload.get("repositories") or payload.get("repositories_added") or []:
            repo(listed["full_name"])
        pr = payload.get("pull_request")
        if pr and not any(p["number"] == pr["number"] for p in repo(payload["repository"]["full_name"])["pulls"]):
            repo(payload["repository"]["full_name"])["pulls"].append(
                {"number": pr["number"], "title": pr["title"], "user": pr["user"]["login"], "head_ref": pr["head"]["ref"]}
            )
    return {"now": "2026-11-30T08:00:00Z", "repositories": list(repos.values()), "timeline": []}


async def test_every_octokit_example_payload_is_accepted_and_processed(tmp_path, fixtures):
    from tests.harness import sandbox_stack

    ids: dict[str, int] = {}
    async with sandbox_stack(tmp_path, _fixture_world(fixtures, ids)) as run:
        sent = []
        for event, path, payload in _fixture_payloads(fixtures):
            # An App always receives its installation: that of the account of the payload's
            # repository (one per account, as on GitHub), else the first one.
            named = (payload.get("repository") or {}).get("full_name")
            installation = _installation_of(named, ids) if named else 1
            payload["installation"] = {"id": installation, "node_id": "MDIzOkludGVncmF0aW9uSW5zdGFsbGF0aW9uMQ=="}
            status, body = await _post_signed(run.url, event, payload, f"fx-{event}-{path.stem}")
            assert status == (200 if event == "ping" else 202), path
            sent.append(body["delivery"])
        await run.settle()
        for delivery in sent:
            found = await run.klaud.inbox.get(delivery)
            assert found is not None and found.status == "done", (delivery, found and found.error)
    assert len(sent) > 50


async def _post_signed(url: str, event: str, payload: dict, delivery: str) -> tuple[int, dict]:
    body = json.dumps(payload).encode()
    headers = headers_for(event, body, delivery=delivery)
    async with aiohttp.ClientSession() as session, session.post(f"{url}/webhook", data=body, headers=headers) as response:
        return response.status, await response.json()


def test_serve_without_secret_exits_2_naming_the_variable(tmp_path, monkeypatch, capsys):
    from bot.cli import main

    for name in list(os.environ):
        if name.startswith("KLAUD_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("KLAUD_DB", f"sqlite:///{tmp_path / 'x.db'}")
    assert main(["serve"]) == 2
    assert "KLAUD_WEBHOOK_SECRET" in capsys.readouterr().err


def test_invalid_setting_exits_2_naming_the_variable(tmp_path, monkeypatch, capsys):
    from bot.cli import main

    monkeypatch.setenv("KLAUD_PORT", "eighty")
    monkeypatch.setenv("KLAUD_WEBHOOK_SECRET", "s")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("klaud: KLAUD_PORT:") and "\n" not in err


def test_receive_runs_one_payload_through_the_handlers(tmp_path, monkeypatch, capsys):
    from bot.cli import main

    payload = tmp_path / "ping.json"
    payload.write_text(json.dumps({"zen": "Design for failure.", "hook_id": 9}))
    monkeypatch.setenv("KLAUD_DB", f"sqlite:///{tmp_path / 'r.db'}")
    assert main(["receive", "--event", "ping", "--payload", str(payload), "--delivery", "r-1"]) == 0
    assert json.loads(capsys.readouterr().out) == {"delivery": "r-1", "event": "ping", "status": "done"}


@pytest.mark.parametrize(
    "content, says",
    [
        (b"{nope", "body is not JSON"),
        (b"\xff\xfe{}", "body is not JSON"),  # not UTF-8: a traceback before
        (b"[" * 100_000 + b"]" * 100_000, "JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"repository": {"full_name": 12345}}', "repository.full_name must be a string"),  # crashed ordering_key
        (b'{"action": "' + b"a" * 101 + b'"}', "action must be 1-100 printable characters"),
    ],
)
def test_receive_refuses_in_one_line_what_the_webhook_refuses(tmp_path, monkeypatch, capsys, content, says):
    from bot.cli import main

    payload = tmp_path / "bad.json"
    payload.write_bytes(content)
    monkeypatch.setenv("KLAUD_DB", f"sqlite:///{tmp_path / 'r.db'}")
    assert main(["receive", "--event", "push", "--payload", str(payload)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("klaud: --payload: ") and says in error and error.count("\n") == 1


@pytest.mark.parametrize(
    "event, payload",
    [
        ("pull_request", {"action": "opened", "repository": {"full_name": "acme/bench"}, "installation": {"id": 7}}),
        ("push", {"ref": "refs/heads/main", "repository": {"full_name": "acme/bench"}, "installation": {"id": 7}}),
        ("workflow_run", {"action": "completed", "workflow_run": {"id": "x"}, "repository": {"full_name": "acme/bench"}, "installation": {"id": 7}}),
        ("issue_comment", {"action": "created", "comment": {"body": "/klaud help"}, "repository": {"full_name": "acme/bench"}, "installation": {"id": 7}}),
    ],
    ids=["pr-without-pull_request", "push-without-after", "run-with-bad-id", "comment-without-id"],
)
async def test_malformed_payload_fails_at_once_with_the_reason(tmp_path, event, payload):
    async with running_klaud(make_klaud(tmp_path)) as run:
        status, _ = await run.post(event, payload, delivery="bad-shape")
        assert status == 202
        failed = await wait_status(run, "bad-shape", "failed")
    assert failed["attempts"] == 1
    assert "ValidationError" in failed["error"]


async def test_serve_sandbox_stops_cleanly_on_sigterm(tmp_path):
    port, admin_port = free_ports(2)
    env = {**os.environ, "KLAUD_DB": f"sqlite:///{tmp_path / 'serve.db'}", "KLAUD_PORT": str(port),
           "KLAUD_ADMIN_PORT": str(admin_port),
           "KLAUD_WEBHOOK_SECRET": SECRET, "KLAUD_LOG_FORMAT": "json"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "serve", "--sandbox", cwd=ROOT, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(400):  # up to 20 s: start-up generates a key and reconciles
                try:
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as response:
                        if response.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.05)
            else:
                proc.kill()
                _, stderr = await proc.communicate()
                pytest.fail(f"not ready within 20 s (exit {proc.returncode}): {stderr.decode()[-2000:]}")
            # The bundled scenario was reconciled at start-up through the mounted sandbox.
            async with session.get(f"http://127.0.0.1:{admin_port}/api/v1/repos/acme/bench/state") as response:
                assert response.status == 200 and len((await response.json())["families"]) == 30
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), timeout=20)
    finally:
        if proc.returncode is None:
            proc.kill()
    assert proc.returncode == 0
    events = [json.loads(line)["event"] for line in stderr.decode().splitlines() if line.startswith("{")]
    assert events.index("serve.stopping") < events.index("serve.stopped")


def test_invalid_private_key_exits_2_without_printing_it(monkeypatch, capsys):
    from bot.cli import main

    monkeypatch.setenv("KLAUD_WEBHOOK_SECRET", "s")
    monkeypatch.setenv("KLAUD_APP_ID", "1")
    monkeypatch.setenv("KLAUD_PRIVATE_KEY", "not-a-key-SECRET-MATERIAL")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("klaud: KLAUD_PRIVATE_KEY:") and "SECRET-MATERIAL" not in err


async def test_prune_removes_finished_deliveries_after_their_retention(tmp_path):
    import time as time_module

    recorder = Recorder(failures=1, exc=ValueError)
    async with running_klaud(make_klaud(tmp_path, recorder)) as run:
        await run.post("pull_request", PR_PAYLOAD, delivery="will-fail")
        await run.post("pull_request", dict(PR_PAYLOAD, number=2), delivery="will-pass")
        await run.klaud.inbox.drained()
        now = time_module.time() + 1
        # Failed deliveries are kept longer than done ones.
        assert await run.klaud.inbox.prune(done_before=now, failed_before=now - 3600) == 1
        assert (await run.get_json("/api/v1/deliveries/will-pass"))[0] == 404
        assert (await run.get_json("/api/v1/deliveries/will-fail"))[1]["status"] == "failed"
        assert await run.klaud.inbox.prune(done_before=now, failed_before=now) == 1


def test_receive_prints_its_status_line_when_the_handler_fails(tmp_path, monkeypatch, capsys):
    from bot.cli import main

    # A pull_request without its pull_request: the handler's parse fails. Before, a
    # traceback and nothing on stdout; through a running server, the status line.
    payload = tmp_path / "p.json"
    payload.write_text(json.dumps({"action": "opened", "repository": {"full_name": "o/r"}, "installation": {"id": 1}}))
    monkeypatch.setenv("KLAUD_DB", f"sqlite:///{tmp_path / 'r.db'}")
    assert main(["receive", "--event", "pull_request", "--payload", str(payload), "--delivery", "d1"]) == 1
    printed = json.loads(capsys.readouterr().out)
    assert (printed["delivery"], printed["status"]) == ("d1", "failed") and "ValidationError" in printed["error"]
