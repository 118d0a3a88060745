"""``gpujob ps`` asks every host at once (gpujob/cli/fanout.py): a host that answers
slowly or not at all holds none of the others beyond ``--timeout``, is reported in one
line, and the rows keep their order."""

from __future__ import annotations

import socket
import threading
import time

import yaml

from gpujob.cli import fanout
from gpujob.state import State
from helpers import cli, local_env


def test_gather_keeps_the_order_and_gives_up_on_the_slow_one_at_the_deadline():
    gate = threading.Event()

    def fetch(k):
        if k == "slow":
            gate.wait(30)
        if k == "bad":
            raise ValueError("broken")
        time.sleep(0.05)
        return k.upper()

    t0 = time.monotonic()
    got = fanout.gather(["a", "slow", "b", "bad", "c"], fetch, workers=64, deadline=0.5)
    took = time.monotonic() - t0
    gate.set()
    assert list(got) == ["a", "slow", "b", "bad", "c"]
    assert [got[k] for k in ("a", "b", "c")] == ["A", "B", "C"]
    assert isinstance(got["slow"], fanout.NoAnswer) and "0.5s" in str(got["slow"])
    assert isinstance(got["bad"], ValueError)
    assert 0.45 <= took < 1.5  # the deadline, not the slow one's 30 s


def test_gather_runs_the_hosts_at_once():
    t0 = time.monotonic()
    got = fanout.gather(list(range(20)), lambda k: time.sleep(0.2) or k, workers=64, deadline=10)
    assert list(got.values()) == list(range(20))
    assert time.monotonic() - t0 < 1.5  # 20 × 0.2 s one after another would be 4 s


def test_ps_with_a_silent_and_a_refusing_host_shows_the_rest_and_one_line_each(tmp_path):
    silent = socket.socket()  # accepts, never sends an SSH banner
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    closed = socket.socket()  # a port nobody listens on: refused at once
    closed.bind(("127.0.0.1", 0))
    refused_port = closed.getsockname()[1]
    closed.close()
    env = local_env(tmp_path)
    inv = yaml.safe_load(open(env["GPUJOB_HOSTS"]))
    for name, port in (("quiet", silent.getsockname()[1]), ("gone", refused_port)):
        inv["hosts"][name] = {"address": "127.0.0.1", "port": port, "user": "root", "connect_timeout": 60,
                              "known_hosts": str(tmp_path / "known_hosts"), "containers": {"ct200": {"vmid": 200}}}
    open(env["GPUJOB_HOSTS"], "w").write(yaml.safe_dump(inv))
    db = State(tmp_path / "state" / "gpujob" / "state.db")
    for job, target in (("j-local", "lab/box"), ("j-quiet", "quiet/ct200"), ("j-gone", "gone/ct200"),
                        ("j-local2", "lab/box")):
        db.reserve(job, "t", target, "", "", "fast")
    db.close()
    try:
        t0 = time.monotonic()
        p = cli(["ps", "--timeout", "2"], env, daemon=False, timeout=60)
        took = time.monotonic() - t0
    finally:
        silent.close()
    out, errs = p.stdout.decode(), p.stderr.decode()
    assert p.returncode == 0, errs
    assert took < 20  # held by the silent host for --timeout only, not its 60 s connect_timeout
    lines = [ln for ln in errs.splitlines() if ln.strip()]
    quiet = [ln for ln in lines if "quiet/ct200" in ln]
    gone = [ln for ln in lines if "gone/ct200" in ln]
    assert len(quiet) == 1 and "no answer within 2s" in quiet[0] and "1 job shown as unreachable" in quiet[0]
    assert len(gone) == 1 and "unreachable" in gone[0]
    assert "Traceback" not in errs
    rows = [ln.split()[0] for ln in out.splitlines() if ln.split() and ln.split()[0].startswith("j-")]
    assert rows == ["j-local2", "j-gone", "j-quiet", "j-local"]  # newest first, as the index has them
    local = [ln for ln in out.splitlines() if ln.split() and ln.split()[0] in ("j-local", "j-local2")]
    assert all("unreachable" not in ln for ln in local)  # the local target answered
