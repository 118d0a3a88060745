"""The contract every target kind keeps, written once and run on each registered
kind: ``local`` on a temp home, ``ssh`` on the loopback Proxmox test bed (real sshd,
fake pct, a real LXC container). A kind added to gpujob.kinds.REGISTRY without a
way to set it up here fails this suite (it is never skipped)."""

from __future__ import annotations

import json

import pytest

from gpujob import kinds
from gpujob.agent.base.wire import ProbeAnswer, StatusAnswer
from gpujob.ops import doctor
from gpujob.inventory.hosts import load_inventory
from gpujob.ops.target import Targets


def _local(tmp_path, request):
    hosts = tmp_path / "hosts.yaml"
    hosts.write_text(f"hosts:\n  here:\n    kind: local\n    containers:\n"
                     f"      box: {{root: {json.dumps(str(tmp_path / 'home'))}}}\n")
    return hosts, "here/box"


def _ssh(tmp_path, request):
    bed = request.getfixturevalue("testbed")
    return bed.write_hosts_yaml(tmp_path / "hosts.yaml"), f"tb/ct{bed.vmid}"


def _cut_ssh(request) -> int:
    """The link dies the way a network drop kills it: every sshd session SIGKILLed."""
    return request.getfixturevalue("testbed").kill_ssh_sessions()


SETUPS = {"local": _local, "ssh": _ssh}
#: how the link below a kind's container dies (None: there is none; local runs here)
CUTS = {"local": None, "ssh": _cut_ssh}


#: kinds whose setup starts the loopback Proxmox bed: their cases carry the `testbed` mark
#: (scripts/test --fast leaves them out)
ON_THE_BED = {"ssh"}


@pytest.fixture(params=[pytest.param(k, marks=[pytest.mark.testbed] if k in ON_THE_BED else [])
                        for k in kinds.NAMES])
def target(request, tmp_path):
    setup = SETUPS.get(request.param)
    if setup is None:
        pytest.fail(f"kind {request.param!r} is registered but has no setup in test_kind_contract.py")
    hosts, name = setup(tmp_path, request)
    targets = Targets(load_inventory(hosts))
    try:
        t = targets.open(name)
        assert t.kind == request.param and t.driver is kinds.get(request.param)
        yield t
    finally:
        targets.close()


def test_run_is_a_value_with_exit_code_and_output(target):
    r = target.run(["python3", "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                   timeout=60)
    assert (r.exit_code, r.stdout, r.stderr) == (3, b"out\n", b"err\n")
    assert target.run(["python3", "-c", "import time; time.sleep(30)"], timeout=0.5).timed_out


def test_open_stream_is_a_raw_byte_stream(target):
    stream = target.transport.open_stream(
        ["python3", "-c", "import sys\nfor l in sys.stdin: sys.stdout.write(l.upper()); sys.stdout.flush()"])
    try:
        stream.send(b"hello\n")
        got = b""
        while not got.endswith(b"\n"):
            chunk = stream.recv(100)
            assert chunk, f"stream ended early: {stream.stderr()!r}"
            got += chunk
        assert got == b"HELLO\n"
    finally:
        stream.close()


def test_status_says_the_container_takes_commands(target):
    assert target.driver.status(target) in kinds.READY


def test_home_is_absolute_and_the_agent_lands_there(target):
    assert target.home.startswith("/") and not target.home.endswith("/")
    assert target.agent_path.startswith(target.home + "/bin/")
    out = target.ask(StatusAnswer, "status")  # ships the agent on first use
    assert isinstance(out.jobs, list)
    assert target.run(["test", "-f", target.agent_path], timeout=30).exit_code == 0


def test_agent_round_trip(target):
    probe = target.ask(ProbeAnswer, "probe")
    assert probe.python and probe.system == "Linux"
    r = target.agent("tail", "no-such-job")  # an agent refusal comes back as one JSON line
    assert r.exit_code != 0 and "error" in json.loads(r.stdout.decode().splitlines()[-1])


def test_reconnect_then_run(target):
    assert target.run(["true"], timeout=30).ok
    before = target.host_transport.client() if target.host_transport is not None and \
        hasattr(target.host_transport, "client") else None
    target.driver.reconnect(target)
    assert target.run(["true"], timeout=30).ok
    if before is not None:  # a real new connection, not the old one kept
        assert target.host_transport.client() is not before


def test_doctor_facts_of_the_layers_below_judge_ok(target):
    facts = doctor.gather(target)
    assert "probe" in facts, facts
    checks = doctor.judge(facts, expected_gpus=None)
    python = next(i for i, c in enumerate(checks) if c.name == "python3")
    assert all(c.status == "ok" for c in checks[:python + 1]), checks


#: what each kind's plan says it does before the first container command, and whether it
#: may install a boot hook (a kind added without an entry here fails the test)
PLANNED = {"local": ([], False), "ssh": ([("connect", "laptop"), ("channel", "host")], True)}


def test_plan_steps_and_boot_hooks_are_declared(target):
    steps = target.driver.plan_connect(target)
    assert target.kind in PLANNED, f"kind {target.kind!r} has no PLANNED entry in test_kind_contract.py"
    want_steps, want_hooks = PLANNED[target.kind]
    assert [(s.kind, s.where) for s in steps] == want_steps
    assert target.driver.boot_hooks is want_hooks
    channel = [s for s in steps if s.kind == "channel"]
    if channel:  # the plan shows the very argv that opens the exec channel (the server's source elided)
        real = target.transport.mux_argv()
        assert channel[0].argv[:-1] == real[:-1] and real[-1].startswith('"""The far end of a multiplexed')


def test_reconnect_after_the_link_died(target, request):
    assert target.ask(StatusAnswer, "status").jobs is not None  # the link and its exec channel are open
    cut = CUTS[target.kind]
    if cut is not None:
        assert cut(request) >= 1
    target.driver.reconnect(target)
    r = target.run(["python3", "-c", "print('back')"], timeout=60)
    assert (r.exit_code, r.stdout) == (0, b"back\n"), r.stderr
    assert isinstance(target.ask(StatusAnswer, "status").jobs, list)
