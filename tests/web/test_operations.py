"""Operations (issue 13 item 2): build info, process metrics and the repository metrics others set."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from bot.runtime import generate_app_key
from bot.web.events import GITHUB_EVENTS, KLAUD_EVENTS, OTHER, event_label
from tests.harness import running_klaud
from tests.web.test_ingest import make_klaud

ROOT = Path(__file__).resolve().parents[2]


async def test_metrics_carry_build_info_process_and_platform_metrics_and_the_repository_metrics(tmp_path):
    async with running_klaud(make_klaud(tmp_path)) as run, run.session.get(f"{run.admin_url}/metrics") as response:
        text = await response.text()
    assert f'klaud_build_info{{version="{metadata.version("klaud")}"}} 1.0' in text
    for sample in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds", "python_info{"):
        assert f"\n{sample}" in text, sample
    for metric in ("klaud_last_wave_timestamp_seconds", "klaud_last_wave_candidates", "klaud_dispatch_paused",
                   "klaud_family_image_age_days"):
        assert f"# HELP {metric} " in text, metric


def test_every_event_the_app_subscribes_to_is_known():
    manifest = yaml.safe_load((ROOT / "app.yaml").read_text())
    assert set(manifest["default_events"]) <= KLAUD_EVENTS <= GITHUB_EVENTS


def test_only_known_event_names_become_label_values():
    assert event_label("pull_request") == "pull_request"
    assert event_label("star") == "star"  # documented by GitHub, not handled
    assert event_label("klaud_reconcile") == "klaud_reconcile"  # Klaud's own request to a replica
    assert event_label("pullrequest") == event_label("x" * 500) == OTHER


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_start_up_stops_klaud_at_once_and_cleanly(tmp_path, sig):
    # Start-up reconciles every installation; against a GitHub that accepts connections
    # and never answers it lasts minutes. SIGTERM was ignored as a container's PID 1, and
    # otherwise killed the process; SIGINT printed a traceback.
    silent = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    threading.Thread(target=lambda: [held.append(silent.accept()[0]) for _ in iter(int, 1)], daemon=True).start()
    key = tmp_path / "key.pem"
    key.write_text(generate_app_key()[0])
    env = dict(os.environ, KLAUD_WEBHOOK_SECRET="s", KLAUD_APP_ID="1", KLAUD_PRIVATE_KEY_FILE=str(key),
               KLAUD_GITHUB_URL=f"http://127.0.0.1:{silent.getsockname()[1]}", KLAUD_PORT="0", KLAUD_ADMIN_PORT="0",
               KLAUD_DB=f"sqlite:///{tmp_path / 'k.db'}", KLAUD_LOG_FORMAT="json")
    server = subprocess.Popen([sys.executable, "-m", "bot", "serve"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(300):  # until the start-up reconcile is asking the silent GitHub
            if held:
                break
            time.sleep(0.05)
        assert held, "start-up never reached GitHub"
        server.send_signal(sig)
        out, err = server.communicate(timeout=30)
    finally:
        server.kill()
        silent.close()
    assert server.returncode == 0, err[-2000:]
    assert '"serve.stopped"' in out + err and "Traceback" not in out + err


def test_serve_sandbox_runs_without_a_webhook_secret_as_the_readme_shows(tmp_path):
    # It exited 2 asking for KLAUD_WEBHOOK_SECRET; the sandbox signs its own webhooks.
    env = {k: v for k, v in os.environ.items() if not k.startswith("KLAUD_")}
    env |= {"KLAUD_PORT": "0", "KLAUD_ADMIN_PORT": "0", "KLAUD_DB": f"sqlite:///{tmp_path / 'k.db'}", "KLAUD_LOG_FORMAT": "json"}
    server = subprocess.Popen([sys.executable, "-m", "bot", "serve", "--sandbox"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    try:
        assert server.stdout is not None
        seen: list[str] = []
        deadline = time.monotonic() + 30
        # Until it listens, exits, or 30 s pass (a server that never listens must not hang the suite).
        while time.monotonic() < deadline:
            if not select.select([server.stdout], [], [], 1)[0]:
                continue
            line = server.stdout.readline()
            if not line:
                break
            seen.append(line)
            if '"serve.listening"' in line:
                break
        assert any('"serve.listening"' in line for line in seen), "".join(seen)[-2000:]
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=30) == 0
    finally:
        server.kill()


async def test_the_last_wave_and_a_pause_show_on_metrics_after_a_restart(tmp_path):
    # What this catches (a review): the last wave's time and the pause gauge were set only
    # by a wave and by an event, so after every restart (or a replica's takeover) an alert
    # on them went blind until the next wave, up to two hours later.
    from typing import get_args

    from bot.core.domain import DecisionKind
    from bot.metrics import REGISTRY, forget_repo
    from tests import scenarios as sc
    from tests.harness import sandbox_stack

    async with sandbox_stack(tmp_path, sc.scenario()) as run:
        wave = await run.klaud.waves.run(sc.REPO, trigger="test")
        await run.settle()
        forget_repo(sc.REPO, get_args(DecisionKind))  # what a new process starts with
        assert REGISTRY.get_sample_value("klaud_last_wave_timestamp_seconds", {"repo": sc.REPO}) is None
        await run.klaud.live.load()
    labels = {"repo": sc.REPO}
    assert REGISTRY.get_sample_value("klaud_last_wave_timestamp_seconds", labels) == wave.at.timestamp()
    assert REGISTRY.get_sample_value("klaud_dispatch_paused", labels) == 0
    assert REGISTRY.get_sample_value("klaud_last_wave_candidates", labels | {"decision": "selected"}) == len(wave.selected)
