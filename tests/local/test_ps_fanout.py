"""``gpujob ps`` asks every host at once (gpujob/ops/fanout.py): a host that answers
slowly or not at all holds none of the others beyond ``--timeout``, is reported in one
line, and the rows keep their order."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import yaml

from gpujob.ops import fanout
from gpujob.errors import GpujobError
from gpujob.ops.state import State
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
                              "known_hosts": str(tmp_path / "known_hosts"),
                              "containers": {"ct200": {"vmid": 200}}}
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


class _Sent:
    """A question sent without waiting: answered at ``at`` (monotonic), or never."""

    def __init__(self, key, at):
        self.key, self.at, self.cancelled = key, at, False

    def cancel(self):
        self.cancelled = True


def test_questions_sent_at_once_from_one_thread_are_awaited_together():
    """Targets whose question can be sent at once (an open exec channel) are all sent
    before any answer is awaited: four that take 0.3 s each take 0.3 s, not 1.2 s, with no
    thread started for them; the others (None from begin) are fetched on threads, as ever."""
    import threading
    t0 = time.monotonic()
    sent: dict = {}
    threads_before = threading.active_count()
    peak = []

    def begin(key):
        if key == "cold":
            return None
        sent[key] = _Sent(key, time.monotonic() + (100 if key == "mute" else 0.3))
        return sent[key]

    def end(key, h, until):
        peak.append(threading.active_count())
        if h.at > until:
            time.sleep(max(0.0, until - time.monotonic()))
            raise TimeoutError()
        time.sleep(max(0.0, h.at - time.monotonic()))
        if key == "bad":
            raise GpujobError("refused")
        if key == "unshipped":  # its agent is not there yet: asked the slow way, on a thread
            return fanout.FETCH
        return f"answer {key}"

    got = fanout.gather(["a", "b", "cold", "c", "bad", "unshipped", "mute"], lambda k: f"fetched {k}",
                        workers=64, deadline=1.0, begin=begin, end=end)
    took = time.monotonic() - t0
    assert list(got) == ["a", "b", "cold", "c", "bad", "unshipped", "mute"]
    assert got["a"] == "answer a" and got["c"] == "answer c" and got["cold"] == "fetched cold"
    assert got["unshipped"] == "fetched unshipped"
    assert isinstance(got["bad"], GpujobError) and isinstance(got["mute"], fanout.NoAnswer)
    assert 0.9 <= took < 1.6, took  # the mute one's deadline, the others within it
    assert max(peak) <= threads_before + 2  # a thread each for the cold and the unshipped key


def test_ctrl_c_while_awaiting_ends_the_questions_not_awaited_yet():
    sent = {k: _Sent(k, 0) for k in "abc"}

    def end(key, h, until):
        if key == "a":
            raise KeyboardInterrupt
        return key

    with pytest.raises(KeyboardInterrupt):
        fanout.gather(list("abc"), lambda k: k, workers=4, deadline=5, begin=sent.get, end=end)
    assert [sent[k].cancelled for k in "abc"] == [False, True, True]
