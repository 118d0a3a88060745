"""The ledger as a store you can trust, on the loopback bed (issue 39): parallel hand writers
through the installed entry point (kept connection on) all kept; the supervisor's suspect ->
bad confirmation racing tight hand writers with no verdict lost (journal = ledger); each
damaged ledger (rows 1, 2, 6) refused in one line with its bytes kept, `profiles` still
showing the other names', `submit` onto the bad profile refused, then recovered; the undo of
row 5; a foreign known-good entry (row 4) and the automatic rollback to `fast`."""

from __future__ import annotations

import json
import os
import subprocess
import threading

import pytest

from helpers import cli, cli_json, gpujob_argv, job_id_of, user_env, wait_for, write_spec
from test_jobs_testbed import bed_env, home_path, status  # noqa: F401 (a fixture)

pytestmark = pytest.mark.testbed


def one_line_refusal(p: subprocess.CompletedProcess, *words: str) -> str:
    err = p.stderr.decode()
    assert p.returncode != 0, p.stdout.decode()[-2000:]
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


def ledger_json(testbed, env, name="tjob") -> dict:
    return json.loads(home_path(testbed, env, "ledger", f"{name}.json").read_text())


def test_24_parallel_ledger_sets_through_the_kept_connection_are_all_kept(testbed, bed_env):
    cli(["ledger", "history", "ct200", "tjob"], bed_env, check=True)  # the agent shipped, the connection kept
    procs = [subprocess.Popen([*gpujob_argv(), "ledger", "set", "ct200", "tjob", f"p{i}", "good", "--json"],
                              env=user_env(bed_env), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for i in range(24)]
    answers = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0] * 24, [a[1].decode()[-300:] for a in answers]
    led = ledger_json(testbed, bed_env)
    assert sorted(led["profiles"]) == sorted(f"p{i}" for i in range(24))
    assert sorted(h["profile"] for h in led["history"]) == sorted(f"p{i}" for i in range(24))
    ids = sorted(json.loads(a[0])["id"] for a in answers)
    assert ids == list(range(1, 25))  # each its own verdict, and said so


# what an ordinary write of a damaged form leaves in the container (host-side creation)
def _write(path, data: bytes):
    path.write_bytes(data)


DAMAGE = {
    "truncated": lambda p, good: _write(p, good[:len(good) // 2]),
    "garbage": lambda p, good: _write(p, b"\x00\xff garbage {{{"),
    "empty": lambda p, good: _write(p, b""),
    "profiles a list": lambda p, good: _write(p, b'{"profiles": []}'),
    "wrong shape": lambda p, good: _write(p, b'{"profiles": {"slow": "bad"}}'),
    "format 99": lambda p, good: _write(p, b'{"format": 99, "profiles": {}}'),
    "a FIFO": lambda p, good: os.mkfifo(p),
    "a link to /dev/zero": lambda p, good: os.symlink("/dev/zero", p),
    "a link to another ledger": lambda p, good: os.symlink("other.json", p),
}


def _fingerprint(path) -> tuple:
    st = os.lstat(path)
    if os.path.islink(path):
        return ("link", os.readlink(path))
    if not os.path.isfile(path):
        return ("special", st.st_mode)
    return ("file", path.read_bytes())


def test_each_damaged_ledger_is_refused_in_one_line_and_kept(testbed, bed_env, tmp_path, index):
    env = bed_env
    cli(["ledger", "set", "ct200", "other", "fast", "good"], env, check=True)
    cli(["ledger", "set", "ct200", "tjob", "fast", "good"], env, check=True)
    cli(["ledger", "set", "ct200", "tjob", "slow", "bad", "--reason", "median 4K < 10K"], env, check=True)
    path = home_path(testbed, env, "ledger", "tjob.json")
    good = path.read_bytes()
    spec = write_spec(tmp_path / "job.yaml", target="ct200", fast_url=index["fast"], slow_url=index["slow"],
                      profile="slow", warmup=False)
    for form, make in DAMAGE.items():
        os.replace(path, path.with_name("intact.keep"))  # beside it: same file system
        make(path, good)
        before = _fingerprint(path)
        one_line_refusal(cli(["ledger", "history", "ct200", "tjob"], env, timeout=60), "tjob.json")
        one_line_refusal(cli(["ledger", "set", "ct200", "tjob", "slow", "good"], env, timeout=60),
                         "tjob.json")
        one_line_refusal(cli(["ledger", "undo", "ct200", "tjob", "1"], env, timeout=60), "tjob.json")
        p = cli(["profiles", "ct200"], env, timeout=60)
        assert p.returncode == 0 and "(job other)" in p.stdout.decode(), (form, p.stdout.decode()[-1500:])
        assert "tjob.json" in p.stderr.decode() and "Traceback" not in p.stderr.decode()
        assert cli(["profiles", "ct200", "--json"], env, timeout=60).returncode == 0
        if form in ("truncated", "a FIFO"):  # the intact ledger marked slow bad: nothing starts on it
            one_line_refusal(cli(["submit", str(spec)], env, timeout=120), "tjob.json", "--force")
            assert not home_path(testbed, env, "jobs").exists() or not list(home_path(testbed, env,
                                                                                      "jobs").iterdir())
        assert _fingerprint(path) == before, form  # nothing written over it
        os.unlink(path)
        os.replace(path.with_name("intact.keep"), path)
    # the recovery: the damaged file kept aside, the last good copy back, slow still bad
    path.write_bytes(good[:10])
    res = cli_json(["ledger", "recover", "ct200", "tjob", "--json"], env)
    assert res["restored_from"] == "tjob.json.last-good" and res["next_id"] == 3
    assert home_path(testbed, env, "ledger", os.path.basename(res["kept_as"])).read_bytes() == good[:10]
    assert ledger_json(testbed, env)["profiles"]["slow"]["status"] == "bad"
    one_line_refusal(cli(["submit", str(spec)], env, timeout=120), "marked bad")


def test_undo_of_a_superseded_verdict_is_refused_and_ids_are_never_reused(testbed, bed_env):
    env = bed_env
    cli(["ledger", "set", "ct200", "tjob", "fast", "good"], env, check=True)
    cli(["ledger", "set", "ct200", "tjob", "fast", "bad", "--reason", "odd"], env, check=True)
    cli(["ledger", "set", "ct200", "tjob", "slow", "bad"], env, check=True)
    one_line_refusal(cli(["ledger", "undo", "ct200", "tjob", "1"], env), "verdict 2", "fast bad")
    assert ledger_json(testbed, env)["profiles"]["fast"]["status"] == "bad"  # the later verdict stands
    assert cli_json(["ledger", "undo", "ct200", "tjob", "2", "--json"], env)["status"] == "good"
    # a reset by hand (the file gone) after a recovery: ids go on from the last good copy
    path = home_path(testbed, env, "ledger", "tjob.json")
    path.write_bytes(b"garbage")
    cli(["ledger", "recover", "ct200", "tjob"], env, check=True)
    res = cli_json(["ledger", "set", "ct200", "tjob", "mid", "good", "--json"], env)
    assert res["id"] == 5 and [h["id"] for h in ledger_json(testbed, env)["history"]] == [1, 2, 3, 4, 5]


def test_a_foreign_known_good_entry_does_not_hide_fast_from_the_rollback(testbed, bed_env, tmp_path, index):
    env = bed_env
    cli(["ledger", "set", "ct200", "tjob", "fast", "good"], env, check=True)
    cli(["ledger", "set", "ct200", "tjob", "nightly", "good"], env, check=True)  # newer, not in this spec
    spec = write_spec(tmp_path / "job.yaml", target="ct200", fast_url=index["fast"], slow_url=index["slow"],
                      profile="slow", warmup=False, trainer_args="--steps 80 --interval 0.05",
                      rollback={"confirm": "0s"})
    p = cli(["submit", str(spec), "--follow"], env, timeout=300)
    assert p.returncode == 0, p.stdout.decode()[-3000:] + p.stderr.decode()[-1000:]
    st = status(job_id_of(p.stdout), env)
    assert st["state"] == "succeeded" and st["profile"] == "fast"
    assert [(r["from"], r["to"]) for r in st["rollbacks"]] == [("slow", "fast")]
    assert st["ledger"]["slow"]["status"] == "bad"
    assert "not a profile of this spec (never rolled back to): nightly" in p.stderr.decode()


WRITER = """
import contextlib, io, os, sys
sys.path.insert(0, sys.argv[1])
from gpujob.agent.main import main
home, stop, tag = sys.argv[2], sys.argv[3], sys.argv[4]
ok = 0
while not os.path.exists(stop):
    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(["--home", home, "ledger", "set", "tjob", "hand-" + tag, "bad", "--reason", "tight"])
    ok += rc == 0
print(ok)
"""


def test_the_supervisors_confirmation_racing_tight_hand_writers_loses_no_verdict(testbed, bed_env, tmp_path,
                                                                                  index):
    env = bed_env
    home = env["GPUJOB_TEST_HOME"]
    cli(["ledger", "set", "ct200", "tjob", "fast", "good"], env, check=True)
    [agent] = [f"{home}/bin/{n.name}" for n in home_path(testbed, env, "bin").glob("agent-*.pyz")]
    stop = f"{home}/stop-writers"
    counts: dict = {}

    def writer(tag):
        r = testbed.container_exec("python3", "-c", WRITER, agent, home, stop, tag, timeout=400)
        counts[tag] = (r.returncode, r.stdout.decode().strip(), r.stderr.decode()[-500:])

    threads = [threading.Thread(target=writer, args=(str(i),)) for i in range(3)]
    for t in threads:
        t.start()
    job = None
    try:
        spec = write_spec(tmp_path / "job.yaml", target="ct200", fast_url=index["fast"],
                          slow_url=index["slow"],
                          profile="slow", warmup=False, trainer_args="--steps 4000 --interval 0.05",
                          rollback={"confirm": "1s"})
        job = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
        events = home_path(testbed, env, "jobs", job, "events.jsonl")
        wait_for(lambda: events.exists() and '"suspect_confirmed"' in events.read_text(), 240,
                 what="slow confirmed bad while the hand writers write")
    finally:
        home_path(testbed, env, "stop-writers").write_text("")
        for t in threads:
            t.join(120)
        if job:
            cli(["stop", job], env)
    assert all(rc == 0 for rc, _, _ in counts.values()), counts
    led = ledger_json(testbed, env)
    [confirmed] = [e for e in map(json.loads, events.read_text().splitlines())
                   if e.get("type") == "suspect_confirmed"]
    assert confirmed["suspect"] == "slow"
    assert led["profiles"]["slow"]["status"] == "bad"  # the journal and the ledger agree
    assert [h["status"] for h in led["history"] if h["profile"] == "slow"] == ["bad"]
    for tag, (_, ok, _) in counts.items():  # and every hand verdict that said so is there
        assert int(ok) > 0 and sum(h["profile"] == f"hand-{tag}" for h in led["history"]) == int(ok)
    assert confirmed["ledger"] == "written"
