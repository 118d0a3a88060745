"""Checkpoint awareness: the plan's warning, the resume point recorded after a
rollback, and rollback.wait_for_checkpoint holding a rollback until one exists."""

from __future__ import annotations

import os
import time


from gpujob.agent import checkpoint
from helpers import cli, cli_json, events, job_id_of, local_env, write_spec


def test_step_names_resume_point_and_description(tmp_path):
    assert checkpoint.step_of("out/ckpt_step_400.pt") == 400
    assert checkpoint.step_of("iter-12/model.safetensors".split("/")[0]) == 12
    assert checkpoint.step_of("ckpt-000400.pt") == 400
    assert checkpoint.step_of("latest.pt") is None
    assert checkpoint.describe(checkpoint.resume_point(str(tmp_path), "ck/*.pt", time.time())) == \
        "no checkpoint: restarted from scratch"
    (tmp_path / "ck").mkdir()
    old, new = tmp_path / "ck" / "step_1.pt", tmp_path / "ck" / "step_2.pt"
    old.write_text("a")
    new.write_text("b")
    os.utime(old, (time.time() - 100, time.time() - 100))
    os.utime(new, (time.time() - 12, time.time() - 12))
    point = checkpoint.resume_point(str(tmp_path), "ck/*.pt", time.time())
    assert point["file"] == str(new) and point["step"] == 2
    assert checkpoint.describe(point) == f"resumed from {new} (age 12s, step 2)"


SPEC = {"train": {"checkpoint": {"path": "c/*.pt", "every": 30.0}},
        "throughput": {"initial_delay": 10.0}, "rollback": {"on": ["low_throughput", "gpu_idle"],
                                                            "gpu_idle": {"for": 20.0}}}


def test_warnings_when_the_policy_can_decide_before_the_first_checkpoint():
    w = checkpoint.warnings(SPEC)
    assert len(w) == 2 and w[0].startswith("throughput.initial_delay (10s, counted from the first sample) "
                                           "with the time parts of window and failure_limit (10s in all) is "
                                           "shorter than train.checkpoint.every (30s)")
    # issue 22: a time window and failure_limit count too (10 + 10 + 2 x 10 = 40s >= 30s: no warning)
    assert len(checkpoint.warnings(dict(SPEC, throughput={"initial_delay": 10.0, "window": "10s",
                                                          "failure_limit": 3}))) == 1
    assert "rollback.gpu_idle.for (20s)" in w[1]
    assert checkpoint.warnings(dict(SPEC, rollback={"on": ["low_throughput"], "wait_for_checkpoint": True})) == []
    assert checkpoint.warnings(dict(SPEC, throughput={"initial_delay": 40.0}, rollback={"on": ["low_throughput"]})) == []
    assert checkpoint.warnings({"train": {}}) == []


def rollback_job(tmp_path, index_urls, *, ck_every: int, wait: bool, path: str = "checkpoint.json",
                 every: str = "1s", throughput: dict | None = None, steps: int = 40):
    env = local_env(tmp_path)
    spec = write_spec(tmp_path / "job.yaml", target="box", fast_url=index_urls["fast"],
                      slow_url=index_urls["slow"], warmup=False, throughput=throughput,
                      trainer_args=f"--steps {steps} --interval 0.05 --checkpoint-every {ck_every}",
                      rollback={"wait_for_checkpoint": wait} if wait else None)
    import yaml
    data = yaml.safe_load(spec.read_text())
    data["train"]["checkpoint"] = {"path": path, "every": every}
    spec.write_text(yaml.safe_dump(data))
    plan = cli(["submit", str(spec), "--plan"], env, check=True).stdout.decode()
    assert cli(["submit", str(spec), "--profile", "fast", "--follow"], env, timeout=120).returncode == 0
    for f in (tmp_path / "root" / "work").rglob("checkpoint.json"):
        f.unlink()  # act 2 starts from nothing
    p = cli(["submit", str(spec), "--follow"], env, timeout=120)
    assert p.returncode == 0, p.stdout.decode()[-3000:]
    job_id = job_id_of(p.stdout)
    return plan, cli_json(["status", job_id, "--json"], env), events(tmp_path / "root" / "jobs" / job_id), \
        (tmp_path / "root" / "jobs" / job_id / "train.log").read_text(), p.stdout.decode()


def test_wait_for_checkpoint_holds_the_rollback_and_resumes_from_it(tmp_path, index_urls):
    # slow is caught after ~3-4 steps; its first checkpoint comes at step 12
    plan, st, ev, log, out = rollback_job(tmp_path, index_urls, ck_every=12, wait=True)
    assert "warning" not in plan  # wait_for_checkpoint: no warning
    kinds = [e["type"] for e in ev]
    assert kinds.index("rollback_held") < kinds.index("rollback_released") < kinds.index("rollback")
    released = next(e for e in ev if e["type"] == "rollback_released")
    assert released["why"] == "a checkpoint exists" and released["waited"] > 0.1
    [rb] = st["rollbacks"]
    assert rb["resumed"].startswith("resumed from ") and "checkpoint.json (age" in rb["resumed"]
    assert "resumed from checkpoint at step 12" in log
    assert "resumed from" in out  # status table / banner


def test_without_a_checkpoint_the_rollback_says_restarted_from_scratch(tmp_path, index_urls):
    tp = {"format": "ktok", "window": 3, "min": "10K", "failure_limit": 2, "no_data_timeout": "30s",
          "good_after": "1s", "initial_delay": "1.5s", "resume_initial_delay": 0}
    plan, st, ev, log, out = rollback_job(tmp_path, index_urls, ck_every=1000, wait=False, every="3s",
                                          throughput=tp, steps=80)
    assert "warning" in plan and "initial_delay (1.5s, counted from the first sample)" in plan.replace("\n", " ") \
        and "shorter than train.checkpoint.every (3s)" in plan.replace("\n", " ")
    # decision -> trainer start -> first sample -> first good -> first ok, in that order
    t = st["rollbacks"][0]["timings"]
    assert sorted(t) == sorted(["trainer_start", "first_sample", "first_good", "first_ok"])
    assert t["trainer_start"] <= t["first_sample"] <= t["first_good"] <= t["first_ok"]
    # resume_initial_delay 0 for the known-good profile resumed: ok long before initial_delay (1.5 s)
    assert t["first_ok"] - t["trainer_start"] < 1.4
    assert [e["mark"] for e in ev if e["type"] == "rollback_timing"] == ["first_sample", "first_good", "first_ok"]
    assert "decision →" in out and "ok " in out
    [rb] = st["rollbacks"]
    assert rb["resumed"] == "no checkpoint: restarted from scratch"
    assert not any(e["type"] == "rollback_held" for e in ev)
    assert any(e["type"] == "resume_point" and e["file"] is None for e in ev)
