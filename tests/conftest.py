"""Shared test helpers: the real-data fixtures folder."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from bot.log import configure_logging

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def debug_logging() -> None:
    """Every test starts with debug logs on stderr (shown for failures), whatever an
    earlier test's in-process `klaud` command configured; stdout stays for what commands print."""
    configure_logging("console", logging.DEBUG)


def fixtures_root() -> Path:
    return Path(os.environ.get("KLAUD_FIXTURES", ROOT.parent / "shared" / "fixtures"))


@pytest.fixture
def fixtures() -> Path:
    """The shared real-data folder; tests that need it skip when it is absent."""
    root = fixtures_root()
    if not root.is_dir():
        pytest.skip(f"real-data fixtures not found at {root} (set KLAUD_FIXTURES)")
    return root
