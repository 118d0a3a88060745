"""The compile race recovered (issue 33 item 8): a compile race with a known-good profile on
the ledger rolls back there at once, from this job's newest finished checkpoint; the raced
profile is a suspect, marked bad once the known-good held. A supervisor SIGKILLed right
after the decision (GPUJOB_TEST_DIE_AT) leaves the same outcome under a new one."""

from __future__ import annotations

import json

import pytest
import yaml

from helpers import cli, events, job_id_of, local_env, wait_for, write_spec
from test_faults import jdir, state_of, wheelhouse  # noqa: F401 (a fixture)
from test_jobs_local import trainers_of

FX = "torch._dynamo.exc.Unsupported: is_fx_symbolic_tracing() is True"


@pytest.mark.parametrize("point", ["", "train_ended:slow", "rollback_planned"])
def test_a_compile_race_with_a_known_good_profile_rolls_back_there_from_the_newest_checkpoint(
        tmp_path, wheelhouse, point):
    urls = wheelhouse[1]
    marker = tmp_path / "died"
    env = dict(local_env(tmp_path), **({"GPUJOB_TEST_DIE_AT": f"{point}@{marker}"} if point else {}))
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=urls["fast"], slow_url=urls["slow"],
                      profile="slow", warmup=False, throughput=False, rollback={"confirm": "1s"},
                      trainer_args=f"--steps 400 --interval 0.05 --checkpoint-every 10 --fail-on-build slow "
                                   f"--fail-step 30 --fail-message '{FX}'")
    data = yaml.safe_load(spec.read_text())
    data["train"]["checkpoint"] = {"path": "checkpoint.json", "every": "1s", "settle": "0.3s"}
    spec.write_text(yaml.safe_dump(data))
    cli(["ledger", "set", "box", "tjob", "fast", "good"], env, check=True)
    job_id = job_id_of(cli(["submit", str(spec)], env, check=True).stdout)
    if point:
        wait_for(marker.exists, 90, what=f"the supervisor to die at {point}")
        first = state_of(tmp_path, job_id)["supervisor_pid"]
        wait_for(lambda: state_of(tmp_path, job_id).get("supervisor_pid") != first or
                 not _alive(first), 20, what="the killed supervisor to be gone")
        cli(["status", job_id], env, check=True)  # a new supervisor takes the job over
    wait_for(lambda: (state_of(tmp_path, job_id).get("child") or {}).get("profile") == "fast", 90,
             what="fast's trainer")
    ledger = tmp_path / "root" / "ledger" / "tjob.json"
    wait_for(lambda: json.loads(ledger.read_text())["profiles"].get("slow", {}).get("status") == "bad", 90,
             what="slow marked bad once fast held")
    st = state_of(tmp_path, job_id)
    assert [(r["from"], r["to"], r["signal"]) for r in st["rollbacks"]] == [("slow", "fast", "compile_race")]
    assert not st.get("restarts")  # no restart on the raced wheels: a known-good was there
    ev = events(jdir(tmp_path, job_id))
    [point_ev] = [e for e in ev if e["type"] == "resume_point"]
    assert point_ev["file"] and point_ev["file"].endswith("checkpoint.json") and point_ev["step"] is None
    log = (jdir(tmp_path, job_id) / "train.log").read_text()
    assert "resumed from checkpoint at step 20" in log or "resumed from checkpoint at step 10" in log
    assert len(trainers_of(tmp_path)) <= 1
    cli(["stop", job_id], env, check=True)


def _alive(pid: int) -> bool:
    import os
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
