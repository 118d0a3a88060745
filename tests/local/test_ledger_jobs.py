"""Local jobs and the ledger (issue 39). A supervisor SIGKILLed right after a ledger write of a
hand rollback (`gpujob rollback --mark-bad`), before its state write: the new supervisor redoes
the switch from the plan and finds the verdict already there (its op): the profile left is
marked bad once, the job goes on on the profile asked for, one trainer (issue 39; the
confirmation's point is in test_rollback_kill.py). A job started with `submit --force` onto a
damaged ledger runs: the supervisor journals the ledger's line once, decides as with an empty
ledger and writes nothing over the damaged file."""

from __future__ import annotations

import json

from helpers import cli, job_id_of, local_env, wait_for, write_spec
from test_faults import jdir, journal_is_sound, state_of, wheelhouse  # noqa: F401 (a fixture)
from test_jobs_local import trainers_of
from test_rollback_kill import pids_alive


def test_a_supervisor_killed_after_a_hand_rollbacks_ledger_mark_records_one_verdict(tmp_path, wheelhouse):
    urls = wheelhouse[1]
    marker = tmp_path / "died"
    env = dict(local_env(tmp_path), GPUJOB_TEST_DIE_AT=f"rollback_marked@{marker}")
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=urls["fast"], slow_url=urls["slow"],
                      profile="slow", warmup=False, trainer_args="--steps 4000 --interval 0.05",
                      throughput=False)
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    wait_for(lambda: (state_of(tmp_path, job_id).get("child") or {}).get("phase") == "train", 90,
             what="slow's trainer")
    cli(["rollback", job_id, "--to", "fast", "--mark-bad"], env, check=True)
    wait_for(marker.exists, 90, what="the supervisor to die after its ledger mark")
    first = state_of(tmp_path, job_id)["supervisor_pid"]
    wait_for(lambda: not pids_alive([first]), 10, what="the killed supervisor to be gone")
    cli(["status", job_id], env, check=True)  # a new supervisor takes the job over
    wait_for(lambda: (state_of(tmp_path, job_id).get("child") or {}).get("profile") == "fast"
             and state_of(tmp_path, job_id).get("supervisor_pid") != first, 90,
             what="fast's trainer under the new supervisor")
    led = json.loads((tmp_path / "root" / "ledger" / "tjob.json").read_text())
    assert [h["status"] for h in led["history"] if h["profile"] == "slow"] == ["bad"]  # one verdict, not two
    assert led["profiles"]["slow"]["status"] == "bad"
    wait_for(lambda: len(trainers_of(tmp_path)) == 1, 30, what="fast's trainer")
    rollbacks = [e for e in journal_is_sound(jdir(tmp_path, job_id)) if e["type"] == "rollback"]
    assert len(rollbacks) == 1 and rollbacks[0]["ledger"] == "written"  # the journal says what the ledger has
    cli(["stop", job_id], env, check=True)
    assert not trainers_of(tmp_path)


def test_submit_force_onto_a_damaged_ledger_runs_and_leaves_the_file_as_it_was(tmp_path, wheelhouse):
    urls = wheelhouse[1]
    env = local_env(tmp_path)
    cli(["ledger", "set", "box", "tjob", "slow", "bad"], env, check=True)
    path = tmp_path / "root" / "ledger" / "tjob.json"
    damaged = path.read_bytes()[:40]
    path.write_bytes(damaged)
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=urls["fast"], slow_url=urls["slow"],
                      profile="fast", warmup=False, trainer_args="--steps 30 --interval 0.05")
    p = cli(["submit", str(spec)], env)
    assert p.returncode != 0 and "does not parse" in p.stderr.decode() and "--force" in p.stderr.decode()
    job_id = job_id_of(cli(["submit", str(spec), "--force", "--follow"], env, timeout=240).stdout)
    st = state_of(tmp_path, job_id)
    assert st["state"] == "succeeded", st
    warnings = [e for e in journal_is_sound(jdir(tmp_path, job_id)) if e["type"] == "warning"
                and "tjob.json" in e.get("message", "")]
    assert len(warnings) == 1 and "does not parse" in warnings[0]["message"]
    shown = json.loads(cli(["status", job_id, "--json"], env, check=True).stdout)
    assert "tjob.json: does not parse" in shown["ledger_error"]  # status says it too
    assert cli(["status", job_id], env, check=True).returncode == 0
    assert path.read_bytes() == damaged  # kept as it was
