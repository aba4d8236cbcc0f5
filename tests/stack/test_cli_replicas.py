"""`klaud receive` and `klaud reconcile` never write behind serving replicas' backs
(DESIGN §3.1): a delivery, or a request to reconcile, goes through the inbox they share; with
no replica serving, the CLI works on the store directly."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import asyncpg
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from bot import cli
from bot.cli import main
from bot.store.deliveries import Delivery
from tests import scenarios as sc
from tests.harness import sandbox_stack
from tests.stack.test_replicas_e2e import Replica, start_replica


@pytest.fixture
def klaud_env(store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (tmp_path / "app.pem").write_bytes(key)
    for name, value in {"KLAUD_DB": store_url, "KLAUD_APP_ID": "1", "KLAUD_PRIVATE_KEY_FILE": str(tmp_path / "app.pem"),
                        "KLAUD_LOG_FORMAT": "json", "KLAUD_LOG_LEVEL": "warning"}.items():
        monkeypatch.setenv(name, value)
    return store_url


def payload_file(tmp_path: Path, document: dict) -> str:
    path = tmp_path / f"payload-{len(list(tmp_path.iterdir()))}.json"
    path.write_text(json.dumps(document))
    return str(path)


async def seen_by(store_url: str, delivery: str) -> list[str]:
    """Who processed `delivery` (the replica's recording handler leaves one record per run)."""
    conn = await asyncpg.connect(store_url)
    try:
        rows = await conn.fetch("SELECT data FROM records WHERE kind = 'seen' AND key LIKE $1", f"{delivery}/%")
        return [json.loads(row["data"])["by"] for row in rows]
    finally:
        await conn.close()


async def stored_delivery(store_url: str, delivery: str) -> str | None:
    conn = await asyncpg.connect(store_url)
    try:
        status: str | None = await conn.fetchval("SELECT status FROM deliveries WHERE id = $1", delivery)
        return status
    finally:
        await conn.close()


@pytest.fixture
def replica(klaud_env: str, tmp_path: Path) -> Iterator[Replica]:
    started = start_replica(klaud_env, tmp_path / "replica")
    yield started
    started.process.kill()
    started.process.wait()


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    status = main(args)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


async def test_receive_while_a_replica_serves_hands_the_delivery_to_it_through_the_shared_inbox(
    klaud_env, replica, tmp_path, capsys
):
    pull = {"action": "synchronize", "number": 7, "repository": {"full_name": "o/cli"}, "installation": {"id": 1}}
    args = ["receive", "--event", "pull_request", "--payload", payload_file(tmp_path, pull), "--delivery", "cli-1"]
    status, out, _ = await _in_thread(run, args, capsys)
    assert status == 0
    assert json.loads(out) == {"delivery": "cli-1", "event": "pull_request", "status": "done"}
    assert await seen_by(klaud_env, "cli-1") == [replica.owner]  # the replica processed it, once

    status, out, err = await _in_thread(run, args, capsys)
    assert (status, out) == (1, "")
    assert err.strip() == "klaud: --delivery: cli-1 is already stored (a delivery id is processed once)"
    assert await seen_by(klaud_env, "cli-1") == [replica.owner]


async def test_reconcile_while_a_replica_serves_is_run_by_the_repositorys_owner(
    klaud_env, tmp_path, capsys, monkeypatch
):
    async with sandbox_stack(tmp_path, sc.scenario(), env={"KLAUD_DB": klaud_env}) as serving:
        monkeypatch.setenv("KLAUD_GITHUB_URL", serving.klaud.settings.github_url)
        serving.sandbox.set_faults({"rules": [{"webhook": "pull_request", "count": 1}]})  # its webhook lost
        await serving.act({"action": "open_pull", "repo": "acme/bench", "pull": sc.image_bump(12)})
        assert serving.klaud.live.repo("acme/bench").overlap.get(12) is None

        status, out, _ = await _in_thread(run, ["reconcile", "--repo", "acme/bench"], capsys)

        assert status == 0
        line = json.loads(out)
        assert (line["repo"], line["status"]) == ("acme/bench", "done") and line["delivery"].startswith("klaud-")
        assert serving.klaud.live.repo("acme/bench").overlap.get(12) is not None  # reconciled by the replica


async def test_reconcile_while_a_replica_serves_says_when_github_failed_the_owners_reconcile(
    klaud_env, tmp_path, capsys, monkeypatch
):
    async with sandbox_stack(tmp_path, sc.scenario(), env={"KLAUD_DB": klaud_env}) as serving:
        monkeypatch.setenv("KLAUD_GITHUB_URL", serving.klaud.settings.github_url)
        # The owner cannot list the open pull requests; the CLI's listing of repositories works.
        serving.sandbox.set_faults({"rules": [{"method": "GET", "route": "/pulls$", "status": 403}]})

        status, out, _ = await _in_thread(run, ["reconcile", "--repo", "acme/bench"], capsys)

        line = json.loads(out)
        assert (status, line["status"]) == (1, "failed") and "403" in line["error"]
        assert "acme/bench" in serving.klaud.reconciler.failures  # the owner tries again with backoff


async def test_with_no_replica_serving_receive_works_on_the_store_directly(klaud_env, replica, tmp_path, capsys):
    replica.process.send_signal(signal.SIGTERM)  # a clean stop releases its leases
    assert replica.process.wait(30) == 0
    args = ["receive", "--event", "ping", "--payload", payload_file(tmp_path, {"zen": "hi"}), "--delivery", "cli-2"]
    status, out, _ = await _in_thread(run, args, capsys)
    assert (status, json.loads(out)["status"]) == (0, "done")
    assert await stored_delivery(klaud_env, "cli-2") is None  # handled here, not queued for anyone


async def _in_thread(function, *args):  # type: ignore[no-untyped-def]
    # `klaud` runs its own event loop (asyncio.run), which cannot start inside the test's.
    return await asyncio.to_thread(function, *args)


async def test_reconcile_waits_for_every_repositorys_owner_at_once(capsys, monkeypatch):
    # Replicas stopped without releasing their leases: each request waits the whole wait.
    monkeypatch.setattr(cli, "RECEIVE_WAIT_SECONDS", 0.3)
    asked: list[str] = []

    class NoOwnerAnswers:
        async def put(self, delivery: Delivery) -> bool:
            return True

        async def get(self, delivery_id: str) -> Delivery | None:
            asked.append(delivery_id)
            return None  # stored, never finished

    klaud = SimpleNamespace(inbox=SimpleNamespace(store=NoOwnerAnswers()))
    status = await cli._reconciled_by_replicas(klaud, [("o/a", 1), ("o/b", 1)])  # type: ignore[arg-type]

    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert status == 1 and [(line["repo"], line["status"]) for line in lines] == [("o/a", "unfinished"), ("o/b", "unfinished")]
    first, second = (line["delivery"] for line in lines)
    assert asked[:4] == [first, second, first, second]  # one wait for both, not one after the other
