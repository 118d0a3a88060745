"""The watch loop's wait on a quiet log (agent/base/logwait.py): it sleeps until the log
grows past what was read, the command's pidfd is readable or the timeout passes, and
falls back to the timed poll without inotify. These check what woke the wait (the
descriptor its select returned, or the timeout it slept to), never how long it took: the
module's select and sleep are recorded (bench/supervisor_cpu.py measures the wakeups)."""

from __future__ import annotations

import os
import select
import threading
import time
import types

import pytest

from gpujob.agent.base import logwait
from gpujob.agent.base.logwait import LogWait

HANG = 60.0  # the timeout of a wait something should wake: reached only when nothing did


class Waits:
    """logwait's select and sleep, recorded: ("select", timeout, the readable fds) and
    ("sleep", seconds). ``during`` runs just as the next select begins (after the size
    check: what a write at that moment does); ``now`` is the clock after_read reads."""

    def __init__(self, monkeypatch):
        self.calls: list = []
        self.during = None
        self.now = None
        monkeypatch.setattr(logwait, "select", types.SimpleNamespace(select=self._select))
        monkeypatch.setattr(logwait, "time", types.SimpleNamespace(
            monotonic=lambda: time.monotonic() if self.now is None else self.now, sleep=self._sleep))

    def _select(self, r, w, x, timeout):
        if self.during is not None:
            self.during, during = None, self.during
            during()
        got = select.select(r, w, x, timeout)
        self.calls.append(("select", timeout, got[0]))
        return got

    def _sleep(self, seconds):
        self.calls.append(("sleep", seconds))
        time.sleep(seconds)

    def take(self) -> list:
        calls, self.calls = self.calls, []
        return calls


def _later(seconds: float, fn) -> threading.Thread:
    th = threading.Thread(target=lambda: (time.sleep(seconds), fn()))
    th.start()
    return th


def _append(path, data: bytes = b"line\n") -> None:
    with open(path, "ab") as f:
        f.write(data)


def _ino(w: LogWait) -> int:
    assert w._ino is not None and not w.failed  # inotify here
    return w._ino.fd


def test_a_write_wakes_the_wait_and_a_quiet_log_sleeps_to_the_timeout(tmp_path, monkeypatch):
    waits = Waits(monkeypatch)
    log = tmp_path / "train.log"
    log.write_bytes(b"old\n")
    w = LogWait()
    w.wait(str(log), 4, [], 0.3, 0.05)
    assert waits.take() == [("select", 0.3, [])]  # nothing new: the whole timeout (the poll: 0.05 s)
    threads = []
    waits.during = lambda: threads.append(_later(0.1, lambda: _append(log)))  # while it sleeps
    w.wait(str(log), 4, [], HANG, 0.05)
    threads[0].join()
    assert waits.take() == [("select", HANG, [_ino(w)])]  # the write woke it
    w.wait(str(log), 4, [], HANG, 0.05)
    assert waits.take() == []  # unread bytes: at once, no sleep
    # the bytes read, their events drained: it sleeps again
    w.wait(str(log), log.stat().st_size, [], 0.3, 0.05)
    assert waits.take() == [("select", 0.3, [])]


def test_a_write_between_the_read_and_the_wait_is_not_slept_through(tmp_path, monkeypatch):
    waits = Waits(monkeypatch)
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    w = LogWait()
    w.wait(str(log), 0, [], 0.0, 0.05)  # aimed
    waits.take()
    _append(log)  # after the loop's empty read, before its wait
    w.wait(str(log), 0, [], HANG, 0.05)
    assert waits.take() == []  # returned at once
    waits.during = lambda: _append(log)  # after its size check, before its sleep: the event is queued
    w.wait(str(log), log.stat().st_size, [], HANG, 0.05)
    assert waits.take() == [("select", HANG, [_ino(w)])]


def test_the_commands_end_wakes_it(tmp_path, monkeypatch):
    waits = Waits(monkeypatch)
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    r, wfd = os.pipe()  # (a pidfd reads as readable when the process ends: a pipe does here)
    try:
        threads = []
        waits.during = lambda: threads.append(_later(0.1, lambda: os.write(wfd, b"x")))
        LogWait().wait(str(log), 0, [r, None], HANG, 0.05)
        threads[0].join()
        assert waits.take() == [("select", HANG, [r])]
    finally:
        os.close(r)
        os.close(wfd)


def test_a_new_file_at_the_path_is_watched_in_its_turn(tmp_path, monkeypatch):
    waits = Waits(monkeypatch)
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    w = LogWait()
    w.wait(str(log), 0, [], 0.0, 0.05)
    os.unlink(log)
    log.write_bytes(b"")  # another inode at the same name (a phase's new log)
    waits.take()
    threads = []
    waits.during = lambda: threads.append(_later(0.1, lambda: _append(log)))
    w.wait(str(log), 0, [], HANG, 0.05)
    threads[0].join()
    assert waits.take() == [("select", HANG, [_ino(w)])]  # the new file's write, not the timeout


def test_without_inotify_or_a_log_it_polls(tmp_path, monkeypatch):
    waits = Waits(monkeypatch)
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    LogWait().wait(None, 0, [], HANG, 0.05)  # no log yet: the poll
    LogWait().wait(str(tmp_path / "absent.log"), 0, [], HANG, 0.05)
    assert waits.take() == [("sleep", 0.05), ("sleep", 0.05)]

    def no_inotify():
        raise OSError(24, "inotify_init1")  # EMFILE: the per-user instances used up
    monkeypatch.setattr(logwait, "_Inotify", no_inotify)
    w = LogWait()
    w.wait(str(log), 0, [], HANG, 0.05)
    assert waits.take() == [("sleep", 0.05)]
    assert w.failed


@pytest.mark.parametrize("src", [None, "train.log"])
def test_quiet_reads_where_the_relay_is(tmp_path, monkeypatch, src):
    waits = Waits(monkeypatch)

    class Relay:
        dir, offset = str(tmp_path), 0
    Relay.src = src
    (tmp_path / "train.log").write_bytes(b"x\n")  # unread: returns at once with a log, polls without
    logwait.after_read(Relay, None, False, HANG, 0.05, 0.05)
    assert waits.take() == ([("sleep", 0.05)] if src is None else [])


def test_output_that_keeps_coming_gathers_and_a_lone_line_waits_for_the_next(tmp_path, monkeypatch):
    waits = Waits(monkeypatch)

    class Relay:
        dir, src, offset = str(tmp_path), "train.log", 2
    (tmp_path / "train.log").write_bytes(b"x\n")  # read: nothing new
    monkeypatch.setattr(logwait, "_LAST_READ", [0.0])
    # a lone line (no read with output for long): the log's next growth, or the checks
    waits.now = 100.0
    logwait.after_read(Relay, None, True, 0.3, 0.05, 0.2)
    assert waits.take() == [("select", 0.3, [])]
    # another read with output soon after (within 2 x COALESCE): the writer is fast, let its
    # output gather for COALESCE
    waits.now = 100.3
    logwait.after_read(Relay, None, True, HANG, 0.05, 0.2)
    assert waits.take() == [("sleep", 0.2)]
    # a read with output long after the last: a lone line again
    waits.now = 101.0
    logwait.after_read(Relay, None, True, 0.3, 0.05, 0.2)
    assert waits.take() == [("select", 0.3, [])]
    # a read without output: the log's growth (here: the timeout)
    waits.now = 101.1
    logwait.after_read(Relay, None, False, 0.3, 0.05, 0.2)
    assert waits.take() == [("select", 0.3, [])]
