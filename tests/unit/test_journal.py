"""The journal's promises on real files, in this process: fenced writes, durable state,
a torn tail, exactly-once log relay, the ordered request queue, a recycled pid, trimming and
the restart policy's rules (the ones that need real processes: tests/local/test_journal_procs.py)."""

from __future__ import annotations

import json
import os

import pytest

from gpujob.agent.home import journal as jn
from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.base.fsio import read_records, write_json
from gpujob.agent.home.lock import Fenced
from gpujob.agent.base.proc import Phase, is_alive, start_ticks
from gpujob.agent.home.relay import JobLog, Relay
from gpujob.agent.supervisor.supervisor import restart_refusal


def test_a_stale_writer_is_fenced_off(tmp_path):
    home = Home(str(tmp_path))
    os.makedirs(home.job_dir("j"))
    # a legal first step (agent/base/stages.py)
    Journal(home, "j", generation=1).set_state(state="training", step="env")
    Journal(home, "j", generation=2).set_state(step="rollback")
    with pytest.raises(Fenced):
        Journal(home, "j", generation=1).set_state(step="train")  # a late write of the old holder
    assert Journal(home, "j").state()["step"] == "rollback"
    Journal(home, "j").set_state(reason="readers and lock-free writes are not fenced")
    assert Journal(home, "j").state()["generation"] == 2


def test_state_writes_are_durable_and_atomic(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)
    monkeypatch.setattr(jn.os, "fsync", fsync)
    path = tmp_path / "state.json"
    write_json(str(path), {"a": 1})
    assert any(s.startswith(str(path) + ".tmp") for s in synced)  # the data, before the rename
    assert str(tmp_path) in synced  # then the directory, so the rename itself is on disk
    assert json.loads(path.read_text()) == {"a": 1}
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_state_json_is_one_compact_line_and_an_older_agents_indented_one_reads_on(tmp_path):
    home = Home(str(tmp_path))
    os.makedirs(home.job_dir("j1"))
    j = Journal(home, "j1")
    old = {"job_id": "j1", "state": "running", "phase": "train", "step": "train", "format": 1,
           "tps_recent": [1.5, 2.0], "window": {"median": 2.0}}
    # older agents'
    (tmp_path / "jobs/j1/state.json").write_text(json.dumps(old, indent=1, sort_keys=True) + "\n")
    assert j.state() == old
    st = j.set_state(durable=False, tps=2.0, verdict="ok")
    text = (tmp_path / "jobs/j1/state.json").read_text()
    assert text == json.dumps(st, sort_keys=True, separators=(",", ":")) + "\n"  # one line, no spaces
    assert text.count("\n") == 1 and json.loads(text) == dict(old, tps=2.0, verdict="ok",
                                                              updated_at=st["updated_at"])
    assert j.state() == json.loads(text)


def test_a_torn_tail_is_skipped_and_reported(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"t": 1, "type": "a"}\n{"t": 2, "type": "b"}\n{"t": 3, "ty')
    records, skipped = read_records(str(path))
    assert [r["type"] for r in records] == ["a", "b"] and skipped == 1


def test_relay_copies_every_byte_once_across_a_death_at_any_point(tmp_path):
    (tmp_path / "train.log").write_bytes(b"".join(b"line %d\n" % i for i in range(1000)))
    src_bytes = (tmp_path / "train.log").read_bytes()
    for cut in (0, 1, 7, 100, 1023):  # how much of the last append landed before the death
        d = tmp_path / f"case{cut}"
        d.mkdir()
        os.symlink(tmp_path / "train.log", d / "train.log")
        log = JobLog(str(d / "job.log"))
        relay = Relay(str(d), log)
        relay.follow("train.log", 0)
        relay.poll(limit=3000)
        # the second append dies after `cut` of its 1024 bytes: its intent is on disk
        relay._write_cursor({"src": "train.log", "off": relay.offset, "len": 1024, "dst": log.size()})
        log.append(src_bytes[relay.offset:relay.offset + cut])
        # a new supervisor
        log2 = JobLog(str(d / "job.log"))
        relay2 = Relay(str(d), log2)
        relay2.recover()
        relay2.follow("train.log", 0)
        for _ in relay2.drain():
            pass
        assert (d / "job.log").read_bytes() == src_bytes, cut


def test_relay_cursor_is_rewritten_in_place_and_read_back_whole(tmp_path):
    """The cursor is one fixed-size pwrite into relay.json kept open (no temp file and
    rename per append): a shorter record after a longer one reads back whole, an older
    supervisor's renamed relay.json is taken over, a long one falls back to the rename,
    and a symlink planted as relay.json is replaced, never written through."""
    (tmp_path / "relay.json").write_text('{"src": "warmup.log", "off": 0, "len": 0, "dst": 0}\n')
    relay = Relay(str(tmp_path), JobLog(str(tmp_path / "job.log")))
    relay._write_cursor({"src": "train.log", "off": 123456789012, "len": 1048576, "dst": 987654321098})
    ino = os.stat(tmp_path / "relay.json").st_ino
    relay._write_cursor({"src": "train.log", "off": 5, "len": 1, "dst": 7})
    assert os.stat(tmp_path / "relay.json").st_ino == ino  # in place: no new file per write
    assert relay._cursor() == {"src": "train.log", "off": 5, "len": 1, "dst": 7}
    assert os.path.getsize(tmp_path / "relay.json") == 512
    long = {"src": "x" * 600 + ".log", "off": 1, "len": 2, "dst": 3}
    relay._write_cursor(long)
    assert relay._cursor() == long
    relay._write_cursor({"src": "train.log", "off": 9, "len": 1, "dst": 7})
    assert relay._cursor()["off"] == 9
    victim = tmp_path / "victim"
    victim.write_text("root only\n")
    d = tmp_path / "planted"
    d.mkdir()
    os.symlink(victim, d / "relay.json")
    Relay(str(d), JobLog(str(d / "job.log")))._write_cursor({"src": "a", "off": 0, "len": 1, "dst": 0})
    assert victim.read_text() == "root only\n" and not os.path.islink(d / "relay.json")


def test_banner_lines_start_on_a_line_of_their_own(tmp_path):
    log = JobLog(str(tmp_path / "job.log"))
    log.append(b"partial line without newline")
    log.banner("[gpujob] job succeeded")
    assert (tmp_path / "job.log").read_text() == "partial line without newline\n[gpujob] job succeeded\n"
    assert JobLog(str(tmp_path / "job.log")).at_line_start


def test_requests_queue_in_order_and_stay_until_done(tmp_path):
    home = Home(str(tmp_path))
    os.makedirs(home.job_dir("j"))
    j = Journal(home, "j")
    a = j.request("rollback", to="fast")
    b = j.request("stop")
    assert [n for n, _ in j.pending()] == [a, b]
    j.done(a)
    assert [r["kind"] for _, r in j.pending()] == ["stop"]


def test_a_recycled_pid_is_not_mistaken_for_the_phase(tmp_path):
    me = os.getpid()
    assert is_alive(me, start_ticks(me))
    assert not is_alive(me, start_ticks(me) - 1)  # same pid, another start: another process
    stale = Phase.adopt({"pgid": me, "ticks": start_ticks(me) - 1, "exit_file": str(tmp_path / "x")})
    assert not stale.running() and stale.returncode is None


def test_restart_policy_rules():
    cfg = {"max": 2, "within": 600}
    assert restart_refusal(cfg, [], "crash", 1000) is None
    two = [{"at": 900, "signal": "crash"}, {"at": 950, "signal": "nccl_timeout"}]
    assert "crash loop: 2 restarts" in restart_refusal(cfg, two, "crash", 1000)
    assert restart_refusal(cfg, two, "crash", 1600) is None  # the first fell out of the window
    assert "OOM-kill loop" in restart_refusal(cfg, [{"at": 990, "signal": "oom_killed"}], "oom_killed", 1000)


def test_trimming_frees_old_log_bytes_without_moving_an_offset(tmp_path):
    from gpujob.agent.home.trim import Trimmer, read_jsonl_from
    log = tmp_path / "job.log"
    lines = [b"line %06d %s\n" % (i, b"x" * 90) for i in range(30000)]  # ~3 MB
    log.write_bytes(b"".join(lines))
    size = log.stat().st_size
    tr = Trimmer(str(tmp_path))
    freed = tr.trim("job.log", keep=1 << 20)
    assert freed > 1 << 20 and log.stat().st_size == size  # same length: offsets stay valid
    begins = tr.start_of("job.log")
    kept = b"".join(lines)[begins:]
    with open(log, "rb") as f:
        f.seek(begins)
        assert f.read() == kept and kept.startswith(b"line ")  # whole lines, from a line start
        f.seek(begins - 1)
        assert f.read(1) == b"\0"  # what came before is a hole now
    assert os.stat(log).st_blocks * 512 < size - (1 << 20)  # the disk blocks are really freed
    assert tr.trim("job.log", keep=1 << 20) == 0  # nothing more until it grows again
    # a phase log is never freed past what the relay has copied
    (tmp_path / "train.log").write_bytes(b"".join(lines))
    assert tr.trim("train.log", keep=1 << 20, upto=1000) == 0
    # samples: whole records from where the file now begins
    s = tmp_path / "samples.jsonl"
    s.write_bytes(b"".join(b'{"t": %d, "value": 1.0}\n' % i for i in range(100000)))
    cut = s.read_bytes().index(b'{"t": 90000,')
    assert tr.trim_before("samples.jsonl", cut) == cut
    recs = read_jsonl_from(str(s), tr.start_of("samples.jsonl"))
    assert recs[0]["t"] == 90000 and len(recs) == 10000


def test_a_job_of_an_older_agent_is_never_revived(tmp_path):
    from gpujob.agent.verbs.lifecycle import revive
    home = Home(str(tmp_path))
    os.makedirs(home.job_dir("old"))
    write_json(os.path.join(home.job_dir("old"), "job.json"), {"spec": {"name": "x"}})
    write_json(os.path.join(home.job_dir("old"), "state.json"),
               {"state": "training", "supervisor_pid": 999999, "child_pgid": 999998})  # no "step"
    assert revive(home, "old") is None
    assert Journal(home, "old").effective_state()["state"] == "lost"
