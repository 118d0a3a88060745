"""The journal's promises, tested on real files and real processes: one lock holder
at a time under a race with stale locks, fenced writes, durable state, whole
event records, exactly-once log relay, the ordered request queue, re-adoptable
phase commands and the restart policy's rules."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpujob.agent.home import journal as jn
from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.base.fsio import read_records, write_json
from gpujob.agent.home.lock import Fenced, Lock
from gpujob.agent.base.proc import Phase, group_pids, is_alive, start_ticks
from gpujob.agent.home.relay import JobLog, Relay
from gpujob.agent.supervisor.supervisor import restart_refusal

RACERS, ROUNDS = 8, 500


def _racer(root: str, idx: int, barrier, wins, rounds: int) -> None:
    lock = Lock(root)
    for r in range(rounds):
        barrier.wait()
        held = lock.try_acquire(f"job{idx}")
        if held is not None:
            with wins.get_lock():
                wins[r] += 1
        barrier.wait()  # every racer has tried while the winner still holds it
        if held is not None:
            # half the rounds the winner dies without releasing (lock.json says it still
            # holds the lock: a stale lock for the next round); half it releases properly
            if r % 2:
                held.release()
            else:
                held.close_quietly()
        barrier.wait()


def test_lock_race_has_exactly_one_winner_every_round_with_stale_locks(tmp_path):
    root = str(tmp_path)
    # start from a stale lock: a holder that died without a word
    write_json(os.path.join(root, "lock.json"), {"job_id": "dead", "pid": 999999, "generation": 7})
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(RACERS)
    wins = ctx.Array("i", ROUNDS)
    procs = [ctx.Process(target=_racer, args=(root, i, barrier, wins, ROUNDS)) for i in range(RACERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(240)
        assert p.exitcode == 0
    counts = list(wins)
    assert counts == [1] * ROUNDS, {c: counts.count(c) for c in set(counts)}
    info = json.loads((tmp_path / "lock.json").read_text())
    assert info["generation"] == 7 + ROUNDS  # one generation per acquisition, none skipped
    print(f"lock race: {RACERS} processes x {ROUNDS} rounds: exactly one winner in {counts.count(1)} rounds")


def test_a_killed_holder_frees_the_lock_at_once(tmp_path):
    code = ("import sys,time; sys.path.insert(0, %r)\n"
            "from gpujob.agent.home.lock import Lock\n"
            "h = Lock(%r).try_acquire('j1'); print('held', flush=True); time.sleep(60)") % (
        os.getcwd(), str(tmp_path))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout.readline().strip() == b"held"
    assert Lock(str(tmp_path)).try_acquire("j2") is None
    assert Lock(str(tmp_path)).holder()["job_id"] == "j1"
    p.kill()
    p.wait()
    assert Lock(str(tmp_path)).holder() is None  # its pid is gone: nobody holds it
    held = Lock(str(tmp_path)).try_acquire("j2")
    assert held is not None and held.generation == 2


def test_a_stale_writer_is_fenced_off(tmp_path):
    home = Home(str(tmp_path))
    os.makedirs(home.job_dir("j"))
    Journal(home, "j", generation=1).set_state(state="training", step="env")  # a legal first step (agent/base/stages.py)
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
    (tmp_path / "jobs/j1/state.json").write_text(json.dumps(old, indent=1, sort_keys=True) + "\n")  # older agents'
    assert j.state() == old
    st = j.set_state(durable=False, tps=2.0, verdict="ok")
    text = (tmp_path / "jobs/j1/state.json").read_text()
    assert text == json.dumps(st, sort_keys=True, separators=(",", ":")) + "\n"  # one line, no spaces
    assert text.count("\n") == 1 and json.loads(text) == dict(old, tps=2.0, verdict="ok", updated_at=st["updated_at"])
    assert j.state() == json.loads(text)


@pytest.fixture
def tiny_fs(tmp_path):
    """A 64 KiB tmpfs: a real disk that fills."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    assert r.returncode == 0, f"cannot mount a tmpfs here: {r.stderr.decode()}"
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)])


def test_events_stay_whole_records_when_the_disk_fills(tiny_fs):
    home = Home(str(tiny_fs))
    os.makedirs(home.job_dir("j"))
    j = Journal(home, "j")
    j.set_state(state="training")
    n = 0
    with pytest.raises(OSError) as exc:
        while True:
            j.event("sample", value=n, pad="x" * 300)
            n += 1
    assert exc.value.errno == 28  # ENOSPC
    records, skipped = j.events()
    assert skipped == 0 and len(records) == n and records[-1]["value"] == n - 1
    with pytest.raises(OSError):  # a state write that cannot fit leaves the old state whole
        j.set_state(reason="y" * 100_000)
    assert j.state()["state"] == "training"
    assert not [p for p in os.listdir(j.dir) if ".tmp" in p]


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


def test_a_phase_runs_on_when_its_watcher_dies_and_is_readopted(tmp_path):
    code = ("import sys,time\nprint('started', flush=True)\ntime.sleep(float(sys.argv[1]))\n"
            "sys.stdout.write('last line without newline'); sys.stdout.flush(); sys.exit(7)")
    proc = Phase.start([sys.executable, "-c", code, "1.0"], env=None, cwd=str(tmp_path),
                       log_path=str(tmp_path / "train.log"), exit_file=str(tmp_path / "train.exit"))
    rec = proc.record()
    assert rec["ticks"] == start_ticks(rec["pgid"]) and proc.running()
    adopted = Phase.adopt(rec)  # what a new supervisor does with the record in state
    assert adopted.running()
    end = time.monotonic() + 10
    while adopted.running() and time.monotonic() < end:
        time.sleep(0.02)
    proc.popen.wait()
    assert adopted.returncode == 7  # the keeper wrote it: nobody had to be its parent
    assert (tmp_path / "train.log").read_text() == "started\nlast line without newline"


def test_a_recycled_pid_is_not_mistaken_for_the_phase(tmp_path):
    me = os.getpid()
    assert is_alive(me, start_ticks(me))
    assert not is_alive(me, start_ticks(me) - 1)  # same pid, another start: another process
    stale = Phase.adopt({"pgid": me, "ticks": start_ticks(me) - 1, "exit_file": str(tmp_path / "x")})
    assert not stale.running() and stale.returncode is None


def test_the_keeper_outlives_sigterm_and_reports_the_command_s_fate(tmp_path):
    proc = Phase.start([sys.executable, "-c", "import time; time.sleep(30)"], env=None, cwd=str(tmp_path),
                       log_path=str(tmp_path / "w.log"), exit_file=str(tmp_path / "w.exit"))
    time.sleep(0.3)
    left = proc.kill(5)
    assert left == [] and not group_pids(proc.pgid)
    assert proc.returncode == -signal.SIGTERM


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


def test_tail_starts_where_a_trimmed_log_begins_and_says_what_it_skipped(tmp_path):
    from gpujob.agent.home.trim import Trimmer
    home = Home(str(tmp_path))
    os.makedirs(home.job_dir("j"))
    d = Path(home.job_dir("j"))
    (d / "job.json").write_text("{}")
    (d / "state.json").write_text('{"state": "succeeded"}')
    (d / "job.log").write_bytes(b"".join(b"line %06d %s\n" % (i, b"y" * 90) for i in range(30000)))
    Trimmer(str(d)).trim("job.log", keep=1 << 20)
    p = subprocess.run([sys.executable, "-m", "gpujob.agent.main", "--home", str(tmp_path), "tail", "j",
                        "--offset", "0"], capture_output=True)
    info = json.loads(p.stdout.split(b"\n", 1)[0])  # the first record: where the bytes start
    assert info["offset"] == Trimmer(str(d)).start_of("job.log") and info["skipped"] == info["offset"]
    body = p.stdout.split(b"\n", 1)[1]
    assert body.startswith(b"line ") and b"\0" not in body


def test_a_job_of_an_older_agent_is_never_revived(tmp_path):
    from gpujob.agent.verbs.lifecycle import revive
    home = Home(str(tmp_path))
    os.makedirs(home.job_dir("old"))
    write_json(os.path.join(home.job_dir("old"), "job.json"), {"spec": {"name": "x"}})
    write_json(os.path.join(home.job_dir("old"), "state.json"),
               {"state": "training", "supervisor_pid": 999999, "child_pgid": 999998})  # no "step"
    assert revive(home, "old") is None
    assert Journal(home, "old").effective_state()["state"] == "lost"
