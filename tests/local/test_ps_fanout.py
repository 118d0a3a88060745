"""``gpujob ps`` asks every host at once (gpujob/ops/fanout.py): a host that answers
slowly or not at all holds none of the others beyond ``--timeout``, is reported in one
line, and the rows keep their order."""

from __future__ import annotations

import socket
import threading

import pytest
import yaml

from gpujob.ops import fanout
from gpujob.errors import GpujobError
from gpujob.ops.state import State
from helpers import HANG, cli, local_env


def test_gather_keeps_the_order_and_gives_up_on_the_slow_one_at_the_deadline():
    gate = threading.Event()
    slow_done = threading.Event()

    def fetch(k):
        if k == "slow":
            gate.wait(HANG)  # held until the test lets it go (or, were it awaited, for HANG)
            slow_done.set()
            return "SLOW"
        if k == "bad":
            raise ValueError("broken")
        return k.upper()

    got = fanout.gather(["a", "slow", "b", "bad", "c"], fetch, workers=64, deadline=2)
    held = not slow_done.is_set()  # gather returned while the slow one was still at work
    gate.set()
    assert list(got) == ["a", "slow", "b", "bad", "c"]
    assert [got[k] for k in ("a", "b", "c")] == ["A", "B", "C"]
    assert isinstance(got["slow"], fanout.NoAnswer) and "within 2s" in str(got["slow"])
    assert isinstance(got["bad"], ValueError)
    assert held  # the deadline ended the wait, not the slow one's answer


def test_gather_runs_the_hosts_at_once():
    """Twenty fetches that each wait for all twenty to be under way: asked one after
    another, the first would wait alone until the barrier broke (HANG) and every one fail."""
    together = threading.Barrier(20, timeout=HANG)

    def fetch(k):
        together.wait()
        return k
    got = fanout.gather(list(range(20)), fetch, workers=64, deadline=2 * HANG)
    assert list(got.values()) == list(range(20))


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
        inv["hosts"][name] = {"address": "127.0.0.1", "port": port, "user": "root", "connect_timeout": 3600,
                              "known_hosts": str(tmp_path / "known_hosts"),
                              "containers": {"ct200": {"vmid": 200}}}
    open(env["GPUJOB_HOSTS"], "w").write(yaml.safe_dump(inv))
    db = State(tmp_path / "state" / "gpujob" / "state.db")
    for job, target in (("j-local", "lab/box"), ("j-quiet", "quiet/ct200"), ("j-gone", "gone/ct200"),
                        ("j-local2", "lab/box")):
        db.reserve(job, "t", target, "", "", "fast")
    db.close()
    try:  # held by the silent host for --timeout only: its 3600 s connect_timeout would be "hung"
        p = cli(["ps", "--timeout", "5"], env, daemon=False, timeout=300)
    finally:
        silent.close()
    out, errs = p.stdout.decode(), p.stderr.decode()
    assert p.returncode == 0, errs
    lines = [ln for ln in errs.splitlines() if ln.strip()]
    quiet = [ln for ln in lines if "quiet/ct200" in ln]
    gone = [ln for ln in lines if "gone/ct200" in ln]
    assert len(quiet) == 1 and "no answer within 5s" in quiet[0] and "1 job shown as unreachable" in quiet[0]
    assert len(gone) == 1 and "unreachable" in gone[0]
    assert "Traceback" not in errs
    rows = [ln.split()[0] for ln in out.splitlines() if ln.split() and ln.split()[0].startswith("j-")]
    assert rows == ["j-local2", "j-gone", "j-quiet", "j-local"]  # newest first, as the index has them
    local = [ln for ln in out.splitlines() if ln.split() and ln.split()[0] in ("j-local", "j-local2")]
    assert all("unreachable" not in ln for ln in local)  # the local target answered


class _Sent:
    """A question sent without waiting; ``at``: the deadline its answer was awaited until."""

    def __init__(self, key, at):
        self.key, self.at, self.cancelled = key, at, False

    def cancel(self):
        self.cancelled = True


def test_questions_sent_at_once_from_one_thread_are_awaited_together():
    """Targets whose question can be sent at once (an open exec channel) are all sent
    before any answer is awaited, each awaited until the one common deadline, with no
    thread started for them; the others (None from begin) are fetched on threads, as ever."""
    sent: dict = {}
    threads_before = threading.active_count()
    peak = []
    calls: list = []  # ("begin" | "end" | "fetch", key), in order

    def begin(key):
        calls.append(("begin", key))
        if key == "cold":
            return None
        sent[key] = _Sent(key, None)
        return sent[key]

    def end(key, h, until):
        calls.append(("end", key))
        peak.append(threading.active_count())
        h.at = until
        if key == "mute":  # (an end past its deadline raises TimeoutError)
            raise TimeoutError()
        if key == "bad":
            raise GpujobError("refused")
        if key == "unshipped":  # its agent is not there yet: asked the slow way, on a thread
            return fanout.FETCH
        return f"answer {key}"

    def fetch(key):
        calls.append(("fetch", key))
        return f"fetched {key}"

    keys = ["a", "b", "cold", "c", "bad", "unshipped", "mute"]
    got = fanout.gather(keys, fetch, workers=64, deadline=HANG, begin=begin, end=end)
    assert list(got) == keys
    assert got["a"] == "answer a" and got["c"] == "answer c" and got["cold"] == "fetched cold"
    assert got["unshipped"] == "fetched unshipped"
    assert isinstance(got["bad"], GpujobError) and isinstance(got["mute"], fanout.NoAnswer)
    assert sent["mute"].cancelled and not sent["a"].cancelled  # given up on: ended on its channel
    # every question sent before the first answer is awaited
    assert [c for c in calls if c[0] == "begin"] == [("begin", k) for k in keys]
    assert calls.index(("end", "a")) > max(calls.index(("begin", k)) for k in keys)
    assert len({h.at for h in sent.values()}) == 1  # awaited until one common deadline
    assert sorted(k for op, k in calls if op == "fetch") == ["cold", "unshipped"]
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
