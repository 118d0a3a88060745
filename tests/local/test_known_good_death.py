"""The supervisor's known-good ask (watch.KNOWN_GOOD_EVERY: every 0.5 s once good_after
holds, and once more at the run's end) with a death at it: the supervisor SIGKILLed when
the ask has decided (nothing written yet), after its known_good event (the ledger not yet
written), and after the ledger's mark (the cache snapshot not yet taken). After `status`
revives the job, it ends succeeded and the ledger is whole: the profile is good, with one
known-good verdict of this job (never lost, never half written, never twice), and a cache
snapshot is taken. Revived at once (its re-adopted trainer goes on proving itself) and
revived only after the trainer ended (the new supervisor sees no new samples: the verdict
the dead one reached must not be lost). Local kind."""

from __future__ import annotations

import json

import pytest

from gpujob.agent.home.ledgerfile import shape_error
from helpers import cli, job_id_of, local_env, wait_for, write_spec
from test_faults import jdir, journal_is_sound, state_of, wheelhouse  # noqa: F401 (a fixture)
from test_jobs_local import trainers_of

POINTS = ["known_good_asked", "known_good_said", "known_good_marked"]


def ledger_of(tmp_path) -> dict:
    return json.loads((tmp_path / "root" / "ledger" / "tjob.json").read_text())


@pytest.mark.parametrize("revived", ["at_once", "after_the_trainer_ended"])
@pytest.mark.parametrize("point", POINTS)
def test_a_supervisor_killed_at_the_known_good_ask_leaves_one_whole_verdict(tmp_path, wheelhouse, point,
                                                                           revived):
    urls = wheelhouse[1]
    marker = tmp_path / "died"
    env = dict(local_env(tmp_path), GPUJOB_TEST_DIE_AT=f"{point}@{marker}")
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=urls["fast"], slow_url=urls["slow"],
                      profile="fast", warmup=False, trainer_args="--steps 40 --interval 0.1")
    job = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    wait_for(marker.exists, 90, what=f"the supervisor to die at {point}")
    first = state_of(tmp_path, job)["supervisor_pid"]
    if revived != "at_once":  # nobody revives it before its trainer is done: no new samples to judge
        wait_for(lambda: not trainers_of(tmp_path), 60, what="the trainer's end")
    wait_for(lambda: cli(["status", job], env).returncode == 0 and
             state_of(tmp_path, job).get("supervisor_pid") != first, 30, what="a new supervisor")
    wait_for(lambda: state_of(tmp_path, job).get("state") in ("succeeded", "failed", "stopped", "lost"), 90,
             what="the job's end")
    st = state_of(tmp_path, job)
    assert st["state"] == "succeeded", st.get("reason")
    assert not trainers_of(tmp_path)
    led = ledger_of(tmp_path)
    assert shape_error(led) is None
    assert led["profiles"]["fast"]["status"] == "good"
    goods = [h for h in led["history"] if h["profile"] == "fast" and h["status"] == "good"]
    assert len(goods) == 1, goods  # one verdict: not lost, not twice
    assert goods[0].get("job") == job
    assert st.get("snapshot_due") is None
    ev = journal_is_sound(jdir(tmp_path, job))
    assert [e["type"] for e in ev].count("cache_snapshot") == 1, [e["type"] for e in ev]
    assert (led["profiles"]["fast"].get("snapshot") or {}).get("name")

