"""Shared test helpers: the real-data fixtures folder."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from bot.log import configure_logging

# Logs go to stderr (pytest shows them for failing tests); stdout stays for what commands print.
configure_logging("console", logging.DEBUG)

ROOT = Path(__file__).resolve().parent.parent


def fixtures_root() -> Path:
    return Path(os.environ.get("KLAUD_FIXTURES", ROOT.parent / "shared" / "fixtures"))


@pytest.fixture
def fixtures() -> Path:
    """The shared real-data folder; tests that need it skip when it is absent."""
    root = fixtures_root()
    if not root.is_dir():
        pytest.skip(f"real-data fixtures not found at {root} (set KLAUD_FIXTURES)")
    return root
