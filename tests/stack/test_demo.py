"""`klaud demo --once`, the README's first command, end to end."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


async def test_demo_once_prints_every_family_and_the_waves_requests(tmp_path):
    # Run from a copy of the packages alone, as installed (the container's): nothing may be
    # read from the checkout around them (the sandbox once read app.yaml there, and the demo
    # failed in the image).
    site = tmp_path / "site"
    for package in ("bot", "handlers"):
        shutil.copytree(ROOT / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "demo", "--once", cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "KLAUD_DB": f"sqlite:///{tmp_path / 'unused.db'}",
             "KLAUD_LOG_FORMAT": "json"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, stderr.decode()[-2000:]
    out = stdout.decode()
    assert "Played the scenario's timeline" in out
    rows = [line for line in out.splitlines() if line.split(" ", 1)[0].isdigit()]
    assert len(rows) == 30
    for decision in ("selected", "claimed", "cooldown", "overlap", "capacity", "held", "cap"):
        assert any(f"  {decision}  " in row for row in rows), decision
    assert "GitHub requests made by the wave:" in out and "GET " not in out.split("GitHub requests made by the wave:")[1]
    # Every publication reached the sandbox (the dashboard's last one once failed against
    # it, stopped first); the warnings left are the scenario's broken artifacts.
    logged = out + stderr.decode()
    assert "check_flush_failed" not in logged and '"level":"error"' not in logged, logged[-2000:]
    # The demo used a throw-away store, not KLAUD_DB.
    assert not (tmp_path / "unused.db").exists()
