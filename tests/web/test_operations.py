"""Operations (issue 13 item 2): build info, process metrics and the repository metrics others set."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import yaml

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
    assert event_label("pullrequest") == event_label("x" * 500) == OTHER
