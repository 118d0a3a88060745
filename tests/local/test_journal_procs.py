"""The journal's promises that need real processes (its in-process half: tests/unit/test_journal.py):
one lock holder at a time under a race of forked processes with stale locks, a killed holder,
whole event records on a real tmpfs that fills, re-adoptable phase commands, the keeper, and
the agent's tail verb as a process."""

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

from gpujob.agent.home.journal import Home, Journal
from gpujob.agent.base.fsio import write_json
from gpujob.agent.home.lock import Lock
from gpujob.agent.base.proc import Phase, group_pids, start_ticks

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


def test_the_keeper_outlives_sigterm_and_reports_the_command_s_fate(tmp_path):
    proc = Phase.start([sys.executable, "-c", "import time; time.sleep(30)"], env=None, cwd=str(tmp_path),
                       log_path=str(tmp_path / "w.log"), exit_file=str(tmp_path / "w.exit"))
    time.sleep(0.3)
    left = proc.kill(5)
    assert left == [] and not group_pids(proc.pgid)
    assert proc.returncode == -signal.SIGTERM


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
