"""Shared pytest fixtures. The loopback Proxmox test bed lives in tests/testbed.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:  # plain `pytest` (not `python -m pytest`) from anywhere
    sys.path.insert(0, str(_REPO))

from tests.testbed import TestBed  # noqa: E402

# The kept connection (gpujob/conn) stays off in tests that run the installed `gpujob`:
# a daemon started there would outlive the test in the user's runtime dir. Its own tests
# (test_conn.py) turn it on, each with a private runtime dir, and end what they start.
os.environ.setdefault("GPUJOB_NO_DAEMON", "1")
# An illegal change of the supervisor's durable step (agent/stages.py) raises in every
# process the tests start, so it fails the test instead of being only an event.
os.environ.setdefault("GPUJOB_STRICT_STAGES", "1")


@pytest.fixture(scope="module")
def index_urls(tmp_path_factory):
    """The demo's two wheel builds (fast, slow) as file:// indexes, one set per module."""
    from gpujob.wheelhouse import build_indexes
    return {b: p.as_uri() for b, p in build_indexes(tmp_path_factory.mktemp("wheelhouse")).items()}


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """The same indexes served over HTTP on loopback (a container reaches them there)."""
    from gpujob.wheelhouse import build_indexes, serve
    root = tmp_path_factory.mktemp("index")
    build_indexes(root)
    server, url = serve(root)
    yield {"fast": f"{url}/fast/simple", "slow": f"{url}/slow/simple"}
    server.shutdown()


@pytest.fixture(scope="session")
def testbed():
    """One loopback Proxmox bed (sshd + fake pct + LXC 200 running, 201 stopped) per
    session. If it cannot start, every test using it ERRORS with the reason (no skip)."""
    bed = TestBed.start()
    try:
        yield bed
    finally:
        bed.stop()


@pytest.fixture(scope="module")
def testbed_two_hosts():
    """A bed of its own with a second running container (202) behind a second sshd:
    only the modules that ask for it pay its start-up, and the session's `testbed`
    (one host, 200 running, 201 stopped) stays as every other test expects it."""
    bed = TestBed.start()
    try:
        bed.start_second_host()
        yield bed
    finally:
        bed.stop()


@pytest.fixture(autouse=True)
def _reap_job_processes(tmp_path):
    """After each test: no supervisor, trainer or agent of that test's jobs lives on,
    even when the test failed half-way (they would otherwise run detached for hours)."""
    yield
    import os
    import signal
    mine = str(tmp_path)
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().decode("utf-8", "replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if mine in cmd or cwd.startswith(mine):
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
