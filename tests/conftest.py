"""Shared pytest fixtures. The loopback Proxmox test bed lives in tests/testbed.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:  # plain `pytest` (not `python -m pytest`) from anywhere
    sys.path.insert(0, str(_REPO))

from tests.testbed import TestBed  # noqa: E402


@pytest.fixture(scope="session")
def testbed():
    """One loopback Proxmox bed (sshd + fake pct + LXC 200 running, 201 stopped) per
    session. If it cannot start, every test using it ERRORS with the reason (no skip)."""
    bed = TestBed.start()
    try:
        yield bed
    finally:
        bed.stop()
