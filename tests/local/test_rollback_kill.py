"""The rollback switch writes one durable state before the known-good trainer's spawn
(issue 25): end_phase and the plan replace state.json without fsync, the record, the
venv switch and the steps after it are deferred to the spawn's durable write; a ledger
mark or a message is preceded by a sync, and the rollback's timing is written after
the spawn. A supervisor SIGKILLed at each point between the decision and the
last of those writes (GPUJOB_TEST_DIE_AT, proc.die_here) is followed by a new one that
ends with the same job: one trainer, on fast, the rollback recorded once, slow marked
bad once after fast held (the suspect survives; killed between the ledger's mark and the
state write, the new supervisor's confirmation finds its verdict there: one verdict, not
two), and job.log's trainer lines each once."""

from __future__ import annotations

import json
import os
import time

import pytest

from helpers import cli, events, job_id_of, local_env, wait_for, write_spec
from test_faults import jdir, journal_is_sound, state_of, wheelhouse  # noqa: F401 (a fixture)
from test_jobs_local import trainers_of

POINTS = [
    "train_ended:slow",      # slow's trainer stopped, child=None written without fsync
    "rollback_planned",      # the pending rollback written (no fsync)
    "rollback_recorded",     # the rollback's record and rolling_back (deferred: not on disk)
    "rollback_switched",     # the venv pointed at fast, step restore (deferred: not on disk)
    "train_starting:fast",   # child_starting written durably, fast's trainer not yet spawned
    "train_started:fast",    # fast's trainer spawned, not yet written down as the child
    "rollback_done",         # the rollback's timing written, right after the spawn
    "suspect_marked",        # slow marked bad in the ledger, the suspect not yet cleared in state.json
]


def pids_alive(pids) -> list:
    out = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            out.append(pid)
        except ProcessLookupError:
            pass
    return out


@pytest.mark.parametrize("point", POINTS)
def test_a_supervisor_killed_between_the_rollback_decision_and_its_writes(tmp_path, wheelhouse, point):
    urls = wheelhouse[1]
    marker = tmp_path / "died"
    env = dict(local_env(tmp_path), GPUJOB_TEST_DIE_AT=f"{point}@{marker}")
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=urls["fast"], slow_url=urls["slow"],
                      profile="slow", warmup=False, trainer_args="--steps 2000 --interval 0.05",
                      rollback={"confirm": "2s"})
    cli(["ledger", "set", "box", "tjob", "fast", "good"], env, check=True)
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    wait_for(marker.exists, 90, what=f"the supervisor to die at {point}")
    first = state_of(tmp_path, job_id)["supervisor_pid"]
    wait_for(lambda: not pids_alive([first]), 10, what="the killed supervisor to be gone")
    assert len(trainers_of(tmp_path)) <= 1  # never two, even with nobody watching
    cli(["status", job_id], env, check=True)  # a new supervisor takes the job over
    wait_for(lambda: (state_of(tmp_path, job_id).get("child") or {}).get("profile") == "fast"
             and state_of(tmp_path, job_id).get("supervisor_pid") != first, 60,
             what="fast's trainer under the new supervisor")
    ledger = tmp_path / "root" / "ledger" / "tjob.json"
    wait_for(lambda: json.loads(ledger.read_text())["profiles"].get("slow", {}).get("status") == "bad", 60,
             what="slow marked bad once fast held")
    for _ in range(10):  # one trainer all along, and it is fast's
        assert len(trainers_of(tmp_path)) == 1
        time.sleep(0.1)
    st = state_of(tmp_path, job_id)
    assert st["profile"] == "fast" and st["step"] == "train" and st.get("pending_rollback") is None
    assert st.get("child_starting") is None and st["child"]["phase"] == "train"
    assert [(r["from"], r["to"]) for r in st["rollbacks"]] == [("slow", "fast")]
    assert st["rollbacks"][0].get("took") is not None  # its timing, also when it came late
    environ = open(f"/proc/{trainers_of(tmp_path)[0]}/environ", "rb").read().split(b"\0")
    assert b"GPUJOB_PROFILE=fast" in environ  # the trainer that runs is fast's
    ev = journal_is_sound(jdir(tmp_path, job_id))
    kinds = [e["type"] for e in ev]
    assert kinds.count("rollback") == 1 and kinds.count("suspect_confirmed") == 1
    hist = [h for h in json.loads(ledger.read_text()).get("history") or [] if h.get("profile") == "slow"]
    assert [h["status"] for h in hist if h["status"] == "bad"] == ["bad"]
    cli(["stop", job_id], env, check=True)
    assert not trainers_of(tmp_path)
    train = (jdir(tmp_path, job_id) / "train.log").read_text().splitlines()
    log = (jdir(tmp_path, job_id) / "job.log").read_text().splitlines()
    assert [ln for ln in log if ln in set(train)] == train  # each of the trainers' lines once, in order
    assert any(e["type"] in ("supervisor_revived", "supervisor_restarted")
               for e in events(jdir(tmp_path, job_id)))
