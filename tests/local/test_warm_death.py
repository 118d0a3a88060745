"""The warm marker and `warmup.ignore_flags` with a death (issue 38 row 8's follow-up): the
supervisor SIGKILLed while a warmup runs, after every warmup run but before the marker, and
right after the marker was written (its event not yet). The job is then stopped (its
supervisor is gone: `gpujob stop` ends what it left) and submitted again with only an
ignored flag changed (`--save_steps`): the warmup runs again iff the marker is not whole.
A marker torn after the death (half its bytes, as a disk that failed mid-write leaves it)
is not whole either. Through the installed entry point on the local kind."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from gpujob.agent.base.envs import WARM_MARKER
from helpers import cli, events, job_id_of, local_env, wait_for, write_spec
from test_faults import state_of, wheelhouse  # noqa: F401 (a fixture)
from test_jobs_local import trainers_of

CASES = [  # (death point, tear the marker after it, the next submit warms up again)
    ("warmup_started:fast", False, True),
    ("warm_marking", False, True),
    ("warm_marked", False, False),
    ("warm_marked", True, True),
]


def markers(tmp_path) -> list:
    return sorted((tmp_path / "root" / "caches").glob(f"*/{WARM_MARKER}"))


@pytest.mark.parametrize("point,tear,again", CASES, ids=[f"{p}{'-torn' if t else ''}" for p, t, _ in CASES])
def test_a_death_around_the_warm_marker_reruns_the_warmup_iff_the_marker_is_not_whole(
        tmp_path, wheelhouse, point, tear, again):
    urls = wheelhouse[1]
    env = local_env(tmp_path)
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=urls["fast"], slow_url=urls["slow"],
                      profile="fast", throughput=False, trainer_args="--steps 1 --interval 0.01")
    data = yaml.safe_load(spec.read_text())

    def write(every: int) -> None:
        data["warmup"] = {"command": f"sleep 0.5 && echo warming --save_steps {every}", "when": "cold",
                          "per_gpu": "drafter", "ignore_flags": ["--save_steps"]}
        spec.write_text(yaml.safe_dump(data))
    write(200)
    died = tmp_path / "died"
    job = job_id_of(cli(["submit", str(spec)], dict(env, GPUJOB_TEST_DIE_AT=f"{point}@{died}"),
                        check=True).stdout)
    wait_for(died.exists, 90, what=f"the supervisor to die at {point}")
    sup = state_of(tmp_path, job)["supervisor_pid"]
    wait_for(lambda: not os.path.exists(f"/proc/{sup}/status")
             or "State:\tZ" in open(f"/proc/{sup}/status").read(), 10, what="the supervisor gone")
    found = markers(tmp_path)
    for m in found:  # whatever it left is whole, or not there at all
        assert json.loads(m.read_text()).get("hash")
    assert bool(found) == (point == "warm_marked")
    if tear:
        raw = found[0].read_bytes()
        found[0].write_bytes(raw[:len(raw) // 2])
    p = cli(["stop", job], env)  # no supervisor: the agent ends what it left
    assert p.returncode == 0, p.stderr.decode()
    assert state_of(tmp_path, job)["state"] == "stopped"
    wait_for(lambda: not trainers_of(tmp_path), 20, what="nothing of the job left running")
    write(50)  # only an ignored flag changes
    p = cli(["submit", str(spec), "--follow"], env, timeout=180)
    assert p.returncode == 0, p.stdout.decode()[-2000:] + p.stderr.decode()[-2000:]
    second = job_id_of(p.stdout)
    kinds = [e["type"] for e in events(tmp_path / "root" / "jobs" / second)
             if e["type"] in ("warmup_skipped", "warm_marked")]
    assert kinds == (["warm_marked"] if again else ["warmup_skipped"]), kinds
    assert state_of(tmp_path, second)["state"] == "succeeded"
    [m] = markers(tmp_path)
    assert json.loads(m.read_text()).get("hash")  # whole again
