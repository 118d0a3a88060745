"""The watch loop's wait on a quiet log (agent/base/logwait.py): it sleeps until the log
grows past what was read, the command's pidfd is readable or the timeout passes, and
falls back to the timed poll without inotify. Bounds are generous: these check what
wakes the wait, not how fast (bench/supervisor_cpu.py measures the wakeups)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from gpujob.agent.base import logwait
from gpujob.agent.base.logwait import LogWait


def _timed(fn) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def _later(seconds: float, fn) -> threading.Thread:
    th = threading.Thread(target=lambda: (time.sleep(seconds), fn()))
    th.start()
    return th


def _append(path, data: bytes = b"line\n") -> None:
    with open(path, "ab") as f:
        f.write(data)


def test_a_write_wakes_the_wait_and_a_quiet_log_sleeps_to_the_timeout(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(b"old\n")
    w = LogWait()
    assert _timed(lambda: w.wait(str(log), 4, [], 0.3, 0.05)) >= 0.25  # nothing new: the whole timeout
    assert not w.failed  # (inotify here; the poll would have woken after 0.05 s)
    th = _later(0.1, lambda: _append(log))
    assert _timed(lambda: w.wait(str(log), 4, [], 10.0, 0.05)) < 5.0  # the write woke it
    th.join()
    assert _timed(lambda: w.wait(str(log), 4, [], 10.0, 0.05)) < 1.0  # unread bytes: at once
    # the bytes read, their events drained: it sleeps again
    assert _timed(lambda: w.wait(str(log), log.stat().st_size, [], 0.3, 0.05)) >= 0.25


def test_a_write_between_the_read_and_the_wait_is_not_slept_through(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    w = LogWait()
    w.wait(str(log), 0, [], 0.0, 0.05)  # aimed
    _append(log)  # after the loop's empty read, before its wait
    assert _timed(lambda: w.wait(str(log), 0, [], 10.0, 0.05)) < 1.0


def test_the_commands_end_wakes_it(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    r, wfd = os.pipe()  # (a pidfd reads as readable when the process ends: a pipe does here)
    try:
        th = _later(0.1, lambda: os.write(wfd, b"x"))
        assert _timed(lambda: LogWait().wait(str(log), 0, [r, None], 10.0, 0.05)) < 5.0
        th.join()
    finally:
        os.close(r)
        os.close(wfd)


def test_a_new_file_at_the_path_is_watched_in_its_turn(tmp_path):
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    w = LogWait()
    w.wait(str(log), 0, [], 0.0, 0.05)
    os.unlink(log)
    log.write_bytes(b"")  # another inode at the same name (a phase's new log)
    th = _later(0.1, lambda: _append(log))
    assert _timed(lambda: w.wait(str(log), 0, [], 10.0, 0.05)) < 5.0
    th.join()


def test_without_inotify_or_a_log_it_polls(tmp_path, monkeypatch):
    log = tmp_path / "train.log"
    log.write_bytes(b"")
    assert _timed(lambda: LogWait().wait(None, 0, [], 10.0, 0.05)) < 5.0  # no log yet: the poll
    assert _timed(lambda: LogWait().wait(str(tmp_path / "absent.log"), 0, [], 10.0, 0.05)) < 5.0

    def no_inotify():
        raise OSError(24, "inotify_init1")  # EMFILE: the per-user instances used up
    monkeypatch.setattr(logwait, "_Inotify", no_inotify)
    w = LogWait()
    assert _timed(lambda: w.wait(str(log), 0, [], 10.0, 0.05)) < 5.0
    assert w.failed


@pytest.mark.parametrize("src", [None, "train.log"])
def test_quiet_reads_where_the_relay_is(tmp_path, src):
    class Relay:
        dir, offset = str(tmp_path), 0
    Relay.src = src
    (tmp_path / "train.log").write_bytes(b"x\n")  # unread: returns at once with a log, polls without
    assert _timed(lambda: logwait.after_read(Relay, None, False, 10.0, 0.05, 0.05)) < 5.0


def test_output_that_keeps_coming_gathers_and_a_lone_line_waits_for_the_next(tmp_path, monkeypatch):
    class Relay:
        dir, src, offset = str(tmp_path), "train.log", 2
    (tmp_path / "train.log").write_bytes(b"x\n")  # read: nothing new
    monkeypatch.setattr(logwait, "_LAST_READ", [0.0])
    # a lone line (no read with output for long): the log's next growth, or the checks
    assert _timed(lambda: logwait.after_read(Relay, None, True, 0.3, 0.05, 0.05)) >= 0.25
    # another read with output right after: the writer is fast, let its output gather for COALESCE
    took = _timed(lambda: logwait.after_read(Relay, None, True, 10.0, 0.05, 0.2))
    assert 0.15 <= took < 5.0
    # a read without output: the log's growth (here: the timeout)
    assert _timed(lambda: logwait.after_read(Relay, None, False, 0.3, 0.05, 0.05)) >= 0.25
