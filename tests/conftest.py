"""Shared pytest fixtures. The loopback Proxmox test bed lives in testbed/ (the package at the top)."""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:  # plain `pytest` (not `python -m pytest`) from anywhere
    sys.path.insert(0, str(_REPO))
# The tests live in tiers (tests/README.md): unit/, cli/, local/, bed/. The shared modules
# (helpers, connkit, fuzzgen, limits) stay here, and a test may import another tier's test
# module by its name (`from test_notify import HookServer`): tests/ and each tier are on the
# path, whichever file or folder pytest was given. A test file's name is unique across tiers.
TIERS = ("unit", "cli", "local", "bed")
for _d in (_REPO / "tests", *(_REPO / "tests" / t for t in TIERS)):
    if str(_d) not in sys.path:
        sys.path.insert(1, str(_d))

from testbed import TestBed, TestBedError  # noqa: E402

# An illegal change of the supervisor's durable step (agent/base/stages.py) raises in every
# process the tests start, so it fails the test instead of being only an event.
os.environ.setdefault("GPUJOB_STRICT_STAGES", "1")
# The suite runs gpujob as users do (tests/helpers.py: the installed console script) with
# the kept connection ON, its default. Its daemons listen in a runtime dir of this session
# only, idle out soon, and are ended at the session's end (_reap_daemons): none outlives
# the suite, and none of the user's own daemons is touched. GPUJOB_NO_DAEMON=1 (the direct
# path) is what helpers.cli_direct runs; test_conn.py compares the two byte for byte.
SESSION_RUNTIME = tempfile.mkdtemp(prefix="gj-rt-", dir="/tmp")  # short: socket paths stay < 108
SESSION_IDLE = "20"
os.environ["XDG_RUNTIME_DIR"] = SESSION_RUNTIME
os.environ["GPUJOB_CONN_IDLE"] = SESSION_IDLE
os.environ.pop("GPUJOB_NO_DAEMON", None)
# A suite started with SIGINT ignored (a background job of a non-interactive shell, nohup, some
# CI runners) hands that ignore to every process it starts, and Python leaves an ignored SIGINT
# ignored: the Ctrl-C tests would send a signal no gpujob hears (seen 2026-12-04, three of them,
# a run started with `setsid nohup scripts/test &`). A handler here resets to the default on exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

if os.environ.get("GPUJOB_TEST_FAST") == "1":  # scripts/test --fast: -m "not testbed"
    def _refuse(cls, *a, **kw):
        raise TestBedError("this test starts the loopback Proxmox bed but lacks the `testbed` mark "
                           "(scripts/test --fast runs only tests that need no bed)")
    TestBed.start = classmethod(_refuse)


def suite_daemons(basetemp: str | None = None) -> list[int]:
    """Connection daemons this session started: in its runtime dir, or in a test's own
    (under the session's basetemp)."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if b"gpujob.daemon\0serve" not in f.read():
                    continue
            with open(f"/proc/{d}/environ", "rb") as f:
                env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        rt = os.fsdecode(env.get(b"XDG_RUNTIME_DIR", b""))
        if rt == SESSION_RUNTIME or (basetemp and rt.startswith(basetemp + os.sep)):
            found.append(int(d))
    return found


def reap_daemons(basetemp: str | None = None) -> None:
    """End every daemon of the session: ask each socket to stop, then SIGKILL (each is a
    session leader: its process group) what is left; remove the session's runtime dir."""
    from gpujob.conn.client import stop
    where = os.path.join(SESSION_RUNTIME, "gpujob")
    for name in (os.listdir(where) if os.path.isdir(where) else []):
        if name.endswith(".sock"):
            stop(os.path.join(where, name))
    deadline = time.monotonic() + 5
    while suite_daemons(basetemp) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in suite_daemons(basetemp):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(SESSION_RUNTIME, ignore_errors=True)


atexit.register(reap_daemons)  # also when the session ends without its teardown


@pytest.fixture(scope="session", autouse=True)
def _reap_daemons(tmp_path_factory):
    yield
    reap_daemons(str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def index_urls(tmp_path_factory):
    """The demo's two wheel builds (fast, slow) as file:// indexes, one set per module."""
    from gpujob.ops.wheelhouse import build_indexes
    return {b: p.as_uri() for b, p in build_indexes(tmp_path_factory.mktemp("wheelhouse")).items()}


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    """The same indexes served over HTTP on loopback (a container reaches them there)."""
    from gpujob.ops.wheelhouse import build_indexes, serve
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
    even when the test failed half-way (they would otherwise run detached for hours);
    the kept-connection daemons of that test's environment (its HOME or state dir under
    tmp_path) are asked to end (SIGTERM: they close their connections) rather than idle on."""
    yield
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
        sig = signal.SIGKILL if mine in cmd or cwd.startswith(mine) else None
        if sig is None and "gpujob.daemon\0serve" in cmd:
            try:
                with open(f"/proc/{pid}/environ", "rb") as f:
                    env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
            except OSError:
                continue
            if any(os.fsdecode(env.get(k, b"")).startswith(mine + os.sep)
                   for k in (b"HOME", b"XDG_STATE_HOME", b"XDG_RUNTIME_DIR")):
                sig = signal.SIGTERM
        if sig is not None:
            try:
                os.kill(int(pid), sig)
            except ProcessLookupError:
                pass


BED_FIXTURES = {"testbed", "testbed_two_hosts"}


def pytest_collection_modifyitems(config, items):
    """Every test whose fixtures start the bed carries the `testbed` mark (what
    scripts/test --fast leaves out); one that starts it otherwise (a fixture asking for
    it by name) is caught by the --fast run itself (TestBed.start refuses there)."""
    bare = [i.nodeid for i in items
            if BED_FIXTURES & set(getattr(i, "fixturenames", ())) and i.get_closest_marker("testbed") is None]
    if bare:
        raise pytest.UsageError("tests that use the loopback Proxmox bed without the `testbed` mark: "
                                + ", ".join(bare))
